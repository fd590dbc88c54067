"""The GPU check: Qwen3-8B's architecture with random weights (nothing downloaded), loaded in 4-bit
NF4 with double quantization, running a 10-step episode with KV cache reuse; reports prefill and
decode tokens/s and peak memory, and fails when the 4-bit model plus an 8,192-token context
would not fit the target card (24 GB, an L4, by default).

    bash bench/gpu_check.sh                      # on a CUDA machine
    python bench/gpu_check.py --tiny             # the same path on CPU with the tiny model (a smoke test)

The random bf16 weights are written to a scratch directory once (about 16 GB for 8B; needs
that much disk and host memory) and loaded back through the same ``from_pretrained`` +
``BitsAndBytesConfig`` path the hf policy uses, so the check measures the real loading code.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Qwen/Qwen3-8B config.json as published (architecture only; the weights here are random).
QWEN3_8B = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
}
GIB = 2**30


def build_random_model(shape: dict, directory: Path, tokenizer_from: Path) -> Path:
    """Random bf16 weights of ``shape`` plus the tiny tokenizer, saved as a model directory."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_from / "tokenizer.json"))
    im_end = tokenizer.token_to_id("<|im_end|>")
    config = Qwen3Config(**shape, eos_token_id=im_end, torch_dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    del model
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_from / name, directory / name)
    return directory


def run(args) -> dict:
    import torch

    from agent.policies.hf import HFPolicy
    from agent.runner import EpisodeRunner
    from agent.tiny_model import TINY_SHAPE, build_tiny_model
    from agent.trajectory import EpisodeConfig
    from corpus import BM25Index, DemoConfig, generate

    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        raise SystemExit("no CUDA device: run with --tiny for the CPU smoke test")
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-", dir=args.scratch))
    try:
        tiny = build_tiny_model(scratch / "tiny")
        model_dir = tiny if args.tiny else build_random_model(QWEN3_8B, scratch / "qwen3-8b-random", tiny)
        started = time.perf_counter()
        policy = HFPolicy(str(model_dir), quantization="4bit" if cuda else "none", max_new_tokens=args.max_new_tokens,
                          max_context=max(args.context, 32_768))
        load_seconds = time.perf_counter() - started
        corpus = generate(DemoConfig(papers=40, seed=7))
        question = corpus.questions[0]
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        runner = EpisodeRunner(corpus, BM25Index.build(corpus), policy, EpisodeConfig(max_steps=10))
        trajectory = runner.run(question.text, question)
        steps = [step.generation for step in trajectory.steps]
        prefill_tokens = sum(g["prefill_tokens"] for g in steps)
        decode_tokens = sum(g["generated_tokens"] for g in steps)
        prefill_seconds = sum(g["prefill_seconds"] for g in steps)
        decode_seconds = sum(g["decode_seconds"] for g in steps)
        # the fit test: one prefill of a full-length context on top of the loaded model
        policy._reset()
        with torch.inference_mode():
            policy._forward([policy.renderer.im_start] * args.context)
        peak = torch.cuda.max_memory_allocated() / GIB if cuda else None
        shape = TINY_SHAPE if args.tiny else QWEN3_8B
        report = {
            "device": torch.cuda.get_device_name(0) if cuda else "cpu",
            "model": "tiny" if args.tiny else "Qwen3-8B architecture, random weights",
            "layers": shape["num_hidden_layers"], "quantization": policy.quantization, "load_seconds": round(load_seconds, 1),
            "episode_steps": len(steps), "episode_status": trajectory.outcome.status,
            "prompt_tokens_final": steps[-1]["prompt_tokens"], "prefill_tokens": prefill_tokens,
            "prefill_tokens_per_second": round(prefill_tokens / prefill_seconds, 1),
            "decode_tokens": decode_tokens, "decode_tokens_per_second": round(decode_tokens / decode_seconds, 1),
            "fit_context_tokens": args.context, "peak_memory_gib": round(peak, 2) if peak is not None else None,
            "budget_gib": args.budget_gib,
        }
        report["fits"] = peak is None or peak <= args.budget_gib
        return report
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny random model instead of Qwen3-8B's shape (CPU smoke test)")
    parser.add_argument("--context", type=int, default=8192, help="context length that must fit")
    parser.add_argument("--budget-gib", type=float, default=24.0, help="memory of the target card (an L4 has 24 GB)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--scratch", default=None, help="directory for the random weights (needs ~16 GB free for 8B)")
    parser.add_argument("--out", type=Path, help="also write the report as JSON here")
    args = parser.parse_args()
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if not report["fits"]:
        print(f"FAIL: peak {report['peak_memory_gib']} GiB exceeds the {args.budget_gib} GiB budget", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
