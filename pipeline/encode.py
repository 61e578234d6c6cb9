"""Batch preparation: an Arrow batch of messages -> validated columns -> the native encoder.

:func:`prepare` validates a whole batch before anything is written (all or nothing, whole-column
checks with numpy and Arrow) and hands the columns to :class:`pipeline.native.EncodeBatch`,
which derives every per-message value the CommitLog, ConsumeQueue and IndexFile need (PROPERTIES
lengths, record sizes, tag hashes, index key hashes) and later writes the records straight into
the mapped segment. The readable reference for one record is :func:`pipeline.record.encode_record`.

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

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from pipeline import native, record
from pipeline.config import StoreConfig
from pipeline.errors import InvalidMessageError, MessageTooLargeError
from pipeline.javahash import binary_offsets
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
_EMPTY_STR = _scalar(b"", pa.string())
_NULL_STR = _scalar(None, pa.string())
_NAME_SEP = _scalar(b"\x01", pa.string())
_PROP_SEP = _scalar(b"\x02", pa.string())


@dataclasses.dataclass
class PreparedBatch:
    """A validated batch, column by column (numpy arrays of length ``n`` unless noted), and the
    native encoder that borrows its columns."""

    n: int
    topics: list[str]  # distinct topics
    topic_codes: npt.NDArray[np.int32]
    queue_ids: npt.NDArray[np.int32]
    sys_flags: npt.NDArray[np.int32]  # with the host v6 bits set
    props_lens: npt.NDArray[np.int64]
    tags_codes: npt.NDArray[np.int64]
    uniq_keys: pa.StringArray
    key_rows: npt.NDArray[np.int64]  # per index entry: the message it belongs to
    key_hashes: npt.NDArray[np.int32]  # per index entry: abs hash of "topic#key"
    sizes: npt.NDArray[np.int64]
    encoder: native.EncodeBatch

    @property
    def transaction_types(self) -> npt.NDArray[np.int32]:
        return self.sys_flags & record.TRANSACTION_MASK


# -- UNIQ_KEY ----------------------------------------------------------------------------------


_SEQ_MASK = (1 << 48) - 1


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
        seqs = (np.arange(n, dtype=np.uint64) + np.uint64(start)) & np.uint64((1 << 48) - 1)
        raw = np.empty((n, 16), dtype=np.uint8)
        raw[:, :10] = self._prefix
        raw[:, 10:] = seqs.astype(">u8").view(np.uint8).reshape(n, 8)[:, 2:]
        return hex_fixed(raw)

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
    # Without the column every message is born when stored (the encoder stamps the rows this
    # mask marks; None would mean "all given" and store 0).
    born_ts_missing = (
        np.ones(n, dtype=bool)
        if born_ts_col is None
        else born_ts_col.is_null().to_numpy(zero_copy_only=False)
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
    for values, what in ((keys_str, "keys"), (tags, "tags"), (uniq_keys, "uniqKey")):
        _check_separators(values, what)
    user_part = None
    if user_props is not None and user_props.null_count < n:
        # Each pair ends with \x02 here; the record carries none after the last.
        pairs = _encode_user_props(user_props).view(pa.binary())
        user_part = pc.binary_slice(pairs, 0, -1) if len(pairs) else pairs
    encoder = native.EncodeBatch(
        n=n,
        topics=native.table_of([t.encode("utf-8") for t in topics]),
        topic_codes=np.ascontiguousarray(topic_codes, dtype=np.int32),
        queue_ids=queue_ids.astype(np.int32),
        flags=flags.astype(np.int32),
        sys_flags=sys_flags,
        reconsume=reconsume.astype(np.int32),
        prep_tx=prep_tx,
        born_ts=born_ts,
        born_missing=None if born_ts_missing is None else born_ts_missing.view(np.uint8),
        born_hosts=native.table_of(born_hosts),
        born_codes=np.ascontiguousarray(born_codes, dtype=np.int32),
        store_host=store_field,
        bodies=native.strings(body_col),
        keys=native.strings(keys_str),
        tags=native.strings(tags),
        uniq=native.strings(uniq_keys),
        user_props=None if user_part is None else native.strings(user_part),
    )
    props_lens = np.empty(n, dtype=np.int64)
    sizes = np.empty(n, dtype=np.int64)
    encoder.measure(props_lens, sizes)
    _fail(
        InvalidMessageError,
        "properties",
        props_lens > record.MAX_PROPERTIES_LENGTH,
        f"encoded properties longer than {record.MAX_PROPERTIES_LENGTH} bytes",
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
    key_rows, key_hashes = index_keys(topics, topic_codes, uniq_keys, keys_str, sys_flags)
    return PreparedBatch(
        n=n,
        topics=topics,
        topic_codes=topic_codes,
        queue_ids=queue_ids.astype(np.int32),
        sys_flags=sys_flags,
        props_lens=props_lens,
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
    rows, hashes = native.index_keys(
        native.table_of([t.encode("utf-8") for t in topics]),
        np.ascontiguousarray(topic_codes, dtype=np.int32),
        native.strings(uniq),
        native.strings(keys),
        np.ascontiguousarray(sys_flags, dtype=np.int32),
    )
    return np.frombuffer(rows, dtype=np.int64), np.frombuffer(hashes, dtype=np.int32)
