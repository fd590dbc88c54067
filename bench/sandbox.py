"""Running one action: our sandbox vs smolagents' LocalPythonExecutor vs a fresh interpreter per step.

    python bench/sandbox.py                # writes its section of bench/RESULTS.md
    python bench/sandbox.py --no-write --repeats 50

Four workloads, each timed from the host's side (code in, result out):

  trivial    ``1 + 1``
  search     ``hits = search("...", k=5)`` then the first hit's paper id
  loop       ``total = 0; for i in range(200000): total += i``
  start      a new episode's sandbox made ready and running its first trivial action

The executors:

  ours           ``tools.sandbox.Sandbox``: RestrictedPython in a worker forked from the zygote
                 behind seccomp; every tool call is an RPC to the host, which holds the index
                 (the episode-start row forks a new worker)
  in-worker      the previous design (``tools/sandbox.py`` at commit PREVIOUS, read from git):
                 a worker forked from the host that holds the index and runs the tools itself,
                 no zygote and no seccomp - the baseline the RPC's cost is measured against
  smolagents     ``LocalPythonExecutor`` in the host process (an AST interpreter, no process
                 isolation) with the same tool functions and its default 30 s timeout
  fresh-python   a new ``python -c`` per step that re-runs the episode's script so far, the
                 way a stateless REPL keeps variables; the "with tools" variant must load the
                 corpus and its (cached) index in every step before it can search

All run on the same generated 416-paper demo corpus, in one run.
"""

from __future__ import annotations

import argparse
import gc
import re
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
from paper_explorer.corpus import BM25Index, generate  # noqa: E402
from paper_explorer.corpus.writing import write_jsonl  # noqa: E402
from paper_explorer.tools.paper_tools import PaperTools  # noqa: E402
from paper_explorer.tools.sandbox import Limits, Sandbox  # noqa: E402

TRIVIAL = "1 + 1"
SEARCH = 'hits = search("What learning rate is used to train QuantLens?", k=5)\nhits[0]["paper_id"]'
LOOP = "total = 0\nfor i in range(200000):\n    total += i\ntotal"
WORKLOADS = {"trivial": TRIVIAL, "search": SEARCH, "loop": LOOP}
PACKAGES = ("RestrictedPython", "smolagents", "pyseccomp")
PREVIOUS = "b737a9e"  # the last commit whose worker held the corpus and ran the tools in-process


def _module_from_git(path: str, name: str):
    import importlib.util

    shown = subprocess.run(["git", "show", f"{PREVIOUS}:{path}"], cwd=ROOT, capture_output=True, text=True)
    if shown.returncode != 0:
        return None
    file = Path(tempfile.mkdtemp()) / f"{name}.py"
    # That commit's packages were top-level (corpus, tools, ...); today they live in paper_explorer.
    file.write_text(re.sub(r"^(\s*)from (corpus|tools|agent)\b", r"\1from paper_explorer.\2", shown.stdout, flags=re.M))
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def previous_sandbox_module():
    """The in-worker sandbox of commit PREVIOUS, with that commit's tools, loaded from git; None
    outside a git checkout."""
    tools_then = _module_from_git("tools/paper_tools.py", "previous_paper_tools")
    sandbox_then = _module_from_git("tools/sandbox.py", "previous_sandbox")
    if tools_then is None or sandbox_then is None:
        return None
    sandbox_then.PaperTools = tools_then.PaperTools
    return sandbox_then


def timed(call, repeats: int) -> list[float]:
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    return seconds


def bench_ours(corpus, index, repeats: dict[str, int], module=None) -> dict[str, list[float]]:
    """``module``: another sandbox module with the same interface (the previous design)."""
    results = {}
    sandbox_class, limits_class = (Sandbox, Limits) if module is None else (module.Sandbox, module.Limits)
    limits = limits_class(wall_seconds=60, cpu_seconds=60)
    with sandbox_class(corpus, limits, index=index) as sandbox:
        sandbox.execute(TRIVIAL)  # the worker's one-time set-up belongs to the start row
        for name, code in WORKLOADS.items():

            def run(code=code):
                result = sandbox.execute(code)
                assert result.error is None and result.limit_hit is None, result

            run()
            results[name] = timed(run, repeats[name])

    def start():
        with sandbox_class(corpus, limits, index=index) as sandbox:
            assert sandbox.execute(TRIVIAL).value == "2"

    start()
    results["start"] = timed(start, repeats["start"])
    return results


