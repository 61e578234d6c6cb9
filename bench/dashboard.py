"""The Grafana dashboard (conf/prometheus/rocketstore-dashboard.json) drawn from real data:
``python -m bench.dashboard`` (``make dashboard``) runs a store with a writer, a Spark query and
a stock consumer group for a few minutes under a real Prometheus (:mod:`bench.dashboard_run`),
keeps what every panel's PromQL returned over the run in ``bench/out/dashboard-<UTC time>.json``,
and draws ``docs/images/dashboard.png`` from it with matplotlib: each panel where the dashboard's
``gridPos`` puts it (24 columns; a row unit is a fixed height), its series labelled by the
panel's ``legendFormat``, in the panel's unit. ``--results FILE`` draws again from kept results.

Not a Grafana render (no Grafana runs here: Debian has no package of it): the layout, titles,
queries and legends are the dashboard's, the look is matplotlib's. A stat panel shows each
series' last value. The caption says when and at which commit the run was, and what ran.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from pathlib import Path
from typing import Any

from bench.common import DEFAULT_OUT_DIR, PROJECT_DIR, log, machine_info, machine_line

IMAGE = PROJECT_DIR / "docs" / "images" / "dashboard.png"
ROW_INCHES = 0.36  # one gridPos height unit
WIDTH_INCHES = 16.0
HEADER_INCHES = 0.9
FOOTER_INCHES = 0.7
UNITS = {
    "ops": (1.0, "msg/s"),
    "Bps": (1 / 1024, "KiB/s"),
    "short": (1.0, ""),
    "s": (1.0, "s"),
    "percentunit": (100.0, "%"),
}


def legend(fmt: str, labels: dict[str, str]) -> str:
    """Grafana's ``legendFormat``: ``{{name}}`` replaced by the series' label."""
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)
    return text.strip() or ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _caption(results: dict[str, Any]) -> str:
    when = dt.datetime.fromtimestamp(results["start"], dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    group = (
        "a stock RocketMQ 4.9.4 broker, producer and consumer group (billing on payments)"
        if results["consumer_group"]
        else "no consumer group (the stock RocketMQ kit could not run)"
    )
    return (
        f"Drawn with matplotlib from Prometheus' query_range of each panel's PromQL (step 2 s) "
        f"over a {results['minutes']:g}-minute run on {when} at commit {results['commit']}: "
        f"a writer (orders, clicks), the Spark query ingest (stopped at 45%, restarted at 70%), "
        f"{group}; rocketstore exporter scraped every 1 s.\n{results['machine']}"
    )


def draw(results: dict[str, Any], out: Path) -> Path:
    """Draw ``results`` (what :func:`bench.dashboard_run.run` returned) into ``out``."""
    import matplotlib as mpl

    mpl.use("Agg")
    from matplotlib.figure import Figure

    panels = results["panels"]
    rows = max(p["grid"]["y"] + p["grid"]["h"] for p in panels)
    height = HEADER_INCHES + rows * ROW_INCHES + FOOTER_INCHES
    fig = Figure(figsize=(WIDTH_INCHES, height), dpi=80)
    fig.text(
        0.01,
        1 - 0.35 / height,
        "rocketstore (conf/prometheus/rocketstore-dashboard.json)",
        fontsize=15,
        weight="bold",
        va="top",
    )
    start = results["start"]
    for panel in panels:
        g = panel["grid"]
        left = g["x"] / 24 + 0.035
        width = g["w"] / 24 - 0.055
        top = (HEADER_INCHES + g["y"] * ROW_INCHES + 0.35) / height
        h = (g["h"] * ROW_INCHES - 0.85) / height
        ax = fig.add_axes((left, 1 - top - h, width, h))
        ax.set_title(panel["title"], fontsize=10, loc="left")
        scale, unit = UNITS.get(panel["unit"], (1.0, panel["unit"]))
        series = [
            (legend(t["legend"], s["metric"]), s["values"])
            for t in panel["targets"]
            for s in t["result"]
        ]
        if panel["type"] == "stat":
            ax.set_axis_off()
            text = "\n".join(f"{name}: {float(values[-1][1]) * scale:g}" for name, values in series)
            ax.text(
                0.5,
                0.5,
                text or "No data",
                ha="center",
                va="center",
                fontsize=14,
                transform=ax.transAxes,
            )
            continue
        for name, values in series:
            xs = [(float(t) - start) / 60 for t, _ in values]
            ys = [float(v) * scale for _, v in values]
            ax.plot(xs, ys, linewidth=1.2, label=name)
        if not series:
            ax.text(
                0.5, 0.5, "No data", ha="center", va="center", color="grey", transform=ax.transAxes
            )
        ax.set_xlim(0, results["minutes"])
        ax.set_xlabel("minutes into the run", fontsize=8)
        if unit:
            ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=7, loc="upper left", frameon=False, ncol=2)
    fig.text(0.01, 0.25 / height, _caption(results), fontsize=8, va="bottom", wrap=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"Software": None})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard", description=__doc__)
    parser.add_argument("--minutes", type=float, default=4.0, help="length of the run")
    parser.add_argument("--results", type=Path, help="draw from these kept results, no run")
    parser.add_argument("--out", type=Path, default=IMAGE, help="the image (PNG)")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_OUT_DIR / "tmp")
    args = parser.parse_args(argv)
    if args.results is not None:
        results = json.loads(args.results.read_text())
    else:
        import tempfile

        from bench.dashboard_run import run

        machine = machine_info()
        args.work_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="dashboard-", dir=args.work_dir) as work:
            results = run(args.minutes, Path(work))
        results["commit"] = machine["git_commit"]
        results["machine"] = machine_line(machine)
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        kept = DEFAULT_OUT_DIR / f"dashboard-{stamp}.json"
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(json.dumps(results))
        log(f"dashboard: results in {kept}")
    log(f"dashboard: drew {draw(results, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
