"""Smoke test of the source benchmark (``python -m bench source --quick``), in-process with the
test session: it checks the shape of the results and that every side read every row, not the
speed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def test_source_benchmark_quick(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))  # bench/ is a directory of the checkout
    monkeypatch.chdir(ROOT)  # Spark's Python workers import bench.spark_source from here
    from bench.cli import main

    out = tmp_path / "out"
    assert main(["source", "--quick", "--runs", "1", "--out", str(out)]) == 0
    assert "replay: Python data source" in capsys.readouterr().out
    data = json.loads((out / "source-latest.json").read_text())
    assert data["part"] == "source" and data["messages"] == 200_000
    assert data["commitlog_bytes"] > 200_000 * 100
    (run,) = data["runs"]
    assert sorted(run["order"]) == ["parquet", "replay", "replay_stream", "source"]
    for key in ("source_s", "parquet_s", "replay_s", "replay_stream_s", "source_over_floor"):
        assert run[key] > 0
    assert not list((out / "tmp").iterdir()), "scratch stores must be removed"
    # The test session is the bench's session: it must still be usable.
    assert spark.range(3).count() == 3
