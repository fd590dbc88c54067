"""``explorer preregister``, ``inspect``, ``compare`` and ``report``: what a run did, read back.

Questions, answers, ids and flag evidence come from the run's files: they reach the terminal as
``agent.terminal_text.untrusted`` text (table cells included), never as rich markup.

Why one module: the four commands print the same records (metrics, comparisons, calibration
tables) with the same untrusted-text rules; split, each would repeat the table helpers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from paper_explorer.agent.terminal_text import json_visible, untrusted
from paper_explorer.cli.errors import UsageError
from paper_explorer.cli.flags import config_flags
from paper_explorer.cli.options import CorpusOption, QuestionsOption, SplitOfOption, say_note, split_of
from paper_explorer.evaluation.preregister import PreregisterConfig

if TYPE_CHECKING:
    from paper_explorer.agent.trajectory import Trajectory
    from paper_explorer.evaluation.compare import RunComparison

console = Console()


@config_flags(PreregisterConfig)
def preregister_command(
    out: Path = typer.Option(..., "--out", "-o", help="The preregistration TOML to write."),
    corpus_path: Path | None = CorpusOption,
    questions_path: Path | None = QuestionsOption,
    split_of_values: list[str] | None = SplitOfOption,
    force: bool = typer.Option(False, "--force", help="Overwrite OUT."),
    overrides: dict | None = None,  # the run's questions and rule given as flags (cli.flags, from PreregisterConfig's fields)
) -> None:
    """Freeze the corpus and question hashes of a future run, with its pass rule, into a TOML file."""
    from paper_explorer.agent.config import load_config
    from paper_explorer.evaluation.preregister import preregister

    config = load_config(PreregisterConfig, None, {**(overrides or {}), "split_of": split_of(split_of_values)})
    written = preregister(config, out=out, corpus=corpus_path, questions=questions_path, force=force, note=say_note)
    typer.echo(f"preregistration written to {out} ({written.frozen.questions} questions); run: explorer eval --preregistration {out} ...")


def inspect_command(
    run_dir: Path = typer.Argument(..., help="A run directory written by explorer eval (or explorer decide)."),
    episode: str | None = typer.Option(
        None, "--episode", "-e", help="Show one episode (episode or question id) with its flags; of a decide run, one question's options."
    ),
    flag: str | None = typer.Option(None, "--flag", "-f", help="List the episodes a detector flagged, with its evidence."),
    worst: int = typer.Option(10, "--worst", min=0, help="How many of the worst episodes (or questions) to list."),
) -> None:
    """Summarise a run (metrics, abstention, detector rates, worst episodes), or drill into a flag or an episode."""
    from paper_explorer.cli.display import id_column
    from paper_explorer.evaluation.answer_metrics import answer_metrics
    from paper_explorer.evaluation.detectors import DETECTORS
    from paper_explorer.evaluation.run_directory import DECIDE_RUN, RL_RUN, Run, kind_of

    if kind_of(run_dir) is DECIDE_RUN:
        _inspect_decisions(run_dir, episode, flag, worst)
        return
    from paper_explorer.evaluation.summary import print_summary

    if kind_of(run_dir) is RL_RUN and episode is None and flag is None:  # its rounds; each round's runs are inspected as runs
        from paper_explorer.cli.display import print_rl_rounds

        print_rl_rounds(console, run_dir)
        return
    run = Run.load(run_dir)
    if flag is not None and flag not in DETECTORS:
        raise UsageError(f"unknown flag {flag!r}; choose one of {', '.join(DETECTORS)}")
    if episode is not None:
        from paper_explorer.cli.display import print_episode

        matches = [t for t in run.trajectories if episode in (t.episode_id, t.question_id)]
        if not matches:
            raise UsageError(f"{run_dir}: no episode {episode!r}; explorer inspect {run_dir} lists the worst ones")
        print_episode(console, matches[-1])
        score = next((s for s in run.scores if s.episode_id == matches[-1].episode_id), None)
        if score is not None:
            if score.scored:
                console.print(", ".join(f"{metric.label} {metric.shown(score.metric(metric.name))}" for metric in answer_metrics()))
            if score.model_tokens is not None:
                console.print(f"model tokens {score.model_tokens:,} (every prompt and generated token of its model calls)")
            for item in score.flags:
                step = "" if item.step is None else f" (step {item.step + 1})"
                console.print(Text.assemble(untrusted(f"flag {item.detector}{step}", style="red"), ": ", untrusted(item.text)))
        _print_changed_observations(matches[-1])
        return
    if flag is not None:
        flagged = [s for s in run.scores if any(f.detector == flag for f in s.flags)]
        table = Table(id_column(), "question", "step", "evidence", title=f"{flag}: {len(flagged)} of {len(run.scores)} episodes")
        for score in flagged:
            for item in (f for f in score.flags if f.detector == flag):
                table.add_row(
                    untrusted(score.episode_id),
                    untrusted(score.question[:50]),
                    "-" if item.step is None else str(item.step + 1),
                    untrusted(item.text[:80]),
                )
        console.print(table)
        return
    print_summary(console, run.metrics)
    ranked = sorted(run.scores, key=lambda s: (s.answer_f1 or 0.0, -len(s.flags)))[:worst]
    table = Table(id_column(), "question", "status", "F1", "model tokens", "flags", title=f"worst {len(ranked)} episodes")
    for score in ranked:
        flags = ", ".join(sorted({f.detector for f in score.flags}))
        table.add_row(
            untrusted(score.episode_id),
            untrusted(score.question[:50]),
            untrusted(score.status),
            f"{score.answer_f1 or 0:.2f}",
            _tokens(score.model_tokens),
            untrusted(flags),
        )
    console.print(table)


def _inspect_decisions(run_dir: Path, question: str | None, flag: str | None, worst: int) -> None:
    """A run of explorer decide: its per-kind figures and worst questions, or one question's options."""
    from paper_explorer.decisions.inspect_view import print_question, print_run
    from paper_explorer.decisions.run_reading import DecisionRun

    if flag is not None:
        raise UsageError(f"{run_dir}: a decide run has no detector flags; explorer inspect {run_dir} shows its figures")
    run = DecisionRun.load(run_dir)
    if question is not None:
        print_question(console, run, question)
    else:
        print_run(console, run, worst)


