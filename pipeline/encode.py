"""Vectorised batch encoding: an Arrow batch of messages -> validated columns -> record bytes.

:func:`prepare` validates a whole batch before anything is written (all or nothing) and derives
every per-message value the CommitLog, ConsumeQueue and IndexFile need: encoded properties,
record sizes, tag hashes and index key hashes. :func:`encode_records` then builds the bytes of a
run of records with Arrow's element-wise binary join over fixed-width numpy headers, so the only
per-message Python work in a batch put is the body CRC.

Pure functions; thread-safe.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import re
import socket
import time
import zlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from pipeline import record
from pipeline.config import StoreConfig
from pipeline.errors import InvalidMessageError, MessageTooLargeError
from pipeline.javahash import (
    abs_index_hash,
    binary_offsets,
    combine_prefix,
    java_hash,
    java_hash_array,
    utf16_lengths,
)
from pipeline.message import COLUMNS, Message, messages_to_table

TOPIC_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")
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
_EMPTY = _scalar(b"", pa.binary())
_EMPTY_STR = _scalar(b"", pa.string())
_NULL_STR = _scalar(None, pa.string())
_NAME_SEP = _scalar(b"\x01", pa.string())
_PROP_SEP = _scalar(b"\x02", pa.string())


def _mid_dtype(store_host_len: int) -> np.dtype:
    return np.dtype(
        [
            ("store_ts", ">i8"),
            ("store_host", f"S{store_host_len}"),
            ("reconsume", ">i4"),
            ("prep_tx", ">i8"),
            ("body_len", ">i4"),
        ]
    )


@dataclasses.dataclass
class PreparedBatch:
    """A validated batch, column by column (numpy arrays of length ``n`` unless noted)."""

    n: int
    topics: list[str]  # distinct topics
    topic_codes: npt.NDArray[np.int32]
    queue_ids: npt.NDArray[np.int32]
    bodies: pa.BinaryArray
    body_lens: npt.NDArray[np.int64]
    flags: npt.NDArray[np.int32]
    sys_flags: npt.NDArray[np.int32]  # with the host v6 bits set
    reconsume: npt.NDArray[np.int32]
    prep_tx: npt.NDArray[np.int64]
    born_ts: npt.NDArray[np.int64]
    born_ts_missing: npt.NDArray[np.bool_] | None  # rows that take the store timestamp
    born_codes: npt.NDArray[np.int32]
    born_hosts: list[bytes]  # distinct BORNHOST field bytes (address + port)
    props_pieces: list[pa.Array | pa.Scalar]  # joined element-wise, they give PROPERTIES
    props_lens: npt.NDArray[np.int64]
    tags_codes: npt.NDArray[np.int64]
    uniq_keys: pa.StringArray
    key_rows: npt.NDArray[np.int64]  # per index entry: the message it belongs to
    key_hashes: npt.NDArray[np.int32]  # per index entry: abs hash of "topic#key"
    sizes: npt.NDArray[np.int64]

    @property
    def transaction_types(self) -> npt.NDArray[np.int32]:
        return self.sys_flags & record.TRANSACTION_MASK


# -- UNIQ_KEY ----------------------------------------------------------------------------------


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
        self._seq = 0

    def generate(self, n: int, now_ms: int) -> pa.StringArray:
        t = time.gmtime(now_ms / 1000)
        month_start = int(time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, 0)) - time.timezone)
        since = max(0, now_ms - month_start * 1000) & 0xFFFFFFFF
        start = max(self._seq, since << 16)
        seqs = (np.arange(n, dtype=np.uint64) + np.uint64(start)) & np.uint64((1 << 48) - 1)
        self._seq = start + n
        raw = np.empty((n, 16), dtype=np.uint8)
        raw[:, :10] = self._prefix
        raw[:, 10:] = seqs.astype(">u8").view(np.uint8).reshape(n, 8)[:, 2:]
        return hex_fixed(raw)


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


def _int_column(table: pa.Table, name: str, dtype: type, default: int) -> npt.NDArray[np.int64]:
    col = _column(table, name)
    if col is None:
        return np.full(table.num_rows, default, dtype=np.int64)
    if not (pa.types.is_integer(col.type)):
        raise InvalidMessageError(f"column {name!r}: expected an integer type, got {col.type}")
    raw = pc.fill_null(col, default).to_numpy(zero_copy_only=False)
    if raw.dtype == np.uint64:
        _fail(
            InvalidMessageError,
            name,
            raw > np.iinfo(np.int64).max,
            f"value out of range for {np.dtype(dtype).name}",
        )
    values = raw.astype(np.int64)
    info = np.iinfo(dtype)
    _fail(
        InvalidMessageError,
        name,
        (values < info.min) | (values > info.max),
        f"value out of range for {np.dtype(dtype).name}",
    )
    return np.asarray(values, dtype=np.int64)


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
) -> PreparedBatch:
    """Validate a batch and derive everything needed to store it. Nothing is written.

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
    topic_codes = encoded_topics.indices.to_numpy(zero_copy_only=False).astype(np.int32)
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
    body_lens = np.diff(binary_offsets(body_col))
    _fail(
        MessageTooLargeError,
        "body",
        body_lens > config.max_message_size,
        f"body larger than maxMessageSize={config.max_message_size} bytes",
    )

    queue_ids = _int_column(table, "queueId", np.int32, 0)
    _fail(InvalidMessageError, "queueId", queue_ids < 0, "queueId is negative")
    flags = _int_column(table, "flag", np.int32, 0)
    sys_in = _int_column(table, "sysFlag", np.int32, 0)
    _fail(
        InvalidMessageError,
        "sysFlag",
        (sys_in & ~record.TRANSACTION_MASK) != 0,
        "only the transaction bits (0x4, 0x8, 0xC) may be set",
    )
    reconsume = _int_column(table, "reconsumeTimes", np.int32, 0)
    prep_tx = _int_column(table, "preparedTransactionOffset", np.int64, 0)
    born_ts = _int_column(table, "bornTimestamp", np.int64, 0)
    born_ts_col = _column(table, "bornTimestamp")
    born_ts_missing = (
        None if born_ts_col is None else born_ts_col.is_null().to_numpy(zero_copy_only=False)
    )

    # hosts
    store_field, store_v6 = record.encode_host(config.store_host)
    born_col = _column(table, "bornHost")
    if born_col is None or born_col.null_count == n:
        born_hosts = [store_field]
        born_codes = np.zeros(n, dtype=np.int32)
    else:
        filled = pc.fill_null(born_col, config.store_host)
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
        born_codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int32)
    born_v6 = np.array([len(h) == 20 for h in born_hosts], dtype=bool)[born_codes]
    sys_flags = (
        sys_in
        | np.where(born_v6, record.BORNHOST_V6_FLAG, 0)
        | (record.STOREHOSTADDRESS_V6_FLAG if store_v6 else 0)
    ).astype(np.int32)

    # keys, tags, UNIQ_KEY, user properties
    keys_str = _keys_column(table, n)
    tags = _string_column(table, "tags", n)
    uniq_keys = _string_column(table, "uniqKey", n)
    user_props = _column(table, "properties")
    if user_props is not None and user_props.null_count < n:
        keys_str, tags, uniq_keys, user_props = _lift_reserved(
            keys_str, tags, uniq_keys, user_props
        )
    missing_uniq = uniq_keys.is_null().to_numpy(zero_copy_only=False)
    if missing_uniq.any():
        fresh = uniq.generate(int(missing_uniq.sum()), now_ms)
        filled = np.empty(n, dtype=object)
        filled[~missing_uniq] = uniq_keys.filter(pa.array(~missing_uniq)).to_pylist()
        filled[missing_uniq] = fresh.to_pylist()
        uniq_keys = pa.array(filled, pa.string()) if not missing_uniq.all() else fresh
    props_pieces, props_lens = _props_pieces(keys_str, tags, uniq_keys, user_props)
    _fail(
        InvalidMessageError,
        "properties",
        props_lens > record.MAX_PROPERTIES_LENGTH,
        f"encoded properties longer than {record.MAX_PROPERTIES_LENGTH} bytes",
    )

    topic_lens = np.array([len(t.encode("utf-8")) for t in topics], dtype=np.int64)[topic_codes]
    sizes = (
        record.FIXED_SIZE_V4
        + body_lens
        + topic_lens
        + props_lens
        + np.where(born_v6, record.HOST_EXTRA_V6, 0)
        + (record.HOST_EXTRA_V6 if store_v6 else 0)
    ).astype(np.int64)
    limit = config.mapped_file_size_commitlog - record.BLANK_SIZE
    _fail(
        MessageTooLargeError,
        "body",
        sizes > limit,
        f"record larger than a CommitLog segment can hold ({limit} bytes)",
    )

    tags_codes = java_hash_array(tags).astype(np.int64)
    key_rows, key_hashes = index_keys(topics, topic_codes, uniq_keys, keys_str, sys_flags)

    return PreparedBatch(
        n=n,
        topics=topics,
        topic_codes=topic_codes,
        queue_ids=queue_ids.astype(np.int32),
        bodies=body_col,
        body_lens=body_lens,
        flags=flags.astype(np.int32),
        sys_flags=sys_flags,
        reconsume=reconsume.astype(np.int32),
        prep_tx=prep_tx,
        born_ts=born_ts,
        born_ts_missing=born_ts_missing,
        born_codes=born_codes,
        born_hosts=born_hosts,
        props_pieces=props_pieces,
        props_lens=props_lens,
        tags_codes=tags_codes,
        uniq_keys=uniq_keys,
        key_rows=key_rows,
        key_hashes=key_hashes,
        sizes=sizes,
    )


