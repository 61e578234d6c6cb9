"""The streaming append of a shuffled ``foreachBatch`` task (``sink.append.append_stream``,
``sink.writer.append_shuffled``) and the prefetching thread it runs beside
(``sink.prefetch``): the same rows land, with the same UNIQ_KEYs, as the whole-table
``append`` gives them, and a re-run finds what either stored."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from test_sink_append import CONFIG, FP, rows, stored

from pipeline.errors import InvalidMessageError, StoreError
from pipeline.store import MessageStore
from sink.append import FAILPOINT_ENV, SinkFailpoint, SinkReplayError, append, append_stream
from sink.prefetch import prefetched
from sink.rows import ROUTED
from sink.settings import SinkSettings
from sink.writer import append_shuffled


def parts(table: pa.Table, size: int) -> Iterator[pa.Table]:
    for start in range(0, table.num_rows, size):
        yield table.slice(start, size)


def stream(path: Path, table: pa.Table, size: int = 7, **kw: object) -> object:
    args: dict[str, object] = {"sink_fp": FP, "batch_id": 7, "slot": 2, "lock_timeout_ms": 5000}
    args.update(kw)
    return append_stream(path, CONFIG, parts(table, size), **args)  # type: ignore[arg-type]


def uniq_of(path: Path) -> dict[bytes, str]:
    with MessageStore(path, CONFIG, read_only=True) as s:
        got: dict[bytes, str] = {}
        for info in s.queue_infos("orders"):
            for m in s.get_messages("orders", info.queue_id, 0, 10_000).messages:
                got[m.body] = m.properties["UNIQ_KEY"]
    return got


def test_a_stream_stores_what_a_whole_append_stores(tmp_path: Path) -> None:
    streamed = stream(tmp_path / "a", rows(50))
    whole = append(
        tmp_path / "b", CONFIG, rows(50), sink_fp=FP, batch_id=7, slot=2, lock_timeout_ms=5000
    )
    assert (streamed.rows, streamed.appended, streamed.skipped) == (50, 50, 0)  # type: ignore[attr-defined]
    assert stored(tmp_path / "a") == [b"body-%d" % i for i in range(50)]
    assert uniq_of(tmp_path / "a") == uniq_of(tmp_path / "b")
    assert streamed.bytes == whole.bytes  # type: ignore[attr-defined]


def test_nothing_to_stream_takes_no_lock(tmp_path: Path) -> None:
    assert (
        append_stream(
            tmp_path / "x", CONFIG, iter([]), sink_fp=FP, batch_id=7, slot=2, lock_timeout_ms=0
        )
        is None
    )
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("landed", [1, 23, 50])
def test_a_rerun_of_a_stream_appends_what_did_not_land(tmp_path: Path, landed: int) -> None:
    path = tmp_path / "broker-0"
    append(path, CONFIG, rows(landed), sink_fp=FP, batch_id=7, slot=2, lock_timeout_ms=5000)
    again = stream(path, rows(50))
    assert (again.skipped, again.appended) == (landed, 50 - landed)  # type: ignore[attr-defined]
    assert stored(path) == [b"body-%d" % i for i in range(50)]
    again = stream(path, rows(50))
    assert (again.skipped, again.appended) == (50, 0)  # type: ignore[attr-defined]


def test_a_failed_stream_leaves_a_prefix_either_path_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "fired"
    monkeypatch.setenv(FAILPOINT_ENV, f"after_chunk:3:{log}")
    for path, retry in ((tmp_path / "a", stream), (tmp_path / "b", None)):
        with pytest.raises(SinkFailpoint):
            stream(path, rows(100), size=10, attempt=0)
        assert stored(path) == [b"body-%d" % i for i in range(30)]
        if retry is not None:
            got = retry(path, rows(100), size=9, attempt=1)
        else:
            got = append(
                path,
                CONFIG,
                rows(100),
                sink_fp=FP,
                batch_id=7,
                slot=2,
                lock_timeout_ms=5000,
                attempt=1,
            )
        assert (got.skipped, got.appended) == (30, 70)  # type: ignore[attr-defined]
        assert stored(path) == [b"body-%d" % i for i in range(100)]


def test_a_rerun_with_other_rows_fails(tmp_path: Path) -> None:
    path = tmp_path / "broker-0"
    stream(path, rows(10))
    with pytest.raises(SinkReplayError, match="deterministic"):
        stream(path, rows(10, start=500))


def test_a_bad_row_stops_the_stream_after_the_parts_before_it(tmp_path: Path) -> None:
    """Parts before the bad row's own stay; the re-run with the row filtered out skips them."""
    path = tmp_path / "broker-0"
    table = rows(30)
    bodies = table.column("body").to_pylist()
    bodies[25] = None
    bad = table.set_column(1, "body", pa.array(bodies, pa.binary()))
    with pytest.raises(InvalidMessageError, match="body is null"):
        stream(path, bad, size=10)
    assert stored(path) == [b"body-%d" % i for i in range(20)]
    fixed = bad.filter(pa.array([b is not None for b in bodies]))
    got = stream(path, fixed, size=10)
    assert (got.skipped, got.appended) == (20, 9)  # type: ignore[attr-defined]


