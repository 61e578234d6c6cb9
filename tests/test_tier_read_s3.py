"""The tier's read side against a real radosgw (the session's Ceph, tests/kit/ceph.py): a
store's sealed segments uploaded by the uploader (pipeline/tier/upload.py), then read back
through the S3 face (pipeline/tier/objects.py) with RemoteSegments, RemoteQueue, key look-ups
and the source's partition read. What they must give is taken from the local files: the
segment files' bytes, and each queue read by the source's local read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from rocketstore.pipeline import Message, MessageStore
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.tier.manifest import tier_prefix
from rocketstore.pipeline.tier.objects import ObjectStore
from rocketstore.pipeline.tier.remote import RemoteQueue, RemoteSegments
from rocketstore.pipeline.tier.upload import Uploader
from rocketstore.source import schema
from rocketstore.source.planning import QueueRange
from rocketstore.source.read import ReadContext, read_queue_range
from rocketstore.source.tierread import read_tier_range

SEG = 64 * 1024


def test_uploaded_segments_read_back_as_the_local_files(
    ceph: Any, bucket: str, tmp_path: Path
) -> None:
    store = tmp_path / "broker-a"
    config = StoreConfig(
        mapped_file_size_commitlog=SEG, max_hash_slot_num=64, max_index_num=512
    ).with_overrides(ceph.settings(bucket, objectStorePrefix="pre/"))
    with MessageStore(store, config) as s:
        puts = [
            s.put(Message(f"T{k % 2}", bytes([k % 251]) * (300 + k % 50), queue_id=k % 3,
                          keys=[f"k{k}"], tags=f"tag{k % 4}"))
            for k in range(600)
        ]  # fmt: skip
    assert Uploader(store, config).run_once().uploaded
    tier = RemoteSegments(ObjectStore(config), tier_prefix(store, config), name=f"s3://{bucket}/")
    local = sorted((store / "commitlog").iterdir())
    sealed = [int(p.name) for p in local[:-1]]
    assert tier.listed() == sealed and tier.file_size() == SEG

    for path in local[:-1]:
        raw = path.read_bytes()
        seg = tier.open(int(path.name))
        n = seg.data_end()
        assert bytes(seg.buffer) == raw[:n]
        # Past the object (the blank's end): zeros, as the local file's are.
        at, want = n - 100, min(200, SEG - n + 100)
        assert seg.read(at, want) == raw[at:n] + bytes(want - 100)
        seg.close()

    ctx = ReadContext(
        schema=schema.arrow_schema(None), root=str(tmp_path), sub_expression="tag1 || tag2"
    )
    for topic in ("T0", "T1"):
        for queue_id in range(3):
            q = RemoteQueue(tier, topic, queue_id)
            lo, hi = q.min_offset(), q.max_offset()
            assert lo == 0 and hi is not None and hi > 10
            rng = QueueRange(topic, "broker-a", str(store), queue_id, lo, hi)
            got = pa.Table.from_batches(list(read_tier_range(rng, ctx, tier)), ctx.schema)
            want = pa.Table.from_batches(list(read_queue_range(rng, ctx)), ctx.schema)
            assert got.num_rows > 0 and got.equals(want)

    tier_end = tier.end()
    for k in (0, 1, 257):
        found = tier.query_key(f"T{k % 2}", f"k{k}")
        assert puts[k].commit_log_offset < tier_end
        assert [m.commit_log_offset for m in found] == [puts[k].commit_log_offset]
    assert tier.query_key("T0", "k1") == []  # k1 is T1's
