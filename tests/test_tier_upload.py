"""The uploader (pipeline/tier/upload.py): which segments are sealed, and uploads to a real
radosgw checked from outside (another client reads the bucket; expected bytes and digests
are taken from the local files by the test itself)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline import Message, MessageStore
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.root import StoreRoot
from rocketstore.pipeline.errors import ManifestOwnerError, TierUnavailableError
from rocketstore.pipeline.files.localsegments import LocalSegments
from rocketstore.pipeline.files.topicmeta import TopicMeta
from rocketstore.pipeline.tier import localstate
from rocketstore.pipeline.tier.objects import ObjectStore
from rocketstore.pipeline.tier.upload import Uploader, sealed_bases

SEG = 64 * 1024
BLANK_MAGIC = 0xCBD43194 - (1 << 32)  # as a signed Java int


def base_config(**more: Any) -> StoreConfig:
    return StoreConfig(
        mapped_file_size_commitlog=SEG, max_hash_slot_num=64, max_index_num=512, **more
    )


def fill(store: Path, config: StoreConfig, n: int, start: int = 0) -> list[Any]:
    """``n`` messages over two topics, 3 queues each, ~1 KiB each; closed (flushed)."""
    with MessageStore(store, config) as s:
        return [
            s.put(
                Message(
                    f"T{k % 2}",
                    bytes([k % 251]) * (900 + k % 50),
                    queue_id=k % 3,
                    keys=[f"k{k}"],
                )
            )
            for k in range(start, start + n)
        ]


def data_end(path: Path) -> int:
    """Where the segment's records end: past its END_OF_FILE blank (walked here by size)."""
    raw = path.read_bytes()
    at = 0
    while True:
        size, magic = struct.unpack_from(">ii", raw, at)
        if magic == BLANK_MAGIC:
            return at + 8
        assert size > 0, f"{path}: no blank"
        at += size


def test_sealed_needs_a_later_segment_and_the_flushed_point(tmp_path: Path) -> None:
    for base in (0, SEG, 2 * SEG):
        (tmp_path / f"{base:020d}").write_bytes(b"\0" * SEG)
    segs = LocalSegments(tmp_path, segment_size=SEG)
    assert sealed_bases(segs, SEG, 0) == []
    assert sealed_bases(segs, SEG, SEG - 1) == []
    assert sealed_bases(segs, SEG, SEG) == [0]
    assert sealed_bases(segs, SEG, 5 * SEG) == [0, SEG]  # never the last


