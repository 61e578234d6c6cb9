"""Batch preparation: an Arrow batch of messages -> validated columns -> the native encoder.

:func:`prepare` validates a whole batch before anything is written (all or nothing, whole-column
checks with numpy and Arrow) and hands the columns to :class:`rocketstore.pipeline.native.EncodeBatch`,
which derives every per-message value the CommitLog, ConsumeQueue and IndexFile need (PROPERTIES
lengths, record sizes, tag hashes, index key hashes) and later writes the records straight into
the mapped segment. The readable reference for one record is :func:`rocketstore.pipeline.record.encode_record`.

Pure functions; thread-safe.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import socket
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from rocketstore.pipeline import native, record
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.errors import InvalidMessageError, MessageTooLargeError
from rocketstore.pipeline.message import COLUMNS, Message, messages_to_table

TOPIC_PATTERN = re.compile(r"[%|a-zA-Z0-9_-]+")  # whole names only: fullmatch
# Characters no property name or value may hold: \x01 and \x02 would split the PROPERTIES
# field, and readers take a NUL there for a torn write's zeros (record.torn_tail).
RESERVED_CHARS = r"[\x00-\x02]"
RESERVED_REASON = "contains a reserved character (\\x00, \\x01 or \\x02)"
RESERVED_PROPERTIES = (
    record.PROPERTY_KEYS,
    record.PROPERTY_TAGS,
    record.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
)


def _scalar(value: bytes | None, type_: pa.DataType) -> pa.Scalar:
    """A binary or string scalar cut from an array built on raw buffers: ``pa.scalar`` (like
    ``pa.array`` of Python values) imports pandas, about 170 ms, to rule out pandas inputs, and
    every reading command of the CLI imports this module."""
    if value is None:
        return pa.nulls(1, type_)[0]
    offsets = pa.py_buffer(np.array([0, len(value)], dtype=np.int32))
    return pa.Array.from_buffers(type_, 1, [None, offsets, pa.py_buffer(value)])[0]


# Compute functions are given Arrow scalars, never Python literals: converting a literal costs
# a failed optional import inside pyarrow on every call, which dominated small puts.
_EMPTY_STR = _scalar(b"", pa.string())
_NULL_STR = _scalar(None, pa.string())
_NAME_SEP = _scalar(b"\x01", pa.string())
_PROP_SEP = _scalar(b"\x02", pa.string())
_ZERO_OF = {
    pa.from_numpy_dtype(d): pa.Array.from_buffers(
        pa.from_numpy_dtype(d), 1, [None, pa.py_buffer(np.zeros(1, d))]
    )[0]
    for d in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
}


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


def _fail(
    cls: type[InvalidMessageError], column: str, mask: npt.NDArray[np.bool_], reason: str
) -> None:
    bad = np.flatnonzero(mask)
    if len(bad):
        raise cls(
            f"column {column!r}: {reason} ({len(bad)} row(s), first at row {int(bad[0])})",
            int(bad[0]),
        )


def _column(table: pa.Table, name: str) -> pa.Array | None:
    if name not in table.column_names:
        return None
    col = table.column(name)
    return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)


def _int_column(
    table: pa.Table, name: str, dtype: type[np.int32] | type[np.int64]
) -> npt.NDArray[Any] | None:
    """An integer column as ``dtype`` (nulls as 0), or None when the batch does not carry it.
    Borrowed from Arrow without a copy when it already has that type and no null."""
    col = _column(table, name)
    if col is None:
        return None
    if not (pa.types.is_integer(col.type)):
        raise InvalidMessageError(f"column {name!r}: expected an integer type, got {col.type}")
    if col.null_count:
        col = pc.fill_null(col, _ZERO_OF[col.type])
    raw: npt.NDArray[Any] = col.to_numpy(zero_copy_only=False)
    target = np.dtype(dtype)
    if raw.dtype == target:
        return raw
    info = np.iinfo(dtype)
    out_of_range = raw > info.max
    if raw.dtype.kind == "i":
        out_of_range |= raw < info.min
    _fail(InvalidMessageError, name, out_of_range, f"value out of range for {target.name}")
    return raw.astype(target)


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
    rows without one (:func:`rocketstore.pipeline.storehost.store_host`).

    Raises :class:`InvalidMessageError` (or :class:`MessageTooLargeError`) naming the column,
    the reason, how many rows fail and the first of them.
    """
    table = to_table(data)
    unknown = [c for c in table.column_names if c not in COLUMNS]
    if unknown:
        raise InvalidMessageError(
            f"unknown column(s) {unknown}; accepted columns: {', '.join(COLUMNS)}"
        )
    n = table.num_rows

    # topic
    topic_col = _column(table, "topic")
    if topic_col is None:
        raise InvalidMessageError("column 'topic' is required")
    if pa.types.is_dictionary(topic_col.type):
        topic_col = topic_col.cast(topic_col.type.value_type)
    if not (pa.types.is_string(topic_col.type) or pa.types.is_large_string(topic_col.type)):
        raise InvalidMessageError(f"column 'topic': expected string, got {topic_col.type}")
    _fail(
        InvalidMessageError,
        "topic",
        topic_col.is_null().to_numpy(zero_copy_only=False),
        "topic is null",
    )
    encoded_topics = pc.dictionary_encode(topic_col)
    topics: list[str] = encoded_topics.dictionary.to_pylist()
    topic_codes = np.asarray(encoded_topics.indices.to_numpy(zero_copy_only=False), np.int32)
    for i, t in enumerate(topics):
        reason = topic_problem(t)
        if reason:
            _fail(InvalidMessageError, "topic", topic_codes == i, f"topic {t!r} {reason}")

    # body
    body_col = _column(table, "body")
    if body_col is None:
        raise InvalidMessageError("column 'body' is required")
    if pa.types.is_string(body_col.type) or pa.types.is_large_string(body_col.type):
        body_col = body_col.cast(
            pa.binary() if pa.types.is_string(body_col.type) else pa.large_binary()
        )
    if pa.types.is_large_binary(body_col.type):
        body_col = body_col.cast(pa.binary())
    if not pa.types.is_binary(body_col.type):
        raise InvalidMessageError(f"column 'body': expected binary or string, got {body_col.type}")
    _fail(
        InvalidMessageError,
        "body",
        body_col.is_null().to_numpy(zero_copy_only=False),
        "body is null",
    )
    bodies = native.strings(body_col)
    _fail(
        MessageTooLargeError,
        "body",
        np.diff(bodies[1]) > config.max_message_size,
        f"body larger than maxMessageSize={config.max_message_size} bytes",
    )

    # Columns a batch does not carry stay None: the encoder writes 0 (a missing bornTimestamp:
    # the store time), so the common batch allocates no per-row array for them.
    queue_ids = _int_column(table, "queueId", np.int32)
    if queue_ids is None:
        queue_ids = np.zeros(n, dtype=np.int32)
    _fail(InvalidMessageError, "queueId", queue_ids < 0, "queueId is negative")
    flags = _int_column(table, "flag", np.int32)
    sys_in = _int_column(table, "sysFlag", np.int32)
    if sys_in is not None:
        _fail(
            InvalidMessageError,
            "sysFlag",
            (sys_in & ~record.TRANSACTION_MASK) != 0,
            "only the transaction bits (0x4, 0x8, 0xC) may be set",
        )
    reconsume = _int_column(table, "reconsumeTimes", np.int32)
    prep_tx = _int_column(table, "preparedTransactionOffset", np.int64)
    born_ts = _int_column(table, "bornTimestamp", np.int64)
    born_ts_col = _column(table, "bornTimestamp")
    # Rows without a born timestamp are born when stored: the encoder stamps those this mask
    # marks (and every row when the column is absent).
    born_ts_missing = (
        born_ts_col.is_null().to_numpy(zero_copy_only=False)
        if born_ts_col is not None and born_ts_col.null_count
        else None
    )

    # hosts
    store_field, store_v6 = record.encode_host(store_host)
    born_col = _column(table, "bornHost")
    born_codes: npt.NDArray[np.int32] | None = None  # None: every message's is born_hosts[0]
    if born_col is None or born_col.null_count == n:
        born_hosts = [store_field]
    else:
        filled = pc.fill_null(born_col, store_host)
        enc = pc.dictionary_encode(filled)
        born_hosts = []
        for text in enc.dictionary.to_pylist():
            try:
                born_hosts.append(record.encode_host(text)[0])
            except InvalidMessageError as exc:
                codes = enc.indices.to_numpy(zero_copy_only=False)
                _fail(
                    InvalidMessageError,
                    "bornHost",
                    codes == enc.dictionary.to_pylist().index(text),
                    exc.reason,
                )
        born_codes = np.asarray(enc.indices.to_numpy(zero_copy_only=False), np.int32)
    sys_flags = np.zeros(n, np.int32) if sys_in is None else sys_in.astype(np.int32)
    v6_hosts = [k for k, h in enumerate(born_hosts) if len(h) == 20]
    if v6_hosts and born_codes is not None:
        sys_flags[np.isin(born_codes, v6_hosts)] |= record.BORNHOST_V6_FLAG
    elif v6_hosts:
        sys_flags |= record.BORNHOST_V6_FLAG
    if store_v6:
        sys_flags |= record.STOREHOSTADDRESS_V6_FLAG

    # keys, tags, UNIQ_KEY, user properties
    keys_str = _keys_column(table, n)
    tags = _string_column(table, "tags", n)
    uniq_keys = _string_column(table, "uniqKey", n)
    user_props = _column(table, "properties")
    if user_props is not None and user_props.null_count < n:
        keys_str, tags, uniq_keys, user_props = _lift_reserved(
            keys_str, tags, uniq_keys, user_props
        )
    checked = [(keys_str, "keys"), (tags, "tags")]
    if uniq_keys.null_count == n:
        uniq_keys = uniq.generate(n, now_ms)
    else:
        checked.append((uniq_keys, "uniqKey"))
        if uniq_keys.null_count:
            missing_uniq = uniq_keys.is_null().to_numpy(zero_copy_only=False)
            fresh = uniq.generate(int(missing_uniq.sum()), now_ms)
            filled = np.empty(n, dtype=object)
            filled[~missing_uniq] = uniq_keys.filter(pa.array(~missing_uniq)).to_pylist()
            filled[missing_uniq] = fresh.to_pylist()
            uniq_keys = pa.array(filled, pa.string())
    for values, what in checked:
        _check_reserved_chars(values, what)
    user_part = None
    if user_props is not None and user_props.null_count < n:
        # Each pair ends with \x02 here; the record carries none after the last.
        pairs = _encode_user_props(user_props).view(pa.binary())
        user_part = pc.binary_slice(pairs, 0, -1) if len(pairs) else pairs
    # The encoder and the index keys read the same columns: handed over once, for both.
    topic_table = native.table_of([t.encode("utf-8") for t in topics])
    keys_arg, uniq_arg = native.strings(keys_str), native.strings(uniq_keys)
    encoder = native.EncodeBatch(
        n=n,
        topics=topic_table,
        topic_codes=topic_codes,
        queue_ids=queue_ids,
        flags=flags,
        sys_flags=sys_flags,
        reconsume=reconsume,
        prep_tx=prep_tx,
        born_ts=born_ts,
        born_missing=None if born_ts_missing is None else born_ts_missing.view(np.uint8),
        born_hosts=native.table_of(born_hosts),
        born_codes=born_codes,
        store_host=store_field,
        bodies=bodies,
        keys=keys_arg,
        tags=native.strings(tags),
        uniq=uniq_arg,
        user_props=None if user_part is None else native.strings(user_part),
    )
    sizes = np.empty(n, dtype=np.int64)
    too_long, first_too_long = encoder.measure(sizes, record.MAX_PROPERTIES_LENGTH)
    if too_long:
        raise InvalidMessageError(
            f"column 'properties': encoded properties longer than "
            f"{record.MAX_PROPERTIES_LENGTH} bytes ({too_long} row(s), first at row "
            f"{first_too_long})",
            first_too_long,
        )
    limit = config.mapped_file_size_commitlog - record.BLANK_SIZE
    _fail(
        MessageTooLargeError,
        "body",
        sizes > limit,
        f"record larger than a CommitLog segment can hold ({limit} bytes)",
    )
    tags_codes = np.empty(n, dtype=np.int64)
    encoder.tags_codes(tags_codes)
    key_rows, key_hashes = index_keys(topic_table, topic_codes, uniq_arg, keys_arg, sys_flags)
    return PreparedBatch(
        n=n,
        topics=topics,
        topic_codes=topic_codes,
        queue_ids=queue_ids,
        sys_flags=sys_flags,
        tags_codes=tags_codes,
        uniq_keys=uniq_keys,
        key_rows=key_rows,
        key_hashes=key_hashes,
        sizes=sizes,
        encoder=encoder,
    )