def topic_problem(topic: str) -> str | None:
    """Why ``topic`` cannot be stored, or None. Topics name directories, so the rule matters."""
    if not topic:
        return "is empty"
    if len(topic.encode("utf-8")) > record.MAX_TOPIC_LENGTH:
        return f"is longer than {record.MAX_TOPIC_LENGTH} bytes"
    if not TOPIC_PATTERN.match(topic):
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
    return pc.if_else(pc.equal(col, _EMPTY_STR), _NULL_STR, col)


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
                current = fields[name][row]
                if current is not None and current != value:
                    raise InvalidMessageError(
                        f"row {row}: property {name}={value!r} contradicts the "
                        f"{name.lower()} field {current!r}",
                        row,
                    )
                fields[name][row] = value or None
            else:
                kept.append((name, value))
        rest.append(kept)
    return (
        pa.array(fields[record.PROPERTY_KEYS], pa.string()),
        pa.array(fields[record.PROPERTY_TAGS], pa.string()),
        pa.array(fields[record.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX], pa.string()),
        pa.array(rest, pa.map_(pa.string(), pa.string())),
    )


def _check_separators(values: pa.Array, what: str) -> None:
    """Refuse \\x01 / \\x02 inside a value: they would split the PROPERTIES field."""
    data = values.buffers()[2] if values.null_count < len(values) else None
    if data is None:
        return
    offs = binary_offsets(values)
    raw = np.frombuffer(data, dtype=np.uint8)[offs[0] : offs[-1]]
    if not np.any(raw <= 2):
        return
    bad = pc.fill_null(pc.match_substring_regex(values, "[\x01\x02]"), False)
    _fail(
        InvalidMessageError,
        what,
        bad.to_numpy(zero_copy_only=False),
        "contains a reserved separator character (\\x01 or \\x02)",
    )


