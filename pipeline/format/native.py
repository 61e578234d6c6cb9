"""The Python face of the native core (``rocketstore.pipeline._native``, the Rust crate in ``native/``).

Every loop over messages runs in compiled code with the GIL released: record encoding straight
into a mapped segment, body CRCs, Java string hashes, index chains, the record walk and the
record decoder. This module adapts Arrow and numpy columns to the crate's buffer arguments and
turns its results into numpy and Arrow arrays (the decoder's without a copy); the readable
reference for every format stays in :mod:`rocketstore.pipeline.format.record`.

Thread-safety: the functions are pure over their arguments; the caller owns any buffer it
passes as an output (the store's single writer owns its segments).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from rocketstore.pipeline import _native
from rocketstore.pipeline.errors import CorruptRecordError, NativeError
from rocketstore.pipeline.format.record import MessageExt
from rocketstore.pipeline.layout import UNIT_DTYPE

StringTriple = tuple[Any, npt.NDArray[Any] | int, npt.NDArray[np.uint8] | None]
EncodeBatch = _native.EncodeBatch
index_put = _native.index_put
index_mend = _native.index_mend
index_keys = _native.index_keys
uniq_ids = _native.uniq_ids
SinglePut = _native.SinglePut

_EMPTY = b""


def strings(arr: pa.Array) -> StringTriple:
    """A string or binary Arrow array as ``(data, offsets, validity)`` for the crate, without a
    copy: the data buffer and the ``n + 1`` offsets (int32, or int64 for the ``large_`` types)
    as Arrow holds them, and one byte per row (1 = present), or None when no row is null. A
    column with no value at all is ``(b"", n, None)``."""
    if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type):
        width: type = np.int64
    elif pa.types.is_string(arr.type) or pa.types.is_binary(arr.type):
        width = np.int32
    else:
        raise TypeError(f"expected a string or binary array, got {arr.type}")
    n = len(arr)
    bufs = arr.buffers()
    if n and arr.null_count == n:
        return _EMPTY, n, None
    if bufs[1] is None:  # an empty array may come without buffers
        return _EMPTY, np.zeros(n + 1, dtype=width), None
    offsets: npt.NDArray[Any] = np.frombuffer(bufs[1], dtype=width)[arr.offset : arr.offset + n + 1]
    data = bufs[2] if bufs[2] is not None else _EMPTY
    valid = None
    if arr.null_count:
        valid = arr.is_valid().to_numpy(zero_copy_only=False).view(np.uint8)
    return data, offsets, valid


def table_of(values: list[bytes]) -> StringTriple:
    """A small table of byte strings (distinct topics, born hosts) in the crate's layout."""
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum([len(v) for v in values], out=offsets[1:])
    return b"".join(values), offsets, None


def body_crcs(bodies: pa.Array) -> npt.NDArray[np.int32]:
    """BODYCRC (CRC-32 masked to 31 bits) of every body of a binary array."""
    out = np.empty(len(bodies), dtype=np.int32)
    _native.body_crcs(strings(bodies), out)
    return out


def java_hashes(values: pa.Array) -> npt.NDArray[np.int32]:
    """Java ``String.hashCode`` of every string (0 for null) of a string array."""
    out = np.empty(len(values), dtype=np.int32)
    _native.java_hashes(strings(values), out)
    return out


# Why a walk stopped (the crate's STOP_* values).
STOP_END = 0
STOP_BLANK = 1
STOP_INVALID = 2


@dataclasses.dataclass(frozen=True)
class Walk:
    """Records walked in one segment, column by column, and where and why the walk stopped.

    ``topics`` are the distinct topic names ``topic_codes`` index (invalid UTF-8 replaced;
    ``raw_topics`` holds them as stored, for a caller that must reject such a topic). Index entries are listed in
    RocketMQ's order (per record: UNIQ_KEY, then each KEYS token; none for ROLLBACK records):
    ``key_rows`` names each entry's record, ``key_hashes`` its key hash. ``end`` is the
    physical offset where the walk stopped; ``stop`` is :data:`STOP_END` (no more bytes or
    the record limit), :data:`STOP_BLANK` (an END_OF_FILE blank ends the segment) or
    :data:`STOP_INVALID` (``reason`` says what is wrong with the bytes at ``end``).
    """

    phys: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    queue_ids: npt.NDArray[np.int32]
    queue_offsets: npt.NDArray[np.int64]
    sys_flags: npt.NDArray[np.int32]
    store_ts: npt.NDArray[np.int64]
    tags_codes: npt.NDArray[np.int64]
    topic_codes: npt.NDArray[np.int32]
    key_rows: npt.NDArray[np.int64]
    key_hashes: npt.NDArray[np.int32]
    topics: list[str]
    raw_topics: list[bytes]
    end: int
    stop: int
    reason: str

    def __len__(self) -> int:
        return len(self.phys)


