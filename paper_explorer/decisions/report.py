"""``explorer report DECIDE_RUN``: one self-contained HTML page of a decide run.

The calibration table per kind (top-label accuracy, ECE equal-width and equal-mass, multi-class
Brier and NLL, each with its 95% bootstrap interval, the mean confidence statistic and p_max), a
reliability diagram per kind over equal-width bins and one over equal-mass bins, the checks'
figures where recorded, and every question in a list that opens its options with their
probabilities. The page is ``evaluation.report``'s (its style, list script and page frame), so it
reads like an eval run's report and keeps its rules: no network, the page's data in one JSON block
with every "<" escaped, and text from the decision file (questions, options, ids, reasons) put in
the page with ``textContent`` or ``html.escape`` only, never as markup.
"""

from __future__ import annotations

import html
from pathlib import Path

from paper_explorer.decisions.errors import DecisionError
from paper_explorer.decisions.inspect_view import check_lines, with_interval
from paper_explorer.decisions.records import KindFigures
from paper_explorer.decisions.run_reading import DecisionRun
from paper_explorer.evaluation.report import html_table, page, page_data, write_html
from paper_explorer.evaluation.report_plots import reliability_diagram

CALIBRATION_HEADER = [
    "kind",
    "questions",
    "measured",
    "labelled",
    "accuracy",
    "ECE equal-width",
    "ECE equal-mass",
    "Brier",
    "NLL",
    "mean confidence",
    "mean p_max",
]


