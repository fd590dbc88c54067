"""``explorer report RUN``: one self-contained HTML file per run - metrics, the abstention table,
plots with axes and counts, and every episode browsable: its question, status and F1 in the list;
the gold answers and evidence beside the prediction and the paragraphs it cited, then its steps
and flags. No network: styles, script, data and the SVG plots are all inline. Model-written text
is inserted with ``textContent`` only, so an action, answer or observation can never become markup
or script. A run with option probes gets a calibration section: the ECE table (``calibration_section``)
and a reliability diagram per probe. ``evaluation.report_compare`` builds the two-run page from the same pieces.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from pathlib import Path
from typing import Any

from paper_explorer.corpus.collection import Corpus
from paper_explorer.evaluation.answer_metrics import ANSWER_F1, answer_metrics
from paper_explorer.evaluation.benchmarks import TABLE_CAPTION, TABLE_HEADER, missing_note, table_rows
from paper_explorer.evaluation.detectors import DETECTORS
from paper_explorer.evaluation.records import (
    BenchmarkTables,
    ReplayDrift,
    RunMetrics,
    figure_label,
    figure_text,
)
from paper_explorer.evaluation.report_calibration import calibration_section
from paper_explorer.evaluation.report_data import ReportEpisode, report_episodes
from paper_explorer.evaluation.report_plots import bar_chart, count_histogram, f1_histogram
from paper_explorer.evaluation.run_directory import Run


def page_data(payload: dict[str, Any]) -> str:
    """JSON for a <script type="application/json"> block: every "<" escaped, so no "</script>" or
    "<!--" inside model-written text can change how the page parses. The answer metrics' names,
    labels and decimals go with it, for the episode script (``EPISODE_JS``) to show each."""
    metrics = [{"name": m.name, "label": m.heading, "digits": m.digits} for m in answer_metrics()]
    return json.dumps({**payload, "metrics": metrics}).replace("<", "\\u003c")


def run_plots(run: Run) -> list[str]:
    metrics, scores = run.metrics, run.scores
    flagged = Counter(name for score in scores for name in {flag.detector for flag in score.flags})
    typed = Counter(score.type for score in scores if score.scored)
    return [
        count_histogram("steps per episode", "steps", [s.steps for s in scores]),
        count_histogram("searches, reads and extracts before submit or abstain", "calls", [s.tool_calls_before_end for s in scores]),
        f1_histogram("answer F1 per episode", [s.value(ANSWER_F1) for s in scores if s.scored]),
        bar_chart(
            "detector flags",
            "share of episodes flagged",
            [(name, rate, f"{flagged[name]} ({rate:.0%})") for name, rate in metrics.detector_rates.items()],
            maximum=1.0,
            tick_format="{:.0%}",
            caption=f"of {len(scores)} episodes",
        ),
        bar_chart(
            "answer F1 by question type",
            "mean answer F1",
            [(kind, value, f"{value:.2f} (n={typed[kind]})") for kind, value in metrics.answer_f1_by_type.items()],
            maximum=1.0,
            tick_format="{:.1f}",
            caption="n: scored episodes of the type",
        ),
    ]


def metrics_rows(metrics: RunMetrics) -> str:
    """The headline figures, each under its metrics.json key and what it means (``records.figure_label``)."""
    return "".join(
        f"<tr><th>{html.escape(figure_label(name))}</th><td>{figure_text(name, value)}</td></tr>" for name, value in metrics.headline()
    )


def html_table(table_id: str, header: list[str], rows: list[list[str]]) -> str:
    """A table of text cells, every cell escaped."""
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table id="{table_id}"><tr>{head}</tr>{body}</table>'


def benchmarks_section(tables: BenchmarkTables | None) -> str:
    """The per-benchmark table (``evaluation.benchmarks``); nothing for a run whose questions carry no benchmark."""
    if tables is None:
        return ""
    note = missing_note(tables.longbench_qa)
    missing = "" if note is None else f'<p class="muted">{html.escape(note)}.</p>'
    return (
        f'<h2>Per benchmark</h2><p class="muted">{html.escape(TABLE_CAPTION)}</p>'
        f"{html_table('benchmarks', TABLE_HEADER, table_rows(tables))}{missing}"
    )


def report_html(run: Run, episodes: list[ReportEpisode]) -> str:
    metrics = run.metrics
    abstention = "".join(
        f"<tr><th>{row}</th><td>{counts.answered}</td><td>{counts.abstained}</td>"
        f"<td>{counts.step_limit}</td><td>{counts.context_limit}</td><td>{counts.policy_error}</td><td>{counts.no_answer}</td></tr>"
        for row, counts in metrics.abstention.rows()
    )
    verdict = metrics.verdict
    policy = run.manifest.config.policy.name
    data = page_data({"episodes": [e.model_dump(mode="json") for e in episodes], "detectors": list(DETECTORS)})
    title = html.escape(f"{run.directory.name} - {policy}")
    header = HEADER.format(
        title=title,
        policy=html.escape(policy),
        verdict_class="bad" if verdict.verdict == "shortcut collapse" else "good",
        verdict=html.escape(f"{verdict.verdict}: direct-submit rate {verdict.direct_submit_rate:.1%} (threshold {verdict.threshold:.0%})"),
        corpus=html.escape(run.manifest.hashes.corpus_sha256[:16]),
        commit=html.escape(str(run.manifest.git_commit)),
    )
    main = MAIN.format(
        rows=metrics_rows(metrics),
        benchmarks=benchmarks_section(metrics.benchmarks),
        abstention=abstention,
        replay=replay_section(metrics.replay),
        calibration=calibration_section([("", metrics.calibration, metrics.probe_mass)]),
        plots="".join(run_plots(run)),
    )
    return page(title, header, main, data, SCRIPT)


def page(title: str, header: str, main: str, data: str, script: str) -> str:
    """A whole report page: the shared style and episode script, the page's data as JSON, its own script."""
    return PAGE.format(title=title, style=STYLE, header=header, main=main, data=data, episode_js=EPISODE_JS, script=script)


