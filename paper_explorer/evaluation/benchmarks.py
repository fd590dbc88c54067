"""Per-benchmark tables: a run whose questions carry ``Question.benchmark`` ("longbench/hotpotqa",
"memagent/hotpotqa") reported as the benchmarks' released tables report it. Per benchmark/subset:
its questions, EM, F1 by that benchmark's own rule, the bidirectional SubEM, and how many episodes
failed or gave no valid answer (in the denominator, at 0); then LongBench's QA average, the mean of
its five subsets' means. ``explorer compare`` gets the same per benchmark on the paired questions,
side by side, with B - A.

A benchmark's F1 (``F1_RULES``): LongBench's ``qa_f1_score`` for longbench/* (``answer_f1``, the
same function), HotpotQA's for memagent/* (``hotpotqa_f1``: a yes, no or noanswer must be the
gold's), as MemAgent scores its QA tasks with ``update_answer``; any other benchmark (a user's own)
gets ``answer_f1``. EM is ``exact_match``, SubEM ``sub_exact_match_substring``. Every figure is a
mean of the episodes' values in scores.jsonl (``evaluation.answer_metrics``): nothing is scored
twice, and ``Run.load`` recomputes these tables with the rest of metrics.json.

Shown as the released tables show them: x100, two decimals (LongBench's ``eval.py`` rounds so).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from statistics import fmean
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from paper_explorer.evaluation.answer_metrics import ANSWER_F1, EXACT_MATCH, HOTPOTQA_F1, SUB_EXACT_MATCH_SUBSTRING
from paper_explorer.evaluation.records import BenchmarkFigures, BenchmarkTables, MacroAverage, MeanInterval
from paper_explorer.evaluation.stats import bootstrap_mean_ci

if TYPE_CHECKING:
    from paper_explorer.evaluation.scoring import EpisodeScore

# LongBench's five QA subsets whose mean its released tables report (multifieldqa_en is tabled, not averaged).
LONGBENCH_QA = ("longbench/narrativeqa", "longbench/qasper", "longbench/hotpotqa", "longbench/2wikimqa", "longbench/musique")
LONGBENCH_QA_LABEL = "LongBench QA (mean of 5 subsets)"
F1_RULES = {"longbench": ANSWER_F1, "memagent": HOTPOTQA_F1}
F1_RULE_NAMES = {"longbench": "LongBench qa_f1_score", "memagent": "HotpotQA F1"}  # as the tables name them
FAILED = ("step_limit", "context_limit", "policy_error")
FIGURES = ("exact_match", "f1", "sub_exact_match")  # BenchmarkFigures' and MacroAverage's shares, as the tables order them


def f1_metric(benchmark: str) -> str:
    """The answer metric that is ``benchmark``'s F1 ("benchmark/subset")."""
    return F1_RULES.get(benchmark.partition("/")[0], ANSWER_F1)


def f1_rule(benchmark: str) -> str:
    """``benchmark``'s F1 as a table names it: its upstream's name, else the metric's key."""
    return F1_RULE_NAMES.get(benchmark.partition("/")[0], f1_metric(benchmark))


def by_benchmark(scores: Sequence[EpisodeScore]) -> dict[str, list[EpisodeScore]]:
    """The scored episodes of questions with a benchmark, by benchmark (sorted)."""
    groups: dict[str, list[EpisodeScore]] = defaultdict(list)
    for score in scores:
        if score.scored and score.benchmark is not None:
            groups[score.benchmark].append(score)
    return dict(sorted(groups.items()))


def _mean(scores: Sequence[EpisodeScore], name: str) -> float | None:
    """The metric's mean over the episodes; None when one was scored before the metric existed."""
    values = [score.metric(name) for score in scores]
    present = [value for value in values if value is not None]
    return fmean(present) if present and len(present) == len(values) else None