def calibration_rows(kinds: dict[str, KindFigures]) -> list[list[str]]:
    def plain(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    return [
        [
            f.kind,
            str(f.questions),
            str(f.measured),
            str(f.labelled),
            plain(f.accuracy),
            with_interval(f.ece_equal_width, f.ece_equal_width_ci95),
            with_interval(f.ece_equal_mass, f.ece_equal_mass_ci95),
            with_interval(f.brier, f.brier_ci95),
            with_interval(f.nll, f.nll_ci95),
            plain(f.mean_confidence),
            plain(f.mean_p_max),
        ]
        for f in kinds.values()
    ]


def reliability_section(kinds: dict[str, KindFigures]) -> str:
    """Two diagrams per kind with labelled questions, in divs ``#reliability-KIND-width|mass``."""
    parts = []
    for f in kinds.values():
        if not f.labelled:
            continue
        for binning, bins, figure in (
            ("width", f.reliability_equal_width, f.ece_equal_width),
            ("mass", f.reliability_equal_mass, f.ece_equal_mass),
        ):
            title = f"{f.kind}: reliability, equal-{binning} bins"
            caption = f"{f.labelled} labelled questions; top-label ECE {figure:.3f} over {f.bins} equal-{binning} bins"
            diagram = reliability_diagram(title, bins, caption, unit="questions")
            parts.append(f'<div class="reliability" id="reliability-{f.kind}-{binning}">{diagram}</div>')
    return "".join(parts)


def report_html(run: DecisionRun) -> str:
    metrics, manifest = run.metrics, run.manifest
    model = str(manifest.model.get("model", ""))
    title = html.escape(f"{run.directory.name} - decide - {model}")
    header = HEADER.format(
        title=title,
        file=html.escape(manifest.file),
        sha=html.escape(manifest.file_sha256[:16]),
        settings=html.escape(f"{manifest.backend} {model}; order {manifest.order}, mode {manifest.mode}, cut {manifest.cut}"),
        commit=html.escape(str(manifest.git_commit)),
    )
    counts = f"{metrics.measured} of {metrics.questions} questions measured, {metrics.not_measured} not measured, {metrics.cut} cut to fit"
    checks = "".join(f"<li>{html.escape(line)}</li>" for line in check_lines(metrics.checks)) if metrics.checks else ""
    main = MAIN.format(
        counts=html.escape(counts),
        calibration=html_table("calibration-table", CALIBRATION_HEADER, calibration_rows(metrics.kinds)),
        checks=f'<h2>Checks</h2><ul id="checks">{checks}</ul>' if checks else "",
        reliability=reliability_section(metrics.kinds),
    )
    questions = [
        record.model_dump(
            mode="json",
            include={
                "question_id",
                "document_id",
                "kind",
                "question",
                "options",
                "probabilities",
                "loglikelihoods",
                "predicted",
                "p_max",
                "confidence",
                "label",
                "correct",
                "not_measured",
                "cut",
            },
        )
        for record in run.records
    ]
    return page(title, header, main, page_data({"questions": questions}), SCRIPT)


def write_decision_report(run: DecisionRun, out: Path, force: bool = False) -> Path:
    """The decide run's report at the .html file ``out`` (an existing one only with ``force``)."""
    if out.is_dir():
        raise DecisionError(f"{out}: is a directory; --out names the .html file to write")
    if out.exists() and not force:
        raise DecisionError(f"{out}: already exists; pass --force to overwrite it, or name another file")
    return write_html(report_html(run), out)


HEADER = """<h1>{title}</h1>
<div class="muted">decision file {file} (sha256 {sha}&hellip;) &middot; {settings} &middot; commit {commit}</div>"""

# The calibration table is wider than an eval report's tables: the list side gets more room, and
# scrolls rather than run under the question pane.
MAIN = """<style>main {{ grid-template-columns: minmax(560px, 1.4fr) 1fr; }} .wide {{ overflow-x: auto; }}</style>
<section>
<h2>Calibration per kind</h2>
<p class="muted" id="counts">{counts}</p>
<p class="muted">Top-label: the likeliest option's probability against whether it is the label, over the measured questions
with a label. Brier is the multi-class score (0 to 2), NLL the label's -log probability (clipped at 1e-12); 95% seeded
bootstrap intervals in brackets. Mean confidence is (K p_max - 1) / (K - 1) over the measured questions.</p>
<div class="wide">{calibration}</div>{checks}<h2>Reliability</h2><div id="plots">{reliability}</div>
<h2>Questions</h2>
<label>kind <select id="kind-filter"><option value="">every kind</option></select></label>
<span id="count" class="muted"></span>
<table id="questions" class="list"><thead><tr><th>question</th><th>kind</th><th>text</th><th>predicted</th><th>p_max</th><th>label</th></tr></thead><tbody></tbody></table>
</section>
<section id="detail"><h2>Question</h2><p class="muted">Choose a question on the left.</p></section>"""

SCRIPT = """const select = document.getElementById("kind-filter");
for (const kind of [...new Set(DATA.questions.map(q => q.kind))]) { const option = el("option", kind); option.value = kind; select.appendChild(option); }
function pMax(q) { return q.p_max === null ? "-" : q.p_max.toFixed(3); }
function showQuestion(id) {
  const q = DATA.questions.find(item => item.question_id === id);
  const detail = detailPane("Question " + id);
  if (!q) { detail.appendChild(el("p", "No such question.", "muted")); return; }
  detail.appendChild(el("p", q.question, "question-text"));
  detail.appendChild(el("div", "kind " + q.kind + " | document " + q.document_id + " | label " + (q.label ?? "none"), "muted"));
  if (q.cut) detail.appendChild(el("div", "document cut at its " + q.cut.side + ": " + q.cut.tokens + " tokens dropped", "flag"));
  if (q.probabilities === null) { detail.appendChild(el("p", "not measured: " + q.not_measured, "flag")); return; }
  detail.appendChild(el("div", "p_max " + q.p_max.toFixed(4) + " | confidence " + q.confidence.toFixed(4) + (q.correct === null ? "" : q.correct ? " | right" : " | wrong"), "muted"));
  const table = el("table"); table.className = "options";
  const head = el("tr"); for (const name of ["#", "option", "probability", "log-likelihood", ""]) head.appendChild(el("th", name)); table.appendChild(head);
  q.options.forEach((option, i) => {
    const row = el("tr");
    const marks = [option === q.predicted ? "predicted" : "", option === q.label ? "label" : ""].filter(Boolean).join(" ");
    for (const text of [i + 1, option, q.probabilities[i].toFixed(4), q.loglikelihoods[i].toFixed(3), marks]) row.appendChild(el("td", text));
    table.appendChild(row);
  });
  detail.appendChild(table);
}
const renderList = listPage({
  table: "#questions", name: "question", total: DATA.questions.length, id: q => q.question_id, show: showQuestion,
  items: () => DATA.questions.filter(q => !select.value || q.kind === select.value),
  cells: q => [el("td", q.question_id), el("td", q.kind), textCell(q.question), el("td", q.predicted ?? "-"), el("td", pMax(q)), el("td", q.label ?? "-")],
});
select.addEventListener("change", renderList);
"""

__all__ = ["report_html", "write_decision_report"]
