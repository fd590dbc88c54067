"""``explorer report``: one self-contained HTML file per run - metrics, the abstention table,
plots, and every episode browsable with its steps and flags. No network: styles, script, data
and the SVG plots are all inline. Model-written text is inserted with ``textContent`` only, so
an action or observation can never become markup or script.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from pathlib import Path

from agent.trajectory import Drift
from agent.writer import read_trajectories
from evaluation.detectors import DETECTORS
from evaluation.records import ReplayDrift
from evaluation.scoring import compared_observations
from evaluation.summary import Run

CHART_WIDTH, BAR_HEIGHT = 420, 18


def bar_chart(title: str, bars: list[tuple[str, float]], value_format: str = "{:.0f}", maximum: float | None = None) -> str:
    """A horizontal bar chart as inline SVG."""
    top = maximum if maximum is not None else max((value for _, value in bars), default=0) or 1
    label_width, bar_space = 170, CHART_WIDTH - 170 - 60
    rows = []
    for i, (label, value) in enumerate(bars):
        y = 24 + i * (BAR_HEIGHT + 6)
        width = 0 if top == 0 else bar_space * value / top
        rows.append(
            f'<text x="{label_width - 6}" y="{y + 13}" text-anchor="end">{html.escape(label)}</text>'
            f'<rect x="{label_width}" y="{y}" width="{width:.1f}" height="{BAR_HEIGHT}" class="bar"/>'
            f'<text x="{label_width + width + 4:.1f}" y="{y + 13}">{html.escape(value_format.format(value))}</text>'
        )
    height = 30 + len(bars) * (BAR_HEIGHT + 6)
    return (f'<figure><svg width="{CHART_WIDTH}" height="{height}" role="img" aria-label="{html.escape(title)}">'
            f'<text x="0" y="14" class="title">{html.escape(title)}</text>{"".join(rows)}</svg></figure>')


def histogram(title: str, values: list[int]) -> str:
    counts = Counter(values)
    return bar_chart(title, [(str(v), counts[v]) for v in range(min(values, default=0), max(values, default=0) + 1)])


def report_html(run: Run) -> str:
    metrics, scores = run.metrics, run.scores
    trajectories = {t.episode_id: t for t in read_trajectories(run.trajectories)}
    episodes = []
    for score in scores:
        trajectory = trajectories.get(score.episode_id)
        changed = {} if trajectory is None else {index: drift for index, matches, drift in compared_observations(trajectory) if not matches}
        steps = [] if trajectory is None else [
            {"index": s.index, "action": s.action_text, "code": s.code, "observation": s.observation,
             "tools": [f"{c.name}({', '.join(f'{k}={v!r}' for k, v in c.arguments.items() if v is not None)})"[:200]
                       + (f" -> error: {c.error}" if c.error else "") for c in s.tool_calls],
             "error": s.error, "limit": s.limit_hit, "format_error": s.format_error,
             "changed": _changed(changed[s.index]) if s.index in changed else None}
            for s in trajectory.steps
        ]
        episodes.append({**score.model_dump(mode="json"), "steps_detail": steps,
                         "answer": trajectory.outcome.answer if trajectory else None,
                         "reason": trajectory.outcome.reason if trajectory else None})
    plots = [
        histogram("steps per episode", [s.steps for s in scores]),
        histogram("tool calls before submit or abstain", [s.tool_calls_before_end for s in scores]),
        bar_chart("detector rates (share of episodes)", list(metrics.detector_rates.items()),
                  "{:.0%}", maximum=1.0),
        bar_chart("answer F1 by question type", list(metrics.answer_f1_by_type.items()), "{:.2f}", maximum=1.0),
    ]
    headline = [("episodes", metrics.episodes), ("answer_f1", metrics.answer_f1), ("exact_match", metrics.exact_match),
                ("sub_exact_match", metrics.sub_exact_match), ("evidence_f1", metrics.evidence_f1),
                ("evidence_f1_text_only", metrics.evidence_f1_text_only), ("evidence_f1_strict", metrics.evidence_f1_strict), ("false_abstention_rate", metrics.false_abstention_rate),
                ("missed_abstention_rate", metrics.missed_abstention_rate), ("mean_steps", metrics.mean_steps),
                ("mean_tool_calls", metrics.mean_tool_calls)]
    rows = "".join(f"<tr><th>{name}</th><td>{'-' if value is None else f'{value:.3f}' if isinstance(value, float) else value}</td></tr>"
                   for name, value in headline)
    abstention = "".join(f"<tr><th>{row}</th><td>{counts.answered}</td><td>{counts.abstained}</td>"
                         f"<td>{counts.step_limit}</td><td>{counts.context_limit}</td><td>{counts.policy_error}</td></tr>"
                         for row, counts in metrics.abstention.rows())
    verdict = metrics.verdict
    policy = run.manifest.config.policy.name
    # every "<" escaped: no "</script>" or "<!--" inside the data can change how the page parses
    data = json.dumps({"episodes": episodes, "detectors": list(DETECTORS)}).replace("<", "\\u003c")
    return TEMPLATE.format(
        title=html.escape(f"{run.directory.name} - {policy}"), policy=html.escape(policy),
        verdict_class="bad" if verdict.verdict == "shortcut collapse" else "good",
        verdict=html.escape(f"{verdict.verdict}: direct-submit rate {verdict.direct_submit_rate:.1%} (threshold {verdict.threshold:.0%})"),
        rows=rows, abstention=abstention, replay=replay_section(metrics.replay), plots="".join(plots), data=data,
        corpus=html.escape(run.manifest.hashes.corpus_sha256[:16]),
        commit=html.escape(str(run.manifest.git_commit)),
    )


def replay_section(drift: ReplayDrift | None) -> str:
    """The run's replay drift as a table (nothing for a run of another policy)."""
    if drift is None:
        return ""
    rows = [("episodes replayed", drift.episodes), ("steps replayed", drift.steps),
            ("observations compared", drift.observations_compared), ("observations changed", drift.observations_changed),
            ("episodes with a change", drift.episodes_changed)]
    cells = "".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in rows)
    first = drift.first_change
    if first is not None:
        where = f"episode {first.episode_id}, observation of step {first.step + 1}, character {first.position}"
        cells += (f"<tr><th>first change</th><td>{html.escape(where)}</td></tr>"
                  f"<tr><th>recorded</th><td><pre>{html.escape(first.recorded)}</pre></td></tr>"
                  f"<tr><th>current</th><td><pre>{html.escape(first.current)}</pre></td></tr>")
    return f'<h2>Replay drift</h2><table id="replay">{cells}</table>'