def routed(n: int, broker: int, queues: int, order: list[int] | None = None) -> pa.RecordBatch:
    ids = order if order is not None else list(range(n))
    return pa.RecordBatch.from_pydict(
        {
            "topic": ["orders"] * n,
            "body": [b"body-%d" % i for i in ids],
            "keys": [[f"k{i}"] for i in ids],
            "tags": [None] * n,
            "properties": [None] * n,
            "flag": [0] * n,
            "__rs_row": ids,
            "__rs_mq": [broker * queues + i % queues for i in ids],
        },
        schema=ROUTED,
    )


def test_a_shuffled_task_appends_its_broker_in_row_order(tmp_path: Path) -> None:
    settings = SinkSettings.from_options({"path": str(tmp_path), "topic": "orders"})
    batches = [routed(10, 1, 4).slice(0, 4), routed(10, 1, 4).slice(4)]
    (got,) = append_shuffled(settings, 4, batches, batch_id=3, sink_fp=FP, attempt=0)
    assert (got.broker, got.slot, got.appended) == ("broker-1", 1, 10)
    with MessageStore(tmp_path / "broker-1", settings.store_config, read_only=True) as s:
        q = {i.queue_id: i.max_offset for i in s.queue_infos("orders")}
    assert q == {0: 3, 1: 3, 2: 2, 3: 2}
    assert append_shuffled(settings, 4, [], batch_id=3, sink_fp=FP, attempt=0) == []


@pytest.mark.parametrize(
    "batches",
    [
        [routed(3, 0, 4, [0, 2, 1])],  # out of order within a batch
        [routed(2, 0, 4, [5, 6]), routed(2, 0, 4, [3, 4])],  # across batches
        [routed(2, 0, 4), routed(2, 1, 4, [2, 3])],  # a second broker
    ],
)
def test_a_shuffled_task_refuses_what_breaks_the_replay_order(
    tmp_path: Path, batches: list[pa.RecordBatch]
) -> None:
    settings = SinkSettings.from_options({"path": str(tmp_path), "topic": "orders"})
    with pytest.raises(StoreError, match=r"row order|more than one broker"):
        append_shuffled(settings, 4, batches, batch_id=3, sink_fp=FP, attempt=0)


def test_prefetched_keeps_order_and_stays_within_its_depth() -> None:
    made = []

    def source() -> Iterator[int]:
        for i in range(20):
            made.append(i)
            yield i

    got = []
    it = prefetched(source(), depth=2)
    for item in it:
        got.append(item)
        # The producer is at most depth + 1 ahead of what was consumed (queue + in hand).
        assert len(made) <= len(got) + 3
    assert got == list(range(20))


def test_prefetched_raises_the_producers_error_after_its_items() -> None:
    def source() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("bad batch")

    it = prefetched(source())
    assert next(it) == 1 and next(it) == 2
    with pytest.raises(ValueError, match="bad batch"):
        next(it)


def test_prefetched_stops_its_thread_when_the_consumer_stops() -> None:
    produced = threading.Event()

    def source() -> Iterator[np.int64]:
        for i in range(10_000):
            produced.set()
            yield np.int64(i)

    it = prefetched(source(), depth=1)
    assert next(it) == 0
    it.close()  # the consumer gives up early: the producer must not run on to the end
    threads = [t for t in threading.enumerate() if t.name == "rocketstore-prefetch"]
    for t in threads:
        t.join(timeout=10)
        assert not t.is_alive()
