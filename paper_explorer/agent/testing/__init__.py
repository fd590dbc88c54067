"""Stand-ins for Qwen3-8B that run on a CPU in seconds: a tiny random-weight model and a locally
trained tokenizer (used by the tests, the benches and ``explorer tiny-model``)."""
