"""Rows one sink writer appends to one broker without Spark (rocketstore.sink.append), and the
bodies the broker holds afterwards: shared by the append tests and the streamed-append tests."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.sink.append import sink_fingerprint

CONFIG = StoreConfig(mapped_file_size_commitlog=1 << 16, max_hash_slot_num=512, max_index_num=4096)
FP = sink_fingerprint("query-1")


def rows(n: int, start: int = 0, topic: str = "orders") -> pa.Table:
    return pa.table(
        {
            "topic": [topic] * n,
            "body": [b"body-%d" % i for i in range(start, start + n)],
            "queueId": pa.array([i % 3 for i in range(n)], pa.int32()),
            "keys": [[f"k{i}"] for i in range(start, start + n)],
        }
    )


def stored(path: Path, topic: str = "orders") -> list[bytes]:
    """Every body of ``topic``, in CommitLog order."""
    with MessageStore(path, CONFIG, read_only=True) as s:
        found = []
        for info in s.queue_infos(topic):
            got = s.get_messages(topic, info.queue_id, 0, 10_000).messages
            found += [(m.commit_log_offset, m.body) for m in got]
    return [b for _, b in sorted(found)]
