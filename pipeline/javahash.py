"""Java's ``String.hashCode`` and the two hashes RocketMQ derives from it.

RocketMQ keys its on-disk structures by Java string hashes:

* ConsumeQueue ``tagsCode`` is ``TAGS.hashCode()`` widened to a long (so it may be negative);
* an IndexFile slot is chosen by ``abs((topic + "#" + key).hashCode())`` (``MIN_VALUE`` -> 0).

Java hashes the UTF-16 code units of the string: ``h = 31*h + unit`` in 32-bit arithmetic.
The scalar functions are for single values; :func:`java_hash_array` hashes a whole batch with
numpy, with no per-string Python work for ASCII strings (which is what keys and tags nearly
always are).

Pure functions; thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

_MASK32 = 0xFFFFFFFF


def java_hash(text: str) -> int:
    """``String.hashCode()`` as a signed 32-bit int."""
    h = 0
    units = text.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & _MASK32
    return h - (1 << 32) if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    """ConsumeQueue tagsCode of a message's TAGS property (0 when it has none)."""
    if not tags:
        return 0
    return java_hash(tags)


def index_key_hash(topic: str, key: str) -> int:
    """IndexFile key hash of ``topic#key``: ``abs(hashCode)``, with ``MIN_VALUE`` mapped to 0."""
    h = java_hash(f"{topic}#{key}")
    return 0 if h == -(1 << 31) else abs(h)


_INV31 = pow(31, -1, 1 << 32)  # 31 is odd, so it is invertible modulo 2**32
_CHUNK_UNITS = 1 << 22
_power_tables: dict[int, npt.NDArray[np.uint32]] = {}


def _powers(base: int, n: int) -> npt.NDArray[np.uint32]:
    """``base**i mod 2**32`` for i in [0, n), cached and grown by doubling."""
    table = _power_tables.get(base)
    if table is None or len(table) < n:
        size = max(n, 1024, 2 * len(table) if table is not None else 0)
        table = np.empty(size, dtype=np.uint32)
        table[0] = 1
        filled = 1
        while filled < size:
            step = min(filled, size - filled)
            table[filled : filled + step] = table[:step] * np.uint32(pow(base, filled, 1 << 32))
            filled += step
        _power_tables[base] = table
    return table


def _pow31(n: int) -> npt.NDArray[np.uint32]:
    """31**i mod 2**32 for i in [0, n)."""
    return _powers(31, n)[:n]


def java_hash_array(strings: pa.Array | pa.ChunkedArray | Sequence[str]) -> npt.NDArray[np.int32]:
    """``String.hashCode()`` of every string, as int32. Nulls hash as the empty string (0)."""
    arr = (
        strings
        if isinstance(strings, pa.Array | pa.ChunkedArray)
        else pa.array(strings, pa.string())
    )
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if pa.types.is_dictionary(arr.type):
        # Null entries hash as the empty string: index a 0 appended after the dictionary's hashes.
        hashes = np.append(java_hash_array(arr.dictionary), np.int32(0))
        codes = pc.fill_null(arr.indices, len(arr.dictionary)).to_numpy(zero_copy_only=False)
        return np.asarray(hashes[codes], dtype=np.int32)
    if pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.string())
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    arr = pc.fill_null(arr, "")
    ascii_ok = pc.all(pc.string_is_ascii(arr)).as_py()
    if not ascii_ok:
        return _java_hash_utf16(arr)
    offsets = binary_offsets(arr)
    data_buf = arr.buffers()[2]
    base = offsets[0]
    width = int(offsets[1] - base)
    if data_buf is not None and width and bool(np.all(np.diff(offsets) == width)):
        # Every string has the same length (generated ids, fixed-format keys): the hash is the
        # n x width matrix of units times the vector of powers 31**(width-1-k), in uint32
        # arithmetic that wraps as Java's int does.
        matrix = np.frombuffer(data_buf, dtype=np.uint8, count=width * n, offset=int(base))
        powers = _pow31(width)[::-1].copy()
        product: npt.NDArray[np.uint32] = matrix.reshape(n, width) @ powers
        return product.astype(np.uint32).view(np.int32)
    units = (
        np.frombuffer(data_buf, dtype=np.uint8)[base : offsets[-1]].astype(np.uint32)
        if data_buf is not None
        else np.zeros(0, np.uint32)
    )
    return _segment_hash(units, offsets - base)


