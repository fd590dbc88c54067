"""The calibration section of ``explorer report`` (and of the two-run page, and ``compare``'s
table): each probe's ECE, Brier and NLL with their bootstrap intervals, the options' mass, and a
reliability diagram per probe."""

from __future__ import annotations

import html
import re

from paper_explorer.evaluation.records import Interval, ProbeCalibration, ProbeMass
from paper_explorer.evaluation.report_plots import reliability_diagram


def _with_interval(value: float, interval: Interval) -> str:
    return f"{value:.3f} ({interval.low:.3f}-{interval.high:.3f})"


CALIBRATION_HEADER = [
    "run",
    "probe",
    "label",
    "n",
    "options' mass (least)",
    "ECE equal-width",
    "ECE equal-mass",
    "Brier",
    "NLL",
    "accuracy",
]


def calibration_rows(
    figures: dict[str, ProbeCalibration] | None, run: str = "", masses: dict[str, ProbeMass] | None = None
) -> list[list[str]]:
    """One row per probe: the share of the distribution its options held, and its figures, each
    with its 95% bootstrap interval; a probe whose every episode held too little has no figures."""
    rows = []
    for probe in dict.fromkeys([*(figures or {}), *(masses or {})]):
        c, m = (figures or {}).get(probe), (masses or {}).get(probe)
        mass = "-" if m is None else f"{m.mean:.3g} ({m.min:.3g})" + (f", {m.below} under {m.min_mass:g}" if m.below else "")
        if c is None:
            why = "no episode held the minimum mass" if m is not None and m.below else "no measured episode with a label"
            rows.append([run, probe, "-", f"0 ({why})", mass, *["-"] * 5])
            continue
        left_out = [f"{c.not_measured} not measured"] * bool(c.not_measured) + [f"{c.low_mass} under the minimum mass"] * bool(c.low_mass)
        rows.append(
            [
                run,
                c.probe,
                c.label,
                f"{c.n}" + (f" ({', '.join(left_out)})" if left_out else ""),
                mass,
                _with_interval(c.ece_equal_width, c.ece_equal_width_ci95),
                _with_interval(c.ece_equal_mass, c.ece_equal_mass_ci95),
                _with_interval(c.brier, c.brier_ci95),
                _with_interval(c.nll, c.nll_ci95),
                f"{c.accuracy:.3f}",
            ]
        )
    return rows


def reliability_figures(figures: dict[str, ProbeCalibration] | None, run: str = "") -> str:
    """A reliability diagram per probe (equal-width bins), each in a div ``#reliability-[A-|B-]PROBE``."""
    parts = []
    for c in (figures or {}).values():
        slug = re.sub(r"[^a-z0-9_-]", "-", c.probe.lower())
        prefix = f"{run}-" if run else ""
        title = f"{run + ': ' if run else ''}reliability of probe {c.probe} (P({c.option}))"
        caption = f"{c.n} episodes, label {c.label}; ECE {c.ece_equal_width:.3f} over {c.bins} equal-width bins"
        parts.append(
            f'<div class="reliability" id="reliability-{prefix}{slug}">{reliability_diagram(title, c.reliability_equal_width, caption)}</div>'
        )
    return "".join(parts)


def calibration_section(runs: list[tuple[str, dict[str, ProbeCalibration] | None, dict[str, ProbeMass] | None]]) -> str:
    """The ECE table and the reliability diagrams of one run ([("", figures, masses)]) or two
    ([("A", ...), ("B", ...)]); nothing when no run measured a probe."""
    if all(figures is None and masses is None for _, figures, masses in runs):
        return ""
    rows = [row for name, figures, masses in runs for row in calibration_rows(figures, name, masses)]
    header = CALIBRATION_HEADER if len(runs) > 1 else CALIBRATION_HEADER[1:]
    if len(runs) == 1:
        rows = [row[1:] for row in rows]
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    note = (
        '<p class="muted">The probability of each probe\'s first option against its label; 95% bootstrap intervals '
        "in brackets; NLL with probabilities clipped to [1e-12, 1 - 1e-12]. The options' mass is their share of the "
        "model's next-token distribution before renormalising (mean, least): an episode under the run's minimum "
        "measured no belief and is left out of the figures.</p>"
    )
    diagrams = "".join(reliability_figures(figures, name) for name, figures, _ in runs)
    return f'<h2>Calibration</h2>{note}<table id="calibration-table"><tr>{head}</tr>{body}</table><div id="calibration">{diagrams}</div>'
