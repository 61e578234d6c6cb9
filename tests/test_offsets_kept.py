"""A queue's offsets are never handed out twice: not after retention deleted the records of a
queue nothing has loaded since the store opened, not after a crash that followed such a round,
and not after a rebuild of a queue (`rocketstore recover`) whose records are gone.

Consumers hold queue offsets (a Spark checkpoint, a consumer group): an offset given to a new
message after it was given to another makes a committed position point at other messages. The
stores use a small geometry (64 KiB CommitLog segments, ConsumeQueue files of 50 units) so that
a few hundred messages make queues of several files whose records retention can delete.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files.progress import FlushProgress
from rocketstore.pipeline.format.message import Message
from tests.kit.powercut import abandon

CONFIG = StoreConfig(
    mapped_file_size_commitlog=64 * 1024,
    mapped_file_size_consume_queue=20 * 50,
    max_hash_slot_num=101,
    max_index_num=300,
)
OLD = 120  # messages of queue OLD/0: three ConsumeQueue files, records early in the log
BODY = b"o" * 1000


def later() -> int:
    """A clock 100 hours ahead: every segment but the last has expired."""
    return int(time.time() * 1000) + 100 * 3_600_000


def old_queue_then_others(path: Path) -> None:
    """Queue OLD/0 gets its messages first, then other queues fill segments past them, so that
    retention can delete every record of OLD/0; the store is closed clean."""
    with MessageStore(path, CONFIG, background=False) as store:
        for _ in range(OLD // 20):
            store.put_batch([Message("OLD", BODY, queue_id=0)] * 20)
        for _ in range(10):
            store.put_batch([Message("NEW", BODY, queue_id=q) for q in range(4) for _ in range(5)])


def next_offset(store: MessageStore, topic: str = "OLD") -> int:
    return store.put(Message(topic, b"after", queue_id=0)).queue_offset


def test_retention_of_a_queue_not_loaded_since_the_open_keeps_the_store_writing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s"
    old_queue_then_others(path)
    with MessageStore(path, CONFIG, background=False, clock_ms=later) as store:
        assert not store.queues[("OLD", 0)].loaded
        report = store.clean(force_expired=True, max_files=100)
        assert store.commitlog.min_offset > OLD * len(BODY)  # every OLD/0 record is gone
        assert any(f.path.parent.name == "0" and "OLD" in str(f.path) for f in report.files)
        assert store.min_offset("OLD", 0) == store.max_offset("OLD", 0) == OLD
        assert next_offset(store) == OLD
    with MessageStore(path, CONFIG, background=False) as store:
        assert store.recovery.queues_rebuilt == []
        assert next_offset(store) == OLD + 1


def test_recover_keeps_the_offsets_of_a_queue_whose_records_retention_deleted(
    tmp_path: Path,
) -> None:
    """`rocketstore recover` checks every unit: units that point below the CommitLog's first
    record are what retention leaves, not damage."""
    path = tmp_path / "s"
    old_queue_then_others(path)
    with MessageStore(path, CONFIG, background=False, clock_ms=later) as store:
        store.commitlog.segments.delete_first()  # the CommitLog only, as a crash between
        store.commitlog.segments.delete_first()  # a round's two steps leaves it
    with MessageStore(path, CONFIG, background=False, full_check=True) as store:
        assert store.recovery.queues_rebuilt == []
        assert next_offset(store) == OLD


def test_a_crash_after_a_round_deleted_the_segment_of_the_last_flush_point(
    tmp_path: Path,
) -> None:
    """The progress file names its last record, and retention deleted the segment holding it
    before the next flush recorded a newer one; the writer then dies. Recovery must not take
    the expired units of the queues for damage, nor rebuild them from nothing."""
    path = tmp_path / "s"
    old_queue_then_others(path)
    store = MessageStore(path, CONFIG, background=False, clock_ms=later)
    store.put_batch([Message("NEW", BODY, queue_id=0)] * 5)
    store.flush()
    recorded = FlushProgress.read(path / "config")
    assert recorded is not None
    store.put_batch([Message("NEW", BODY, queue_id=1)] * 70)  # rolls past the recorded point
    store.clean(force_expired=True, max_files=100)
    assert store.commitlog.min_offset > recorded.last_record_offset
    abandon(store)
    with MessageStore(path, CONFIG, background=False) as store:
        # The walk starts at the log's first record, as the progress file's point lies below
        # it: only the queues written after that flush are looked at.
        assert (store.recovery.start_source, store.recovery.scan_start) == (
            "progress",
            store.commitlog.min_offset,
        )
        assert store.work.queues_loaded == 1
        assert store.recovery.queues_rebuilt == []
        assert next_offset(store) == OLD
        assert store.put(Message("NEW", b"after", queue_id=1)).queue_offset == 50 + 70


def test_a_rebuilt_queue_whose_records_are_gone_resumes_at_its_recorded_length(
    tmp_path: Path,
) -> None:
    """A queue whose directory is lost after retention deleted its records: the rebuild finds
    none of them in the CommitLog, and the queue resumes at the length the last flush recorded,
    its offsets below that unreadable, as a queue whose records expired."""
    path = tmp_path / "s"
    old_queue_then_others(path)
    with MessageStore(path, CONFIG, background=False, clock_ms=later) as store:
        store.clean(force_expired=True, max_files=100)
    shutil.rmtree(path / "consumequeue" / "OLD" / "0")
    with MessageStore(path, CONFIG, background=False) as store:
        assert store.recovery.queues_rebuilt == ["OLD/0"]
        assert store.min_offset("OLD", 0) == store.max_offset("OLD", 0) == OLD
        got = store.get_messages("OLD", 0, 0, 10)
        assert (got.status, got.messages, got.next_begin_offset) == ("OFFSET_TOO_SMALL", [], OLD)
        assert next_offset(store) == OLD
    with MessageStore(path, CONFIG, background=False, full_check=True) as store:
        assert store.recovery.queues_rebuilt == []
        got = store.get_messages("OLD", 0, OLD, 10)
        assert [m.body for m in got.messages] == [b"after"]
