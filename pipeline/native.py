"""The Python face of the native core (``pipeline._native``, the Rust crate in ``native/``).

Every loop over messages runs in compiled code with the GIL released: record encoding straight
into a mapped segment, body CRCs, Java string hashes, index chains and the record walk. This
module adapts Arrow and numpy columns to the crate's buffer arguments and turns its results
into numpy arrays; the readable reference for every format stays in :mod:`pipeline.record`.

Thread-safety: the functions are pure over their arguments; the caller owns any buffer it
passes as an output (the store's single writer owns its segments).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pipeline import _native

StringTriple = tuple[Any, npt.NDArray[np.int64], npt.NDArray[np.uint8] | None]
EncodeBatch = _native.EncodeBatch
index_put = _native.index_put
index_keys = _native.index_keys
encode_one = _native.encode_one

_EMPTY = b""


def strings(arr: pa.Array) -> StringTriple:
    """A string or binary Arrow array as ``(data, offsets, validity)`` for the crate: the data
    buffer as is, ``n + 1`` int64 offsets into it, and one byte per row (1 = present), or None
    when no row is null. Zero-copy for the data."""
    if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type):
        width: type = np.int64
    elif pa.types.is_string(arr.type) or pa.types.is_binary(arr.type):
        width = np.int32
    else:
        raise TypeError(f"expected a string or binary array, got {arr.type}")
    n = len(arr)
    bufs = arr.buffers()
    if bufs[1] is None:
        offsets = np.zeros(n + 1, dtype=np.int64)
    else:
        raw: npt.NDArray[Any] = np.frombuffer(bufs[1], dtype=width)
        offsets = raw[arr.offset : arr.offset + n + 1].astype(np.int64)
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

    ``topics`` are the distinct topic names ``topic_codes`` index. Index entries are listed in
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
    bytes that are not a whole, valid record (magic, sizes, PHYSICALOFFSET, and the body CRC
    when ``check_crc``), at an END_OF_FILE blank, or after ``max_records``."""
    raw = _native.walk(buf, start, limit, base, check_crc, max_records or (1 << 62))
    cols = {name: np.frombuffer(raw[name], dtype=dtype) for name, dtype in _WALK_DTYPES.items()}
    return Walk(
        **cols,
        topics=[t.decode("utf-8", "replace") for t in raw["topics"]],
        end=base + int(raw["end"]),
        stop=int(raw["stop"]),
        reason=str(raw["reason"]),
    )
