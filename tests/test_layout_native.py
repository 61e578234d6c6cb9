"""The fixed sizes of the ConsumeQueue unit and the IndexFile are defined once for both
languages: the Python side (rocketstore.pipeline.layout) takes them from the native core and
refuses to import when its own shapes disagree with a native core built from other sources.

Expected numbers are RocketMQ 4.9.x's (ConsumeQueue.CQ_STORE_UNIT_SIZE, IndexHeader's
INDEX_HEADER_SIZE, IndexFile's hashSlotSize and indexSize), not read from the code under test.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from rocketstore.pipeline import _native, layout
from rocketstore.pipeline.config import StoreConfig

CQ_STORE_UNIT_SIZE = 20
INDEX_HEADER_SIZE = 40
HASH_SLOT_SIZE = 4
INDEX_SIZE = 20


def test_the_native_core_and_python_give_rocketmq_s_sizes() -> None:
    assert _native.UNIT_SIZE == layout.CQ_UNIT_SIZE == CQ_STORE_UNIT_SIZE
    assert layout.UNIT_DTYPE.itemsize == layout.UNIT.size == CQ_STORE_UNIT_SIZE
    assert _native.INDEX_HEADER_SIZE == layout.INDEX_HEADER.size == INDEX_HEADER_SIZE
    assert _native.INDEX_SLOT_SIZE == layout.INDEX_SLOT.size == HASH_SLOT_SIZE
    assert _native.INDEX_ENTRY_SIZE == layout.INDEX_ENTRY_DTYPE.itemsize == INDEX_SIZE
    assert layout.INDEX_ENTRY.size == INDEX_SIZE


def test_one_unit_packs_as_the_dtype_reads_it() -> None:
    raw = layout.UNIT.pack(123_456_789_012, 345, -6)
    (unit,) = np.frombuffer(raw, dtype=layout.UNIT_DTYPE)
    assert (int(unit["offset"]), int(unit["size"]), int(unit["tags_code"])) == (
        123_456_789_012,
        345,
        -6,
    )


def test_the_default_index_file_is_rocketmq_s_size() -> None:
    # RocketMQ 4.9.x: 5,000,000 slots and 20,000,000 entries, 420,000,040 bytes a file.
    assert StoreConfig().index_file_size == 420_000_040
    assert StoreConfig(max_hash_slot_num=101, max_index_num=300).index_file_size == (
        INDEX_HEADER_SIZE + HASH_SLOT_SIZE * 101 + INDEX_SIZE * 300
    )


def test_a_native_core_that_disagrees_fails_the_import() -> None:
    code = (
        "from rocketstore.pipeline import _native\n"
        "_native.INDEX_ENTRY_SIZE = 24\n"
        "import rocketstore.pipeline.layout\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert "ImportError: rocketstore's native core gives the IndexFile entry size = 24" in (
        done.stderr
    )
