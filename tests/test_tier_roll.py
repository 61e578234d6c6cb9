"""The early roll (pipeline/engine/earlyroll.py): with the tier on, a segment whose first record
is older than tieredStoreGroupCommitTimeout is ended with an END_OF_FILE blank at a put, a
flush or the close; queues stay continuous and the store's own recovery reads across it."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files.localsegments import LocalSegments
from rocketstore.pipeline.files.progress import FlushProgress
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.tier.upload import sealed_bases

SEG = 64 * 1024
OFF = StoreConfig(mapped_file_size_commitlog=SEG, max_hash_slot_num=101, max_index_num=300)
ON = dataclasses.replace(
    OFF,
    tiered_storage_level="NOT_IN_DISK",
    object_store_bucket="unused",
    tiered_store_group_commit_timeout=1000,
)
BLANK_MAGIC = 0xCBD43194 - (1 << 32)


class Clock:
    def __init__(self, ms: int = 1_800_000_000_000) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def open_store(path: Path, config: StoreConfig, clock: Clock) -> MessageStore:
    return MessageStore(path, config, clock_ms=clock, background=False)


def bodies(store: MessageStore, topic: str, queue_id: int) -> list[tuple[int, bytes]]:
    got = store.get_messages(topic, queue_id, 0, 1000)
    return [(m.queue_offset, m.body) for m in got.messages]


def segments(path: Path) -> list[int]:
    return [int(p.name) for p in sorted((path / "commitlog").iterdir()) if p.name.isdigit()]


def blank_at(path: Path, base: int, position: int) -> bool:
    raw = (path / "commitlog" / f"{base:020d}").read_bytes()
    size, magic = struct.unpack_from(">ii", raw, position)
    return magic == BLANK_MAGIC and size == SEG - position


def test_a_put_after_the_timeout_starts_the_next_segment(tmp_path: Path) -> None:
    clock = Clock()
    with open_store(tmp_path / "s", ON, clock) as store:
        first = [store.put(Message("T", f"m{k}".encode(), queue_id=0)) for k in range(3)]
        clock.ms += 999
        store.put(Message("T", b"m3", queue_id=0))  # not old enough yet
        end = store.commitlog.max_offset
        clock.ms += 1
        late = store.put(Message("T", b"m4", queue_id=0))
        assert late.commit_log_offset == SEG
        assert [r.queue_offset for r in first] == [0, 1, 2] and late.queue_offset == 4
        assert blank_at(tmp_path / "s", 0, end)
    with open_store(tmp_path / "s", ON, clock) as again:  # recovery reads across the roll
        assert bodies(again, "T", 0) == [(k, f"m{k}".encode()) for k in range(5)]
        assert again.commitlog.max_offset > SEG


def test_the_tier_off_never_rolls_early(tmp_path: Path) -> None:
    clock = Clock()
    with open_store(tmp_path / "s", OFF, clock) as store:
        store.put(Message("T", b"a"))
        clock.ms += 10**9
        assert store.put(Message("T", b"b")).commit_log_offset < SEG
    assert segments(tmp_path / "s") == [0]


def test_a_flush_rolls_and_seals_the_segment_for_the_uploader(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "s"
    with open_store(path, ON, clock) as store:
        store.put(Message("T", b"only", queue_id=1))
        end = store.commitlog.max_offset
        clock.ms += 5000
        store.flush()
        assert blank_at(path, 0, end)
        # The next segment exists (a recovery moves on to it), the flushed point is its base.
        assert segments(path) == [0, SEG]
        progress = FlushProgress.read(path / "config")
        assert progress is not None and progress.flushed_offset == SEG
        assert sealed_bases(LocalSegments(path / "commitlog"), SEG, SEG) == [0]
    # Reopened, the blank stays and the next put goes to the next segment.
    with open_store(path, ON, clock) as again:
        assert again.put(Message("T", b"next", queue_id=1)).commit_log_offset == SEG
        assert bodies(again, "T", 1) == [(0, b"only"), (1, b"next")]
    assert blank_at(path, 0, end)


def test_the_close_rolls_an_old_segment(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "s"
    store = open_store(path, ON, clock)
    store.put(Message("T", b"x"))
    end = store.commitlog.max_offset
    clock.ms += 1000
    store.close()
    assert blank_at(path, 0, end) and segments(path) == [0, SEG]


def test_a_segment_is_rolled_once(tmp_path: Path) -> None:
    """After a roll the new segment waits for its own first record's age."""
    clock = Clock()
    with open_store(tmp_path / "s", ON, clock) as store:
        store.put(Message("T", b"a"))
        clock.ms += 2000
        b = store.put(Message("T", b"b"))
        assert b.commit_log_offset == SEG
        store.flush()
        clock.ms += 500
        store.flush()
        c = store.put(Message("T", b"c"))
        assert SEG < c.commit_log_offset < 2 * SEG
        assert segments(tmp_path / "s") == [0, SEG]
