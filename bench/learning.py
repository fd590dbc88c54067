"""Does a real model learn the agent's loop on a CPU? SmolLM2-135M-Instruct (``make smollm2``) is
taught by the scripted teacher on the demo corpus's train split (``explorer sft teach`` -> ``sft
build`` -> ``train``), and then the base model and the checkpoint that behavioural selection chose
answer the same held-out test questions, served by the real vLLM of ``make vllm`` (the adapter
loaded at runtime), and are compared with the project's paired statistics.

    make smollm2 vllm && python bench/learning.py      # about an hour on 2 cores; writes its RESULTS.md section
    python bench/learning.py --no-write --train-steps 4 --save-steps 2 --questions 8 --validation-episodes 2

Every stage writes under --work and a rerun skips what is done (training resumes from its newest
checkpoint, an evaluation from its last episode); change a setting, and give a new --work.

It also measures training speed, input tokens per second over the first steps, for the Trainer as
``explorer train`` configures it for a GPU (gradient checkpointing on) with torch's default
threads, against the settings this benchmark trains with (one thread, no checkpointing): on a
135M model with 2k-token sequences the recomputation costs more than the memory it saves.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import write_results  # noqa: E402
from paper_explorer.agent.testing.vllm_server import running_vllm  # noqa: E402
from paper_explorer.corpus import DemoConfig, generate  # noqa: E402
from paper_explorer.evaluation.answers import answer_and_evidence_f1  # noqa: E402
from paper_explorer.evaluation.scoring import ABSTENTION  # noqa: E402
from paper_explorer.evaluation.stats import bootstrap_mean_ci, format_p  # noqa: E402

EXPLORER = str(Path(sys.executable).parent / "explorer")
MODEL = ROOT / ".models" / "smollm2-135m-instruct"
SERVED = "smollm2"
SPEED_LINE = re.compile(r"([\d,]+) input tokens/s")
# Training speed: the Trainer as `explorer train` sets it up by default (gradient checkpointing on,
# the reference recipe's), at torch's default threads and at one, against no checkpointing.
SPEED_ARMS = {
    "default Trainer settings, torch's default threads (2), gradient checkpointing": (2, True),
    "one thread, gradient checkpointing": (1, True),
    "one thread, no gradient checkpointing (this benchmark)": (1, False),
}


def explorer(*args: str, log: Path) -> subprocess.CompletedProcess:
    """One explorer command as a user types it, its stderr streamed into ``log`` (follow it with
    tail -f); a failure stops the benchmark."""
    started = time.perf_counter()
    with log.open("w") as sink:
        done = subprocess.run([EXPLORER, *args], stdout=subprocess.PIPE, stderr=sink, text=True)
    stderr = log.read_text()
    if done.returncode != 0:
        sys.exit(f"explorer {args[0]} failed (exit {done.returncode}); its stderr is in {log}:\n{stderr[-3000:]}")
    print(f"  explorer {' '.join(args[:2])} ... {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout, stderr)


def config_file(path: Path, gradient_checkpointing: bool) -> Path:
    path.write_text(f"gradient_checkpointing = {str(gradient_checkpointing).lower()}\n")  # a TrainConfig field set in files only
    return path


def teach_and_build(work: Path) -> Path:
    teacher, data = work / "teacher.jsonl", work / "data"
    explorer("sft", "teach", "--out", str(teacher), log=work / "teach.log")  # appends: a rerun finishes it
    if not (data / "build_report.json").exists():
        explorer(
            "sft", "build", "--trajectories", str(teacher), "--tokenizer", str(MODEL), "--out", str(data), "--max-length", "4096",
            "--force", log=work / "build.log",
        )  # fmt: skip
    return data


def measure_speed(work: Path, data: Path, steps: int) -> dict[str, float]:
    """Input tokens per second over ``steps`` optimizer steps of 4 examples, for each arm."""
    speeds: dict[str, float] = {}
    if steps == 0:
        return speeds
    for number, (label, (threads, checkpointing)) in enumerate(SPEED_ARMS.items()):
        result = work / "speed" / f"arm-{number}.json"
        if not result.exists():
            out = work / "speed" / f"arm-{number}"
            out.parent.mkdir(parents=True, exist_ok=True)
            done = explorer(
                "train", "--data", str(data), "--out", str(out), "--model", str(MODEL), "--threads", str(threads),
                "--config", str(config_file(work / "speed" / f"arm-{number}.toml", checkpointing)), "--max-steps", str(steps),
                "--validation-episodes", "0", "--validation-examples", "1", "--lora-r", "8", "--lora-alpha", "16",
                log=work / "speed" / f"arm-{number}.log",
            )  # fmt: skip
            measured = SPEED_LINE.findall(done.stderr)
            if not measured:
                sys.exit(f"no tokens/s line in {work / 'speed' / f'arm-{number}.log'}")
            result.write_text(json.dumps({"label": label, "tokens_per_second": float(measured[-1].replace(",", ""))}))
        speeds[label] = json.loads(result.read_text())["tokens_per_second"]
    return speeds


def train(work: Path, data: Path, args) -> dict:
    out = work / "train"
    if not (out / "training_summary.json").exists():
        explorer(
            "train", "--data", str(data), "--out", str(out), "--model", str(MODEL), "--threads", "1",
            "--config", str(config_file(work / "train.toml", False)), "--max-steps", str(args.train_steps),
            "--save-steps", str(args.save_steps), "--learning-rate", str(args.learning_rate), "--lora-r", "8",
            "--lora-alpha", "16", "--gradient-accumulation-steps", "4", "--max-length", "4096",
            "--validation-examples", "32", "--validation-episodes", str(args.validation_episodes),
            "--validation-max-steps", str(args.max_steps), "--validation-max-new-tokens", str(args.max_new_tokens),
            *(["--resume"] if any(out.glob("checkpoint-*")) else []), log=work / "train.log",
        )  # fmt: skip
    return json.loads((out / "training_summary.json").read_text())


def evaluate(server, work: Path, name: str, adapter: str | None, args) -> Path:
    out = work / f"eval-{name}"
    if (out / "metrics.json").exists():
        return out
    explorer(
        "eval", "--policy", "openai", "--base-url", server.url, "--model", server.model, "--tokenizer", str(MODEL),
        *(["--adapter", adapter] if adapter else []), "--split", "test", "--limit", str(args.questions),
        "--max-steps", str(args.max_steps), "--max-new-tokens", str(args.max_new_tokens), "--concurrency", "16",
        "--out", str(out), *(["--resume"] if (out / "manifest.json").exists() else []), log=work / f"eval-{name}.log",
    )  # fmt: skip
    return out


class Timings:
    """Wall seconds of each stage, kept in a file: a rerun that skips a finished stage reports the
    time it took when it ran, and one that resumes a stage adds to it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def seconds(self) -> dict[str, float]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    @contextmanager
    def stage(self, name: str):
        started = time.perf_counter()
        yield
        spent = self.seconds()
        spent[name] = spent.get(name, 0.0) + time.perf_counter() - started
        self.path.write_text(json.dumps(spent))


