"""The console's charts, drawn on the server as SVG with matplotlib and put inline in a page.

No JavaScript and nothing fetched by the browser: each chart is an ``<svg>`` element. Text
stays text (``svg.fonttype: none``), so a page's charts are searchable and small, and the
browser draws them in its own fonts.

Thread-safety: figures are made with :class:`matplotlib.figure.Figure` (not pyplot's global
state) and drawn under one lock, because matplotlib's text layout caches are shared.
"""

from __future__ import annotations

import datetime as dt
import io
import re
import threading
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("svg")  # no GUI backend, whatever the environment says

import matplotlib.dates as mdates
import numpy as np
import numpy.typing as npt
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

_LOCK = threading.Lock()
_STYLE: Any = {
    "svg.fonttype": "none",
    "svg.hashsalt": "rocketstore",  # stable ids: the same data draws the same bytes
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
}
_WIDTH, _HEIGHT = 8.0, 2.6  # inches; the page scales the SVG to its column


def _svg(fig: Figure, title: str) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    # Inline: no XML prolog or DOCTYPE; the chart says what it is to screen readers.
    text = text[text.index("<svg") :]
    return re.sub(
        r"<svg ",
        f'<svg role="img" aria-label="{_attr(title)}" class="chart" ',
        text,
        count=1,
    )


def _attr(text: str) -> str:
    return (
        text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")
    )


def _plain(label: str) -> str:
    """``label`` drawn as it is: matplotlib would parse text between two ``$`` as math (and
    fail on some), and a label starting with ``_`` would be left out of the legend."""
    return label.replace("$", r"\$").lstrip("_") or "?"


def _times(ms: npt.NDArray[np.int64]) -> list[dt.datetime]:
    return [dt.datetime.fromtimestamp(int(t) / 1000, dt.UTC).replace(tzinfo=None) for t in ms]


def rate_chart(
    title: str,
    edges: npt.NDArray[np.int64],
    series: Sequence[tuple[str, npt.NDArray[np.float64]]],
    unit: str = "messages / minute",
) -> str:
    """A line per series: counts per bucket at the buckets' starts (``edges[:-1]``, ms since
    the epoch, shown in UTC). Returns an ``<svg>`` element."""
    with _LOCK, matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=(_WIDTH, _HEIGHT))
        # Fixed margins: matplotlib's constrained layout costs several times the drawing.
        fig.subplots_adjust(left=0.08, right=0.98, top=0.88, bottom=0.27)
        ax = fig.add_subplot()
        starts = mdates.date2num(_times(edges[:-1]))  # type: ignore[no-untyped-call]
        for name, values in series:
            ax.plot(
                starts,
                values,
                marker="o" if len(values) <= 60 else None,
                ms=2.5,
                lw=1.2,
                label=_plain(name),
                drawstyle="steps-post" if len(values) > 1 else "default",
            )
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M\n%m-%d"))  # type: ignore[no-untyped-call]
        ax.set_xlabel("store time (UTC)")
        if 1 < len(series) <= 12:
            # Above the plot, where it hides no line.
            ax.legend(
                loc="lower left",
                bbox_to_anchor=(0.0, 1.0),
                fontsize=8,
                frameon=False,
                ncols=min(len(series), 6),
                borderaxespad=0.2,
            )
        return _svg(fig, title)


def bar_chart(title: str, labels: Sequence[str], values: Sequence[int], unit: str) -> str:
    """Horizontal bars, one per label (at most a few dozen: the caller cuts). Returns an
    ``<svg>`` element."""
    with _LOCK, matplotlib.rc_context(_STYLE):
        height = max(1.2, 0.22 * len(labels) + 0.8)
        fig = Figure(figsize=(_WIDTH, height))
        # Room for the longest label (about 0.075 in a character at 8 points), within reason.
        longest = max((len(label) for label in labels), default=1)
        left = min(0.5, (0.075 * longest + 0.25) / _WIDTH)
        fig.subplots_adjust(left=left, right=0.97, top=1 - 0.15 / height, bottom=0.55 / height)
        ax = fig.add_subplot()
        positions = np.arange(len(labels))
        ax.barh(positions, list(values), color="#c0504d", height=0.7)
        ax.set_yticks(positions, [_plain(label) for label in labels], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(unit)
        ax.grid(axis="y", visible=False)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        for y, v in zip(positions, values, strict=True):
            ax.annotate(
                f"{v:,}", (v, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7
            )
        return _svg(fig, title)
