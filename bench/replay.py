"""The source benchmark's floor: Python data sources that replay Arrow IPC files as they are.

Kept apart from :mod:`bench.spark_source` so that the processes Spark starts for them (the
streaming source's own Python process on the driver, the Python workers) import only pyarrow
and PySpark: the floor pays for nothing a minimal Python data source would not.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow


def read_file(path: str) -> Iterator[pa.RecordBatch]:
    """The record batches of one Arrow IPC file, memory-mapped, as they are."""
    with pa.memory_map(path) as source:
        reader = pa.ipc.open_file(source)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)


class ReplayDataSource(DataSource):
    """Yields Arrow IPC files' record batches as they are (option ``path``: their directory)."""

    @classmethod
    def name(cls) -> str:
        return "rocketstore_bench_replay"

    def schema(self) -> Any:
        from pyspark.sql.pandas.types import from_arrow_schema

        # The files' own schema: the source's default row, which wrote them.
        first = min(Path(str(self.options["path"])).glob("*.arrow"))
        with pa.memory_map(str(first)) as source:
            return from_arrow_schema(pa.ipc.open_file(source).schema)

    def reader(self, schema: Any) -> DataSourceReader:
        return ReplayReader(str(self.options["path"]))


class ReplayReader(DataSourceReader):
    def __init__(self, path: str) -> None:
        self.path = path

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(str(p)) for p in sorted(Path(self.path).glob("*.arrow"))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_file(partition.value)


class ReplayStreamDataSource(ReplayDataSource):
    """:class:`ReplayDataSource` as a streaming source: one micro-batch holding every file."""

    @classmethod
    def name(cls) -> str:
        return "rocketstore_bench_replay_stream"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return ReplayStreamReader(str(self.options["path"]))


class ReplayStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are file counts: the first micro-batch reads files ``[0, all)``."""

    def __init__(self, path: str) -> None:
        self.files = [str(p) for p in sorted(Path(path).glob("*.arrow"))]

    def initialOffset(self) -> dict[str, int]:
        return {"files": 0}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        return {"files": len(self.files)}

    def prepareForTriggerAvailableNow(self) -> None:
        pass  # every file is there from the start

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return [InputPartition(f) for f in self.files[start["files"] : end["files"]]]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_file(partition.value)

    def commit(self, end: dict[str, int]) -> None:
        pass
