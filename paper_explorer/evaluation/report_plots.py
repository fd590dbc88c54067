"""The report's plots: inline SVG with a title, labelled axes, ticks, and the count or value
written beside every bar, so a plot can be read without hovering and printed without a browser.
Every label is escaped; nothing here runs script."""

from __future__ import annotations

import html
import math
from collections import Counter

WIDTH = 460  # every plot, so that a column of them lines up
TITLE_HEIGHT, AXIS_SPACE = 22, 34  # room for the title above, and for the ticks and axis label below


def nice_step(top: float, most_ticks: int = 5) -> float:
    """The smallest of 1, 2, 5 x 10^k that puts at most ``most_ticks`` intervals between 0 and ``top``."""
    if top <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(top / most_ticks))
    for factor in (1, 2, 5, 10):
        if top / (factor * magnitude) <= most_ticks:
            return factor * magnitude
    return 10 * magnitude


def ticks(top: float, integer: bool) -> list[float]:
    """Tick positions from 0 to at least ``top`` (whole numbers for counts)."""
    step = max(1.0, nice_step(top)) if integer else nice_step(top)
    count = max(1, math.ceil(top / step - 1e-9))
    return [round(i * step, 10) for i in range(count + 1)]


def _text(x: float, y: float, text: str, anchor: str = "start", cls: str = "") -> str:
    klass = f' class="{cls}"' if cls else ""
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{klass}>{html.escape(text)}</text>'


def _figure(title: str, width: int, height: int, body: list[str], caption: str = "") -> str:
    note = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
    return (
        f'<figure><svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{html.escape(title)}">{_text(2, 15, title, cls="title")}{"".join(body)}</svg>{note}</figure>'
    )


def column_chart(title: str, x_label: str, y_label: str, columns: list[tuple[str, int]], caption: str = "") -> str:
    """Vertical bars of counts: x is a category or a bin, y the count, written above each bar."""
    left, right, plot_height = 52, 10, 150
    top_y = TITLE_HEIGHT + 14  # the counts above the tallest bar need a line
    base_y = top_y + plot_height
    marks = ticks(max((count for _, count in columns), default=0), integer=True)
    scale = plot_height / marks[-1]
    slot = (WIDTH - left - right) / max(1, len(columns))
    body = []
    for mark in marks:
        y = base_y - mark * scale
        body.append(f'<line x1="{left}" x2="{WIDTH - right}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        body.append(_text(left - 6, y + 4, f"{mark:g}", "end", "tick"))
    for i, (label, count) in enumerate(columns):
        x, height = left + i * slot, count * scale
        body.append(
            f'<rect x="{x + slot * 0.12:.1f}" y="{base_y - height:.1f}" width="{slot * 0.76:.1f}" '
            f'height="{height:.1f}" class="bar"><title>{html.escape(f"{label}: {count}")}</title></rect>'
        )
        body.append(_text(x + slot / 2, base_y - height - 4, str(count), "middle", "count"))
        body.append(_text(x + slot / 2, base_y + 14, label, "middle", "tick"))
    body.append(f'<line x1="{left}" x2="{WIDTH - right}" y1="{base_y}" y2="{base_y}" class="axis"/>')
    body.append(f'<line x1="{left}" x2="{left}" y1="{top_y}" y2="{base_y}" class="axis"/>')
    body.append(_text(left + (WIDTH - left - right) / 2, base_y + 30, x_label, "middle", "axis-label"))
    middle = top_y + plot_height / 2
    body.append(
        f'<text x="14" y="{middle:.1f}" text-anchor="middle" transform="rotate(-90 14 {middle:.1f})" '
        f'class="axis-label">{html.escape(y_label)}</text>'
    )
    return _figure(title, WIDTH, base_y + AXIS_SPACE + 4, body, caption)


def bar_chart(
    title: str, x_label: str, bars: list[tuple[str, float, str]], maximum: float, tick_format: str = "{:g}", caption: str = ""
) -> str:
    """Horizontal bars from 0 to ``maximum`` on a ticked x axis; each bar is (label, value, what to
    write after it - the value with its count, say)."""
    label_width, right, row = 150, 90, 22
    top_y = TITLE_HEIGHT + 4
    plot_width = WIDTH - label_width - right
    base_y = top_y + max(1, len(bars)) * row
    body = []
    for mark in ticks(maximum, integer=False):
        if mark > maximum + 1e-9:
            break
        x = label_width + plot_width * mark / maximum
        body.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top_y}" y2="{base_y}" class="grid"/>')
        body.append(_text(x, base_y + 14, tick_format.format(mark), "middle", "tick"))
    if not bars:
        body.append(_text(label_width + 6, top_y + 15, "nothing to plot", cls="count"))
    for i, (label, value, annotation) in enumerate(bars):
        y = top_y + i * row + 3
        width = plot_width * min(value, maximum) / maximum
        body.append(_text(label_width - 6, y + 12, label, "end", "tick"))
        body.append(
            f'<rect x="{label_width}" y="{y}" width="{width:.1f}" height="{row - 6}" class="bar">'
            f"<title>{html.escape(f'{label}: {annotation}')}</title></rect>"
        )
        body.append(_text(label_width + width + 4, y + 12, annotation, cls="count"))
    body.append(f'<line x1="{label_width}" x2="{label_width + plot_width}" y1="{base_y}" y2="{base_y}" class="axis"/>')
    body.append(f'<line x1="{label_width}" x2="{label_width}" y1="{top_y}" y2="{base_y}" class="axis"/>')
    body.append(_text(label_width + plot_width / 2, base_y + 30, x_label, "middle", "axis-label"))
    return _figure(title, WIDTH, base_y + AXIS_SPACE + 4, body, caption)


