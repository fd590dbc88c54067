"""``explorer compare A B`` for two decide runs of one decision file: per kind, on the questions
both runs measured with a label, each run's accuracy, top-label ECE (equal-width), multi-class
Brier and NLL, and B - A with a paired bootstrap interval; and how often the two runs' likeliest
options agree.

Paired: one draw of questions (with replacement, seeded) is used for both runs and every figure,
so each interval is of the difference on the same questions (``evaluation.calibration.bootstrap_interval``
over question indices). ECE is not a mean of per-question values, so the difference is
recomputed on each draw, as the others are.

Runs of two files are refused (their questions cannot be paired: the file's SHA-256 decides).
Runs made with other settings (backend, model, option order, mode, cut, context, prompts) are
compared with a note naming each difference: it is what the comparison measures.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict
from rich.console import Console
from rich.table import Column, Table

from paper_explorer.agent.terminal_text import untrusted
from paper_explorer.decisions.errors import DecisionError
from paper_explorer.decisions.records import DecisionRecord
from paper_explorer.decisions.run_reading import DecisionRun
from paper_explorer.decisions.schema import KINDS
from paper_explorer.evaluation.calibration import CLIP, DEFAULT_BINS, bootstrap_interval, ece
from paper_explorer.evaluation.records import Interval

SETTINGS = ("backend", "order", "mode", "cut", "context", "prompts_sha256")
MODEL_SETTINGS = ("model", "adapter_sha256", "quantization", "dtype")  # of the manifest's model (threads, device: how, not what)
FIGURES = ("accuracy", "ece", "brier", "nll")


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PairedFigure(Record):
    a: float
    b: float
    difference: float  # b - a
    difference_ci95: Interval  # paired bootstrap over the questions


class KindComparison(Record):
    kind: str
    paired: int  # questions of this kind both runs measured, with a label: the figures' n
    accuracy: PairedFigure | None = None
    ece: PairedFigure | None = None  # top-label, equal-width bins
    brier: PairedFigure | None = None
    nll: PairedFigure | None = None


class DecisionComparison(Record):
    run_a: str
    run_b: str
    file: str
    file_sha256: str
    questions: int
    measured_in_both: int
    only_a: int  # measured in A only
    only_b: int
    agreement: float | None  # share of the questions measured in both whose likeliest option is the same
    agreeing: int
    bins: int
    kinds: dict[str, KindComparison]
    notes: list[str]


def _row(record: DecisionRecord) -> tuple[np.ndarray, int]:
    assert record.probabilities is not None and record.label is not None
    return np.asarray(record.probabilities, dtype=float), record.options.index(record.label)


def per_question(records: list[DecisionRecord]) -> dict[str, np.ndarray]:
    """Each labelled, measured question's top-label confidence and correctness, Brier and NLL."""
    rows = [_row(record) for record in records]
    return {
        "confidence": np.array([row.max() for row, _ in rows]),
        "correct": np.array([int(np.argmax(row)) == label for row, label in rows], dtype=float),
        "brier": np.array([np.sum((row - np.eye(row.size)[label]) ** 2) for row, label in rows]),
        "nll": np.array([-np.log(np.clip(row[label], CLIP, 1 - CLIP)) for row, label in rows]),
    }


def figure_of(name: str, values: dict[str, np.ndarray], bins: int) -> Callable[[np.ndarray], float]:
    """The run's figure ``name`` on the questions at the given indices."""
    if name == "ece":
        return lambda index: ece(values["confidence"][index], values["correct"][index], bins)
    column = values["correct" if name == "accuracy" else name]
    return lambda index: float(column[index].mean())


def kind_comparison(kind: str, a: list[DecisionRecord], b: list[DecisionRecord], bins: int, seed: int) -> KindComparison:
    if not a:
        return KindComparison(kind=kind, paired=0)
    values_a, values_b = per_question(a), per_question(b)
    every = np.arange(len(a))
    figures = {}
    for name in FIGURES:
        of_a, of_b = figure_of(name, values_a, bins), figure_of(name, values_b, bins)

        def difference(index: np.ndarray, _: np.ndarray, of_a=of_a, of_b=of_b) -> float:
            return of_b(index) - of_a(index)

        figures[name] = PairedFigure(
            a=of_a(every),
            b=of_b(every),
            difference=of_b(every) - of_a(every),
            difference_ci95=bootstrap_interval(difference, every, every, seed),
        )
    return KindComparison(kind=kind, paired=len(a), **figures)


