"""pipeline/files/consumequeue/queue.py: 20-byte units in fixed-size files, rolls, reload, truncation."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from rocketstore.pipeline.errors import NotAStoreError, StoreError
from rocketstore.pipeline.files.consumequeue.queue import ConsumeQueue, make_units
from rocketstore.pipeline.layout import PRE_BLANK_SIZE, UNIT_DTYPE

FILE_SIZE = 20 * 5  # five units per file
MSG = 100  # every test message is 100 bytes long, at CommitLog offset 100 * i


def units(start: int, count: int, *, salt: int = 0) -> np.ndarray:
    idx = np.arange(start, start + count, dtype=np.int64)
    return make_units(idx * MSG, np.full(count, MSG), idx * 7 - 3 + salt)


def open_cq(root: Path, *, read_only: bool = False) -> ConsumeQueue:
    cq = ConsumeQueue(root, "TopicTest", 2, FILE_SIZE, read_only=read_only)
    cq.load()
    return cq


def queue_files(root: Path) -> list[Path]:
    return sorted((root / "TopicTest" / "2").iterdir())


def as_tuples(arr: np.ndarray) -> list[tuple[int, int, int]]:
    return [(int(u["offset"]), int(u["size"]), int(u["tags_code"])) for u in arr]


def test_unit_layout() -> None:
    u = make_units([0x0102030405060708], [0x0A0B0C0D], [-2])
    assert UNIT_DTYPE.itemsize == 20
    assert u.tobytes() == struct.pack(">qiq", 0x0102030405060708, 0x0A0B0C0D, -2)


def test_append_across_file_rolls(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    assert (cq.min_offset, cq.max_offset) == (0, 0)
    cq.append(0, units(0, 3))
    cq.append(3, units(3, 9))  # crosses two file boundaries (5 and 10)
    assert (cq.min_offset, cq.max_offset) == (0, 12)
    assert cq.max_physic_offset == 12 * MSG
    files = queue_files(tmp_path)
    assert [f.name for f in files] == [f"{b:020d}" for b in (0, 100, 200)]
    assert all(f.stat().st_size == FILE_SIZE for f in files)
    raw = b"".join(f.read_bytes() for f in files)
    assert raw[: 12 * 20] == units(0, 12).tobytes()
    assert raw[12 * 20 :] == bytes(3 * 20)
    cq.close()


def test_append_exactly_filling_a_file_creates_no_extra_file(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append(0, units(0, 5))
    assert [f.name for f in queue_files(tmp_path)] == [f"{0:020d}"]
    assert cq.max_offset == 5
    cq.append(5, units(5, 1))
    assert [f.name for f in queue_files(tmp_path)] == [f"{0:020d}", f"{100:020d}"]
    cq.close()


@pytest.mark.parametrize(("start", "count"), [(0, 12), (3, 6), (4, 2), (5, 5), (9, 100), (11, 1)])
def test_read_ranges_spanning_files(tmp_path: Path, start: int, count: int) -> None:
    cq = open_cq(tmp_path)
    cq.append(0, units(0, 12))
    got = cq.read(start, count)
    assert as_tuples(got) == as_tuples(units(start, min(count, 12 - start)))
    cq.close()


def test_read_keeps_unit_dtype_across_files(tmp_path: Path) -> None:
    # Units read from one queue are units: their bytes are the on-disk layout whether or not the
    # range spans files, so they can be appended to another queue as they are.
    cq = open_cq(tmp_path / "a")
    cq.append(0, units(0, 12))
    within, spanning = cq.read(0, 5), cq.read(0, 12)
    assert within.dtype == UNIT_DTYPE
    assert spanning.dtype == UNIT_DTYPE
    assert spanning.tobytes() == units(0, 12).tobytes()
    copy = open_cq(tmp_path / "b")
    copy.append(0, spanning)
    assert as_tuples(copy.read(0, 12)) == as_tuples(units(0, 12))
    cq.close()
    copy.close()


def test_read_past_end_and_empty(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    assert len(cq.read(0, 10)) == 0
    cq.append(0, units(0, 7))
    assert len(cq.read(7, 10)) == 0
    assert len(cq.read(100, 10)) == 0
    assert len(cq.read(2, 0)) == 0
    assert len(cq.read(2, -1)) == 0
    cq.close()


def test_read_returns_copies(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append(0, units(0, 3))
    got = cq.read(0, 3)
    got["offset"] = -1
    assert as_tuples(cq.read(0, 3)) == as_tuples(units(0, 3))
    cq.close()
    assert as_tuples(got)[0][0] == -1  # still usable after close


def test_reappend_of_existing_units_is_skipped(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append(0, units(0, 7))
    # 5..6 exist (given different tags here: they must not overwrite), 7..8 are new
    cq.append(5, units(5, 4, salt=1000))
    assert cq.max_offset == 9
    got = as_tuples(cq.read(0, 9))
    assert got[:7] == as_tuples(units(0, 7))
    assert got[7:] == as_tuples(units(7, 2, salt=1000))
    # entirely old: nothing happens
    before = b"".join(f.read_bytes() for f in queue_files(tmp_path))
    cq.append(2, units(2, 3, salt=5))
    assert cq.max_offset == 9
    assert b"".join(f.read_bytes() for f in queue_files(tmp_path)) == before
    assert cq.max_physic_offset == 9 * MSG
    cq.close()


def test_gap_is_refused(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append(0, units(0, 3))
    with pytest.raises(StoreError, match="gap"):
        cq.append(4, units(4, 1))
    assert cq.max_offset == 3
    assert as_tuples(cq.read(0, 10)) == as_tuples(units(0, 3))
    cq.close()


@pytest.mark.parametrize("count", [1, 4, 5, 6, 10, 12])
def test_load_finds_end_after_reopen(tmp_path: Path, count: int) -> None:
    cq = open_cq(tmp_path)
    cq.append(0, units(0, count))
    cq.flush()
    cq.close()
    cq = open_cq(tmp_path)
    assert (cq.min_offset, cq.max_offset) == (0, count)
    assert cq.max_physic_offset == count * MSG
    assert as_tuples(cq.read(0, 100)) == as_tuples(units(0, count))
    cq.append(count, units(count, 3))  # and it goes on from there
    assert cq.max_offset == count + 3
    cq.close()


def test_load_steps_back_over_empty_trailing_file(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append(0, units(0, 7))
    cq.close()
    # a pre-allocated, all-zero next file (as a crash after creating it may leave)
    (tmp_path / "TopicTest" / "2" / f"{200:020d}").write_bytes(bytes(FILE_SIZE))
    cq = open_cq(tmp_path)
    assert cq.max_offset == 7
    assert cq.max_physic_offset == 7 * MSG
    cq.close()


def test_load_read_only(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append(0, units(0, 6))
    cq.close()
    before = {f.name: f.read_bytes() for f in queue_files(tmp_path)}
    ro = open_cq(tmp_path, read_only=True)
    assert ro.max_offset == 6
    assert as_tuples(ro.read(0, 6)) == as_tuples(units(0, 6))
    ro.close()
    assert {f.name: f.read_bytes() for f in queue_files(tmp_path)} == before


def test_load_of_missing_queue_is_empty(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    assert (cq.min_offset, cq.max_offset, cq.max_physic_offset) == (0, 0, -1)
    assert not (tmp_path / "TopicTest").exists()
    cq.close()


def test_truncate_after_physical_mid_file(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append(0, units(0, 12))
    # units 0..2 end by 300; unit 3 ends at 400 > 350
    assert cq.truncate_after_physical(350) == 9
    assert cq.max_offset == 3
    assert cq.max_physic_offset == 300
    assert [f.name for f in queue_files(tmp_path)] == [f"{0:020d}"]
    assert queue_files(tmp_path)[0].read_bytes() == units(0, 3).tobytes() + bytes(40)
    cq.close()
    cq = open_cq(tmp_path)
    assert cq.max_offset == 3
    cq.append(3, units(3, 1, salt=9))
    assert as_tuples(cq.read(3, 1)) == as_tuples(units(3, 1, salt=9))
    cq.close()


def test_truncate_after_physical_on_file_boundary(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append(0, units(0, 12))
    assert cq.truncate_after_physical(5 * MSG) == 7
    assert cq.max_offset == 5
    assert [f.name for f in queue_files(tmp_path)] == [f"{0:020d}"]
    cq.append(5, units(5, 2))
    assert cq.max_offset == 7
    cq.close()


def test_truncate_after_physical_nothing_and_everything(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append(0, units(0, 8))
    assert cq.truncate_after_physical(8 * MSG) == 0
    assert cq.truncate_after_physical(10**9) == 0
    assert cq.max_offset == 8
    assert cq.truncate_after_physical(MSG - 1) == 8
    assert (cq.max_offset, cq.max_physic_offset) == (0, -1)
    assert queue_files(tmp_path) == []
    cq.append(0, units(0, 1))
    assert cq.max_offset == 1
    cq.close()


def test_correct_min_offset(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append(0, units(0, 8))
    cq.correct_min_offset(0)
    assert cq.min_offset == 0
    cq.correct_min_offset(250)  # unit 3 (offset 300) is the first message still held
    assert cq.min_offset == 3
    assert as_tuples(cq.read(0, 2)) == as_tuples(units(3, 2))
    cq.correct_min_offset(300)
    assert cq.min_offset == 3
    # The first file wholly below (its last unit, 4, at 400): on into the second, to unit 6.
    cq.correct_min_offset(600)
    assert cq.min_offset == 6
    cq.correct_min_offset(10**6)  # nothing live in any file: the queue is empty, at its end
    assert (cq.min_offset, cq.max_offset) == (8, 8)
    cq.close()


def test_pre_blank_fill_when_queue_starts_past_zero(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append(7, units(7, 4))  # queue offsets 7..10: file 100 (units 5..9) and file 200
    assert (cq.min_offset, cq.max_offset) == (7, 11)
    files = queue_files(tmp_path)
    assert [f.name for f in files] == [f"{100:020d}", f"{200:020d}"]
    assert all(f.stat().st_size == FILE_SIZE for f in files)
    blank = make_units([0, 0], [PRE_BLANK_SIZE] * 2, [0, 0]).tobytes()
    assert files[0].read_bytes() == blank + units(7, 3).tobytes()
    assert as_tuples(cq.read(0, 100)) == as_tuples(units(7, 4))
    cq.close()

    cq = open_cq(tmp_path)
    assert cq.max_offset == 11
    cq.correct_min_offset(0)  # pre-blank units are never live
    assert cq.min_offset == 7
    assert as_tuples(cq.read(7, 2)) == as_tuples(units(7, 2))
    cq.close()


def test_pre_blank_on_file_boundary(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append(10, units(10, 2))
    assert [f.name for f in queue_files(tmp_path)] == [f"{200:020d}"]
    assert (cq.min_offset, cq.max_offset) == (10, 12)
    assert queue_files(tmp_path)[0].read_bytes()[:40] == units(10, 2).tobytes()
    cq.close()


def test_wrong_size_file_refused(tmp_path: Path) -> None:
    d = tmp_path / "TopicTest" / "2"
    d.mkdir(parents=True)
    (d / f"{0:020d}").write_bytes(bytes(FILE_SIZE - 20))
    cq = ConsumeQueue(tmp_path, "TopicTest", 2, FILE_SIZE, read_only=False)
    with pytest.raises(NotAStoreError, match=f"{0:020d}"):
        cq.load()


# -- offset by time ------------------------------------------------------------------------

T0 = 1_700_000_000_000


def store_time(offset: int, size: int) -> int:
    """Message i (at CommitLog offset 100 * i) was stored at T0 + 1000 * i."""
    assert size == MSG
    return T0 + offset * 10


@pytest.mark.parametrize(
    ("timestamp", "expected"),
    [
        (T0 + 3000, 3),  # exact
        (T0 + 3400, 3),  # nearer neighbour
        (T0 + 3600, 4),
        (T0 + 3500, 3),  # tie: the left one
        (T0 - 10, 0),  # before everything: the first
        (T0 + 99_999, 11),  # after everything: the last unit, not max_offset
        (T0 + 4500, 5),  # file 0 ends before it, so file 1 is searched (as RocketMQ does)
        (T0 + 11_000, 11),
        (T0 + 10_000, 10),
    ],
)
def test_offset_by_time(tmp_path: Path, timestamp: int, expected: int) -> None:
    cq = open_cq(tmp_path)
    cq.append(0, units(0, 12))
    assert cq.offset_by_time(timestamp, 0, store_time) == expected
    cq.close()


def test_offset_by_time_skips_units_below_min_physic_offset(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    cq.append(0, units(0, 12))
    assert cq.offset_by_time(T0, 250, store_time) == 3
    cq.correct_min_offset(250)
    assert cq.offset_by_time(T0, 250, store_time) == 3
    cq.close()


def test_offset_by_time_empty_or_unreadable(tmp_path: Path) -> None:
    cq = open_cq(tmp_path)
    assert cq.offset_by_time(T0, 0, store_time) == 0
    cq.append(0, units(0, 3))
    assert cq.offset_by_time(T0 + 1000, 0, lambda off, size: -1) == 0
    cq.close()
