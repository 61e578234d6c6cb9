"""The messages and geometries of the store tests across two GlusterFS mounts
(tests/test_gluster_store.py, tests/test_gluster_source.py), also imported by the writers
those tests run as processes of their own: message ``i`` is :func:`body` ``(i)`` in queue
``i % QUEUES`` with key ``k<i>``."""

from __future__ import annotations

import pyarrow as pa

from rocketstore.pipeline.config import StoreConfig

CONFIG = StoreConfig(
    mapped_file_size_commitlog=4 << 20,
    mapped_file_size_consume_queue=20 * 3000,
    max_hash_slot_num=5000,
    max_index_num=200_000,
)

# The readers check at two geometries. With 4 MiB segments a reader rarely meets a file that
# is newer than its host's listing of the directory; with these, the writer starts a CommitLog
# segment every ~300 messages, a ConsumeQueue file every 250 units of a queue and an IndexFile
# every 4,000 keys, so readers keep meeting published data in files their host has not listed.
SMALL_FILES = StoreConfig(
    mapped_file_size_commitlog=64 << 10,
    mapped_file_size_consume_queue=20 * 250,
    max_hash_slot_num=1000,
    max_index_num=8000,
)
GEOMETRIES = {"4MiB": CONFIG, "small-files": SMALL_FILES}
QUEUES = 4


def body(i: int) -> bytes:
    return f"m{i}:".encode() + b"x" * (i % 61)


def table(first: int, n: int) -> pa.Table:
    ids = range(first, first + n)
    return pa.table(
        {
            "topic": pa.array(["T"] * n, pa.string()),
            "body": pa.array([body(i) for i in ids], pa.binary()),
            "queueId": pa.array([i % QUEUES for i in ids], pa.int32()),
            "keys": pa.array([[f"k{i}"] for i in ids], pa.list_(pa.string())),
        }
    )