_WALK_DTYPES = {
    "phys": np.int64,
    "sizes": np.int64,
    "queue_ids": np.int32,
    "queue_offsets": np.int64,
    "sys_flags": np.int32,
    "store_ts": np.int64,
    "tags_codes": np.int64,
    "topic_codes": np.int32,
    "key_rows": np.int64,
    "key_hashes": np.int32,
}


def walk(
    buf: Any,
    start: int,
    limit: int,
    base: int,
    *,
    check_crc: bool,
    max_records: int | None = None,
) -> Walk:
    """Walk the records of one segment's bytes ``buf`` from ``start`` (relative, a record
    boundary) up to ``limit``; ``base`` is the segment's physical offset. Stops at the first
    bytes that are not a whole, valid record (magic, sizes, PHYSICALOFFSET, the body CRC when
    ``check_crc``, no NUL in the topic or properties: see :func:`rocketstore.pipeline.format.record.torn_tail`),
    at an END_OF_FILE blank, or after ``max_records``."""
    raw = _native.walk(buf, start, limit, base, check_crc, max_records or (1 << 62))
    cols = {name: np.frombuffer(raw[name], dtype=dtype) for name, dtype in _WALK_DTYPES.items()}
    return Walk(
        **cols,
        topics=[t.decode("utf-8", "replace") for t in raw["topics"]],
        raw_topics=list(raw["topics"]),
        end=base + int(raw["end"]),
        stop=int(raw["stop"]),
        reason=str(raw["reason"]),
    )


@dataclasses.dataclass(frozen=True)
class Dispatched:
    """What one segment's records give dispatch (see :func:`dispatch_walk`)."""

    runs: list[tuple[str, int, int, npt.NDArray[np.void]]]
    key_hashes: npt.NDArray[np.int32]
    phys: npt.NDArray[np.int64]
    store_ts: npt.NDArray[np.int64]
    count: int
    last_unit_ts: int
    end: int
    stop: int
    reason: str


def dispatch_walk(
    buf: Any, start: int, limit: int, base: int, end: int, *, check_crc: bool, index: bool
) -> Dispatched:
    """Walk the records of one segment's bytes ``buf`` from ``start`` (relative, a record
    boundary) that begin before physical offset ``end``, as :func:`walk` walks them, and derive
    in the same pass what dispatch writes: ``runs``, per queue in order of its first record,
    ``(topic, queueId, first queue offset, units)`` with the units as the ConsumeQueue file
    holds them (:data:`rocketstore.pipeline.layout.UNIT_DTYPE`); the index entries in order (none
    unless ``index``); ``count`` records walked; ``last_unit_ts``, the store time of the last
    record that got a unit (-1 if none); and where the walk stopped, as :class:`Walk` says."""
    raw = _native.dispatch_walk(buf, start, limit, base, end, check_crc, index)
    return Dispatched(
        runs=[
            (topic.decode("utf-8", "replace"), qid, first, np.frombuffer(units, UNIT_DTYPE))
            for topic, qid, first, units in raw["runs"]
        ],
        key_hashes=np.frombuffer(raw["hashes"], np.int32),
        phys=np.frombuffer(raw["phys"], np.int64),
        store_ts=np.frombuffer(raw["times"], np.int64),
        count=int(raw["count"]),
        last_unit_ts=int(raw["last_unit_ts"]),
        end=base + int(raw["end"]),
        stop=int(raw["stop"]),
        reason=str(raw["reason"]),
    )


class Columns(enum.IntFlag):
    """The optional column groups of :func:`decode` (the numbers and ``topic`` always come)."""

    BODY = _native.DECODE_BODY
    PROPERTIES = _native.DECODE_PROPERTIES
    KEYS = _native.DECODE_KEYS
    TAGS = _native.DECODE_TAGS
    UNIQ_KEY = _native.DECODE_UNIQ_KEY
    HOSTS = _native.DECODE_HOSTS  # bornHost and storeHost
    MSG_ID = _native.DECODE_MSG_ID
    ALL = BODY | PROPERTIES | KEYS | TAGS | UNIQ_KEY | HOSTS | MSG_ID


