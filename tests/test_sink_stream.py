"""The streaming appends of a shuffled ``foreachBatch`` task (``rocketstore.sink.append.append_stream``,
``rocketstore.sink.writer.append_shuffled``) and of a data source writer task's lead broker
(``rocketstore.sink.writer.append_partition``), and the prefetching thread they run beside
(``rocketstore.sink.prefetch``): the same rows land, with the same UNIQ_KEYs, as the whole-table
``append`` gives them, and a re-run finds what either stored."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import (
    InvalidMessageError,
    SinkFailpoint,
    SinkReplayError,
    StoreError,
    StoreLockedError,
)
from rocketstore.sink import writer
from rocketstore.sink.append import FAILPOINT_ENV, append, append_stream
from rocketstore.sink.prefetch import prefetched
from rocketstore.sink.rows import ROUTED
from rocketstore.sink.settings import SinkSettings
from rocketstore.sink.writer import append_partition, append_routed, append_shuffled
from tests.kit.appendrows import CONFIG, FP, rows, stored


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


def routed_rows(ids: list[int], mq: list[int]) -> pa.RecordBatch:
    """Routed rows (schema ``ROUTED``) numbered ``ids``, each in message queue ``mq[i]``."""
    n = len(ids)
    return pa.RecordBatch.from_pydict(
        {
            "topic": ["orders"] * n,
            "body": [b"body-%d" % i for i in ids],
            "keys": [[f"k{i}"] for i in ids],
            "tags": [None] * n,
            "properties": [None] * n,
            "flag": [0] * n,
            "__rs_row": ids,
            "__rs_mq": mq,
        },
        schema=ROUTED,
    )


def routed(n: int, broker: int, queues: int, order: list[int] | None = None) -> pa.RecordBatch:
    ids = order if order is not None else list(range(n))
    return routed_rows(ids, [broker * queues + i % queues for i in ids])


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
        [routed(2, 1, 4), routed(2, 0, 4, [2, 3])],  # brokers out of order across batches
        [routed_rows([0, 1, 2], [4, 0, 5])],  # brokers out of order within a batch
        [routed(2, 0, 4), routed(2, 1, 4, [3, 4]), routed(2, 1, 4, [4, 5])],  # within a broker
    ],
)
def test_a_shuffled_task_refuses_what_breaks_the_replay_order(
    tmp_path: Path, batches: list[pa.RecordBatch]
) -> None:
    settings = SinkSettings.from_options({"path": str(tmp_path), "topic": "orders"})
    with pytest.raises(StoreError, match=r"row order|brokers out of order"):
        append_shuffled(settings, 4, batches, batch_id=3, sink_fp=FP, attempt=0)


def small_settings(root: Path) -> SinkSettings:
    settings = SinkSettings.from_options({"path": str(root), "topic": "orders"})
    return dataclasses.replace(settings, store_config=CONFIG)


@pytest.mark.parametrize("cut", [1, 5, 9, 40])
def test_a_shuffled_task_appends_each_of_its_brokers_as_one_task_of_its_own_would(
    tmp_path: Path, cut: int
) -> None:
    """With fewer writer tasks than brokers a task gets several brokers' rows, broker after
    broker (a broker's run may start or end inside an Arrow batch): each broker gets what the
    task of its own would have put there, with the same UNIQ_KEYs, and only those brokers are
    opened."""
    ids = list(range(30))
    mq = [4 * b + i % 4 for b, n in ((1, 12), (2, 5), (5, 13)) for i in range(n)]
    whole = routed_rows(ids, mq)
    batches = [whole.slice(0, cut), whole.slice(cut)]
    settings = small_settings(tmp_path / "shared")
    got = append_shuffled(settings, 4, batches, batch_id=3, sink_fp=FP, attempt=0)
    assert [(s.broker, s.slot, s.appended) for s in got] == [
        ("broker-1", 1, 12),
        ("broker-2", 2, 5),
        ("broker-5", 5, 13),
    ]
    assert sorted(p.name for p in (tmp_path / "shared").iterdir()) == [
        "broker-1",
        "broker-2",
        "broker-5",
    ]
    for broker in (1, 2, 5):
        alone = [i for i in ids if mq[i] // 4 == broker]
        own = small_settings(tmp_path / f"own-{broker}")
        append_shuffled(
            own, 4, [routed_rows(alone, [mq[i] for i in alone])], batch_id=3, sink_fp=FP, attempt=0
        )
        name = f"broker-{broker}"
        assert uniq_of(tmp_path / "shared" / name) == uniq_of(tmp_path / f"own-{broker}" / name)
        assert len(uniq_of(tmp_path / "shared" / name)) == len(alone)


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


def mixed(n: int, brokers: int, queues: int) -> list[pa.RecordBatch]:
    """One partition's routed rows, every broker's mixed in, as Spark's batches of 10."""
    ids = list(range(n))
    table = routed_rows(ids, [(i * 7) % (brokers * queues) for i in ids])
    return [table.slice(i, 10) for i in range(0, n, 10)]


def broker_rows(root: Path, brokers: int) -> dict[str, list[tuple[int, bytes, str]]]:
    """Per broker, each message's queue, body and UNIQ_KEY, in CommitLog order."""
    out = {}
    for b in range(brokers):
        path = root / f"broker-{b}"
        if not path.exists():
            continue
        with MessageStore(path, CONFIG, read_only=True) as s:
            got = [
                (m.commit_log_offset, m.queue_id, m.body, m.properties["UNIQ_KEY"])
                for info in s.queue_infos("orders")
                for m in s.get_messages("orders", info.queue_id, 0, 10_000).messages
            ]
        out[path.name] = [g[1:] for g in sorted(got)]
    return out


def settings_for(root: Path, **extra: object) -> SinkSettings:
    return SinkSettings.from_options(
        {
            "path": str(root),
            "topic": "orders",
            "mappedFileSizeCommitLog": str(1 << 16),
            "maxHashSlotNum": "512",
            "maxIndexNum": "4096",
            **extra,
        }
    )


def partition(root: Path, slot: int, attempt: int = 0, **extra: object) -> list[object]:
    return append_partition(  # type: ignore[return-value]
        settings_for(root, **extra),
        2,
        3,
        mixed(95, 3, 2),
        batch_id=4,
        sink_fp=FP,
        slot=slot,
        attempt=attempt,
    )


@pytest.mark.parametrize("slot", [0, 1, 5])
def test_a_partition_streams_its_lead_broker_and_stores_what_the_gathered_path_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slot: int
) -> None:
    monkeypatch.setattr(writer, "STREAM_ROWS", 8)  # several parts for the lead broker
    got = partition(tmp_path / "streamed", slot)
    whole = append_routed(
        settings_for(tmp_path / "gathered"),
        2,
        mixed(95, 3, 2),
        batch_id=4,
        sink_fp=FP,
        slot=slot,
        attempt=0,
    )
    lead = f"broker-{slot % 3}"
    assert got[0].broker == lead  # type: ignore[attr-defined]
    assert sorted(s.broker for s in got) == sorted(s.broker for s in whole)  # type: ignore[attr-defined]
    streamed = broker_rows(tmp_path / "streamed", 3)
    assert streamed == broker_rows(tmp_path / "gathered", 3)
    # Each broker holds its rows in the partition's order.
    for name, held in streamed.items():
        bodies = [int(body.split(b"-")[1]) for _, body, _ in held]
        assert bodies == sorted(bodies) and len(bodies) > 0, name