def replay_section(drift: ReplayDrift | None) -> str:
    """The run's replay drift as a table (nothing for a run of another policy)."""
    if drift is None:
        return ""
    rows = [
        ("episodes replayed", drift.episodes),
        ("steps replayed", drift.steps),
        ("observations compared", drift.observations_compared),
        ("observations changed", drift.observations_changed),
        ("episodes with a change", drift.episodes_changed),
    ]
    cells = "".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in rows)
    first = drift.first_change
    if first is not None:
        where = f"episode {first.episode_id}, observation of step {first.step + 1}, character {first.position}"
        cells += (
            f"<tr><th>first change</th><td>{html.escape(where)}</td></tr>"
            f"<tr><th>recorded</th><td><pre>{html.escape(first.recorded)}</pre></td></tr>"
            f"<tr><th>current</th><td><pre>{html.escape(first.current)}</pre></td></tr>"
        )
    return f'<h2>Replay drift</h2><table id="replay">{cells}</table>'


def write_html(text: str, out: Path) -> Path:
    from paper_explorer.corpus.files import atomic_file

    with atomic_file(out) as handle:
        handle.write(text)
    return out


def write_report(run: Run, corpus: Corpus, out: Path) -> Path:
    """The run's report, its gold answers and cited paragraphs read from ``corpus`` (checked by the caller)."""
    return write_html(report_html(run, report_episodes(run, corpus)), out)


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{style}</style></head>
<body>
<header>{header}</header>
<main>
{main}
</main>
<script type="application/json" id="data">{data}</script>
<script>
"use strict";
{episode_js}
const DATA = JSON.parse(document.getElementById("data").textContent);
{script}</script></body></html>
"""

# Plain strings (not format templates): the pages insert them whole.
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #1d2430; }
header { padding: 12px 20px; background: #f3f5f8; border-bottom: 1px solid #d8dde5; }
h1 { font-size: 18px; margin: 0 0 4px; } h2 { font-size: 15px; margin: 18px 0 6px; } h3 { font-size: 14px; margin: 4px 0; }
main { display: grid; grid-template-columns: minmax(460px, 1fr) 1.4fr; gap: 20px; padding: 0 20px 20px; }
table { border-collapse: collapse; } th, td { padding: 3px 8px; border-bottom: 1px solid #e4e7ec; text-align: left; vertical-align: top; }
.verdict.bad { color: #b3261e; font-weight: 600; } .verdict.good { color: #1e7d32; font-weight: 600; }
figure { margin: 8px 0 14px; } figcaption { color: #5d6675; font-size: 12px; }
svg text { font-size: 11px; fill: #1d2430; } svg .title { font-size: 13px; font-weight: 600; } svg .axis-label { font-size: 12px; }
svg .bar { fill: #4a78c2; } svg .axis { stroke: #1d2430; stroke-width: 1; } svg .grid { stroke: #e1e5eb; stroke-width: 1; }
.list tbody tr { cursor: pointer; } .list tbody tr:hover, .list tbody tr.open { background: #eef3fb; }
.list td.question { max-width: 320px; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.flag { display: inline-block; background: #fde7e4; color: #8c1d18; border-radius: 3px; padding: 0 4px; margin: 1px; font-size: 12px; }
pre { white-space: pre-wrap; word-break: break-word; background: #f7f8fa; padding: 6px; margin: 4px 0; max-height: 320px; overflow: auto; }
blockquote { margin: 4px 0; padding: 4px 8px; border-left: 3px solid #c9d3e3; background: #f7f8fa; white-space: pre-wrap; word-break: break-word; }
.step { border: 1px solid #d8dde5; border-radius: 4px; padding: 6px 10px; margin: 8px 0; }
.side { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; }
.gold, .prediction { border: 1px solid #d8dde5; border-radius: 4px; padding: 6px 10px; }
.gold { background: #f4faf4; } .prediction { background: #f6f8fd; } .answer { margin: 6px 0; }
.answer-text { font-weight: 600; white-space: pre-wrap; word-break: break-word; }
.up { color: #1e7d32; } .down { color: #b3261e; }
.muted { color: #5d6675; } #detail { position: sticky; top: 0; max-height: 100vh; overflow: auto; }
"""