def test_upload_sealed_segments(ceph: Any, bucket: str, tmp_path: Path) -> None:
    store = tmp_path / "broker-a"
    config = base_config().with_overrides(ceph.settings(bucket, objectStorePrefix="pre/"))
    puts = fill(store, config, 200)
    local = sorted((store / "commitlog").iterdir())
    assert len(local) >= 3
    up = Uploader(store, config)
    started = time.time_ns() // 1_000_000
    report = up.run_once()
    ended = time.time_ns() // 1_000_000
    sealed = [int(p.name) for p in local[:-1]]
    assert report.uploaded == sealed
    assert report.pending == []
    end = sealed[-1] + SEG
    state = localstate.read(store)
    assert state is not None and (state.store_id, state.uploaded_end) == (up.state.store_id, end)
    assert started <= state.last_upload_ms <= ended
    assert (state.upload_errors, state.last_error_ms) == (0, 0)

    got = ceph.objects(bucket, "pre/broker-a/")
    # The record's figures of the bucket: its segment and index objects.
    assert state.bucket_segments == len(sealed)
    assert state.bucket_bytes == sum(len(v) for k, v in got.items() if "/manifest" not in k)
    manifest = json.loads(got["pre/broker-a/manifest.json"])
    assert manifest["storeId"] == up.state.store_id
    assert manifest["broker"] == "broker-a" and manifest["segmentSize"] == SEG
    assert manifest["generation"] == len(sealed)
    assert [s["base"] for s in manifest["segments"]] == sealed
    for path, entry in zip(local[:-1], manifest["segments"], strict=True):
        body = got[f"pre/broker-a/commitlog/{path.name}"]
        expect = path.read_bytes()[: data_end(path)]
        assert body == expect
        assert entry["length"] == len(expect)
        assert entry["sha256"] == hashlib.sha256(expect).hexdigest()
        index = got[f"pre/broker-a/index/{path.name}"]
        assert index[:4] == b"RSIX" and struct.unpack_from(">q", index, 8)[0] == int(path.name)
        assert entry["index"] == {"length": len(index), "sha256": hashlib.sha256(index).hexdigest()}
    # The records and the queues' next offsets at the tier's end, from the puts' results.
    below = [p for p in puts if p.commit_log_offset < end]
    assert sum(s["records"] for s in manifest["segments"]) == len(below)
    expect_queues: dict[str, dict[str, int]] = {}
    for k, p in enumerate(puts):
        if p.commit_log_offset < end:
            q = expect_queues.setdefault(f"T{k % 2}", {})
            q[str(k % 3)] = max(q.get(str(k % 3), 0), p.queue_offset + 1)
    assert manifest["queues"] == expect_queues
    stamps = [p.store_timestamp for p in below]
    assert manifest["segments"][0]["minStoreTimestamp"] == min(
        p.store_timestamp for p in below if p.commit_log_offset < sealed[0] + SEG
    )
    assert max(s["maxStoreTimestamp"] for s in manifest["segments"]) == max(stamps)

    # Nothing new: nothing sent. More puts seal more: only those go.
    assert Uploader(store, config).run_once().uploaded == []
    fill(store, config, 150, start=200)
    more = Uploader(store, config).run_once()
    now_local = sorted(int(p.name) for p in (store / "commitlog").iterdir())
    assert more.uploaded == [b for b in now_local[:-1] if b >= end]
    assert more.uploaded and localstate.read(store).uploaded_end == now_local[-1]  # type: ignore[union-attr]


def test_a_leftover_object_is_rewritten(ceph: Any, bucket: str, tmp_path: Path) -> None:
    """What a run killed mid-upload leaves (an object the manifest does not name, a multipart
    upload never completed) is not trusted: the next run writes the object again."""
    store = tmp_path / "b"
    config = base_config().with_overrides(ceph.settings(bucket))
    fill(store, config, 120)
    s3 = ceph.client()
    first = sorted((store / "commitlog").iterdir())[0]
    key = f"b/commitlog/{first.name}"
    s3.put_object(Bucket=bucket, Key=key, Body=b"half of a segment")
    s3.create_multipart_upload(Bucket=bucket, Key=f"b/commitlog/{SEG * 7:020d}")
    Uploader(store, config).run_once()
    assert ceph.objects(bucket, key)[key] == first.read_bytes()[: data_end(first)]
    assert s3.list_multipart_uploads(Bucket=bucket, Prefix="b/").get("Uploads", []) == []


def test_a_second_store_on_the_same_prefix_is_refused(
    ceph: Any, bucket: str, tmp_path: Path
) -> None:
    config = base_config().with_overrides(ceph.settings(bucket, brokerName="shared"))
    one, two = tmp_path / "one", tmp_path / "two"
    fill(one, config, 120)
    fill(two, config, 120)
    Uploader(one, config).run_once()
    before = ceph.objects(bucket, "shared/manifest.json")
    with pytest.raises(ManifestOwnerError, match="two stores never share a prefix") as caught:
        Uploader(two, config).run_once()
    assert localstate.read(one).store_id in str(caught.value)  # type: ignore[union-attr]
    assert ceph.objects(bucket, "shared/manifest.json") == before
    assert localstate.read(two).uploaded_end == 0  # type: ignore[union-attr]