def count_histogram(title: str, x_label: str, values: list[int]) -> str:
    """How many episodes took each whole number of something (every value from the least to the most shown)."""
    counts = Counter(values)
    columns = [(str(v), counts[v]) for v in range(min(values, default=0), max(values, default=0) + 1)]
    return column_chart(title, x_label, "episodes", columns, caption=f"{len(values)} episodes")


F1_BINS = [(0.0, 0.2), (0.2, 0.4), (0.4, 0.6), (0.6, 0.8), (0.8, 1.0)]


def f1_histogram(title: str, values: list[float]) -> str:
    """Answer F1 in five bins, the last one closed ([0.8, 1.0]) so that a perfect answer is counted."""

    def bin_of(value: float) -> int:
        return min(int(value * len(F1_BINS)), len(F1_BINS) - 1)

    counts = Counter(bin_of(value) for value in values)
    labels = [f"{low:.1f}-{high:.1f}" for low, high in F1_BINS]
    return column_chart(
        title,
        "answer F1",
        "episodes",
        [(label, counts[i]) for i, label in enumerate(labels)],
        caption=f"{len(values)} scored episodes; bins include their lower edge, the last also 1.0",
    )


def reliability_diagram(title: str, bins: list, caption: str = "", unit: str = "episodes") -> str:
    """A reliability diagram: x the probability the policy gave, y how often the label held. Each
    non-empty bin is a bar over its edges as high as its accuracy, a dot at (mean probability,
    accuracy) and its count above; the dashed diagonal is perfect calibration. ``bins`` are
    ``records.ReliabilityBin`` (equal-width: fixed edges); ``unit``: what a bin counts."""
    left, right, size = 52, 10, 220
    top_y = TITLE_HEIGHT + 14
    base_y = top_y + size
    width = left + size + right + 150  # room on the right for the legend

    def x_of(value: float) -> float:
        return left + size * value

    def y_of(value: float) -> float:
        return base_y - size * value

    body = []
    for mark in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0):
        body.append(f'<line x1="{left}" x2="{left + size}" y1="{y_of(mark):.1f}" y2="{y_of(mark):.1f}" class="grid"/>')
        body.append(_text(left - 6, y_of(mark) + 4, f"{mark:.1f}", "end", "tick"))
        body.append(_text(x_of(mark), base_y + 14, f"{mark:.1f}", "middle", "tick"))
    body.append(
        f'<line x1="{x_of(0):.1f}" y1="{y_of(0):.1f}" x2="{x_of(1):.1f}" y2="{y_of(1):.1f}" class="diagonal" '
        'stroke="#8a93a3" stroke-dasharray="4 3"/>'
    )
    for b in bins:
        if not b.count:
            continue
        x0, x1, height = x_of(b.low), x_of(b.high), size * b.accuracy
        tip = f"{b.low:.2f}-{b.high:.2f}: {b.count} {unit}, mean probability {b.mean_confidence:.3f}, accuracy {b.accuracy:.3f}"
        body.append(
            f'<rect x="{x0 + 1:.1f}" y="{base_y - height:.1f}" width="{max(1.0, x1 - x0 - 2):.1f}" height="{height:.1f}" '
            f'class="bar"><title>{html.escape(tip)}</title></rect>'
        )
        body.append(f'<circle cx="{x_of(b.mean_confidence):.1f}" cy="{y_of(b.accuracy):.1f}" r="3" class="point" fill="#b3261e"/>')
        body.append(_text((x0 + x1) / 2, base_y - height - 4, str(b.count), "middle", "count"))
    body.append(f'<line x1="{left}" x2="{left + size}" y1="{base_y}" y2="{base_y}" class="axis"/>')
    body.append(f'<line x1="{left}" x2="{left}" y1="{top_y}" y2="{base_y}" class="axis"/>')
    body.append(_text(left + size / 2, base_y + 30, "probability given (bin)", "middle", "axis-label"))
    middle = top_y + size / 2
    body.append(
        f'<text x="14" y="{middle:.1f}" text-anchor="middle" transform="rotate(-90 14 {middle:.1f})" class="axis-label">accuracy</text>'
    )
    legend_x = left + size + 16
    body.append(_text(legend_x, top_y + 10, "bar: accuracy in the bin"))
    body.append(_text(legend_x, top_y + 26, "dot: at the bin's mean"))
    body.append(_text(legend_x, top_y + 40, "probability"))
    body.append(_text(legend_x, top_y + 56, f"number: {unit}"))
    body.append(_text(legend_x, top_y + 72, "dashed: calibrated"))
    return _figure(title, width, base_y + AXIS_SPACE + 4, body, caption)
