"""``scale.svg``: each operation's cost against the number of queues (the ``scale`` part).

Two log-log panels over the same queue counts: the writer's operations (put + close, opens,
the open after kill -9) and the tools' (``verify``, ``queues``, ``topics``, ``lag``, the
console's overview), each beside the floors measured in the same run (one file per queue
created; every ConsumeQueue file listed and stat-ed) and RocketMQ 4.9.4's own store load of the
same store. Points are medians; whiskers span the runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from bench.chartkit import (
    FLOOR,
    ROCKETMQ,
    PartResults,
    add_captions,
    fmt_count,
    load_part,
    new_figure,
)

WRITER = (
    ("put_close_s", "put + close", "#1f77b4", "o"),
    ("open_s", "clean open", "#2ca02c", "s"),
    ("open_ro_s", "read-only open", "#98df8a", "s"),
    ("crash_open_s", "open after kill -9", "#9467bd", "D"),
)
TOOLS = (
    ("verify_s", "verify", "#1f77b4", "o"),
    ("queues_s", "queues", "#2ca02c", "s"),
    ("topics_s", "topics", "#98df8a", "s"),
    ("lag_s", "lag", "#9467bd", "D"),
    ("overview_s", "console overview", "#8c564b", "^"),
)
FLOORS = (
    ("floor_create_s", "floor: a file per queue created", FLOOR, "--"),
    ("floor_list_s", "floor: every file listed + stat", "#6baed6", ":"),
)


def _series(ax: Axes, by_q: dict[str, dict[str, Any]], key: str, **kw: Any) -> None:
    qs, med, lo, hi = [], [], [], []
    for q, d in sorted(by_q.items(), key=lambda kv: int(kv[0])):
        s = d.get(key)
        if not s:
            continue
        qs.append(int(q))
        med.append(s["median"])
        lo.append(s["median"] - s["min"])
        hi.append(s["max"] - s["median"])
    if qs:
        drawn = ax.errorbar(qs, med, yerr=[lo, hi], capsize=3, **kw)
        drawn.lines[0].set_gid(f"scale.{ax.get_label()}.{key}")


def _panel(
    ax: Axes,
    by_q: dict[str, dict[str, Any]],
    ops: tuple[tuple[str, str, str, str], ...],
    title: str,
) -> None:
    for key, label, color, marker in ops:
        _series(ax, by_q, key, label=label, color=color, marker=marker)
    for key, label, color, style in FLOORS:
        _series(ax, by_q, key, label=label, color=color, linestyle=style)
    _series(
        ax,
        by_q,
        "rocketmq_load_s",
        label="RocketMQ 4.9.4 store load()",
        color=ROCKETMQ,
        marker="x",
        linestyle="-.",
    )
    counts = sorted(int(q) for q in by_q)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(counts, [fmt_count(q) for q in counts])
    ax.minorticks_off()
    ax.set_xlabel("queues (topics of 4), the same messages")
    ax.set_ylabel("seconds (log)")
    ax.set_title(title, fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")


def draw_scale(results: Path) -> Figure:
    scale: PartResults = load_part(results, "scale")
    by_q: dict[str, dict[str, Any]] = scale["by_queues"]
    messages = next(iter(by_q.values()))["messages"]
    fig, (writer, tools) = new_figure(
        f"{messages:,} messages of 100 B over more and more queues: what each operation costs",
        "ab",
        5.5,
    )
    writer.set_label("writer")
    tools.set_label("tools")
    _panel(writer, by_q, WRITER, "The writer: put, open, recovery")
    _panel(tools, by_q, TOOLS, "The tools (each a fresh process, interpreter start included)")
    add_captions(
        fig,
        [scale],
        "Floors measured in the same run: creating one ConsumeQueue file per queue in "
        "RocketMQ's layout (directories made, sized to 6,000,000 bytes, first unit written), "
        "and listing and stat-ing every file. RocketMQ's load(): DefaultMessageStore.load() "
        "on the same store, which maps every file.",
    )
    return fig
