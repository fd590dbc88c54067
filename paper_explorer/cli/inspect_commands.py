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
from paper_explorer.cli.options import CorpusOption, QuestionsOption, SplitOfOption, open_corpus, select_questions, split_of

if TYPE_CHECKING:
    from paper_explorer.agent.trajectory import Trajectory
    from paper_explorer.evaluation.compare import RunComparison

console = Console()


def preregister_command(
    out: Path = typer.Option(..., "--out", "-o", help="The preregistration TOML to write."),
    corpus_path: Path | None = CorpusOption,
    questions_path: Path | None = QuestionsOption,
    split: str | None = typer.Option(
        None, "--split", help="Split the run will ask (as explorer eval --split; default test, all when the corpus has no splits)."
    ),
    split_of_values: list[str] | None = SplitOfOption,
    limit: int | None = typer.Option(None, "--limit", min=1, help="Only the first N questions (as explorer eval --limit)."),
    min_correct_abstentions: int = typer.Option(
        ...,
        "--min-correct-abstentions",
        metavar="<int>",
        rich_help_panel="Pass rule",
        help="Pass only with at least this many abstentions on unanswerable questions (>= 0).",
    ),
    max_false_abstentions: int = typer.Option(
        ...,
        "--max-false-abstentions",
        metavar="<int>",
        rich_help_panel="Pass rule",
        help="Pass only with at most this many abstentions on answerable questions (>= 0).",
    ),
    comparison: Path | None = typer.Option(
        None,
        "--comparison",
        rich_help_panel="Comparison",
        help="A finished run directory to Fisher-test against (as you would name it here).",
    ),
    alpha: float = typer.Option(
        0.05, "--alpha", min=0.0001, max=0.5, rich_help_panel="Comparison", help="Significance level of the comparison."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite OUT."),
) -> None:
    """Freeze the corpus and question hashes of a future run, with its pass rule, into a TOML file."""
    from paper_explorer.corpus.collection import questions_sha256
    from paper_explorer.corpus.files import atomic_file
    from paper_explorer.evaluation.prereg import template

    if out.exists() and not force:
        raise UsageError(f"{out}: already exists; pass --force to overwrite it")
    for flag, value in (("--min-correct-abstentions", min_correct_abstentions), ("--max-false-abstentions", max_false_abstentions)):
        if value < 0:  # checked here, not by a typer range, whose bounds would crowd the option's name out of 80 columns
            raise UsageError(f"{flag} {value}: a count of abstentions; give 0 or more")
    if comparison is not None:
        comparison = comparison.resolve()  # stored absolute: the file may be read from anywhere
        if not (comparison / "metrics.json").is_file():
            raise UsageError(f"--comparison {comparison}: no metrics.json; name a finished run directory (explorer eval --out)")
    corpus = open_corpus(corpus_path, questions_path, split_of(split_of_values))
    questions = select_questions(corpus, split, limit)
    text = template(
        corpus.papers_sha256,
        questions_sha256(questions),
        len(questions),
        min_correct_abstentions,
        max_false_abstentions,
        str(comparison) if comparison else None,
        alpha,
    )
    with atomic_file(out) as handle:
        handle.write(text)
    typer.echo(f"preregistration written to {out} ({len(questions)} questions); run: explorer eval --preregistration {out} ...")


def inspect_command(
    run_dir: Path = typer.Argument(..., help="A run directory written by explorer eval."),
    episode: str | None = typer.Option(None, "--episode", "-e", help="Show one episode (episode or question id) with its flags."),
    flag: str | None = typer.Option(None, "--flag", "-f", help="List the episodes a detector flagged, with its evidence."),
    worst: int = typer.Option(10, "--worst", min=0, help="How many of the worst episodes to list."),
) -> None:
    """Summarise a run (metrics, abstention, detector rates, worst episodes), or drill into a flag or an episode."""
    from paper_explorer.cli.display import id_column
    from paper_explorer.evaluation.detectors import DETECTORS
    from paper_explorer.evaluation.run_directory import Run
    from paper_explorer.evaluation.summary import print_summary

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
                console.print(f"answer F1 {score.answer_f1:.3f}, exact match {score.exact_match:.0f}, evidence F1 {score.evidence_f1:.3f}")
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


def _print_changed_observations(trajectory: Trajectory) -> None:
    """A replayed episode's observations that differ from its recording (nothing for other policies)."""
    from paper_explorer.evaluation.scoring import compared_observations

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
    from paper_explorer.evaluation.compare import compare_runs, confound_note
    from paper_explorer.evaluation.run_directory import Run

    runs = Run.load(run_a), Run.load(run_b)
    result = compare_runs(*runs)
    for run in runs:
        if any(score.sample for score in run.scores):
            typer.echo(
                f"note: {run.directory} has several samples per question; compare pairs each question's first "
                "(its pass@k and majority vote are in its metrics.json)",
                err=True,
            )
    if result.paired_questions == 0:
        raise UsageError(
            f"the runs share no scored question ({result.unpaired.only_in_a} scored only in A, "
            f"{result.unpaired.only_in_b} only in B); compare runs of the same split"
        )
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


def _compare_tables(result: RunComparison) -> list[Table | str]:
    """``explorer compare``'s tables: paired figures, abstention, the paired tests, Fisher, the unpaired rest, the moves, calibration."""
    from paper_explorer.evaluation.report import CALIBRATION_HEADER, calibration_rows
    from paper_explorer.evaluation.stats import format_p

    def number(value: float | None, signed: bool = False) -> str:
        return "-" if value is None else (f"{value:+.3f}" if signed else f"{value:.3f}")

    f1, em, ci = result.answer_f1, result.exact_match, result.answer_f1.paired_difference_ci95
    n = result.paired_questions
    figures = Table("figure", "A", "B", "B - A", f"{ci.confidence:.0%} CI of B - A", title=f"paired questions (n = {n})")
    figures.add_row(
        "answer F1",
        number(f1.a),
        number(f1.b),
        number(ci.mean, signed=True),
        f"{ci.low:+.3f} to {ci.high:+.3f} (paired bootstrap)" if ci.low is not None else "-",
    )
    figures.add_row("exact match", number(em.a), number(em.b), number(em.difference, signed=True), "-")
    for label, sub in (
        ("SubEM (whole tokens)", result.sub_exact_match),
        ("SubEM (substring, LongBench)", result.sub_exact_match_substring),
    ):
        figures.add_row(label, number(sub.a), number(sub.b), number(sub.difference, signed=True), "-")
    tokens, spent = result.model_tokens, result.model_tokens.paired_difference_ci95
    figures.add_row(
        f"model tokens per episode ({tokens.pairs} pairs)",
        _tokens(tokens.a),
        _tokens(tokens.b),
        _tokens(spent.mean, signed=True),
        f"{spent.low:+,.0f} to {spent.high:+,.0f} (paired bootstrap)" if spent.low is not None else "-",
    )
    rate = result.direct_submit_rate
    figures.add_row("direct-submit rate", f"{rate.a:.1%}", f"{rate.b:.1%}", f"{rate.b - rate.a:+.1%}", "-")

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
    for test in [result.mcnemar_exact_match, *result.mcnemar_sub_exact_match, *result.mcnemar_abstention]:
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
    for test in result.fisher_abstention:
        (a_abstained, a_answered), (b_abstained, b_answered) = test.table
        fisher.add_row(
            test.row,
            str(a_abstained),
            str(a_answered),
            str(b_abstained),
            str(b_answered),
            "n/a" if test.odds_ratio is None else f"{test.odds_ratio:.3g}",
            format_p(test.p_value),
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
        for row in result.largest_differences:
            moves.add_row(untrusted(row.question[:50]), untrusted(row.a[:30]), untrusted(row.b[:30]), f"{row.f1_a:.2f}", f"{row.f1_b:.2f}")
    calibration: list[Table] = []
    if result.calibration is not None:  # each run's figures per probe, on the paired questions
        paired = result.calibration
        caption = untrusted("; ".join(f"note: {note}" for note in paired.notes), "yellow") if paired.notes else None
        calibration = [
            Table(*CALIBRATION_HEADER, title="calibration of the option probes on the paired questions (95% CI)", caption=caption)
        ]
        for row in calibration_rows(paired.a, "A", paired.mass_a) + calibration_rows(paired.b, "B", paired.mass_b):
            calibration[0].add_row(*(untrusted(cell) for cell in row))
    return [figures, abstention, mcnemar, fisher, rest, moves, *calibration]


def _tokens(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else (f"{value:+,.0f}" if signed else f"{value:,.0f}")


def report_command(
    run_dir: Path = typer.Argument(..., help="A run directory written by explorer eval (run A of a comparison)."),
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
    from paper_explorer.evaluation.report import write_report
    from paper_explorer.evaluation.run_directory import Run

    if out.is_dir():
        raise UsageError(f"{out}: is a directory; name the .html file to write")
    if out.exists() and not force:
        raise UsageError(f"{out}: already exists; pass --force to overwrite it, or name another file")
    runs = [Run.load(run_dir)] + ([] if run_b is None else [Run.load(run_b)])
    corpus = _report_corpus(runs, corpus_path, questions_path)
    if run_b is None:
        write_report(runs[0], corpus, out)
    else:
        _write_comparison_report(runs[0], runs[1], corpus, out)
    typer.echo(f"report written to {out}")


def _report_corpus(runs: list, corpus_path: Path | None, questions_path: Path | None):
    """The corpus the runs were made on: the one named, else the first run's recorded one; refused
    unless its papers and questions hash to what every run's manifest recorded."""
    from paper_explorer.evaluation.report_data import check_corpus
    from paper_explorer.evaluation.resume import recorded_corpus

    first = runs[0].manifest
    if len(runs) == 2:
        theirs = runs[1].manifest.hashes
        for what, a, b in (
            ("corpora", first.hashes.corpus_sha256, theirs.corpus_sha256),
            ("question sets", first.hashes.questions_sha256, theirs.questions_sha256),
        ):
            if a != b:
                raise UsageError(
                    f"the runs used different {what} (sha256 {a[:12]} and {b[:12]}): their questions cannot be "
                    "paired; report runs made on the same corpus, or explorer report each run alone"
                )
    path = corpus_path if corpus_path is not None else recorded_corpus(first)
    corpus = open_corpus(path, questions_path, first.config.split_of or None)
    for run in runs:
        check_corpus(run, corpus, str(path) if path is not None else "the generated demo corpus")
    return corpus


def _write_comparison_report(run_a, run_b, corpus, out: Path) -> None:
    from paper_explorer.evaluation.compare import compare_runs
    from paper_explorer.evaluation.report_compare import write_comparison_report

    comparison = compare_runs(run_a, run_b, top=len(run_a.scores))  # every question whose F1 moved, largest first
    if comparison.paired_questions == 0:
        raise UsageError(
            f"the runs share no scored question ({comparison.unpaired.only_in_a} scored only in A, "
            f"{comparison.unpaired.only_in_b} only in B); report runs of the same split"
        )
    for run in (run_a, run_b):
        if any(score.sample for score in run.scores):
            typer.echo(
                f"note: {run.directory} has several samples per question; the report pairs each question's first "
                "(its pass@k and majority vote are in its metrics.json)",
                err=True,
            )
    write_comparison_report(run_a, run_b, comparison, corpus, out)
