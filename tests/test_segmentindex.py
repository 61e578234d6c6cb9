"""The segment index (pipeline/format/segmentindex.py) against a plain model.

* Property test: random messages (every transaction type, keys, tags, IPv6 hosts, generated
  and given unique keys) are put by the store's own writer into a store of small segments and,
  alongside, into :class:`tests.kit.model.StoreModel`. Each sealed segment's index is built
  from the segment's bytes (the whole file, and the object's bytes alone) and compared with
  what the model says the segment holds: its queues and their units, its key entries (hashed
  by the model's own Java hash), its record count, times and data end. Key look-ups by range
  (tiny windows, so that every search path runs) and time look-ups are checked against the
  model too.
* Corruption: a flipped byte, a truncated object, a bad magic, and random bytes or mutations
  fed to the parser raise :class:`CorruptIndexError` naming the object and the byte, never
  anything else; a damaged record in the segment fails the build naming the segment and the
  record's offset.
"""

from __future__ import annotations

import random
import struct
import zlib
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketstore.pipeline.errors import CorruptIndexError, CorruptRecordError
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.format.segmentindex import (
    HEADER,
    HEADER_SIZE,
    KEY_SIZE,
    QUEUE_ROW,
    ROW_SIZE,
    NeedMore,
    SegmentIndex,
    build_segment_index,
    key_stride,
    unit_at_time,
)
from tests.kit.strategies import messages
from tests.kit.tiermodel import Written, expected_keys, expected_rows, key_hash, written


def reader(blob: bytes, *, strict: bool = True) -> Callable[[int, int], bytes]:
    """Ranged reads of ``blob``, as a GET of bytes [start, end) of an object (``strict``: the
    reader asks for nothing past the object; else a read past it is short, as a GET's)."""

    def read(start: int, end: int) -> bytes:
        assert not strict or 0 <= start <= end <= len(blob)
        return blob[start:end]

    return read


class counting:
    """:func:`reader` that also records the ranges it was asked for."""

    def __init__(self, blob: bytes) -> None:
        self.read = reader(blob)
        self.reads: list[tuple[int, int]] = []

    def __call__(self, start: int, end: int) -> bytes:
        self.reads.append((start, end))
        return self.read(start, end)


