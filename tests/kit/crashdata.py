"""The messages of the kill -9 writer (tests/procs/crash_writer.py), each derived from its
number ``seq`` alone (:func:`expected`), so that a checker tells a real message from anything
else, and the small geometry it writes with (:data:`GEOMETRY`): shared by the writer, the
crash test (tests/test_crash.py) and the fault tests that put the same messages."""

from __future__ import annotations

import dataclasses
import hashlib

import pyarrow as pa

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.format.message import Message

# Small geometry: 64 KiB CommitLog segments roll every few hundred messages; ConsumeQueue files of
# 100 units; index files of 499 entries.
GEOMETRY: dict[str, int] = {
    "mapped_file_size_commitlog": 64 * 1024,
    "mapped_file_size_consume_queue": 20 * 100,
    "max_hash_slot_num": 101,
    "max_index_num": 500,
}
TOPICS = ("CrashA", "CrashB", "CrashC")
QUEUES = 4
TAGS = ("TagA", "TagB", "TagC", "TagD", "TagE")
MAX_BODY = 700


def store_config(flush_disk_type: str) -> StoreConfig:
    return StoreConfig(
        flush_disk_type=flush_disk_type,
        mapped_file_size_commitlog=GEOMETRY["mapped_file_size_commitlog"],
        mapped_file_size_consume_queue=GEOMETRY["mapped_file_size_consume_queue"],
        max_hash_slot_num=GEOMETRY["max_hash_slot_num"],
        max_index_num=GEOMETRY["max_index_num"],
    )


@dataclasses.dataclass(frozen=True)
class Expected:
    """What message ``seq`` is: everything a put gives the store, derived from ``seq``."""

    seq: int
    topic: str
    queue_id: int
    body: bytes
    key: str
    tags: str
    uniq_key: str

    @property
    def properties(self) -> dict[str, str]:
        return {"seq": str(self.seq)}

    def message(self) -> Message:
        return Message(
            self.topic,
            self.body,
            queue_id=self.queue_id,
            keys=[self.key],
            tags=self.tags,
            properties=self.properties,
            uniq_key=self.uniq_key,
        )


def expected(seq: int) -> Expected:
    digest = hashlib.blake2b(seq.to_bytes(8, "big"), digest_size=32).digest()
    h = int.from_bytes(digest[:8], "big")
    length = 1 + (h >> 20) % MAX_BODY
    body = (digest * (length // len(digest) + 1))[:length]
    return Expected(
        seq=seq,
        topic=TOPICS[h % len(TOPICS)],
        queue_id=(h >> 8) % QUEUES,
        body=body,
        key=f"key-{seq}",
        tags=TAGS[(h >> 40) % len(TAGS)],
        uniq_key=f"C{seq:031X}",
    )


def batch_table(first: int, n: int) -> pa.Table:
    """Messages ``first .. first + n - 1`` as an Arrow table (the Spark sink's form)."""
    es = [expected(s) for s in range(first, first + n)]
    return pa.table(
        {
            "topic": pa.array([e.topic for e in es], pa.string()),
            "body": pa.array([e.body for e in es], pa.binary()),
            "queueId": pa.array([e.queue_id for e in es], pa.int32()),
            "keys": pa.array([[e.key] for e in es], pa.list_(pa.string())),
            "tags": pa.array([e.tags for e in es], pa.string()),
            "properties": pa.array(
                [list(e.properties.items()) for e in es], pa.map_(pa.string(), pa.string())
            ),
            "uniqKey": pa.array([e.uniq_key for e in es], pa.string()),
        }
    )