PROPERTIES_TYPE = pa.map_(pa.string(), pa.string())
KEYS_TYPE = pa.list_(pa.string())
# (column, crate name, type) in the order of :func:`decode`'s batches; the names are
# MessageExt's getters, as in :meth:`rocketstore.pipeline.format.record.MessageExt.to_json`. Timestamps are ms.
_FIXED = (
    ("commitLogOffset", "phys", pa.int64()),
    ("storeSize", "size", pa.int32()),
    ("queueId", "queue_id", pa.int32()),
    ("queueOffset", "queue_offset", pa.int64()),
    ("sysFlag", "sys_flag", pa.int32()),
    ("flag", "flag", pa.int32()),
    ("bornTimestamp", "born_ts", pa.int64()),
    ("storeTimestamp", "store_ts", pa.int64()),
    ("reconsumeTimes", "reconsume", pa.int32()),
    ("preparedTransactionOffset", "prep_tx", pa.int64()),
    ("bodyCRC", "body_crc", pa.int32()),
)
_VARIABLE = (
    ("topic", "topic", pa.string()),
    ("body", "body", pa.binary()),
    ("properties", "properties", PROPERTIES_TYPE),
    ("keys", "keys", KEYS_TYPE),
    ("tags", "tags", pa.string()),
    ("uniqKey", "uniq_key", pa.string()),
    ("bornHost", "born_host", pa.string()),
    ("storeHost", "store_host", pa.string()),
    ("msgId", "msg_id", pa.string()),
)


def _buffer(owned: Any) -> pa.Buffer | None:
    return None if owned is None else pa.py_buffer(owned)


def _strings(raw: Any, n: int, t: pa.DataType) -> pa.Array:
    offsets, data, valid, nulls = raw
    return pa.Array.from_buffers(
        t, n, [_buffer(valid), _buffer(offsets), _buffer(data)], null_count=nulls
    )