def _changed(drift: Drift | None) -> str:
    """What a replayed step's detail says under an observation the replay did not reproduce."""
    if drift is None:
        return "this observation differs from the recording"
    return f"this observation differs from the recording at character {drift.position}: recorded {drift.recorded!r}, now {drift.current!r}"


def write_report(run: Run, out: Path) -> Path:
    from corpus.atomic import atomic_file

    with atomic_file(out) as handle:
        handle.write(report_html(run))
    return out


TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #1d2430; }}
header {{ padding: 12px 20px; background: #f3f5f8; border-bottom: 1px solid #d8dde5; }}
h1 {{ font-size: 18px; margin: 0 0 4px; }} h2 {{ font-size: 15px; margin: 18px 0 6px; }}
main {{ display: grid; grid-template-columns: minmax(420px, 1fr) 1.4fr; gap: 20px; padding: 0 20px 20px; }}
table {{ border-collapse: collapse; }} th, td {{ padding: 3px 8px; border-bottom: 1px solid #e4e7ec; text-align: left; }}
.verdict.bad {{ color: #b3261e; font-weight: 600; }} .verdict.good {{ color: #1e7d32; font-weight: 600; }}
figure {{ margin: 8px 0; }} svg text {{ font-size: 12px; }} svg .title {{ font-weight: 600; }} .bar {{ fill: #4a78c2; }}
#episodes tbody tr {{ cursor: pointer; }} #episodes tbody tr:hover, #episodes tbody tr.open {{ background: #eef3fb; }}
.flag {{ display: inline-block; background: #fde7e4; color: #8c1d18; border-radius: 3px; padding: 0 4px; margin: 1px; font-size: 12px; }}
pre {{ white-space: pre-wrap; word-break: break-word; background: #f7f8fa; padding: 6px; margin: 4px 0; max-height: 320px; overflow: auto; }}
.step {{ border: 1px solid #d8dde5; border-radius: 4px; padding: 6px 10px; margin: 8px 0; }}
.muted {{ color: #5d6675; }} #detail {{ position: sticky; top: 0; max-height: 100vh; overflow: auto; }}
</style></head>
<body>
<header><h1>{title}</h1>
<div class="verdict {verdict_class}" id="verdict">{verdict}</div>
<div class="muted">policy {policy} &middot; corpus {corpus}&hellip; &middot; commit {commit}</div></header>
<main>
<section>
<h2>Metrics</h2><table id="metrics">{rows}</table>
<h2>How episodes ended</h2><table id="abstention"><tr><th>gold \\ ended</th><th>answered</th><th>abstained</th><th>step limit</th><th>context limit</th><th>policy error</th></tr>{abstention}</table>
{replay}<h2>Plots</h2>{plots}
<h2>Episodes</h2>
<label>flag <select id="flag-filter"><option value="">all episodes</option></select></label>
<span id="count" class="muted"></span>
<table id="episodes"><thead><tr><th>episode</th><th>status</th><th>F1</th><th>steps</th><th>flags</th></tr></thead><tbody></tbody></table>
</section>
<section id="detail"><h2>Episode</h2><p class="muted">Choose an episode on the left.</p></section>
</main>
<script type="application/json" id="data">{data}</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
function el(tag, text, cls) {{ const node = document.createElement(tag); if (text !== undefined && text !== null) node.textContent = String(text); if (cls) node.className = cls; return node; }}
const select = document.getElementById("flag-filter");
for (const name of DATA.detectors) {{
  const count = DATA.episodes.filter(e => e.flags.some(f => f.detector === name)).length;
  if (count) {{ const option = el("option", name + " (" + count + ")"); option.value = name; select.appendChild(option); }}
}}
function flagNames(episode) {{ return [...new Set(episode.flags.map(f => f.detector))]; }}
function renderList() {{
  const body = document.querySelector("#episodes tbody");
  body.replaceChildren();
  const shown = DATA.episodes.filter(e => !select.value || e.flags.some(f => f.detector === select.value));
  for (const episode of shown) {{
    const row = el("tr"); row.dataset.episode = episode.episode_id;
    row.appendChild(el("td", episode.episode_id));
    row.appendChild(el("td", episode.status));
    row.appendChild(el("td", episode.answer_f1 === undefined ? "-" : episode.answer_f1.toFixed(2)));
    row.appendChild(el("td", episode.steps));
    const flags = el("td"); for (const name of flagNames(episode)) flags.appendChild(el("span", name, "flag"));
    row.appendChild(flags);
    row.addEventListener("click", () => {{ location.hash = "episode=" + encodeURIComponent(episode.episode_id); }});
    body.appendChild(row);
  }}
  document.getElementById("count").textContent = shown.length + " of " + DATA.episodes.length;
}}
function showEpisode(id) {{
  const episode = DATA.episodes.find(e => e.episode_id === id);
  const detail = document.getElementById("detail");
  detail.replaceChildren(el("h2", "Episode " + id));
  if (!episode) {{ detail.appendChild(el("p", "No such episode.", "muted")); return; }}
  for (const row of document.querySelectorAll("#episodes tbody tr")) row.classList.toggle("open", row.dataset.episode === id);
  detail.appendChild(el("p", episode.question));
  detail.appendChild(el("p", "status: " + episode.status + " | answer: " + (episode.answer ?? "-") + " | F1: " +
    (episode.answer_f1 === undefined ? "-" : episode.answer_f1.toFixed(2)) + (episode.reason ? " | " + episode.reason : ""), "muted"));
  for (const flag of episode.flags) detail.appendChild(el("div", flag.detector + (flag.step === null ? "" : " (step " + (flag.step + 1) + ")") + ": " + flag.text, "flag"));
  for (const step of episode.steps_detail) {{
    const box = el("div", null, "step"); box.dataset.step = step.index;
    box.appendChild(el("strong", "step " + (step.index + 1) + (step.format_error ? " - format error" : "") + (step.limit ? " - limit: " + step.limit : "")));
    box.appendChild(el("pre", step.code ?? step.action));
    if (step.tools.length) box.appendChild(el("div", "tools: " + step.tools.join("; "), "muted"));
    box.appendChild(el("pre", step.observation));
    if (step.changed !== null) box.appendChild(el("div", step.changed, "flag"));
    detail.appendChild(box);
  }}
}}
function route() {{ const match = location.hash.match(/^#episode=(.*)$/); if (match) showEpisode(decodeURIComponent(match[1])); }}
select.addEventListener("change", renderList);
window.addEventListener("hashchange", route);
renderList(); route();
</script></body></html>
"""
