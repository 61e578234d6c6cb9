"""Smoke test of the store benchmark: ``--quick`` sizes, in-process; checks shape, not speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _positive(spread: dict[str, float]) -> None:
    assert set(spread) == {"median", "min", "max"}
    assert 0 < spread["min"] <= spread["median"] <= spread["max"]


def test_store_benchmark_quick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))  # bench/ is a directory of the checkout, not installed
    from bench.cli import main

    out = tmp_path / "out"
    assert main(["store", "--quick", "--runs", "2", "--out", str(out)]) == 0

    printed = capsys.readouterr().out
    assert "machine:" in printed and "query_by_key" in printed

    data = json.loads((out / "store-latest.json").read_text())
    assert data["part"] == "store"
    assert data["options"]["quick"] is True and data["options"]["runs"] == 2
    assert {"nproc", "python", "numpy", "pyarrow"} <= set(data["machine"])
    assert not list((out / "tmp").iterdir()), "scratch stores must be removed"

    for name in ("put_small", "put_large"):
        put = data[name]
        assert len(put["runs"]) == 2 and put["encoded_bytes"] > 0
        for key in ("store_msgs_per_s", "store_mb_per_s", "raw_mb_per_s", "store_over_raw"):
            _positive(put[key])

    query = data["query"]
    assert query["index_entries"] == 2 * query["messages"]  # a key and a UNIQ_KEY each
    assert len(query["runs"]) == 2
    for key in ("p50_ms", "p90_ms", "p99_ms"):
        _positive(query[key])

    memory = data["memory"]
    assert len(memory["runs"]) == 2 and memory["encoded_bytes"] > 0
    _positive(memory["rss_anon_growth"])
    _positive(memory["rss_anon_growth_over_encoded"])
