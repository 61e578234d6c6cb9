"""The ``rocketstore`` source through Spark: streams from every kind of starting point, rate
limits, tag filters, key reads, avro/json bodies, retention with failOnDataLoss, the RocketMQ
4.9.4 fixtures, and bad options failing at query start.

Streaming queries run with ``trigger(availableNow=True)`` and collect each micro-batch on the
driver (``foreachBatch``), so a test sees exactly what each batch read.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from chispa import assert_df_equality

from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format import bodyformat
from tests.kit.fixtures import fixture_dir
from tests.kit.sourcekit import (
    SMALL,
    body_of,
    expected_msg_lines,
    ids_of,
    make_root,
    message_table,
    msg_line,
    stream,
    write,
)

pytestmark = pytest.mark.slow
HOUR_MS = 3_600_000


def batch_read(spark: Any, opts: Mapping[str, str]) -> Any:
    reader = spark.read.format("rocketstore")
    for k, v in opts.items():
        reader = reader.option(k, v)
    return reader.load()


def flat(batches: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [r for b in batches for r in b]


# -- starting points and rate limits --------------------------------------------------------------


def test_stream_from_earliest_in_bounded_batches(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    ids = make_root(root, "orders", brokers=2, queues=2, count=50)
    opts = {
        "path": str(root),
        "topic": "orders",
        "startingOffsets": "earliest",
        "maxMessagesPerTrigger": "12",
        "includeProperties": "true",
    }
    batches, progress = stream(spark, opts, tmp_path / "ck")
    assert [p["numInputRows"] for p in progress if p["numInputRows"]] == [12, 12, 12, 12, 2]
    assert [len(b) for b in batches] == [12, 12, 12, 12, 2]
    rows = flat(batches)
    assert ids_of(rows) == ids
    assert all(r["body"] == body_of(int(r["properties"]["id"])) for r in rows)
    assert {(r["brokerName"], r["queueId"], r["queueOffset"]) for r in rows} == {
        (f"broker-{(i // 2) % 2}", i % 2, n) for i in ids for n in [i // 4]
    }
    # Each batch takes from every queue in proportion to its backlog (here: equal backlogs).
    first = batches[0]
    assert sorted(
        sum(1 for r in first if (r["brokerName"], r["queueId"]) == q)
        for q in {(r["brokerName"], r["queueId"]) for r in rows}
    ) == [3, 3, 3, 3]
    end = progress[-1]["sources"][0]["endOffset"]
    assert '"broker-0":{"0":13,"1":13}' in end.replace(" ", "")


def test_stream_from_latest_reads_only_what_comes_later(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_root(root, "orders", brokers=2, queues=2, count=20)
    opts = {
        "path": str(root),
        "topic": "orders",
        "startingOffsets": "latest",
        "includeProperties": "true",
    }
    batches, _ = stream(spark, opts, tmp_path / "ck")
    assert flat(batches) == []
    # New messages on the known brokers, and a broker that did not exist when the query started:
    # its queues start at their earliest offset.
    write(root, 0, message_table("orders", [100, 101, 102], 2))
    write(root, 2, message_table("orders", [103, 104], 2))
    batches, _ = stream(spark, opts, tmp_path / "ck")
    rows = flat(batches)
    assert ids_of(rows) == [100, 101, 102, 103, 104]
    assert {r["brokerName"] for r in rows if int(r["properties"]["id"]) >= 103} == {"broker-2"}
    batches, _ = stream(spark, opts, tmp_path / "ck")
    assert flat(batches) == []


def test_stream_from_a_timestamp(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    StoreRoot(root).ensure_topic("orders", TopicMeta(2, 2))
    for b in (0, 1):
        write(
            root,
            b,
            message_table("orders", list(range(b * 100, b * 100 + 10)), 2),
            clock_ms=1_000_000,
        )
        write(
            root,
            b,
            message_table("orders", list(range(b * 100 + 10, b * 100 + 16)), 2),
            clock_ms=2_000_000,
        )
    batches, _ = stream(
        spark,
        {
            "path": str(root),
            "topic": "orders",
            "startingTimestamp": "1500000",
            "includeProperties": "true",
        },
        tmp_path / "ck",
    )
    rows = flat(batches)
    assert ids_of(rows) == list(range(10, 16)) + list(range(110, 116))
    assert all(r["storeTimestamp"].timestamp() == 2000 for r in rows)

    by_queue = '{"orders": {"broker-0": {"0": 1500000, "1": -1}, "broker-1": {"1": 2000001}}}'
    batches, _ = stream(
        spark,
        {
            "path": str(root),
            "topic": "orders",
            "startingOffsetsByTimestamp": by_queue,
            "includeProperties": "true",
        },
        tmp_path / "ck2",
    )
    # broker-0/0 from the second put; broker-0/1 latest (nothing); broker-1/1 after the last
    # message (nothing); broker-1/0 not named: earliest.
    assert ids_of(flat(batches)) == [10, 12, 14, 100, 102, 104, 106, 108, 110, 112, 114]


def test_stream_from_explicit_offsets(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_root(root, "orders", brokers=2, queues=2, count=40)
    start = '{"orders": {"broker-0": {"0": 7, "1": -1}, "broker-1": {"0": -2, "1": 9}}}'
    batches, progress = stream(
        spark, {"path": str(root), "topic": "orders", "startingOffsets": start}, tmp_path / "ck"
    )
    got = sorted((r["brokerName"], r["queueId"], r["queueOffset"]) for r in flat(batches))
    want = sorted(
        [("broker-0", 0, n) for n in range(7, 10)]
        + [("broker-1", 0, n) for n in range(10)]
        + [("broker-1", 1, 9)]
    )
    assert got == want
    end = progress[-1]["sources"][0]["endOffset"].replace(" ", "")
    assert end == '{"orders":{"broker-0":{"0":10,"1":10},"broker-1":{"0":10,"1":10}}}'


# -- filters, keys, bodies ------------------------------------------------------------------------


def test_tag_filter_and_key_reads(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    ids = make_root(root, "orders", brokers=2, queues=2, count=30)
    base = {"path": str(root), "topic": "orders", "includeProperties": "true"}
    df = batch_read(spark, {**base, "subExpression": "TagA || TagC"})
    want = spark.createDataFrame(
        [(f"m{i}:", ["TagA", "TagB", "TagC"][i % 3]) for i in ids if i % 3 != 1],
        "prefix string, tags string",
    )
    got = df.selectExpr("substring_index(cast(body as string), ':', 1) || ':' as prefix", "tags")
    assert_df_equality(got, want, ignore_row_order=True, ignore_nullable=True)

    keyed = batch_read(spark, {**base, "key": "g3"}).collect()
    assert sorted(int(r["properties"]["id"]) for r in keyed) == [i for i in ids if i % 5 == 3]
    assert all("g3" in r["keys"] for r in keyed)
    streamed, _ = stream(
        spark, {**base, "subExpression": "TagB", "startingOffsets": "earliest"}, tmp_path / "ck"
    )
    assert ids_of(flat(streamed)) == [i for i in ids if i % 3 == 1]


def _body_topic(root: Path, topic: str, fmt: str, versions: list[pa.Table]) -> None:
    """Messages whose bodies hold rows, as the sink writes them: one put per schema version."""
    meta = StoreRoot(root)
    for table in versions:
        body_schema = bodyformat.BodySchema.from_arrow(table.schema, topic)
        meta.register_schema(body_schema.fingerprint, body_schema.document())
        meta.ensure_topic(topic, TopicMeta(1, 1, fmt, (body_schema.fingerprint,)))
        bodies = bodyformat.encode_bodies(table, body_schema, fmt)
        n = len(table)
        write(
            root,
            0,
            pa.table(
                {
                    "topic": pa.array([topic] * n),
                    "body": bodies,
                    "tags": pa.array(["v"] * n),
                    "properties": pa.array(
                        [[(bodyformat.SCHEMA_PROPERTY, body_schema.fingerprint)]] * n,
                        pa.map_(pa.string(), pa.string()),
                    ),
                }
            ),
        )


def test_avro_and_json_bodies_decode_into_columns(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    people = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["ann", "bo", None]})
    _body_topic(root, "people", "avro", [people])
    v1 = pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["ann", "bo"]})
    v2 = pa.table(
        {"id": pa.array([3], pa.int64()), "name": ["cy"], "score": pa.array([1.5], pa.float64())}
    )
    _body_topic(root, "events", "json", [v1, v2])

    avro = batch_read(spark, {"path": str(root), "topic": "people"})
    assert "body" not in avro.columns and avro.columns[-2:] == ["id", "name"]
    assert sorted(tuple(r) for r in avro.select("id", "name").collect()) == [
        (1, "ann"),
        (2, "bo"),
        (3, None),
    ]
    # A topic's newest schema reads every version: older rows get null for new columns.
    events = batch_read(spark, {"path": str(root), "topic": "events"}).select("id", "name", "score")
    want = spark.createDataFrame([(1, "ann", None), (2, "bo", None), (3, "cy", 1.5)], events.schema)
    assert_df_equality(events, want, ignore_row_order=True)
    # bodyFormat=binary shows the raw bodies of either.
    raw = batch_read(spark, {"path": str(root), "topic": "events", "bodyFormat": "binary"})
    assert sorted(r["body"][:7] for r in raw.collect())[0] == b'{"id":1'
    streamed, _ = stream(
        spark,
        {"path": str(root), "topic": "people", "startingOffsets": "earliest"},
        tmp_path / "ck",
    )
    assert sorted(r["id"] for r in flat(streamed)) == [1, 2, 3]


# -- retention ------------------------------------------------------------------------------------


def test_retention_with_fail_on_data_loss(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    StoreRoot(root).ensure_topic("orders", TopicMeta(1, 2))
    write(root, 0, message_table("orders", list(range(10)), 2))
    opts = {
        "path": str(root),
        "topic": "orders",
        "startingOffsets": "earliest",
        "includeProperties": "true",
    }
    batches, _ = stream(spark, opts, tmp_path / "ck")
    assert ids_of(flat(batches)) == list(range(10))
    # Many more messages, then retention deletes the oldest CommitLog segments, with messages
    # the query has not read in them.
    with MessageStore(root / "broker-0", SMALL) as store:
        for k in range(1, 12):
            store.put_batch(message_table("orders", list(range(k * 100, k * 100 + 100)), 2))
        assert store.retention is not None
        store.retention.run(
            int(time.time() * 1000) + 100 * HOUR_MS, force_expired=True, max_files=2
        )
        mins = {q.queue_id: q.min_offset for q in store.queue_infos("orders")}
        maxes = {q.queue_id: q.max_offset for q in store.queue_infos("orders")}
    assert all(m > 5 for m in mins.values())

    with pytest.raises(Exception) as err:
        stream(spark, opts, tmp_path / "ck")
    text = str(err.value)
    assert "DataLossError" in text and "failOnDataLoss=false" in text
    for qid, m in mins.items():
        assert f"orders/broker-0/{qid}: offsets [5, {m}), {m - 5} messages" in text

    batches, _ = stream(spark, {**opts, "failOnDataLoss": "false"}, tmp_path / "ck")
    got = sorted((r["queueId"], r["queueOffset"]) for r in flat(batches))
    assert got == sorted((q, n) for q in mins for n in range(mins[q], maxes[q]))


# -- the RocketMQ 4.9.4 fixtures ------------------------------------------------------------------


@pytest.mark.fixtures
@pytest.mark.parametrize("name", ["basic", "transactions", "crashed"])
def test_fixture_as_batch_and_as_stream(spark: Any, tmp_path: Path, name: str) -> None:
    fixture = fixture_dir(name)
    opts = {"path": str(fixture / "store"), "topic": "TopicA,TopicB", "includeAll": "true"}
    expected = expected_msg_lines(fixture)
    rows = [r.asDict(recursive=True) for r in batch_read(spark, opts).collect()]
    assert sorted(msg_line(r) for r in rows) == expected
    batches, _ = stream(
        spark,
        {**opts, "startingOffsets": "earliest", "maxMessagesPerTrigger": "2000"},
        tmp_path / "ck",
    )
    assert all(0 < len(b) <= 2000 for b in batches)
    assert sorted(msg_line(r) for r in flat(batches)) == expected


# -- errors ---------------------------------------------------------------------------------------


def test_bad_options_fail_when_the_query_starts(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_root(root, "orders", brokers=1, queues=1, count=3)
    cases = [
        ({"topic": "nope"}, "option topic: 'nope' not found"),
        ({"topic": "orders", "startingOffsets": "{oops"}, "option startingOffsets"),
        ({"topic": "orders", "maxMessagesPerTrigger": "-1"}, "option maxMessagesPerTrigger='-1'"),
        ({"topic": "orders", "endingOffsets": "latest"}, "option endingOffsets is only for batch"),
    ]
    for extra, fragment in cases:
        with pytest.raises(Exception) as err:
            stream(spark, {"path": str(root), **extra}, tmp_path / "ck-bad")
        assert fragment in str(err.value), str(err.value)[:2000]
    with pytest.raises(Exception) as err:
        batch_read(spark, {"path": str(tmp_path / "nowhere"), "topic": "orders"}).collect()
    assert "option path=" in str(err.value) and "no such directory" in str(err.value)


def test_a_damaged_record_fails_the_read_naming_file_and_offset(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_root(root, "orders", brokers=1, queues=1, count=3)
    segment = root / "broker-0" / "commitlog" / ("0" * 20)
    data = bytearray(segment.read_bytes())
    data[88] ^= 0xFF  # first byte of the first message's body
    segment.write_bytes(bytes(data))
    with pytest.raises(Exception) as err:
        batch_read(spark, {"path": str(root), "topic": "orders"}).collect()
    assert f"{segment} @ offset 0: body CRC mismatch" in str(err.value)