def topic_problem(topic: str) -> str | None:
    """Why ``topic`` cannot be stored, or None. Topics name directories, so the rule matters."""
    if not topic:
        return "is empty"
    if len(topic.encode("utf-8")) > record.MAX_TOPIC_LENGTH:
        return f"is longer than {record.MAX_TOPIC_LENGTH} bytes"
    if not TOPIC_PATTERN.fullmatch(topic):
        return "has characters outside [%|a-zA-Z0-9_-] (RocketMQ's topic rule)"
    return None


def _string_column(table: pa.Table, name: str, n: int) -> pa.StringArray:
    col = _column(table, name)
    if col is None:
        return pa.nulls(n, pa.string())
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    if pa.types.is_large_string(col.type):
        col = col.cast(pa.string())
    if not pa.types.is_string(col.type):
        raise InvalidMessageError(f"column {name!r}: expected string, got {col.type}")
    # An empty value means "none": RocketMQ never stores an empty TAGS or KEYS property.
    # Copied only when there is one: the usual column passes through as it is.
    empty = pc.equal(col, _EMPTY_STR)
    return pc.if_else(empty, _NULL_STR, col) if pc.any(empty).as_py() else col


def _keys_column(table: pa.Table, n: int) -> pa.StringArray:
    col = _column(table, "keys")
    if col is None:
        return pa.nulls(n, pa.string())
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        if not (
            pa.types.is_string(col.type.value_type) or pa.types.is_large_string(col.type.value_type)
        ):
            raise InvalidMessageError(f"column 'keys': expected list<string>, got {col.type}")
        flat = pc.list_flatten(col)
        if flat.null_count:
            _fail_rows(
                col,
                flat.is_null().to_numpy(zero_copy_only=False),
                n,
                "keys",
                "a key inside a list is null",
            )
        joined = pc.binary_join(col, " ")
        table = pa.table({"keys": joined})
    return _string_column(table, "keys", n)