EPISODE_JS = """
function el(tag, text, cls) { const node = document.createElement(tag); if (text !== undefined && text !== null) node.textContent = String(text); if (cls) node.className = cls; return node; }
function f1Text(episode) { return episode.answer_f1 === undefined ? "-" : episode.answer_f1.toFixed(2); }
function tokensText(episode) { return episode.model_tokens === undefined ? "-" : episode.model_tokens.toLocaleString("en-US"); }
function goldBox(episode) {
  const box = el("div", null, "gold"); box.appendChild(el("h3", "Gold answers"));
  if (episode.gold === undefined) { box.appendChild(el("p", "none: a question given as free text, without gold", "muted")); return box; }
  if (!episode.gold.length) box.appendChild(el("p", "the question has no annotated answer", "muted"));
  episode.gold.forEach((answer, i) => {
    const item = el("div", null, "answer");
    item.appendChild(el("div", "annotator " + (i + 1) + " (" + answer.kind + ")", "muted"));
    item.appendChild(el("div", answer.text ?? "(empty annotation)", "answer-text"));
    if (!answer.evidence.length) item.appendChild(el("div", "no evidence marked", "muted"));
    for (const text of answer.evidence) item.appendChild(el("blockquote", text));
    box.appendChild(item);
  });
  return box;
}
function predictionBox(episode, heading) {
  const box = el("div", null, "prediction"); box.appendChild(el("h3", heading));
  const said = episode.status === "submitted" ? episode.answer ?? "" : episode.status === "abstained" ? "abstained" : "no answer";
  box.appendChild(el("div", said, "answer-text"));
  // DATA.metrics: the answer metrics as evaluation.answer_metrics declares them (a line scored before one existed lacks it)
  const scores = episode.answer_f1 === undefined ? "not scored" :
    DATA.metrics.filter(m => episode[m.name] !== undefined).map(m => m.label + " " + episode[m.name].toFixed(m.digits)).join(" | ");
  const tokens = episode.model_tokens === undefined ? "" : " | model tokens " + tokensText(episode) +
    (episode.document_tokens === undefined ? "" : " (document " + episode.document_tokens.toLocaleString("en-US") + ", unread " + episode.unread_tokens.toLocaleString("en-US") + ")");
  box.appendChild(el("div", "status: " + episode.status + " | " + scores + tokens + (episode.reason ? " | " + episode.reason : ""), "muted"));
  box.appendChild(el("div", episode.cited.length ? "cited paragraphs:" : "no paragraph cited", "muted"));
  for (const item of episode.cited) {
    box.appendChild(el("div", item.paper_id + " / " + item.section_name + " (section " + item.section + ", paragraph " + item.paragraph + ")", "muted"));
    box.appendChild(el("blockquote", item.text));
  }
  return box;
}
function stepsBox(episode) {
  const box = el("div");
  for (const flag of episode.flags) box.appendChild(el("div", flag.detector + (flag.step === null ? "" : " (step " + (flag.step + 1) + ")") + ": " + flag.text, "flag"));
  for (const step of episode.steps_detail) {
    const item = el("div", null, "step"); item.dataset.step = step.index;
    item.appendChild(el("strong", "step " + (step.index + 1) + (step.format_error ? " - format error" : "") + (step.limit ? " - limit: " + step.limit : "")));
    item.appendChild(el("pre", step.code ?? step.action));
    if (step.tools.length) item.appendChild(el("div", "tools: " + step.tools.join("; "), "muted"));
    item.appendChild(el("pre", step.observation));
    if (step.changed !== null) item.appendChild(el("div", step.changed, "flag"));
    box.appendChild(item);
  }
  return box;
}
function side(...boxes) { const grid = el("div", null, "side"); for (const box of boxes) grid.appendChild(box); return grid; }
function textCell(text) { const cell = el("td", text, "question"); cell.title = text; return cell; }
function detailPane(title) { const detail = document.getElementById("detail"); detail.replaceChildren(el("h2", title)); return detail; }
// A clickable list whose rows open their item in #detail through the location hash (#NAME=ID), so a
// row can be linked to. config: table (selector), name, total, items() (the rows shown), id(item),
// cells(item) (the row's td nodes), show(id). Returns the function that redraws the list.
function listPage(config) {
  function render() {
    const body = document.querySelector(config.table + " tbody");
    body.replaceChildren();
    const shown = config.items();
    for (const item of shown) {
      const row = el("tr"); row.dataset[config.name] = config.id(item);
      for (const cell of config.cells(item)) row.appendChild(cell);
      row.addEventListener("click", () => { location.hash = config.name + "=" + encodeURIComponent(config.id(item)); });
      body.appendChild(row);
    }
    document.getElementById("count").textContent = shown.length + " of " + config.total;
  }
  function route() {
    const match = location.hash.match(new RegExp("^#" + config.name + "=(.*)$"));
    if (!match) return;
    const id = decodeURIComponent(match[1]);
    for (const row of document.querySelectorAll(config.table + " tbody tr")) row.classList.toggle("open", row.dataset[config.name] === id);
    config.show(id);
  }
  window.addEventListener("hashchange", route);
  render(); route();
  return render;
}
"""

