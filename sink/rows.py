"""Input rows → message columns and message queues (vectorised; runs on executors).

The sink accepts the columns Kafka's and RocketMQ's sinks take:

========== =========================== ==================================================
column     Spark type                  meaning
========== =========================== ==================================================
body       binary or string            the body (required for bodyFormat=binary)
topic      string                      the topic (the ``topic`` option wins)
keys       string or array<string>     KEYS (a string is space-separated)
tags       string                      TAGS
properties map<string,string>          user properties
flag       int (any integral type)     application flag
queueId    int                         message queue of the topic, 0 .. brokers*queues-1
========== =========================== ==================================================

With ``bodyFormat`` avro or json every other column goes into the body (see
:mod:`rocketstore.pipeline.format.bodyformat`) and ``body`` must not be given. With bodyFormat binary, other
columns are an error (they would be silently dropped otherwise).

:func:`route` turns an Arrow batch into :data:`ROUTED` rows: the message columns plus the row's
message queue (``__rs_mq``) and a stable row number (``__rs_row``) that fixes the order in which
a broker appends its rows, so that a replayed micro-batch appends them in the same order.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rocketstore.pipeline.engine.root import select_queues
from rocketstore.pipeline.errors import ConfigError, InvalidMessageError
from rocketstore.pipeline.format import bodyformat

ROUTED = pa.schema(
    [
        ("topic", pa.string()),
        ("body", pa.binary()),
        ("keys", pa.list_(pa.string())),
        ("tags", pa.string()),
        ("properties", pa.map_(pa.string(), pa.string())),
        ("flag", pa.int32()),
        ("__rs_row", pa.int64()),
        ("__rs_mq", pa.int32()),
    ]
)
_INTEGRAL = (pa.int8(), pa.int16(), pa.int32(), pa.int64())


@dataclasses.dataclass(frozen=True)
class Layout:
    """How rows map to queues: the same for every row of a micro-batch."""

    topic: str | None
    total_queues: int
    sharding_key: str | None
    body_format: str
    body_schema: bodyformat.BodySchema | None


def check_schema(
    schema: pa.Schema, topic_option: str | None, body_format: str, sharding_key: str | None
) -> bodyformat.BodySchema | None:
    """Refuse an input schema the sink cannot store, naming the column; returns the body schema
    for avro/json. Called on the driver before any task runs, and again by tasks."""
    types = {f.name: f.type for f in schema}

    def need(name: str, ok: bool, expected: str) -> None:
        if name in types and not ok:
            raise InvalidMessageError(f"column {name}: expected {expected}, got {types[name]}")

    need("topic", _is_string(types.get("topic")), "string")
    need("body", _is_string(types.get("body")) or _is_binary(types.get("body")), "binary or string")
    keys_t = types.get("keys")
    need(
        "keys",
        _is_string(keys_t)
        or (keys_t is not None and pa.types.is_list(keys_t) and _is_string(keys_t.value_type)),
        "string or array<string>",
    )
    need("tags", _is_string(types.get("tags")), "string")
    props_t = types.get("properties")
    need(
        "properties",
        props_t is not None
        and pa.types.is_map(props_t)
        and _is_string(props_t.key_type)
        and _is_string(props_t.item_type),
        "map<string,string>",
    )
    need("flag", types.get("flag") in _INTEGRAL, "an integer type")
    need("queueId", types.get("queueId") in _INTEGRAL, "an integer type")
    if topic_option is None and "topic" not in types:
        raise InvalidMessageError("column topic: missing; give a topic column or the topic option")
    if sharding_key is not None and sharding_key not in types:
        raise ConfigError(
            f"option shardingKey={sharding_key!r}: no such column; columns: {', '.join(types)}"
        )
    if body_format == "binary":
        if "body" not in types:
            raise InvalidMessageError(
                "column body: missing (required with bodyFormat=binary; choose bodyFormat avro "
                "or json to store the other columns as the body)"
            )
        extra = [n for n in types if n not in bodyformat.MESSAGE_COLUMNS and n != sharding_key]
        if extra:
            raise InvalidMessageError(
                f"column(s) {', '.join(extra)}: not message fields; with bodyFormat=binary the "
                f"sink takes {', '.join(sorted(bodyformat.MESSAGE_COLUMNS))} (choose bodyFormat "
                "avro or json to keep them in the body, or drop them)"
            )
        return None
    if "body" in types:
        raise InvalidMessageError(
            f"column body: bodyFormat={body_format} builds the body from the other columns; "
            "drop or rename the body column"
        )
    return bodyformat.BodySchema.from_arrow(schema, topic_option or "topic")


def _is_string(t: pa.DataType | None) -> bool:
    return t is not None and (pa.types.is_string(t) or pa.types.is_large_string(t))


def _is_binary(t: pa.DataType | None) -> bool:
    return t is not None and (pa.types.is_binary(t) or pa.types.is_large_binary(t))


def route(batch: pa.RecordBatch, layout: Layout, row_base: int) -> pa.RecordBatch:
    """The routed form of one input batch; ``row_base`` numbers its first row."""
    n = batch.num_rows
    rows = np.arange(row_base, row_base + n, dtype=np.int64)
    return shape(batch, layout, rows, None)


def shape(
    batch: pa.RecordBatch,
    layout: Layout,
    rows: np.ndarray,
    mq: np.ndarray | None,
) -> pa.RecordBatch:
    """Message columns of an input batch, with its row numbers and message queues (computed
    here with :func:`~rocketstore.pipeline.engine.root.select_queues` when ``mq`` is None; otherwise given, as
    :func:`queue_expression` computed them in Spark, and only range-checked)."""
    n = batch.num_rows
    cols = {name: batch.column(name) for name in batch.schema.names}
    if layout.topic is not None:
        topic = repeated(layout.topic, n)
    else:
        topic = cols["topic"].cast(pa.string())
    if layout.body_schema is not None:
        body = bodyformat.encode_bodies(
            pa.Table.from_batches([batch]), layout.body_schema, layout.body_format
        )
    else:
        body = cols["body"].cast(pa.binary())
    keys = _keys(cols.get("keys"), n)
    tags = cols["tags"].cast(pa.string()) if "tags" in cols else pa.nulls(n, pa.string())
    props = _properties(cols.get("properties"), n, layout.body_schema)
    flag = _ints(cols.get("flag"), n, "flag")
    if mq is None:
        mq = _queues(cols, keys, layout, rows)
    else:
        _check_queue_ids(mq, layout.total_queues)
    return pa.RecordBatch.from_arrays(
        [
            topic,
            body,
            keys,
            tags,
            props,
            pa.array(flag, pa.int32()),
            pa.array(rows, pa.int64()),
            pa.array(mq.astype(np.int32)),
        ],
        schema=ROUTED,
    )


def repeated(text: str, n: int) -> pa.Array:
    """``text`` ``n`` times as a string array, built from its buffers: going through a numpy
    object array costs about 3 us a row, what the rest of a row's routing costs."""
    raw = text.encode("utf-8")
    if n * len(raw) >= 1 << 31:
        return pa.array([text] * n, pa.large_string()).cast(pa.string())
    offsets = (np.arange(n + 1, dtype=np.int64) * len(raw)).astype(np.int32)
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)]
    )