def selection(out: Path, summary: dict) -> dict:
    """The training summary with its selection made by this code's rule (``sft.validation.
    select_checkpoint``) over the run's own validation records: a training run that recorded no
    format-error rate (older code) has it filled in from the validation episodes it saved."""
    from paper_explorer.sft.config import TrainConfig
    from paper_explorer.sft.records import ValidationRecord
    from paper_explorer.sft.validation import select_checkpoint

    records = [ValidationRecord.model_validate(record) for record in summary["checkpoints"]]
    for record in records:
        episodes = out / "validation-episodes" / f"step-{record.step}.jsonl"
        if record.behaviour.format_error_rate is None and episodes.exists():
            steps = [step for trajectory in lines(episodes) for step in trajectory["steps"]]
            record.behaviour.format_error_rate = sum(bool(step.get("format_error")) for step in steps) / len(steps) if steps else None
    chosen = select_checkpoint(records, TrainConfig())
    return {**summary, **chosen.model_dump(), "checkpoints": [record.model_dump(mode="json") for record in records]}


def evaluated_checkpoint(out: Path, summary: dict) -> Path:
    """The checkpoint behavioural selection chose; when it chose none (every checkpoint submitted at
    once too often), the last one, so that the table still shows what training made (and says so)."""
    if summary.get("best_checkpoint"):
        return out / Path(summary["best_checkpoint"]).name
    saved = [record["checkpoint"] for record in summary["checkpoints"] if record.get("checkpoint")]
    if not saved:
        sys.exit(f"training saved no checkpoint; see {out}")
    return out / Path(saved[-1]).name


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def figures(run: Path) -> dict:
    """The benchmark's figures of one evaluation run, from its trajectories and scores."""
    trajectories, scores = lines(run / "trajectories.jsonl"), {s["episode_id"]: s for s in lines(run / "scores.jsonl")}
    steps = [step for t in trajectories for step in t["steps"]]
    scored = [scores[t["episode_id"]] for t in trajectories]
    answerable = [s for s in scored if s.get("answerable")]
    decided_right = [s.get("abstained") is (not s.get("answerable")) and s["status"] in ("submitted", "abstained") for s in scored]
    return {
        "episodes": len(trajectories),
        "format_error_steps": sum(bool(step.get("format_error")) for step in steps) / len(steps),
        "format_error_episodes": statistics.mean(any(step.get("format_error") for step in t["steps"]) for t in trajectories),
        "tool_use": statistics.mean(s["tool_calls_before_end"] > 0 for s in scored),
        "answer_f1": statistics.mean(s["answer_f1"] for s in scored),
        "answer_f1_answerable": statistics.mean(s["answer_f1"] for s in answerable),
        "abstention_accuracy": statistics.mean(decided_right),
        "direct_submit": statistics.mean(any(f["detector"] == "direct_submit" for f in s["flags"]) for s in scored),
        "ended": statistics.mean(s["status"] in ("submitted", "abstained") for s in scored),
        "mean_steps": statistics.mean(len(t["steps"]) for t in trajectories),
    }


