"""The source's columns: the narrow default row, each ``include*`` option, the decoder's column
groups per schema, and, through Spark, every option's rows against the engine's own reads
(``MessageStore.get_messages``, the single-record reader of :mod:`rocketstore.pipeline.format.record`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from chispa import assert_df_equality

from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import ConfigError
from rocketstore.pipeline.format import bodyformat, record
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.format.native import Columns
from rocketstore.pipeline.format.record import MessageExt
from rocketstore.source import options, schema
from rocketstore.source.read import ReadContext
from tests.kit.sourcekit import SMALL

TS = pa.timestamp("us", tz="UTC")
# Written out by hand: these are the contract, not a copy of source/schema.py.
TYPES: dict[str, pa.DataType] = {
    "topic": pa.string(),
    "brokerName": pa.string(),
    "queueId": pa.int32(),
    "queueOffset": pa.int64(),
    "commitLogOffset": pa.int64(),
    "msgId": pa.string(),
    "keys": pa.list_(pa.field("element", pa.string())),
    "tags": pa.string(),
    "properties": pa.map_(pa.string(), pa.string()),
    "body": pa.binary(),
    "bornTimestamp": TS,
    "storeTimestamp": TS,
    "bornHost": pa.string(),
    "storeHost": pa.string(),
    "flag": pa.int32(),
    "sysFlag": pa.int32(),
    "reconsumeTimes": pa.int32(),
}
DEFAULT = [
    "topic",
    "brokerName",
    "queueId",
    "queueOffset",
    "commitLogOffset",
    "keys",
    "tags",
    "body",
    "bornTimestamp",
    "storeTimestamp",
]
FULL = [
    "topic",
    "brokerName",
    "queueId",
    "queueOffset",
    "commitLogOffset",
    "msgId",
    "keys",
    "tags",
    "properties",
    "body",
    "bornTimestamp",
    "storeTimestamp",
    "bornHost",
    "storeHost",
    "flag",
    "sysFlag",
    "reconsumeTimes",
]
# Each option alone: the row it gives.
ROWS: dict[str | None, list[str]] = {
    None: DEFAULT,
    "includeProperties": [*DEFAULT[:7], "properties", *DEFAULT[7:]],
    "includeHosts": [*DEFAULT, "bornHost", "storeHost"],
    "includeMsgId": [*DEFAULT[:5], "msgId", *DEFAULT[5:]],
    "includeFlags": [*DEFAULT, "flag", "sysFlag", "reconsumeTimes"],
    "includeAll": FULL,
}
BASE_GROUPS = Columns.TAGS | Columns.KEYS | Columns.BODY
GROUPS: dict[str | None, Columns] = {
    None: BASE_GROUPS,
    "includeProperties": BASE_GROUPS | Columns.PROPERTIES,
    "includeHosts": BASE_GROUPS | Columns.HOSTS,
    "includeMsgId": BASE_GROUPS | Columns.MSG_ID,
    "includeFlags": BASE_GROUPS,  # flags are fixed fields, decoded anyway
    "includeAll": BASE_GROUPS | Columns.PROPERTIES | Columns.HOSTS | Columns.MSG_ID,
}
HOSTS = ["127.0.0.1:5000", "[fe80::1]:10911", "10.1.2.3:65535"]


def _messages(first: int, n: int) -> list[Message]:
    """Messages that differ in every optional column: keys or none, tags or none, user
    properties, IPv4 and IPv6 born hosts, flags, sysFlag and reconsume counts."""
    return [
        Message(
            topic="orders",
            body=f"m{i}".encode() * (i % 4),
            queue_id=i % 2,
            keys=None if i % 5 == 0 else [f"k{i}", f"g{i % 3}"],
            tags=None if i % 7 == 0 else f"Tag{i % 3}",
            properties={"id": str(i), "note": "é" * (i % 3)} if i % 2 else None,
            flag=i * 1_000_003 - 2**30,
            sys_flag=record.TRANSACTION_COMMIT_TYPE if i % 6 == 0 else 0,
            born_timestamp=1_700_000_000_000 + i * 997,
            born_host=HOSTS[i % 3],
            reconsume_times=i % 4,
        )
        for i in range(first, first + n)
    ]


@pytest.fixture(scope="module")
def store_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("columns")
    StoreRoot(root).ensure_topic("orders", TopicMeta(2, 2))
    for b in range(2):
        with MessageStore(root / f"broker-{b}", SMALL) as store:
            store.put_batch(_messages(b * 100, 30))
    return root


def _parse(root: Path, **extra: str) -> options.ReadOptions:
    return options.parse({"path": str(root), "topic": "orders", **extra}, streaming=False)


def _on(option: str | None) -> dict[str, str]:
    return {} if option is None else {option: "true"}


# -- the schema -----------------------------------------------------------------------------------


def test_the_default_row_is_narrow(store_root: Path) -> None:
    parsed = _parse(store_root)
    got = schema.arrow_schema(None, parsed.optional_columns)
    assert got.names == DEFAULT
    assert [got.field(n).type for n in DEFAULT] == [TYPES[n] for n in DEFAULT]


@pytest.mark.parametrize("option", [k for k in ROWS if k is not None])
def test_each_option_adds_its_columns_in_place(store_root: Path, option: str) -> None:
    parsed = _parse(store_root, **_on(option))
    got = schema.arrow_schema(None, parsed.optional_columns)
    assert got.names == ROWS[option]
    assert [got.field(n).type for n in got.names] == [TYPES[n] for n in got.names]


def test_include_all_is_the_full_row_and_the_options_add_up(store_root: Path) -> None:
    every = {k: "true" for k in ROWS if k not in (None, "includeAll")}
    assert schema.arrow_schema(None, _parse(store_root, includeAll="true").optional_columns) == (
        pa.schema([pa.field(n, TYPES[n]) for n in FULL])
    )
    assert schema.arrow_schema(None, _parse(store_root, **every).optional_columns).names == FULL
    # false is the same as leaving the option out; option names are case-insensitive.
    assert _parse(store_root, includeHosts="FALSE").optional_columns == frozenset()
    assert _parse(store_root, includemsgid="true").optional_columns == {"msgId"}


def test_avro_bodies_replace_body_whatever_the_options(store_root: Path) -> None:
    body = bodyformat.BodySchema.from_arrow(pa.schema([("id", pa.int64())]), "orders")
    parsed = _parse(store_root, includeProperties="true")
    got = schema.arrow_schema(body, parsed.optional_columns)
    assert got.names == [n for n in ROWS["includeProperties"] if n != "body"] + ["id"]


@pytest.mark.parametrize("option", [k for k in ROWS if k is not None])
def test_a_bad_value_names_the_option(store_root: Path, option: str) -> None:
    with pytest.raises(ConfigError, match=rf"option {option}='yes': expected true or false"):
        _parse(store_root, **{option: "yes"})
    # Checked even when includeAll already turns every group on.
    if option != "includeAll":
        with pytest.raises(ConfigError, match=rf"option {option}='1'"):
            _parse(store_root, includeAll="true", **{option: "1"})


# -- what the decoder is asked for ----------------------------------------------------------------


@pytest.mark.parametrize("option", list(GROUPS))
def test_the_decoder_builds_only_the_groups_the_row_needs(store_root: Path, option: str) -> None:
    parsed = _parse(store_root, **_on(option))
    ctx = ReadContext(schema.arrow_schema(None, parsed.optional_columns), str(store_root))
    assert ctx.columns == GROUPS[option]


def test_groups_for_avro_bodies_subscriptions_and_given_schemas(store_root: Path) -> None:
    body = bodyformat.BodySchema.from_arrow(pa.schema([("id", pa.int64())]), "orders")
    avro = ReadContext(
        schema.arrow_schema(body), str(store_root), body_format="avro", body_schema=body
    )
    # Properties name each body's schema: decoded, though not a column.
    assert "properties" not in avro.schema.names
    assert avro.columns == Columns.TAGS | Columns.KEYS | Columns.BODY | Columns.PROPERTIES
    narrow = pa.schema([("queueOffset", pa.int64()), ("msgId", pa.string())])
    assert ReadContext(narrow, str(store_root)).columns == Columns.MSG_ID
    # A tag filter needs the tags even when the row has none.
    filtered = ReadContext(narrow, str(store_root), sub_expression="Tag1")
    assert filtered.columns == Columns.MSG_ID | Columns.TAGS


# -- the hand-over to Spark -----------------------------------------------------------------------


@pytest.mark.parametrize("option", [None, "includeAll"])
def test_read_hands_spark_record_batches_of_the_declared_schema(
    store_root: Path, option: str | None
) -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    from rocketstore.source.format import RocketStoreBatchReader, spark_schema

    opts = {"path": str(store_root), "topic": "orders", **_on(option)}
    declared = spark_schema(opts)
    reader = RocketStoreBatchReader(opts, declared)
    batches = [b for p in reader.partitions() for b in reader.read(p)]
    # Record batches, not rows or pandas frames: Spark takes them as Arrow as they are, once
    # their schema is exactly the declared one (pyspark's own check).
    assert batches and all(type(b) is pa.RecordBatch for b in batches)
    want = to_arrow_schema(declared, timezone="UTC")
    assert all(b.schema.equals(want) for b in batches)
    assert sum(b.num_rows for b in batches) == 60


# -- through Spark, against the engine ------------------------------------------------------------


def _ms_to_ts(values: list[int]) -> pa.Array:
    return pa.array(values, pa.timestamp("ms", tz="UTC")).cast(TS)


def _engine_table(root: Path) -> pa.Table:
    """Every message of topic orders as the engine reads it, in the source's full row."""
    rows: list[tuple[str, MessageExt]] = []
    for b in range(2):
        broker = f"broker-{b}"
        with MessageStore(root / broker, SMALL, read_only=True) as store:
            for info in store.queue_infos("orders"):
                offset = info.min_offset
                while offset < info.max_offset:
                    got = store.get_messages("orders", info.queue_id, offset, 1000)
                    rows.extend((broker, m) for m in got.messages)
                    offset = got.next_begin_offset
    ms = [m for _, m in rows]
    values: dict[str, Any] = {
        "topic": [m.topic for m in ms],
        "brokerName": [b for b, _ in rows],
        "queueId": [m.queue_id for m in ms],
        "queueOffset": [m.queue_offset for m in ms],
        "commitLogOffset": [m.commit_log_offset for m in ms],
        "msgId": [m.msg_id for m in ms],
        "keys": [m.keys if record.PROPERTY_KEYS in m.properties else None for m in ms],
        "tags": [m.tags for m in ms],
        "properties": [list(m.properties.items()) for m in ms],
        "body": [m.body for m in ms],
        "bornTimestamp": _ms_to_ts([m.born_timestamp for m in ms]),
        "storeTimestamp": _ms_to_ts([m.store_timestamp for m in ms]),
        "bornHost": [m.born_host for m in ms],
        "storeHost": [m.store_host for m in ms],
        "flag": [m.flag for m in ms],
        "sysFlag": [m.sys_flag for m in ms],
        "reconsumeTimes": [m.reconsume_times for m in ms],
    }
    return pa.table({n: pa.array(values[n], TYPES[n]) for n in FULL})


