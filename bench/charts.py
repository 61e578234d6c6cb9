"""The benchmark figures as charts: ``python -m bench.charts`` (``make charts``) reads the newest
results of each part from ``bench/out/`` (or ``--results DIR``) and draws three SVGs into
``docs/images/``:

- ``throughput.svg``: the store's put throughput beside its same-run baselines (the raw mmap
  write and one ``os.write`` per message), the Spark sink and source beside Spark's parquet
  sink and source, and the RocketMQ 4.9.4 store's put rates as reference marks;
- ``latency.svg``: the latency part's percentiles at its steady rate, and along its ramp;
- ``floors.svg``: the sink and the source beside their floors (what any Python sink or source
  costs before doing anything), and the fixed cost of a micro-batch or query with almost no
  rows.

Every chart ends with one caption line per part it draws from: the date of the run, the
machine's load average over it, how many runs each figure is the median of, and the commit;
and a line naming the machine. Bars are medians; whiskers span the runs' min .. max.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib as mpl
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.ticker import LogLocator

from bench.common import DEFAULT_OUT_DIR, MB, PROJECT_DIR, median
from bench.latency import TARGET_P50_MS

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


def _spread_bar(spread: dict[str, float], scale: float = 1.0, **kw: Any) -> Bar:
    return Bar(
        value=spread["median"] * scale,
        low=spread["min"] * scale,
        high=spread["max"] * scale,
        **kw,
    )


def _ratio(spread: dict[str, float] | None, of: str) -> str:
    """``0.72 x raw``: a part's own same-run ratio (the median of its per-run ratios)."""
    return "" if spread is None else f"{spread['median']:.2f} x {of}"


