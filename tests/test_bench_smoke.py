"""Smoke tests of the benchmarks: ``--quick`` sizes, in-process; they check shape, not speed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

# Each part records the checkout's git revision and the startup part times fresh Python
# processes; the parts are looked up by name (bench/cli.py), which tests/conftest.py's walk
# does not follow: the heavy tier's mark is given here.
pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parent.parent


def _positive(spread: dict[str, float]) -> None:
    assert set(spread) == {"median", "min", "max"}
    assert 0 < spread["min"] <= spread["median"] <= spread["max"]


def run_quick(part: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``python -m bench PART --quick --runs 2`` in-process; the part's JSON, after checking
    the options it records and that its scratch space is gone."""
    monkeypatch.syspath_prepend(str(ROOT))  # bench/ is a directory of the checkout, not installed
    from bench.cli import main

    out = tmp_path / "out"
    assert main([part, "--quick", "--runs", "2", "--out", str(out)]) == 0
    data: dict[str, Any] = json.loads((out / f"{part}-latest.json").read_text())
    assert data["part"] == part
    assert data["options"]["quick"] is True and data["options"]["runs"] == 2
    # the load average as the part started and ended (1, 5 and 15 minutes): what the charts show
    assert [len(data["part_load_avg"][k]) for k in ("start", "end")] == [3, 3]
    assert not list((out / "tmp").iterdir()), "scratch stores must be removed"
    return data


def test_store_benchmark_quick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = run_quick("store", tmp_path, monkeypatch)
    printed = capsys.readouterr().out
    assert "machine:" in printed and "query_by_key" in printed
    assert {"nproc", "python", "numpy", "pyarrow"} <= set(data["machine"])

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


def test_recovery_benchmark_quick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = run_quick("recovery", tmp_path, monkeypatch)
    printed = capsys.readouterr().out
    assert "open after kill -9" in printed and "SYNC_FLUSH" in printed

    recovery = data["recovery"]
    assert len(recovery["runs"]) == 2
    for run in recovery["runs"]:
        assert run["abnormal_report"]["abortFileFound"] is True
        assert run["clean_report"]["abortFileFound"] is False
        assert run["commitlog_bytes"] >= run["acked_end"] > 0
    assert recovery["runs"][0]["commitlog_bytes"] >= recovery["fill_bytes"]
    for key in ("abnormal_open_s", "clean_open_s", "tail_read_s"):
        _positive(recovery[key])

    puts = data["puts"]
    assert [p["batch"] for p in puts] == [1, 100, 10_000]
    for p in puts:
        assert len(p["runs"]) == 2 and p["encoded_bytes"] > 0
        for key in ("sync_msgs_per_s", "async_msgs_per_s", "raw_msgs_per_s", "sync_over_raw"):
            _positive(p[key])


def test_core_benchmark_quick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.cli import main

    out = tmp_path / "out"
    assert main(["core", "--quick", "--runs", "2", "--out", str(out)]) == 0

    printed = capsys.readouterr().out
    assert "single put" in printed and "clean open" in printed and "rebuild" in printed

    data = json.loads((out / "core-latest.json").read_text())
    assert data["part"] == "core"
    assert not list((out / "tmp").iterdir()), "scratch stores must be removed"
    single = data["single"]
    assert len(single["runs"]) == 2 and single["messages"] == data["sizes"]["single_puts"]
    _positive(single["put_msgs_per_s"])
    _positive(single["write_msgs_per_s"])
    opened = data["open"]
    assert len(opened["opens"]) == len(opened["rebuilds"]) == 2
    for key in ("open_big_ms", "open_small_ms", "rebuild_records_per_s", "rebuild_read_mb_per_s"):
        _positive(opened[key])


def test_decode_benchmark_quick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.cli import main

    out = tmp_path / "out"
    assert main(["decode", "--quick", "--runs", "2", "--out", str(out), "--no-pin"]) == 0
    assert "into the source's columns" in capsys.readouterr().out
    data = json.loads((out / "decode-latest.json").read_text())
    assert data["messages"] == 50_000 and len(data["runs"]) == 2
    assert len(data["load_avg_before"]) == 3
    for key in ("decode_msgs_per_s", "raw_msgs_per_s", "ipc_msgs_per_s", "decode_over_raw"):
        _positive(data[key])
    assert not list((out / "tmp").iterdir()), "scratch stores must be removed"


def test_segindex_benchmark_quick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.cli import main

    out = tmp_path / "out"
    assert main(["segindex", "--quick", "--runs", "2", "--out", str(out), "--no-pin"]) == 0
    assert "build the index of a 8 MiB segment" in capsys.readouterr().out
    data = json.loads((out / "segindex-latest.json").read_text())
    assert data["records"] > 0 and 0 < data["data_end"] <= data["segment_bytes"]
    assert len(data["runs"]) == 2
    for key in ("build_records_per_s", "parse_records_per_s", "build_over_raw"):
        _positive(data[key])
    assert not list((out / "tmp").iterdir()), "scratch stores must be removed"


def test_startup_benchmark_quick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = run_quick("startup", tmp_path, monkeypatch)
    assert "rocketstore --help" in capsys.readouterr().out
    assert data["runs"] == 2
    for name in ("python", "help", "queues"):
        assert len(data[name]["runs"]) == 2
        _positive(data[name]["seconds"])
    for name in ("help", "queues"):  # the child reports its own peak RSS
        _positive(data[name]["max_rss_kib"])


def test_brokers_benchmark_planning_reads_the_brokers_that_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``brokers`` part's planning figures (its Spark figures need a session: run
    ``python -m bench brokers --quick``): the brokers each plan read, per case."""
    monkeypatch.syspath_prepend(str(ROOT))
    from bench import brokers

    brokers.build_root(tmp_path / "root", 6, 20)
    got = brokers.planning(tmp_path / "root", 6, 3)
    assert {c: got[c]["brokers_read_per_plan"] for c in brokers.CHANGED} == {
        "none": 0,
        "one": 1,
        "all": 6,
    }
    assert all(len(got[c]["seconds"]) == 3 for c in brokers.CHANGED)


def test_firsttouch_benchmark_quick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = run_quick("firsttouch", tmp_path, monkeypatch)
    assert len(data["runs"]) == 2
    for run in data["runs"]:
        assert set(run) == {"sync", "dirty", "populated", "floor"}
        assert all(r["seconds"] > 0 for r in run.values())
        assert run["populated"]["populate_seconds"] > 0
        # what the machine held when each figure started
        assert set(run["dirty"]) == set(run["sync"]) == {"seconds", "Dirty", "Writeback"}
    assert data["vm"]["dirty_ratio"] > 0
