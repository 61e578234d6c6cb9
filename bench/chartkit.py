"""What the chart step draws with: the newest results of each bench part, the caption every
chart carries (the run's date, load, runs and commit; the machine), and the bar and figure
helpers the three charts share (:mod:`bench.charts`)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine

from bench.common import PROJECT_DIR, median

DEFAULT_IMAGES_DIR = PROJECT_DIR / "docs" / "images"

# Fixed SVG output, so that redrawing unchanged results changes no byte: ids from a fixed salt,
# text kept as text (smaller, searchable, no glyph paths), no date in the metadata.
SVG_SALT = "rocketstore-bench"
SVG_METADATA: dict[str, str | None] = {"Date": None}

# The RocketMQ 4.9.4 store (DefaultMessageStore, ASYNC_FLUSH, dispatch to ConsumeQueue and index
# included) on this machine, as issue 9 measured it: no bench part runs the Java store, so these
# are reference marks, drawn as such, not results of the runs the captions describe.
# Messages/s: puts in batches of 100, and one message per put.
ROCKETMQ_REFERENCE = {"batch": 485_000, "single": 297_000}

# One colour per role, the same in every chart.
ROCKETSTORE = "#1f77b4"
FLOOR = "#9ecae1"
RAW = "#2ca02c"
PARQUET = "#ff7f0e"
ROCKETMQ = "#d62728"
PARQUET_SOURCE = "#fdae6b"
FLOOR_SOURCE = "#6baed6"


class MissingResults(Exception):
    """A chart needs a part whose results are not in the results directory."""


@dataclasses.dataclass(frozen=True)
class PartResults:
    """One part's newest JSON file and what it holds."""

    part: str
    path: Path
    data: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.data[key]


def _display(directory: Path) -> str:
    try:
        return str(directory.resolve().relative_to(PROJECT_DIR))
    except ValueError:
        return str(directory)


def newest(directory: Path, part: str) -> Path:
    """The newest ``<part>-<UTC time>.json`` in ``directory`` (the name's time; ``sink`` does
    not match ``sink-batch``'s files), else ``<part>-latest.json``."""
    pattern = re.compile(rf"^{re.escape(part)}-(\d{{8}}T\d{{6}}Z)\.json$")
    stamped = sorted(
        (m.group(1), p)
        for p in (directory.iterdir() if directory.is_dir() else ())
        if (m := pattern.match(p.name))
    )
    if stamped:
        return stamped[-1][1]
    latest = directory / f"{part}-latest.json"
    if latest.is_file():
        return latest
    raise MissingResults(
        f"no results of bench part '{part}' in {_display(directory)}: "
        f"run `python -m bench {part}` first"
    )


def load_part(directory: Path, part: str) -> PartResults:
    path = newest(directory, part)
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("part") != part:
        raise MissingResults(f"{path} holds results of part {data.get('part')!r}, not {part!r}")
    return PartResults(part, path, data)


# -- what every caption says -------------------------------------------------------------------


def load_samples(r: PartResults) -> list[float]:
    """Every 1-minute load average the part's results recorded: around the whole part (the
    command line records it for every part) and, where a part samples it itself, per run."""
    d = r.data
    out: list[float] = []
    around = d.get("part_load_avg") or {}
    out += [float(around[k][0]) for k in ("start", "end") if k in around]
    if r.part == "sink":
        out += [float(x) for x in d.get("load_avg", [])]
    if r.part == "sink-batch":
        out += [float(x[0]) for x in d.get("loadavg", [])]
    if r.part == "source":
        out += [
            float(run[k])
            for run in d.get("runs", [])
            for k in ("load_avg_before", "load_avg_after")
        ]
    if r.part == "latency":
        out += [float(d[k][0]) for k in ("load_avg_start", "load_avg_end") if k in d]
        for m in [*d.get("steady", []), *d.get("steps", [])]:
            out += [float(m[k][0]) for k in ("load_before", "load_after") if k in m]
    return out


