"""``tier.svg``: tiered storage against its targets (the ``tier`` part, bench/tier.py).

One bar per target of the part's latest run, drawn as the share of its target reached: a
ratio measured against its baseline over the ratio asked for (``>= x`` targets), or the limit
over the measurement (``< x`` targets: a key look-up's time, the bytes a read fetches), so that
1.0 is the target and a bar past it is met. Each bar is labelled with the measurement itself;
whiskers span the runs where the part took several.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from bench.chartkit import add_captions, load_part, new_figure

MET = "#2f7d3b"
MISSED = "#c0651a"


# (id, label, share of the target: median, min, max; what was measured); the id names the bar
# in the SVG (``tier.<id>``).
Target = tuple[str, str, float, float, float, str]


def _targets(r: dict[str, Any]) -> list[Target]:
    """One entry per target the results hold (see the module docstring)."""
    out: list[Target] = []

    def at_least(tid: str, label: str, spread: dict[str, float], want: float, text: str) -> None:
        share = spread["median"] / want
        out.append((tid, label, share, spread["min"] / want, spread["max"] / want, text))

    def at_most(tid: str, label: str, spread: dict[str, float], limit: float, text: str) -> None:
        # A lower measurement is better: the largest share is the smallest measurement.
        share = limit / spread["median"]
        out.append((tid, label, share, limit / spread["max"], limit / spread["min"], text))

    def one(x: float) -> dict[str, float]:
        return {"median": x, "min": x, "max": x}

    hot = r.get("hot")
    if hot:
        # Runs before the uploader was kept off the puts' CPU have "ratio" only.
        ratio = hot.get("ratio_apart", hot.get("ratio"))
        label = "puts, tier on / off\n(>= 0.95 x)"
        at_least("hot", label, ratio, 0.95, f"{ratio['median']:.2f} x")
    cold = r.get("cold")
    if cold:
        spark = cold.get("spark")
        if spark:
            x = spark["cold_over_local"]
            label = "cold read through Spark,\nover local (>= 0.5 x)"
            at_least("spark", label, one(x), 0.5, f"{x:.2f} x")
        local = cold["cold_over_local"]
        label = "cold read, executors only,\nover local (>= 0.5 x)"
        at_least("cold", label, local, 0.5, f"{local['median']:.2f} x")
        floor = cold["cold_over_floor"]
        label = "cold read over raw\nranged GETs (>= 0.7 x)"
        at_least("floor", label, floor, 0.7, f"{floor['median']:.2f} x")
    wide = r.get("wide")
    if wide:
        x = wide["amplification"]
        label = "one queue of 4,000: bytes\nfetched over its own (< 2 x)"
        at_most("wide", label, one(x), 2.0, f"{x:.2f} x")
    keys = r.get("keys")
    if keys:
        ms = keys["query_key_ms"]
        at_most("keys", "key look-up, cold\n(< 200 ms)", ms, 200.0, f"{ms['median']:.0f} ms")
    bounded = r.get("bounded")
    if bounded:
        x = bounded["tier_over_local"]
        text = f"{x:.1f} x after {bounded['seconds']:.0f} s"
        at_least("bounded", "tier over local disk\n(>= 10 x)", one(x), 10.0, text)
    pace = r.get("pace")
    if pace:
        x = pace["pace"]
        label = "upload over a writer\nat full rate (>= 0.95 x)"
        at_least("pace", label, one(x), 0.95, f"{x:.2f} x")
    return out


def draw_tier(results: Path) -> Figure:
    r = load_part(results, "tier")
    fig, (ax,) = new_figure("Tiered storage against its targets (share of each target)", "a", 6)
    rows = _targets(r.data)[::-1]  # the first target on top
    shares = [t[2] for t in rows]
    ys = list(range(len(rows)))
    bars = ax.barh(
        ys,
        shares,
        color=[MET if x >= 1.0 else MISSED for x in shares],
        xerr=[[t[2] - t[3] for t in rows], [t[4] - t[2] for t in rows]],
        capsize=3,
    )
    for bar, t in zip(bars, rows, strict=True):
        bar.set_gid(f"tier.{t[0]}")
    ax.axvline(1.0, color="#222", linewidth=1, linestyle="--")
    ax.set_yticks(ys, [t[1] for t in rows], fontsize=8)
    ax.set_xlabel("share of the target reached (1.0: the target; past it: met)")
    for y, t in zip(ys, rows, strict=True):
        ax.text(max(t[2], t[4]) + 0.03, y, t[5], va="center", fontsize=8)  # past the whisker
    ax.set_xlim(0, max(1.4, max(shares, default=1.0) * 1.3))
    add_captions(fig, [r], "Green: met; orange: missed. Whiskers: min .. max over the runs.")
    return fig