def _lift_reserved(
    keys: pa.StringArray, tags: pa.StringArray, uniq: pa.StringArray, props: pa.Array
) -> tuple[pa.StringArray, pa.StringArray, pa.StringArray, pa.Array]:
    """Take KEYS / TAGS / UNIQ_KEY given as user properties (as ``dump`` prints them) into their
    own fields, refusing a row that gives one twice with different values."""
    if not pa.types.is_map(props.type):
        raise InvalidMessageError(
            f"column 'properties': expected map<string,string>, got {props.type}"
        )
    flat_keys = _unsliced(props).keys
    if not pc.any(pc.is_in(flat_keys, pa.array(RESERVED_PROPERTIES))).as_py():
        return keys, tags, uniq, props
    fields = {
        record.PROPERTY_KEYS: keys.to_pylist(),
        record.PROPERTY_TAGS: tags.to_pylist(),
        record.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: uniq.to_pylist(),
    }
    rest: list[list[tuple[str, str]] | None] = []
    for row, items in enumerate(props.to_pylist()):
        if items is None:
            rest.append(None)
            continue
        kept = []
        for name, value in items:
            if name in fields:
                # An empty value is no value, as for the fields themselves.
                current = fields[name][row]
                if value and current is not None and current != value:
                    raise InvalidMessageError(
                        f"row {row}: property {name}={value!r} contradicts the "
                        f"{name.lower()} field {current!r}",
                        row,
                    )
                if value:
                    fields[name][row] = value
            else:
                kept.append((name, value))
        rest.append(kept)
    return (
        pa.array(fields[record.PROPERTY_KEYS], pa.string()),
        pa.array(fields[record.PROPERTY_TAGS], pa.string()),
        pa.array(fields[record.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX], pa.string()),
        pa.array(rest, pa.map_(pa.string(), pa.string())),
    )