def as_version_1(index: bytes) -> bytes:
    """The version 1 object of the same segment (as uploads before the key sample wrote it):
    the sample cut out of the head, the rows' unit starts moved back, both CRCs made again.
    Written here from the layout in docs/tiering.md, so that the reader's version 1 path is
    tested against objects of that layout."""
    (magic, _, base, end, records, queues, keys, names, lo, hi, _, _) = HEADER.unpack_from(index)
    names_end = HEADER_SIZE + ROW_SIZE * queues + names
    (stride,) = struct.unpack_from(">i", index, names_end)
    cut = 4 + 4 * -(-keys // stride)
    table = bytearray(index[HEADER_SIZE:names_end])
    for i in range(queues):
        row = list(QUEUE_ROW.unpack_from(table, ROW_SIZE * i))
        row[5] -= cut
        QUEUE_ROW.pack_into(table, ROW_SIZE * i, *row)
    body = bytes(table) + index[names_end + cut :]
    head = HEADER.pack(magic, 1, base, end, records, queues, keys, names, lo, hi, 0, 0)[:56]
    head += struct.pack(">I", zlib.crc32(body))
    head_crc = zlib.crc32(body[: names_end - HEADER_SIZE], zlib.crc32(head))
    return head + struct.pack(">I", head_crc) + body


def check_index(w: Written, base: int, raw: bytes, index: bytes) -> SegmentIndex:
    held = w.held(base)
    where = f"index/{base:020d}"
    parsed = SegmentIndex.parse(index, where=where)
    last = held[-1].ext
    assert parsed.base == base
    assert parsed.data_end == last.commit_log_offset - base + last.store_size + 8
    assert parsed.records == len(held)
    assert parsed.min_store_timestamp == min(s.ext.store_timestamp for s in held)
    assert parsed.max_store_timestamp == max(s.ext.store_timestamp for s in held)
    rows = expected_rows(held)
    assert [(r.topic, r.queue_id) for r in parsed.rows] == sorted(
        rows, key=lambda k: (k[0].encode(), k[1])
    )
    for r in parsed.rows:
        want = rows[(r.topic, r.queue_id)]
        got = parsed.units(r)
        assert [tuple(u) for u in got.tolist()] == want
        queue = w.model.queues[(r.topic, r.queue_id)]
        offsets = [
            s.ext.queue_offset for s in queue if base <= s.ext.commit_log_offset < base + w.segment
        ]
        assert list(range(r.first, r.end)) == offsets
        assert parsed.row(r.topic, r.queue_id) == r
    assert parsed.row("no such topic", 0) is None
    keys = expected_keys(held)
    assert parsed.keys == len(keys)
    return parsed


segment_sizes = st.sampled_from([4096, 8192])
batches = st.lists(
    st.tuples(st.lists(messages(), min_size=1, max_size=12), st.integers(0, 5000)),
    min_size=1,
    max_size=16,
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=batches,
    segment=segment_sizes,
    window=st.sampled_from([1, 2, 3, 4096]),
    stride=st.sampled_from([1, 2, 3, 1024]),
    data=st.data(),
)
def test_index_matches_the_model(
    batches: list[tuple[list[Message], int]],
    segment: int,
    window: int,
    stride: int,
    data: st.DataObject,
) -> None:
    with written(batches, segment) as w:
        sealed = w.segments()[:-1]  # the last one is still written to
        for base, raw in sealed:
            index = build_segment_index(raw, base, len(raw), stride=stride)
            parsed = check_index(w, base, raw, index)
            # The object holds the segment only up to its blank: the same index from it.
            assert (
                build_segment_index(raw[: parsed.data_end], base, parsed.data_end, stride=stride)
                == index
            )
            # The head alone, as a ranged reader gets it: first too short, then enough (at
            # most three reads: the header, up to the sample's stride, the whole head).
            step: SegmentIndex | NeedMore = NeedMore(30)
            for _ in range(4):
                assert isinstance(step, NeedMore)
                step = SegmentIndex.parse_head(index[: step.length], where="i", length=len(index))
                if isinstance(step, SegmentIndex):
                    break
            head = step
            assert isinstance(head, SegmentIndex)
            assert head.rows == parsed.rows and head.keys_start == parsed.keys_start
            assert head.key_stride == stride and head.head_length == parsed.head_length

            ranged = counting(index)
            old = as_version_1(index)
            assert build_segment_index(raw, base, len(raw), version=1) == old
            old_head = SegmentIndex.parse(old, where="i")
            assert old_head.key_stride == 0 and old_head.rows != parsed.rows  # units moved
            held = w.held(base)
            keys = expected_keys(held)
            probes = {h for h, _ in keys} | {0, 2**31 - 1, data.draw(st.integers(0, 2**31 - 1))}
            for h in probes:
                want = sorted(o for kh, o in keys if kh == h)
                ranged.reads.clear()
                assert head.key_offsets(h, ranged, window=window).tolist() == want
                # One read, of the stride around the hash (more when its run spans strides).
                assert len(ranged.reads) <= 1
                run = sum(1 for kh, _ in keys if kh == h)
                assert sum(b - a for a, b in ranged.reads) <= KEY_SIZE * (
                    stride * (2 + -(-run // stride))
                )
                assert parsed.key_offsets(h, window=window).tolist() == want
                assert old_head.key_offsets(h, reader(old), window=window).tolist() == want
            for r in head.rows:
                a, b = sorted(data.draw(st.integers(r.first - 1, r.end + 1)) for _ in range(2))
                lo, hi = head.unit_range(r, a, b)
                got = head.units(r, ranged(lo, hi), lo)["offset"].tolist()
                all_units = [u[0] for u in expected_rows(held)[(r.topic, r.queue_id)]]
                assert (
                    got
                    == all_units[max(a, r.first) - r.first : max(min(b, r.end), r.first) - r.first]
                )
                times = [u[3] for u in expected_rows(held)[(r.topic, r.queue_id)]]
                t = data.draw(st.integers(times[0] - 1, times[-1] + 1))
                assert unit_at_time(parsed.units(r), t) == next(
                    (i for i, x in enumerate(times) if x >= t), len(times)
                )


# -- corruption --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sample() -> tuple[bytes, bytes, int]:
    """(segment bytes, index, base) of one sealed segment with many queues and keys."""
    batch = [
        Message(f"T{i % 5}", bytes(40), queue_id=i % 3, keys=[f"k{i}", "shared"], tags="t")
        for i in range(120)
    ]
    with written([(batch, 1), (batch, 1)], 8192) as w:
        base, raw = w.segments()[0]
        return raw, build_segment_index(raw, base, len(raw)), base


def test_flipped_byte_truncation_and_magic_name_the_object(
    sample: tuple[bytes, bytes, int],
) -> None:
    _, index, _ = sample
    for at in (0, 10, 57, 64, 70, len(index) // 2, len(index) - 1):
        bad = bytearray(index)
        bad[at] ^= 0x40
        with pytest.raises(CorruptIndexError, match=r"^bucket/index/x @ offset \d+: ") as e:
            SegmentIndex.parse(bytes(bad), where="bucket/index/x")
        assert 0 <= e.value.offset <= len(index)
    with pytest.raises(CorruptIndexError, match="counts say"):
        SegmentIndex.parse(index[:-5], where="o")
    with pytest.raises(CorruptIndexError, match="truncated"):
        SegmentIndex.parse(index[:70], where="o")
    with pytest.raises(CorruptIndexError, match="bad magic") as e:
        SegmentIndex.parse(b"XXXX" + index[4:], where="o")
    assert e.value.offset == 0 and isinstance(e.value, CorruptRecordError)


def test_damaged_record_fails_the_build_naming_segment_and_offset(
    sample: tuple[bytes, bytes, int],
) -> None:
    raw, index, base = sample
    parsed = SegmentIndex.parse(index, where="o")
    unit = parsed.units(parsed.rows[3])[1]
    bad = bytearray(raw)
    at = int(unit["offset"]) - base + 90  # inside the body (IPv4 hosts: it starts at 88)
    bad[at] ^= 0xFF
    with pytest.raises(CorruptRecordError) as e:
        build_segment_index(bytes(bad), base, len(raw))
    assert e.value.offset == int(unit["offset"])
    assert f"{base:020d}" in str(e.value)
    with pytest.raises(CorruptRecordError, match="not a whole record"):
        build_segment_index(raw, base, parsed.data_end - 3)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_parser_fed_random_or_mutated_bytes_raises_only_its_error(
    sample: tuple[bytes, bytes, int], data: st.DataObject
) -> None:
    _, index, _ = sample
    kind = data.draw(st.sampled_from(["random", "mutated", "cut"]))
    if kind == "random":
        blob = data.draw(st.binary(max_size=400))
        if data.draw(st.booleans()):
            blob = index[:4] + blob[4:]
    elif kind == "cut":
        blob = index[: data.draw(st.integers(0, len(index)))]
    else:
        bad = bytearray(index)
        rng = random.Random(data.draw(st.integers()))
        for _ in range(data.draw(st.integers(1, 4))):
            bad[rng.randrange(len(bad))] = rng.randrange(256)
        blob = bytes(bad)
    try:
        whole = SegmentIndex.parse(blob, where="o")
    except CorruptIndexError:
        pass
    else:
        # Every byte is under one of the two CRCs: only the object itself passes.
        assert whole.length == len(index) and blob == index
    try:
        head = SegmentIndex.parse_head(
            blob, where="o", length=data.draw(st.none() | st.just(len(blob)))
        )
    except CorruptIndexError:
        return
    if isinstance(head, NeedMore):
        return

    # Units and keys read by range from damaged bytes are unchecked data, never a crash.
    ranged = reader(blob, strict=False)
    try:
        for r in head.rows:
            lo, hi = head.unit_range(r, r.first, r.end)
            head.units(r, ranged(lo, hi), lo)
        head.key_offsets(data.draw(st.integers(0, 2**31 - 1)), ranged, window=2)
    except CorruptIndexError:
        pass


def test_empty_queue_table_and_no_keys_round_trip() -> None:
    """A segment whose records are all ROLLBACK: no queue row and no key entry."""
    batch = [Message("T", bytes(300), sys_flag=0xC, keys=["a"]) for _ in range(30)]
    with written([(batch, 1)], 4096) as w:
        base, raw = w.segments()[0]
        parsed = SegmentIndex.parse(build_segment_index(raw, base, len(raw)), where="o")
        assert parsed.rows == () and parsed.keys == 0 and parsed.records == len(w.held(base))
        assert parsed.key_offsets(key_hash("T", "a")).tolist() == []
        assert len(np.asarray(parsed.key_offsets(0, lambda a, b: b""))) == 0


def test_a_key_sample_that_disagrees_with_the_entries_is_named() -> None:
    """Both CRCs right (the object was written so), the sample not the entries' every stride-th
    hash: a whole parse names the sample's byte; the default stride bounds the sample."""
    batch = [Message("T", bytes(20), keys=[f"k{i}"]) for i in range(60)]
    with written([(batch, 1), (batch, 1)], 8192) as w:
        base, raw = w.segments()[0]
        index = build_segment_index(raw, base, len(raw), stride=4)
    head = SegmentIndex.parse(index, where="o")
    at = head.head_length - len(head.key_sample) + 4  # the second sampled hash
    bad = bytearray(index)
    bad[at : at + 4] = struct.pack(">i", struct.unpack_from(">i", index, at)[0] + 1)
    body_crc = zlib.crc32(bad[HEADER_SIZE:])
    bad[56:60] = struct.pack(">I", body_crc)
    bad[60:64] = struct.pack(
        ">I", zlib.crc32(bad[HEADER_SIZE : head.head_length], zlib.crc32(bad[:60]))
    )
    with pytest.raises(CorruptIndexError, match="key sample") as e:
        SegmentIndex.parse(bytes(bad), where="o")
    assert e.value.offset == head.head_length - len(head.key_sample)
    for keys in (0, 1, 4096 * 1024, 4096 * 1024 + 1, 10**8):
        stride = key_stride(keys)
        assert stride >= 1024 and stride & (stride - 1) == 0 and -(-keys // stride) <= 4096