def _props_pieces(
    keys: pa.StringArray, tags: pa.StringArray, uniq: pa.StringArray, user: pa.Array | None
) -> tuple[list[pa.Array | pa.Scalar], npt.NDArray[np.int64]]:
    """The PROPERTIES field of every message (KEYS, TAGS, UNIQ_KEY, then user properties) as
    pieces to join element-wise, and each message's field length.

    When every part is present in all rows or in none (the usual case), the field is literal
    names and separators around the value columns, so it is never built on its own: the
    pieces go straight into the record join. Otherwise it is built per row here.
    """
    named = [
        (record.PROPERTY_KEYS, keys, "keys"),
        (record.PROPERTY_TAGS, tags, "tags"),
        (record.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uniq, "uniqKey"),
    ]
    for _, values, what in named:
        _check_separators(values, what)
    n = len(keys)
    user_part = None
    if user is not None and user.null_count < len(user):
        user_part = _encode_user_props(user)
    parts: list[tuple[str, pa.Array]] = [
        (f"{name}\x01", values.view(pa.binary())) for name, values, _ in named
    ]
    uniform = all(v.null_count in (0, n) for _, v in parts) and (
        user_part is None or user_part.null_count == 0
    )
    if uniform:
        pieces: list[pa.Array | pa.Scalar] = []
        lens = np.zeros(n, dtype=np.int64)
        literal = b""
        for prefix, values in parts:
            if values.null_count == n:
                continue
            literal += (b"\x02" if pieces or literal else b"") + prefix.encode()
            pieces.append(pa.scalar(literal, pa.binary()))
            lens += len(literal) + np.diff(binary_offsets(values))
            pieces.append(values)
            literal = b""
        if user_part is not None:
            # user_part ends with \x02 per pair; rows with no user properties are empty.
            up = user_part.view(pa.binary())
            up_lens = np.diff(binary_offsets(up))
            if pieces and np.all(up_lens > 0):
                pieces.append(pa.scalar(b"\x02", pa.binary()))
                lens += 1
            if np.all(up_lens > 0) or not pieces:
                pieces.append(pc.binary_slice(up, 0, -1) if len(up) else up)
                lens += np.maximum(up_lens - 1, 0)
            else:
                uniform = False
        if uniform:
            return pieces, lens

    # General case: some rows lack a part; build each row's field.
    def part(prefix: str, values: pa.Array) -> pa.Array:
        return pc.fill_null(
            pc.binary_join_element_wise(
                pa.scalar(prefix.encode(), pa.binary()),
                values,
                pa.scalar(b"\x02", pa.binary()),
                pa.scalar(b"", pa.binary()),
            ),
            pa.scalar(b"", pa.binary()),
        )

    joined_parts = [part(prefix, values) for prefix, values in parts]
    if user_part is not None:
        joined_parts.append(pc.fill_null(user_part.view(pa.binary()), pa.scalar(b"", pa.binary())))
    joined = pc.binary_join_element_wise(*joined_parts, pa.scalar(b"", pa.binary()))
    # Every present part ends with \x02; RocketMQ writes no trailing separator.
    props = pc.binary_slice(joined, 0, -1) if len(joined) else joined
    return [props], np.diff(binary_offsets(props))


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
        bad = pc.fill_null(pc.match_substring_regex(arr, "[\x01\x02]"), False)
        _fail_rows(
            user,
            bad.to_numpy(zero_copy_only=False),
            n,
            "properties",
            f"a property {what} contains a reserved separator character (\\x01 or \\x02)",
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
    topics: list[str],
    topic_codes: npt.NDArray[np.int32],
    uniq: pa.StringArray,
    keys: pa.StringArray,
    sys_flags: npt.NDArray[np.int32],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]:
    """Index entries in RocketMQ's order: UNIQ_KEY, then each KEYS token, per message;
    ROLLBACK transactions get none. Returns (message row, key hash) per entry."""
    prefix_by_topic = np.array([java_hash(f"{t}#") for t in topics], dtype=np.int64)

    def hashed(rows: npt.NDArray[np.int64], strings: pa.Array) -> npt.NDArray[np.int32]:
        if not len(rows):
            return np.zeros(0, dtype=np.int32)
        combined = combine_prefix(
            prefix_by_topic[topic_codes[rows]], java_hash_array(strings), utf16_lengths(strings)
        )
        return abs_index_hash(combined)

    uniq_valid = ~uniq.is_null().to_numpy(zero_copy_only=False)
    uniq_rows = np.flatnonzero(uniq_valid)
    uniq_hash = hashed(uniq_rows, uniq if uniq_valid.all() else uniq.filter(pa.array(uniq_valid)))
    if keys.null_count == len(keys):
        rows, hashes = uniq_rows, uniq_hash
    else:
        tokens = pc.split_pattern(keys, " ")
        flat = pc.list_flatten(tokens)
        parents = pc.list_parent_indices(tokens).to_numpy(zero_copy_only=False).astype(np.int64)
        nonempty = np.diff(binary_offsets(flat)) > 0
        if not nonempty.all():
            flat = flat.filter(pa.array(nonempty))
            parents = parents[nonempty]
        key_hash = hashed(parents, flat)
        if len(parents) == len(uniq_rows) == len(keys) and np.array_equal(parents, uniq_rows):
            # One key per message, all with a UNIQ_KEY: entries simply alternate.
            rows = np.repeat(uniq_rows, 2)
            hashes = np.empty(2 * len(uniq_rows), dtype=np.int32)
            hashes[0::2] = uniq_hash
            hashes[1::2] = key_hash
        else:
            rows = np.concatenate((uniq_rows, parents))
            hashes = np.concatenate((uniq_hash, key_hash))
            # Stable by message keeps UNIQ_KEY first, then KEYS tokens in their order.
            order = np.argsort(rows, kind="stable")
            rows, hashes = rows[order], hashes[order]
    keep = (sys_flags[rows] & record.TRANSACTION_MASK) != record.TRANSACTION_ROLLBACK_TYPE
    if not keep.all():
        rows, hashes = rows[keep], hashes[keep]
    return rows, hashes


