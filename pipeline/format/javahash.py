"""Java's ``String.hashCode`` and the two hashes RocketMQ derives from it.

RocketMQ keys its on-disk structures by Java string hashes:

* ConsumeQueue ``tagsCode`` is ``TAGS.hashCode()`` widened to a long (so it may be negative);
* an IndexFile slot is chosen by ``abs((topic + "#" + key).hashCode())`` (``MIN_VALUE`` -> 0).

Java hashes the UTF-16 code units of the string: ``h = 31*h + unit`` in 32-bit arithmetic.
The scalar functions are the readable reference; :func:`java_hash_array` hashes a whole batch
in the native core (:func:`rocketstore.pipeline.format.native.java_hashes`), which the differential tests hold to
the reference.

Pure functions; thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from rocketstore.pipeline.format import native

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
    return native.java_hashes(arr)
