"""Shared helpers of the sink tests: sample input and an engine-side read-back of a root."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.root import StoreRoot
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format.bodyformat import SCHEMA_PROPERTY

# Small segments so that tests roll files; the same settings go to the sink as options.
STORE_OPTIONS = {
    "mappedFileSizeCommitLog": str(1 << 20),
    "maxHashSlotNum": "4096",
    "maxIndexNum": "65536",
}
CONFIG = StoreConfig(
    mapped_file_size_commitlog=1 << 20, max_hash_slot_num=4096, max_index_num=65536
)
TAGS = ["TagA", "TagB", "TagC"]


def order_rows(start: int, n: int) -> list[dict[str, Any]]:
    """Rows with every sink column; ``id`` orders one customer's rows."""
    return [
        {
            "id": i,
            "keys": f"customer-{i % 23}",
            "tags": TAGS[i % 3] if i % 7 else None,
            "properties": {"source": "test", "n": str(i)} if i % 5 else None,
            "flag": i % 4,
            "body": f"order {i}".encode(),
        }
        for i in range(start, start + n)
    ]


INPUT_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("keys", pa.string()),
        ("tags", pa.string()),
        ("properties", pa.map_(pa.string(), pa.string())),
        ("flag", pa.int32()),
        ("body", pa.binary()),
    ]
)


# INPUT_SCHEMA as Spark DDL: how the sink tests' queries read the input files.
INPUT_DDL = (
    "id long, keys string, tags string, properties map<string,string>, flag int, body binary"
)


def write_input(folder: Path, files: int, rows_per_file: int) -> list[dict[str, Any]]:
    """Parquet files ``part-00000.parquet``... and the rows they hold, in order."""
    folder.mkdir(parents=True, exist_ok=True)
    everything = []
    # Spark's file source takes new files oldest first, and files written within one
    # millisecond tie: a second apart, they are taken in the order of their rows.
    t0 = time.time() - 3600
    for f in range(files):
        rows = order_rows(f * rows_per_file, rows_per_file)
        path = folder / f"part-{f:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, INPUT_SCHEMA), path)
        os.utime(path, (t0 + f, t0 + f))
        everything += rows
    return everything


def read_back(root: Path, topic: str) -> list[dict[str, Any]]:
    """Every message of ``topic`` in every broker, with where it is stored."""
    out = []
    for name, path in StoreRoot(root).brokers():
        with MessageStore(path, CONFIG, read_only=True) as store:
            for info in store.queue_infos(topic):
                offset = info.min_offset
                while offset < info.max_offset:
                    got = store.get_messages(topic, info.queue_id, offset, 1000).messages
                    assert got, f"{name} queue {info.queue_id}: nothing at offset {offset}"
                    for m in got:
                        props = {
                            k: v
                            for k, v in m.properties.items()
                            if k not in ("KEYS", "TAGS", "UNIQ_KEY", "WAIT")
                        }
                        out.append(
                            {
                                "broker": name,
                                "queueId": m.queue_id,
                                "queueOffset": m.queue_offset,
                                "keys": " ".join(m.keys) or None,
                                "tags": m.properties.get("TAGS"),
                                "properties": props,
                                "flag": m.flag,
                                "body": m.body,
                                "uniqKey": m.uniq_key,
                                "msgId": m.msg_id,
                                "schema": props.pop(SCHEMA_PROPERTY, None),
                            }
                        )
                    offset = got[-1].queue_offset + 1
    return out