def _check_reserved_chars(values: pa.Array, what: str) -> None:
    """Refuse a reserved character (:data:`RESERVED_CHARS`) inside a value."""
    data = values.buffers()[2] if values.null_count < len(values) else None
    if data is None:
        return
    offs = np.asarray(native.strings(values)[1])
    raw = np.frombuffer(data, dtype=np.uint8)[int(offs[0]) : int(offs[-1])]
    if not len(raw) or int(raw.min()) > 2:  # min(): no temporary the size of the data
        return
    bad = pc.fill_null(pc.match_substring_regex(values, RESERVED_CHARS), False)
    _fail(InvalidMessageError, what, bad.to_numpy(zero_copy_only=False), RESERVED_REASON)


def _encode_user_props(user: pa.Array) -> pa.Array:
    user = _unsliced(user)
    n = len(user)
    names = user.keys
    values = user.items
    _fail_rows(
        user,
        values.is_null().to_numpy(zero_copy_only=False),
        n,
        "properties",
        "a property value is null",
    )
    for arr, what in ((names, "name"), (values, "value")):
        bad = pc.fill_null(pc.match_substring_regex(arr, RESERVED_CHARS), False)
        _fail_rows(
            user,
            bad.to_numpy(zero_copy_only=False),
            n,
            "properties",
            f"a property {what} {RESERVED_REASON}",
        )
    _fail_rows(
        user,
        pc.equal(names, _EMPTY_STR).to_numpy(zero_copy_only=False),
        n,
        "properties",
        "a property name is empty",
    )
    pairs = pc.binary_join_element_wise(names, _NAME_SEP, values, _PROP_SEP, _EMPTY_STR)
    offsets = binary_offsets_of_list(user)
    per_row = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pairs)
    # Each pair ends with \x02 here; the caller drops the final one.
    return pc.fill_null(pc.binary_join(per_row, ""), "")


