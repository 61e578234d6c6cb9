"""A store with thousands of small queues, built in about a second, for the tests that count
the work an operation does (files mapped, read, queues loaded) rather than time it.

The messages go round the queues (topic ``T00000`` .. , 4 queues each), so every queue holds
``per_queue`` units whose records are spread over the whole log, as in a store written by many
producers at once.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files.mappedfile import MappedFile

QUEUES_PER_TOPIC = 4
# ConsumeQueue files of RocketMQ's size (300,000 units), small CommitLog segments and IndexFiles
# so that a store is built and scanned in a second or two.
QUICK = StoreConfig(
    mapped_file_size_commitlog=256 << 10, max_hash_slot_num=1000, max_index_num=20_000
)


def table(topics: int, per_queue: int, start: int = 0) -> pa.Table:
    """``per_queue`` messages for each of ``topics`` x 4 queues, with a key each."""
    n = topics * QUEUES_PER_TOPIC * per_queue
    ids = np.arange(start, start + n)
    names = pa.array([f"T{i:05d}" for i in range(topics)])
    return pa.table(
        {
            "topic": pc.take(names, pa.array(ids % topics)),
            "body": pc.binary_join_element_wise("body-", pa.array(ids).cast(pa.string()), "").cast(
                pa.binary()
            ),
            "queueId": pa.array(((ids // topics) % QUEUES_PER_TOPIC).astype(np.int32)),
            "keys": pc.binary_join_element_wise("k-", pa.array(ids).cast(pa.string()), ""),
        }
    )


def build(path: Path, topics: int, per_queue: int, config: StoreConfig | None = None) -> Path:
    with MessageStore(path, config or StoreConfig(), background=False) as store:
        store.put_batch(table(topics, per_queue))
    return path


class FileReads:
    """Counts the reads of ConsumeQueue files (``pread`` through :class:`MappedFile`, and the
    bytes asked for) while installed: ``monkeypatch`` it over the class."""

    def __init__(self) -> None:
        self.calls = 0
        self.bytes = 0

    def install(self, setattr: Callable[[object, str, object], None]) -> None:
        read, read_into = MappedFile.read, MappedFile.read_into

        def counted_read(mf: MappedFile, position: int, n: int) -> bytes:
            self._count(mf, n)
            return read(mf, position, n)

        def counted_read_into(mf: MappedFile, position: int, out: memoryview) -> None:
            self._count(mf, out.nbytes)
            read_into(mf, position, out)

        setattr(MappedFile, "read", counted_read)
        setattr(MappedFile, "read_into", counted_read_into)

    def _count(self, mf: MappedFile, n: int) -> None:
        if "consumequeue" in mf.path.parts:
            self.calls += 1
            self.bytes += n