def bench_smolagents(corpus, index, repeats: dict[str, int]) -> dict[str, list[float]]:
    from smolagents.local_python_executor import LocalPythonExecutor

    def new_executor():
        executor = LocalPythonExecutor([])
        executor.send_tools(PaperTools(corpus, index).functions())
        return executor

    results = {}
    executor = new_executor()
    for name, code in WORKLOADS.items():
        run = lambda code=code: executor(code)  # noqa: E731
        run()
        results[name] = timed(run, repeats[name])
    results["start"] = timed(lambda: new_executor()(TRIVIAL), repeats["start"])
    return results


FRESH_PREAMBLE = """
import sys
sys.path.insert(0, {root!r})
from paper_explorer.corpus import BM25Index, load
from paper_explorer.tools.paper_tools import PaperTools
corpus = load({corpus!r})
globals().update(PaperTools(corpus, BM25Index.cached(corpus)).functions())
"""


def bench_fresh(corpus_file: Path, repeats: dict[str, int], with_tools: bool) -> dict[str, list[float]]:
    """Each step runs ``python -c`` on the episode's script so far (here: one earlier action)."""
    preamble = FRESH_PREAMBLE.format(root=str(ROOT), corpus=str(corpus_file)) if with_tools else ""

    def step(code: str, history: str = "x = 1\n"):
        subprocess.run([sys.executable, "-c", preamble + history + code], check=True, capture_output=True)

    names = ["search", "start"] if with_tools else ["trivial", "loop", "start"]
    results = {}
    for name in names:
        code = TRIVIAL if name == "start" else WORKLOADS[name]
        history = "" if name == "start" else "x = 1\n"
        step(code, history)
        results[name] = timed(lambda code=code, history=history: step(code, history), repeats[name])
    return results


def summary(seconds: list[float]) -> tuple[float, float]:
    return statistics.median(seconds) * 1000, float(np.percentile(seconds, 95)) * 1000


