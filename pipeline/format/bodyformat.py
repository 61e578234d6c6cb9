"""Message bodies that carry a row: the ``avro`` and ``json`` body formats.

With ``bodyFormat=avro`` or ``json`` the sink stores every column that is not a message field
(``topic``, ``keys``, ``tags``, ``properties``, ``flag``, ``queueId``) in the body of its row's
message, and the source turns bodies back into those columns.

- ``avro``: the Avro binary encoding of one record per message, without a header (fastavro's
  schemaless form). The writer's schema is derived from the Arrow schema of the columns
  (:func:`BodySchema.from_arrow`).
- ``json``: one JSON object per message, UTF-8; timestamps as ISO-8601 strings in UTC, dates as
  ``YYYY-MM-DD``, binary as base64, decimals as strings.

Either way the schema is registered in the store root (``schemas/<fingerprint>.json``, see
:mod:`rocketstore.pipeline.engine.root`) and each message names it in the user property ``rsSchema``: the
fingerprint is Avro's CRC-64-AVRO of the schema's parsing canonical form, as 16 hex digits. A
reader decodes each body with the schema its message names and, for Avro, resolves it to the
reader's schema by Avro's schema-resolution rules, so a topic whose schema gained a nullable
column reads as one table.

Pure functions; thread-safe. Encoding and decoding are per row (fastavro's C code and
``json``), the one place in the sink and source where per-row Python is unavoidable.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import io
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import fastavro
import fastavro.schema
import pyarrow as pa

from rocketstore.pipeline.errors import ConfigError, CorruptRecordError

FORMATS = ("binary", "avro", "json")
SCHEMA_PROPERTY = "rsSchema"
# Columns that are message fields rather than row data.
MESSAGE_COLUMNS = frozenset({"topic", "keys", "tags", "properties", "flag", "queueId", "body"})
_UTC = dt.UTC
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)


def check_format(value: str, option: str = "bodyFormat") -> str:
    fmt = value.strip().lower()
    if fmt not in FORMATS:
        raise ConfigError(f"option {option}={value!r}: expected one of {', '.join(FORMATS)}")
    return fmt


def _avro_name(name: str) -> str:
    """Avro names are ``[A-Za-z_][A-Za-z0-9_]*``; anything else is replaced by ``_``."""
    clean = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return clean if clean and not clean[0].isdigit() else f"_{clean}"


def _avro_type(t: pa.DataType, name: str) -> Any:
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t):
        return "int"
    if pa.types.is_int64(t):
        return "long"
    if pa.types.is_float32(t):
        return "float"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "bytes"
    if pa.types.is_timestamp(t):
        return {"type": "long", "logicalType": "timestamp-micros"}
    if pa.types.is_date32(t):
        return {"type": "int", "logicalType": "date"}
    if pa.types.is_decimal(t):
        return {
            "type": "bytes",
            "logicalType": "decimal",
            "precision": t.precision,
            "scale": t.scale,
        }
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return {"type": "array", "items": _nullable(t.value_type, f"{name}_item", True)}
    if pa.types.is_map(t):
        if not pa.types.is_string(t.key_type):
            raise ConfigError(f"column {name}: Avro maps need string keys, not {t.key_type}")
        return {"type": "map", "values": _nullable(t.item_type, f"{name}_value", True)}
    if pa.types.is_struct(t):
        return {
            "type": "record",
            "name": _avro_name(name),
            "fields": [_field(f, f"{name}_{f.name}") for f in t],
        }
    raise ConfigError(f"column {name}: type {t} cannot be stored in an avro or json body")


def _field(f: pa.Field, name: str) -> dict[str, Any]:
    """A record field; a nullable one defaults to null, so that a reader whose schema gained
    a nullable column can still read bodies written before it (Avro schema resolution)."""
    field: dict[str, Any] = {"name": f.name, "type": _nullable(f.type, name, f.nullable)}
    if f.nullable:
        field["default"] = None
    return field


def _nullable(t: pa.DataType, name: str, nullable: bool) -> Any:
    inner = _avro_type(t, name)
    return ["null", inner] if nullable else inner


@dataclasses.dataclass(frozen=True)
class BodySchema:
    """The schema of the rows stored in bodies: its Arrow form (what Spark sees), its Avro form
    and its fingerprint."""

    arrow_schema: pa.Schema
    avro_schema: dict[str, Any]
    fingerprint: str

    @classmethod
    def from_arrow(cls, schema: pa.Schema, topic: str) -> BodySchema:
        # Spark hands timestamps over in the session's time zone; the instant is what is
        # stored, so the schema (and its fingerprint) says UTC whatever the session said.
        fields = [
            f.with_type(pa.timestamp("us", tz="UTC"))
            if pa.types.is_timestamp(f.type) and f.type.tz is not None
            else f
            for f in schema
            if f.name not in MESSAGE_COLUMNS
        ]
        if not fields:
            raise ConfigError(
                "bodyFormat avro/json needs at least one column besides the message fields "
                f"({', '.join(sorted(MESSAGE_COLUMNS))}); the input has none"
            )
        for f in fields:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", f.name):
                raise ConfigError(
                    f"column {f.name!r}: bodyFormat avro/json needs column names of letters, "
                    "digits and _ (not starting with a digit); rename it"
                )
        avro = {
            "type": "record",
            "name": "Row",
            "namespace": f"rocketstore.{_avro_name(topic)}",
            "fields": [_field(f, f.name) for f in fields],
        }
        arrow = pa.schema(fields)
        return cls(arrow, avro, fingerprint_of(avro))

    def document(self) -> dict[str, Any]:
        """The registered form: the Avro schema and the Arrow schema (IPC, base64)."""
        ipc = self.arrow_schema.serialize().to_pybytes()
        return {"avro": self.avro_schema, "arrow": base64.b64encode(ipc).decode("ascii")}

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> BodySchema:
        arrow = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(doc["arrow"])))
        return cls(arrow, doc["avro"], fingerprint_of(doc["avro"]))


def fingerprint_of(avro_schema: dict[str, Any]) -> str:
    parsed = fastavro.parse_schema(avro_schema, _write_hint=False)
    canonical = fastavro.schema.to_parsing_canonical_form(parsed)
    return str(fastavro.schema.fingerprint(canonical, "CRC-64-AVRO"))


# -- encoding ---------------------------------------------------------------------------------


def encode_bodies(table: pa.Table, schema: BodySchema, fmt: str) -> pa.BinaryArray:
    """One body per row of ``table`` (which has at least the schema's columns)."""
    rows = table.select(schema.arrow_schema.names).to_pylist()
    maps = [f for f in schema.arrow_schema if _has_map(f.type)]
    for f in maps:
        # Arrow gives maps as lists of pairs; Avro and JSON want objects.
        for row in rows:
            row[f.name] = _maps_as_dicts(row[f.name], f.type)
    if fmt == "avro":
        parsed = fastavro.parse_schema(schema.avro_schema)
        out = []
        buf = io.BytesIO()
        for row in rows:
            buf.seek(0)
            buf.truncate()
            fastavro.schemaless_writer(buf, parsed, row)
            out.append(buf.getvalue())
        return pa.array(out, pa.binary())
    if fmt == "json":
        dumps = json.JSONEncoder(default=_json_default, ensure_ascii=False, separators=(",", ":"))
        return pa.array([dumps.encode(r).encode("utf-8") for r in rows], pa.binary())
    raise ConfigError(f"bodyFormat {fmt!r} does not encode rows")


def _has_map(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_map(t.value_type)
    if pa.types.is_struct(t):
        return any(_has_map(f.type) for f in t)
    return False


def _maps_as_dicts(value: Any, t: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_map(t):
        return {k: _maps_as_dicts(v, t.item_type) for k, v in value}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_maps_as_dicts(v, t.value_type) for v in value]
    if pa.types.is_struct(t):
        return {f.name: _maps_as_dicts(value.get(f.name), f.type) for f in t}
    return value


def _json_default(value: object) -> object:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_UTC)
        return value.astimezone(_UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, decimal.Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


# -- decoding ---------------------------------------------------------------------------------


def decode_bodies(
    bodies: Sequence[bytes | None],
    fingerprints: Sequence[str | None],
    fmt: str,
    reader: BodySchema,
    load: Callable[[str], BodySchema],
    where: Callable[[int], tuple[str, int]],
) -> pa.Table:
    """Decode bodies into a table of ``reader.arrow_schema``.

    ``load(fp)`` returns the writer schema a fingerprint names (callers cache it);
    ``where(i)`` gives the file and offset of message ``i`` for errors. A body that does not
    decode raises :class:`CorruptRecordError`; a message without ``rsSchema`` is decoded with
    the reader schema.
    """
    rows: list[dict[str, Any]] = []
    if fmt == "avro":
        parsed_reader = fastavro.parse_schema(reader.avro_schema)
        writers: dict[str, Any] = {}
        for i, (body, fp) in enumerate(zip(bodies, fingerprints, strict=True)):
            key = fp or reader.fingerprint
            writer = writers.get(key)
            if writer is None:
                src = reader if key == reader.fingerprint else load(key)
                writer = writers[key] = fastavro.parse_schema(src.avro_schema)
            try:
                row = fastavro.schemaless_reader(io.BytesIO(body or b""), writer, parsed_reader)
                rows.append(row)  # type: ignore[arg-type]  # a record schema reads as a dict
            except Exception as exc:  # fastavro raises assorted types for bad input
                raise _undecodable(where(i), "avro", exc) from None
    elif fmt == "json":
        for i, body in enumerate(bodies):
            try:
                rows.append(json.loads(body or b""))
            except ValueError as exc:
                raise _undecodable(where(i), "json", exc) from None
        return _json_table(rows, reader.arrow_schema)
    else:
        raise ConfigError(f"bodyFormat {fmt!r} does not decode rows")
    return pa.Table.from_pylist(rows, schema=reader.arrow_schema)


def _undecodable(where: tuple[str, int], fmt: str, exc: Exception) -> CorruptRecordError:
    return CorruptRecordError(where[0], where[1], f"body is not a valid {fmt} row ({exc})")


def _json_table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows parsed from JSON, converted back to the Arrow types JSON cannot carry."""
    columns = []
    for f in schema:
        values = [r.get(f.name) for r in rows]
        columns.append(_from_json(values, f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _from_json(values: list[Any], t: pa.DataType) -> pa.Array:
    if pa.types.is_timestamp(t):
        parsed = [None if v is None else dt.datetime.fromisoformat(v) for v in values]
        return pa.array(parsed, t)
    if pa.types.is_date32(t):
        return pa.array([None if v is None else dt.date.fromisoformat(v) for v in values], t)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pa.array([None if v is None else base64.b64decode(v) for v in values], t)
    if pa.types.is_decimal(t):
        return pa.array([None if v is None else decimal.Decimal(v) for v in values], t)
    return pa.array(values, t)
