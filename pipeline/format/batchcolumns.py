"""The column checks of a batch put: each column of an Arrow batch read, type-checked and
validated as a whole, one function per column or group of columns.

:func:`rocketstore.pipeline.format.encode.prepare` runs them in order before anything is written; the
first that fails raises :class:`InvalidMessageError` (or :class:`MessageTooLargeError`) naming
the column, the reason, how many rows fail and the first of them. The columns themselves are
listed in :mod:`rocketstore.pipeline.format.message`.

Pure functions; thread-safe.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from rocketstore.pipeline.errors import InvalidMessageError, MessageTooLargeError
from rocketstore.pipeline.format import native, record
from rocketstore.pipeline.format.message import COLUMNS

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


def topic_problem(topic: str) -> str | None:
    """Why ``topic`` cannot be stored, or None. Topics name directories, so the rule matters."""
    if not topic:
        return "is empty"
    if len(topic.encode("utf-8")) > record.MAX_TOPIC_LENGTH:
        return f"is longer than {record.MAX_TOPIC_LENGTH} bytes"
    if not TOPIC_PATTERN.fullmatch(topic):
        return "has characters outside [%|a-zA-Z0-9_-] (RocketMQ's topic rule)"
    return None


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


def _nulls(col: pa.Array) -> npt.NDArray[np.bool_]:
    mask: npt.NDArray[np.bool_] = col.is_null().to_numpy(zero_copy_only=False)
    return mask


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


# -- the columns, in the order prepare checks them ---------------------------------------------


def check_names(table: pa.Table) -> None:
    """Refuse a column that is none of :data:`rocketstore.pipeline.format.message.COLUMNS`."""
    unknown = [c for c in table.column_names if c not in COLUMNS]
    if unknown:
        raise InvalidMessageError(
            f"unknown column(s) {unknown}; accepted columns: {', '.join(COLUMNS)}"
        )


def topic_column(table: pa.Table) -> tuple[list[str], npt.NDArray[np.int32]]:
    """The distinct topics and each row's index among them; every topic follows
    :func:`topic_problem`'s rule."""
    topic_col = _column(table, "topic")
    if topic_col is None:
        raise InvalidMessageError("column 'topic' is required")
    if pa.types.is_dictionary(topic_col.type):
        topic_col = topic_col.cast(topic_col.type.value_type)
    if not (pa.types.is_string(topic_col.type) or pa.types.is_large_string(topic_col.type)):
        raise InvalidMessageError(f"column 'topic': expected string, got {topic_col.type}")
    _fail(InvalidMessageError, "topic", _nulls(topic_col), "topic is null")
    encoded_topics = pc.dictionary_encode(topic_col)
    topics: list[str] = encoded_topics.dictionary.to_pylist()
    topic_codes = np.asarray(encoded_topics.indices.to_numpy(zero_copy_only=False), np.int32)
    for i, t in enumerate(topics):
        reason = topic_problem(t)
        if reason:
            _fail(InvalidMessageError, "topic", topic_codes == i, f"topic {t!r} {reason}")
    return topics, topic_codes


def body_column(table: pa.Table, max_message_size: int) -> native.StringTriple:
    """The bodies (binary, or string as its UTF-8 bytes), none null or over
    ``max_message_size`` bytes, as :func:`rocketstore.pipeline.format.native.strings` hands them over."""
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
    _fail(InvalidMessageError, "body", _nulls(body_col), "body is null")
    bodies = native.strings(body_col)
    _fail(
        MessageTooLargeError,
        "body",
        np.diff(bodies[1]) > max_message_size,
        f"body larger than maxMessageSize={max_message_size} bytes",
    )
    return bodies


@dataclasses.dataclass
class Numbers:
    """The integer columns. Those a batch does not carry stay None: the encoder writes 0 (a
    missing bornTimestamp: the store time), so the common batch allocates no per-row array for
    them."""

    queue_ids: npt.NDArray[np.int32]  # 0 where absent
    flags: npt.NDArray[np.int32] | None
    sys_in: npt.NDArray[np.int32] | None  # sysFlag as given: transaction bits only
    reconsume: npt.NDArray[np.int32] | None
    prep_tx: npt.NDArray[np.int64] | None
    born_ts: npt.NDArray[np.int64] | None
    # Rows without a born timestamp are born when stored: the encoder stamps those this mask
    # marks (and every row when the column is absent).
    born_missing: npt.NDArray[np.bool_] | None