# The page's own parts: HEADER and MAIN are format strings, SCRIPT is inserted whole.
HEADER = """<h1>{title}</h1>
<div class="verdict {verdict_class}" id="verdict">{verdict}</div>
<div class="muted">policy {policy} &middot; corpus {corpus}&hellip; &middot; commit {commit}</div>"""

MAIN = """<section>
<h2>Metrics</h2><table id="metrics">{rows}</table>
{benchmarks}<h2>How episodes ended</h2><table id="abstention"><tr><th>gold \\ ended</th><th>answered</th><th>abstained</th><th>step limit</th><th>context limit</th><th>policy error</th><th>no answer</th></tr>{abstention}</table>
{replay}{calibration}<h2>Plots</h2><div id="plots">{plots}</div>
<h2>Episodes</h2>
<label>flag <select id="flag-filter"><option value="">all episodes</option></select></label>
<span id="count" class="muted"></span>
<table id="episodes" class="list"><thead><tr><th>episode</th><th>question</th><th>status</th><th>F1</th><th>model tokens</th><th>steps</th><th>flags</th></tr></thead><tbody></tbody></table>
</section>
<section id="detail"><h2>Episode</h2><p class="muted">Choose an episode on the left.</p></section>"""

SCRIPT = """const select = document.getElementById("flag-filter");
for (const name of DATA.detectors) {
  const count = DATA.episodes.filter(e => e.flags.some(f => f.detector === name)).length;
  if (count) { const option = el("option", name + " (" + count + ")"); option.value = name; select.appendChild(option); }
}
function flagNames(episode) { return [...new Set(episode.flags.map(f => f.detector))]; }
function flagsCell(episode) { const cell = el("td"); for (const name of flagNames(episode)) cell.appendChild(el("span", name, "flag")); return cell; }
function showEpisode(id) {
  const episode = DATA.episodes.find(e => e.episode_id === id);
  const detail = detailPane("Episode " + id);
  if (!episode) { detail.appendChild(el("p", "No such episode.", "muted")); return; }
  detail.appendChild(el("p", episode.question, "question-text"));
  detail.appendChild(side(goldBox(episode), predictionBox(episode, "Prediction")));
  detail.appendChild(stepsBox(episode));
}
const renderList = listPage({
  table: "#episodes", name: "episode", total: DATA.episodes.length, id: e => e.episode_id, show: showEpisode,
  items: () => DATA.episodes.filter(e => !select.value || e.flags.some(f => f.detector === select.value)),
  cells: e => [el("td", e.episode_id), textCell(e.question), el("td", e.status), el("td", f1Text(e)), el("td", tokensText(e)), el("td", e.steps), flagsCell(e)],
});
select.addEventListener("change", renderList);
"""
