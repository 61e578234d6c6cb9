"""Reads against the store's own background work (the flusher and the cleaner threads).

Each test stops one side at a chosen point (a hook in the flush or in the read), runs the other
side on another thread with :func:`contention.run_aside`, and checks that it waited for the
first instead of running in the middle of it. Before reads took the store's lock, the reader
ran there: it unmapped a ConsumeQueue file the flush was syncing (which failed the store), or
saw the cleaner delete the segment it was reading (a false :class:`CorruptRecordError`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.results import GetResult
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files import durability
from rocketstore.pipeline.format.message import Message
from tests.kit.contention import Aside, SignallingLock, run_aside

CLOCK = 1_700_000_000_000
QUEUES = [("TopicA", 0), ("TopicA", 1), ("TopicB", 0)]


def open_store(path: Path, cfg: StoreConfig, **kw: object) -> MessageStore:
    store = MessageStore(path, cfg, clock_ms=lambda: CLOCK, background=False, **kw)  # type: ignore[arg-type]
    return store


@pytest.fixture
def opened() -> Iterator[list[MessageStore]]:
    stores: list[MessageStore] = []
    yield stores
    for s in stores:
        s.close()


def watch_mutex(store: MessageStore) -> SignallingLock:
    lock = SignallingLock(store._mutex)
    store._mutex = lock  # type: ignore[assignment]
    return lock


def test_read_waits_for_a_flush_syncing_a_queue_file(
    tmp_path: Path, opened: list[MessageStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A read of the queues the flush is not syncing, started while it syncs one: it must wait
    # for the flush (the store's lock). Before reads took the lock, with two mappings for three
    # ConsumeQueue files, such a read mapped its files and pushed out the one being synced.
    cfg = StoreConfig(
        mapped_file_size_commitlog=65536,
        message_index_enable=False,
        max_mapped_files=2,
        flush_interval_commitlog=3_600_000,  # no flush from a put: the test flushes
    )
    store = open_store(tmp_path / "store", cfg)
    opened.append(store)
    store.put_batch([Message(t, b"%s-%d-%d" % (t.encode(), q, i), queue_id=q)
                     for i in range(3) for t, q in QUEUES])  # fmt: skip
    lock = watch_mutex(store)
    real_msync, real_fsync = durability.msync, durability.fsync
    reads: list[tuple[tuple[str, int], Aside[list[GetResult]]]] = []

    def read_aside(path: Path) -> None:
        if "consumequeue" in path.parts and not reads:
            syncing = (path.parent.parent.name, int(path.parent.name))
            others = [key for key in QUEUES if key != syncing]
            reads.append(
                (syncing, run_aside(lambda: [store.get_messages(t, q, 0) for t, q in others], lock))
            )

    def msync_then_read(mm: object, start: int, length: int, path: Path) -> None:
        read_aside(path)
        real_msync(mm, start, length, path)  # type: ignore[arg-type]

    def fsync_then_read(fd: int, path: Path) -> None:
        read_aside(path)
        real_fsync(fd, path)

    monkeypatch.setattr(durability, "msync", msync_then_read)
    monkeypatch.setattr(durability, "fsync", fsync_then_read)
    store.flush()
    assert store.failed is None
    assert len(reads) == 1, "no ConsumeQueue file was synced"
    syncing, aside = reads[0]
    assert aside.blocked, "the read ran in the middle of the flush"
    others = [key for key in QUEUES if key != syncing]
    got = aside.result()
    for (t, q), result in zip(others, got, strict=True):
        assert [m.body for m in result.messages] == [
            b"%s-%d-%d" % (t.encode(), q, i) for i in range(3)
        ]


def test_read_waits_for_the_cleaner_deleting_its_segment(
    tmp_path: Path, opened: list[MessageStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = StoreConfig(mapped_file_size_commitlog=65536, max_hash_slot_num=64, max_index_num=256)
    disk = [0.10]
    store = open_store(tmp_path / "store", cfg, disk_usage=lambda _: disk[0])
    opened.append(store)
    bodies = [b"%04d" % i + b"x" * 1000 for i in range(200)]
    store.put_batch([Message("TopicA", b) for b in bodies])
    assert len(store.commitlog.segments.files) >= 3
    first_segment = store.commitlog.segments.files[0].path
    disk[0] = 0.95  # the next clean deletes every segment but the last, loaded or not
    lock = watch_mutex(store)
    real_starts_record = store.commitlog.starts_record
    cleans: list[Aside[None]] = []

    def clean_first(phys: int) -> bool:
        if not cleans:
            cleans.append(run_aside(store.clean, lock))
        return real_starts_record(phys)

    monkeypatch.setattr(store.commitlog, "starts_record", clean_first)
    result = store.get_messages("TopicA", 0, 0, 4)
    assert len(cleans) == 1
    assert cleans[0].blocked, "the cleaner ran in the middle of the read"
    assert [m.body for m in result.messages] == bodies[:4]
    cleans[0].result()
    assert not first_segment.exists()
    assert store.get_messages("TopicA", 0, 0, 4).status == "OFFSET_TOO_SMALL"