def number_columns(table: pa.Table, n: int) -> Numbers:
    """queueId (not negative), flag, sysFlag (transaction bits only), reconsumeTimes,
    preparedTransactionOffset and bornTimestamp."""
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
    born_missing = (
        _nulls(born_ts_col) if born_ts_col is not None and born_ts_col.null_count else None
    )
    return Numbers(queue_ids, flags, sys_in, reconsume, prep_tx, born_ts, born_missing)


@dataclasses.dataclass
class Hosts:
    """The host fields of a batch: the store host's, the distinct born hosts' and each row's
    index among them, and the SYSFLAGs with the IPv6 bits of both hosts set."""

    store_field: bytes
    born_hosts: list[bytes]
    born_codes: npt.NDArray[np.int32] | None  # None: every message's is born_hosts[0]
    sys_flags: npt.NDArray[np.int32]


def host_columns(
    table: pa.Table, store_host: str, n: int, sys_in: npt.NDArray[np.int32] | None
) -> Hosts:
    """bornHost (``ip:port``; the store host where null), and the SYSFLAG bits the hosts
    set on ``sys_in`` (the sysFlag column, or None)."""
    store_field, store_v6 = record.encode_host(store_host)
    born_col = _column(table, "bornHost")
    born_codes: npt.NDArray[np.int32] | None = None
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
    return Hosts(store_field, born_hosts, born_codes, sys_flags)


@dataclasses.dataclass
class Strings:
    """The string columns as the encoder takes them: KEYS (space-separated), TAGS, UNIQ_KEY
    (none null) and the user properties' ``name\\x01value\\x02...`` bytes (None when no row
    has any)."""

    keys: pa.StringArray
    tags: pa.StringArray
    uniq_keys: pa.StringArray
    user_part: pa.Array | None


def string_columns(table: pa.Table, n: int, generate: Callable[[int], pa.StringArray]) -> Strings:
    """keys, tags, uniqKey and properties; KEYS / TAGS / UNIQ_KEY given as properties are
    taken into their fields. ``generate(k)`` makes ``k`` message ids, for the rows whose
    uniqKey is null."""
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
        uniq_keys = generate(n)
    else:
        checked.append((uniq_keys, "uniqKey"))
        if uniq_keys.null_count:
            uniq_keys = _fill_uniq(uniq_keys, n, generate)
    for values, what in checked:
        _check_reserved_chars(values, what)
    user_part = None
    if user_props is not None and user_props.null_count < n:
        # Each pair ends with \x02 here; the record carries none after the last.
        pairs = _encode_user_props(user_props).view(pa.binary())
        user_part = pc.binary_slice(pairs, 0, -1) if len(pairs) else pairs
    return Strings(keys_str, tags, uniq_keys, user_part)


def _fill_uniq(
    uniq_keys: pa.StringArray, n: int, generate: Callable[[int], pa.StringArray]
) -> pa.StringArray:
    """``uniq_keys`` with a fresh id in each null row."""
    missing_uniq = _nulls(uniq_keys)
    fresh = generate(int(missing_uniq.sum()))
    filled = np.empty(n, dtype=object)
    filled[~missing_uniq] = uniq_keys.filter(pa.array(~missing_uniq)).to_pylist()
    filled[missing_uniq] = fresh.to_pylist()
    return pa.array(filled, pa.string())


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
            _fail_rows(col, _nulls(flat), n, "keys", "a key inside a list is null")
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
    _fail_rows(user, _nulls(values), n, "properties", "a property value is null")
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


def record_sizes(encoder: native.EncodeBatch, n: int, segment_size: int) -> npt.NDArray[np.int64]:
    """Each record's size, as the encoder measures it; refuses properties over
    :data:`rocketstore.pipeline.format.record.MAX_PROPERTIES_LENGTH` bytes encoded, and a record a
    CommitLog segment of ``segment_size`` bytes cannot hold."""
    sizes = np.empty(n, dtype=np.int64)
    too_long, first_too_long = encoder.measure(sizes, record.MAX_PROPERTIES_LENGTH)
    if too_long:
        raise InvalidMessageError(
            f"column 'properties': encoded properties longer than "
            f"{record.MAX_PROPERTIES_LENGTH} bytes ({too_long} row(s), first at row "
            f"{first_too_long})",
            first_too_long,
        )
    limit = segment_size - record.BLANK_SIZE
    _fail(
        MessageTooLargeError,
        "body",
        sizes > limit,
        f"record larger than a CommitLog segment can hold ({limit} bytes)",
    )
    return sizes
