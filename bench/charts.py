"""The benchmark figures as charts: ``python -m bench.charts`` (``make charts``) reads the newest
results of each part from ``bench/out/`` (or ``--results DIR``) and draws five SVGs into
``docs/images/``:

- ``throughput.svg``: the store's put throughput beside its same-run baselines (the raw mmap
  write and one ``os.write`` per message), the Spark sink and source beside Spark's parquet
  sink and source, and the RocketMQ 4.9.4 store's put rates as reference marks;
- ``latency.svg``: the latency part's percentiles at its steady rate, and along its ramp;
- ``floors.svg``: the sink and the source beside their floors (what any Python sink or source
  costs before doing anything), and the fixed cost of a micro-batch or query with almost no
  rows (:mod:`bench.chart_floors`);
- ``scale.svg``: each operation's cost against the number of queues (:mod:`bench.chart_scale`);
- ``tier.svg``: tiered storage against the targets of its benchmark (:mod:`bench.chart_tier`).

Every chart ends with one caption line per part it draws from: the date of the run, the
machine's load average over it, how many runs each figure is the median of, and the commit;
and a line naming the machine. Bars are medians; whiskers span the runs' min .. max.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib as mpl
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator

from bench.chart_floors import draw_floors
from bench.chart_scale import draw_scale
from bench.chart_tier import draw_tier
from bench.chartkit import (
    DEFAULT_IMAGES_DIR,
    PARQUET,
    RAW,
    ROCKETMQ,
    ROCKETMQ_REFERENCE,
    ROCKETSTORE,
    SVG_METADATA,
    SVG_SALT,
    Bar,
    MissingResults,
    PartResults,
    add_captions,
    fmt_count,
    fmt_size,
    grouped_bars,
    human,
    list_bar,
    load_part,
    new_figure,
    ratio_label,
    spread_bar,
)
from bench.common import DEFAULT_OUT_DIR, MB, median
from bench.latency import TARGET_P50_MS

# -- throughput.svg ----------------------------------------------------------------------------


def draw_throughput(results: Path) -> Figure:
    store = load_part(results, "store")
    core = load_part(results, "core")
    sink = load_part(results, "sink")
    source = load_part(results, "source")
    fig, (mbs, msgs, sinks, sources) = new_figure(
        "rocketstore throughput beside same-run baselines", "ab;cd", 10
    )
    _put_bandwidth(mbs, store)
    _put_rates(msgs, store, core)
    _sink_speed(sinks, sink)
    _source_speed(sources, source)
    add_captions(
        fig,
        [store, core, sink, source],
        "Hatched: the RocketMQ 4.9.4 store (DefaultMessageStore, ASYNC_FLUSH, with dispatch) "
        "as measured earlier on this machine, a reference mark, not from the runs above.",
    )
    return fig


def _put_bandwidth(ax: Axes, store: PartResults) -> None:
    """The store's batch puts (small and large bodies) in MB/s beside the raw mmap write."""
    groups = []
    for key in ("put_small", "put_large"):
        put = store[key]
        name = f"{fmt_count(int(put['messages']))} x {fmt_size(int(put['body_bytes']))}"
        groups.append(
            (
                f"batch put, {name}\n({put['encoded_bytes'] / MB:,.0f} MB encoded)",
                [
                    spread_bar(
                        put["store_mb_per_s"],
                        label="rocketstore put_batch",
                        color=ROCKETSTORE,
                        gid=f"throughput.{key}.store_mb_per_s",
                        note=ratio_label(put.get("store_over_raw"), "raw"),
                    ),
                    spread_bar(
                        put["raw_mb_per_s"],
                        label="raw mmap write of the same bytes",
                        color=RAW,
                        gid=f"throughput.{key}.raw_mb_per_s",
                    ),
                ],
            )
        )
    grouped_bars(ax, groups, "MB/s", "bandwidth")
    ax.set_title("Store: batch put against a raw write, one core", fontsize=11)


def _put_rates(ax: Axes, store: PartResults, core: PartResults) -> None:
    """Batch and single puts in messages/s beside RocketMQ's store (reference marks) and one
    ``os.write`` per message."""
    small = store["put_small"]
    single = core["single"]
    grouped_bars(
        ax,
        [
            (
                f"batch put, {fmt_count(int(small['messages']))} x {fmt_size(int(small['body_bytes']))}",
                [
                    spread_bar(
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
                f"single put, {fmt_count(int(single['messages']))} calls of 100 B",
                [
                    spread_bar(
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
                    spread_bar(
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
    ax.set_title("Store: puts against RocketMQ's store and raw writes, one core", fontsize=11)


def _sink_speed(ax: Axes, sink: PartResults) -> None:
    """The Spark sink's two faces in rows/s beside Spark's parquet sink."""
    rows = int(sink["rows"])
    speed = {k: [rows / w for w in v] for k, v in sink["wall_s"].items()}
    parquet = median(speed["parquet"])
    grouped_bars(
        ax,
        [
            (
                "foreachBatch",
                [
                    list_bar(
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
                    list_bar(
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
                    list_bar(
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
    ax.set_title(
        f"Spark sink: {fmt_count(rows)} rows x 100 B, local[2], against parquet", fontsize=11
    )


def _source_speed(ax: Axes, source: PartResults) -> None:
    """The Spark source in rows/s beside Spark's parquet source."""
    n = int(source["messages"])
    grouped_bars(
        ax,
        [
            (
                'readStream.format("rocketstore")',
                [
                    spread_bar(
                        source["source_rows_per_s"],
                        label="rocketstore source",
                        gid="throughput.source.source",
                        note=ratio_label(source.data.get("source_over_parquet"), "parquet"),
                    )
                ],
            ),
            (
                "readStream.parquet",
                [
                    spread_bar(
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
    ax.set_title(
        f"Spark source: {fmt_count(n)} rows x {source['body_bytes']} B into noop, against parquet",
        fontsize=11,
    )


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
                bars.append(list_bar(values, label=label, color=color, gid=f"latency.{key}.{q}"))
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


# -- the command -------------------------------------------------------------------------------

CHARTS: dict[str, Callable[[Path], Figure]] = {
    "throughput": draw_throughput,
    "latency": draw_latency,
    "floors": draw_floors,
    "scale": draw_scale,
    "tier": draw_tier,
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