def binary_offsets(arr: pa.Array) -> npt.NDArray[np.int64]:
    """The ``n + 1`` value offsets of a (sliced) string or binary array, as int64."""
    dtype = (
        np.int64
        if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
        else np.int32
    )
    raw = np.frombuffer(arr.buffers()[1], dtype=dtype)
    return raw[arr.offset : arr.offset + len(arr) + 1].astype(np.int64)


def utf16_lengths(arr: pa.Array) -> npt.NDArray[np.int64]:
    """Length of each string in UTF-16 code units (what Java's ``length()`` returns)."""
    if pc.all(pc.string_is_ascii(pc.fill_null(arr, ""))).as_py() is not False:
        return np.diff(binary_offsets(arr))
    return np.fromiter(
        (len(v.encode("utf-16-be")) // 2 if v is not None else 0 for v in arr.to_pylist()),
        dtype=np.int64,
        count=len(arr),
    )


def _java_hash_utf16(arr: pa.Array) -> npt.NDArray[np.int32]:
    values = arr.to_pylist()
    encoded = [v.encode("utf-16-be") for v in values]
    lengths = np.fromiter((len(e) // 2 for e in encoded), dtype=np.int64, count=len(encoded))
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    units = np.frombuffer(b"".join(encoded), dtype=">u2").astype(np.uint32)
    return _segment_hash(units, offsets)


def _segment_hash(
    units: npt.NDArray[np.unsignedinteger], offsets: npt.NDArray[np.int64]
) -> npt.NDArray[np.int32]:
    """Hash each ``units[offsets[i]:offsets[i+1]]`` with Java's polynomial.

    31 is invertible mod 2**32, so the hash of ``u[a:b]`` is
    ``31**(b-1) * sum(u[k] * 31**-k for k in [a, b))``: one multiply over all units, one
    segmented sum, then one multiply per string. Strings are taken in chunks of about 4M units so the power
    tables stay small.
    """
    n = len(offsets) - 1
    out = np.zeros(n, dtype=np.uint32)
    i = 0
    while i < n:
        a = int(offsets[i])
        j = int(np.searchsorted(offsets, a + _CHUNK_UNITS, side="right")) - 1
        j = min(max(j, i + 1), n)
        b = int(offsets[j])
        count = b - a
        if count:
            weighted = np.multiply(
                units[a:b], _powers(_INV31, count)[:count], dtype=np.uint32, casting="unsafe"
            )
            starts = offsets[i:j] - a
            ends = offsets[i + 1 : j + 1] - a
            nonempty = np.flatnonzero(ends > starts)
            # Empty strings hash to 0; leaving them out makes each reduceat segment end where
            # the next non-empty string starts, which is exactly its own end.
            sums = np.add.reduceat(weighted, starts[nonempty], dtype=np.uint32)
            out[i + nonempty] = _powers(31, count)[ends[nonempty] - 1] * sums
        i = j
    return out.view(np.int32)


def combine_prefix(
    prefix_hash: int | npt.NDArray[np.int64],
    suffix_hash: npt.NDArray[np.int32],
    suffix_unit_len: npt.NDArray[np.int64],
) -> npt.NDArray[np.int32]:
    """Hash of ``prefix + suffix`` from the hashes of both parts (no re-hashing of the prefix).

    ``hash(p + s) = hash(p) * 31**len(s) + hash(s)`` in 32-bit arithmetic, lengths in UTF-16
    units. ``prefix_hash`` is one value or one per suffix.
    """
    max_len = int(suffix_unit_len.max()) + 1 if len(suffix_unit_len) else 1
    powers = _pow31(max_len)
    prefix = (np.asarray(prefix_hash, dtype=np.int64) & _MASK32).astype(np.uint32)
    mixed = prefix * powers[suffix_unit_len] + suffix_hash.view(np.uint32)
    return mixed.astype(np.uint32).view(np.int32)


def abs_index_hash(hashes: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
    """RocketMQ's ``indexKeyHashMethod``: abs, with ``Integer.MIN_VALUE`` mapped to 0."""
    h = hashes.astype(np.int64)
    out = np.abs(h)
    out[h == -(1 << 31)] = 0
    return out.astype(np.int32)
