"""Row bodies: Avro and JSON encoding, schemas, fingerprints, evolution (no Spark)."""

from __future__ import annotations

import datetime as dt
import decimal
import json

import pyarrow as pa
import pytest

from rocketstore.pipeline.errors import ConfigError, CorruptRecordError
from rocketstore.pipeline.format.bodyformat import (
    BodySchema,
    check_format,
    decode_bodies,
    encode_bodies,
    fingerprint_of,
)

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


def crc64_avro(data: bytes) -> int:
    """CRC-64-AVRO (Rabin), written from the algorithm the Avro specification publishes
    ("Schema Fingerprints"), independently of fastavro, as an unsigned 64-bit value."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp & 0xFFFFFFFFFFFFFFFF)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def as_hex(fp: int) -> str:
    """A fingerprint as this project names schemas: its 8 bytes little-endian (the byte order of
    Avro's single-object encoding), in hex."""
    return (fp & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little").hex()


# (schema, parsing canonical form, fingerprint as a signed long) from the Avro project's
# share/test/data/schema-tests.txt, the test vectors its Java reference implementation checks.
AVRO_VECTORS = [
    ('"null"', '"null"', 7195948357588979594),
    ('"int"', '"int"', 8247732601305521295),
    (
        '{"fields":[], "type":"record", "name":"foo"}',
        '{"name":"foo","type":"record","fields":[]}',
        -4824392279771201922,
    ),
    (
        '{"fields":[], "type":"record", "name":"foo", "namespace":"x.y"}',
        '{"name":"x.y.foo","type":"record","fields":[]}',
        5916914534497305771,
    ),
    (
        '{"fields":[{"type":{"type":"boolean"}, "name":"f1"}], "type":"record", "name":"foo"}',
        '{"name":"foo","type":"record","fields":[{"name":"f1","type":"boolean"}]}',
        7843277075252814651,
    ),
    (
        '{"name":"PigValue","type":"record",'
        '"fields":[{"name":"value", "type":["null", "int", "long", "PigValue"]}]}',
        '{"name":"PigValue","type":"record","fields":[{"name":"value",'
        '"type":["null","int","long","PigValue"]}]}',
        -1759257747318642341,
    ),
]


@pytest.mark.parametrize(("schema", "canonical", "fingerprint"), AVRO_VECTORS)
def test_fingerprints_are_avros_crc64(schema: str, canonical: str, fingerprint: int) -> None:
    assert as_hex(crc64_avro(canonical.encode())) == as_hex(fingerprint)  # the reference
    parsed = json.loads(schema)
    if isinstance(parsed, dict):
        assert fingerprint_of(parsed) == as_hex(fingerprint)


# The sample's body schema as the Avro specification's canonical form rules write it (full
# names, attributes in the order name, type, fields, symbols, items, values, size; no doc,
# default or logicalType). Its fingerprint names the schema file in every store written with
# it, so it must not change between releases.
SAMPLE_CANONICAL = (
    '{"name":"rocketstore.orders.Row","type":"record","fields":['
    '{"name":"amount","type":["null","double"]},'
    '{"name":"n","type":["null","int"]},'
    '{"name":"at","type":["null","long"]},'
    '{"name":"day","type":["null","int"]},'
    '{"name":"raw","type":["null","bytes"]},'
    '{"name":"price","type":["null","bytes"]},'
    '{"name":"tags_list","type":["null",{"type":"array","items":["null","string"]}]},'
    '{"name":"attrs","type":["null",{"type":"map","values":["null","long"]}]},'
    '{"name":"nested","type":["null",{"name":"rocketstore.orders.nested","type":"record",'
    '"fields":[{"name":"x","type":["null","long"]},{"name":"y","type":["null","string"]}]}]}'
    "]}"
)
SAMPLE_FINGERPRINT = "92235c97ac4cec8d"


def test_document_round_trip_and_pinned_fingerprint() -> None:
    schema = BodySchema.from_arrow(sample().schema, "orders")
    again = BodySchema.from_document(schema.document())
    assert again == schema
    assert as_hex(crc64_avro(SAMPLE_CANONICAL.encode())) == SAMPLE_FINGERPRINT
    assert schema.fingerprint == SAMPLE_FINGERPRINT


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
