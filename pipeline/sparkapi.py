"""What differs between the PySpark versions rocketstore runs on, kept in one place.

Owns: the running PySpark's version, the version each Spark-facing feature needs, and the one
call whose signature changed among them (``to_arrow_schema``). The table of what each version
offers, and why, is docs/spark-versions.md; this module is its code.

Thread-safety: pure functions over constants. Requires: pyspark importable (the engine and the
tools never import this module; only the Spark faces do: sink, source, datasource, jobs).
"""

from __future__ import annotations

import inspect
import re
from functools import cache
from typing import TYPE_CHECKING

from rocketstore.pipeline.errors import SparkVersionError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

# The oldest PySpark each face works on. The foreachBatch sink (CommitLogSink), the CLI and the
# jobs that only write need none of these.
# format("rocketstore"): pyspark.sql.datasource (the source, the batch writer, registration).
DATA_SOURCE = (4, 0)
# writeStream.format("rocketstore"): a stream writer given Arrow batches (DataSourceStreamArrowWriter).
ARROW_STREAM_WRITER = (4, 1)
# The source's per-trigger limits: latestOffset(start, limit), ReadLimit, SupportsTriggerAvailableNow.
ADMISSION_CONTROL = (4, 2)


def _parse(text: str) -> tuple[int, int]:
    """``(major, minor)`` of a version such as ``4.3.0``, ``4.1.0.dev1`` or ``5.0rc1``."""
    found = re.match(r"(\d+)\.(\d+)", text)
    if found is None:
        raise SparkVersionError(f"pyspark.__version__ {text!r} is not a version rocketstore reads")
    return int(found.group(1)), int(found.group(2))


@cache
def version() -> tuple[int, int]:
    """The running PySpark's ``(major, minor)``."""
    import pyspark

    return _parse(pyspark.__version__)


def version_text() -> str:
    import pyspark

    return str(pyspark.__version__)


def has(needed: tuple[int, int]) -> bool:
    """Whether the running PySpark is at least ``needed``."""
    return version() >= needed


def require(needed: tuple[int, int], feature: str) -> None:
    """Raise :class:`SparkVersionError` naming ``feature`` unless PySpark is ``needed`` or newer."""
    if not has(needed):
        raise SparkVersionError(
            f"{feature} needs PySpark {needed[0]}.{needed[1]} or later; this is "
            f"{version_text()} (docs/spark-versions.md: what each version offers)"
        )


@cache
def _takes_timezone() -> bool:
    from pyspark.sql.pandas.types import to_arrow_schema

    return "timezone" in inspect.signature(to_arrow_schema).parameters


def to_arrow(schema: StructType) -> pa.Schema:
    """``schema`` as Arrow, timestamps in UTC: 4.2 took ``timezone="UTC"`` where 4.0 and 4.1
    said ``timestamp_utc=True`` (their default) and 3.5 had UTC as its only form."""
    from pyspark.sql.pandas.types import to_arrow_schema

    if _takes_timezone():
        return to_arrow_schema(schema, timezone="UTC")
    return to_arrow_schema(schema)
