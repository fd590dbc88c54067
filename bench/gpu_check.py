"""The GPU check: Qwen3-8B's architecture with random weights (nothing downloaded), loaded in 4-bit
NF4 with double quantization, running a 10-step episode with KV cache reuse; reports prefill and
decode tokens/s and peak memory, and fails when the 4-bit model plus an 8,192-token context
would not fit the target card (24 GB, an L4, by default). Then QLoRA training steps with the
default recipe (LoRA r=4 on all projections, gradient checkpointing, the assistant-only loss) at
8,192 tokens: peak memory and tokens/s, beside ``explorer train --dry-run``'s estimate; the
recipe must stay below 22 GiB.

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

from paper_explorer.sft.memory import GIB, QWEN3_8B  # noqa: E402  (Qwen/Qwen3-8B's published config; the weights here are random)

TRAIN_BUDGET_GIB = 22.0


def build_random_model(shape: dict, directory: Path, tokenizer_from: Path) -> Path:
    """Random bf16 weights of ``shape`` plus the tiny tokenizer, saved as a model directory."""
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = Tokenizer.from_file(str(tokenizer_from / "tokenizer.json"))
    im_end = tokenizer.token_to_id("<|im_end|>")
    config = Qwen3Config(**shape, eos_token_id=im_end, torch_dtype="bfloat16")
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # build in 16 bits: 8B parameters in fp32 would need 32 GB of host memory
    try:
        model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.save_pretrained(directory)
    del model
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_from / name, directory / name)
    return directory


def run(args) -> dict:
    import torch

    from paper_explorer.agent.policies.hf import HFPolicy
    from paper_explorer.agent.runner import EpisodeRunner
    from paper_explorer.agent.testing.tiny_model import TINY_SHAPE, build_tiny_model
    from paper_explorer.agent.trajectory import EpisodeConfig
    from paper_explorer.corpus import BM25Index, DemoConfig, generate

    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        raise SystemExit("no CUDA device: run with --tiny for the CPU smoke test")
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-", dir=args.scratch))
    try:
        tiny = build_tiny_model(scratch / "tiny")
        model_dir = tiny if args.tiny else build_random_model(QWEN3_8B, scratch / "qwen3-8b-random", tiny)
        started = time.perf_counter()
        policy = HFPolicy.load(
            str(model_dir),
            quantization="4bit" if cuda else "none",
            max_new_tokens=args.max_new_tokens,
            max_context=max(args.context, 32_768),
        )
        load_seconds = time.perf_counter() - started
        corpus = generate(DemoConfig(papers=40, seed=7))
        question = corpus.questions[0]
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        runner = EpisodeRunner(corpus, BM25Index.build(corpus), policy, EpisodeConfig(max_steps=10))
        trajectory = runner.run(question.text, question)
        steps = [step.generation for step in trajectory.steps]
        prefill_tokens = sum(g.prefill_tokens for g in steps)
        decode_tokens = sum(g.generated_tokens for g in steps)
        prefill_seconds = sum(g.prefill_seconds for g in steps)
        decode_seconds = sum(g.decode_seconds for g in steps)
        # the fit test: one prefill of a full-length context on top of the loaded model
        policy._reset()
        with torch.inference_mode():
            policy._forward([policy.renderer.end_of_turn] * args.context)
        peak = torch.cuda.max_memory_allocated() / GIB if cuda else None
        quantization = policy.quantization
        del policy, runner
        training = train_steps(model_dir, args, cuda) if args.train_steps else None
        shape = TINY_SHAPE if args.tiny else QWEN3_8B
        report = {
            "device": torch.cuda.get_device_name(0) if cuda else "cpu",
            "model": "tiny" if args.tiny else "Qwen3-8B architecture, random weights",
            "layers": shape["num_hidden_layers"],
            "quantization": quantization,
            "load_seconds": round(load_seconds, 1),
            "episode_steps": len(steps),
            "episode_status": trajectory.outcome.status,
            "prompt_tokens_final": steps[-1].prompt_tokens,
            "prefill_tokens": prefill_tokens,
            "prefill_tokens_per_second": round(prefill_tokens / prefill_seconds, 1),
            "decode_tokens": decode_tokens,
            "decode_tokens_per_second": round(decode_tokens / decode_seconds, 1),
            "fit_context_tokens": args.context,
            "peak_memory_gib": round(peak, 2) if peak is not None else None,
            "budget_gib": args.budget_gib,
        }
        report["fits"] = peak is None or peak <= args.budget_gib
        if training is not None:
            report["training"] = training
            report["fits"] = report["fits"] and training["fits"]
        return report
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def train_steps(model_dir: Path, args, cuda: bool) -> dict:
    """QLoRA optimizer steps with the default recipe on one sequence of ``--context`` tokens."""
    import gc
    import json as json_

    import torch

    from paper_explorer.sft.config import TrainConfig
    from paper_explorer.sft.memory import Shape, estimate
    from paper_explorer.sft.model import assistant_loss, load_model

    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    config = TrainConfig(model=str(model_dir), quantization="4bit" if cuda else "none", max_length=args.context)
    model, _ = load_model(config)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.learning_rate)
    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(10, min(vocab, 4000), (1, args.context), generator=generator).to(device)
    labels = torch.full_like(ids, -100)
    trained = int(args.context * args.trained_share)
    labels[0, -trained:] = ids[0, -trained:]  # the assistant share of a long multi-turn example
    seconds = []
    for _ in range(args.train_steps):
        started = time.perf_counter()
        loss, _, _ = assistant_loss(model, ids, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    peak = torch.cuda.max_memory_allocated() / GIB if cuda else None
    shape = Shape.from_config(json_.loads((model_dir / "config.json").read_text()))
    estimated = estimate(shape, args.context, config.lora_r, config.target_modules, quantized=cuda, trained_share=args.trained_share)[
        "total"
    ]
    steady = seconds[1:] or seconds
    return {
        "steps": args.train_steps,
        "context": args.context,
        "trained_share": args.trained_share,
        "lora_r": config.lora_r,
        "gradient_checkpointing": config.gradient_checkpointing,
        "last_loss": round(loss.item(), 4),
        "tokens_per_second": round(args.context / (sum(steady) / len(steady)), 1),
        "peak_memory_gib": round(peak, 2) if peak is not None else None,
        "dry_run_estimate_gib": round(estimated, 2),
        "budget_gib": TRAIN_BUDGET_GIB,
        "fits": peak is None or peak < TRAIN_BUDGET_GIB,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny random model instead of Qwen3-8B's shape (CPU smoke test)")
    parser.add_argument("--context", type=int, default=8192, help="context length that must fit")
    parser.add_argument("--budget-gib", type=float, default=24.0, help="memory of the target card (an L4 has 24 GB)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--train-steps", type=int, default=3, help="QLoRA optimizer steps to time (0 skips training)")
    parser.add_argument("--trained-share", type=float, default=0.25, help="share of the sequence that is assistant tokens")
    parser.add_argument("--scratch", default=None, help="directory for the random weights (needs ~16 GB free for 8B)")
    parser.add_argument("--out", type=Path, help="also write the report as JSON here")
    args = parser.parse_args()
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if not report["fits"]:
        training = report.get("training") or {}
        print(
            f"FAIL: inference peak {report['peak_memory_gib']} GiB (budget {args.budget_gib}), "
            f"training peak {training.get('peak_memory_gib')} GiB (budget {TRAIN_BUDGET_GIB})",
            file=sys.stderr,
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
