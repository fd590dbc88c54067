"""A run's metrics in the terminal: ``explorer eval``'s last words, ``explorer inspect``'s summary.

Reading the run directory is ``evaluation.run_directory``'s (``Run.load``); this module only prints."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from paper_explorer.agent.terminal_text import untrusted
from paper_explorer.evaluation.answer_metrics import EVIDENCE_F1, EVIDENCE_F1_STRICT
from paper_explorer.evaluation.benchmarks import TABLE_CAPTION, TABLE_HEADER, missing_note, table_rows
from paper_explorer.evaluation.records import BenchmarkTables, ReplayDrift, RunMetrics, figure_label, figure_text


def _shown(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def retrieval_label(name: str, searched_episodes: int | None) -> str:
    """A search figure's row. Its queries were the questions' own texts (``evaluation.retrieval``), so
    it describes the questions and the index, not the policy: the label says so, and says when the
    policy never searched, lest a reader credit it with a search it never made (None: a run scored
    before searches were counted)."""
    never = "; the policy never searched" if searched_episodes == 0 else ""
    return f"search {name} (of the questions' BM25 results{never})"


# The abstention table's columns for episodes that neither answered nor abstained (AbstentionRow's).
NO_ANSWER = ("step_limit", "context_limit", "policy_error", "no_answer")


def print_summary(console: Console, metrics: RunMetrics, out: Path | None = None) -> None:
    table = Table("metric", "value", title=untrusted(str(out)) if out else "metrics")
    for name, value in metrics.headline():
        shown = figure_text(name, value)
        ci = metrics.interval(name)
        if ci is not None and ci.low is not None and ci.high is not None:
            shown += f"  ({ci.confidence:.0%} CI {ci.low:.3f}-{ci.high:.3f})"
        table.add_row(figure_label(name), shown)
    for kind, value in metrics.answer_f1_by_type.items():
        table.add_row(f"answer_f1 ({kind})", _shown(value))
    for name, value in metrics.retrieval.items():
        if name != "questions":
            table.add_row(retrieval_label(name, metrics.searched_episodes), _shown(value))
    console.print(table)
    if metrics.benchmarks is not None:
        print_benchmarks(console, metrics.benchmarks)
    abstention = Table("gold \\ ended", "answered", "abstained", *NO_ANSWER, title="how episodes ended")
    for row, counts in metrics.abstention.rows():
        abstention.add_row(row, str(counts.answered), str(counts.abstained), *(str(getattr(counts, n)) for n in NO_ANSWER))
    console.print(abstention)
    unanswered = sum(counts.undecided() for _, counts in metrics.abstention.rows())
    if unanswered:
        console.print(
            f"[yellow]{unanswered} episodes ended without answering or abstaining (flagged no_answer): "
            "counted in neither column of the abstention tests; their answer metrics are 0[/yellow]"
        )
    invalid = sum(counts.no_answer for _, counts in metrics.abstention.rows())
    if invalid:
        console.print(
            f"[yellow]{invalid} episodes ended in no_answer (the policy's own answer was empty or cut at its cap; "
            f"flagged invalid_answer): scored 0 and kept in the denominator[/yellow]"
        )
    official, strict = metrics.metric(EVIDENCE_F1), metrics.metric(EVIDENCE_F1_STRICT)
    if official is not None and strict is not None and strict != official:
        console.print(
            f"evidence F1 {official:.3f} by QASPER's official rule (an episode with no evidence on a question "
            f"with none scores 1.0, answered or not); {strict:.3f} when episodes that never "
            f"answered score 0 ({EVIDENCE_F1_STRICT})"
        )
    if metrics.sampling is not None:
        sampled = metrics.sampling
        table = Table("k", "pass@k (exact match)", title=f"{sampled.samples} samples of {sampled.questions} questions")
        for k, value in sampled.pass_at_k.items():
            table.add_row(k, f"{value:.3f}")
        console.print(table)
        console.print(
            f"answer F1: mean over samples {sampled.mean_answer_f1:.3f}, majority vote {sampled.majority_answer_f1:.3f}; "
            f"agreement with the majority {sampled.agreement:.1%}"
        )
    rates = {name: rate for name, rate in metrics.detector_rates.items() if rate}
    if rates:
        detectors = Table("detector", "episodes flagged", title="behaviour")
        for name, rate in sorted(rates.items(), key=lambda item: -item[1]):
            detectors.add_row(name, f"{rate:.1%}")
        console.print(detectors)
    verdict = metrics.verdict
    style = "bold red" if verdict.verdict == "shortcut collapse" else "green"
    console.print(
        Text.assemble(
            untrusted(verdict.verdict, style=style),
            f": direct-submit rate {verdict.direct_submit_rate:.1%} (threshold {verdict.threshold:.0%})",
        )
    )
    console.print(untrusted("status: " + ", ".join(f"{k} {v}" for k, v in metrics.status.items())))
    for name, value in (
        ("api_retries", metrics.api_retries),
        ("parity_warnings", metrics.parity_warnings),
        ("hit_cap_steps", metrics.hit_cap_steps),
    ):
        if value:
            console.print(f"[yellow]{name}: {value}[/yellow]")
    if metrics.calibration or metrics.probe_mass:
        from paper_explorer.evaluation.calibration import calibration_summary, mass_line

        for name, mass in (metrics.probe_mass or {}).items():
            console.print(untrusted(mass_line(name, mass), "yellow" if mass.below else ""))
        for line in calibration_summary(metrics.calibration):
            console.print(untrusted(line))
    if metrics.replay is not None:
        print_replay_drift(console, metrics.replay)
    prereg = metrics.preregistration
    if prereg:
        style = "bold green" if prereg.passed else "bold red"
        console.print(
            Text.assemble((f"preregistered rule: {'PASS' if prereg.passed else 'FAIL'}", style), " ", untrusted(f"({prereg.file})"))
        )
        for check in prereg.checks:
            console.print(untrusted(f"  {'pass' if check.passed else 'FAIL'}: {check.check} (got {check.value})"))
        for pending in prereg.pending or []:
            console.print(untrusted(f"  pending: {pending}"))
        if prereg.comparison is not None:
            compared = prereg.comparison
            for test in compared.fisher:
                console.print(
                    untrusted(
                        f"  Fisher exact, {test.row} abstentions vs {compared.run}: p = {test.p_value:.4f}"
                        f"{' (significant)' if test.significant else ''}"
                    )
                )
    if out is not None:
        console.print(
            untrusted(f"written: {out / 'manifest.json'}, {out / 'trajectories.jsonl'}, {out / 'scores.jsonl'}, {out / 'metrics.json'}")
        )


def print_benchmarks(console: Console, tables: BenchmarkTables) -> None:
    """The per-benchmark table (``evaluation.benchmarks``), and why LongBench's QA average is missing when it is."""
    # 80 columns hold every figure: the rows go by benchmark, each subset under its benchmark's
    # name, and each row's F1 rule is said below the table
    name, _, *figures, _ = TABLE_HEADER
    table = Table(title="per benchmark")
    table.add_column(name, overflow="fold")
    table.add_column("n", justify="right", no_wrap=True)
    for heading in figures:
        table.add_column(heading, justify="right", no_wrap=True)
    rules: dict[str, list[str]] = {}  # a rule, and the benchmarks it scores
    group = None
    for label, *cells, rule in table_rows(tables):
        benchmark, slash, subset = label.partition("/")
        if slash and benchmark != group:
            table.add_row(untrusted(benchmark + "/", "bold"), *[""] * len(cells))
        group = benchmark if slash else None
        # a benchmark's name comes from the questions file
        table.add_row(untrusted("  " + subset if slash else label), *(untrusted(cell) for cell in cells))
        if slash and benchmark + "/" not in rules.setdefault(rule, []):
            rules[rule].append(benchmark + "/")
    console.print(table)
    console.print(Text(TABLE_CAPTION))
    for rule, names in rules.items():
        console.print(untrusted(f"F1 of {', '.join(names)}: {rule}", "dim"))
    note = missing_note(tables.longbench_qa)
    if note is not None:
        console.print(untrusted(note, "yellow"))


def print_replay_drift(console: Console, drift: ReplayDrift) -> None:
    """One line when the replay reproduced every recorded observation; else how many changed and the first change."""
    if not drift.observations_compared:
        console.print(
            f"[yellow]replay: no recorded observation was compared ({drift.episodes} episodes, {drift.steps} steps replayed)[/yellow]"
        )
        return
    if not drift.observations_changed:
        console.print(
            f"[green]replay: all {drift.observations_compared} recorded observations reproduced "
            f"({drift.episodes} episodes, {drift.steps} steps replayed)[/green]"
        )
        return
    console.print(
        f"[bold yellow]replay drift: {drift.observations_changed} of {drift.observations_compared} recorded observations "
        f"changed, in {drift.episodes_changed} of {drift.episodes} episodes[/bold yellow] ({drift.steps} steps replayed)"
    )
    first = drift.first_change
    if first is not None:
        question = f" (question {first.question_id})" if first.question_id else ""
        console.print(
            untrusted(
                f"  first change: episode {first.episode_id}{question}, observation of step {first.step + 1}, character {first.position}"
            )
        )
        console.print(untrusted(f"    recorded: {first.recorded!r}"))
        console.print(untrusted(f"    current:  {first.current!r}"))
