"""Decoding many CommitLog records of one segment at once, with numpy and Arrow.

The input is a segment file's bytes (a read-only mapping) and the positions of the records to
decode, ascending. Fixed-width fields are gathered for all records in one numpy fancy-index
each (the 48-byte head, then a 64-byte window holding the hosts, the store time, the reconsume
count and the body length, whose positions depend on the IPv6 flags). Variable-width fields
(body, properties) become Arrow binary arrays without a Python loop: the segment is
viewed as a binary array whose elements alternate *field, gap, field, gap, ...* (the offsets
``[start0, end0, start1, end1, ...]`` are ascending because the records are), and taking every
other element copies the fields out, contiguous.

The one per-record Python step is the body CRC (``zlib.crc32``), which nothing vectorises.
Hosts are formatted once per distinct host (there are few), msgIds with a hex lookup table.

Every record is checked: magic, TOTALSIZE (against the ConsumeQueue unit's size when given),
PHYSICALOFFSET, field lengths adding up to TOTALSIZE, and the body CRC. The first failure raises
:class:`~pipeline.errors.CorruptRecordError` naming the segment file and the record's offset.

Pure functions over the given buffers; thread-safe; the results own their memory (nothing
returned refers to the mapping, which the caller may close afterwards).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import itertools
import zlib
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pipeline import record
from pipeline.errors import CorruptRecordError

Bytes = npt.NDArray[np.uint8]
I64 = npt.NDArray[np.int64]

WINDOW = 64  # bytes after the head that hold every fixed field up to BODYLENGTH
_HEX_DIGITS = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
# Two ASCII hex digits per byte value, as one uint16 in memory order.
_HEX_WORDS = (
    np.stack([_HEX_DIGITS[np.arange(256) >> 4], _HEX_DIGITS[np.arange(256) & 15]], axis=1)
    .copy()
    .view(np.uint16)
    .ravel()
)
_HEAD_COLS = np.arange(record.HEAD_SIZE, dtype=np.int64)


@dataclasses.dataclass
class Records:
    """Decoded columns of ``n`` records (numpy for numbers, Arrow for the rest)."""

    phys: I64
    size: I64
    queue_id: npt.NDArray[np.int32]
    queue_offset: I64
    flag: npt.NDArray[np.int32]
    sys_flag: npt.NDArray[np.int32]
    born_ts: I64
    store_ts: I64
    reconsume: npt.NDArray[np.int32]
    born_host: pa.Array
    store_host: pa.Array
    msg_id: pa.Array
    topic_ok: npt.NDArray[np.bool_]  # the record's topic is the one asked for
    body: pa.Array
    props: pa.Array

    def __len__(self) -> int:
        return len(self.phys)

    def take(self, rows: npt.NDArray[Any]) -> Records:
        """The records at ``rows`` (indices or a boolean mask)."""
        idx = np.flatnonzero(rows) if rows.dtype == np.bool_ else rows
        arrow_idx = pa.array(idx, pa.int64())
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.take(arrow_idx) if isinstance(value, pa.Array) else value[idx]
        return Records(**out)

    @staticmethod
    def concat(parts: list[Records]) -> Records:
        if len(parts) == 1:
            return parts[0]
        out: dict[str, Any] = {}
        for f in dataclasses.fields(Records):
            values = [getattr(p, f.name) for p in parts]
            out[f.name] = (
                pa.concat_arrays(values)
                if isinstance(values[0], pa.Array)
                else np.concatenate(values)
            )
        return Records(**out)


def empty_records() -> Records:
    z64 = np.zeros(0, np.int64)
    z32 = np.zeros(0, np.int32)
    s = pa.array([], pa.string())
    b = pa.array([], pa.binary())
    return Records(z64, z64, z32, z64, z32, z32, z64, z64, z32, s, s, s, np.zeros(0, bool), b, b)


def _be(cols: Bytes, dtype: str) -> npt.NDArray[Any]:
    """Rows of big-endian bytes as native integers."""
    return np.ascontiguousarray(cols).view(dtype).ravel().astype(dtype.lstrip(">"))


def gather_rows(data: Bytes, starts: I64, width: int) -> Bytes:
    """``width`` bytes from each of ``starts`` as an ``(n, width)`` matrix; bytes past the end
    of ``data`` read as zero.

    A strided view of ``data`` whose rows start one byte apart turns the gather into one row
    copy per start instead of one index per byte.
    """
    n = len(starts)
    out = np.zeros((n, width), dtype=np.uint8)
    limit = len(data) - width
    inside = starts <= limit
    if limit >= 0:
        rows = np.lib.stride_tricks.as_strided(
            data, shape=(limit + 1, width), strides=(1, 1), writeable=False
        )
        out[inside] = rows[starts[inside]]
    for i in np.flatnonzero(~inside).tolist():
        tail = data[int(starts[i]) :]
        out[i, : len(tail)] = tail
    return out


def _field(matrix: Bytes, column: int, shift: I64, width: int) -> Bytes:
    """``width`` bytes per row from column ``column + shift[row]`` (shifts are 0 for IPv4
    hosts, so the common case is one slice)."""
    out = matrix[:, column : column + width].copy()  # a copy: rows are written below
    moved = np.flatnonzero(shift)
    if len(moved):
        cols = column + shift[moved][:, None] + np.arange(width)
        out[moved] = matrix[moved[:, None], cols]
    return out


def slices(buffer: pa.Buffer, starts: I64, ends: I64) -> pa.Array:
    """The byte ranges ``[starts[i], ends[i])`` of ``buffer`` as a new binary array.

    The ranges must be ascending and not overlap; positions must fit in int32 (a segment is at
    most 2 GiB - 1, as RocketMQ requires).
    """
    n = len(starts)
    if n == 0:
        return pa.array([], pa.binary())
    offsets = np.empty(2 * n, dtype=np.int32)
    offsets[0::2] = starts
    offsets[1::2] = ends
    interleaved = pa.BinaryArray.from_buffers(
        pa.binary(), 2 * n - 1, [None, pa.py_buffer(offsets), buffer]
    )
    return interleaved.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64)))


def binary_offsets(arr: pa.Array) -> npt.NDArray[np.int32]:
    return np.frombuffer(
        arr.buffers()[1], dtype=np.int32, count=len(arr) + 1, offset=arr.offset * 4
    )


def body_crcs(bodies: pa.Array) -> I64:
    """``crc32(body) & 0x7FFFFFFF`` of every body (the per-record loop nothing vectorises)."""
    offs = binary_offsets(bodies).tolist()
    data = bodies.buffers()[2]
    view = memoryview(data) if data is not None else memoryview(b"")
    crc = zlib.crc32
    return np.fromiter(
        (crc(view[a:b]) & 0x7FFFFFFF for a, b in itertools.pairwise(offs)),
        dtype=np.int64,
        count=len(bodies),
    )


def format_hosts(field: Bytes, v6: npt.NDArray[np.bool_]) -> pa.Array:
    """``ip:port`` (IPv6 as ``[addr]:port``) of host fields: ``field`` rows hold the 8 bytes
    (IPv4 address, int port) or 20 bytes (IPv6) of each record's host. Formatted once per
    distinct host."""
    n = len(field)
    index = np.empty(n, dtype=np.int64)
    labels: list[str] = []
    any_v6 = bool(v6.any())
    v4_rows = np.flatnonzero(~v6) if any_v6 else np.arange(n)
    if len(v4_rows):
        # Address and port of each IPv4 host as one big-endian uint64 key.
        head = field[v4_rows, 0:8] if any_v6 else field[:, 0:8]
        keys = np.ascontiguousarray(head).view(">u8").ravel()
        if (keys == keys[0]).all():  # one host: no sort needed
            uniq, inverse = keys[:1], np.zeros(len(keys), dtype=np.int64)
        else:
            uniq, inverse = np.unique(keys, return_inverse=True)
        for value in uniq.astype(np.uint64).tolist():
            port_value = value & 0xFFFFFFFF
            port_signed = port_value - (1 << 32) if port_value & 0x80000000 else port_value
            labels.append(f"{ipaddress.IPv4Address(value >> 32)}:{port_signed}")
        index[v4_rows] = inverse.ravel()
    v6_rows = np.flatnonzero(v6)
    if len(v6_rows):
        seen: dict[bytes, int] = {}
        for row in v6_rows.tolist():
            raw = field[row, 0:20].tobytes()
            at = seen.get(raw)
            if at is None:
                port = record.INT.unpack_from(raw, 16)[0]
                at = seen[raw] = len(labels)
                labels.append(record.format_host_bytes(raw[:16], port))
            index[row] = at
    if len(labels) == 1:
        return constant_strings(labels[0], n)
    return pa.array(labels, pa.string()).take(pa.array(index))


def constant_strings(value: str, n: int) -> pa.Array:
    """``n`` copies of ``value`` as a string array."""
    raw = value.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw * n))


def format_msg_ids(store_field: Bytes, v6: npt.NDArray[np.bool_], phys: I64) -> pa.Array:
    """Offset msgIds: uppercase hex of the store host field and the physical offset."""
    n = len(phys)
    phys_be = phys.astype(">i8").view(np.uint8).reshape(n, 8)
    width = 28 if v6.any() else 16
    raw = np.empty((n, width), dtype=np.uint8)
    raw[:, 0:8] = store_field[:, 0:8]
    raw[:, 8:16] = phys_be
    if width == 28:
        raw[v6, 8:20] = store_field[v6, 8:20]
        raw[v6, 20:28] = phys_be[v6]
    text = _HEX_WORDS[raw].view(np.uint8).reshape(n, 2 * width)
    if width == 16:
        offsets = np.arange(0, 32 * n + 1, 32, dtype=np.int32)
        return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(text))
    starts = np.arange(n, dtype=np.int64) * 56
    ends = starts + np.where(v6, 56, 32)
    return slices(pa.py_buffer(text), starts, ends).cast(pa.string())


def decode_segment(
    data: Bytes,
    buffer: pa.Buffer,
    rel: I64,
    *,
    base: int,
    path: str,
    topic: bytes,
    sizes: I64 | None = None,
    check_crc: bool = True,
) -> Records:
    """Decode the records at positions ``rel`` (ascending) of one segment.

    ``data`` and ``buffer`` are the same segment bytes (numpy and Arrow views), ``base`` the
    segment's first offset in the log; ``topic`` the topic the records should have
    (:attr:`Records.topic_ok` says which do). ``sizes``, when given, are the sizes the ConsumeQueue
    units claim, checked against each record's TOTALSIZE.
    """
    n = len(rel)
    if n == 0:
        return empty_records()
    seglen = len(data)
    phys = base + rel

    def fail(rows: npt.NDArray[np.bool_], reason: str) -> None:
        bad = np.flatnonzero(rows)
        if len(bad):
            i = int(bad[0])
            raise CorruptRecordError(path, int(phys[i]), reason.format(i=i))

    fail(rel + record.HEAD_SIZE > seglen, "record head runs past the end of the segment")
    matrix = gather_rows(data, rel, record.HEAD_SIZE + WINDOW)
    head = np.ascontiguousarray(matrix[:, : record.HEAD_SIZE]).view(record.HEAD_DTYPE).ravel()
    total = head["size"].astype(np.int64)
    magic = head["magic"]
    fail(magic != record.MAGIC, "bad magic code (not the start of a record)")
    if sizes is not None:
        mismatch = total != sizes
        if mismatch.any():
            i = int(np.flatnonzero(mismatch)[0])
            raise CorruptRecordError(
                path,
                int(phys[i]),
                f"TOTALSIZE {int(total[i])} differs from the ConsumeQueue unit's size "
                f"{int(sizes[i])}",
            )
    fail(total < record.FIXED_SIZE_V4, "TOTALSIZE below the fixed record size")
    fail(rel + total > seglen, "record runs past the end of the segment")
    fail(head["phys"] != phys, "PHYSICALOFFSET field does not match the record's offset")
    sys_flag = head["sys_flag"].astype(np.int32)
    born_v6 = (sys_flag & record.BORNHOST_V6_FLAG) != 0
    store_v6 = (sys_flag & record.STOREHOSTADDRESS_V6_FLAG) != 0
    be = np.where(born_v6, 12, 0).astype(np.int64)
    se = np.where(store_v6, 12, 0).astype(np.int64)
    # Matrix columns with IPv4 hosts: born host 48, store time 56, store host 64, reconsume
    # times 72, prepared transaction offset 76, body length 84; an IPv6 host moves what
    # follows it by 12.
    store_ts = _be(_field(matrix, 56, be, 8), ">i8")
    reconsume = _be(_field(matrix, 72, be + se, 4), ">i4")
    body_len = _be(_field(matrix, 84, be + se, 4), ">i4").astype(np.int64)
    end = rel + total
    body_start = rel + 88 + be + se
    fail((body_len < 0) | (body_start + body_len + 3 > end), "BODYLENGTH exceeds TOTALSIZE")
    topic_pos = body_start + body_len
    topic_len = data[topic_pos].astype(np.int64)
    props_pos = topic_pos + 1 + topic_len
    fail(props_pos + 2 > end, "TOPICLENGTH exceeds TOTALSIZE")
    props_len = (
        (data[props_pos].astype(np.int16) << 8) | data[props_pos + 1].astype(np.int16)
    ).astype(np.int64)
    props_start = props_pos + 2
    fail(
        (props_len < 0) | (props_start + props_len != end),
        "field lengths do not add up to TOTALSIZE",
    )
    body = slices(buffer, body_start, body_start + body_len)
    if check_crc:
        stored = head["crc"].astype(np.int64)
        computed = body_crcs(body)
        bad = np.flatnonzero(stored != computed)
        if len(bad):
            i = int(bad[0])
            raise CorruptRecordError(
                path,
                int(phys[i]),
                f"body CRC mismatch: stored {int(stored[i])}, computed {int(computed[i])}",
            )
    born_field = matrix[:, 48:68]
    store_field = _field(matrix, 64, be, 20)
    return Records(
        phys=phys.astype(np.int64),
        size=total,
        queue_id=head["queue_id"].astype(np.int32),
        queue_offset=head["queue_offset"].astype(np.int64),
        flag=head["flag"].astype(np.int32),
        sys_flag=sys_flag,
        born_ts=head["born_ts"].astype(np.int64),
        store_ts=store_ts.astype(np.int64),
        reconsume=reconsume.astype(np.int32),
        born_host=format_hosts(born_field, born_v6),
        store_host=format_hosts(store_field, store_v6),
        msg_id=format_msg_ids(store_field, store_v6, phys.astype(np.int64)),
        topic_ok=_topic_is(data, topic_pos, topic_len, topic),
        body=body,
        props=slices(buffer, props_start, end),
    )


def _topic_is(data: Bytes, topic_pos: I64, topic_len: I64, topic: bytes) -> npt.NDArray[np.bool_]:
    """Whether each record's TOPIC field is ``topic`` (compared in place, not copied out)."""
    ok = topic_len == len(topic)
    rows = np.flatnonzero(ok)
    if len(rows):
        got = gather_rows(data, topic_pos[rows] + 1, len(topic))
        ok[rows] = (got == np.frombuffer(topic, dtype=np.uint8)).all(axis=1)
    return np.asarray(ok)


def record_starts(data: Bytes, rel: I64, base: int) -> npt.NDArray[np.bool_]:
    """Which positions hold the start of a record (magic and PHYSICALOFFSET both right): for
    index look-ups, whose candidates may point at anything."""
    ok = rel + record.HEAD_SIZE <= len(data)
    out = np.zeros(len(rel), dtype=bool)
    if ok.any():
        r = rel[ok]
        head = data[r[:, None] + _HEAD_COLS].view(record.HEAD_DTYPE).ravel()
        out[ok] = (head["magic"] == record.MAGIC) & (head["phys"] == base + r)
    return out
