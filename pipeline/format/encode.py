"""Batch preparation: an Arrow batch of messages -> validated columns -> the native encoder.

:func:`prepare` validates a whole batch before anything is written (all or nothing, whole-column
checks with numpy and Arrow, one function per column in :mod:`rocketstore.pipeline.format.batchcolumns`)
and hands the columns to :class:`rocketstore.pipeline.format.native.EncodeBatch`,
which derives every per-message value the CommitLog, ConsumeQueue and IndexFile need (PROPERTIES
lengths, record sizes, tag hashes, index key hashes) and later writes the records straight into
the mapped segment. The readable reference for one record is :func:`rocketstore.pipeline.format.record.encode_record`.

Pure functions; thread-safe.
"""

from __future__ import annotations

import dataclasses
import os
import random
import socket
import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.format import batchcolumns, native
from rocketstore.pipeline.format.message import Message, messages_to_table


@dataclasses.dataclass
class PreparedBatch:
    """A validated batch, column by column (numpy arrays of length ``n`` unless noted), and the
    native encoder that borrows its columns."""

    n: int
    topics: list[str]  # distinct topics
    topic_codes: npt.NDArray[np.int32]
    queue_ids: npt.NDArray[np.int32]
    sys_flags: npt.NDArray[np.int32]  # with the host v6 bits set
    tags_codes: npt.NDArray[np.int64]
    uniq_keys: pa.StringArray
    key_rows: npt.NDArray[np.int64]  # per index entry: the message it belongs to
    key_hashes: npt.NDArray[np.int32]  # per index entry: abs hash of "topic#key"
    sizes: npt.NDArray[np.int64]
    encoder: native.EncodeBatch


# -- UNIQ_KEY ----------------------------------------------------------------------------------


_SEQ_MASK = (1 << 48) - 1
ID_CHARS = 32  # a message id's hex digits


class UniqKeyGenerator:
    """Message ids in the layout of RocketMQ's ``MessageClientIDSetter`` (32 hex chars).

    Bytes: client IP (4), process id (2), a random per-generator value (4), milliseconds since
    the start of the month (4), counter (2). RocketMQ's counter wraps after 65 536 ids in the
    same millisecond; here time and counter form one 48-bit sequence that only moves forward,
    so ids stay unique within a generator however large the batch. Thread-safety: none.
    """

    def __init__(self, clock_ms: object = None) -> None:
        try:
            ip = socket.inet_aton(socket.gethostbyname(socket.gethostname()))
        except OSError:
            ip = bytes(4)
        self._prefix = np.frombuffer(
            ip
            + (os.getpid() & 0xFFFF).to_bytes(2, "big")
            + random.getrandbits(32).to_bytes(4, "big"),
            dtype=np.uint8,
        )
        self._prefix_hex = self._prefix.tobytes().hex().upper()
        self._seq = 0
        self._month = (0, -1)  # [start, end) in ms of the month the last id was made in

    def _since_month_start(self, now_ms: int) -> int:
        start, end = self._month
        if not start <= now_ms < end:
            t = time.gmtime(now_ms / 1000)
            first = (t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, 0)
            nxt = (t.tm_year + t.tm_mon // 12, t.tm_mon % 12 + 1, 1, 0, 0, 0, 0, 0, 0)
            start = int(time.mktime(first) - time.timezone) * 1000
            end = int(time.mktime(nxt) - time.timezone) * 1000
            self._month = (start, end)
        return max(0, now_ms - start) & 0xFFFFFFFF

    def _take(self, n: int, now_ms: int) -> int:
        start = max(self._seq, self._since_month_start(now_ms) << 16)
        self._seq = start + n
        return start

    def generate(self, n: int, now_ms: int) -> pa.StringArray:
        start = self._take(n, now_ms)
        # Written in place by the crate: a million ids are 32 MB, and building them from
        # numpy temporaries took twice that again at the batch put's peak.
        data = np.empty(n * ID_CHARS, dtype=np.uint8)
        native.uniq_ids(self._prefix.tobytes(), start, data)
        offsets = np.arange(0, ID_CHARS * (n + 1), ID_CHARS, dtype=np.int32)
        return pa.Array.from_buffers(
            pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
        )

    def next_id(self, now_ms: int) -> str:
        """One id, exactly as ``generate(1, now_ms)`` would make it (the single-put path, so
        :meth:`_take` is inlined for the usual case: ``now_ms`` in the month of the last id)."""
        start, end = self._month
        if not start <= now_ms < end:
            return f"{self._prefix_hex}{self._take(1, now_ms) & _SEQ_MASK:012X}"
        seq = max(self._seq, ((now_ms - start) & 0xFFFFFFFF) << 16)
        self._seq = seq + 1
        return f"{self._prefix_hex}{seq & _SEQ_MASK:012X}"


# Two ASCII hex digits of every byte value, as one little-endian uint16 each.
_HEX_PAIRS = np.frombuffer(b"".join(f"{i:02X}".encode() for i in range(256)), dtype="<u2").copy()


def hex_fixed(raw: npt.NDArray[np.uint8]) -> pa.StringArray:
    """Uppercase hex of each row of a 2-D uint8 array, as an Arrow string array."""
    n, width = raw.shape
    out = _HEX_PAIRS[raw].view(np.uint8)
    offsets = np.arange(n + 1, dtype=np.int32) * (width * 2)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(out)])