def _when(r: PartResults) -> str:
    started = dt.datetime.fromisoformat(str(r["started_utc"]))
    ended = started + dt.timedelta(seconds=float(r.data.get("duration_s", 0)))
    return f"{started:%Y-%m-%d %H:%M}-{ended:%H:%M} UTC"


def caption(r: PartResults) -> str:
    """``part: date, load, median of N runs, commit``: one line under a chart."""
    loads = load_samples(r)
    if not loads:
        load = "load average not recorded"
    elif max(loads) - min(loads) < 0.05:
        load = f"load average {loads[0]:.1f}"
    else:
        load = f"load average {min(loads):.1f}-{max(loads):.1f}"
    runs = int(r["options"]["runs"])
    median_of = f"median of {runs} run{'s' if runs != 1 else ''}"
    quick = ", quick sizes (a smoke run)" if r["options"].get("quick") else ""
    commit = r["machine"].get("git_commit", "unknown")
    return f"{r.part}: {_when(r)}, {load}, {median_of}{quick}, commit {commit}"


def machine_caption(results: Sequence[PartResults]) -> str:
    m = results[0]["machine"]
    cores = m.get("nproc")
    return (
        f"Machine: {cores} cores ({m.get('cpu_model', 'unknown CPU')}), "
        f"{m.get('mem_total_gib')} GiB, Linux {m.get('kernel')}, shared with other work: "
        "the load average says how busy it was (load = cores means fully busy)."
    )


# -- drawing -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Bar:
    """One bar: its label (legend), value (the median), whiskers, colour and id.

    ``gid`` names the bar in the SVG (``<g id="...">``) and in the figure, so a test can find
    it; ``hatch`` marks reference bars that are not results of these runs."""

    label: str
    value: float
    low: float | None = None
    high: float | None = None
    color: str = ROCKETSTORE
    gid: str = ""
    hatch: str | None = None
    note: str = ""


def human(value: float) -> str:
    """3.2M, 485k, 2,413, 0.27: short numbers for the bar labels."""
    a = abs(value)
    if a == 0:
        text = "0"
    elif a >= 1_000_000:
        text = f"{value / 1_000_000:.2f}M"
    elif a >= 10_000:
        text = f"{value / 1000:.0f}k"
    elif a >= 100:
        text = f"{value:,.0f}"
    elif a >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return text


def grouped_bars(
    ax: Axes,
    groups: Sequence[tuple[str, Sequence[Bar]]],
    unit: str,
    ylabel: str,
    horizontal: bool = False,
) -> None:
    """Bars in groups (one tick per group), each labelled with its value and note; vertical,
    or horizontal (groups from the top down) where the notes would not fit side by side."""
    width = 0.8 / max(len(bars) for _, bars in groups)
    seen: set[str] = set()
    top = 0.0
    for gi, (_, bars) in enumerate(groups):
        start = gi - width * (len(bars) - 1) / 2
        for bi, bar in enumerate(bars):
            at = start + bi * width
            label = bar.label if bar.label not in seen else "_nolegend_"
            seen.add(bar.label)
            style: dict[str, Any] = {
                "color": bar.color,
                "label": label,
                "hatch": bar.hatch,
                "edgecolor": "white" if bar.hatch else None,
            }
            if horizontal:
                container = ax.barh(-at, bar.value, width * 0.92, **style)
            else:
                container = ax.bar(at, bar.value, width * 0.92, **style)
            container.patches[0].set_gid(bar.gid or None)
            high = bar.value
            if bar.low is not None and bar.high is not None:
                err = [[bar.value - bar.low], [bar.high - bar.value]]
                ax.errorbar(
                    bar.value if horizontal else at,
                    -at if horizontal else bar.value,
                    xerr=err if horizontal else None,
                    yerr=None if horizontal else err,
                    color="#333333",
                    capsize=3,
                    linewidth=1,
                )
                high = bar.high
            if horizontal:
                text = human(bar.value) + (f", {bar.note}" if bar.note else "")
                ax.annotate(
                    text,
                    (high, -at),
                    xytext=(4, 0),
                    textcoords="offset points",
                    ha="left",
                    va="center",
                    fontsize=8,
                )
            else:
                ax.annotate(
                    human(bar.value) + (f"\n{bar.note}" if bar.note else ""),
                    (at, high),
                    xytext=(0, 3),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=8,
                )
            top = max(top, high)
    names = [name for name, _ in groups]
    value_axis = ax.xaxis if horizontal else ax.yaxis
    value_axis.set_major_formatter(lambda v, _: human(v))
    if horizontal:
        ax.set_yticks([-g for g in range(len(groups))], names)
        ax.set_xlim(0, top * 1.6 if top > 0 else 1)
        ax.set_xlabel(f"{ylabel} ({unit})" if unit else ylabel)
        ax.grid(axis="x", alpha=0.3)
    else:
        ax.set_xticks(range(len(groups)), names)
        ax.set_xlim(-0.7, len(groups) - 0.3)  # room for the outer bars' labels
        ax.set_ylim(0, top * 1.3 if top > 0 else 1)
        ax.set_ylabel(f"{ylabel} ({unit})" if unit else ylabel)
        ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    if horizontal:  # below the axes: the value labels run to the right edge
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.12), frameon=False)
    else:
        ax.legend(fontsize=8, loc="upper right", frameon=False)


