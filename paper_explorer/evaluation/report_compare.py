"""``explorer report RUN_A RUN_B``: two runs compared on one self-contained HTML page - the
statistics of ``explorer compare`` (its RunComparison, never recomputed here), the questions whose
answer F1 changed and by how much, plots with axes and counts, and each paired question opened on
both episodes side by side under its gold answers; with option probes, both runs' calibration on
the paired questions (``RunComparison.calibration``). Model-written text goes in through
``textContent`` only, as in ``evaluation.report``."""

from __future__ import annotations

import html
from collections import Counter
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from paper_explorer.corpus.collection import Corpus
from paper_explorer.evaluation.answer_metrics import ANSWER_F1, answer_metrics
from paper_explorer.evaluation.benchmarks import PAIRED_HEADER, missing_note, paired_rows
from paper_explorer.evaluation.compare import PairedFigure, RunComparison, confound_note, scored_by_question
from paper_explorer.evaluation.report import html_table, page, page_data, write_html
from paper_explorer.evaluation.report_calibration import calibration_section
from paper_explorer.evaluation.report_data import report_episodes
from paper_explorer.evaluation.report_plots import bar_chart, column_chart
from paper_explorer.evaluation.run_directory import Run
from paper_explorer.evaluation.stats import format_p


class PairedQuestion(BaseModel):
    """One question both runs scored, with the episodes that answered it."""

    model_config = ConfigDict(extra="forbid")

    question_id: str
    question: str
    episode_a: str
    episode_b: str
    f1_a: float
    f1_b: float
    change: float  # B - A; 0 for a question whose F1 did not move
    tokens_a: int | None = None  # model tokens the episode spent (None: no model call)
    tokens_b: int | None = None


def paired_questions(a: Run, b: Run, comparison: RunComparison) -> list[PairedQuestion]:
    """Every paired question: those whose F1 moved first, in compare's order (largest change first), then the rest in A's order."""
    by_a, by_b = scored_by_question(a), scored_by_question(b)
    moved = [d.question_id for d in comparison.largest_differences]
    same = [q for q in by_a if q in by_b and q not in set(moved)]
    return [
        PairedQuestion(
            question_id=q,
            question=by_a[q].question,
            episode_a=by_a[q].episode_id,
            episode_b=by_b[q].episode_id,
            f1_a=by_a[q].value(ANSWER_F1),
            f1_b=by_b[q].value(ANSWER_F1),
            change=by_b[q].value(ANSWER_F1) - by_a[q].value(ANSWER_F1),
            tokens_a=by_a[q].model_tokens,
            tokens_b=by_b[q].model_tokens,
        )
        for q in moved + same
    ]


CHANGE_BINS = [
    ("<= -0.5", lambda d: d <= -0.5),
    ("-0.5 to 0", lambda d: -0.5 < d < 0),
    ("0 (same)", lambda d: d == 0),
    ("0 to 0.5", lambda d: 0 < d < 0.5),
    (">= 0.5", lambda d: d >= 0.5),
]


def comparison_plots(comparison: RunComparison, pairs: list[PairedQuestion]) -> list[str]:
    changes = Counter(next(label for label, holds in CHANGE_BINS if holds(p.change)) for p in pairs)
    figures = []
    paired: list[tuple[str, PairedFigure | None]] = [(m.label, comparison.metric(m.name)) for m in answer_metrics()]
    for name, figure in [*paired, ("direct-submit rate", comparison.direct_submit_rate)]:
        if figure is not None:
            figures += [(f"{name} A", figure.a or 0.0, _number(figure.a)), (f"{name} B", figure.b or 0.0, _number(figure.b))]
    return [
        column_chart(
            "change of answer F1 per question (B - A)",
            "F1 of B minus F1 of A",
            "questions",
            [(label, changes[label]) for label, _ in CHANGE_BINS],
            caption=f"{len(pairs)} paired questions",
        ),
        bar_chart(
            "paired figures",
            "mean over the paired questions",
            figures,
            maximum=1.0,
            tick_format="{:.1f}",
            caption=f"n = {comparison.paired_questions} paired questions",
        ),
    ]