def paired_answerable(base: Path, trained: Path) -> dict:
    """Answer F1 on the answerable questions both runs scored: the trained minus the base per
    question, its bootstrap interval and a two-sided sign-flip permutation test of its mean."""
    a = {s["question_id"]: s for s in lines(base / "scores.jsonl") if s.get("answerable")}
    b = {s["question_id"]: s for s in lines(trained / "scores.jsonl") if s.get("answerable")}
    shared = sorted(a.keys() & b.keys())
    differences = np.array([b[q]["answer_f1"] - a[q]["answer_f1"] for q in shared])
    if not differences.any():
        p_value = 1.0
    else:
        test = scipy_stats.permutation_test(
            (differences,), np.mean, permutation_type="samples", n_resamples=100_000, random_state=np.random.default_rng(0)
        )
        p_value = float(test.pvalue)
    return {"questions": len(shared), "interval": bootstrap_mean_ci(differences.tolist()).model_dump(), "p_value": p_value}


def always_abstain_f1(run: Path) -> float:
    """Overall answer F1 of answering "Unanswerable" to every question the run scored."""
    questions = {q.id: q for q in generate(DemoConfig()).questions}
    return statistics.mean(
        answer_and_evidence_f1(ABSTENTION, [], questions[s["question_id"]])[0] for s in lines(run / "scores.jsonl") if "answer_f1" in s
    )