# -- encoding --------------------------------------------------------------------------------


def _fixed(arr: npt.NDArray[np.void]) -> pa.BinaryArray:
    n = len(arr)
    offsets = np.arange(n + 1, dtype=np.int32) * arr.dtype.itemsize
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(arr)])


# Bodies at least this long on average are written around the record join (see
# encode_frames): copying them once more into the joined buffer would cost more than the
# per-record Python work of placing them separately.
LARGE_BODY = 1024


def body_crcs(bodies: pa.BinaryArray) -> npt.NDArray[np.int32]:
    """BODYCRC of every body. The one per-message Python loop of a batch put."""
    crc = zlib.crc32
    n = len(bodies)
    offsets = binary_offsets(bodies)
    if n and (offsets[-1] - offsets[0]) >= LARGE_BODY * n:
        # Large bodies: CRC them in place through views rather than copying each into bytes.
        view = memoryview(bodies.buffers()[2]).cast("B")
        bounds = offsets.tolist()
        values = np.fromiter(
            (crc(view[a:b]) for a, b in itertools.pairwise(bounds)),
            dtype=np.int64,
            count=n,
        )
    else:
        values = np.fromiter(map(crc, bodies.to_pylist()), dtype=np.int64, count=n)
    return (values & 0x7FFFFFFF).astype(np.int32)


