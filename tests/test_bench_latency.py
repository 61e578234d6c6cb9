"""The latency benchmark's arithmetic and its reader's measuring function (not its figures: its
``--quick`` run takes too long for the suite, see bench/README.md)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def latency(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(ROOT))  # bench/ is a directory of the checkout
    from bench import latency

    return latency


def test_window_is_the_rows_generated_after_the_warm_up(latency: Any) -> None:
    w = latency.Window(rate=10_000, warmup_s=10, window_s=60)
    assert (w.first, w.end, w.size) == (100_000, 700_000, 600_000)


def test_percentiles_are_observed_values_by_nearest_rank(latency: Any) -> None:
    values = np.arange(1, 101, dtype=np.int64)[::-1].copy()
    assert latency.exact_percentiles(values) == {"p50": 50, "p90": 90, "p99": 99, "max": 100}
    assert latency.exact_percentiles(np.array([7, 3000], dtype=np.int64)) == {
        "p50": 7,
        "p90": 3000,
        "p99": 3000,
        "max": 3000,
    }
    assert latency.exact_percentiles(np.empty(0, dtype=np.int64)) == {}


def test_drift_compares_the_first_and_last_fifth_of_the_window(latency: Any) -> None:
    w = latency.Window(rate=10, warmup_s=1, window_s=10)  # sequence numbers 10 .. 109
    seq = np.arange(10, 110, dtype=np.int64)
    growing = 100 + (seq - 10) * 10  # each row waits 10 ms longer than the one before
    # first fifth: rows 10..29, median wait 195 ms; last fifth: rows 90..109, median 995 ms
    assert latency.drift_ms(seq, growing, w) == 800.0
    flat = np.full(100, 250, dtype=np.int64)
    assert latency.drift_ms(seq, flat, w) == 0.0
    head_only = seq < 50
    assert latency.drift_ms(seq[head_only], flat[head_only], w) is None


def test_sustained_needs_every_row_a_bounded_p50_and_no_growing_backlog(latency: Any) -> None:
    assert latency.sustained(True, 4_999.0, 1_000.0) == []
    (why,) = latency.sustained(False, 100.0, 0.0)
    assert "drain" in why
    (why,) = latency.sustained(True, 5_000.0, 0.0)
    assert "5,000 ms" in why and "p50" in why
    (why,) = latency.sustained(True, 100.0, 1_001.0)
    assert "backlog grows" in why
    assert len(latency.sustained(True, None, None)) == 2


def _frame(spark: Any, rows: list[tuple[list[str], dt.datetime, dict[str, str]]]) -> Any:
    return spark.createDataFrame(
        rows, "keys array<string>, bornTimestamp timestamp, properties map<string,string>"
    )


def test_recorder_measures_each_row_from_the_moment_its_batch_is_seen(
    spark: Any, latency: Any
) -> None:
    rate, start = 1_000, 1_700_000_000_000  # genTs = start + seq ms at 1000 rows/s
    born = dt.datetime(2023, 11, 14, 22, 13, 21, 500_000, tzinfo=dt.UTC)
    born_ms = int(born.timestamp() * 1000)
    window = latency.Window(rate=rate, warmup_s=1, window_s=2)  # sequence numbers 1000 .. 2999
    rows = [([str(s)], born, {"genTs": str(start + s), "x": "y"}) for s in (5, 1000, 2999, 3000)]
    recorder = latency.Recorder(window)
    recorder(_frame(spark, rows), 7)

    (batch,) = recorder.batches
    assert batch["batch"] == 7 and batch["rows"] == 4 and batch["read_ms"] >= 0
    see = batch["see_ms"]
    assert recorder.counts() == (4, 2, start)
    seq, born_lat, gen_lat = recorder.arrays()
    assert seq.tolist() == [1000, 2999]
    assert born_lat.tolist() == [see - born_ms, see - born_ms]
    assert gen_lat.tolist() == [see - start - 1000, see - start - 2999]


def test_recorder_refuses_a_row_the_benchmark_did_not_write(spark: Any, latency: Any) -> None:
    born = dt.datetime(2023, 11, 14, tzinfo=dt.UTC)
    recorder = latency.Recorder(latency.Window(rate=10, warmup_s=0, window_s=1))
    with pytest.raises(AssertionError, match="without gen"):
        recorder(_frame(spark, [(["1"], born, {"other": "1"})]), 0)
    assert recorder.counts() == (0, 0, None)