def checkpoint_rows(summary: dict) -> list[str]:
    rows = [
        "| checkpoint | step | teacher-forced loss | P(first action ends) | validation episodes | format errors (steps) | answer F1 "
        "| direct submit | tool calls before submit | chosen |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    chosen = summary.get("best_checkpoint")
    for record in summary["checkpoints"]:
        if not record.get("checkpoint"):
            continue
        forced, behaviour = record.get("teacher_forced", {}), record.get("behaviour", {})
        name = Path(record["checkpoint"]).name

        def number(value, spec=".3f"):
            return "-" if value is None else format(value, spec)

        rows.append(
            f"| {name} | {record['step']} | {number(forced.get('loss_all'))} | {number(forced.get('first_action_end_probability'))} | "
            f"{behaviour.get('episodes', 0)} | {number(behaviour.get('format_error_rate'), '.0%')} | {number(behaviour.get('answer_f1'))} | {number(behaviour.get('direct_submit_rate'), '.0%')} | "
            f"{number(behaviour.get('tool_calls_before_submit'), '.2f')} | {'yes' if chosen and Path(chosen).name == name else ''} |"
        )
    return rows


def report(args, speeds, summary, seconds, base_run, trained_run, compare, others: list[Path]) -> str:
    """The RESULTS.md section. ``others``: held-out runs of checkpoints other than the chosen one
    (a checkpoint an earlier selection rule chose, kept rather than thrown away), shown beside it."""
    base, trained = figures(base_run), figures(trained_run)
    paired = paired_answerable(base_run, trained_run)
    abstain = always_abstain_f1(base_run)
    chosen = summary.get("best_checkpoint")
    evaluated = evaluated_checkpoint(Path(trained_run).parent / "train", summary)
    columns = [("base SmolLM2-135M-Instruct", base), *((f"{run.name.removeprefix('eval-')}", figures(run)) for run in others)]
    columns.append((f"trained ({evaluated.name}, chosen)" if chosen else f"trained ({evaluated.name})", trained))
    plain = next(iter(speeds.values()), 1.0)

    def row(label: str, key: str, spec: str) -> str:
        return f"| {label} | " + " | ".join(format(figures_[key], spec) for _, figures_ in columns) + " |"

    lines_ = [
        "Training speed, input tokens per second over the first steps (padding none: one example a forward pass):",
        "",
        "| training settings | input tokens/s | vs default |",
        "|---|---:|---:|",
        *(f"| {label} | {speed:,.0f} | {speed / plain:.2f}x |" for label, speed in speeds.items()),
        "",
        f"Training: {summary['steps']} optimizer steps of 4 examples (LoRA r 8 on every projection, learning rate {args.learning_rate:g}), "
        f"{seconds['train'] / 60:.1f} min including each checkpoint's validation ({args.validation_episodes} greedy episodes on the "
        f"validation split); teach and build {seconds['teach_build'] / 60:.1f} min. Each checkpoint as training validated it:",
        "",
        *checkpoint_rows(summary),
        "",
        (
            f"Behavioural selection chose `{Path(chosen).name}` ({summary['criterion']} on the validation episodes)"
            if chosen
            else f"Behavioural selection chose no checkpoint; the last, `{evaluated.name}`, is evaluated below instead"
        )
        + "".join(f"; {warning}" for warning in summary.get("warnings", []))
        + ".",
        "",
        f"Held-out evaluation: the first {args.questions} questions of the test split, each model served by the real vLLM "
        f"(float32, CPU), greedy, at most {args.max_steps} actions of {args.max_new_tokens} tokens; "
        f"{seconds['eval'] / 60:.1f} min for the {len(columns)} runs.",
        "",
        "| figure | " + " | ".join(label for label, _ in columns) + " |",
        "|---|" + "---:|" * len(columns),
        row("episodes", "episodes", "d"),
        row("format errors (share of steps)", "format_error_steps", ".1%"),
        row("episodes with a format error", "format_error_episodes", ".1%"),
        row("tools used before the end (share of episodes)", "tool_use", ".1%"),
        row("ended by submit or abstain", "ended", ".1%"),
        row("answer F1, all questions", "answer_f1", ".3f"),
        row("answer F1, answerable questions", "answer_f1_answerable", ".3f"),
        row("abstention accuracy (abstained exactly when unanswerable)", "abstention_accuracy", ".1%"),
        row("direct-submit rate", "direct_submit", ".1%"),
        row("mean actions per episode", "mean_steps", ".2f"),
        "",
        f"- Answer F1 on the {paired['questions']} answerable questions, {evaluated.name} minus base: "
        f"{paired['interval']['mean']:+.3f} (95% bootstrap interval {paired['interval']['low']:+.3f} to {paired['interval']['high']:+.3f}), "
        f"paired sign-flip permutation test {format_p(paired['p_value'])} (goal: above base with p < 0.05 on at least 100 questions).",
        f'- Answering "Unanswerable" to every question scores answer F1 {abstain:.3f} on these questions; {evaluated.name} '
        f"{'beats' if trained['answer_f1'] > abstain else 'does not beat'} it ({trained['answer_f1']:.3f}).",
        f"- `explorer compare` of base and {evaluated.name}: exact-match McNemar {format_p(compare['mcnemar_exact_match']['p_value'])}, "
        f"abstention McNemar {format_p(compare['mcnemar_abstention'][0]['p_value'])}; the runs differ in "
        f"{', '.join(compare['setting_differs']) or 'nothing but the adapter'}.",
        "- Goals (issue 30): format errors under 10% of steps, tools in at least 90% of episodes; figures are reported as measured.",
    ]
    return "\n".join(lines_)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / "out" / "learning", help="where every stage writes")
    parser.add_argument("--train-steps", type=int, default=24, help="optimizer steps of 4 examples")
    parser.add_argument("--save-steps", type=int, default=8, help="a validated checkpoint every N steps")
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--validation-episodes", type=int, default=6, help="greedy validation episodes per checkpoint")
    parser.add_argument("--speed-steps", type=int, default=3, help="optimizer steps per training-speed arm (0: not measured)")
    parser.add_argument("--questions", type=int, default=120, help="held-out test questions")
    parser.add_argument("--max-steps", type=int, default=5, help="actions per episode (the teacher takes 4)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="tokens per action (the teacher's longest is about 70)")
    parser.add_argument("--no-write", action="store_true", help="print the results without updating bench/RESULTS.md")
    args = parser.parse_args()
    if not (MODEL / "config.json").exists():
        sys.exit(f"no model at {MODEL}: run `make smollm2` first")
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    timings = Timings(args.work / "timings.json")
    with timings.stage("teach_build"):
        data = teach_and_build(args.work)
    with timings.stage("train"):
        summary = selection(args.work / "train", train(args.work, data, args))
    chosen = evaluated_checkpoint(args.work / "train", summary)
    with timings.stage("eval"):
        if not all((args.work / f"eval-{name}" / "metrics.json").exists() for name in ("base", chosen.name)):
            with running_vllm(MODEL, args.work / "vllm.log", served_name=SERVED, max_model_len=8192, kv_cache_bytes=1 << 30) as server:
                evaluate(server, args.work, "base", None, args)
                evaluate(server, args.work, chosen.name, str(chosen), args)
    base_run, trained_run = args.work / "eval-base", args.work / f"eval-{chosen.name}"
    others = sorted(
        (run for run in args.work.glob("eval-checkpoint-*") if run.is_dir() and run != trained_run),
        key=lambda run: int(run.name.split("-")[-1]),
    )
    speeds = measure_speed(args.work, data, args.speed_steps)  # last: the figures above do not wait on it
    seconds = timings.seconds()
    compared = explorer("compare", str(base_run), str(trained_run), "--json", log=args.work / "compare.log")
    text = report(args, speeds, summary, seconds, base_run, trained_run, json.loads(compared.stdout), others)
    print(text)
    if not args.no_write:
        write_results(
            "## A real model learns the agent's loop on CPU (bench/learning.py)",
            "python bench/learning.py",
            ("torch", "transformers", "peft"),
            text,
        )


if __name__ == "__main__":
    main()
