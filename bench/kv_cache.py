"""Multi-turn KV cache reuse in the hf policy: tokens prefilled and time per 10-step episode,
with the cache kept across steps vs re-encoding the whole prompt every step, in one run.

    python bench/kv_cache.py               # writes its section of bench/RESULTS.md
    python bench/kv_cache.py --no-write --episodes 3

Runs the tiny random-weight Qwen3 (``explorer tiny-model``) on CPU, so the times say little
about a GPU (bench/gpu_check.py measures that); the token counts are what the cache changes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import write_results  # noqa: E402
from paper_explorer.agent.policies.hf import HFPolicy  # noqa: E402
from paper_explorer.agent.renderer import ChatRenderer  # noqa: E402
from paper_explorer.agent.runner import EpisodeRunner  # noqa: E402
from paper_explorer.agent.testing.tiny_model import build_tiny_model  # noqa: E402
from paper_explorer.agent.trajectory import EpisodeConfig  # noqa: E402
from paper_explorer.corpus import BM25Index, DemoConfig, generate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=10, help="episodes per setting")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--no-write", action="store_true", help="print the table without updating bench/RESULTS.md")
    args = parser.parse_args()

    corpus = generate(DemoConfig(papers=40, seed=7))
    index = BM25Index.build(corpus)
    rows = {}
    with tempfile.TemporaryDirectory() as directory:
        model = build_tiny_model(Path(directory) / "tiny")
        renderer = ChatRenderer.from_directory(model)
        for reuse in (True, False):
            policy = HFPolicy.load(str(model), max_new_tokens=args.max_new_tokens, reuse_cache=reuse)
            runner = EpisodeRunner(corpus, index, policy, EpisodeConfig(max_steps=10))
            prefilled, finals, seconds = [], [], []
            for question in list(corpus.questions)[: args.episodes]:
                trajectory = runner.run(question.text, question)
                prefilled.append(sum(step.generation.prefill_tokens for step in trajectory.steps))
                finals.append(len(renderer.render(trajectory.messages()).ids))
                seconds.append(sum(step.timings.policy_seconds for step in trajectory.steps))
            rows[reuse] = (prefilled, finals, seconds)

    lines = [
        "| prompt handling | episodes | steps | final length (tokens, median) | prefilled (tokens, median) | prefilled / final | policy s per episode (median) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for reuse, label in ((True, "KV cache kept across steps (ours)"), (False, "whole prompt re-encoded each step")):
        prefilled, finals, seconds = rows[reuse]
        ratio = statistics.median(p / f for p, f in zip(prefilled, finals))
        lines.append(
            f"| {label} | {len(prefilled)} | 10 | {statistics.median(finals):,.0f} | {statistics.median(prefilled):,.0f} | "
            f"{ratio:.2f}x | {statistics.median(seconds):.3f} |"
        )
    cached, naive = rows[True], rows[False]
    lines += [
        "",
        f"- Re-encoding prefills {statistics.median(naive[0]) / statistics.median(cached[0]):.1f}x the tokens the cache does "
        f"(target for ours: prefilled <= 1.1x the final length); the tiny model on CPU, {args.max_new_tokens} new tokens per step.",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_results("## KV cache reuse (bench/kv_cache.py)", "python bench/kv_cache.py", ("torch", "transformers"), text)


if __name__ == "__main__":
    main()