def compare_decisions(a: DecisionRun, b: DecisionRun, bins: int = DEFAULT_BINS, seed: int = 0) -> DecisionComparison:
    """B against A on the questions both measured (refused for runs of two decision files)."""
    if a.manifest.file_sha256 != b.manifest.file_sha256:
        raise DecisionError(
            f"{a.directory} and {b.directory} are runs of two decision files ({a.manifest.file}, SHA-256 "
            f"{a.manifest.file_sha256[:12]}; {b.manifest.file}, {b.manifest.file_sha256[:12]}): their questions cannot be "
            "paired; compare two runs of one file"
        )
    by_b = b.by_question()
    both = [(record, by_b[record.question_id]) for record in a.records if record.measured and by_b[record.question_id].measured]
    agreeing = sum(ra.predicted == rb.predicted for ra, rb in both)
    kinds = {}
    for kind in KINDS:
        pairs = [(ra, rb) for ra, rb in both if ra.kind == kind and ra.label is not None]
        if any(record.kind == kind for record in a.records):
            kinds[kind] = kind_comparison(kind, [ra for ra, _ in pairs], [rb for _, rb in pairs], bins, seed)
    settings_a = {name: getattr(a.manifest, name) for name in SETTINGS} | {name: a.manifest.model.get(name) for name in MODEL_SETTINGS}
    settings_b = {name: getattr(b.manifest, name) for name in SETTINGS} | {name: b.manifest.model.get(name) for name in MODEL_SETTINGS}
    notes = [
        f"the runs differ in {name}: A {settings_a[name]}, B {settings_b[name]}"
        for name in settings_a
        if settings_a[name] != settings_b[name]
    ]
    return DecisionComparison(
        run_a=str(a.directory),
        run_b=str(b.directory),
        file=a.manifest.file,
        file_sha256=a.manifest.file_sha256,
        questions=len(a.records),
        measured_in_both=len(both),
        only_a=sum(record.measured and not by_b[record.question_id].measured for record in a.records),
        only_b=sum(not record.measured and by_b[record.question_id].measured for record in a.records),
        agreement=agreeing / len(both) if both else None,
        agreeing=agreeing,
        bins=bins,
        kinds=kinds,
        notes=notes,
    )


def print_comparison(console: Console, result: DecisionComparison) -> None:
    """``explorer compare``'s lines and table for two decide runs, within 80 columns (paths and
    notes come from the runs' files: printed as untrusted text)."""
    console.print(untrusted(f"A: {result.run_a}\nB: {result.run_b}\nboth runs of {result.file}"))
    for note in result.notes:
        console.print(untrusted(f"note: {note}", "yellow"))
    agreement = "-" if result.agreement is None else f"{result.agreement:.3f}"
    console.print(
        f"{result.measured_in_both} of {result.questions} questions measured in both "
        f"({result.only_a} in A only, {result.only_b} in B only); likeliest option the same in {result.agreeing} ({agreement})"
    )
    table = Table(
        Column("kind", no_wrap=True),
        Column("n", justify="right", no_wrap=True),
        Column("figure", no_wrap=True),
        Column("A", justify="right", no_wrap=True),
        Column("B", justify="right", no_wrap=True),
        Column("B - A (95% CI)", justify="right", no_wrap=True),
        title=f"per kind, labelled questions both measured; ECE: {result.bins} equal-width bins",
    )
    for kind in result.kinds.values():
        figures = [(name, getattr(kind, name)) for name in ("accuracy", "ece", "brier", "nll")]
        if kind.paired == 0:
            table.add_row(kind.kind, "0", "-", "-", "-", "-", end_section=True)
            continue
        for index, (name, figure) in enumerate(figures):
            interval = figure.difference_ci95
            table.add_row(
                kind.kind if index == 0 else "",
                str(kind.paired) if index == 0 else "",
                name,
                f"{figure.a:.3f}",
                f"{figure.b:.3f}",
                f"{figure.difference:+.3f} ({interval.low:+.3f} to {interval.high:+.3f})",
                end_section=index == len(figures) - 1,
            )
    console.print(table)


__all__ = ["DecisionComparison", "KindComparison", "PairedFigure", "compare_decisions", "print_comparison"]
