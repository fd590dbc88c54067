"""Episodes in flight against a served model: `eval --concurrency N`, `--workers N` and both together.

    python bench/concurrency.py                 # writes its section of bench/RESULTS.md
    python bench/concurrency.py --levels 1,8,64 --no-write

A local OpenAI-compatible server (bench/latency_server.py) answers every completion after a fixed
latency (200 ms by default) with a scripted action: a search, then a submit. `explorer eval
--policy openai` runs against it as a user would run it, once per concurrency level, then with
`--workers N` processes (one episode each, at most 64), then with both: `--workers W --concurrency
N/W` (W processes, N/W in flight in each; N in flight in all). Measured per run:

- steps/s: completion requests per second at the server, over the middle 80% of the run's
  requests (start-up and the last stragglers left out); episodes/s is steps/s over 2;
- ideal: N in flight / latency (what a host that cost nothing would reach); efficiency = measured / ideal;
- host CPU: user + system seconds of the eval process and all it started (zygote, sandbox
  workers), from wait4, per step;
- memory: the largest sum of PSS (proportional set size: shared pages split between the
  processes sharing them) over the eval process and its descendants, sampled every 2 s; per
  episode in flight = (peak at N - peak at 1) / (N - 1).

The server runs on the same cores and its CPU is reported too: on 2 cores, host and server share them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from common import ROOT, write_results

from paper_explorer.agent.renderer import ChatRenderer

QWEN3 = ROOT.parent / "shared" / "tokenizers" / "qwen3-8b"
DEMO_QUESTIONS = 1248  # questions in every split of the demo corpus


def start_server(latency: float, im_start: int) -> tuple[subprocess.Popen, str]:
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "latency_server.py"), "--latency", str(latency), "--im-start", str(im_start)],
        stdout=subprocess.PIPE,
        text=True,
    )
    port = server.stdout.readline().split()[-1]
    return server, f"http://127.0.0.1:{port}/v1"


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def pss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as handle:
                for line in handle:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
    return total


def how_flags(how: str, level: int) -> list[str]:
    """``concurrency``, ``workers``, or ``workers=W``: W processes sharing ``level`` in flight."""
    if how.startswith("workers="):
        workers = int(how.split("=")[1])
        return ["--workers", str(workers), "--concurrency", str(level // workers)]
    return [f"--{how}", str(level)]


def how_label(how: str, level: int) -> str:
    return " ".join(how_flags(how, level)) if how.startswith("workers=") else f"--{how}"


def run_eval(url: str, tokenizer: Path, how: str, level: int, episodes: int, out: Path) -> dict:
    limit = min(DEMO_QUESTIONS, episodes)
    samples = math.ceil(episodes / limit)
    command = [
        sys.executable,
        "-m",
        "paper_explorer.cli.main",
        "eval",
        "--policy",
        "openai",
        "--base-url",
        url,
        "--model",
        "policy",
        "--tokenizer",
        str(tokenizer),
        "--split",
        "all",
        "--limit",
        str(limit),
        "--samples",
        str(samples),
        "--max-steps",
        "4",
        "--out",
        str(out),
        *how_flags(how, level),
    ]
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = [0]

    def sample() -> None:
        while process.poll() is None:
            peak[0] = max(peak[0], pss_bytes(descendants(process.pid)))
            time.sleep(2.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    stderr = process.stderr.read()
    if process.returncode != 0:
        raise SystemExit(f"explorer eval {' '.join(how_flags(how, level))} failed: {stderr[-2000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    return {
        "wall": time.monotonic() - started,
        "cpu": usage.ru_utime + usage.ru_stime,
        "peak_pss": peak[0],
        "episodes": limit * samples,
        "status": metrics["status"],
    }


def arrivals(url: str) -> list[float]:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/stats") as answer:
        return json.loads(answer.read())["arrivals"]


def steady_rate(times: list[float]) -> float:
    times = sorted(times)
    low, high = int(len(times) * 0.1), int(len(times) * 0.9)
    if high - low < 2 or times[high] == times[low]:
        return float("nan")
    return (high - low) / (times[high] - times[low])


def server_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(tokenizer: Path, latency: float, how: str, level: int, episodes: int) -> dict:
    renderer = ChatRenderer.from_directory(tokenizer)
    server, url = start_server(latency, renderer.tokenizer.token_to_id("<|im_start|>"))  # the bench tokenizer is Qwen3-style
    try:
        with tempfile.TemporaryDirectory() as folder:
            before = server_cpu(server.pid)
            result = run_eval(url, tokenizer, how, level, episodes, Path(folder) / "run")
            times = arrivals(url)
            result.update(steps=len(times), steps_per_s=steady_rate(times), server_cpu=server_cpu(server.pid) - before)
    finally:
        server.kill()
        server.wait()
    result.update(how=how, level=level, ideal=level / latency, latency=latency)
    return result


def table(results: list[dict]) -> str:
    baseline = {r["how"]: r["peak_pss"] for r in results if r["level"] == 1}
    lines = [
        "| how | latency ms | in flight | episodes | steps/s | ideal steps/s | efficiency | episodes/s | host CPU ms/step | "
        "server CPU ms/step | peak PSS MiB | MiB per extra episode in flight |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        per = (
            (r["peak_pss"] - baseline.get(r["how"], baseline.get("concurrency", r["peak_pss"]))) / (r["level"] - 1) / 2**20
            if r["level"] > 1
            else float("nan")
        )
        lines.append(
            f"| `{how_label(r['how'], r['level'])}` | {r['latency'] * 1000:.0f} | {r['level']} | {r['episodes']} | {r['steps_per_s']:.1f} | {r['ideal']:.0f} | "
            f"{r['steps_per_s'] / r['ideal']:.0%} | {r['steps_per_s'] / 2:.1f} | {1000 * r['cpu'] / r['steps']:.2f} | "
            f"{1000 * r['server_cpu'] / r['steps']:.2f} | {r['peak_pss'] / 2**20:.0f} | " + ("" if math.isnan(per) else f"{per:.1f}") + " |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2, help="seconds the server takes per completion")
    parser.add_argument("--levels", default="1,4,16,64,128,256,512", help="--concurrency levels")
    parser.add_argument("--workers", default="1,4,16,64", help="--workers levels (at most 64)")
    parser.add_argument("--together", type=int, default=2, help="W processes for the series with both flags (default 2, one per core)")
    parser.add_argument("--together-levels", default="64,256,512", help="episodes in flight in all W processes together")
    parser.add_argument("--slow-latency", type=float, default=1.0, help="a second, slower server (a longer generation)")
    parser.add_argument("--slow-levels", default="256,512", help="--concurrency levels against the slower server")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=QWEN3 if QWEN3.exists() else None,
        help="a Qwen3 tokenizer directory (default: ../shared/tokenizers/qwen3-8b)",
    )
    parser.add_argument("--no-write", action="store_true", help="print the table without updating bench/RESULTS.md")
    arguments = parser.parse_args()
    if arguments.tokenizer is None:
        raise SystemExit("give --tokenizer (a Qwen3 tokenizer directory, e.g. one `explorer tiny-model` writes)")
    results = []
    series = (
        ("concurrency", arguments.levels, arguments.latency),
        ("workers", arguments.workers, arguments.latency),
        (f"workers={arguments.together}", arguments.together_levels, arguments.latency),
        ("concurrency", arguments.slow_levels, arguments.slow_latency),
    )
    for how, levels, latency in series:
        for level in (int(value) for value in levels.split(",") if value):
            episodes = max(60, 8 * level)
            result = measure(arguments.tokenizer, latency, how, level, episodes)
            print(
                f"{' '.join(how_flags(how, level))} at {latency * 1000:.0f} ms: {result['steps_per_s']:.1f} steps/s of {result['ideal']:.0f} ideal, "
                f"{1000 * result['cpu'] / result['steps']:.2f} host CPU ms/step, peak PSS {result['peak_pss'] / 2**20:.0f} MiB",
                flush=True,
            )
            results.append(result)
    text = table(results)
    print(text)
    if not arguments.no_write:
        write_results(
            "## Episodes in flight against a served model (bench/concurrency.py)",
            "python bench/concurrency.py",
            ("tokenizers",),
            text + "\n\n" + notes(results),
        )


def notes(results: list[dict]) -> str:
    lines = ["- An episode is 2 steps (search, submit); the prompts are rendered with Qwen3-8B's tokenizer."]
    for how in dict.fromkeys(r["how"] for r in results):
        for at in sorted({r["latency"] for r in results if r["how"] == how}):
            rows = [r for r in results if r["how"] == how and r["latency"] == at]
            good = [r["level"] for r in rows if r["steps_per_s"] >= 0.8 * r["ideal"]]
            best = max(rows, key=lambda r: r["steps_per_s"])
            cores_used = best["steps_per_s"] * best["cpu"] / best["steps"]
            label = how_label(how, 2).replace("--concurrency 1", "--concurrency N/W") if how.startswith("workers=") else f"--{how}"
            lines.append(
                f"- `{label}` at {at * 1000:.0f} ms: at least 80% of the ideal throughput up to "
                f"{max(good) if good else 'none of the levels'} in flight; the most measured was "
                f"{best['steps_per_s']:.0f} steps/s ({best['level']} in flight), using {cores_used:.2f} of the "
                f"{os.cpu_count()} cores for the eval process and its sandbox workers."
            )
    fastest = min((r["latency"] for r in results if r["how"] == "concurrency"), default=None)
    concurrent = [r for r in results if r["how"] == "concurrency" and r["latency"] == fastest]
    if concurrent:
        best = max(concurrent, key=lambda r: r["steps_per_s"])
        deep = max(concurrent, key=lambda r: r["level"])
        per_step = 1000 * deep["cpu"] / deep["steps"]
        lines.append(
            f"- Where it stops: at {deep['level']} in flight each step costs {per_step:.1f} ms of CPU in the eval process and "
            f"its sandbox workers (rendering the prompt, the request, the action's sandbox round trip and tool calls, the "
            f"episode's sandbox start shared by its steps, the log), so {os.cpu_count()} cores could serve at most about "
            f"{1000 * os.cpu_count() / per_step:.0f} steps/s. One process peaks lower, at {best['steps_per_s']:.0f} steps/s "
            f"({best['level']} in flight): its Python work (rendering, requests, the log) shares one interpreter lock, "
            f"and every episode's worker is forked by its process's one zygote, one at a time; W processes have W of "
            f"each. `--workers` alone pays, in every process, for starting its own zygote and episode hosts' fork server "
            f"(two interpreters, and the corpus sent to one): use it for CPU-bound policies, not against servers."
        )
    goal = 0.8 * 256 / fastest if fastest else None
    at_256 = [r for r in results if r["level"] == 256 and r["latency"] == fastest]
    if goal and at_256:
        best = max(at_256, key=lambda r: r["steps_per_s"])
        lines.append(
            f"- The goal, 80% of the ideal at 256 in flight against a {fastest * 1000:.0f} ms server ({goal:,.0f} steps/s), is "
            + ("met" if best["steps_per_s"] >= goal else "not met")
            + f" on these cores: the best at 256 was `{how_label(best['how'], 256)}` with {best['steps_per_s']:.0f} steps/s "
            f"({best['steps_per_s'] / best['ideal']:.0%}), {1000 * best['cpu'] / best['steps']:.2f} ms of host CPU per step."
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