def test_a_partition_whose_lead_broker_is_held_goes_down_the_gathered_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tried: list[str] = []

    def held(path: Path, *args: object) -> object:
        tried.append(path.name)
        raise StoreLockedError(f"{path}: held")

    monkeypatch.setattr(writer, "open_writer", held)
    got = partition(tmp_path / "a", 1)
    assert tried == ["broker-1"]
    assert [s.broker for s in got] == ["broker-1", "broker-2", "broker-0"]  # type: ignore[attr-defined]
    monkeypatch.undo()
    partition(tmp_path / "b", 1)
    assert broker_rows(tmp_path / "a", 3) == broker_rows(tmp_path / "b", 3)


def test_a_partition_without_rows_of_its_lead_broker_leaves_it_alone(tmp_path: Path) -> None:
    batches = [
        b.filter(pa.compute.not_equal(pa.compute.divide(b["__rs_mq"], 2), 0))
        for b in mixed(95, 3, 2)
    ]
    got = append_partition(
        settings_for(tmp_path), 2, 3, batches, batch_id=4, sink_fp=FP, slot=0, attempt=0
    )
    assert sorted(s.broker for s in got) == ["broker-1", "broker-2"]  # type: ignore[attr-defined]
    assert not (tmp_path / "broker-0").exists()


def test_a_partition_failing_mid_stream_is_completed_by_its_retry_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer, "STREAM_ROWS", 8)
    monkeypatch.setenv(FAILPOINT_ENV, f"after_chunk:2:{tmp_path / 'fired'}")
    with pytest.raises(SinkFailpoint):
        partition(tmp_path / "a", 0, chunkRows=5)
    # The lead broker kept the chunks before the failure; the others got nothing yet.
    landed = broker_rows(tmp_path / "a", 3)
    assert list(landed) == ["broker-0"] and len(landed["broker-0"]) > 0
    again = partition(tmp_path / "a", 0, attempt=1, chunkRows=5)
    assert again[0].skipped == len(landed["broker-0"])  # type: ignore[attr-defined]
    monkeypatch.delenv(FAILPOINT_ENV)
    partition(tmp_path / "b", 0)
    assert broker_rows(tmp_path / "a", 3) == broker_rows(tmp_path / "b", 3)
