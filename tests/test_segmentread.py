"""The read seam (rocketstore.pipeline.files.segmentread) and its local face
(rocketstore.pipeline.files.localsegments): where a unit sits, against a plain model of a queue
filling its files; and a directory's segments listed, opened, read exactly, gone since the
listing (never damage) and not visible yet (waited for, then NotVisibleError)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketstore.pipeline.errors import (
    CorruptRecordError,
    NotAStoreError,
    NotVisibleError,
    SegmentGoneError,
)
from rocketstore.pipeline.files.localsegments import LocalSegments, list_segments
from rocketstore.pipeline.files.mappedfile import MappedFile, segment_name
from rocketstore.pipeline.files.segmentread import (
    OpenSegments,
    SegmentFile,
    locate,
    unit_index,
    unit_position,
)
from rocketstore.pipeline.layout import CQ_UNIT_SIZE

SIZE = 4096


def segment(directory: Path, base: int, fill: bytes = b"", size: int = SIZE) -> Path:
    """A segment file of ``size`` bytes at ``base`` starting with ``fill``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / segment_name(base)
    path.write_bytes(fill + bytes(size - len(fill)))
    return path


# -- where a unit sits ----------------------------------------------------------------------------


def model_positions(units_per_file: int, count: int) -> list[tuple[int, int]]:
    """(file base, position) of units 0 .. count-1 of a queue written one unit after another,
    starting a new file when the last is full: what a writer does, no arithmetic shared with
    the code under test."""
    out = []
    base, position = 0, 0
    for _ in range(count):
        if position == units_per_file * CQ_UNIT_SIZE:
            base, position = base + units_per_file * CQ_UNIT_SIZE, 0
        out.append((base, position))
        position += CQ_UNIT_SIZE
    return out


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 60), st.integers(1, 400))
def test_unit_position_is_where_a_writer_puts_the_unit(units_per_file: int, count: int) -> None:
    file_size = units_per_file * CQ_UNIT_SIZE
    for k, want in enumerate(model_positions(units_per_file, count)):
        assert unit_position(k, file_size) == want
        assert unit_index(*want) == k


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 300_000), st.integers(0, 10**12))
def test_unit_index_inverts_unit_position(units_per_file: int, k: int) -> None:
    file_size = units_per_file * CQ_UNIT_SIZE
    base, position = unit_position(k, file_size)
    assert base % file_size == 0 and 0 <= position < file_size and position % CQ_UNIT_SIZE == 0
    assert unit_index(base, position) == k
    # One past the file's last unit starts the next file.
    assert unit_index(base, file_size) == unit_index(base + file_size, 0)
    assert unit_position(unit_index(base, file_size), file_size) == (base + file_size, 0)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 1 << 30), st.lists(st.integers(0, 1 << 40), min_size=1, max_size=50))
def test_locate_of_an_array_is_locate_of_each(size: int, offsets: list[int]) -> None:
    bases, positions = locate(np.array(offsets, dtype=np.int64), size)
    for i, offset in enumerate(offsets):
        base, position = locate(offset, size)
        assert (int(bases[i]), int(positions[i])) == (base, position)
        assert base + position == offset and base % size == 0 and 0 <= position < size


# -- listing --------------------------------------------------------------------------------------


def test_a_listing_names_segments_only_and_sizes_them(tmp_path: Path) -> None:
    for base in (2 * SIZE, 0, SIZE):
        segment(tmp_path, base)
    (tmp_path / (segment_name(3 * SIZE) + ".creating")).write_bytes(b"")
    (tmp_path / "rocketstore-writer-open").write_bytes(b"x")
    (tmp_path / segment_name(9 * SIZE)).mkdir()
    files = LocalSegments(tmp_path)
    assert files.listed() == [0, SIZE, 2 * SIZE]
    assert files.first() == 0
    assert files.file_size() == SIZE
    assert [files.size_of(b) for b in files.listed()] == [SIZE] * 3
    assert files.size_of(3 * SIZE) == -1
    assert files.where(SIZE) == str(tmp_path / segment_name(SIZE))
    assert LocalSegments(tmp_path / "missing").listed() == []
    assert LocalSegments(tmp_path / "missing").file_size() == 0


def test_the_file_size_is_the_newest_sized_file_still_there(tmp_path: Path) -> None:
    """Retention deletes the oldest, maybe after the listing; a writer that creates a file and
    then sizes it (RocketMQ) leaves the newest empty for a moment."""
    for base in (0, SIZE):
        segment(tmp_path, base)
    (tmp_path / segment_name(2 * SIZE)).write_bytes(b"")
    files = LocalSegments(tmp_path)
    assert files.listed() == [0, SIZE, 2 * SIZE]
    (tmp_path / segment_name(0)).unlink()
    (tmp_path / segment_name(SIZE)).unlink()
    segment(tmp_path, 3 * SIZE, size=2 * SIZE)  # listed only after relist
    assert files.file_size() == 0
    files.relist()
    assert files.listed() == [2 * SIZE, 3 * SIZE] and files.file_size() == 2 * SIZE


