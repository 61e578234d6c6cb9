"""pipeline/files/commitlog.py, pipeline/files/segments.py, pipeline/files/mappedfile.py: placement of records in
fixed-size segments, END_OF_FILE blanks, loading, walking and cutting the log."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import (
    CorruptRecordError,
    NotAStoreError,
    OffsetOutOfRangeError,
    StoreError,
)
from rocketstore.pipeline.files.commitlog import CommitLog
from rocketstore.pipeline.files.mappedfile import (
    PWRITE_MIN_BYTES,
    MappedFile,
    parse_segment_name,
    segment_name,
)
from rocketstore.pipeline.files.mappings import MappingCache
from rocketstore.pipeline.files.segments import SegmentQueue
from rocketstore.pipeline.format import record
from rocketstore.pipeline.format.message import Message

SEG = 1000
BLANK = struct.Struct(">iI")


def sizes(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def open_log(d: Path, seg: int = SEG, *, read_only: bool = False) -> CommitLog:
    log = CommitLog(SegmentQueue(d, seg, read_only=read_only))
    log.load()
    return log


def make_record(phys: int, body_len: int, i: int = 0) -> bytes:
    return record.encode_record(
        topic="T",
        body=bytes([i % 256]) * body_len,
        properties={},
        queue_id=0,
        queue_offset=i,
        physical_offset=phys,
        born_timestamp=1000 + i,
        store_timestamp=2000 + i,
        born_host="127.0.0.1:1",
        store_host="127.0.0.1:10911",
    )


def append_records(log: CommitLog, body_lens: list[int]) -> list[int]:
    """Encode, plan and write records the way the store does; returns their offsets."""
    recs_sizes = sizes(*(92 + n for n in body_lens))  # topic "T", no properties: 91 + 1 + body
    phys, blanks = log.plan(recs_sizes)
    pending = list(blanks)
    for i, (p, n) in enumerate(zip(phys.tolist(), body_lens, strict=True)):
        while pending and pending[0] < p:
            log.write_blank(pending.pop(0))
        data = make_record(p, n, i)
        assert len(data) == recs_sizes[i]
        log.write(p, data)
    assert pending == []
    return phys.tolist()


# -- names -------------------------------------------------------------------------------


def test_segment_names() -> None:
    assert segment_name(0) == "00000000000000000000"
    assert segment_name(1073741824) == "00000000001073741824"
    assert len(segment_name(2**62)) == 20
    assert parse_segment_name(Path("/x/00000000001073741824")) == 1073741824
    assert parse_segment_name(Path("0000000000107374182")) is None
    assert parse_segment_name(Path("0000000000107374182x")) is None


# -- plan --------------------------------------------------------------------------------


def test_plan_exact_boundary_fits(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    # second record: size + 8 == remaining (500) -> fits, no blank
    phys, blanks = log.plan(sizes(500, 492))
    assert phys.tolist() == [0, 500]
    assert blanks == []


def test_plan_one_byte_over_boundary_moves_to_next_file(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    phys, blanks = log.plan(sizes(500, 493))
    assert phys.tolist() == [0, 1000]
    assert blanks == [500]


def test_plan_many_files(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    phys, blanks = log.plan(sizes(*[300] * 7))
    assert phys.tolist() == [0, 300, 600, 1000, 1300, 1600, 2000]
    assert blanks == [900, 1900]
    assert log.max_offset == 0  # planning writes nothing
    assert list(tmp_path.iterdir()) == []


def test_plan_from_current_end(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append_records(log, [400])  # one record of 492 bytes
    assert log.max_offset == 492
    phys, blanks = log.plan(sizes(500, 100))
    # 492 + 500 + 8 = 1000: fits exactly; then 992 + 100 + 8 > 1000
    assert phys.tolist() == [492, 1000]
    assert blanks == [992]


def test_plan_empty(tmp_path: Path) -> None:
    phys, blanks = open_log(tmp_path).plan(sizes())
    assert phys.tolist() == []
    assert blanks == []


def test_plan_largest_record(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    phys, blanks = log.plan(sizes(SEG - 8, SEG - 8))
    assert phys.tolist() == [0, 1000]
    assert blanks == [992]


def test_plan_record_too_large_for_a_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    with pytest.raises(StoreError, match="message 1 needs 993 bytes"):
        log.plan(sizes(100, SEG - 7))


# -- write and read ------------------------------------------------------------------------


def test_writes_blank_and_rolls(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    offs = append_records(log, [400, 400, 400])  # 492 each: 0, 492 | blank at 984 | 1000
    assert offs == [0, 492, 1000]
    assert log.max_offset == 1492
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["00000000000000000000", "00000000000000001000"]
    assert all(f.stat().st_size == SEG for f in files)
    first = files[0].read_bytes()
    assert BLANK.unpack_from(first, 984) == (16, 0xCBD43194)
    assert struct.unpack_from(">i", first, 988)[0] == record.BLANK_MAGIC
    assert first[992:] == bytes(8)
    for i, off in enumerate(offs):
        m = log.read(off)
        assert (m.commit_log_offset, m.queue_offset, m.store_size) == (off, i, 492)
        assert m.body == bytes([i]) * 400
    assert log.store_timestamp(1000, 492) == 2002
    assert log.store_timestamp(5000, 492) == -1
    log.close()


def test_read_out_of_range(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append_records(log, [10])
    with pytest.raises(OffsetOutOfRangeError):
        log.read(log.max_offset)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1)
    log.close()


def test_write_across_segment_end_refused(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    with pytest.raises(StoreError):
        log.write(900, bytes(200))
    log.close()


def test_store_put_places_records_like_plan(tmp_path: Path) -> None:
    cfg = StoreConfig(mapped_file_size_commitlog=4096, max_hash_slot_num=16, max_index_num=64)
    with MessageStore(tmp_path / "s", cfg, clock_ms=lambda: 1_700_000_000_000) as store:
        results = [store.put(Message("T", bytes(700 + i))) for i in range(12)]
        offs = [r.commit_log_offset for r in results]
        size_of = {r.commit_log_offset: r.store_size for r in results}
        for r in results:
            rel = r.commit_log_offset % 4096
            assert rel + r.store_size + 8 <= 4096
        walked = list(store.commitlog.walk(0, check_crc=True))
        assert walked == [(o, size_of[o]) for o in offs]
    seg_files = sorted((tmp_path / "s" / "commitlog").iterdir())
    assert all(f.stat().st_size == 4096 for f in seg_files)
    for f in seg_files[:-1]:
        data = f.read_bytes()
        base = int(f.name)
        ends = [o + size_of[o] - base for o in offs if base <= o < base + 4096]
        end = max(ends)
        assert BLANK.unpack_from(data, end) == (4096 - end, 0xCBD43194)


# -- load --------------------------------------------------------------------------------


def test_load_wrong_size_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append_records(log, [10])
    log.close()
    (tmp_path / "00000000000000001000").write_bytes(bytes(SEG + 1))
    with pytest.raises(NotAStoreError, match="00000000000000001000"):
        open_log(tmp_path)


def test_load_with_other_segment_size(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append_records(log, [10])
    log.close()
    with pytest.raises(NotAStoreError, match="00000000000000000000"):
        open_log(tmp_path, 2000)


def test_load_missing_middle_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append_records(log, [400, 400, 400, 400, 400])  # three files
    log.close()
    assert len(list(tmp_path.iterdir())) == 3
    (tmp_path / "00000000000000001000").unlink()
    with pytest.raises(NotAStoreError, match="00000000000000001000"):
        open_log(tmp_path)


def test_load_misaligned_segment_name(tmp_path: Path) -> None:
    (tmp_path / "00000000000000000500").write_bytes(bytes(SEG))
    with pytest.raises(NotAStoreError, match="00000000000000000500"):
        open_log(tmp_path)


def test_load_ignores_other_names(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "0000000000000000000").write_bytes(bytes(5))
    log = open_log(tmp_path)
    assert log.segments.files == []
    assert (log.min_offset, log.max_offset) == (0, 0)


def test_load_after_retention_starts_at_first_file(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append_records(log, [400] * 5)
    log.close()
    (tmp_path / "00000000000000000000").unlink()
    log = open_log(tmp_path)
    assert log.min_offset == 1000
    assert [p for p, _ in log.walk(1000, check_crc=True)] == [1000, 1492, 2000]
    log.close()


def test_mapped_file_refuses_overwrite_and_wrong_size(tmp_path: Path) -> None:
    path = tmp_path / segment_name(0)
    mf = MappedFile(path, 0, 100, read_only=False, create=True)
    mf.close()
    with pytest.raises(StoreError, match="already exists"):
        MappedFile(path, 0, 100, read_only=False, create=True)
    with pytest.raises(NotAStoreError, match=segment_name(0)):
        MappedFile(path, 0, 200, read_only=True)
    with pytest.raises(StoreError):
        MappedFile(tmp_path / segment_name(100), 100, 100, read_only=True, create=True)


def test_mapped_file_write_bounds(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / segment_name(0), 0, 100, read_only=False, create=True)
    mf.write_at(90, b"x" * 10)
    assert mf.wrote_position == 100
    assert mf.is_full
    with pytest.raises(StoreError):
        mf.write_at(95, b"x" * 10)
    with pytest.raises(StoreError):
        mf.write_at(-1, b"x")
    mf.close()


@pytest.mark.parametrize("export", ["slice", "array"])
def test_mapped_file_close_leaves_a_live_view_its_mapping(tmp_path: Path, export: str) -> None:
    # A slice of the buffer, or an array over it (as the index reads its slots), keeps the
    # mapping exported. Close must not fail for it, must forget the mapping, and what the
    # reader holds must still read the bytes it was made for.
    cache = MappingCache(2)
    mf = MappedFile(tmp_path / segment_name(0), 0, 4096, read_only=False, create=True, cache=cache)
    mf.write_at(0, b"still-here")
    held = mf.buffer[:10] if export == "slice" else np.frombuffer(mf.buffer, np.uint8, count=10)
    assert len(cache) == 1
    mf.close()
    assert not mf.mapped
    assert len(cache) == 0
    assert bytes(held) == b"still-here"
    del held
    mf.close()  # idempotent


def test_large_writes_go_through_the_file_and_show_in_the_mapping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes from PWRITE_MIN_BYTES up use pwrite: the mapping sees them at once, smaller writes
    beside them are not disturbed, and a flush makes both durable (what a reopen reads)."""
    pwrites: list[int] = []
    real_pwrite = os.pwrite

    def counting_pwrite(fd: int, data: bytes, offset: int) -> int:
        pwrites.append(offset)
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", counting_pwrite)
    size = 4 * PWRITE_MIN_BYTES
    path = tmp_path / segment_name(0)
    mf = MappedFile(path, 0, size, read_only=False, create=True)
    big = bytes(range(256)) * (PWRITE_MIN_BYTES // 256 + 1)
    mf.write_at(10, b"small")
    mf.write_at(100, big)
    mf.write_at(100 + len(big), b"tail")
    want = bytearray(size)
    want[10:15] = b"small"
    want[100 : 100 + len(big)] = big
    want[100 + len(big) : 104 + len(big)] = b"tail"
    assert bytes(mf.buffer) == bytes(want)
    assert pwrites == [100]
    assert mf.wrote_position == 104 + len(big)
    mf.flush()
    mf.close()
    assert path.read_bytes() == bytes(want)


def test_segment_queue_refuses_skipping_a_segment(tmp_path: Path) -> None:
    q = SegmentQueue(tmp_path, 100, read_only=False)
    q.segment_for_write(0)
    with pytest.raises(OffsetOutOfRangeError):
        q.segment_for_write(250)
    q.close()


# -- walk --------------------------------------------------------------------------------


def test_walk_across_blanks(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    offs = append_records(log, [400] * 5)
    assert [p for p, _ in log.walk(0, check_crc=True)] == offs
    assert [p for p, _ in log.walk(492, check_crc=True)] == offs[1:]
    assert [p for p, _ in log.walk(1000, check_crc=True)] == offs[2:]
    assert all(s == 492 for _, s in log.walk(0, check_crc=True))
    log.close()


def test_walk_stops_at_corrupted_record(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    offs = append_records(log, [100, 100, 100, 100])  # 192 bytes each
    log.close()
    path = tmp_path / "00000000000000000000"
    data = bytearray(path.read_bytes())
    data[offs[2] + 88 + 5] ^= 0xFF  # a body byte of the third record
    path.write_bytes(bytes(data))
    log = open_log(tmp_path)
    assert [p for p, _ in log.walk(0, check_crc=True)] == offs[:2]
    assert [p for p, _ in log.walk(0, check_crc=False)] == offs
    log.set_end(offs[3] + 192)
    with pytest.raises(CorruptRecordError, match="00000000000000000000") as info:
        log.read(offs[2])
    assert info.value.offset == offs[2]
    assert log.read(offs[2], check_crc=False).queue_offset == 2
    log.close()


@pytest.mark.parametrize(
    ("at", "value"),
    [(4, 0x12345678), (0, 50), (0, 10_000), (28, 1)],  # magic, size, size, PHYSICALOFFSET
)
def test_walk_stops_at_bad_header(tmp_path: Path, at: int, value: int) -> None:
    log = open_log(tmp_path)
    offs = append_records(log, [100, 100, 100])
    log.close()
    path = tmp_path / "00000000000000000000"
    data = bytearray(path.read_bytes())
    fmt = ">q" if at == 28 else ">i"
    struct.pack_into(fmt, data, offs[1] + at, value)
    path.write_bytes(bytes(data))
    log = open_log(tmp_path)
    assert [p for p, _ in log.walk(0, check_crc=False)] == offs[:1]
    log.close()


def test_walk_stops_at_zeros_and_bad_blank(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    offs = append_records(log, [400, 400, 400])  # blank at 984
    log.close()
    assert [p for p, _ in open_log(tmp_path).walk(0, check_crc=True)] == offs
    path = tmp_path / "00000000000000000000"
    data = bytearray(path.read_bytes())
    BLANK.pack_into(data, 984, 12, 0xCBD43194)  # a blank that does not reach the file end
    path.write_bytes(bytes(data))
    assert [p for p, _ in open_log(tmp_path).walk(0, check_crc=True)] == offs[:2]


# -- truncate ----------------------------------------------------------------------------


def test_cut_mid_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    offs = append_records(log, [400] * 5)  # 0, 492 | 1000, 1492 | 2000
    assert log.has_data_after(offs[3])
    log.cut(offs[3])
    assert log.max_offset == offs[3]
    assert sorted(p.name for p in tmp_path.iterdir()) == [segment_name(0), segment_name(1000)]
    assert (tmp_path / segment_name(1000)).read_bytes()[492:] == bytes(SEG - 492)
    assert not log.has_data_after(offs[3])
    assert [p for p, _ in log.walk(0, check_crc=True)] == offs[:3]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(offs[3])
    # appending goes on from the cut
    assert append_records(log, [50]) == [offs[3]]
    log.close()
    log = open_log(tmp_path)
    assert [p for p, _ in log.walk(0, check_crc=True)] == [*offs[:3], offs[3]]
    log.close()


def test_cut_on_segment_boundary(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    offs = append_records(log, [400] * 5)
    log.cut(1000)
    assert log.max_offset == 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == [segment_name(0)]
    # the blank closing the kept file is still there
    assert BLANK.unpack_from((tmp_path / segment_name(0)).read_bytes(), 984) == (16, 0xCBD43194)
    assert [p for p, _ in log.walk(0, check_crc=True)] == offs[:2]
    log.close()


def test_segment_queue_truncate(tmp_path: Path) -> None:
    q = SegmentQueue(tmp_path, 100, read_only=False)
    for base in (0, 100, 200):
        q.segment_for_write(base).write_at(0, b"\x01" * 100)
    assert q.max_offset == 300
    dropped = q.truncate(150)
    assert dropped == 150
    assert q.max_offset == 150
    assert sorted(p.name for p in tmp_path.iterdir()) == [segment_name(0), segment_name(100)]
    assert (tmp_path / segment_name(100)).read_bytes() == b"\x01" * 50 + bytes(50)
    assert q.truncate(0) == 150
    assert list(tmp_path.iterdir()) == []
    assert q.max_offset == 0
    q.close()


def test_set_end_positions(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append_records(log, [400] * 5)
    log.close()
    log = open_log(tmp_path)
    assert log.max_offset == 3000  # before recovery, every loaded segment counts as full
    log.set_end(1492)
    assert log.max_offset == 1492
    assert [mf.wrote_position for mf in log.segments.files] == [SEG, 492, 0]
    log.close()
