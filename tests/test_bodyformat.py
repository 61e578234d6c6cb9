"""Row bodies: Avro and JSON encoding, schemas, fingerprints, evolution (no Spark)."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest

from pipeline.bodyformat import BodySchema, check_format, decode_bodies, encode_bodies
from pipeline.errors import ConfigError, CorruptRecordError

UTC = dt.UTC


def sample() -> pa.Table:
    return pa.table(
        {
            "keys": ["a", "b"],
            "amount": [1.5, None],
            "n": pa.array([1, 2], pa.int32()),
            "at": pa.array([dt.datetime(2024, 1, 1, tzinfo=UTC), None], pa.timestamp("us", "UTC")),
            "day": pa.array([dt.date(2024, 1, 2), None]),
            "raw": [b"\x00\xff", None],
            "price": pa.array([decimal.Decimal("1.25"), None], pa.decimal128(9, 2)),
            "tags_list": [["x", None], []],
            "attrs": pa.array([[("k", 1)], None], pa.map_(pa.string(), pa.int64())),
            "nested": [{"x": 1, "y": "s"}, None],
        }
    )


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_rows_round_trip(fmt: str) -> None:
    table = sample()
    schema = BodySchema.from_arrow(table.schema, "orders")
    assert "keys" not in schema.arrow_schema.names
    bodies = encode_bodies(table, schema, fmt).to_pylist()
    back = decode_bodies(
        bodies, [schema.fingerprint] * 2, fmt, schema, KeyError, lambda i: ("f", i)
    )
    assert back.equals(table.select(schema.arrow_schema.names))


def test_document_round_trip_and_stable_fingerprint() -> None:
    schema = BodySchema.from_arrow(sample().schema, "orders")
    again = BodySchema.from_document(schema.document())
    assert again == schema
    assert len(schema.fingerprint) == 16
    assert BodySchema.from_arrow(sample().schema, "orders").fingerprint == schema.fingerprint


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_reader_with_an_added_nullable_column_reads_old_bodies(fmt: str) -> None:
    v1 = BodySchema.from_arrow(pa.schema([("a", pa.int64())]), "t")
    v2 = BodySchema.from_arrow(pa.schema([("a", pa.int64()), ("score", pa.float64())]), "t")
    old = encode_bodies(pa.table({"a": [1, 2]}), v1, fmt).to_pylist()
    new = encode_bodies(pa.table({"a": [3], "score": [0.5]}), v2, fmt).to_pylist()
    known = {v1.fingerprint: v1, v2.fingerprint: v2}
    back = decode_bodies(
        old + new,
        [v1.fingerprint] * 2 + [v2.fingerprint],
        fmt,
        v2,
        known.__getitem__,
        lambda i: ("f", i),
    )
    assert back.to_pylist() == [
        {"a": 1, "score": None},
        {"a": 2, "score": None},
        {"a": 3, "score": 0.5},
    ]


def test_undecodable_body_names_file_and_offset() -> None:
    schema = BodySchema.from_arrow(pa.schema([("a", pa.string())]), "t")
    with pytest.raises(
        CorruptRecordError, match=r"00000000000000000000 @ offset 4096: body is not"
    ):
        decode_bodies(
            [b"\x07"],
            [schema.fingerprint],
            "avro",
            schema,
            KeyError,
            lambda i: ("00000000000000000000", 4096),
        )


def test_bad_formats_and_columns() -> None:
    with pytest.raises(ConfigError, match="bodyFormat='xml'"):
        check_format("xml")
    with pytest.raises(ConfigError, match="at least one column"):
        BodySchema.from_arrow(pa.schema([("keys", pa.string())]), "t")
    with pytest.raises(ConfigError, match="column 'my col'"):
        BodySchema.from_arrow(pa.schema([("my col", pa.string())]), "t")