def queue_expression(schema: pa.Schema, layout: Layout, row: str) -> str:
    """A Spark SQL expression for each row's message queue, equal to what :func:`shape`
    computes with numpy: ``abs(hashCode % n)`` where hashCode is Java's ``String.hashCode``
    (``java.util.Objects.hashCode`` of the string, called in the JVM), round-robin over
    ``row`` for rows without a key, and a non-null ``queueId`` column as given."""
    names = set(schema.names)
    total = layout.total_queues
    if layout.sharding_key is not None:
        key = f"cast(`{layout.sharding_key}` as string)"
    elif "keys" not in names:
        key = "cast(null as string)"
    elif _is_string(schema.field("keys").type):
        # KEYS split at spaces, empty tokens dropped, joined by one space: the same as trimming
        # spaces and collapsing their runs. Not split/filter/array_join: a lambda runs row by
        # row outside generated code, and with the regular expression on every row cost more
        # than the shuffle (5M rows: 3.2 s, against 1.7 s so).
        key = (
            "CASE WHEN contains(`keys`, '  ') THEN regexp_replace(trim(`keys`), ' {2,}', ' ') "
            "ELSE trim(`keys`) END"
        )
    else:
        key = "array_join(`keys`, ' ')"
    hashed = f"abs(cast(java_method('java.util.Objects', 'hashCode', {key}) as int) % {total})"
    chosen = f"CASE WHEN {key} IS NULL OR {key} = '' THEN pmod({row}, {total}) ELSE {hashed} END"
    if "queueId" in names:
        return f"cast(coalesce(cast(`queueId` as bigint), {chosen}) as int)"
    return f"cast({chosen} as int)"