def uses_frames(b: PreparedBatch) -> bool:
    """Whether the batch's bodies are large enough to be placed by :func:`encode_frames`."""
    return b.n > 0 and int(b.body_lens.sum()) >= LARGE_BODY * b.n


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where and when a batch's records go: what encoding needs beyond the batch itself."""

    phys: npt.NDArray[np.int64]
    queue_offsets: npt.NDArray[np.int64]
    store_ts: int
    crcs: npt.NDArray[np.int32]
    store_host: bytes


def _record_parts(
    b: PreparedBatch, lo: int, hi: int, where: Placement
) -> tuple[list[pa.Array | pa.Scalar], list[pa.Array | pa.Scalar]]:
    """The pieces of records ``lo:hi`` before the body and after it, for an element-wise join."""
    n = hi - lo
    head = np.empty(n, dtype=record.HEAD_DTYPE)
    head["size"] = b.sizes[lo:hi]
    head["magic"] = record.MAGIC
    head["crc"] = where.crcs[lo:hi]
    head["queue_id"] = b.queue_ids[lo:hi]
    head["flag"] = b.flags[lo:hi]
    head["queue_offset"] = where.queue_offsets[lo:hi]
    head["phys"] = where.phys[lo:hi]
    head["sys_flag"] = b.sys_flags[lo:hi]
    if b.born_ts_missing is None:  # no bornTimestamp column: born when stored
        head["born_ts"] = where.store_ts
    else:
        head["born_ts"] = np.where(b.born_ts_missing[lo:hi], where.store_ts, b.born_ts[lo:hi])
    mid = np.empty(n, dtype=_mid_dtype(len(where.store_host)))
    mid["store_ts"] = where.store_ts
    mid["store_host"] = where.store_host
    mid["reconsume"] = b.reconsume[lo:hi]
    mid["prep_tx"] = b.prep_tx[lo:hi]
    mid["body_len"] = b.body_lens[lo:hi]
    codes = pa.array(b.born_codes[lo:hi])
    born_hosts = pa.array(b.born_hosts, pa.binary()).take(codes)
    topic_pieces = pa.array(
        [bytes((len(t.encode("utf-8")),)) + t.encode("utf-8") for t in b.topics], pa.binary()
    ).take(pa.array(b.topic_codes[lo:hi]))
    plen = np.empty(n, dtype=">i2")
    plen[:] = b.props_lens[lo:hi]
    before: list[pa.Array | pa.Scalar] = [_fixed(head), born_hosts, _fixed(mid)]
    after: list[pa.Array | pa.Scalar] = [
        topic_pieces,
        _fixed(plen.view(np.dtype([("len", ">i2")]))),
        *(p.slice(lo, n) if isinstance(p, pa.Array) else p for p in b.props_pieces),
    ]
    return before, after


