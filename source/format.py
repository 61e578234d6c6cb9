"""The ``rocketstore`` data source's readers: ``spark.read`` and ``spark.readStream`` with
``format("rocketstore")`` (the data source itself is :class:`datasource.RocketStoreDataSource`;
its writers are in :mod:`rocketstore.sink.format`)::

    spark.readStream.format("rocketstore").option("path", root).option("topic", "orders").load()
    spark.read.format("rocketstore").option("path", root).option("topic", "orders").load()

The classes here are thin: options are parsed by :mod:`rocketstore.source.options`, offsets planned by
:mod:`rocketstore.source.planning`, partitions read by :mod:`rocketstore.source.read`.

Where things run (PySpark 4.3):

* The data source's ``schema`` and the readers' constructors run on the driver when
  the query or batch read starts; bad options fail there, with
  :class:`~rocketstore.pipeline.errors.ConfigError` naming the option.
* The stream reader's offset methods (``initialOffset``, ``latestOffset``, ``partitions``, ...)
  run in one long-lived Python process on the driver, one call at a time.
* ``read()`` runs on executors, in pickled copies of the reader: it opens every file itself.
* ``commit()`` and ``stop()`` are not called reliably, so nothing depends on them: progress is
  the offsets in the query's checkpoint, and after a crash the last planned batch is replayed
  with the same offsets, which read the same messages.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from rocketstore.pipeline import sparkapi
from rocketstore.pipeline.errors import ConfigError
from rocketstore.source import offsets, options, schema
from rocketstore.source.planning import KeyRange, Limit, Planner, QueueRange
from rocketstore.source.read import ReadContext, read_context
from rocketstore.source.tierread import read_part

if TYPE_CHECKING:
    from pyspark.sql.streaming.datasource import ReadLimit


class Partition(InputPartition):
    """One partition as the planner makes them (picklable): queue ranges read one after another
    (:func:`~rocketstore.source.planning.pack_ranges`), or one broker's key look-up."""

    def __init__(self, part: KeyRange | tuple[QueueRange, ...]) -> None:
        super().__init__(part)
        self.part = part


def _context(opts: options.ReadOptions, spark_schema: StructType) -> ReadContext:
    _, body = schema.body_format_and_schema(opts)
    # A schema given with .schema(...) may pick any column the source can produce, whatever the
    # include* options say; Spark hands the default (schema() below) over as it is.
    expected = schema.full_arrow_schema(body)
    unknown = [n for n in spark_schema.fieldNames() if n not in expected.names]
    if unknown:
        raise ConfigError(
            f"the schema given to the rocketstore source names columns it does not produce: "
            f"{', '.join(unknown)}; its columns are {', '.join(expected.names)}"
        )
    return read_context(opts, sparkapi.to_arrow(spark_schema))


def _read(partition: InputPartition, ctx: ReadContext) -> Iterator[pa.RecordBatch]:
    if isinstance(partition, Partition):
        yield from read_part(partition.part, ctx)
    # Anything else is Spark's placeholder for a batch with no partitions: nothing to read.


class RocketStoreBatchReader(DataSourceReader):
    """``spark.read``: one partition per queue range (``startingOffsets`` to
    ``endingOffsets``), or per broker for a ``key`` look-up."""

    def __init__(self, opts: Mapping[str, str], spark_schema: StructType) -> None:
        self.options = options.parse(opts, streaming=False)
        self.ctx = _context(self.options, spark_schema)

    def partitions(self) -> list[InputPartition]:
        return [Partition(part) for part in Planner(self.options).batch_parts()]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.ctx)


class RocketStoreStreamReader(DataSourceStreamReader):
    """``spark.readStream``, with admission control (``maxMessagesPerTrigger``,
    ``minMessagesPerTrigger``) and ``Trigger.AvailableNow`` (PySpark 4.2 and later: Spark calls
    ``latestOffset(start, limit)`` because of its signature). Offsets: see
    :mod:`rocketstore.source.offsets`."""

    def __init__(self, opts: Mapping[str, str], spark_schema: StructType) -> None:
        self.options = options.parse(opts, streaming=True)
        self.ctx = _context(self.options, spark_schema)
        self.planner = Planner(self.options)

    def initialOffset(self) -> dict[str, Any]:
        return offsets.to_json(self.planner.initial_offsets())

    # The read limits are imported where used: pyspark.sql.streaming.datasource is new in 4.2,
    # and this module must import on 4.0 and 4.1 too (PlainStreamReader below).
    def getDefaultReadLimit(self) -> ReadLimit:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

        if self.options.max_per_trigger is not None:
            return ReadMaxRows(self.options.max_per_trigger)
        if self.options.min_per_trigger is not None:
            return ReadMinRows(self.options.min_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

        if isinstance(limit, ReadAllAvailable):
            plan = Limit(all_available=True)
        elif isinstance(limit, ReadMaxRows):
            plan = Limit(max_rows=limit.max_rows)
        elif isinstance(limit, ReadMinRows):
            plan = Limit(min_rows=limit.min_rows)
        else:
            plan = Limit()
        begin = offsets.from_json(start, "start offset")
        return offsets.to_json(self.planner.next_end(begin, plan))

    def reportLatestOffset(self) -> dict[str, Any]:
        return offsets.to_json(self.planner.latest())

    def prepareForTriggerAvailableNow(self) -> None:
        self.planner.prepare_available_now()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, stop = offsets.from_json(start, "start offset"), offsets.from_json(end, "end offset")
        return [Partition(group) for group in self.planner.packed(begin, stop)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.ctx)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the store keeps no consumer state (progress is the checkpoint's)."""


if sparkapi.has(sparkapi.ADMISSION_CONTROL):
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    # An ABC: registering the class is what inheriting would do (Spark asks isinstance), without
    # naming a base that PySpark 4.0 and 4.1 do not have.
    SupportsTriggerAvailableNow.register(RocketStoreStreamReader)


class PlainStreamReader(RocketStoreStreamReader):
    """``spark.readStream`` on PySpark 4.0 and 4.1, whose Python sources have no admission
    control: Spark asks ``latestOffset()`` with neither a start nor a limit, so each micro-batch
    reads everything published when it is planned. Data loss is still found, when the batch's
    partitions are planned (:meth:`Planner.ranges`). The per-trigger options are refused here
    rather than ignored: a query sized by them would silently read all at once."""

    def __init__(self, opts: Mapping[str, str], spark_schema: StructType) -> None:
        for name in options.STREAM_ONLY:  # all three are admission control
            if any(k.lower() == name.lower() for k in opts):
                sparkapi.require(sparkapi.ADMISSION_CONTROL, f"option {name}")
        super().__init__(opts, spark_schema)

    def latestOffset(self) -> dict[str, Any]:  # type: ignore[override]
        return offsets.to_json(self.planner.latest())


def stream_reader(opts: Mapping[str, str], spark_schema: StructType) -> RocketStoreStreamReader:
    """The stream reader the running PySpark can drive (docs/spark-versions.md)."""
    if sparkapi.has(sparkapi.ADMISSION_CONTROL):
        return RocketStoreStreamReader(opts, spark_schema)
    return PlainStreamReader(opts, spark_schema)


def spark_schema(opts: Mapping[str, str]) -> StructType:
    """The columns a read with ``opts`` produces: the default ones and those of its
    ``include*`` options (``body`` replaced by the topic's body columns for avro or json
    topics); checks the options on the driver."""
    parsed = options.parse(opts, streaming=None)
    _, body = schema.body_format_and_schema(parsed)
    return from_arrow_schema(schema.arrow_schema(body, parsed.optional_columns))