def test_a_listing_is_taken_when_first_needed_and_again_on_demand(tmp_path: Path) -> None:
    segment(tmp_path, 0)
    files = LocalSegments(tmp_path)
    segment(tmp_path, SIZE)  # before the first look: listed
    assert files.listed() == [0, SIZE]
    segment(tmp_path, 2 * SIZE)
    assert files.listed() == [0, SIZE] and not files.is_listed(2 * SIZE)
    files.relist()
    assert files.listed() == [0, SIZE, 2 * SIZE] and files.is_listed(2 * SIZE)
    assert list_segments(tmp_path) == [(b, tmp_path / segment_name(b)) for b in files.listed()]


# -- open and read --------------------------------------------------------------------------------


def test_reads_are_exact_and_a_mapped_segment_is_a_view_of_the_file(tmp_path: Path) -> None:
    path = segment(tmp_path, SIZE, b"0123456789")
    files = LocalSegments(tmp_path)
    assert files.read(SIZE, 3, 4) == b"3456"
    seg: SegmentFile = files.open(SIZE, whole=True)
    try:
        assert (seg.base, seg.size, seg.where) == (SIZE, SIZE, str(path))
        assert seg.read(0, 10) == b"0123456789"
        out = memoryview(bytearray(4))
        seg.read_into(6, out)
        assert bytes(out) == b"6789"
        view = seg.buffer
        with open(path, "r+b") as f:
            f.write(b"ab")
        assert bytes(view[:3]) == b"ab2"  # the mapping itself, not a copy
        del view
    finally:
        seg.close()


def test_bytes_past_where_the_file_ends_read_as_zeros(tmp_path: Path) -> None:
    """A file a writer is still sizing reads as its holes would."""
    tmp_path.joinpath(segment_name(0)).write_bytes(b"abc")
    assert LocalSegments(tmp_path).read(0, 1, 6) == b"bc" + bytes(4)


def test_an_empty_segment_reads_as_zeros_whatever_the_size_expected(tmp_path: Path) -> None:
    """A reader on another host of a shared file system can see a new file's name before its
    size: the read is of a file not sized yet, not of a store with other settings."""
    tmp_path.joinpath(segment_name(SIZE)).write_bytes(b"")
    assert LocalSegments(tmp_path, segment_size=SIZE).read(SIZE, 40, 20) == bytes(20)