# -- validation and derivation -----------------------------------------------------------------


def to_table(data: pa.Table | pa.RecordBatch | Sequence[Message]) -> pa.Table:
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        return data
    return messages_to_table(list(data))


def prepare(
    data: pa.Table | pa.RecordBatch | Sequence[Message],
    config: StoreConfig,
    uniq: UniqKeyGenerator,
    now_ms: int,
    store_host: str,
) -> PreparedBatch:
    """Validate a batch and derive everything needed to store it. Nothing is written.
    ``store_host`` (``ip:port``) is stamped as every record's STOREHOST and is the born host of
    rows without one (:func:`rocketstore.pipeline.engine.storehost.store_host`).

    Raises :class:`InvalidMessageError` (or :class:`MessageTooLargeError`) naming the column,
    the reason, how many rows fail and the first of them. The columns are checked in the order
    below (:mod:`rocketstore.pipeline.format.batchcolumns`), so the first bad one is reported.
    """
    table = to_table(data)
    batchcolumns.check_names(table)
    n = table.num_rows
    topics, topic_codes = batchcolumns.topic_column(table)
    bodies = batchcolumns.body_column(table, config.max_message_size)
    numbers = batchcolumns.number_columns(table, n)
    hosts = batchcolumns.host_columns(table, store_host, n, numbers.sys_in)
    strings = batchcolumns.string_columns(table, n, lambda k: uniq.generate(k, now_ms))
    # The encoder and the index keys read the same columns: handed over once, for both.
    topic_table = native.table_of([t.encode("utf-8") for t in topics])
    keys_arg, uniq_arg = native.strings(strings.keys), native.strings(strings.uniq_keys)
    born_missing = numbers.born_missing
    encoder = native.EncodeBatch(
        n=n,
        topics=topic_table,
        topic_codes=topic_codes,
        queue_ids=numbers.queue_ids,
        flags=numbers.flags,
        sys_flags=hosts.sys_flags,
        reconsume=numbers.reconsume,
        prep_tx=numbers.prep_tx,
        born_ts=numbers.born_ts,
        born_missing=None if born_missing is None else born_missing.view(np.uint8),
        born_hosts=native.table_of(hosts.born_hosts),
        born_codes=hosts.born_codes,
        store_host=hosts.store_field,
        bodies=bodies,
        keys=keys_arg,
        tags=native.strings(strings.tags),
        uniq=uniq_arg,
        user_props=None if strings.user_part is None else native.strings(strings.user_part),
    )
    sizes = batchcolumns.record_sizes(encoder, n, config.mapped_file_size_commitlog)
    tags_codes = np.empty(n, dtype=np.int64)
    encoder.tags_codes(tags_codes)
    key_rows, key_hashes = index_keys(topic_table, topic_codes, uniq_arg, keys_arg, hosts.sys_flags)
    return PreparedBatch(
        n=n,
        topics=topics,
        topic_codes=topic_codes,
        queue_ids=numbers.queue_ids,
        sys_flags=hosts.sys_flags,
        tags_codes=tags_codes,
        uniq_keys=strings.uniq_keys,
        key_rows=key_rows,
        key_hashes=key_hashes,
        sizes=sizes,
        encoder=encoder,
    )


def index_keys(
    topics: native.StringTriple,
    topic_codes: npt.NDArray[np.int32],
    uniq: native.StringTriple,
    keys: native.StringTriple,
    sys_flags: npt.NDArray[np.int32],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]:
    """Index entries in RocketMQ's order: UNIQ_KEY, then each KEYS token, per message;
    ROLLBACK transactions get none. Returns (message row, key hash) per entry. The string
    columns come as :func:`rocketstore.pipeline.format.native.strings` makes them, ``topics`` as
    :func:`rocketstore.pipeline.format.native.table_of` does."""
    rows, hashes = native.index_keys(topics, topic_codes, uniq, keys, sys_flags)
    return (
        np.frombuffer(memoryview(rows), dtype=np.int64),
        np.frombuffer(memoryview(hashes), dtype=np.int32),
    )
