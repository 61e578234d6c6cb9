"""pipeline/sparkapi.py: versions read, requirements named, the Arrow schema in UTC."""

from __future__ import annotations

import pyarrow as pa
import pyspark
import pytest
from pyspark.sql.types import BinaryType, LongType, StructField, StructType, TimestampType

from rocketstore.pipeline import sparkapi
from rocketstore.pipeline.errors import SparkVersionError, StoreError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4.3.0", (4, 3)),
        ("3.5.9", (3, 5)),
        ("4.1.0.dev1", (4, 1)),
        ("4.2", (4, 2)),
        ("5.0rc1", (5, 0)),
    ],
)
def test_versions_are_read_as_major_and_minor(text: str, expected: tuple[int, int]) -> None:
    assert sparkapi._parse(text) == expected


def test_a_version_it_cannot_read_is_named() -> None:
    with pytest.raises(SparkVersionError, match="'dev' is not a version"):
        sparkapi._parse("dev")


def test_the_running_version_is_pysparks() -> None:
    major, minor = (int(p) for p in pyspark.__version__.split(".")[:2])
    assert sparkapi.version() == (major, minor)
    assert sparkapi.has((major, minor)) and sparkapi.has((3, 5))
    assert not sparkapi.has((major, minor + 1))


def test_a_missing_requirement_names_the_feature_and_both_versions() -> None:
    major, minor = sparkapi.version()
    sparkapi.require((major, minor), "anything")  # met: nothing happens
    with pytest.raises(SparkVersionError) as caught:
        sparkapi.require((major + 1, 0), "option maxFoo")
    assert isinstance(caught.value, StoreError)
    assert str(caught.value).startswith(
        f"option maxFoo needs PySpark {major + 1}.0 or later; this is {pyspark.__version__}"
    )


def test_the_arrow_schema_keeps_timestamps_in_utc() -> None:
    schema = StructType(
        [
            StructField("id", LongType(), False),
            StructField("body", BinaryType()),
            StructField("at", TimestampType()),
        ]
    )
    assert sparkapi.to_arrow(schema) == pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            ("body", pa.binary()),
            ("at", pa.timestamp("us", tz="UTC")),
        ]
    )