def _values(arr: pa.Array) -> tuple[pa.Buffer, npt.NDArray[np.int64]]:
    offsets = binary_offsets(arr)
    return arr.buffers()[2], offsets


def encode_records(
    b: PreparedBatch,
    lo: int,
    hi: int,
    where: Placement,
) -> tuple[pa.Buffer, npt.NDArray[np.int64]]:
    """The bytes of records ``lo:hi``, back to back (they must be contiguous in the log), and
    each record's start in them (``n + 1`` offsets, relative to the joined array)."""
    before, after = _record_parts(b, lo, hi, where)
    joined = pc.binary_join_element_wise(*before, b.bodies.slice(lo, hi - lo), *after, _EMPTY)
    data, start = _values(joined)
    return data.slice(int(start[0]), int(start[-1] - start[0])), start


def encode_frames(
    b: PreparedBatch,
    lo: int,
    hi: int,
    where: Placement,
) -> tuple[pa.Buffer, npt.NDArray[np.int64]]:
    """Records ``lo:hi`` without their bodies: ``n + 1`` frames, where frame ``i`` is what lies
    between body ``i - 1`` and body ``i`` (the end of one record and the start of the next).
    Returns the frames' bytes and their ``n + 2`` offsets into them. Writing frame 0, body 0,
    frame 1, body 1, ... frame n gives exactly :func:`encode_records`' bytes."""
    before, after = _record_parts(b, lo, hi, where)
    pre = pc.binary_join_element_wise(*before, _EMPTY)
    post = pc.binary_join_element_wise(*after, _EMPTY)
    empty = pa.array([b""], pa.binary())
    frames = pc.binary_join_element_wise(
        pa.concat_arrays([empty, post]), pa.concat_arrays([pre, empty]), _EMPTY
    )
    return _values(frames)