def _keys(col: pa.Array | None, n: int) -> pa.Array:
    if col is None:
        return pa.nulls(n, pa.list_(pa.string()))
    if _is_string(col.type):
        split = pc.split_pattern(col.cast(pa.string()), " ")
        # "a  b" splits into an empty token; KEYS never holds empty keys.
        flat = split.flatten()
        keep = pc.not_equal(flat, pa.scalar("", pa.string()))
        lengths = pc.list_value_length(split).to_numpy(zero_copy_only=False)
        owner = np.repeat(np.arange(len(split)), np.nan_to_num(lengths, nan=0).astype(np.int64))
        kept = keep.to_numpy(zero_copy_only=False)
        counts = np.bincount(owner[kept], minlength=n)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        lists = pa.ListArray.from_arrays(pa.array(offsets), flat.filter(keep), mask=col.is_null())
        return lists.cast(pa.list_(pa.string()))
    return col.cast(pa.list_(pa.string()))


def _properties(col: pa.Array | None, n: int, schema: bodyformat.BodySchema | None) -> pa.Array:
    map_type = pa.map_(pa.string(), pa.string())
    if schema is None:
        return col.cast(map_type) if col is not None else pa.nulls(n, map_type)
    # Each body names its schema; user properties (if any) come first, in their order.
    existing = col.cast(map_type) if col is not None else None
    keys_list: list[list[str]] = []
    items_list: list[list[str]] = []
    rows = existing.to_pylist() if existing is not None else [None] * n
    for row in rows:
        ks = [k for k, _ in row] if row else []
        vs = [v for _, v in row] if row else []
        keys_list.append([*ks, bodyformat.SCHEMA_PROPERTY])
        items_list.append([*vs, schema.fingerprint])
    return pa.array(
        [list(zip(k, v, strict=True)) for k, v in zip(keys_list, items_list, strict=True)], map_type
    )


def _ints(col: pa.Array | None, n: int, name: str) -> np.ndarray:
    if col is None:
        return np.zeros(n, dtype=np.int64)
    # A null flag is 0, as an unset flag is in RocketMQ; a null queueId is masked by the caller.
    values = np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    bad = (values < -(2**31)) | (values >= 2**31)
    if bad.any():
        raise InvalidMessageError(
            f"column {name}: {int(bad.sum())} row(s) outside the int range, first "
            f"{int(values[bad][0])}"
        )
    return values


def _queues(
    cols: dict[str, pa.Array], keys: pa.Array, layout: Layout, rows: np.ndarray
) -> np.ndarray:
    total = layout.total_queues
    if layout.sharding_key is not None:
        shard = cols[layout.sharding_key].cast(pa.string())
    else:
        shard = pc.binary_join(keys, " ")
    mq = select_queues(shard, rows, total)
    if "queueId" in cols:
        given = cols["queueId"]
        chosen = given.is_valid().to_numpy(zero_copy_only=False)
        if chosen.any():
            q = _ints(given, len(rows), "queueId")
            _check_queue_ids(np.where(chosen, q, 0), total)
            mq = np.where(chosen, q, mq)
    return mq


def _check_queue_ids(mq: np.ndarray, total: int) -> None:
    bad = (mq < 0) | (mq >= total)
    if bad.any():
        raise InvalidMessageError(
            f"column queueId: {int(bad.sum())} row(s) outside 0..{total - 1} (the topic's "
            f"{total} message queues), first {int(mq[bad][0])}"
        )