def _print_changed_observations(trajectory: Trajectory) -> None:
    """A replayed episode's observations that differ from its recording (nothing for other policies)."""
    from paper_explorer.evaluation.replay_drift import compared_observations

    for index, reproduced, drift in compared_observations(trajectory):
        if reproduced:
            continue
        where = "" if drift is None else f" at character {drift.position}: recorded {drift.recorded!r}, now {drift.current!r}"
        console.print(
            Text.assemble(
                (f"replay drift (step {index + 1})", "yellow"), ": ", untrusted(f"the observation differs from the recording{where}")
            )
        )


def compare_command(
    run_a: Path = typer.Argument(..., help="The reference run (e.g. the base model)."),
    run_b: Path = typer.Argument(..., help="The run compared with it (e.g. the trained adapter)."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON (the RunComparison record)."),
) -> None:
    """Paired comparison of two runs on the questions both scored: F1 and exact match with a bootstrap
    interval of the F1 difference, exact McNemar on correctness and abstention, Fisher as the unpaired-design test."""
    from paper_explorer.evaluation.compare import confound_note
    from paper_explorer.evaluation.run_comparison import compare
    from paper_explorer.evaluation.run_directory import DECIDE_RUN, kind_of

    decide_runs = [kind_of(run) is DECIDE_RUN for run in (run_a, run_b)]
    if any(decide_runs):
        if not all(decide_runs):
            decide, other = (run_a, run_b) if decide_runs[0] else (run_b, run_a)
            raise UsageError(f"{decide} is a run of explorer decide and {other} is not; compare two decide runs of one decision file")
        _compare_decisions(run_a, run_b, as_json)
        return
    result = compare(run_a, run_b, note=say_note)
    if as_json:
        typer.echo(json_visible(result.model_dump_json(indent=2)))  # answers and questions are in it
        return
    if result.same_corpus is False:
        console.print("[yellow]warning: the runs used different corpora[/yellow]")
    console.print(untrusted(f"A: {result.run_a} ({result.setting_a.describe()})\nB: {result.run_b} ({result.setting_b.describe()})"))
    note = confound_note(result)
    if note is not None:
        console.print(untrusted(f"note: {note}", "yellow"))
    console.print(
        f"{result.paired_questions} paired questions (scored in both runs); every figure below is on them, except the unpaired table"
    )
    for table in _compare_tables(result):
        console.print(table)


def _compare_decisions(run_a: Path, run_b: Path, as_json: bool) -> None:
    """Two decide runs of one file: per kind, each run's figures and B - A with its paired interval; their agreement."""
    from paper_explorer.decisions.compare import compare_decisions, print_comparison
    from paper_explorer.decisions.run_reading import DecisionRun

    result = compare_decisions(DecisionRun.load(run_a), DecisionRun.load(run_b))
    if as_json:
        typer.echo(json_visible(result.model_dump_json(indent=2)))
        return
    print_comparison(console, result)


def _compare_tables(result: RunComparison) -> list[Table | Text | str]:
    """``explorer compare``'s tables: paired figures, abstention, the paired tests, Fisher, the unpaired rest, the moves, calibration."""
    from paper_explorer.evaluation.report_calibration import CALIBRATION_HEADER, calibration_rows
    from paper_explorer.evaluation.report_compare import figure_header, figure_rows
    from paper_explorer.evaluation.stats import format_p

    def number(value: float | None, signed: bool = False) -> str:
        return "-" if value is None else (f"{value:+.3f}" if signed else f"{value:.3f}")

    n = result.paired_questions
    figures = Table(*figure_header(result), title=f"paired questions (n = {n})")
    for cells in figure_rows(result):
        figures.add_row(*cells)

    abstention = Table(
        "gold \\ decision",
        "A answered",
        "A abstained",
        "A neither",
        "B answered",
        "B abstained",
        "B neither",
        title=f"abstention on the paired questions (n = {n}; neither: a limit, a policy error or no_answer)",
    )
    for (row, counts_a), (_, counts_b) in zip(result.abstention.a.rows(), result.abstention.b.rows()):
        abstention.add_row(
            row,
            *(str(count) for counts in (counts_a, counts_b) for count in (counts.answered, counts.abstained, counts.undecided())),
        )

    mcnemar = Table(
        "outcome (yes/no per question)",
        "pairs",
        "yes in both",
        "yes in A only",
        "yes in B only",
        "no in both",
        "two-sided p",
        title="exact McNemar on the paired questions (primary test; only A-only and B-only pairs count)",
    )
    for test in [*result.mcnemar_answers, *result.mcnemar_abstention]:
        mcnemar.add_row(
            test.outcome, str(test.pairs), str(test.both), str(test.only_a), str(test.only_b), str(test.neither), format_p(test.p_value)
        )

    fisher = Table(
        "gold",
        "A abstained",
        "A answered",
        "B abstained",
        "B answered",
        "odds ratio",
        "two-sided p",
        title="Fisher exact on unanswerable and answerable abstentions, paired questions' tables "
        "(unpaired-design test, as preregistered; secondary: it ignores the pairing)",
    )
    for fisher_test in result.fisher_abstention:
        (a_abstained, a_answered), (b_abstained, b_answered) = fisher_test.table
        fisher.add_row(
            fisher_test.row,
            str(a_abstained),
            str(a_answered),
            str(b_abstained),
            str(b_answered),
            "n/a" if fisher_test.odds_ratio is None else f"{fisher_test.odds_ratio:.3g}",
            format_p(fisher_test.p_value),
        )

    unpaired = result.unpaired
    rest: Table | str = "no unpaired question: both runs scored the same questions"
    if unpaired.only_in_a or unpaired.only_in_b or unpaired.unscored_a or unpaired.unscored_b:
        rest = Table("not paired (NOT comparable between runs)", "A", "B", title="questions only one run scored")
        rest.add_row("questions scored in this run only", str(unpaired.only_in_a), str(unpaired.only_in_b))
        rest.add_row("answer F1 on them (different questions)", number(unpaired.answer_f1_a), number(unpaired.answer_f1_b))
        rest.add_row("episodes without gold answers (unscored)", str(unpaired.unscored_a), str(unpaired.unscored_b))

    moves: Table | str = "no paired question's F1 differs"
    if result.largest_differences:
        moves = Table("question", "A", "B", "F1 A", "F1 B", title="largest per-question differences")
        for moved in result.largest_differences:
            moves.add_row(
                untrusted(moved.question[:50]), untrusted(moved.a[:30]), untrusted(moved.b[:30]), f"{moved.f1_a:.2f}", f"{moved.f1_b:.2f}"
            )
    calibration: list[Table] = []
    if result.calibration is not None:  # each run's figures per probe, on the paired questions
        paired = result.calibration
        caption = untrusted("; ".join(f"note: {note}" for note in paired.notes), "yellow") if paired.notes else None
        calibration = [
            Table(*CALIBRATION_HEADER, title="calibration of the option probes on the paired questions (95% CI)", caption=caption)
        ]
        for cells in calibration_rows(paired.a, "A", paired.mass_a) + calibration_rows(paired.b, "B", paired.mass_b):
            calibration[0].add_row(*(untrusted(cell) for cell in cells))
    return [figures, *_benchmark_tables(result), abstention, mcnemar, fisher, rest, moves, *calibration]


def _benchmark_tables(result: RunComparison) -> list[Table | Text]:
    """compare's per-benchmark figures on the paired questions (``evaluation.benchmarks``), and why
    LongBench's QA average is missing when it is; nothing when no paired question carries a benchmark."""
    from paper_explorer.evaluation.benchmarks import PAIRED_HEADER, missing_note, paired_rows

    if result.benchmarks is None:
        return []
    # 80 columns hold every figure: the name folds, and each F1's rule is said below the table
    table = Table(title="per benchmark on the paired questions (x100)")
    name, pairs, figure, *figures = PAIRED_HEADER
    table.add_column(name, overflow="fold")
    table.add_column(pairs, justify="right", no_wrap=True)
    table.add_column(figure, no_wrap=True)
    for heading in figures:
        table.add_column(heading, justify="right")
    rules: dict[str, list[str]] = {}
    benchmark = ""
    for cells in paired_rows(result.benchmarks):
        benchmark = cells[0] or benchmark
        label = cells[2]
        if label.startswith("F1 (") and label.endswith(")"):
            named = rules.setdefault(label[len("F1 (") : -1], [])
            if benchmark.partition("/")[0] + "/" not in named:
                named.append(benchmark.partition("/")[0] + "/")
            label = "F1"
        elif label == "failed / no answer":
            label = "failed/none"
        table.add_row(*(untrusted(cell) for cell in [cells[0], cells[1], label, *cells[3:]]))  # names come from the questions file
    notes: list[Table | Text] = [untrusted(f"F1 of {', '.join(names)}: {rule}", "dim") for rule, names in rules.items()]
    average = result.benchmarks.longbench_qa
    note = missing_note(average.a if average is not None else None)
    return [table, *notes] if note is None else [table, *notes, untrusted(note, "yellow")]


def _tokens(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else (f"{value:+,.0f}" if signed else f"{value:,.0f}")


def report_command(
    run_dir: Path = typer.Argument(..., help="A run directory written by explorer eval (run A of a comparison), or by explorer decide."),
    run_b: Path | None = typer.Argument(None, help="A second run: the report compares it with the first, question by question."),
    out: Path = typer.Option(..., "--out", "-o", help="The HTML file to write (self-contained, opens offline)."),
    force: bool = typer.Option(False, "--force", help="Overwrite OUT if it exists."),
    corpus_path: Path | None = typer.Option(
        None,
        "--corpus",
        "-c",
        help="The corpus the run(s) used, for the gold answers and "
        "cited paragraphs (default: the one the manifest recorded; its hash is checked).",
    ),
    questions_path: Path | None = typer.Option(
        None, "--questions", help="The questions file the run(s) were given, if any (its hash is checked)."
    ),
) -> None:
    """Write one self-contained HTML report of a run (metrics, plots, every episode with its gold answers,
    prediction, cited paragraphs, steps and flags), or of two runs compared question by question with
    the statistics of explorer compare."""
    from paper_explorer.evaluation.html_report import report
    from paper_explorer.evaluation.run_directory import DECIDE_RUN, kind_of

    if kind_of(run_dir) is DECIDE_RUN:
        _report_decisions(run_dir, run_b, out, force, corpus_path=corpus_path, questions_path=questions_path)
    else:
        report(run_dir, run_b, out=out, corpus=corpus_path, questions=questions_path, force=force, note=say_note)
    typer.echo(f"report written to {out}")


def _report_decisions(run_dir: Path, run_b: Path | None, out: Path, force: bool, **eval_only: Path | None) -> None:
    from paper_explorer.decisions.report import write_decision_report
    from paper_explorer.decisions.run_reading import DecisionRun

    if run_b is not None:
        raise UsageError(f"{run_dir}: a decide run is reported alone; explorer compare {run_dir} {run_b} compares two")
    given = [f"--{name.removesuffix('_path')}" for name, value in eval_only.items() if value is not None]
    if given:
        raise UsageError(f"{run_dir}: a decide run holds its questions and labels; {', '.join(given)} applies to an eval run")
    write_decision_report(DecisionRun.load(run_dir), out, force)