def benchmark_figures(benchmark: str, scores: Sequence[EpisodeScore]) -> BenchmarkFigures:
    f1 = f1_metric(benchmark)
    return BenchmarkFigures(
        questions=len({score.question_id for score in scores}),
        episodes=len(scores),
        exact_match=_mean(scores, EXACT_MATCH),
        f1=_mean(scores, f1),
        f1_metric=f1,
        sub_exact_match=_mean(scores, SUB_EXACT_MATCH_SUBSTRING),
        failed=sum(score.status in FAILED for score in scores),
        no_answer=sum(score.status == "no_answer" for score in scores),
    )


def macro_average(figures: dict[str, BenchmarkFigures]) -> MacroAverage | None:
    """LongBench's QA average over ``figures`` (None: no longbench benchmark among them)."""
    if not any(name.startswith("longbench/") for name in figures):
        return None
    missing = [subset for subset in LONGBENCH_QA if subset not in figures]

    def average(field: str) -> float | None:
        values = [getattr(figures[subset], field) for subset in LONGBENCH_QA if subset in figures]
        return None if missing or None in values else fmean(values)

    return MacroAverage(subsets=list(LONGBENCH_QA), **{field: average(field) for field in FIGURES}, missing=missing)


def benchmark_tables(scores: Sequence[EpisodeScore]) -> BenchmarkTables | None:
    """The run's per-benchmark tables; None when no scored question carries a benchmark."""
    groups = by_benchmark(scores)
    if not groups:
        return None
    figures = {name: benchmark_figures(name, group) for name, group in groups.items()}
    return BenchmarkTables(by_benchmark=figures, longbench_qa=macro_average(figures))


# -- two runs, paired -----------------------------------------------------------------------------


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Differences(Record):
    """B - A of each share (None where a run has no figure)."""

    exact_match: float | None
    f1: float | None
    sub_exact_match: float | None


def differences(a: BenchmarkFigures | MacroAverage, b: BenchmarkFigures | MacroAverage) -> Differences:
    def minus(field: str) -> float | None:
        x, y = getattr(a, field), getattr(b, field)
        return None if x is None or y is None else y - x

    return Differences(**{field: minus(field) for field in FIGURES})


class PairedBenchmark(Record):
    """One benchmark/subset on the questions both runs scored (each question's first sample)."""

    questions: int
    a: BenchmarkFigures
    b: BenchmarkFigures
    difference: Differences  # B - A
    f1_difference_ci95: MeanInterval | None  # mean of B - A per question, seeded BCa bootstrap; None: a run lacks the F1


class PairedMacroAverage(Record):
    a: MacroAverage
    b: MacroAverage
    difference: Differences


class PairedBenchmarks(Record):
    """``explorer compare``'s per-benchmark figures: by benchmark (A's question's), and LongBench's QA average."""

    by_benchmark: dict[str, PairedBenchmark]
    longbench_qa: PairedMacroAverage | None = None


def paired_benchmarks(pa: Sequence[EpisodeScore], pb: Sequence[EpisodeScore]) -> PairedBenchmarks | None:
    """Per benchmark, both runs on the paired questions (``pa[i]`` and ``pb[i]`` answer one question,
    whose benchmark is read from A); None when no paired question carries a benchmark."""
    positions: dict[str, list[int]] = defaultdict(list)
    for position, score in enumerate(pa):
        if score.benchmark is not None:
            positions[score.benchmark].append(position)
    if not positions:
        return None
    paired: dict[str, PairedBenchmark] = {}
    for name, where in sorted(positions.items()):
        a = benchmark_figures(name, [pa[i] for i in where])
        b = benchmark_figures(name, [pb[i] for i in where])
        f1 = a.f1_metric
        values = [(pa[i].metric(f1), pb[i].metric(f1)) for i in where]
        interval = None
        if all(x is not None and y is not None for x, y in values):
            interval = bootstrap_mean_ci([y - x for x, y in values])  # type: ignore[operator]
        paired[name] = PairedBenchmark(questions=len(where), a=a, b=b, difference=differences(a, b), f1_difference_ci95=interval)
    average_a = macro_average({name: figures.a for name, figures in paired.items()})
    average_b = macro_average({name: figures.b for name, figures in paired.items()})
    longbench = None
    if average_a is not None and average_b is not None:
        longbench = PairedMacroAverage(a=average_a, b=average_b, difference=differences(average_a, average_b))
    return PairedBenchmarks(by_benchmark=paired, longbench_qa=longbench)