def _over(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """The ratio of two medians, as a spread's median (for :func:`_ratio`)."""
    return {"median": a["median"] / b["median"]}


def _list_bar(values: Sequence[float], **kw: Any) -> Bar:
    return Bar(value=median(values), low=min(values), high=max(values), **kw)


def _count(n: int) -> str:
    if n >= 1_000_000 and n % 100_000 == 0:
        return f"{n / 1_000_000:g}M"
    if n >= 1000 and n % 100 == 0:
        return f"{n / 1000:g}k"
    return f"{n:,}"


def _size(n: int) -> str:
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


# -- throughput.svg ----------------------------------------------------------------------------


def draw_throughput(results: Path) -> Figure:
    store = load_part(results, "store")
    core = load_part(results, "core")
    sink = load_part(results, "sink")
    source = load_part(results, "source")
    fig, (mbs, msgs, sinks, sources) = new_figure(
        "rocketstore throughput beside same-run baselines", "ab;cd", 10
    )

    groups = []
    for key in ("put_small", "put_large"):
        put = store[key]
        name = f"{_count(int(put['messages']))} x {_size(int(put['body_bytes']))}"
        groups.append(
            (
                f"batch put, {name}\n({put['encoded_bytes'] / MB:,.0f} MB encoded)",
                [
                    _spread_bar(
                        put["store_mb_per_s"],
                        label="rocketstore put_batch",
                        color=ROCKETSTORE,
                        gid=f"throughput.{key}.store_mb_per_s",
                        note=_ratio(put.get("store_over_raw"), "raw"),
                    ),
                    _spread_bar(
                        put["raw_mb_per_s"],
                        label="raw mmap write of the same bytes",
                        color=RAW,
                        gid=f"throughput.{key}.raw_mb_per_s",
                    ),
                ],
            )
        )
    grouped_bars(mbs, groups, "MB/s", "bandwidth")
    mbs.set_title("Store: batch put against a raw write, one core", fontsize=11)

    small = store["put_small"]
    single = core["single"]
    grouped_bars(
        msgs,
        [
            (
                f"batch put, {_count(int(small['messages']))} x {_size(int(small['body_bytes']))}",
                [
                    _spread_bar(
                        small["store_msgs_per_s"],
                        label="rocketstore",
                        gid="throughput.put_small.store_msgs_per_s",
                    ),
                    Bar(
                        "RocketMQ 4.9.4 store (reference, not these runs)",
                        ROCKETMQ_REFERENCE["batch"],
                        color=ROCKETMQ,
                        hatch="//",
                        gid="throughput.rocketmq.batch",
                    ),
                ],
            ),
            (
                f"single put, {_count(int(single['messages']))} calls of 100 B",
                [
                    _spread_bar(
                        single["put_msgs_per_s"],
                        label="rocketstore",
                        gid="throughput.single.put_msgs_per_s",
                    ),
                    Bar(
                        "RocketMQ 4.9.4 store (reference, not these runs)",
                        ROCKETMQ_REFERENCE["single"],
                        color=ROCKETMQ,
                        hatch="//",
                        gid="throughput.rocketmq.single",
                    ),
                    _spread_bar(
                        single["write_msgs_per_s"],
                        label="os.write per message (raw)",
                        color=RAW,
                        gid="throughput.single.write_msgs_per_s",
                    ),
                ],
            ),
        ],
        "messages/s",
        "throughput",
    )
    msgs.set_title("Store: puts against RocketMQ's store and raw writes, one core", fontsize=11)

    rows = int(sink["rows"])
    speed = {k: [rows / w for w in v] for k, v in sink["wall_s"].items()}
    parquet = median(speed["parquet"])
    grouped_bars(
        sinks,
        [
            (
                "foreachBatch",
                [
                    _list_bar(
                        speed["rocketstore"],
                        label="rocketstore sink",
                        gid="throughput.sink.rocketstore",
                        note=f"{median(speed['rocketstore']) / parquet:.2f} x parquet",
                    )
                ],
            ),
            (
                "data source writer",
                [
                    _list_bar(
                        speed["rocketstore-ds"],
                        label="rocketstore sink",
                        gid="throughput.sink.rocketstore-ds",
                        note=f"{median(speed['rocketstore-ds']) / parquet:.2f} x parquet",
                    )
                ],
            ),
            (
                "Spark's file sink",
                [
                    _list_bar(
                        speed["parquet"],
                        label="parquet sink",
                        color=PARQUET,
                        gid="throughput.sink.parquet",
                    )
                ],
            ),
        ],
        "rows/s",
        "throughput",
    )
    sinks.set_title(
        f"Spark sink: {_count(rows)} rows x 100 B, local[2], against parquet", fontsize=11
    )

    n = int(source["messages"])
    grouped_bars(
        sources,
        [
            (
                'readStream.format("rocketstore")',
                [
                    _spread_bar(
                        source["source_rows_per_s"],
                        label="rocketstore source",
                        gid="throughput.source.source",
                        note=_ratio(source.data.get("source_over_parquet"), "parquet"),
                    )
                ],
            ),
            (
                "readStream.parquet",
                [
                    _spread_bar(
                        source["parquet_rows_per_s"],
                        label="parquet source",
                        color=PARQUET,
                        gid="throughput.source.parquet",
                    )
                ],
            ),
        ],
        "rows/s",
        "throughput",
    )
    sources.set_title(
        f"Spark source: {_count(n)} rows x {source['body_bytes']} B into noop, against parquet",
        fontsize=11,
    )
    add_captions(
        fig,
        [store, core, sink, source],
        "Hatched: the RocketMQ 4.9.4 store (DefaultMessageStore, ASYNC_FLUSH, with dispatch) "
        "as measured earlier on this machine, a reference mark, not from the runs above.",
    )
    return fig


# -- latency.svg -------------------------------------------------------------------------------

PERCENTILES = ("p50", "p90", "p99", "max")
PATHS = {
    "born_to_seen_ms": ("born → seen (store to reader)", ROCKETSTORE),
    "gen_to_seen_ms": ("gen → seen (generated to reader)", PARQUET),
}


def draw_latency(results: Path) -> Figure:
    lat = load_part(results, "latency")
    steady: list[dict[str, Any]] = lat["steady"]
    steps: list[dict[str, Any]] = lat["steps"]
    if not steady:
        raise MissingResults(f"{lat.path} holds no steady-rate measurement")
    rate = int(lat["steady_rate"])
    fig, (bars_ax, ramp_ax) = new_figure(
        "End-to-end latency: a streaming writer and a streaming reader on one store", "ab", 6
    )

    groups = []
    for q in PERCENTILES:
        bars = []
        for key, (label, color) in PATHS.items():
            values = [float(m[key][q]) for m in steady if q in m[key]]
            if values:
                bars.append(_list_bar(values, label=label, color=color, gid=f"latency.{key}.{q}"))
        groups.append((q, bars))
    grouped_bars(bars_ax, groups, "ms", "latency")
    target = float(TARGET_P50_MS)
    bars_ax.axhline(
        target,
        color=ROCKETMQ,
        linestyle="--",
        linewidth=1,
        label=f"target: born → seen p50 < {target / 1000:g} s",
    )
    bars_ax.legend(fontsize=8, loc="upper left", frameon=False)
    bars_ax.set_ylim(0, max(bars_ax.get_ylim()[1], target * 1.15))
    bars_ax.set_title(
        f"At a steady {rate:,} msgs/s: percentiles over every row of the window", fontsize=11
    )

    measured = [*steady, *steps]
    rates = sorted({int(m["rate"]) for m in measured})
    for key, (label, color) in PATHS.items():
        for q, style in (("p50", "-"), ("p99", ":")):
            ys = []
            for r in rates:
                at = [float(m[key][q]) for m in measured if int(m["rate"]) == r and q in m[key]]
                ys.append(median(at) if at else float("nan"))
            (line,) = ramp_ax.plot(rates, ys, style, marker="o", color=color, label=f"{label}, {q}")
            line.set_gid(f"latency.ramp.{key}.{q}")
    failed = [int(m["rate"]) for m in steps if not m["sustained"]]
    for r in failed:
        ramp_ax.axvline(r, color=ROCKETMQ, linestyle="--", linewidth=1)
        ramp_ax.annotate(
            "not sustained",
            (r, 1),
            xycoords=("data", "axes fraction"),
            xytext=(-3, -12),
            textcoords="offset points",
            ha="right",
            fontsize=8,
            color=ROCKETMQ,
        )
    ramp_ax.set_xscale("log", base=2)
    ramp_ax.set_yscale("log")
    ramp_ax.set_xticks(rates, [human(r) for r in rates])
    ramp_ax.minorticks_off()
    ramp_ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ramp_ax.yaxis.set_major_formatter(lambda v, _: human(v))
    ramp_ax.set_xlabel("offered rate (messages/s)")
    ramp_ax.set_ylabel("latency (ms)")
    ramp_ax.grid(alpha=0.3)
    ramp_ax.legend(
        fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2
    )
    highest = int(lat["highest_sustained_rate"])
    ramp_ax.set_title(f"Along the ramp: highest rate sustained {highest:,} msgs/s", fontsize=11)
    add_captions(
        fig,
        [lat],
        f"Steady bars: median of the {len(steady)} steady measurement(s), whiskers min .. max; "
        "the ramp has one measurement per rate (at the steady rate, their median). born: the store's stamp when the sink's put "
        "began; gen: the rate source's stamp; seen: when the reading query has the batch.",
    )
    return fig


# -- floors.svg --------------------------------------------------------------------------------


# The sink's two faces, each with its floor: (group label, the sink's kind, its floor's kind).
SINK_FACES = (
    ("foreachBatch", "rocketstore", "floor-fb"),
    ("data source\nwriter", "rocketstore-ds", "floor-ds"),
)


def _against_floors(
    values: dict[str, list[float]], what: str, note: Callable[[float, float], str]
) -> list[tuple[str, list[Bar]]]:
    """One group per face of the sink: its bar (noted with ``note(sink, floor)`` of the
    medians) beside its floor's."""
    return [
        (
            face,
            [
                _list_bar(
                    values[name],
                    label="rocketstore sink",
                    gid=f"floors.{what}.{name}",
                    note=note(median(values[name]), median(values[floor])),
                ),
                _list_bar(
                    values[floor],
                    label="its floor (same plan, counts)",
                    color=FLOOR,
                    gid=f"floors.{what}.{floor}",
                ),
            ],
        )
        for face, name, floor in SINK_FACES
    ]


def draw_floors(results: Path) -> Figure:
    sink = load_part(results, "sink")
    batch = load_part(results, "sink-batch")
    source = load_part(results, "source")
    fig, (sink_ax, sink_cpu_ax, source_ax, source_cpu_ax, fixed_ax) = new_figure(
        "What the sink and the source cost beyond Spark's own floor", "ace;bde", 10
    )

    rows = int(sink["rows"])
    speed = {k: [rows / w for w in v] for k, v in sink["wall_s"].items()}
    grouped_bars(
        sink_ax,
        _against_floors(speed, "sink", lambda sink, floor: f"{sink / floor:.2f} x floor"),
        "rows/s",
        "throughput",
    )
    sink_ax.set_title(f"Sink: {_count(rows)} rows x 100 B, wall clock", fontsize=11)

    per_m = 1_000_000 / rows
    cpu = {k: [c * per_m for c in v] for k, v in sink["cpu_s"].items()}
    grouped_bars(
        sink_cpu_ax,
        [
            *_against_floors(
                cpu, "sink_cpu", lambda sink, floor: f"+{sink - floor:.2f} over floor"
            ),
            (
                "native put,\none thread",
                [
                    _list_bar(
                        [c * per_m for c in sink["native_put_cpu_s"]],
                        label="the put every sink runs",
                        color=RAW,
                        gid="floors.sink_cpu.native_put",
                    )
                ],
            ),
        ],
        "",
        "CPU s per million rows",
    )
    sink_cpu_ax.set_title("Sink: CPU of every process, lower is better", fontsize=11)

    grouped_bars(
        source_ax,
        [
            (
                "streaming",
                [
                    _spread_bar(
                        source["source_rows_per_s"],
                        label="rocketstore source",
                        gid="floors.source.source",
                        note=_ratio(source.data.get("source_over_floor"), "floor"),
                    ),
                    _spread_bar(
                        source["replay_stream_rows_per_s"],
                        label="floor: replay of decoded batches",
                        color=FLOOR,
                        gid="floors.source.replay_stream",
                    ),
                ],
            ),
            (
                "batch read",
                [
                    _spread_bar(
                        source["replay_rows_per_s"],
                        label="floor: replay of decoded batches",
                        color=FLOOR,
                        gid="floors.source.replay",
                    ),
                ],
            ),
        ],
        "rows/s",
        "throughput",
    )
    n = int(source["messages"])
    source_ax.set_title(f"Source: {_count(n)} rows into noop, wall clock", fontsize=11)

    def source_cpu(kind: str) -> list[float]:
        return [float(run[f"{kind}_cpu_s"]) * 1_000_000 / n for run in source["runs"]]

    grouped_bars(
        source_cpu_ax,
        [
            (
                "streaming",
                [
                    _list_bar(
                        source_cpu("source"),
                        label="rocketstore source",
                        gid="floors.source_cpu.source",
                    ),
                    _list_bar(
                        source_cpu("replay_stream"),
                        label="floor: replay of decoded batches",
                        color=FLOOR,
                        gid="floors.source_cpu.replay_stream",
                    ),
                ],
            ),
            (
                "batch read",
                [
                    _list_bar(
                        source_cpu("replay"),
                        label="floor: replay of decoded batches",
                        color=FLOOR,
                        gid="floors.source_cpu.replay",
                    ),
                ],
            ),
        ],
        "",
        "CPU s per million rows",
    )
    source_cpu_ax.set_title("Source: CPU of every process, lower is better", fontsize=11)

    per_batch: dict[str, list[float]] = batch["ms_per_batch"]
    empty, parquet_batch = median(per_batch["empty"]), median(per_batch["parquet"])
    grouped_bars(
        fixed_ax,
        [
            (
                "sink, 100-row\nmicro-batch",
                [
                    _list_bar(
                        per_batch["empty"],
                        label="rocketstore sink, empty store",
                        gid="floors.batch.empty",
                        note=f"{empty / parquet_batch:.2f} x parquet",
                    ),
                    _list_bar(
                        per_batch["large"],
                        label=f"rocketstore sink, store of {_count(int(batch['large']))} messages",
                        color="#08519c",
                        gid="floors.batch.large",
                        note=f"{median(per_batch['large']) / empty:.2f} x empty",
                    ),
                    _list_bar(
                        per_batch["parquet"],
                        label="parquet sink",
                        color=PARQUET,
                        gid="floors.batch.parquet",
                    ),
                ],
            ),
            (
                "query reading\nnothing",
                [
                    _spread_bar(
                        source["source_empty_s"],
                        1000,
                        label="rocketstore source, from the latest offsets",
                        color=FLOOR_SOURCE,
                        gid="floors.empty.source",
                        note=_ratio(
                            _over(source["source_empty_s"], source["parquet_empty_s"]), "parquet"
                        ),
                    ),
                    _spread_bar(
                        source["parquet_empty_s"],
                        1000,
                        label="parquet source, empty folder",
                        color=PARQUET_SOURCE,
                        gid="floors.empty.parquet",
                    ),
                ],
            ),
        ],
        "ms",
        "fixed cost",
        horizontal=True,
    )
    fixed_ax.set_title("Fixed cost, with (almost) no rows", fontsize=11)
    add_captions(
        fig,
        [sink, batch, source],
        "A floor runs Spark's same plan into a Python sink or source that only counts (or "
        "replays batches decoded beforehand). sink-batch: Spark's triggerExecution per "
        "micro-batch, the median over micro-batches and runs; the query reading nothing "
        "starts from the latest offsets (parquet: an empty folder), start to end.",
    )
    return fig


# -- the command -------------------------------------------------------------------------------

CHARTS: dict[str, Callable[[Path], Figure]] = {
    "throughput": draw_throughput,
    "latency": draw_latency,
    "floors": draw_floors,
}


def save_svg(fig: Figure, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with mpl.rc_context({"svg.hashsalt": SVG_SALT, "svg.fonttype": "none"}):
        fig.savefig(path, format="svg", metadata=SVG_METADATA)


def draw(results: Path, images: Path, names: Sequence[str] = tuple(CHARTS)) -> list[Path]:
    """Draw the named charts from ``results`` into ``images``; every chart's parts are looked
    up before any file is written, so a missing part leaves the old images as they were."""
    figures = {name: CHARTS[name](results) for name in names}
    written = []
    for name, fig in figures.items():
        path = images / f"{name}.svg"
        save_svg(fig, path)
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.charts",
        description="Draw the benchmark charts (SVG) from the newest results of each part.",
    )
    p.add_argument("charts", nargs="*", metavar="CHART", help=f"one of: {', '.join(CHARTS)}")
    p.add_argument(
        "--results", type=Path, default=DEFAULT_OUT_DIR, help="the parts' JSON (default bench/out)"
    )
    p.add_argument(
        "--images",
        type=Path,
        default=DEFAULT_IMAGES_DIR,
        help="where the SVGs go (default docs/images)",
    )
    args = p.parse_args(argv)
    unknown = [c for c in args.charts if c not in CHARTS]
    if unknown:
        p.error(f"unknown chart {', '.join(unknown)}; known charts: {', '.join(CHARTS)}")
    try:
        written = draw(args.results, args.images, args.charts or tuple(CHARTS))
    except MissingResults as exc:
        print(f"python -m bench.charts: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