def _number(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else (f"{value:+.3f}" if signed else f"{value:.3f}")


def _tokens(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else (f"{value:+,.0f}" if signed else f"{value:,.0f}")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _percent_change(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{b - a:+.1%}"


def figure_header(comparison: RunComparison) -> list[str]:
    """The paired figures' columns, the interval's named by its confidence (every paired interval has the tokens')."""
    return ["figure", "A", "B", "B - A", f"{comparison.model_tokens.paired_difference_ci95.confidence:.0%} CI of B - A"]


def figure_rows(comparison: RunComparison) -> list[list[str]]:
    """compare's paired figures, one row each (``figure_header``), as the terminal and the page show
    them: every compared answer metric, in the registry's order, then tokens and the direct-submit rate."""
    rows = []
    for metric in answer_metrics():
        paired = comparison.metric(metric.name)
        if paired is None:
            continue
        ci = paired.paired_difference_ci95
        interval = (
            f"{ci.low:+.3f} to {ci.high:+.3f} (paired bootstrap)" if ci is not None and ci.low is not None and ci.high is not None else "-"
        )
        rows.append([metric.heading, _number(paired.a), _number(paired.b), _number(paired.difference, signed=True), interval])
    tokens, spent, rate = comparison.model_tokens, comparison.model_tokens.paired_difference_ci95, comparison.direct_submit_rate
    rows.append(
        [
            f"model tokens per episode ({tokens.pairs} pairs)",
            _tokens(tokens.a),
            _tokens(tokens.b),
            _tokens(spent.mean, signed=True),
            f"{spent.low:+,.0f} to {spent.high:+,.0f} (paired bootstrap)" if spent.low is not None and spent.high is not None else "-",
        ]
    )
    rows.append(["direct-submit rate", _percent(rate.a), _percent(rate.b), _percent_change(rate.a, rate.b), "-"])
    return rows


def statistics_tables(comparison: RunComparison) -> tuple[str, str]:
    """compare's figures, then its tests and tables, as ``explorer compare`` prints them, in HTML."""
    figures = html_table("figures", figure_header(comparison), figure_rows(comparison))
    abstention = html_table(
        "paired-abstention",
        ["gold \\ decision", "A answered", "A abstained", "A neither", "B answered", "B abstained", "B neither"],
        [
            [row, *(str(count) for counts in (ca, cb) for count in (counts.answered, counts.abstained, counts.undecided()))]
            for (row, ca), (_, cb) in zip(comparison.abstention.a.rows(), comparison.abstention.b.rows())
        ],
    )
    mcnemar = html_table(
        "mcnemar",
        ["outcome (yes/no per question)", "pairs", "yes in both", "yes in A only", "yes in B only", "no in both", "two-sided p"],
        [
            [t.outcome, str(t.pairs), str(t.both), str(t.only_a), str(t.only_b), str(t.neither), format_p(t.p_value)]
            for t in [*comparison.mcnemar_answers, *comparison.mcnemar_abstention]
        ],
    )
    fisher = html_table(
        "fisher",
        ["gold", "A abstained", "A answered", "B abstained", "B answered", "odds ratio", "two-sided p"],
        [
            [
                t.row,
                str(t.table[0][0]),
                str(t.table[0][1]),
                str(t.table[1][0]),
                str(t.table[1][1]),
                "n/a" if t.odds_ratio is None else f"{t.odds_ratio:.3g}",
                format_p(t.p_value),
            ]
            for t in comparison.fisher_abstention
        ],
    )
    u = comparison.unpaired
    unpaired = html_table(
        "unpaired",
        ["not paired (NOT comparable between runs)", "A", "B"],
        [
            ["questions scored in this run only", str(u.only_in_a), str(u.only_in_b)],
            ["answer F1 on them (different questions)", _number(u.answer_f1_a), _number(u.answer_f1_b)],
            ["episodes without gold answers (unscored)", str(u.unscored_a), str(u.unscored_b)],
        ],
    )
    tests = (
        f'<h2>Exact McNemar on the paired questions</h2><p class="muted">The primary tests: only the questions '
        f"where one run said yes and the other no count.</p>{mcnemar}"
        f'<h2>Abstention on the paired questions</h2><p class="muted">Neither: a limit, a policy error or no_answer '
        f"(scored 0, left out of the abstention tests).</p>{abstention}"
        f'<h2>Fisher exact on the abstention tables</h2><p class="muted">The unpaired design, as preregistered; '
        f"secondary here: it ignores the pairing.</p>{fisher}"
        f"<h2>Questions only one run scored</h2>{unpaired}"
    )
    return figures, tests


def paired_benchmarks_section(comparison: RunComparison) -> str:
    """compare's per-benchmark figures (``evaluation.benchmarks``); nothing when no paired question carries a benchmark."""
    paired = comparison.benchmarks
    if paired is None:
        return ""
    note = missing_note(paired.longbench_qa.a if paired.longbench_qa is not None else None)
    missing = "" if note is None else f'<p class="muted">{html.escape(note)}.</p>'
    return (
        f'<h2>Per benchmark on the paired questions</h2><p class="muted">x100; F1 by each benchmark\'s rule; every '
        f"episode counts, a failed one or one without an answer at 0.</p>{html_table('paired-benchmarks', PAIRED_HEADER, paired_rows(paired))}{missing}"
    )


def comparison_html(a: Run, b: Run, comparison: RunComparison, corpus: Corpus) -> str:
    pairs = paired_questions(a, b, comparison)
    wanted = {p.episode_a for p in pairs}, {p.episode_b for p in pairs}
    episodes = [
        {e.episode_id: e.model_dump(mode="json") for e in report_episodes(run, corpus) if e.episode_id in ids}
        for run, ids in zip((a, b), wanted)
    ]
    better, worse = sum(1 for p in pairs if p.change > 0), sum(1 for p in pairs if p.change < 0)
    summary = (
        f"{len(pairs)} paired questions: answer F1 higher in B on {better}, lower on {worse}, the same on {len(pairs) - better - worse}"
    )
    figures, statistics = statistics_tables(comparison)
    figures += paired_benchmarks_section(comparison)
    names = [f"{run.directory.name} ({run.manifest.config.policy.name})" for run in (a, b)]
    title = html.escape(f"{names[0]} vs {names[1]}")
    settings = [setting.describe() for setting in (comparison.setting_a, comparison.setting_b)]
    note = confound_note(comparison)
    differs = "" if note is None else note[0].upper() + note[1:] + "."
    header = HEADER.format(
        title=title,
        run_a=html.escape(f"{comparison.run_a} ({settings[0]})"),
        run_b=html.escape(f"{comparison.run_b} ({settings[1]})"),
        summary=html.escape(summary),
        differs=html.escape(differs),
    )
    paired = comparison.calibration
    main = MAIN.format(
        n=comparison.paired_questions,
        figures=figures,
        statistics=statistics,
        plots="".join(comparison_plots(comparison, pairs)),
        calibration=""
        if paired is None
        else calibration_section([("A", paired.a, paired.mass_a), ("B", paired.b, paired.mass_b)])
        + "".join(f'<p class="muted">Note: {html.escape(note)}.</p>' for note in paired.notes),
    )
    data = page_data({"pairs": [p.model_dump(mode="json") for p in pairs], "a": episodes[0], "b": episodes[1], "names": names})
    return page(title, header, main, data, SCRIPT)


def write_comparison_report(a: Run, b: Run, comparison: RunComparison, corpus: Corpus, out: Path) -> Path:
    """The two-run page; ``comparison`` is ``compare_runs(a, b, top=...)`` with every moved question."""
    return write_html(comparison_html(a, b, comparison, corpus), out)


HEADER = """<h1>{title}</h1>
<div class="muted">A: {run_a}<br>B: {run_b}</div>
<div id="summary"><strong>{summary}</strong></div>
<div id="setting-differs" class="verdict bad">{differs}</div>"""

MAIN = """<section>
<h2>Paired figures (n = {n})</h2>{figures}
<h2>Questions</h2>
<label><input type="checkbox" id="changed-only" checked> only questions whose answer F1 changed</label>
<span id="count" class="muted"></span>
<table id="questions" class="list"><thead><tr><th>question</th><th>A</th><th>B</th><th>F1 A</th><th>F1 B</th><th>tokens A</th><th>tokens B</th><th>B - A</th></tr></thead><tbody></tbody></table>
<h2>Plots</h2><div id="plots">{plots}</div>
{calibration}{statistics}
</section>
<section id="detail"><h2>Question</h2><p class="muted">Choose a question on the left.</p></section>"""

SCRIPT = """const changedOnly = document.getElementById("changed-only");
function said(episode) { return episode.status === "submitted" ? episode.answer ?? "" : episode.status; }
function tokens(count) { return count === null ? "-" : count.toLocaleString("en-US"); }
function signed(value) { return (value > 0 ? "+" : "") + value.toFixed(2); }
function showQuestion(id) {
  const pair = DATA.pairs.find(p => p.question_id === id);
  const detail = detailPane("Question " + id);
  if (!pair) { detail.appendChild(el("p", "No such paired question.", "muted")); return; }
  const a = DATA.a[pair.episode_a], b = DATA.b[pair.episode_b];
  detail.appendChild(el("p", pair.question, "question-text"));
  detail.appendChild(el("p", "answer F1 " + pair.f1_a.toFixed(2) + " in A, " + pair.f1_b.toFixed(2) + " in B (" + signed(pair.change) + ")", "muted"));
  detail.appendChild(goldBox(a));
  detail.appendChild(side(predictionBox(a, "A: " + DATA.names[0]), predictionBox(b, "B: " + DATA.names[1])));
  detail.appendChild(side(stepsBox(a), stepsBox(b)));
}
const renderList = listPage({
  table: "#questions", name: "question", total: DATA.pairs.length, id: p => p.question_id, show: showQuestion,
  items: () => DATA.pairs.filter(p => !changedOnly.checked || p.change !== 0),
  cells: p => [textCell(p.question), textCell(said(DATA.a[p.episode_a])), textCell(said(DATA.b[p.episode_b])),
               el("td", p.f1_a.toFixed(2)), el("td", p.f1_b.toFixed(2)), el("td", tokens(p.tokens_a)), el("td", tokens(p.tokens_b)),
               el("td", signed(p.change), p.change > 0 ? "up" : p.change < 0 ? "down" : "")],
});
changedOnly.addEventListener("change", renderList);
"""
