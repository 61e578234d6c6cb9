"""Several sealed segments uploaded at once (``tieredStoreUploadThreads``) against a real
radosgw: the objects of later segments may be in the bucket before an earlier one's, but the
manifest names a segment only once every segment below it is named; a segment that fails
leaves the ones above it as objects no manifest names, which the next run rewrites. The
segment index builder is the seam where a test holds a segment back or fails it; what the
bucket holds is read by another client and compared with the local files."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline.errors import TierError
from rocketstore.pipeline.format.segmentindex import build_segment_index
from rocketstore.pipeline.tier import localstate
from rocketstore.pipeline.tier.upload import Uploader
from tests.test_tier_upload import SEG, base_config, data_end, fill


def poll(cond: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while not (got := cond()):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {seconds} s for {what}")
        time.sleep(0.02)
    return got


def has_object(ceph: Any, bucket: str, key: str) -> bool:
    try:
        ceph.client().head_object(Bucket=bucket, Key=key)
    except Exception:
        return False
    return True


def named(ceph: Any, bucket: str, prefix: str) -> list[int] | None:
    """The bases the manifest names; None when there is no manifest."""
    try:
        raw = ceph.client().get_object(Bucket=bucket, Key=f"{prefix}manifest.json")["Body"].read()
    except Exception:
        return None
    return [s["base"] for s in json.loads(raw)["segments"]]


def check_whole(ceph: Any, bucket: str, prefix: str, store: Path, bases: list[int]) -> None:
    got = ceph.objects(bucket, f"{prefix}commitlog/")
    for base in bases:
        path = store / "commitlog" / f"{base:020d}"
        assert got[f"{prefix}commitlog/{base:020d}"] == path.read_bytes()[: data_end(path)]


def test_later_segments_sent_first_are_named_in_order(
    ceph: Any, bucket: str, tmp_path: Path
) -> None:
    store = tmp_path / "p"
    config = base_config(tiered_store_upload_threads=4).with_overrides(ceph.settings(bucket))
    fill(store, config, 400)
    sealed = [int(p.name) for p in sorted((store / "commitlog").iterdir())[:-1]]
    assert len(sealed) >= 5
    seen: list[list[int] | None] = []

    def held_back(buffer: Any, base: int, n: int) -> bytes:
        if base == sealed[0]:
            # The first segment waits until the fourth is in the bucket: nothing may be named.
            poll(
                lambda: has_object(ceph, bucket, f"p/commitlog/{sealed[3]:020d}"),
                120,
                "the fourth segment sent while the first is held back",
            )
            seen.append(named(ceph, bucket, "p/"))
        return build_segment_index(buffer, base, n)

    report = Uploader(store, config, build_index=held_back).run_once()
    assert seen == [None]  # three later segments sent, none of them named before the first
    assert report.uploaded == sealed and report.pending == []
    assert named(ceph, bucket, "p/") == sealed
    check_whole(ceph, bucket, "p/", store, sealed)


def test_a_failed_segment_leaves_no_gap_and_the_next_run_completes(
    ceph: Any, bucket: str, tmp_path: Path
) -> None:
    store = tmp_path / "f"
    config = base_config(tiered_store_upload_threads=4).with_overrides(ceph.settings(bucket))
    fill(store, config, 400)
    sealed = [int(p.name) for p in sorted((store / "commitlog").iterdir())[:-1]]
    assert len(sealed) >= 5
    bad = sealed[2]

    def failing(buffer: Any, base: int, n: int) -> bytes:
        if base == bad:
            poll(
                lambda: has_object(ceph, bucket, f"f/commitlog/{sealed[3]:020d}"),
                120,
                "the segment above the failing one sent",
            )
            raise TierError(f"injected failure of segment {base}")
        return build_segment_index(buffer, base, n)

    with pytest.raises(TierError, match=f"injected failure of segment {bad}"):
        Uploader(store, config, build_index=failing).run_once()
    assert named(ceph, bucket, "f/") == sealed[:2]
    assert localstate.uploaded_end(store) == bad
    # The segment above it was sent whole but is not part of the tier.
    assert has_object(ceph, bucket, f"f/commitlog/{sealed[3]:020d}")

    report = Uploader(store, config).run_once()
    assert report.uploaded == sealed[2:]
    assert named(ceph, bucket, "f/") == sealed
    assert localstate.uploaded_end(store) == sealed[-1] + SEG
    check_whole(ceph, bucket, "f/", store, sealed)


@pytest.mark.parametrize("threads", [1, 3])
def test_any_thread_count_uploads_the_same_tier(
    ceph: Any, bucket: str, tmp_path: Path, threads: int
) -> None:
    store = tmp_path / "n"
    config = base_config(tiered_store_upload_threads=threads).with_overrides(ceph.settings(bucket))
    fill(store, config, 300)
    sealed = [int(p.name) for p in sorted((store / "commitlog").iterdir())[:-1]]
    report = Uploader(store, config).run_once()
    assert report.uploaded == sealed
    assert named(ceph, bucket, "n/") == sealed
    check_whole(ceph, bucket, "n/", store, sealed)
