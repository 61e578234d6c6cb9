"""A store whose oldest segments are only in the bucket, for the CLI's tests across both tiers
(tests/test_tier_cli_reads.py, tests/test_tier_verify.py): written with small segments,
uploaded by the uploader, then local retention run by ``rocketstore clean`` on segments made
to look long expired, so that the oldest segments are gone locally, some are in both tiers,
and the last (not sealed) is local only.

What the tests expect is taken from here: every message as it was put (:class:`Written`, from
the put results), and which segments each tier holds (the local directory's listing and the
bucket's, read by the test's own boto3 client).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import io
import json
import os
import time
from pathlib import Path
from typing import Any

from rocketstore.pipeline import cli
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.tier.upload import Uploader

SEG = 64 * 1024
PREFIX = "p/"  # objectStorePrefix; the store directory is broker-a
HOUR_S = 3600


@dataclasses.dataclass(frozen=True)
class Written:
    """One message as it was put, and where the put says it went."""

    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    size: int
    store_timestamp: int
    body: bytes
    key: str
    tags: str
    msg_id: str

    def fields(self) -> dict[str, Any]:
        """The fields of a ``dump`` / ``--json`` line these must match."""
        return {
            "topic": self.topic,
            "queueId": self.queue_id,
            "queueOffset": self.queue_offset,
            "commitLogOffset": self.commit_log_offset,
            "storeSize": self.size,
            "storeTimestamp": self.store_timestamp,
            "keys": self.key,
            "tags": self.tags,
            "msgId": self.msg_id,
            "body": base64.b64encode(self.body).decode(),
        }


@dataclasses.dataclass
class TieredStore:
    path: Path
    conf: Path
    bucket: str
    written: list[Written]
    tier_bases: list[int]  # segments the bucket holds
    local_bases: list[int]  # segments left on disk

    @property
    def prefix(self) -> str:
        return f"{PREFIX}{self.path.name}/"

    def key(self, kind: str, base: int) -> str:
        return f"{self.prefix}{kind}/{base:020d}"

    def queue(self, topic: str, queue_id: int) -> list[Written]:
        return [w for w in self.written if (w.topic, w.queue_id) == (topic, queue_id)]

    def queues(self) -> list[tuple[str, int]]:
        return sorted({(w.topic, w.queue_id) for w in self.written})

    def tier_only(self, w: Written) -> bool:
        return w.commit_log_offset < self.local_bases[0]

    def in_segment(self, base: int) -> list[Written]:
        return [w for w in self.written if base <= w.commit_log_offset < base + SEG]


def write_conf(path: Path, settings: dict[str, Any]) -> Path:
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
    return path


def settings(ceph: Any, bucket: str) -> dict[str, Any]:
    return {
        "mappedFileSizeCommitLog": SEG,
        "maxHashSlotNum": 1000,
        "maxIndexNum": 20000,
        **ceph.settings(bucket, objectStorePrefix=PREFIX),
    }


def make(
    ceph: Any, bucket: str, directory: Path, *, messages: int = 1200, keep: int = 3
) -> TieredStore:
    """The store (see the module docstring): ``messages`` over 4 queues of 2 topics, with
    ``keep`` segments left on disk (the last of them not sealed, so not in the tier)."""
    conf = write_conf(directory / "store.toml", settings(ceph, bucket))
    config = StoreConfig.load(conf)
    store = directory / "broker-a"
    written: list[Written] = []
    with MessageStore(store, config) as s:
        for k in range(messages):
            body = f"message {k} ".encode() * (20 + k % 17)
            topic, queue_id, tags = f"T{k % 2}", k % 4 // 2, f"tag{k % 3}"
            r = s.put(Message(topic, body, queue_id=queue_id, keys=[f"key{k}"], tags=tags))
            written.append(
                Written(
                    topic, queue_id, r.queue_offset, r.commit_log_offset, r.store_size,
                    r.store_timestamp, body, f"key{k}", tags, r.msg_id,
                )
            )  # fmt: skip
    assert Uploader(store, config).run_once().uploaded
    segments = sorted(p for p in (store / "commitlog").iterdir() if p.name.isdigit())
    old = time.time() - 1000 * HOUR_S  # past fileReservedTime: retention may delete them
    for p in segments:
        os.utime(p, (old, old))
    with contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(
            ["clean", str(store), "--config", str(conf), "--max-files", str(len(segments) - keep)]
        )
    assert rc == 0
    local = sorted(int(p.name) for p in (store / "commitlog").iterdir() if p.name.isdigit())
    assert len(local) == keep and local[-1] == int(segments[-1].name)
    s3 = ceph.client()
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"{PREFIX}broker-a/commitlog/")
    tier = sorted(int(o["Key"].rsplit("/", 1)[1]) for o in listed.get("Contents", ()))
    assert tier == [int(p.name) for p in segments[:-1]]
    return TieredStore(store, conf, bucket, written, tier, local)
