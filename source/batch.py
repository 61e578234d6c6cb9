"""A batch read of a topic without the Python data source API, for PySpark 3.5::

    from rocketstore.source.batch import read_batch
    df = read_batch(spark, {"path": root, "topic": "orders"})

The DataFrame is the one ``spark.read.format("rocketstore")`` loads on 4.0 and later, with the
same options (docs/source.md: offsets, ``key``, ``subExpression``, ``include*``, bodies) and
columns. The partitions are planned here, on the driver, when the function is called; the
executors read them in ``mapInArrow`` over a range of one row per partition, with the source's
own partition reader (:mod:`rocketstore.source.tierread`), so the bytes read, the errors and the
tiers are the data source's. Streams need the data source API (4.0): there is no stream here.

Owns: nothing past the call. Thread-safety: as the Spark session. Requires: PySpark 3.5 or later
(``mapInArrow``); works the same on 4.x, classic or Spark Connect.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema

from rocketstore.source import options
from rocketstore.source.planning import Planner
from rocketstore.source.read import read_context
from rocketstore.source.tierread import read_part

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def read_batch(spark: SparkSession, opts: Mapping[str, str]) -> DataFrame:
    """The messages ``opts`` select, as a DataFrame planned now (see the module)."""
    parsed = options.parse(opts, streaming=False)
    ctx = read_context(parsed)
    parts = Planner(parsed).batch_parts()
    spark_schema = from_arrow_schema(ctx.schema)
    if not parts:
        return spark.createDataFrame([], spark_schema)

    def read_parts(seeds: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for seed in seeds:
            for i in seed.column(0).to_pylist():
                yield from read_part(parts[i], ctx)

    # range(0, n, 1, n) puts exactly one id in each of its n partitions.
    seeds = spark.range(0, len(parts), 1, len(parts))
    return seeds.mapInArrow(read_parts, spark_schema)
