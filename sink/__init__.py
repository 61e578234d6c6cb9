"""The writeStream side: Spark micro-batches into a rocketstore store root.

``CommitLogSink`` is the ``foreachBatch`` face; ``format("rocketstore")`` (registered by
:func:`register`) is the data source face. Both append each row exactly once for a
deterministic input (see :mod:`sink.append`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sink.foreach import CommitLogSink

__all__ = ["CommitLogSink", "register"]


def __getattr__(name: str) -> object:
    # Spark is imported only when the Spark-facing class is used, so `import sink` stays cheap
    # for the engine's tools.
    if name == "CommitLogSink":
        from sink.foreach import CommitLogSink

        return CommitLogSink
    raise AttributeError(name)


def register(spark: SparkSession) -> None:
    """Register the ``rocketstore`` data source (reader and writer) with ``spark``."""
    from source.datasource import register as _register

    _register(spark)
