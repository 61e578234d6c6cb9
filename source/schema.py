"""The columns the source produces, and the body schema it decodes with.

Message columns, in this order (names as RocketMQ's ``MessageExt`` getters and its Spark
connector's columns). The default row is narrow, as Kafka's source's is: Spark cannot prune a
Python data source's columns, so each column costs every query whether it is used or not. The
columns marked with an option are there only when that option (or ``includeAll``) is true:

================= ==================== ================== ==========================================
column            Spark type           option             meaning
================= ==================== ================== ==========================================
topic             string
brokerName        string                                  the broker directory (``broker-0``), or
                                                          the store directory's name for a single
                                                          RocketMQ store
queueId           int
queueOffset       bigint                                  the message's ConsumeQueue index
commitLogOffset   bigint                                  the record's physical offset
msgId             string               includeMsgId       offset msgId (store host + physical
                                                          offset, hex)
keys              array<string>                           the KEYS property split at spaces; null
                                                          without KEYS
tags              string                                  the TAGS property; null without
properties        map<string,string>   includeProperties  every property as stored (KEYS, TAGS,
                                                          UNIQ_KEY, the user's own), in stored order
body              binary                                  (only with bodyFormat binary)
bornTimestamp     timestamp                               as the producer stamped it (ms precision)
storeTimestamp    timestamp                               when the store appended it (ms precision)
bornHost          string               includeHosts       ``ip:port``, IPv6 as ``[addr]:port``
storeHost         string               includeHosts
flag              int                  includeFlags       the producer's flag
sysFlag           int                  includeFlags       compression, transaction type, ...
reconsumeTimes    int                  includeFlags
================= ==================== ================== ==========================================

With ``bodyFormat`` avro or json, ``body`` is replaced by the columns of the topic's newest
registered body schema, appended after the message columns.

Runs on the driver (reads ``topics.json`` and ``schemas/``); no Spark imports.
"""

from __future__ import annotations

import pyarrow as pa

from rocketstore.pipeline.errors import ConfigError
from rocketstore.pipeline.format.bodyformat import BodySchema
from rocketstore.source.options import OPTIONAL_COLUMNS, ReadOptions

_TS = pa.timestamp("us", tz="UTC")
MESSAGE_FIELDS: tuple[pa.Field, ...] = (
    pa.field("topic", pa.string()),
    pa.field("brokerName", pa.string()),
    pa.field("queueId", pa.int32()),
    pa.field("queueOffset", pa.int64()),
    pa.field("commitLogOffset", pa.int64()),
    pa.field("msgId", pa.string()),
    pa.field("keys", pa.list_(pa.field("element", pa.string()))),
    pa.field("tags", pa.string()),
    pa.field("properties", pa.map_(pa.string(), pa.string())),
    pa.field("body", pa.binary()),
    pa.field("bornTimestamp", _TS),
    pa.field("storeTimestamp", _TS),
    pa.field("bornHost", pa.string()),
    pa.field("storeHost", pa.string()),
    pa.field("flag", pa.int32()),
    pa.field("sysFlag", pa.int32()),
    pa.field("reconsumeTimes", pa.int32()),
)
MESSAGE_COLUMNS = tuple(f.name for f in MESSAGE_FIELDS)


def body_format_and_schema(options: ReadOptions) -> tuple[str, BodySchema | None]:
    """The body format the query decodes with and, for avro/json, the reader schema.

    Without option bodyFormat, each topic's recorded format is used; topics read together must
    agree on the format and, for avro/json, on the schema's columns.
    """
    root = options.topic_catalog()
    metas = {t: root.topic(t) for t in options.topics}
    formats = {t: (m.body_format if m is not None else "binary") for t, m in metas.items()}
    fmt = options.body_format
    if fmt is None:
        found = set(formats.values())
        if len(found) > 1:
            raise ConfigError(
                "option bodyFormat: the topics hold different body formats ("
                + ", ".join(f"{t}: {f}" for t, f in sorted(formats.items()))
                + "); read them in separate queries or set bodyFormat=binary"
            )
        fmt = found.pop()
    if fmt == "binary":
        return fmt, None
    schema: BodySchema | None = None
    for topic, meta in sorted(metas.items()):
        if formats[topic] != fmt or meta is None:
            raise ConfigError(
                f"option bodyFormat={fmt}: topic {topic!r} holds bodyFormat={formats[topic]} "
                "messages (as recorded in topics.json); expected binary for it"
            )
        if not meta.schemas:
            raise ConfigError(
                f"option bodyFormat={fmt}: topic {topic!r} has no registered body schema"
            )
        mine = BodySchema.from_document(root.load_schema(meta.schemas[-1]))
        if schema is not None and not schema.arrow_schema.equals(mine.arrow_schema):
            raise ConfigError(
                f"option bodyFormat={fmt}: topics {', '.join(options.topics)} have different "
                "body schemas; read them in separate queries"
            )
        schema = mine
    assert schema is not None
    clash = sorted(set(schema.arrow_schema.names) & set(MESSAGE_COLUMNS))
    if clash:
        raise ConfigError(
            f"option bodyFormat={fmt}: body columns {', '.join(clash)} clash with message "
            "columns; read with bodyFormat=binary"
        )
    return fmt, schema


def arrow_schema(body: BodySchema | None, optional: frozenset[str] = frozenset()) -> pa.Schema:
    """The default message columns plus the ``optional`` ones, in :data:`MESSAGE_FIELDS`'s
    order, with the body's decoded columns instead of ``body`` when given."""
    fields = [
        f
        for f in MESSAGE_FIELDS
        if (f.name not in OPTIONAL_COLUMNS or f.name in optional)
        and not (body is not None and f.name == "body")
    ]
    return pa.schema(fields if body is None else [*fields, *body.arrow_schema])


def full_arrow_schema(body: BodySchema | None) -> pa.Schema:
    """Every column the source can produce (``includeAll``): what a schema given with
    ``.schema(...)`` may pick from."""
    return arrow_schema(body, OPTIONAL_COLUMNS)
