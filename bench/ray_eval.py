"""Episodes per second of `explorer eval --ray` on 1 and 2 local Ray nodes against `--workers` on
the same machine, and what the driver spends per episode.

    python bench/ray_eval.py               # writes its section of bench/RESULTS.md
    python bench/ray_eval.py --no-write --samples 1 --repeats 1

Every run is `explorer eval` of the scripted policy on the demo corpus's test split as a user
types it (process start, corpus generation and scoring included), alternating the ways so that
a change in the machine's load falls on all of them; the table gives medians. The Ray cluster is
started here with `ray.cluster_utils.Cluster`: a head with no CPU (it serves the driver only) and
worker nodes of one CPU each, as `ray start --num-cpus 1` on separate machines would make them.
On one 2-core machine the nodes share the cores with the driver and with Ray's own processes, so
these figures are Ray's cost where it cannot add cores, not its gain where it can.

The driver's overhead per episode is measured in this process, in one more run on 1 node: the
CPU time (``time.process_time``: every thread of the driver, Ray's own included) of the loop that
submits the tasks, waits, receives and unpickles their trajectories and appends them to the log,
divided by the episodes. Starting up and scoring are left out: a one-process run pays them too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import write_results  # noqa: E402


def timed_eval(args: list[str], cache: Path) -> tuple[float, float, int]:
    """(wall seconds, the driver's CPU seconds, episodes) of one `explorer eval`."""
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "run"
        command = [sys.executable, "-m", "paper_explorer.cli.main", "eval", "--split", "test", *args, "--out", str(out)]
        env = {**os.environ, "EXPLORER_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed: {process.stderr.read().decode() if process.stderr else ''}")
        episodes = (out / "trajectories.jsonl").read_bytes().count(b"\n")
    return wall, usage.ru_utime + usage.ru_stime, episodes


def driver_loop(address: str, samples: int) -> dict:
    """CPU and wall seconds of the driver's episode loop (``_Run._run_all``) in one Ray run in this process."""
    from paper_explorer import EvalConfig, evaluate
    from paper_explorer.evaluation import run as evaluation_run

    measured: dict = {}
    original = evaluation_run._Run._run_all

    def timed(self, units, *rest):
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            return original(self, units, *rest)
        finally:
            measured.update(cpu=time.process_time() - cpu, wall=time.perf_counter() - wall, episodes=len(units))

    evaluation_run._Run._run_all = timed  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as directory:
            evaluate(EvalConfig(split="test", samples=samples, ray=address), out=Path(directory) / "run")
    finally:
        evaluation_run._Run._run_all = original  # type: ignore[method-assign]
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=2, help="episodes per test question (189 questions)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each way; the table gives medians")
    parser.add_argument("--no-write", action="store_true", help="print the table without updating bench/RESULTS.md")
    args = parser.parse_args()

    from ray.cluster_utils import Cluster

    cache = Path(tempfile.mkdtemp(prefix="bench-ray-cache-"))
    os.environ["EXPLORER_CACHE_DIR"] = str(cache)  # the nodes' worker processes inherit it
    os.environ["PYTHONPATH"] = str(ROOT)
    samples = ["--samples", str(args.samples)]
    subprocess.run(  # builds the index cache once, outside every timing
        [sys.executable, "-m", "paper_explorer.cli.main", "eval", "--limit", "1", "--out", str(cache / "warm")],
        check=True,
        capture_output=True,
    )
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ways: dict[str, list[str]] = {
            "`--workers 1`": samples,
            "`--workers 2`": [*samples, "--workers", "2"],
            "`--ray`, 1 node of 1 CPU": [*samples, "--ray", cluster.address],
        }
        runs: dict[str, list[tuple[float, float, int]]] = {way: [] for way in ways}
        for _ in range(args.repeats):
            for way, flags in ways.items():
                runs[way].append(timed_eval(flags, cache))
        driver = driver_loop(cluster.address, args.samples)
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        two = "`--ray`, 2 nodes of 1 CPU"
        runs[two] = [timed_eval([*samples, "--ray", cluster.address], cache) for _ in range(args.repeats)]
    finally:
        cluster.shutdown()

    lines = [
        "| how | episodes | wall s (median) | episodes/s | driver CPU s |",
        "|---|---:|---:|---:|---:|",
    ]
    rate = {}
    for way, measured in runs.items():
        wall = statistics.median(m[0] for m in measured)
        cpu = statistics.median(m[1] for m in measured)
        episodes = measured[0][2]
        rate[way] = episodes / wall
        lines.append(f"| {way} | {episodes} | {wall:.2f} | {rate[way]:.1f} | {cpu:.2f} |")
    lines += [
        "",
        f"- 2 Ray nodes / 1 Ray node: {rate[two] / rate['`--ray`, 1 node of 1 CPU']:.2f}x; "
        f"2 Ray nodes / `--workers 2`: {rate[two] / rate['`--workers 2`']:.2f}x; "
        f"`--workers 2` / `--workers 1`: {rate['`--workers 2`'] / rate['`--workers 1`']:.2f}x.",
        f"- The driver's loop on 1 node ({driver['episodes']} episodes): {1000 * driver['cpu'] / driver['episodes']:.2f} ms of CPU "
        f"per episode, of {1000 * driver['wall'] / driver['episodes']:.2f} ms of wall time per episode.",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_results("## Episodes as Ray tasks (bench/ray_eval.py)", "python bench/ray_eval.py", ("ray", "RestrictedPython"), text)


if __name__ == "__main__":
    main()
