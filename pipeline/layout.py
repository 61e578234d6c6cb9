"""The sizes and shapes of RocketMQ 4.9.x's fixed-size on-disk structures, one definition
each: the ConsumeQueue unit and the IndexFile's geometry (header, slot, entry, defaults).

Each structure's byte diagram and meaning is documented once, in the module that reads and
writes it: the unit in :mod:`rocketstore.pipeline.files.consumequeue.queue`, the IndexFile in
:mod:`rocketstore.pipeline.files.indexfile`. This module holds only their sizes and numpy/struct
shapes, so that the settings (:mod:`rocketstore.pipeline.config`), the native wrapper, the
engine, ``verify`` and the source executors, which read files themselves, share them without
importing each other. The CommitLog record's constants and field offsets stay next to its
diagram in :mod:`rocketstore.pipeline.format.record`, which takes them from ``_native`` the same way.

Where the native core (``native/src/layout.rs``, ``native/src/index.rs``) defines a value,
it is taken from ``_native`` here rather than written again, and the numpy and struct shapes
built on it are checked against it at import: a native core built from other sources fails the
import with :class:`ImportError` instead of reading or writing misplaced bytes.

Pure values: importing this module loads the native extension and numpy, and nothing else of
rocketstore.
"""

from __future__ import annotations

import struct

import numpy as np

from rocketstore.pipeline import _native

# -- ConsumeQueue unit (diagram: rocketstore.pipeline.files.consumequeue.queue) ----------------------------
CQ_UNIT_SIZE: int = _native.UNIT_SIZE
UNIT_DTYPE = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
UNIT = struct.Struct(">qiq")  # the same bytes, for one unit
# The size of the "pre-blank" units RocketMQ writes before a queue's first real unit.
PRE_BLANK_SIZE = 0x7FFFFFFF
# RocketMQ's default mappedFileSizeConsumeQueue, in units.
DEFAULT_CQ_UNITS_PER_FILE = 300_000

# -- IndexFile (diagram: rocketstore.pipeline.files.indexfile) ---------------------------------------
INDEX_HEADER = struct.Struct(">qqqqii")
INDEX_HEADER_SIZE: int = _native.INDEX_HEADER_SIZE
INDEX_SLOT = struct.Struct(">i")
INDEX_SLOT_SIZE: int = _native.INDEX_SLOT_SIZE
INDEX_ENTRY_DTYPE = np.dtype(
    [("key_hash", ">i4"), ("phy_offset", ">i8"), ("time_diff", ">i4"), ("prev_index", ">i4")]
)
INDEX_ENTRY = struct.Struct(">iqii")  # INDEX_ENTRY_DTYPE's fields, for reading one entry
INDEX_ENTRY_SIZE: int = _native.INDEX_ENTRY_SIZE
# RocketMQ's defaults: maxHashSlotNum, and maxIndexNum as entries per slot.
DEFAULT_MAX_HASH_SLOT_NUM = 5_000_000
DEFAULT_INDEX_RATIO = 4
DEFAULT_MAX_INDEX_NUM = DEFAULT_MAX_HASH_SLOT_NUM * DEFAULT_INDEX_RATIO


def index_file_size(max_hash_slot_num: int, max_index_num: int) -> int:
    """Bytes of an IndexFile of ``max_hash_slot_num`` slots and ``max_index_num`` entries."""
    return (
        INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * max_hash_slot_num + INDEX_ENTRY_SIZE * max_index_num
    )


def _agree(name: str, python: int, native: int) -> None:
    if python != native:
        raise ImportError(
            f"rocketstore's native core gives {name} = {native}, its Python side {python}: "
            "the extension was built from other sources; rebuild it (make venv)"
        )


_agree("the ConsumeQueue unit size", UNIT_DTYPE.itemsize, CQ_UNIT_SIZE)
_agree("the ConsumeQueue unit size", UNIT.size, CQ_UNIT_SIZE)
_agree("the IndexFile header size", INDEX_HEADER.size, INDEX_HEADER_SIZE)
_agree("the IndexFile slot size", INDEX_SLOT.size, INDEX_SLOT_SIZE)
_agree("the IndexFile entry size", INDEX_ENTRY_DTYPE.itemsize, INDEX_ENTRY_SIZE)
_agree("the IndexFile entry size", INDEX_ENTRY.size, INDEX_ENTRY_SIZE)
