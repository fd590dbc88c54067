"""How much hostile episodes in flight slow an innocent one: its action latency beside N hostile
episodes, against alone, for this checkout and for a baseline commit in the same run.

Each measurement is a fresh process that runs, like `explorer eval --concurrency`, several episodes
in one host process (a thread each, a sandbox each). The hostile episodes make the host work as
hard as their limits allow (back-to-back 50-hit searches with long queries, default limits); the
innocent one runs a cheap action (one search, a little arithmetic) again and again. We report the
innocent action's median and 95th-percentile latency, the limits it hit, and the variables it lost.

    python bench/interference.py                       # this checkout against the baseline commit
    python bench/interference.py --baseline 6e72d31 --hostile 0 1 4 8 --actions 40

The baseline is checked out with `git worktree` into a temporary directory and removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "6e72d31"  # the last commit whose tools ran in the policy's process

CHILD = r"""
import json, sys, threading, time
from paper_explorer.corpus import BM25Index, DemoConfig, generate
from paper_explorer.tools.sandbox import Limits, Sandbox

papers, hostile, actions = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
corpus = generate(DemoConfig(papers=papers, seed=3))
index = BM25Index.build(corpus)
HOSTILE = "for i in range(100000):\n    search('learning rate model data training results method paper table', k=50)"
stop = threading.Event()
hostile_limits = []

def attack():
    with Sandbox(corpus, Limits(), index=index) as sandbox:
        while not stop.is_set():
            hostile_limits.append(sandbox.execute(HOSTILE).limit_hit)

threads = [threading.Thread(target=attack, daemon=True) for _ in range(hostile)]
for thread in threads:
    thread.start()
time.sleep(2.0 if hostile else 0.0)  # the attack under way before the first innocent action
latencies, limits, lost = [], [], 0
with Sandbox(corpus, Limits(), index=index) as innocent:
    innocent.execute("kept = 0")
    for _ in range(actions):
        started = time.perf_counter()
        result = innocent.execute("hits = search('learning rate', k=3)\nkept = kept + 1\nkept")
        latencies.append(time.perf_counter() - started)
        limits.append(result.limit_hit)
        lost += result.variables_lost
stop.set()
print(json.dumps({"latencies": latencies, "limits": [l for l in limits if l], "lost": lost,
                  "hostile_limits": sorted(set(l for l in hostile_limits if l))}))
"""


def measure(checkout: Path, papers: int, hostile: int, actions: int) -> dict:
    environment = {**os.environ, "PYTHONPATH": str(checkout), "EXPLORER_CACHE_DIR": tempfile.gettempdir()}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(papers), str(hostile), str(actions)],
        capture_output=True,
        text=True,
        cwd=checkout,
        env=environment,
        timeout=3600,
    )
    if done.returncode != 0:
        raise SystemExit(f"the measurement in {checkout} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().split("\n")[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default=BASELINE, help=f"the commit to compare with (default {BASELINE}; 'none' to skip)")
    parser.add_argument("--hostile", type=int, nargs="+", default=[0, 1, 4, 8])
    parser.add_argument("--papers", type=int, default=400)
    parser.add_argument("--actions", type=int, default=40)
    args = parser.parse_args()
    checkouts = [("this checkout", ROOT)]
    worktree = None
    if args.baseline != "none":
        worktree = Path(tempfile.mkdtemp(prefix="interference-baseline-"))
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.baseline], check=True, capture_output=True
        )
        checkouts.append((f"baseline {args.baseline}", worktree))
    print(f"{os.cpu_count()} cores; {args.papers} papers; {args.actions} innocent actions per row")
    print(f"{'code':<20} {'hostile':>7} {'median ms':>10} {'p95 ms':>8} {'x alone':>8} {'limits hit':>11} {'vars lost':>9}")
    try:
        for name, checkout in checkouts:
            alone = None
            for hostile in args.hostile:
                row = measure(checkout, args.papers, hostile, args.actions)
                latencies = sorted(row["latencies"])
                median = statistics.median(latencies)
                p95 = latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))]
                alone = median if hostile == 0 else alone
                ratio = f"{median / alone:.1f}" if alone else "-"
                print(
                    f"{name:<20} {hostile:>7} {median * 1000:>10.1f} {p95 * 1000:>8.1f} {ratio:>8} "
                    f"{len(row['limits']):>11} {row['lost']:>9}",
                    flush=True,
                )
    finally:
        if worktree is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], capture_output=True)


if __name__ == "__main__":
    main()
