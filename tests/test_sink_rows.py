"""Routing and shaping of sink input (no Spark)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from rocketstore.pipeline.errors import ConfigError, InvalidMessageError
from rocketstore.pipeline.format.bodyformat import SCHEMA_PROPERTY
from rocketstore.pipeline.format.javahash import java_hash
from rocketstore.sink.rows import ROUTED, Layout, check_schema, repeated, route


def java_selector(key: str, total: int) -> int:
    # SelectMessageQueueByHash: value = key.hashCode() % size (Java remainder), then abs.
    # Java's remainder truncates toward zero, so abs(h % n) == abs(h) % n.
    return abs(java_hash(key)) % total


def layout(total: int = 8, **kw: object) -> Layout:
    values: dict[str, object] = {
        "topic": "orders",
        "total_queues": total,
        "sharding_key": None,
        "body_format": "binary",
        "body_schema": None,
    }
    values.update(kw)
    return Layout(**values)  # type: ignore[arg-type]


def test_keys_choose_queue_like_rocketmq_hash_selector() -> None:
    keys = [f"customer-{i}" for i in range(200)] + ["Aa", "BB", "\u00e9t\u00e9", "x" * 40]
    batch = pa.record_batch({"body": [b"b"] * len(keys), "keys": keys})
    out = route(batch, layout(12), 0)
    assert out.schema == ROUTED
    expected = [java_selector(k, 12) for k in keys]
    assert out.column("__rs_mq").to_pylist() == expected


def test_rows_without_key_are_spread_evenly() -> None:
    batch = pa.record_batch({"body": [b"b"] * 80, "keys": pa.nulls(80, pa.string())})
    out = route(batch, layout(8), 1000)
    assert np.bincount(out.column("__rs_mq").to_numpy(), minlength=8).tolist() == [10] * 8
    assert out.column("__rs_row").to_pylist() == list(range(1000, 1080))


def test_string_keys_are_split_on_spaces() -> None:
    batch = pa.record_batch({"body": [b"a", b"b", b"c"], "keys": ["k1 k2", "  k3 ", None]})
    out = route(batch, layout(), 0)
    assert out.column("keys").to_pylist() == [["k1", "k2"], ["k3"], None]


def test_sharding_key_column_and_queue_id_override() -> None:
    batch = pa.record_batch(
        {
            "body": [b"a", b"b", b"c"],
            "customer": ["c1", "c2", "c3"],
            "queueId": pa.array([None, 5, None], pa.int32()),
        }
    )
    with pytest.raises(InvalidMessageError, match="customer"):
        check_schema(batch.schema, "t", "binary", None)
    out = route(batch, layout(8, sharding_key="customer"), 0)
    mq = out.column("__rs_mq").to_pylist()
    assert mq == [java_selector("c1", 8), 5, java_selector("c3", 8)]
    bad = pa.record_batch({"body": [b"a"], "queueId": pa.array([8], pa.int32())})
    with pytest.raises(InvalidMessageError, match=r"queueId: 1 row\(s\) outside 0..7"):
        route(bad, layout(8), 0)


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"body": pa.array([1])}, "column body: expected binary or string"),
        ({"body": pa.array([b"x"]), "flag": pa.array(["1"])}, "column flag: expected an integer"),
        ({"body": pa.array([b"x"]), "keys": pa.array([1])}, "column keys: expected string"),
        ({"body": pa.array([b"x"]), "tags": pa.array([[1]])}, "column tags"),
        ({"keys": pa.array(["k"])}, "column body: missing"),
    ],
)
def test_wrong_columns_are_refused_by_name(columns: dict[str, pa.Array], message: str) -> None:
    with pytest.raises(InvalidMessageError, match=message):
        check_schema(pa.table(columns).schema, "t", "binary", None)


def test_topic_is_required_somewhere() -> None:
    schema = pa.schema([("body", pa.binary())])
    with pytest.raises(InvalidMessageError, match="column topic: missing"):
        check_schema(schema, None, "binary", None)
    with pytest.raises(ConfigError, match="shardingKey='nope'"):
        check_schema(schema, "t", "binary", "nope")


def test_avro_layout_encodes_other_columns_and_names_schema() -> None:
    batch = pa.record_batch({"keys": ["c1", "c2"], "amount": [1.5, 2.5], "sku": ["a", None]})
    schema = check_schema(batch.schema, "orders", "avro", None)
    assert schema is not None and schema.arrow_schema.names == ["amount", "sku"]
    out = route(batch, layout(body_format="avro", body_schema=schema), 0)
    props = out.column("properties").to_pylist()
    assert props == [[(SCHEMA_PROPERTY, schema.fingerprint)]] * 2
    with pytest.raises(InvalidMessageError, match="column body: bodyFormat=avro"):
        check_schema(pa.schema([("body", pa.binary()), ("x", pa.int32())]), "t", "avro", None)


@pytest.mark.parametrize("text", ["orders", "主题-é", ""])
@pytest.mark.parametrize("n", [0, 1, 10_000])
def test_repeated_builds_the_plain_string_array(text: str, n: int) -> None:
    got = repeated(text, n)
    got.validate(full=True)
    assert got.type == pa.string()
    assert got.to_pylist() == [text] * n
