"""A store of thousands of queues: every operation's work follows what it touches.

RocketMQ's layout exists for thousands of topics (one CommitLog for all of them); these tests
hold the store to doing per-queue work only where an operation needs it, by counting the work
(``MessageStore.work``: queues loaded, files mapped, descriptors opened, files synced, syncfs
calls), never by timing it. The store has 3,000 queues of tiny ConsumeQueue files, built in a
few batch puts.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import CorruptRecordError
from rocketstore.pipeline.files import filesystem, mappings
from rocketstore.pipeline.format.message import Message
from tests.kit.powercut import abandon

TOPICS = 750
QUEUES = TOPICS * 4
CONFIG = StoreConfig(
    mapped_file_size_commitlog=4 << 20,
    mapped_file_size_consume_queue=40 * 20,  # 40 units a file
    max_hash_slot_num=4099,
    max_index_num=40_000,
    flush_interval_commitlog=3_600_000,  # flushes where the tests make them
)


def batch(first: int, n: int) -> list[Message]:
    return [
        Message(f"T{i % TOPICS:04d}", b"m%d" % i, queue_id=(i // TOPICS) % 4, keys=[f"k{i}"])
        for i in range(first, first + n)
    ]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of 3,000 queues holding 3 messages each, closed cleanly."""
    path = tmp_path_factory.mktemp("many") / "store"
    with MessageStore(path, CONFIG, background=False) as s:
        for b in range(3):
            s.put_batch(batch(b * QUEUES, QUEUES))
    return path


@pytest.fixture
def store(built: Path, tmp_path: Path) -> Iterator[Path]:
    """A copy of the built store for one test to change."""
    copy = tmp_path / "store"
    shutil.copytree(built, copy)
    yield copy


def test_a_clean_open_loads_no_queue_and_a_put_loads_the_one_it_writes(store: Path) -> None:
    with MessageStore(store, CONFIG, background=False) as s:
        assert len(s.queues) == QUEUES
        assert s.work.queues_loaded == 0
        assert s.work.mapped <= 2  # the CommitLog's last segment and the index, if anything
        s.put(Message("T0007", b"one more", queue_id=2))
        assert s.work.queues_loaded == 1
        s.put_batch([Message("T0008", b"x", queue_id=1), Message("T0009", b"y", queue_id=3)])
        assert s.work.queues_loaded == 3
        assert s.queues[("T0007", 2)].max_offset == 4


def test_a_read_only_open_loads_only_what_is_read(store: Path) -> None:
    with MessageStore(store, CONFIG, read_only=True) as s:
        assert s.work.queues_loaded == 0
        got = s.get_messages("T0100", 3, 0, 10)
        assert [m.body for m in got.messages] == [
            b"m%d" % (100 + 3 * TOPICS + r * QUEUES) for r in range(3)
        ]
        assert s.work.queues_loaded == 1


def test_puts_over_every_queue_map_no_queue_file_and_stay_in_budget(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mappings, "descriptor_budget", lambda: 64)
    with MessageStore(store, CONFIG, background=False) as s:
        s.work.reset()
        s.put_batch(batch(3 * QUEUES, QUEUES))
        assert s.work.queues_loaded == QUEUES
        assert s.work.mapped <= 2  # units go through descriptors, never a queue file's mapping
        assert s.mappings.descriptors <= 64
        assert mappings.alive() <= 64
        s.flush()
        assert s.mappings.descriptors <= 64


def test_a_flush_visits_the_queues_written_since_the_last(store: Path) -> None:
    with MessageStore(store, CONFIG, background=False) as s:
        s.put_batch([Message(f"T{t:04d}", b"z", queue_id=0) for t in range(5)])
        s.work.reset()
        s.flush()
        # The CommitLog's segment, the index and the five queues' files, each once.
        assert s.work.synced + s.work.synced_all <= 7
        assert s.work.synced_all == 0  # five queues are below the syncfs threshold
        s.work.reset()
        s.flush(force=True)
        assert s.work.synced == 0  # nothing written since


def test_a_flush_of_many_queues_is_one_file_system_sync_where_that_is_durable(store: Path) -> None:
    with MessageStore(store, CONFIG, background=False) as s:
        s.put_batch(batch(3 * QUEUES, QUEUES))
        s.work.reset()
        s.flush()
        if filesystem.syncfs_replaces_fsyncs(store / "consumequeue"):
            assert s.work.synced_all == 1 and s.work.synced <= 2
        else:
            assert s.work.synced_all == 0 and s.work.synced >= QUEUES