def _arrow(raw: Any, n: int, t: pa.DataType) -> pa.Array:
    """One decoded column as an Arrow array over the crate's buffers (no copy)."""
    if not isinstance(raw, tuple):
        return pa.Array.from_buffers(t, n, [None, _buffer(raw)])
    if not (pa.types.is_list(t) or pa.types.is_map(t)):
        return _strings(raw, n, t)
    offsets, valid, nulls, items, values = raw
    names = _strings(items, len(items[0]) // 4 - 1, pa.string())
    if pa.types.is_list(t):
        child = names
    else:
        child = pa.StructArray.from_arrays(
            [names, _strings(values, len(names), pa.string())],
            fields=[t.key_field, t.item_field],
        )
    return pa.Array.from_buffers(
        t, n, [_buffer(valid), _buffer(offsets)], null_count=nulls, children=[child]
    )


def decode(
    buf: Any,
    rel: npt.NDArray[np.int64],
    base: int,
    *,
    path: str,
    limit: int | None = None,
    sizes: npt.NDArray[np.int64] | None = None,
    check_crc: bool = True,
    columns: Columns = Columns.ALL,
) -> pa.RecordBatch:
    """Decode the records at relative positions ``rel`` of one segment's bytes ``buf`` (an
    mmap, memoryview or bytes; trusted up to ``limit``, default all), whose first byte is
    physical offset ``base``. ``sizes``, when given, are the sizes the records' ConsumeQueue
    units claim.

    Every record is checked as the walk checks it (magic, sizes, field lengths,
    PHYSICALOFFSET, the body CRC when ``check_crc``, no NUL in the topic or properties),
    against its unit's size, and for a UTF-8 topic; the first that fails raises
    :class:`CorruptRecordError` naming ``path`` and the record's physical offset, and nothing
    is returned.

    Returns one batch, a row per position: ``commitLogOffset``, ``storeSize``, ``queueId``,
    ``queueOffset``, ``sysFlag``, ``flag``, ``bornTimestamp`` and ``storeTimestamp`` (int64
    ms), ``reconsumeTimes``, ``preparedTransactionOffset``, ``bodyCRC``, ``topic``, then the
    groups of ``columns``: ``body``; ``properties`` (a map read as
    :func:`rocketstore.pipeline.format.record.decode_properties` reads it); ``keys`` (KEYS split at spaces, empty
    tokens dropped; null without KEYS); ``tags`` and ``uniqKey`` (null when absent);
    ``bornHost`` and ``storeHost`` (``ip:port``, IPv6 ``[addr]:port``); ``msgId``. The batch
    owns its memory: ``buf`` may be closed afterwards.
    """
    rel = np.ascontiguousarray(rel, dtype=np.int64)
    if sizes is not None:
        sizes = np.ascontiguousarray(sizes, dtype=np.int64)
    end = (1 << 62) if limit is None else limit
    try:
        raw = _native.decode(buf, rel, base, end, sizes, check_crc, int(columns))
    except NativeError as exc:
        # A failure outside the record loop (the loop reports its own, with the record) is a
        # bug in the crate, but still a bad read of this segment.
        at = base + int(rel[0]) if len(rel) else base
        raise CorruptRecordError(path, at, f"decoder failed: {exc}") from exc
    if raw["error"] is not None:
        _, phys, reason = raw["error"]
        raise CorruptRecordError(path, int(phys), str(reason))
    n = len(rel)
    names: list[str] = []
    arrays: list[pa.Array] = []
    for name, key, t in _FIXED + _VARIABLE:
        if raw[key] is not None:
            names.append(name)
            arrays.append(_arrow(raw[key], n, t))
    return pa.RecordBatch.from_arrays(arrays, names=names)


def decode_one(
    buf: Any, rel: int, base: int, *, path: str, limit: int, check_crc: bool = True
) -> MessageExt:
    """The record at relative position ``rel`` of one segment's bytes, checked as
    :func:`decode` checks each record and returned as :func:`messages` returns it, without
    Arrow columns in between (a single read would spend most of its time building them).
    Raises :class:`CorruptRecordError` naming ``path`` and the offset."""
    try:
        error, f = _native.decode_one(buf, rel, base, limit, check_crc)
    except NativeError as exc:
        raise CorruptRecordError(path, base + rel, f"decoder failed: {exc}") from exc
    if error is not None:
        raise CorruptRecordError(path, int(error[0]), str(error[1]))
    return MessageExt(
        commit_log_offset=f[0],
        store_size=f[1],
        queue_id=f[2],
        queue_offset=f[3],
        sys_flag=f[4],
        flag=f[5],
        born_timestamp=f[6],
        store_timestamp=f[7],
        reconsume_times=f[8],
        prepared_transaction_offset=f[9],
        body_crc=f[10],
        topic=f[11],
        body=f[12],
        properties=f[13],
        born_host=f[14],
        store_host=f[15],
        msg_id=f[16],
    )


def record_starts(
    buf: Any, rel: npt.NDArray[np.int64], base: int, limit: int | None = None
) -> npt.NDArray[np.bool_]:
    """Which positions ``rel`` hold the start of a record, intact or not (a whole header with
    the magic code and the right PHYSICALOFFSET): for index look-ups, whose candidates may
    point anywhere."""
    rel = np.ascontiguousarray(rel, dtype=np.int64)
    end = (1 << 62) if limit is None else limit
    return np.frombuffer(memoryview(_native.record_starts(buf, rel, base, end)), dtype=np.bool_)


def messages(batch: pa.RecordBatch) -> Iterator[MessageExt]:
    """The rows of a :func:`decode` batch with every column group, as
    :class:`~rocketstore.pipeline.format.record.MessageExt` (what the single-record reader returns)."""
    cols = {name: batch.column(name).to_pylist() for name in batch.schema.names}
    for i in range(batch.num_rows):
        yield MessageExt(
            topic=cols["topic"][i],
            queue_id=cols["queueId"][i],
            queue_offset=cols["queueOffset"][i],
            commit_log_offset=cols["commitLogOffset"][i],
            store_size=cols["storeSize"][i],
            store_timestamp=cols["storeTimestamp"][i],
            born_timestamp=cols["bornTimestamp"][i],
            born_host=cols["bornHost"][i],
            store_host=cols["storeHost"][i],
            sys_flag=cols["sysFlag"][i],
            flag=cols["flag"][i],
            reconsume_times=cols["reconsumeTimes"][i],
            prepared_transaction_offset=cols["preparedTransactionOffset"][i],
            body_crc=cols["bodyCRC"][i],
            properties=dict(cols["properties"][i]),
            body=cols["body"][i],
            msg_id=cols["msgId"][i],
        )
