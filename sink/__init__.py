"""The writeStream side: Spark micro-batches into a rocketstore store root.

``CommitLogSink`` is the ``foreachBatch`` face; the ``rocketstore`` data source's writers
(:mod:`rocketstore.sink.format`, registered with :func:`datasource.register`) are the other. Both append
each row exactly once for a deterministic input (see :mod:`rocketstore.sink.append`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rocketstore.sink.foreach import CommitLogSink

__all__ = ["CommitLogSink"]


def __getattr__(name: str) -> object:
    # Spark is imported only when the Spark-facing class is used, so `import sink` stays cheap
    # for the engine's tools.
    if name == "CommitLogSink":
        from rocketstore.sink.foreach import CommitLogSink

        return CommitLogSink
    raise AttributeError(name)