def test_a_crash_reopens_loading_only_the_queues_written_after_the_last_flush(
    store: Path,
) -> None:
    s = MessageStore(store, CONFIG, background=False)
    written = [("T0001", 0), ("T0002", 1), ("T0500", 3)]
    s.put_batch([Message(t, b"after the flush", queue_id=q) for t, q in written])
    abandon(s)  # no flush, no close: what kill -9 leaves
    with MessageStore(store, CONFIG, background=False) as again:
        assert again.recovery.abort_file_found
        assert again.work.queues_loaded == len(written)
        for t, q in written:
            assert again.queues[(t, q)].max_offset == 4
            assert again.get_messages(t, q, 3, 1).messages[0].body == b"after the flush"


def test_a_queue_of_a_few_units_holds_a_page_of_disk(store: Path) -> None:
    files = list((store / "consumequeue").glob("*/*/0*"))
    assert len(files) == QUEUES
    blocks = {f.stat().st_blocks * 512 for f in files}
    assert max(blocks) <= 4096, blocks


def test_a_queue_whose_files_changed_since_the_last_flush_is_refused_when_it_loads(
    store: Path,
) -> None:
    """The recorded length is trusted at open; a queue cut short behind the store's back is
    caught when first used, with its file named, not written past a gap."""
    victim = next((store / "consumequeue" / "T0042" / "1").iterdir())
    with open(victim, "r+b") as f:
        f.seek(20)
        f.write(bytes(40))  # units 1 and 2 gone: the queue holds one unit, not three
    with MessageStore(store, CONFIG, background=False) as s:
        with pytest.raises(CorruptRecordError, match=r"T0042/1 holds 1 unit\(s\), but the last"):
            s.put(Message("T0042", b"after", queue_id=1))
        s.put(Message("T0043", b"other queues go on", queue_id=1))


def test_a_first_batch_over_new_queues_makes_their_directories_and_lists_none(
    tmp_path: Path,
) -> None:
    """A queue the store did not find when it opened has no directory until its writer makes
    it: made, it holds no file, so nothing is listed or scanned; a reader opened beside the
    writer before the queues existed finds them after the flush, and so does a reopen after a
    crash that came before any flush."""
    path = tmp_path / "store"
    with MessageStore(path, CONFIG, background=False) as s:
        s.put(Message("T0000", b"first", queue_id=0))
        s.flush()
        with MessageStore(path, CONFIG, read_only=True) as before:
            s.work.reset()
            s.put_batch(batch(0, QUEUES))
            assert (s.work.queues_made, s.work.queues_loaded) == (QUEUES - 1, 0)
            s.flush()
            assert before.get_messages("T0001", 0, 0, 1).messages == []  # fixed at its open
        with MessageStore(path, CONFIG, read_only=True) as after:
            assert len(after.queues) == QUEUES
            assert after.get_messages("T0001", 0, 0, 1).messages[0].body == b"m1"
            assert after.get_messages("T0000", 0, 0, 2).messages[1].body == b"m0"
    s = MessageStore(path, CONFIG, background=False)
    s.work.reset()
    s.put_batch([Message("N0000", b"new topic", queue_id=q) for q in range(3)])
    s.put(Message("T0001", b"old queue", queue_id=0))
    assert (s.work.queues_made, s.work.queues_loaded) == (3, 1)
    abandon(s)  # no flush, no close: what kill -9 leaves
    with MessageStore(path, CONFIG, background=False) as again:
        assert again.recovery.abort_file_found
        for q in range(3):
            assert again.queues[("N0000", q)].max_offset == 1
            assert again.get_messages("N0000", q, 0, 1).messages[0].body == b"new topic"
        assert again.get_messages("T0001", 0, 1, 1).messages[0].body == b"old queue"
        again.put(Message("N0000", b"after", queue_id=0))
        assert again.queues[("N0000", 0)].max_offset == 2


def test_a_queue_directory_made_since_the_open_is_listed_as_before(tmp_path: Path) -> None:
    """Only a directory this load made vouches for an empty queue: one already there (a load
    that failed after making it) is listed."""
    path = tmp_path / "store"
    with MessageStore(path, CONFIG, background=False) as s:
        (path / "consumequeue" / "T0003" / "2").mkdir(parents=True)
        s.work.reset()
        s.put(Message("T0003", b"x", queue_id=2))
        assert (s.work.queues_made, s.work.queues_loaded) == (0, 1)
        assert s.get_messages("T0003", 2, 0, 1).messages[0].body == b"x"
