"""Typed decisions: options scored per second with the prompt's cache computed once and the options
in batched passes (``--mode shared``), against one full pass of prompt and option per option
(``--mode separate``), for k options of mixed lengths after a document of about 1k and 4k tokens,
measured in the same run on each model; and, with --vllm, the openai backend against a real vLLM
(one request listing every option against one request per option).

    python bench/decisions.py                        # writes its section of bench/RESULTS.md
    python bench/decisions.py --no-write --models tiny --options 3 10 --documents 1000

One torch thread. Each figure is the median of --repeats runs of one question, the prompt's cache
dropped before each (a question alone; the questions of one document would share it as well).
Separate passes cost the same per option whatever k is, so they are timed on at most
--separate-sample options spread over the k (every length represented) and scaled to k; the table
says how many were timed. The agreement column is the largest difference between the two modes'
log-likelihoods over those options.

Models: the tiny random-weight Qwen3 (``explorer tiny-model``, a 2-layer model on a small
vocabulary), the same on the real Qwen3 vocabulary (151,669 tokens: the cost of the logits), and
SmolLM2-135M-Instruct (``make smollm2``), each skipped with a note when it is not there.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import write_results  # noqa: E402
from paper_explorer.agent.testing.tiny_model import build_tiny_model  # noqa: E402
from paper_explorer.corpus import DemoConfig, generate  # noqa: E402
from paper_explorer.decisions.prompts import build, load_prompts  # noqa: E402

SMOLLM2 = ROOT / ".models" / "smollm2-135m-instruct"
QWEN3_TOKENIZER = ROOT.parent / "shared" / "tokenizers" / "qwen3-8b"
QUESTION = "Which of these does the document support?"


def corpus_words() -> tuple[str, list[str]]:
    """A long text (the demo corpus's paragraphs) and its distinct words, for documents and options."""
    corpus = generate(DemoConfig(papers=60, seed=3))
    text = " ".join(paragraph.text for paragraph in corpus.paragraphs())
    words = sorted({word.strip(".,;:()") for word in text.split() if word.isalpha()})
    return text, words


def mixed_options(words: list[str], k: int) -> list[str]:
    """k distinct options of 1 to 8 words (the option's own number keeps them distinct)."""
    return [f"{index + 1} " + " ".join(words[(index * 7 + j) % len(words)] for j in range(index % 8)) for index in range(k)]


def time_question(backend, prompt: list[int], options: list[list[int]], mode: str) -> tuple[float, list[float]]:
    if hasattr(backend, "scorer"):
        backend.scorer.forget()
    started = time.perf_counter()
    scored = backend.score(prompt, options, mode)
    return time.perf_counter() - started, scored.loglikelihoods


def measure(backend, label: str, document: list[int], texts, words, args, rows: list[str], counts: list[int], timed: int) -> None:
    """One row per k in ``counts``: shared and separate (``timed`` options, scaled to k)."""
    for k in counts:
        options = mixed_options(words, k)
        built = build(backend.renderer, texts, "choice", QUESTION, document, options, context=backend.max_context)
        assert built.prompt is not None, built.overflow
        step = max(1, k // timed)
        sample = list(range(0, k, step))[:timed]
        shared_seconds, separate_seconds, agreement = [], [], 0.0
        for _ in range(args.repeats):
            seconds, shared = time_question(backend, built.prompt, built.options, "shared")
            shared_seconds.append(seconds)
            seconds, alone = time_question(backend, built.prompt, [built.options[index] for index in sample], "separate")
            separate_seconds.append(seconds * k / len(sample))
            agreement = max(agreement, *(abs(shared[index] - value) for index, value in zip(sample, alone, strict=True)))
        shared_median, separate_median = statistics.median(shared_seconds), statistics.median(separate_seconds)
        option_tokens = sum(map(len, built.options))
        rows.append(
            f"| {label} | {len(built.prompt):,} | {k} | {option_tokens:,} | {shared_median:.3f} | {k / shared_median:,.1f} | "
            f"{separate_median:.3f} | {k / separate_median:,.1f} | {len(sample)} | {separate_median / shared_median:.1f}x | {agreement:.1e} |"
        )
        print(rows[-1], flush=True)


def models(args, directory: Path) -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    if "tiny" in args.models:
        found.append(("tiny", build_tiny_model(directory / "tiny")))
    if "qwen3-vocab" in args.models:
        if QWEN3_TOKENIZER.exists():
            found.append(("tiny, Qwen3 vocabulary", build_tiny_model(directory / "qwen3-vocab", tokenizer_from=QWEN3_TOKENIZER)))
        else:
            print(f"note: no Qwen3 tokenizer at {QWEN3_TOKENIZER}; the Qwen3-vocabulary model is skipped", file=sys.stderr)
    if "smollm2" in args.models:
        if (SMOLLM2 / "config.json").exists():
            found.append(("SmolLM2-135M", SMOLLM2))
        else:
            print(f"note: no SmolLM2 at {SMOLLM2} (make smollm2); skipped", file=sys.stderr)
    return found


def served(args, tiny: Path, local, directory: Path, texts, text: str, words: list[str]) -> list[str]:
    """The openai backend against a real vLLM serving the tiny model: one request listing every
    option (chunks of 32) against one request per option, each repeat on a document the server
    has not seen (its prefix cache would otherwise hold it from the previous repeat); agreement:
    the largest difference from the local hf backend's log-likelihoods of the same prompts."""
    from paper_explorer.agent.testing.vllm_server import running_vllm
    from paper_explorer.decisions.server_backend import ServerBackend

    rows = []
    # Without LoRA: vLLM 0.32's CPU LoRA logits path fails on prompt_logprobs of several prompts in one batch.
    with running_vllm(tiny, directory / "vllm.log", max_model_len=8192, kv_cache_bytes=1 << 30, lora=False) as server:
        backend = ServerBackend.load(server.url, server.model, tiny)
        tokens = backend.renderer.text(text)
        for size in args.vllm_documents:
            for k in args.options:
                options = mixed_options(words, k)
                timings: dict[str, list[float]] = {"shared": [], "separate": []}
                agreement = 0.0
                for repeat in range(args.repeats):
                    for mode in ("shared", "separate"):
                        start = (repeat * 2 + (mode == "separate")) * 17 + k  # a document the server's cache does not hold
                        document = tokens[start : start + size]
                        built = build(backend.renderer, texts, "choice", QUESTION, document, options, context=backend.max_context)
                        assert built.prompt is not None, built.overflow
                        seconds, loglikelihoods = time_question(backend, built.prompt, built.options, mode)
                        timings[mode].append(seconds)
                        if repeat == 0:
                            mine = time_question(local, built.prompt, built.options, "shared")[1]
                            agreement = max(agreement, *(abs(a - b) for a, b in zip(loglikelihoods, mine, strict=True)))
                shared, separate = statistics.median(timings["shared"]), statistics.median(timings["separate"])
                rows.append(
                    f"| tiny on vLLM | {len(built.prompt):,} | {k} | {shared:.3f} | {k / shared:,.1f} | {separate:.3f} | "
                    f"{k / separate:,.1f} | {separate / shared:.1f}x | {agreement:.1e} |"
                )
                print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "qwen3-vocab", "smollm2"], choices=["tiny", "qwen3-vocab", "smollm2"])
    parser.add_argument("--documents", nargs="+", type=int, default=[1000, 4000], help="document lengths in tokens")
    parser.add_argument("--options", nargs="+", type=int, default=[3, 10, 40, 160], help="option counts k")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--separate-sample", type=int, default=10, help="separate passes timed per question, scaled to k")
    parser.add_argument(
        "--smollm2-documents", nargs="+", type=int, default=[1000], help="SmolLM2's document lengths (a 4k pass takes a minute)"
    )
    parser.add_argument("--smollm2-options", nargs="+", type=int, default=[3, 40], help="SmolLM2's option counts")
    parser.add_argument("--smollm2-separate-sample", type=int, default=2, help="SmolLM2's separate passes timed per question")
    parser.add_argument(
        "--vllm", action="store_true", help="also time the openai backend on a real vLLM (make vllm) serving the tiny model"
    )
    parser.add_argument("--vllm-documents", nargs="+", type=int, default=[1000], help="document lengths on vLLM")
    parser.add_argument("--no-write", action="store_true", help="print the tables without updating bench/RESULTS.md")
    args = parser.parse_args()

    import torch

    from paper_explorer.decisions.backends import LocalBackend

    torch.set_num_threads(1)
    texts = load_prompts()
    text, words = corpus_words()
    started = time.perf_counter()
    rows = [
        "| model | prompt tokens | k | option tokens | shared s | options/s | separate s | options/s | separate timed | separate / shared | agreement |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        found = models(args, directory)
        backends = {}
        for label, path in found:
            backend = backends[label] = LocalBackend.load(str(path), threads=1)
            tokens = backend.renderer.text(text)
            large = label == "SmolLM2-135M"
            counts, timed = (args.smollm2_options, args.smollm2_separate_sample) if large else (args.options, args.separate_sample)
            for size in args.smollm2_documents if large else args.documents:
                if size > len(tokens):
                    raise SystemExit(f"the corpus text is {len(tokens)} tokens of {label}; ask for shorter --documents")
                measure(backend, label, tokens[:size], texts, words, args, rows, counts, timed)
        tiny = dict(found).get("tiny")
        server_rows = served(args, tiny, backends["tiny"], directory, texts, text, words) if args.vllm and tiny is not None else []
    seconds = time.perf_counter() - started
    load = os.getloadavg()[0]
    notes = [
        "",
        "- shared: the prompt's KV cache computed once, the options in batched passes over copies of it (at most 65,536 cached-plus-option "
        "positions a batch); separate: one full forward pass of prompt and option per option, no cache. Both give each option's summed "
        "log-probability; agreement is the largest difference between them (float32).",
        f"- One torch thread; medians of {args.repeats} runs of each question; separate timed on the options counted in 'separate timed' "
        "(spread over the k, so every length is in) and scaled to k. SmolLM2 by its own --smollm2-* settings: a pass of its "
        "prompt takes seconds on one loaded core.",
        f"- The machine has 2 cores shared with other sessions' work (load average {load:.1f} when this finished, {seconds / 60:.1f} min "
        "in all), so the times are noisy; the ratios, measured in the same run, are what to read.",
    ]
    if server_rows:
        notes += [
            "",
            "The openai backend (`explorer decide --backend openai`) against the real vLLM of `make vllm` (CPU build, float32) serving the "
            "tiny model: shared sends one /completions request listing prompt+option for every option (chunks of 32) with "
            "prompt_logprobs 0; separate one request per option. Each run on a document the server had not seen, so its prefix cache "
            "holds nothing at the start. vLLM (v1) never reads its prefix cache for a request that asks for prompt_logprobs "
            "(SamplingParams.skip_reading_prefix_cache), so both modes compute every option's whole prompt on the server: the list "
            "saves requests and lets the server batch them, not the k prompt passes.",
            "",
            "| server | prompt tokens | k | shared s | options/s | separate s | options/s | separate / shared | agreement with hf |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            *server_rows,
        ]
    table = "\n".join(rows + notes)
    print(table)
    if not args.no_write:
        command = "python bench/decisions.py " + " ".join(sys.argv[1:])
        write_results(
            "## Typed decisions: one shared pass against a pass per option (bench/decisions.py)",
            command.strip(),
            ("torch", "transformers"),
            table,
        )


if __name__ == "__main__":
    main()