def spread_bar(spread: dict[str, float], scale: float = 1.0, **kw: Any) -> Bar:
    return Bar(
        value=spread["median"] * scale,
        low=spread["min"] * scale,
        high=spread["max"] * scale,
        **kw,
    )


def ratio_label(spread: dict[str, float] | None, of: str) -> str:
    """``0.72 x raw``: a part's own same-run ratio (the median of its per-run ratios)."""
    return "" if spread is None else f"{spread['median']:.2f} x {of}"


def ratio_spread(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """The ratio of two medians, as a spread's median (for :func:`ratio_label`)."""
    return {"median": a["median"] / b["median"]}


def list_bar(values: Sequence[float], **kw: Any) -> Bar:
    return Bar(value=median(values), low=min(values), high=max(values), **kw)


def fmt_count(n: int) -> str:
    if n >= 1_000_000 and n % 100_000 == 0:
        return f"{n / 1_000_000:g}M"
    if n >= 1000 and n % 100 == 0:
        return f"{n / 1000:g}k"
    return f"{n:,}"


def fmt_size(n: int) -> str:
    return f"{n // 1024} KiB" if n >= 1024 and n % 1024 == 0 else f"{n} B"


def new_figure(title: str, mosaic: str, height: float) -> tuple[Figure, list[Axes]]:
    """A 12-inch-wide figure of panels laid out as ``mosaic`` (``"ab;cd"``: two rows of two);
    the panels in the order of their letters."""
    fig = Figure(figsize=(12, height), layout="constrained")
    axes = fig.subplot_mosaic(mosaic)
    fig.suptitle(title, fontsize=14, fontweight="bold")
    return fig, [axes[k] for k in sorted(axes)]


CAPTION_PT = 8
CAPTION_CHARS = 165  # characters a caption line holds across a 12-inch figure at 8 pt


def add_captions(fig: Figure, results: Sequence[PartResults], note: str = "") -> None:
    """The machine and each part's run under the axes, and an optional note, wrapped."""
    lines = [machine_caption(results), *(caption(r) for r in results)]
    if note:
        lines += textwrap.wrap(note, CAPTION_CHARS)
    height_in = fig.get_figheight()
    reserved = (len(lines) * CAPTION_PT * 1.25 + 10) / 72 / height_in
    engine = fig.get_layout_engine()
    assert isinstance(engine, ConstrainedLayoutEngine)
    engine.set(rect=(0, reserved, 1, 1 - reserved))
    fig.text(
        0.01, 0.004, "\n".join(lines), fontsize=CAPTION_PT, color="#444444", va="bottom", ha="left"
    )
