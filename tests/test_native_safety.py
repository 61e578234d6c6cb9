"""The native core refuses what would be undefined behaviour, and never lets a panic out as
PyO3's ``PanicException`` (a ``BaseException``, which ``except Exception`` misses)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pytest

from rocketstore.pipeline import _native
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.storehost import store_host
from rocketstore.pipeline.errors import NativeError, StoreError
from rocketstore.pipeline.format import encode, native


def batch() -> encode.PreparedBatch:
    table = pa.table(
        {
            "topic": ["T"] * 8,
            "body": [b"body-%d" % i for i in range(8)],
            "queueId": pa.array(range(8), pa.int32()),
            "keys": [f"k{i}" for i in range(8)],
        }
    )
    config = StoreConfig()
    return encode.prepare(
        table, config, encode.UniqKeyGenerator(), 1_700_000_000_000, store_host(config)
    )


def test_index_put_refuses_one_buffer_as_slots_and_entries() -> None:
    buf = np.zeros(4096, dtype=np.uint8)
    one = np.zeros(1, np.int32), np.zeros(1, np.int64), np.zeros(1, np.int64)
    with pytest.raises(ValueError, match="slots overlaps entries"):
        _native.index_put(buf, buf, 0, 0, *one)
    entries = np.zeros(400, np.uint8)
    with pytest.raises(ValueError, match="entries overlaps hashes"):
        _native.index_put(buf[:400], entries, 0, 0, entries[:4].view(np.int32), *one[1:])
    # Apart, the same call goes through.
    assert _native.index_put(buf[:400], np.zeros(400, np.uint8), 0, 0, *one) == 1


def test_measure_refuses_an_input_column_as_its_output() -> None:
    b = batch()
    with pytest.raises(ValueError, match="sizes overlaps sys_flags"):
        b.encoder.measure(b.sys_flags.view(np.int64), 32767)


def test_encode_refuses_a_destination_over_an_input() -> None:
    b = batch()
    phys = np.concatenate(([0], np.cumsum(b.sizes)[:-1])).astype(np.int64)
    offsets = np.arange(b.n, dtype=np.int64)
    dest = np.zeros(int(b.sizes.sum()), np.uint8)
    b.encoder.encode(dest, 0, 0, b.n, phys, offsets, b.sizes, 1)  # fine
    with pytest.raises(ValueError, match="dest overlaps sys_flags"):
        b.encoder.encode(b.sys_flags.view(np.uint8), 0, 0, 0, phys, offsets, b.sizes, 1)
    with pytest.raises(ValueError, match="dest overlaps sizes"):
        b.encoder.encode(b.sizes.view(np.uint8), 0, 0, 0, phys, offsets, b.sizes, 1)


def own_batch(n: int) -> tuple[object, npt.NDArray[np.int32]]:
    """An encoder over columns this test owns (and may change): n messages of topic T."""
    codes = np.zeros(n, np.int32)
    bodies = native.strings(pa.array([b"x"] * n))
    empty = native.strings(pa.array([None] * n, pa.string()))
    encoder = native.EncodeBatch(
        n=n, topics=native.table_of([b"T"]), topic_codes=codes,
        queue_ids=np.zeros(n, np.int32), flags=None, sys_flags=np.zeros(n, np.int32),
        reconsume=None, prep_tx=None, born_ts=None, born_missing=None,
        born_hosts=native.table_of([bytes(8)]), born_codes=None, store_host=bytes(8),
        bodies=bodies, keys=empty, tags=empty, uniq=empty, user_props=None,
    )  # fmt: skip
    return encoder, codes


def test_a_column_changed_after_the_batch_was_made_is_an_error_not_a_panic() -> None:
    encoder, codes = own_batch(4)
    sizes = np.zeros(4, np.int64)
    encoder.measure(sizes, 32767)  # type: ignore[attr-defined]
    phys = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    dest = np.zeros(int(sizes.sum()), np.uint8)
    codes[3] = 7  # the batch's topic table has one topic: a row look-up out of bounds
    with pytest.raises(ValueError, match="topic_codes: a code outside"):
        encoder.encode(dest, 0, 0, 4, phys, np.arange(4, dtype=np.int64), sizes, 1)  # type: ignore[attr-defined]
    assert not dest.any(), "nothing written"
    with pytest.raises(ValueError, match="topic_codes"):
        encoder.measure(np.zeros(4, np.int64), 32767)  # type: ignore[attr-defined]


def test_sizes_that_overflow_are_refused() -> None:
    b = batch()
    phys = np.zeros(b.n, np.int64)
    dest = np.zeros(64, np.uint8)
    huge = np.full(b.n, 2**62, np.int64)
    with pytest.raises(ValueError, match=r"too many bytes|run past"):
        b.encoder.encode(dest, 0, 0, b.n, phys, np.arange(b.n, dtype=np.int64), huge, 1)
    with pytest.raises(ValueError, match="negative size"):
        b.encoder.encode(dest, 0, 0, b.n, phys, np.arange(b.n, dtype=np.int64), -b.sizes, 1)


def test_a_panic_reaches_python_as_a_store_error() -> None:
    with pytest.raises(NativeError, match="internal error in the native core: as asked"):
        _native._panic_under_guard()
    assert issubclass(NativeError, StoreError)


def test_crc_and_hash_outputs_must_not_overlap_their_input() -> None:
    values = pa.array([b"abc", b"defg"])
    out = np.zeros(2, np.int32)
    _native.body_crcs(native.strings(values), out)
    assert out.tolist() == native.body_crcs(values).tolist()
    raw = np.frombuffer(b"abcdefg", np.uint8).copy()
    offsets = np.array([0, 3, 7], np.int32)
    with pytest.raises(ValueError, match="out overlaps"):
        _native.java_hashes((raw, offsets, None), offsets[1:])


def test_the_record_layout_is_defined_once_in_the_native_core() -> None:
    """RocketMQ 4.9.x's values (MessageDecoder, MessageSysFlag), exported by the crate and
    taken from there by rocketstore.pipeline.format.record."""
    from rocketstore.pipeline.format import record

    expected = {
        "MAGIC": -626843481, "BLANK_MAGIC": -875286124, "BLANK_SIZE": 8, "FIXED_SIZE_V4": 91,
        "BORNHOST_V6_FLAG": 0x10, "STOREHOSTADDRESS_V6_FLAG": 0x20, "TRANSACTION_MASK": 0xC,
        "TRANSACTION_COMMIT_TYPE": 0x8, "TRANSACTION_ROLLBACK_TYPE": 0xC, "OFF_TOTALSIZE": 0,
        "OFF_MAGIC": 4, "OFF_BODYCRC": 8, "OFF_QUEUEID": 12, "OFF_FLAG": 16,
        "OFF_QUEUEOFFSET": 20, "OFF_PHYSICALOFFSET": 28, "OFF_SYSFLAG": 36,
        "OFF_BORNTIMESTAMP": 40, "OFF_BORNHOST": 48,
    }  # fmt: skip
    for name, value in expected.items():
        assert getattr(_native, name) == value, name
        assert getattr(record, name) == value, name