@pytest.fixture(scope="module")
def engine_table(store_root: Path) -> pa.Table:
    table = _engine_table(store_root)
    assert table.num_rows == 60
    # The store really has what each option is about.
    assert set(table.column("sysFlag").to_pylist()) > {0}
    assert any(h.startswith("[") for h in table.column("bornHost").to_pylist())
    return table


ORDER = ("brokerName", "queueId", "queueOffset")


@pytest.mark.slow
@pytest.mark.parametrize("option", list(ROWS))
def test_spark_rows_equal_the_engines(
    spark: Any, store_root: Path, engine_table: pa.Table, option: str | None
) -> None:
    got = (
        spark.read.format("rocketstore")
        .option("path", str(store_root))
        .option("topic", "orders")
        .options(**_on(option))
        .load()
    )
    want = spark.createDataFrame(engine_table.select(ROWS[option]))
    # Spark cannot order maps, which chispa's ignore_row_order would do: order by the queue.
    assert_df_equality(got.orderBy(*ORDER), want.orderBy(*ORDER), ignore_nullable=True)


@pytest.mark.slow
def test_a_stream_takes_the_options_too(
    spark: Any, store_root: Path, engine_table: pa.Table, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    query = (
        spark.readStream.format("rocketstore")
        .option("path", str(store_root))
        .option("topic", "orders")
        .option("startingOffsets", "earliest")
        .option("includeHosts", "true")
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    got = spark.read.parquet(str(out))
    want = spark.createDataFrame(engine_table.select(ROWS["includeHosts"]))
    assert_df_equality(got.orderBy(*ORDER), want.orderBy(*ORDER), ignore_nullable=True)


@pytest.mark.slow
def test_a_given_schema_picks_any_column(
    spark: Any, store_root: Path, engine_table: pa.Table
) -> None:
    # Optional columns without their options, in an order of its own.
    picked = ["msgId", "queueOffset", "sysFlag", "brokerName", "properties", "queueId"]
    reader = spark.read.format("rocketstore").option("path", str(store_root))
    got = reader.option("topic", "orders").schema(
        "msgId string, queueOffset bigint, sysFlag int, brokerName string, "
        "properties map<string,string>, queueId int"
    )
    want = spark.createDataFrame(engine_table.select(picked))
    assert_df_equality(got.load().orderBy(*ORDER), want.orderBy(*ORDER), ignore_nullable=True)
    with pytest.raises(Exception, match="names columns it does not produce: nope"):
        reader.option("topic", "orders").schema("queueId int, nope string").load().collect()
