"""Episodes per second of the scripted policy on the 416-paper demo corpus, and where the time goes.

    python bench/episodes.py               # writes its section of bench/RESULTS.md
    python bench/episodes.py --no-write --questions 200

In-process: every question of the corpus (1,248 by default) through ``EpisodeRunner``, one
fresh sandbox per episode, timing each episode and splitting it into policy, tools (inside the
sandbox), the sandbox round trips around them, and the rest (starting the episode's sandbox,
the loop, building the record). Then ``explorer eval`` end to end, with 1 and 2 workers, on the
test split, as a user runs it (process start and corpus generation included).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import write_results  # noqa: E402
from paper_explorer.agent.policies import make_config, make_policy  # noqa: E402
from paper_explorer.agent.runner import EpisodeRunner  # noqa: E402
from paper_explorer.agent.trajectory import EpisodeConfig  # noqa: E402
from paper_explorer.corpus import BM25Index, generate  # noqa: E402


def in_process(questions: int) -> dict:
    corpus = generate()
    runner = EpisodeRunner(corpus, BM25Index.cached(corpus), make_policy(make_config("scripted")), EpisodeConfig())
    chosen = list(corpus.questions)[:questions]
    runner.run(chosen[0].text, chosen[0])  # warm-up
    totals = {"policy": 0.0, "tools": 0.0, "sandbox": 0.0, "episode": 0.0}
    per_episode = []
    started = time.perf_counter()
    for question in chosen:
        trajectory = runner.run(question.text, question)
        per_episode.append(trajectory.seconds)
        totals["episode"] += trajectory.seconds
        for step in trajectory.steps:
            totals["policy"] += step.timings.policy_seconds
            totals["tools"] += step.timings.tools_seconds
            totals["sandbox"] += step.timings.sandbox_seconds - step.timings.tools_seconds
    wall = time.perf_counter() - started
    totals["other"] = totals["episode"] - totals["policy"] - totals["tools"] - totals["sandbox"]
    return {"episodes": len(chosen), "wall": wall, "per_episode": per_episode, "totals": totals}


def through_cli(workers: int) -> tuple[float, int]:
    explorer = Path(sys.executable).parent / "explorer"
    with tempfile.TemporaryDirectory() as directory:
        started = time.perf_counter()
        subprocess.run([str(explorer), "eval", "--out", f"{directory}/run", "--workers", str(workers)], check=True, capture_output=True)
        seconds = time.perf_counter() - started
        episodes = sum(1 for _ in open(f"{directory}/run/trajectories.jsonl"))
    return seconds, episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=1248, help="questions run in process")
    parser.add_argument("--no-write", action="store_true", help="print the table without updating bench/RESULTS.md")
    args = parser.parse_args()

    measured = in_process(args.questions)
    totals, episodes = measured["totals"], measured["episodes"]
    p50 = statistics.median(measured["per_episode"]) * 1000
    p95 = float(np.percentile(measured["per_episode"], 95)) * 1000
    lines = [
        "| how | episodes | wall s | episodes/s | episode p50 ms | episode p95 ms |",
        "|---|---:|---:|---:|---:|---:|",
        f"| in process, 1 worker | {episodes} | {measured['wall']:.2f} | {episodes / measured['wall']:.1f} | {p50:.1f} | {p95:.1f} |",
    ]
    cli = {}
    for workers in (1, 2):
        seconds, count = through_cli(workers)
        cli[workers] = count / seconds
        lines.append(f"| `explorer eval --workers {workers}` (test split) | {count} | {seconds:.2f} | {count / seconds:.1f} | | |")
    lines += [
        "",
        "| share of episode time | % |",
        "|---|---:|",
    ]
    labels = {
        "policy": "policy (choosing the action)",
        "tools": "tools (search, read, extract, submit)",
        "sandbox": "sandbox round trips around the tools",
        "other": "episode sandbox start, loop and record",
    }
    for key, label in labels.items():
        lines.append(f"| {label} | {100 * totals[key] / totals['episode']:.1f} |")
    lines += ["", f"- `--workers 2` / `--workers 1` throughput through the CLI: {cli[2] / cli[1]:.2f}x on 2 cores."]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_results("## Episodes (bench/episodes.py)", "python bench/episodes.py", ("RestrictedPython", "pydantic"), text)


if __name__ == "__main__":
    main()
