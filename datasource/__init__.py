"""The ``rocketstore`` Spark data source: one class, for reading and for writing.

::

    spark.readStream.format("rocketstore").option("path", root).option("topic", "orders").load()
    df.writeStream.format("rocketstore").option("path", root).option("topic", "orders").start()

PySpark finds the class through the ``pyspark_rocketstore`` module, with no call in the user's
code; :func:`register` does it by hand in a session where that lookup is off.

The class only says which face does what: the readers are in :mod:`rocketstore.source.format`, the writers
in :mod:`rocketstore.sink.format`; neither package imports the other. Each face is imported when Spark asks
for it, so a Python worker that unpickles the class for a read does not import the sink, nor
one for a write the source. Spark pickles the class by reference, so executors must be able to
import this package: install rocketstore into the Python they run (``--py-files`` cannot carry
its compiled core; see docs/cluster.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rocketstore.pipeline import sparkapi

# On PySpark 3.5 (no pyspark.sql.datasource) importing this package is the error, naming the
# version: the foreachBatch sink (rocketstore.sink.foreach.CommitLogSink) works there.
sparkapi.require(sparkapi.DATA_SOURCE, 'format("rocketstore")')

from pyspark.sql.datasource import (  # noqa: E402
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
)
from pyspark.sql.types import StructType  # noqa: E402

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["RocketStoreDataSource", "register"]


class RocketStoreDataSource(DataSource):
    """``format("rocketstore")``: the options are the source's (docs/source.md, source/options.py) for
    reads and the sink's (sink/settings.py) for writes."""

    @classmethod
    def name(cls) -> str:
        return "rocketstore"

    def schema(self) -> StructType:
        from rocketstore.source.format import spark_schema

        return spark_schema(self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        from rocketstore.source.format import RocketStoreBatchReader

        return RocketStoreBatchReader(self.options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from rocketstore.source.format import stream_reader

        return stream_reader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from rocketstore.sink.format import batch_writer

        return batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from rocketstore.sink.format import stream_writer

        return stream_writer(self.options, schema, overwrite)


def register(spark: SparkSession) -> None:
    """Make ``format("rocketstore")`` available in ``spark``, for reading and writing."""
    from pyspark.errors import AnalysisException

    try:
        spark.dataSource.register(RocketStoreDataSource)
    except AnalysisException as exc:
        # PySpark 4.0 registers what the pyspark_rocketstore module names at start-up,
        # as a static source that a second registration may not replace: it is this class.
        condition = getattr(exc, "getCondition", exc.getErrorClass)()
        if condition != "DATA_SOURCE_ALREADY_EXISTS":
            raise