def test_a_lost_race_leaves_one_copy(ceph: Any, bucket: str, tmp_path: Path) -> None:
    """Two uploaders of one store: both upload, the manifest names each segment once."""
    store = tmp_path / "b"
    config = base_config().with_overrides(ceph.settings(bucket))
    fill(store, config, 120)
    a, b = Uploader(store, config), Uploader(store, config)
    assert a.state.store_id == b.state.store_id
    a.run_once()
    assert b.run_once().uploaded == []  # it reads the manifest: nothing left
    manifest = a.manifest()
    assert manifest is not None
    bases = manifest.bases()
    assert bases == sorted(set(bases)) and manifest.generation == len(bases)
    assert dataclasses.replace(manifest) == b.manifest()


class CountingObjects(ObjectStore):
    """The real bucket, with the requests the catalog and the abort of leftovers make counted."""

    def __init__(self, config: StoreConfig) -> None:
        super().__init__(config)
        self.calls: list[str] = []
        self.fail_put: str | None = None  # a key whose next put fails

    def list(self, prefix: str, **kw: Any) -> list[tuple[str, int]]:
        if "/commitlog/" not in prefix and "/index/" not in prefix:  # not the tier's retention
            self.calls.append(f"list {prefix}")
        return super().list(prefix, **kw)

    def head(self, key: str) -> tuple[int, str] | None:
        if not key.endswith(tuple("0123456789")):
            self.calls.append(f"head {key}")
        return super().head(key)

    def put(self, key: str, body: bytes, **kw: Any) -> str:
        if key == self.fail_put:
            self.fail_put = None
            raise TierUnavailableError("the test's failure", self.bucket, key)
        if "/commitlog/" not in key and "/index/" not in key and "manifest" not in key:
            self.calls.append(f"put {key}")
        return super().put(key, body, **kw)

    def abort_uploads(self, prefix: str) -> int:
        self.calls.append("abort")
        return super().abort_uploads(prefix)

    def taken(self) -> list[str]:
        out, self.calls = self.calls, []
        return out


def test_a_following_uploader_asks_about_the_catalog_and_leftovers_once(
    ceph: Any, bucket: str, tmp_path: Path
) -> None:
    """The catalog (topics.json, schemas/) and the multipart uploads left open are looked at in
    the bucket at the first run; later runs put what changed in the root and ask nothing
    else, and a run that failed makes the next one look for leftovers again."""
    root = tmp_path / "root"
    root.mkdir()
    meta = StoreRoot(root)
    meta.register_schema("fp1", {"type": "record", "name": "a", "fields": []})
    meta.ensure_topic("T0", TopicMeta(1, 3))
    config = base_config().with_overrides(ceph.settings(bucket, objectStorePrefix="pre/"))
    store = root / "broker-0"
    fill(store, config, 200)
    objects = CountingObjects(config)
    uploader = Uploader(store, config, objects=objects)
    assert uploader.run_once().uploaded
    assert objects.taken() == [
        "abort", "list pre/schemas/", "put pre/schemas/fp1.json", "head pre/topics.json",
        "put pre/topics.json",
    ]  # fmt: skip
    fill(store, config, 200, start=200)
    assert uploader.run_once().uploaded
    assert objects.taken() == []
    meta.register_schema("fp2", {"type": "record", "name": "b", "fields": []})
    meta.ensure_topic("T1", TopicMeta(1, 3))
    uploader.run_once()
    assert objects.taken() == ["put pre/schemas/fp2.json", "put pre/topics.json"]
    got = ceph.objects(bucket, "pre/")
    assert got["pre/topics.json"] == (root / "topics.json").read_bytes()
    assert {k for k in got if k.startswith("pre/schemas/")} == {
        "pre/schemas/fp1.json",
        "pre/schemas/fp2.json",
    }

    meta.register_schema("fp3", {"type": "record", "name": "c", "fields": []})
    objects.fail_put = "pre/schemas/fp3.json"
    with pytest.raises(TierUnavailableError):
        uploader.run_once()
    objects.taken()
    uploader.run_once()
    assert objects.taken() == ["abort", "put pre/schemas/fp3.json"]
    # A new uploader (a new process) looks at the bucket again, and finds nothing to put.
    again = CountingObjects(config)
    Uploader(store, config, objects=again).run_once()
    assert again.taken() == ["abort", "list pre/schemas/", "head pre/topics.json"]