def _fail_rows(
    lists: pa.Array, flat_bad: npt.NDArray[np.bool_], n: int, column: str, reason: str
) -> None:
    """:func:`_fail` for a condition on the elements of a list/map column: report the rows."""
    if not flat_bad.any():
        return
    # From the offsets, not pc.list_parent_indices, which does not take map arrays.
    wide = pa.types.is_large_list(lists.type)
    raw = np.frombuffer(lists.buffers()[1], dtype=np.int64 if wide else np.int32)
    offsets = raw[lists.offset : lists.offset + n + 1].astype(np.int64)
    parents = np.repeat(np.arange(n), np.diff(offsets))
    rows = np.zeros(n, dtype=bool)
    rows[parents[flat_bad]] = True
    _fail(InvalidMessageError, column, rows, reason)


def _unsliced(arr: pa.Array) -> pa.Array:
    """The array with offset 0, so that a map's ``keys`` / ``items`` cover exactly its rows."""
    return pa.concat_arrays([arr]) if arr.offset else arr


def binary_offsets_of_list(arr: pa.Array) -> npt.NDArray[np.int32]:
    raw = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset : arr.offset + len(arr) + 1]
    return np.asarray(raw - raw[0], dtype=np.int32)


def index_keys(
    topics: native.StringTriple,
    topic_codes: npt.NDArray[np.int32],
    uniq: native.StringTriple,
    keys: native.StringTriple,
    sys_flags: npt.NDArray[np.int32],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]:
    """Index entries in RocketMQ's order: UNIQ_KEY, then each KEYS token, per message;
    ROLLBACK transactions get none. Returns (message row, key hash) per entry. The string
    columns come as :func:`rocketstore.pipeline.native.strings` makes them, ``topics`` as
    :func:`rocketstore.pipeline.native.table_of` does."""
    rows, hashes = native.index_keys(topics, topic_codes, uniq, keys, sys_flags)
    return (
        np.frombuffer(memoryview(rows), dtype=np.int64),
        np.frombuffer(memoryview(hashes), dtype=np.int32),
    )
