"""Does reinforcement learning over live episodes move a real model on a CPU, and does the default
reward keep it off the direct-submit shortcut? SmolLM2-135M-Instruct (``make smollm2``), starting
from the SFT checkpoint that ``bench/learning.py`` trained on the demo corpus, runs ``explorer rl``
for --rounds rounds twice, at the same time on the two cores: with the default reward (answer F1,
a direct-submit penalty of 1, a format-error penalty of 0.2) and with the shortcut penalty off.
Then the starting checkpoint and each arm's last adapter answer the same held-out test questions
(greedy, in-process), compared with ``explorer compare``'s paired statistics.

    make smollm2 && python bench/learning.py && python bench/rl.py     # about 90 minutes on 2 cores
    python bench/rl.py --no-write --rounds 2 --questions-per-round 2 --group-size 2 --held-out 4

Every stage writes under --work and a rerun resumes what is not done (``explorer rl`` and
``explorer eval`` resume themselves); change a setting, and give a new --work.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import write_results  # noqa: E402
from paper_explorer.evaluation.stats import format_p  # noqa: E402

EXPLORER = str(Path(sys.executable).parent / "explorer")
MODEL = ROOT / ".models" / "smollm2-135m-instruct"
LEARNING = ROOT / "bench" / "out" / "learning" / "train"
ARMS = {
    "default reward (shortcut penalty on)": ("answer_f1=1", "direct_submit=-1", "format_errors=-0.2"),
    "shortcut penalty off": ("answer_f1=1", "format_errors=-0.2"),
}


def sft_checkpoint() -> Path:
    """The checkpoint bench/learning.py evaluated: its behavioural selection's choice, by this code's rule."""
    from bench.learning import evaluated_checkpoint, selection

    summary = LEARNING / "training_summary.json"
    if not summary.exists():
        sys.exit(f"no {summary}: run python bench/learning.py first (it trains the SFT checkpoint this benchmark starts from)")
    return evaluated_checkpoint(LEARNING, selection(LEARNING, json.loads(summary.read_text())))


def started(args_list: list[str], log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([EXPLORER, *args_list], stdout=log.open("w"), stderr=subprocess.STDOUT)


def finished(processes: dict[str, tuple[subprocess.Popen, Path]]) -> None:
    for name, (process, log) in processes.items():
        if process.wait() != 0:
            sys.exit(f"{name} failed (exit {process.returncode}); its output is in {log}:\n{log.read_text()[-3000:]}")


def rl_flags(args, adapter: Path, reward: tuple[str, ...], recipe: Path) -> list[str]:
    flags = ["rl", "--model", str(MODEL), "--adapter", str(adapter), "--threads", "1", "--rounds", str(args.rounds)]
    flags += ["--config", str(recipe)]  # gradient checkpointing off: on a 135M model, 1.5x faster (bench/learning.py)
    flags += ["--questions-per-round", str(args.questions_per_round), "--group-size", str(args.group_size)]
    flags += ["--max-steps", str(args.max_steps), "--max-new-tokens", str(args.max_new_tokens), "--temperature", str(args.temperature)]
    flags += ["--validation-episodes", str(args.validation_episodes), "--validation-max-steps", str(args.max_steps)]
    flags += ["--validation-max-new-tokens", str(args.max_new_tokens), "--learning-rate", str(args.learning_rate)]
    for part in reward:
        flags += ["--reward", part]
    return flags


def held_out_flags(args, adapter: Path, out: Path) -> list[str]:
    flags = ["eval", "--policy", "hf", "--model", str(MODEL), "--adapter", str(adapter), "--threads", "1", "--split", "test"]
    flags += ["--limit", str(args.held_out), "--max-steps", str(args.max_steps), "--max-new-tokens", str(args.max_new_tokens)]
    return [*flags, "--out", str(out), *(["--resume"] if (out / "manifest.json").exists() else [])]


def run_arms(args, work: Path, start: Path) -> dict[str, Path]:
    outs = {name: work / f"rl-{number}" for number, name in enumerate(ARMS)}
    recipe = work / "rl.toml"
    work.mkdir(parents=True, exist_ok=True)
    recipe.write_text("gradient_checkpointing = false\n")  # an RLConfig field set in files only
    processes = {}
    for name, reward in ARMS.items():
        if not (outs[name] / "rl_summary.json").exists():
            processes[name] = (
                started([*rl_flags(args, start, reward, recipe), "--out", str(outs[name])], outs[name].with_suffix(".log")),
                outs[name].with_suffix(".log"),
            )
    finished(processes)
    return outs


def held_out(args, work: Path, adapters: dict[str, Path]) -> dict[str, Path]:
    """The held-out runs, two at a time (one a core)."""
    runs = {name: work / f"held-out-{number}" for number, name in enumerate(adapters)}
    pending = [name for name in adapters if not (runs[name] / "metrics.json").exists()]
    while pending:
        batch, pending = pending[:2], pending[2:]
        finished(
            {
                name: (
                    started(held_out_flags(args, adapters[name], runs[name]), runs[name].with_suffix(".log")),
                    runs[name].with_suffix(".log"),
                )
                for name in batch
            }
        )
    return runs


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compared(a: Path, b: Path) -> dict:
    done = subprocess.run([EXPLORER, "compare", str(a), str(b), "--json"], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"explorer compare {a} {b} failed: {done.stderr}")
    return json.loads(done.stdout)


def held_out_figures(run: Path) -> dict:
    metrics = json.loads((run / "metrics.json").read_text())
    trajectories = lines(run / "trajectories.jsonl")
    steps = [step for t in trajectories for step in t["steps"]]
    return {
        "episodes": len(trajectories),
        "answer_f1": metrics["answer_f1"],
        "direct_submit_rate": metrics["verdict"]["direct_submit_rate"],
        "format_error_steps": sum(bool(step.get("format_error")) for step in steps) / len(steps),
        "ended": sum(t["outcome"]["status"] in ("submitted", "abstained") for t in trajectories) / len(trajectories),
    }


def report(args, outs: dict[str, Path], runs: dict[str, Path], seconds: float) -> str:
    rounds = {
        name: [json.loads((out / f"round-{n}" / "round.json").read_text()) for n in range(1, args.rounds + 1)] for name, out in outs.items()
    }
    names = list(ARMS)
    text = [
        f"{args.rounds} rounds per arm from `{sft_checkpoint().relative_to(ROOT)}` (bench/learning.py's chosen SFT checkpoint); "
        f"each round {args.questions_per_round} train questions x {args.group_size} episodes (temperature {args.temperature}, "
        f"at most {args.max_steps} actions of {args.max_new_tokens} tokens), GRPO advantages, 2 AdamW steps at learning rate "
        f"{args.learning_rate}, KL 0.001 toward the base, then {args.validation_episodes} greedy validation episodes. "
        f"Both arms ran at once, one thread each; {seconds / 60:.0f} min in all.",
        "",
        "Mean reward of each round's samples (each arm under its own reward), and the default reward's parts:",
        "",
        "| round | " + " | ".join(f"reward: {name}" for name in names) + " | direct submits (on / off) | format-error episodes (on / off) "
        "| answer F1 of samples (on / off) | KL (on) | clipped (on) | tokens trained (on) | validation F1 (on / off) |",
        "|---:|" + "---:|" * (len(names) + 7),
    ]
    for number in range(args.rounds):
        on, off = (rounds[name][number] for name in names)
        text.append(
            f"| {number + 1} | {on['reward_mean']:+.3f} | {off['reward_mean']:+.3f} "
            f"| {on['direct_submit_rate']:.0%} / {off['direct_submit_rate']:.0%} "
            f"| {on['detector_rates'].get('format_errors', 0):.0%} / {off['detector_rates'].get('format_errors', 0):.0%} "
            f"| {on['answer_f1'] or 0:.3f} / {off['answer_f1'] or 0:.3f} | {on['update']['kl'] or 0:.4f} "
            f"| {on['update']['clip_fraction'] or 0:.1%} | {on['update']['tokens_trained']:,} "
            f"| {on['validation'].get('answer_f1') or 0:.3f} / {off['validation'].get('answer_f1') or 0:.3f} |"
        )
    start = held_out_figures(runs["start"])
    text += [
        "",
        f"Held-out: the first {args.held_out} questions of the test split, greedy, in-process, the same settings for every model:",
        "",
        "| figure | SFT start | " + " | ".join(f"after {args.rounds} rounds: {name}" for name in names) + " |",
        "|---|---:|" + "---:|" * len(names),
    ]
    after = {name: held_out_figures(runs[name]) for name in names}
    for key, label, spec in (
        ("episodes", "episodes", "d"),
        ("answer_f1", "answer F1", ".3f"),
        ("direct_submit_rate", "direct-submit rate", ".1%"),
        ("format_error_steps", "format errors (share of steps)", ".1%"),
        ("ended", "ended by submit or abstain", ".1%"),
    ):
        text.append(f"| {label} | {format(start[key], spec)} | " + " | ".join(format(after[name][key], spec) for name in names) + " |")
    text.append("")
    for name in names:
        paired = compared(runs["start"], runs[name])
        interval = paired["answer_f1"].get("paired_difference_ci95") or {}
        exact = next((test for test in paired["mcnemar_answers"] if test["outcome"] == "exact match"), None)
        rates = paired["direct_submit_rate"]
        text.append(
            f"- {name} minus the start, paired over {paired['paired_questions']} questions: answer F1 "
            f"{interval.get('mean', 0):+.3f} (95% bootstrap interval {interval.get('low', 0):+.3f} to {interval.get('high', 0):+.3f}); "
            f"direct-submit rate {rates['a']:.1%} -> {rates['b']:.1%}"
            + (f"; exact-match McNemar {format_p(exact['p_value'])}" if exact else "")
            + "."
        )
    return "\n".join(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / "out" / "rl")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--questions-per-round", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--validation-episodes", type=int, default=4)
    parser.add_argument("--held-out", type=int, default=24)
    parser.add_argument("--no-write", action="store_true", help="Print the section instead of writing bench/RESULTS.md.")
    args = parser.parse_args()
    if not (MODEL / "config.json").exists():
        sys.exit(f"no model at {MODEL}: run make smollm2")
    start = sft_checkpoint()
    began = time.perf_counter()
    outs = run_arms(args, args.work, start)
    last = {name: out / f"round-{args.rounds}" / "update" / "adapter" for name, out in outs.items()}
    runs = held_out(args, args.work, {"start": start, **last})
    text = report(args, outs, runs, time.perf_counter() - began)
    if args.no_write:
        print(text)
    else:
        write_results(
            "## Reinforcement learning over live episodes on CPU (bench/rl.py)",
            "python bench/rl.py",
            ("torch", "transformers", "peft"),
            text,
        )
        print(text)


if __name__ == "__main__":
    main()
