"""``floors.svg``: the sink and the source beside their floors (the ``sink``, ``sink-batch``
and ``source`` parts).

Five panels: the sink's throughput and CPU per million rows, each of its two faces beside the
floor that runs Spark's same plan into a Python sink that only counts; the source's throughput
and CPU beside the replay of batches decoded beforehand; and the fixed cost of a micro-batch or
a query with almost no rows, beside parquet's. Bars are medians; whiskers span the runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from bench.chartkit import (
    FLOOR,
    FLOOR_SOURCE,
    PARQUET,
    PARQUET_SOURCE,
    RAW,
    Bar,
    PartResults,
    add_captions,
    fmt_count,
    grouped_bars,
    list_bar,
    load_part,
    new_figure,
    ratio_label,
    ratio_spread,
    spread_bar,
)
from bench.common import median

# The sink's two faces, each with its floor: (group label, the sink's kind, its floor's kind).
SINK_FACES = (
    ("foreachBatch", "rocketstore", "floor-fb"),
    ("data source\nwriter", "rocketstore-ds", "floor-ds"),
)
SOURCE_FLOOR = "floor: replay of decoded batches"


def draw_floors(results: Path) -> Figure:
    sink = load_part(results, "sink")
    batch = load_part(results, "sink-batch")
    source = load_part(results, "source")
    fig, (sink_ax, sink_cpu_ax, source_ax, source_cpu_ax, fixed_ax) = new_figure(
        "What the sink and the source cost beyond Spark's own floor", "ace;bde", 10
    )
    _sink_speed(sink_ax, sink)
    _sink_cpu(sink_cpu_ax, sink)
    _source_speed(source_ax, source)
    _source_cpu(source_cpu_ax, source)
    _fixed_cost(fixed_ax, batch, source)
    add_captions(
        fig,
        [sink, batch, source],
        "A floor runs Spark's same plan into a Python sink or source that only counts (or "
        "replays batches decoded beforehand). sink-batch: Spark's triggerExecution per "
        "micro-batch, the median over micro-batches and runs; the query reading nothing "
        "starts from the latest offsets (parquet: an empty folder), start to end.",
    )
    return fig


def _against_floors(
    values: dict[str, list[float]], what: str, note: Callable[[float, float], str]
) -> list[tuple[str, list[Bar]]]:
    """One group per face of the sink: its bar (noted with ``note(sink, floor)`` of the
    medians) beside its floor's."""
    return [
        (
            face,
            [
                list_bar(
                    values[name],
                    label="rocketstore sink",
                    gid=f"floors.{what}.{name}",
                    note=note(median(values[name]), median(values[floor])),
                ),
                list_bar(
                    values[floor],
                    label="its floor (same plan, counts)",
                    color=FLOOR,
                    gid=f"floors.{what}.{floor}",
                ),
            ],
        )
        for face, name, floor in SINK_FACES
    ]


def _sink_speed(ax: Axes, sink: PartResults) -> None:
    """Each face of the sink in rows/s (wall clock) beside its floor."""
    rows = int(sink["rows"])
    speed = {k: [rows / w for w in v] for k, v in sink["wall_s"].items()}
    grouped_bars(
        ax,
        _against_floors(speed, "sink", lambda sink, floor: f"{sink / floor:.2f} x floor"),
        "rows/s",
        "throughput",
    )
    ax.set_title(f"Sink: {fmt_count(rows)} rows x 100 B, wall clock", fontsize=11)


def _sink_cpu(ax: Axes, sink: PartResults) -> None:
    """Each face of the sink in CPU seconds per million rows beside its floor, and the native
    put alone."""
    per_m = 1_000_000 / int(sink["rows"])
    cpu = {k: [c * per_m for c in v] for k, v in sink["cpu_s"].items()}
    grouped_bars(
        ax,
        [
            *_against_floors(
                cpu, "sink_cpu", lambda sink, floor: f"+{sink - floor:.2f} over floor"
            ),
            (
                "native put,\none thread",
                [
                    list_bar(
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
    ax.set_title("Sink: CPU of every process, lower is better", fontsize=11)


def _source_speed(ax: Axes, source: PartResults) -> None:
    """The streaming source in rows/s beside its floor, and the batch read's floor."""
    grouped_bars(
        ax,
        [
            (
                "streaming",
                [
                    spread_bar(
                        source["source_rows_per_s"],
                        label="rocketstore source",
                        gid="floors.source.source",
                        note=ratio_label(source.data.get("source_over_floor"), "floor"),
                    ),
                    spread_bar(
                        source["replay_stream_rows_per_s"],
                        label=SOURCE_FLOOR,
                        color=FLOOR,
                        gid="floors.source.replay_stream",
                    ),
                ],
            ),
            (
                "batch read",
                [
                    spread_bar(
                        source["replay_rows_per_s"],
                        label=SOURCE_FLOOR,
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
    ax.set_title(f"Source: {fmt_count(n)} rows into noop, wall clock", fontsize=11)


def _source_cpu(ax: Axes, source: PartResults) -> None:
    """The streaming source in CPU seconds per million rows beside its floor, and the batch
    read's floor."""
    n = int(source["messages"])

    def per_million(kind: str) -> list[float]:
        return [float(run[f"{kind}_cpu_s"]) * 1_000_000 / n for run in source["runs"]]

    grouped_bars(
        ax,
        [
            (
                "streaming",
                [
                    list_bar(
                        per_million("source"),
                        label="rocketstore source",
                        gid="floors.source_cpu.source",
                    ),
                    list_bar(
                        per_million("replay_stream"),
                        label=SOURCE_FLOOR,
                        color=FLOOR,
                        gid="floors.source_cpu.replay_stream",
                    ),
                ],
            ),
            (
                "batch read",
                [
                    list_bar(
                        per_million("replay"),
                        label=SOURCE_FLOOR,
                        color=FLOOR,
                        gid="floors.source_cpu.replay",
                    ),
                ],
            ),
        ],
        "",
        "CPU s per million rows",
    )
    ax.set_title("Source: CPU of every process, lower is better", fontsize=11)


def _fixed_cost(ax: Axes, batch: PartResults, source: PartResults) -> None:
    """A 100-row micro-batch of the sink (into an empty and a large store) and a query reading
    nothing, each beside parquet's."""
    per_batch: dict[str, list[float]] = batch["ms_per_batch"]
    empty, parquet_batch = median(per_batch["empty"]), median(per_batch["parquet"])
    grouped_bars(
        ax,
        [
            (
                "sink, 100-row\nmicro-batch",
                [
                    list_bar(
                        per_batch["empty"],
                        label="rocketstore sink, empty store",
                        gid="floors.batch.empty",
                        note=f"{empty / parquet_batch:.2f} x parquet",
                    ),
                    list_bar(
                        per_batch["large"],
                        label=f"rocketstore sink, store of {fmt_count(int(batch['large']))} messages",
                        color="#08519c",
                        gid="floors.batch.large",
                        note=f"{median(per_batch['large']) / empty:.2f} x empty",
                    ),
                    list_bar(
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
                    spread_bar(
                        source["source_empty_s"],
                        1000,
                        label="rocketstore source, from the latest offsets",
                        color=FLOOR_SOURCE,
                        gid="floors.empty.source",
                        note=ratio_label(
                            ratio_spread(source["source_empty_s"], source["parquet_empty_s"]),
                            "parquet",
                        ),
                    ),
                    spread_bar(
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
    ax.set_title("Fixed cost, with (almost) no rows", fontsize=11)