def heavy_host_starts(repeats: int, previous: bool = False) -> list[float]:
    """Episode starts from a host that looks like one serving a model: torch and transformers
    imported and 4 GiB of memory resident (in its own process, so the other rows stay clean).
    Ours forks workers from the zygote, whatever the host holds; the previous design forked the
    host itself, so its start grew with the host's page table."""
    import json

    importing = (
        f"sys.path.insert(0, {str(ROOT / 'bench')!r})\nfrom sandbox import previous_sandbox_module\n"
        "previous = previous_sandbox_module()\nLimits, Sandbox = previous.Limits, previous.Sandbox\n"
        if previous
        else "from paper_explorer.tools.sandbox import Limits, Sandbox\n"
    )
    probe = (
        "import json, sys, time\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "import numpy as np, torch, transformers\n"
        "from paper_explorer.corpus import BM25Index, generate\n" + importing + "corpus = generate(); index = BM25Index.cached(corpus)\n"
        "resident = np.ones(4 * 2**30 // 8)\n"
        "seconds = []\n"
        f"for _ in range({repeats} + 1):\n"
        "    started = time.perf_counter()\n"
        "    with Sandbox(corpus, Limits(wall_seconds=60, cpu_seconds=60), index=index) as sandbox:\n"
        "        assert sandbox.execute('1 + 1').value == '2'\n"
        "    seconds.append(time.perf_counter() - started)\n"
        "print(json.dumps(seconds[1:]))\n"
    )
    output = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def table(rows: dict[str, dict[str, list[float]]]) -> str:
    lines = [
        "| workload | executor | runs | p50 ms | p95 ms | p50 vs ours |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for workload in ("trivial", "search", "loop", "start"):
        ours = summary(rows["ours"][workload])[0]
        for executor, by_workload in rows.items():
            if workload not in by_workload:
                continue
            p50, p95 = summary(by_workload[workload])
            lines.append(f"| {workload} | {executor} | {len(by_workload[workload])} | {p50:.3f} | {p95:.3f} | {p50 / ours:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=300, help="runs of the trivial and search actions")
    parser.add_argument("--loop-repeats", type=int, default=20, help="runs of the 200k-iteration loop")
    parser.add_argument("--start-repeats", type=int, default=100, help="episode starts")
    parser.add_argument("--fresh-repeats", type=int, default=20, help="runs per workload of the fresh-interpreter REPL")
    parser.add_argument("--no-write", action="store_true", help="print the table without updating bench/RESULTS.md")
    args = parser.parse_args()

    corpus = generate()
    index = BM25Index.cached(corpus)
    gc.freeze()  # as explorer run/eval do once the corpus and index are loaded (for every executor alike)
    repeats = {"trivial": args.repeats, "search": args.repeats, "loop": args.loop_repeats, "start": args.start_repeats}
    fresh_repeats = dict.fromkeys(repeats, args.fresh_repeats)
    rows = {}
    rows["ours"] = bench_ours(corpus, index, repeats)
    print("ours done", file=sys.stderr)
    previous = previous_sandbox_module()
    if previous is not None:
        rows["in-worker (previous)"] = bench_ours(corpus, index, repeats, previous)
        print("previous design done", file=sys.stderr)
    rows["smolagents"] = bench_smolagents(corpus, index, {**repeats, "loop": max(3, args.loop_repeats // 4)})
    print("smolagents done", file=sys.stderr)
    with tempfile.TemporaryDirectory() as directory:
        corpus_file = Path(directory) / "demo.jsonl"
        write_jsonl(corpus, corpus_file)
        rows["fresh-python"] = bench_fresh(corpus_file, fresh_repeats, with_tools=False)
        rows["fresh-python with tools"] = bench_fresh(corpus_file, fresh_repeats, with_tools=True)
    print("fresh interpreters done", file=sys.stderr)
    heavy_repeats = max(10, args.start_repeats // 5)
    rows["ours, host with torch and 4 GiB resident"] = {"start": heavy_host_starts(heavy_repeats)}
    if previous is not None:
        rows["in-worker (previous), host with torch and 4 GiB resident"] = {"start": heavy_host_starts(heavy_repeats, previous=True)}

    ours = {name: summary(seconds)[0] for name, seconds in rows["ours"].items()}
    smol_loop = summary(rows["smolagents"]["loop"])[0]
    heavy = summary(rows["ours, host with torch and 4 GiB resident"]["start"])[0]
    with Sandbox(corpus, Limits(), index=index) as sandbox:
        isolation = sandbox.isolation
    report = [
        table(rows),
        "",
        f"- Isolation of our workers on this machine: `{isolation}`.",
        f"- Trivial action round trip, ours: p50 {ours['trivial']:.3f} ms (target <= 0.3 ms).",
    ]
    if previous is not None:
        before = {name: summary(seconds)[0] for name, seconds in rows["in-worker (previous)"].items()}
        report.append(
            f"- One-search action, ours (an RPC to the host) / in-worker tools: {ours['search'] / before['search']:.2f}x (target <= 1.5x)."
        )
    report += [
        f"- 200k-iteration loop: smolagents / ours = {smol_loop / ours['loop']:.1f}x.",
        f"- Episode start to first result, ours: p50 {ours['start']:.1f} ms; from a host that has imported torch "
        f"and holds 4 GiB, p50 {heavy:.1f} ms (target <= 10 ms, from the zygote).",
        "- fresh-python rows carry one earlier action (`x = 1`) as the episode's history; every further step "
        "adds its action to the script, so a fresh-interpreter REPL grows O(steps^2) over an episode.",
        "- smolagents runs in the host process with no isolation and no memory or CPU limit; the trivial and "
        "start rows are what our process boundary costs.",
    ]
    text = "\n".join(report)
    print(text)
    if not args.no_write:
        write_results("## Sandbox actions (bench/sandbox.py)", "python bench/sandbox.py", PACKAGES, text)


if __name__ == "__main__":
    main()