# -- as tables show them --------------------------------------------------------------------------


def shown(value: float | None, signed: bool = False) -> str:
    """A share as the released tables show it: x100, two decimals ("-" for none)."""
    if value is None:
        return "-"
    return f"{100 * value:+.2f}" if signed else f"{100 * value:.2f}"


TABLE_HEADER = ["benchmark", "questions", "EM", "F1", "SubEM", "failed", "no answer", "F1 rule"]
TABLE_CAPTION = (
    "x100; EM, F1 (each benchmark's rule) and SubEM (bidirectional substring) after SQuAD normalisation, the best "
    "over the references. Every episode counts: failed (a limit or a policy error) and no answer (empty or cut at its cap) score 0."
)


def table_rows(tables: BenchmarkTables) -> list[list[str]]:
    """The run's per-benchmark table (``TABLE_HEADER``), then LongBench's QA average when all five subsets are in it."""
    rows = []
    for name, f in tables.by_benchmark.items():
        questions = str(f.questions) if f.episodes == f.questions else f"{f.questions} ({f.episodes} episodes)"
        rows.append(
            [
                name,
                questions,
                shown(f.exact_match),
                shown(f.f1),
                shown(f.sub_exact_match),
                str(f.failed),
                str(f.no_answer),
                f1_rule(name),
            ]
        )
    average = tables.longbench_qa
    if average is not None and not average.missing:
        counted = [tables.by_benchmark[subset] for subset in average.subsets]
        rows.append(
            [
                LONGBENCH_QA_LABEL,
                str(sum(f.questions for f in counted)),
                *(shown(getattr(average, field)) for field in FIGURES),
                str(sum(f.failed for f in counted)),
                str(sum(f.no_answer for f in counted)),
                f1_rule(LONGBENCH_QA[0]),
            ]
        )
    return rows


def missing_note(average: MacroAverage | None) -> str | None:
    """What to say when LongBench's QA average cannot be reported (None: it is, or the run has no LongBench)."""
    if average is None or not average.missing:
        return None
    return f"{LONGBENCH_QA_LABEL}: not reported, no question of {', '.join(average.missing)}"


PAIRED_HEADER = ["benchmark", "pairs", "figure", "A", "B", "B - A", "95% CI of B - A"]


def paired_rows(paired: PairedBenchmarks) -> list[list[str]]:
    """compare's per-benchmark figures (``PAIRED_HEADER``): EM, F1 and SubEM of each run on the paired
    questions of each benchmark, with B - A (and the paired interval of F1's), then how many failed."""
    rows = []
    for name, p in paired.by_benchmark.items():
        ci = p.f1_difference_ci95
        interval = "-" if ci is None or ci.low is None or ci.high is None else f"{shown(ci.low, True)} to {shown(ci.high, True)}"
        f1 = f"F1 ({f1_rule(name)})"
        for label, field, ci_text in (("EM", "exact_match", "-"), (f1, "f1", interval), ("SubEM", "sub_exact_match", "-")):
            first = label == "EM"
            rows.append(
                [
                    name if first else "",
                    str(p.questions) if first else "",
                    label,
                    shown(getattr(p.a, field)),
                    shown(getattr(p.b, field)),
                    shown(getattr(p.difference, field), signed=True),
                    ci_text,
                ]
            )
        rows.append(["", "", "failed / no answer", f"{p.a.failed} / {p.a.no_answer}", f"{p.b.failed} / {p.b.no_answer}", "", ""])
    average = paired.longbench_qa
    if average is not None and not average.a.missing:
        for label, field in (("EM", "exact_match"), ("F1", "f1"), ("SubEM", "sub_exact_match")):
            rows.append(
                [
                    LONGBENCH_QA_LABEL if label == "EM" else "",
                    "",
                    label,
                    shown(getattr(average.a, field)),
                    shown(getattr(average.b, field)),
                    shown(getattr(average.difference, field), signed=True),
                    "-",
                ]
            )
    return rows
