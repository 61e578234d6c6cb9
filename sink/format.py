"""The ``rocketstore`` data source's writers: ``df.write`` and ``df.writeStream`` with
``format("rocketstore")``.

A data source writer sees Spark's partitions as they are and cannot shuffle them, so each
task routes its own rows and appends them to every broker they belong to, one broker lock at a
time. Task ``p`` leads with broker ``p``: it appends that broker's rows as they arrive
(:func:`rocketstore.sink.writer.append_partition`) and holds the others' until its input ends, then takes
whichever of their brokers nobody holds first. Every broker still has exactly one writer at a
time, a task's rows of one queue keep their order, and the tasks of a micro-batch do not queue
behind each other on the same broker. The replay
slot is the Spark partition id (see :mod:`rocketstore.sink.append`), which a re-run of the same
micro-batch keeps. For one task per broker (fewer, larger appends),
use :class:`sink.CommitLogSink` with ``foreachBatch``.

``streamWriter``/``writer`` run on the driver; ``write`` runs on executors in pickled copies;
``commit``/``abort`` run on the driver.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from rocketstore.pipeline import sparkapi
from rocketstore.pipeline.errors import ConfigError
from rocketstore.sink.append import AppendStats, sink_fingerprint
from rocketstore.sink.plan import Plan, prepare, route_batches
from rocketstore.sink.settings import SinkSettings
from rocketstore.sink.writer import append_partition

if TYPE_CHECKING or sparkapi.has(sparkapi.ARROW_STREAM_WRITER):
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
else:  # PySpark 4.0: stream_writer refuses first, so the class below is never made there
    from pyspark.sql.datasource import DataSourceStreamWriter as DataSourceStreamArrowWriter

log = logging.getLogger("rocketstore.sink")
_ROW_BITS = 40


@dataclasses.dataclass
class AppendedMessage(WriterCommitMessage):
    """What one task appended (picklable; travels from the executor to the driver)."""

    partition: int
    stats: list[AppendStats]


def _plan(options: Mapping[str, Any], schema: StructType, overwrite: bool) -> Plan:
    if overwrite:
        raise ConfigError(
            "mode overwrite: a rocketstore topic is an append-only log; use mode append "
            "(retention removes old messages)"
        )
    settings = SinkSettings.from_options(dict(options))
    if settings.writer_tasks is not None:
        raise ConfigError(
            "option writerTasks: the rocketstore data source writes with the DataFrame's own "
            "partitions (repartition it to choose how many); writerTasks is an option of the "
            "foreachBatch sink, CommitLogSink"
        )
    return prepare(settings, sparkapi.to_arrow(schema))


def _write(
    plan: Plan, batches: Iterator[pa.RecordBatch], batch_id: int, sink_fp: bytes
) -> AppendedMessage:
    ctx = TaskContext.get()
    part = ctx.partitionId() if ctx is not None else 0
    attempt = ctx.attemptNumber() if ctx is not None else 0
    routed = route_batches(plan, batches, part << _ROW_BITS)
    stats = append_partition(
        plan.settings,
        plan.queues,
        plan.brokers,
        routed,
        batch_id=batch_id,
        sink_fp=sink_fp,
        slot=part,
        attempt=attempt,
    )
    return AppendedMessage(part, stats)


class RocketStoreStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writer; exactly once for deterministic inputs (same contract as foreachBatch)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        ctx = TaskContext.get()
        batch_id = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
        query_id = ctx.getLocalProperty("sql.streaming.queryId") if ctx else None
        sink_id = self.plan.settings.sink_id or query_id
        if batch_id is None or sink_id is None:
            raise RuntimeError("streaming write outside a streaming query (no batch or query id)")
        return _write(self.plan, iterator, int(batch_id), sink_fingerprint(sink_id))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        appended = sum(
            s.appended for m in messages if isinstance(m, AppendedMessage) for s in m.stats
        )
        skipped = sum(
            s.skipped for m in messages if isinstance(m, AppendedMessage) for s in m.stats
        )
        log.info("batch %d: appended %d rows (%d already stored)", batchId, appended, skipped)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Appended rows stay: a re-run of the batch recognises and skips them.
        log.warning("batch %d aborted; its re-run will skip the rows already stored", batchId)


class RocketStoreBatchWriter(DataSourceArrowWriter):
    """Batch writer (``df.write.format("rocketstore").mode("append")``).

    A batch write has no replay identity: a retried task skips what its failed attempt
    stored (the job id is fixed when the write starts), but running the same write twice
    stores the rows twice.
    """

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.sink_fp = sink_fingerprint(plan.settings.sink_id or str(uuid.uuid4()))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _write(self.plan, iterator, 0, self.sink_fp)


def batch_writer(
    options: Mapping[str, Any], schema: StructType, overwrite: bool
) -> RocketStoreBatchWriter:
    return RocketStoreBatchWriter(_plan(options, schema, overwrite))


def stream_writer(
    options: Mapping[str, Any], schema: StructType, overwrite: bool
) -> RocketStoreStreamWriter:
    # 4.0's stream writers take rows one by one; the foreachBatch sink works there (in Arrow).
    sparkapi.require(sparkapi.ARROW_STREAM_WRITER, 'writeStream.format("rocketstore")')
    return RocketStoreStreamWriter(_plan(options, schema, overwrite))