def test_a_segment_of_another_size_is_refused(tmp_path: Path) -> None:
    segment(tmp_path, 0, size=SIZE // 2)
    files = LocalSegments(tmp_path, segment_size=SIZE)
    with pytest.raises(NotAStoreError, match="expected exactly 4096"):
        files.open(0)
    with pytest.raises(NotAStoreError, match="expected exactly 4096"):
        files.read(0, 0, 20)


def test_a_segment_mapped_whole_stays_readable_after_retention_unlinks_it(tmp_path: Path) -> None:
    path = segment(tmp_path, 0, b"kept")
    seg = LocalSegments(tmp_path).open(0, whole=True)
    path.unlink()
    assert bytes(seg.buffer[:4]) == b"kept" and seg.read(0, 4) == b"kept"
    seg.close()


def test_a_pinned_segment_stays_readable_after_retention_unlinks_it(tmp_path: Path) -> None:
    path = segment(tmp_path, 0, b"pinned")
    seg = LocalSegments(tmp_path).open(0)
    with seg.pinned():
        path.unlink()
        assert seg.read(0, 6) == b"pinned"
    seg.close()


def test_open_segments_opens_each_once_and_closes_them_together(tmp_path: Path) -> None:
    for base in (0, SIZE):
        segment(tmp_path, base, b"x")
    files = LocalSegments(tmp_path)
    opened = OpenSegments(files)
    first = opened.get(0)
    assert opened.get(0) is first and opened.get(SIZE) is not first
    assert opened.bases() == [0, SIZE]
    assert isinstance(first, MappedFile) and first.read(0, 1) == b"x"
    opened.close()
    assert opened.bases() == [] and not first.mapped


# -- gone since the listing -----------------------------------------------------------------------


def test_a_segment_deleted_since_the_listing_is_gone_not_damage(tmp_path: Path) -> None:
    for base in (0, SIZE, 2 * SIZE):
        segment(tmp_path, base)
    files = LocalSegments(tmp_path, wait_ms=5000)
    assert files.listed() == [0, SIZE, 2 * SIZE]
    (tmp_path / segment_name(0)).unlink()
    started = time.monotonic()
    for call in (lambda: files.open(0), lambda: files.read(0, 0, 20)):
        with pytest.raises(SegmentGoneError) as caught:
            call()
        assert not isinstance(caught.value, CorruptRecordError)
    files.relist()
    assert not files.has(0)  # before the last listed: deleted, not waited for
    assert time.monotonic() - started < 1
    with pytest.raises(SegmentGoneError):
        OpenSegments(files).get(0)


def test_a_segment_gone_under_open_segments_is_looked_for_again(tmp_path: Path) -> None:
    segment(tmp_path, 0)
    opened = OpenSegments(LocalSegments(tmp_path))
    (tmp_path / segment_name(0)).unlink()
    with pytest.raises(SegmentGoneError):
        opened.get(0)
    segment(tmp_path, 0, b"again")
    assert opened.get(0).read(0, 5) == b"again"
    opened.close()


# -- not visible yet ------------------------------------------------------------------------------


def test_without_a_wait_a_segment_past_the_listing_is_not_there(tmp_path: Path) -> None:
    segment(tmp_path, 0)
    files = LocalSegments(tmp_path)
    assert files.listed() == [0]
    assert not files.has(SIZE)
    with pytest.raises(SegmentGoneError):
        files.open(SIZE)


def test_a_segment_past_the_listing_is_waited_for(tmp_path: Path) -> None:
    """Created by a writer on another host after this host listed the directory: listed again
    until it shows, within the wait."""
    segment(tmp_path, 0)
    files = LocalSegments(tmp_path, wait_ms=5000, segment_size=SIZE)
    assert files.listed() == [0]
    late = threading.Timer(0.2, lambda: segment(tmp_path, SIZE, b"late"))
    late.start()
    try:
        started = time.monotonic()
        assert files.has(SIZE)
        assert 0.15 < time.monotonic() - started < 4
    finally:
        late.join()
    assert files.listed() == [0, SIZE] and files.open(SIZE).read(0, 4) == b"late"


def test_a_segment_never_listed_within_the_wait_is_not_visible(tmp_path: Path) -> None:
    segment(tmp_path, 0)
    files = LocalSegments(tmp_path, wait_ms=300)
    started = time.monotonic()
    with pytest.raises(NotVisibleError, match="not in this host's listing"):
        files.open(SIZE)
    assert time.monotonic() - started >= 0.25
    with pytest.raises(NotVisibleError):
        files.read(2 * SIZE, 0, 20)
    empty = LocalSegments(tmp_path / "none", wait_ms=100)
    with pytest.raises(NotVisibleError, match="any segment"):
        empty.first()


def test_a_segment_deleted_while_waited_for_is_gone(tmp_path: Path) -> None:
    """The listing went past it while it was looked for: retention, not a file still to come."""
    segment(tmp_path, 0)
    files = LocalSegments(tmp_path, wait_ms=5000)
    assert files.listed() == [0]
    os.unlink(tmp_path / segment_name(0))
    segment(tmp_path, 2 * SIZE)
    started = time.monotonic()
    assert not files.has(SIZE)
    assert time.monotonic() - started < 1


def test_a_stale_handle_is_looked_up_again_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ESTALE`` on opening a segment (a shared file system's client naming a file another
    host replaced; the real case is GlusterFS in tests/test_gluster_store.py) lists the
    directory again and opens once more; a second ``ESTALE`` goes out as it is."""
    import errno

    (tmp_path / segment_name(0)).write_bytes(b"abcdefgh" * 128)
    files = LocalSegments(tmp_path)
    real_open, real_listdir = os.open, os.listdir
    stale = {"left": 1}
    listed: list[str] = []

    def opening(path: str, flags: int, *args: int) -> int:
        if str(path).endswith(segment_name(0)) and stale["left"] > 0:
            stale["left"] -= 1
            raise OSError(errno.ESTALE, "Stale file handle", path)
        return real_open(path, flags, *args)

    def listing(path: os.PathLike[str]) -> list[str]:
        listed.append(str(path))
        return real_listdir(path)

    monkeypatch.setattr(os, "open", opening)
    monkeypatch.setattr(os, "listdir", listing)
    assert files.read(0, 8, 8) == b"abcdefgh"
    assert listed == [str(tmp_path)]
    stale["left"] = 2
    with pytest.raises(OSError) as raised:
        files.read(0, 8, 8)
    assert raised.value.errno == errno.ESTALE
