"""``explorer inspect DECIDE_RUN``: a decide run in the terminal, within 80 columns.

The summary: per kind, the counts and top-label figures (accuracy, multi-class Brier, NLL, the mean
confidence statistic and p_max) and the two ECEs with their 95% bootstrap intervals; how many
questions were not measured or cut; the checks' figures where a command recorded them; then the
most confidently wrong and the least confident questions. ``--episode QUESTION_ID``: one question's
options with their probabilities (the likeliest ``TOP_OPTIONS`` when there are more).

Question texts, ids, options and reasons come from the user's file and the run's lines: they reach
the terminal as ``agent.terminal_text.untrusted`` text, never as rich markup.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

from paper_explorer.agent.terminal_text import untrusted
from paper_explorer.decisions.checks import check_lines
from paper_explorer.decisions.errors import DecisionError
from paper_explorer.decisions.records import DecisionRecord, KindFigures
from paper_explorer.decisions.run_reading import DecisionRun
from paper_explorer.evaluation.records import Interval

TOP_OPTIONS = 10
QUESTION_CHARS = 34
OPTION_CHARS = 14
NOT_MEASURED_IDS = 10


def number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def with_interval(value: float | None, interval: Interval | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if interval is None else f"{value:.3f} ({interval.low:.3f}-{interval.high:.3f})"


def figures_table(kinds: dict[str, KindFigures]) -> Table:
    """Per kind: counts, accuracy, Brier, NLL, the mean confidence statistic and p_max."""
    table = Table(title="per kind (figures over the labelled questions)")
    for heading in ("kind", "n", "measured", "labelled", "acc", "Brier", "NLL", "conf", "p_max"):
        table.add_column(heading, justify="left" if heading == "kind" else "right", no_wrap=True)
    for figures in kinds.values():
        table.add_row(
            figures.kind,
            str(figures.questions),
            str(figures.measured),
            str(figures.labelled),
            number(figures.accuracy),
            number(figures.brier),
            number(figures.nll),
            number(figures.mean_confidence),
            number(figures.mean_p_max),
        )
    return table


def ece_table(kinds: dict[str, KindFigures]) -> Table:
    """Per kind: top-label ECE over equal-width and equal-mass bins, each with its 95% interval."""
    bins = next(iter(kinds.values())).bins if kinds else 0
    table = Table(
        Column("kind", no_wrap=True),
        Column("ECE equal-width (95% CI)", justify="right", no_wrap=True),
        Column("ECE equal-mass (95% CI)", justify="right", no_wrap=True),
        title=f"top-label calibration ({bins} bins)",
    )
    for figures in kinds.values():
        table.add_row(
            figures.kind,
            with_interval(figures.ece_equal_width, figures.ece_equal_width_ci95),
            with_interval(figures.ece_equal_mass, figures.ece_equal_mass_ci95),
        )
    return table


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


def questions_table(title: str, records: list[DecisionRecord]) -> Table:
    table = Table(
        Column("question", no_wrap=True),  # the id --episode takes, whole
        Column("kind", no_wrap=True),
        Column("text", overflow="fold"),
        Column("predicted", overflow="fold"),
        Column("p_max", justify="right", no_wrap=True),
        Column("label", overflow="fold"),
        title=title,
    )
    for record in records:
        table.add_row(
            untrusted(record.question_id),
            record.kind,
            untrusted(_cut(record.question, QUESTION_CHARS)),
            untrusted(_cut(record.predicted or "-", OPTION_CHARS)),
            number(record.p_max),
            untrusted(_cut(record.label or "-", OPTION_CHARS)),
        )
    return table


def worst(run: DecisionRun, count: int) -> tuple[list[DecisionRecord], list[DecisionRecord]]:
    """(the labelled questions answered wrong, most confident first; the measured questions, least
    confident first by the confidence statistic), ``count`` of each."""
    wrong = sorted((r for r in run.measured if r.correct is False), key=lambda r: -(r.p_max or 0.0))
    unsure = sorted(run.measured, key=lambda r: r.confidence if r.confidence is not None else 0.0)
    return wrong[:count], unsure[:count]


def print_run(console: Console, run: DecisionRun, count: int) -> None:
    metrics, manifest = run.metrics, run.manifest
    console.print(
        untrusted(
            f"decide run {run.directory}: {manifest.questions} questions of {manifest.file} "
            f"({manifest.backend} {manifest.model.get('model', '')}; order {manifest.order}, cut {manifest.cut})"
        )
    )
    console.print(figures_table(metrics.kinds))
    console.print(ece_table(metrics.kinds))
    cut = [r for r in run.records if r.cut is not None]
    console.print(
        f"{metrics.measured} measured, {metrics.not_measured} not measured, {metrics.cut} cut to fit"
        + (f" ({sum(r.cut.tokens for r in cut if r.cut)} document tokens dropped)" if cut else "")
    )
    unmeasured = [record for record in run.records if record.not_measured is not None]
    if unmeasured:  # each reason names its own numbers: the first in full, the rest by id
        ids = ", ".join(record.question_id for record in unmeasured[:NOT_MEASURED_IDS])
        more = f" and {len(unmeasured) - NOT_MEASURED_IDS} more" if len(unmeasured) > NOT_MEASURED_IDS else ""
        console.print(Text.assemble(("not measured: ", "yellow"), untrusted(f"{ids}{more}")))
        first = unmeasured[0]
        console.print(untrusted(f"  {first.question_id}: {first.not_measured}"))
    if metrics.checks is not None:
        for line in check_lines(metrics.checks):
            console.print(untrusted(line))
    if count == 0:
        return
    wrong, unsure = worst(run, count)
    if wrong:
        console.print(questions_table(f"most confidently wrong ({len(wrong)})", wrong))
    else:
        console.print("no measured question with a label was answered wrong")
    if unsure:
        console.print(questions_table(f"least confident ({len(unsure)})", unsure))
    console.print(untrusted(f"one question's options: explorer inspect {run.directory} --episode QUESTION_ID"), style="dim")


def print_question(console: Console, run: DecisionRun, question_id: str) -> None:
    record = run.by_question().get(question_id)
    if record is None:
        raise DecisionError(f"{run.directory}: no question {question_id!r}; explorer inspect {run.directory} lists some")
    console.print(
        Text.assemble(("question ", "bold"), untrusted(record.question_id), f" ({record.kind}), document ", untrusted(record.document_id))
    )
    console.print(untrusted(record.question))
    if record.cut is not None:
        console.print(f"document cut at its {record.cut.side}: {record.cut.tokens} tokens dropped, {record.cut.kept} kept", style="yellow")
    probabilities = record.probabilities
    if probabilities is None:
        console.print(Text.assemble(("not measured: ", "yellow"), untrusted(record.not_measured or "")))
        return
    ranked = sorted(range(len(record.options)), key=lambda i: -probabilities[i])
    shown = ranked[:TOP_OPTIONS]
    title = f"{len(record.options)} options" + (f", the likeliest {TOP_OPTIONS}" if len(ranked) > TOP_OPTIONS else "")
    table = Table(
        Column("#", justify="right", no_wrap=True),
        Column("option", overflow="fold"),
        Column("probability", justify="right", no_wrap=True),
        Column("log-likelihood", justify="right", no_wrap=True),
        Column("", no_wrap=True),
        title=title + " (#: place as listed)",
    )
    for index in shown:
        option = record.options[index]
        marks = " ".join(mark for mark, on in (("predicted", option == record.predicted), ("label", option == record.label)) if on)
        loglikelihood = (record.loglikelihoods or [])[index]
        table.add_row(str(index + 1), untrusted(option), f"{probabilities[index]:.4f}", f"{loglikelihood:.3f}", marks)
    console.print(table)
    verdict = "" if record.correct is None else (" (right)" if record.correct else " (wrong)")
    console.print(
        untrusted(
            f"p_max {number(record.p_max, 4)}, confidence {number(record.confidence, 4)}, options' mass "
            f"{'-' if record.log_mass is None else f'{record.log_mass:.3f}'} (log), label {record.label or 'none'}{verdict}"
        )
    )


__all__ = ["check_lines", "print_question", "print_run", "worst"]
