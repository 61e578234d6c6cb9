"""The dashboard picture's generator (bench/dashboard.py, bench/dashboard_run.py) without a run:
the panels' queries as asked of Prometheus, Grafana's legend format, and a picture drawn from
small hand-made results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="the picture needs matplotlib (the dev extra)")

from bench.dashboard import draw, legend
from bench.dashboard_run import DASHBOARD, RATE_INTERVAL, panel_queries


def test_every_panel_is_asked_with_grafanas_variables_replaced() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = panel_queries(dashboard)
    assert [p["title"] for p in panels] == [p["title"] for p in dashboard["panels"]]
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    assert exprs and not any("$" in e for e in exprs)
    assert any(f"[{RATE_INTERVAL}]" in e for e in exprs)
    assert all('job=~".*"' in e for e in exprs)


def test_legend_format() -> None:
    labels = {"consumer_group": "billing", "topic": "payments"}
    assert legend("{{consumer_group}} {{ topic }}", labels) == "billing payments"
    assert legend("", labels) == "consumer_group=billing, topic=payments"
    assert legend("{{broker}} used", {}) == "used"


def test_a_picture_from_hand_made_results(tmp_path: Path) -> None:
    start = 1_800_000_000.0
    series = [[start + 2 * i, str(i * 1.5)] for i in range(30)]
    results = {
        "start": start,
        "end": start + 60,
        "minutes": 1.0,
        "consumer_group": False,
        "commit": "0123456789ab",
        "machine": "machine: a test",
        "panels": [
            {
                "title": "lag",
                "type": "timeseries",
                "unit": "short",
                "grid": {"h": 8, "w": 12, "x": 0, "y": 0},
                "targets": [
                    {
                        "legend": "{{query}}",
                        "result": [{"metric": {"query": "ingest"}, "values": series}],
                    }
                ],
            },
            {
                "title": "verify",
                "type": "stat",
                "unit": "short",
                "grid": {"h": 8, "w": 12, "x": 12, "y": 0},
                "targets": [{"legend": "{{broker}}", "result": []}],
            },
            {
                "title": "empty",
                "type": "timeseries",
                "unit": "percentunit",
                "grid": {"h": 8, "w": 24, "x": 0, "y": 8},
                "targets": [],
            },
        ],
    }
    out = draw(results, tmp_path / "d.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width == 16 * 80 and height > 400
