"""The tier's own retention (pipeline/tier/retention.py, ``tieredStoreFileReservedTime``)
against a real radosgw: expired segments leave the manifest first, then the bucket; readers
holding an older manifest see ``SegmentGoneError`` for them and ``CorruptRecordError`` for an
object lost behind the tier's back; a run killed between its commit and its deletions leaves
objects the next run deletes; ``0`` keeps every segment. The clock is the uploader's
``clock_ms``, set hours ahead instead of waiting. What must expire is worked out here from the
puts' own results (each segment's newest store time), what the bucket holds is read by
another client."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline import cli
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.errors import CorruptRecordError, SegmentGoneError
from rocketstore.pipeline.tier import localstate
from rocketstore.pipeline.tier.manifest import tier_prefix
from rocketstore.pipeline.tier.objects import ObjectStore
from rocketstore.pipeline.tier.remote import RemoteQueue, RemoteSegments
from rocketstore.pipeline.tier.upload import Uploader
from tests.test_tier_upload import SEG, base_config, data_end, fill

HOUR_MS = 3_600_000


def newest_by_segment(puts: list[Any]) -> dict[int, int]:
    """Each segment's newest store time, from the puts' results."""
    out: dict[int, int] = {}
    for p in puts:
        base = p.commit_log_offset - p.commit_log_offset % SEG
        out[base] = max(out.get(base, 0), p.store_timestamp)
    return out


def expected_expired(newest: dict[int, int], named: list[int], hours: int, now: int) -> list[int]:
    """The leading run of ``named`` whose newest record is older than ``now`` - ``hours``."""
    out = []
    for base in named:
        if newest[base] >= now - hours * HOUR_MS:
            break
        out.append(base)
    return out


def manifest_doc(ceph: Any, bucket: str, prefix: str) -> dict[str, Any]:
    raw = ceph.client().get_object(Bucket=bucket, Key=f"{prefix}manifest.json")["Body"].read()
    doc: dict[str, Any] = json.loads(raw)
    return doc


def segment_keys(ceph: Any, bucket: str, prefix: str) -> set[str]:
    s3 = ceph.client()
    keys: set[str] = set()
    for folder in ("commitlog/", "index/"):
        got = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + folder).get("Contents", ())
        keys.update(o["Key"] for o in got)
    return keys


def keys_of(prefix: str, bases: list[int]) -> set[str]:
    return {f"{prefix}{f}/{b:020d}" for b in bases for f in ("commitlog", "index")}


def written(
    ceph: Any, bucket: str, tmp_path: Path, hours: int = 1
) -> tuple[Path, StoreConfig, list[Any], list[int]]:
    """A store of several sealed segments, uploaded (now, by the real clock)."""
    store = tmp_path / "broker-r"
    config = base_config(tiered_store_file_reserved_time=hours).with_overrides(
        ceph.settings(bucket)
    )
    puts = fill(store, config, 400)
    report = Uploader(store, config).run_once()
    assert len(report.uploaded) >= 4 and report.removed == []
    return store, config, puts, report.uploaded


def write_conf(ceph: Any, bucket: str, tmp_path: Path) -> Path:
    """The settings of :func:`written`'s store as a file, for the command line."""
    conf = tmp_path / "s.toml"
    settings = {
        "mappedFileSizeCommitLog": SEG,
        "maxHashSlotNum": 64,
        "maxIndexNum": 512,
        "tieredStoreFileReservedTime": 1,
        **ceph.settings(bucket),
    }
    conf.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
    return conf


@dataclasses.dataclass(frozen=True)
class Cut:
    """A store uploaded by :func:`written`, and a clock at which its segments up to the k-th
    are just over the reserved hour old: which expire (``gone``) and which stay (``kept``),
    worked out from the puts."""

    store: Path
    config: StoreConfig
    newest: dict[int, int]
    now: int
    gone: list[int]
    kept: list[int]


def cut(ceph: Any, bucket: str, tmp_path: Path, k: int) -> Cut:
    store, config, puts, named = written(ceph, bucket, tmp_path)
    newest = newest_by_segment(puts)
    now = newest[named[k]] + HOUR_MS + 1
    gone = expected_expired(newest, named, 1, now)
    assert gone and len(gone) < len(named), (newest, now)  # the cut falls between segments
    return Cut(store, config, newest, now, gone, named[len(gone) :])


def test_expired_segments_leave_the_manifest_then_the_bucket(
    ceph: Any, bucket: str, tmp_path: Path
) -> None:
    c = cut(ceph, bucket, tmp_path, 1)
    store, config, newest, now, gone, kept = c.store, c.config, c.newest, c.now, c.gone, c.kept
    before = manifest_doc(ceph, bucket, "broker-r/")

    report = Uploader(store, config, clock_ms=lambda: now).run_once()
    assert report.uploaded == [] and report.removed == gone
    after = manifest_doc(ceph, bucket, "broker-r/")
    assert [s["base"] for s in after["segments"]] == kept
    assert after["deleted"] == {"below": kept[0]} and report.deleted_below == kept[0]
    assert after["generation"] == before["generation"] + 1
    assert after["queues"] == before["queues"]  # the tier's end did not move
    assert segment_keys(ceph, bucket, "broker-r/") == keys_of("broker-r/", kept)
    # The record monitoring reads follows the removal, counted from the bucket's listing.
    record = localstate.read(store)
    assert record is not None and record.bucket_segments == len(kept)
    listed = ceph.objects(bucket, "broker-r/")
    assert record.bucket_bytes == sum(
        len(v) for k, v in listed.items() if "/commitlog/" in k or "/index/" in k
    )
    # What stays is whole: the local files' bytes.
    objects = ceph.objects(bucket, "broker-r/commitlog/")
    for base in kept:
        path = store / "commitlog" / f"{base:020d}"
        assert objects[f"broker-r/commitlog/{base:020d}"] == path.read_bytes()[: data_end(path)]

    # The next round, later still, removes the rest; uploads go on after the gap left.
    later = max(newest.values()) + HOUR_MS + 1
    again = Uploader(store, config, clock_ms=lambda: later).run_once()
    assert again.removed == kept and again.deleted_below == kept[-1] + SEG
    final = manifest_doc(ceph, bucket, "broker-r/")
    assert final["segments"] == [] and final["deleted"] == {"below": kept[-1] + SEG}
    assert segment_keys(ceph, bucket, "broker-r/") == set()
    fill(store, config, 200, start=400)
    up = Uploader(store, config).run_once()
    local = sorted(int(p.name) for p in (store / "commitlog").iterdir())
    assert up.uploaded == [b for b in local[:-1] if b >= kept[-1] + SEG] and up.uploaded
    assert manifest_doc(ceph, bucket, "broker-r/")["segments"][0]["base"] == kept[-1] + SEG


def test_zero_hours_keeps_every_segment(ceph: Any, bucket: str, tmp_path: Path) -> None:
    store, config, puts, named = written(ceph, bucket, tmp_path, hours=0)
    before = manifest_doc(ceph, bucket, "broker-r/")
    far = max(p.store_timestamp for p in puts) + 10 * 365 * 24 * HOUR_MS
    report = Uploader(store, config, clock_ms=lambda: far).run_once()
    assert report.removed == [] and report.deleted_below == 0
    assert manifest_doc(ceph, bucket, "broker-r/") == before
    assert segment_keys(ceph, bucket, "broker-r/") == keys_of("broker-r/", named)


def test_readers_with_an_older_manifest_see_retention_not_damage(
    ceph: Any, bucket: str, tmp_path: Path
) -> None:
    c = cut(ceph, bucket, tmp_path, 1)
    store, config, now, gone, kept = c.store, c.config, c.now, c.gone, c.kept
    named = gone + kept
    objects = ObjectStore(config)
    prefix = tier_prefix(store, config)
    old = RemoteSegments(objects, prefix, name=f"s3://{bucket}/", read_ahead=4096)
    assert old.listed() == named
    seg0 = old.open(gone[0])
    first = store / "commitlog" / f"{gone[0]:020d}"
    assert seg0.read(0, 100) == first.read_bytes()[:100]
    original = old.manifest

    up = Uploader(store, config, clock_ms=lambda: now)
    manifest, removed = up.retention.commit_expired()
    assert removed == gone and manifest is not None and manifest.deleted_below == kept[0]
    # Committed, not deleted yet: the old reader still reads; a new one sees the tier's start.
    assert seg0.read(8192, 100) == first.read_bytes()[8192:8292]
    new = RemoteSegments(objects, prefix, name=f"s3://{bucket}/")
    assert new.listed() == kept
    with pytest.raises(SegmentGoneError, match="not in the tier"):
        new.open(gone[0])

    up.retention.sweep(manifest.deleted_below)
    assert segment_keys(ceph, bucket, prefix) == keys_of(prefix, kept)
    with pytest.raises(SegmentGoneError, match=f"deleted.below is now {kept[0]}"):
        seg0.read(20_000, 100)  # outside its window: a GET of an object now gone
    # A reader that took the manifest before and fetches a removed segment's index head.
    old2 = RemoteSegments(objects, prefix, name=f"s3://{bucket}/", manifest=original)
    with pytest.raises(SegmentGoneError, match="removed by the tier's retention"):
        RemoteQueue(old2, "T0", 0).min_offset()
    # A new reader's queue reads what is kept.
    last = RemoteQueue(new, "T0", 0).max_offset()
    assert last is not None and RemoteQueue(new, "T0", 0).units(0, last).size > 0

    # An object the manifest still names, gone from the bucket behind the tier's back: damage.
    key = f"{prefix}commitlog/{kept[0]:020d}"
    ceph.client().delete_object(Bucket=bucket, Key=key)
    fresh = RemoteSegments(objects, prefix, name=f"s3://{bucket}/")
    with pytest.raises(CorruptRecordError, match="named by the manifest") as caught:
        fresh.read(kept[0], 0, 64)
    assert caught.value.path == f"s3://{bucket}/{key}"
    assert not isinstance(caught.value, SegmentGoneError)


def test_a_run_killed_between_commit_and_delete_is_cleaned_by_the_next(
    ceph: Any, bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = cut(ceph, bucket, tmp_path, 2)
    store, config, now, gone, kept = c.store, c.config, c.now, c.gone, c.kept
    named = gone + kept
    killed = Uploader(store, config, clock_ms=lambda: now)
    _, removed = killed.retention.commit_expired()  # and then it died
    assert removed == gone
    assert segment_keys(ceph, bucket, "broker-r/") == keys_of("broker-r/", named)

    # tier status: the removed segments' objects are leftovers, and deleted.below says why.
    conf = write_conf(ceph, bucket, tmp_path)
    assert cli.main(["tier", "status", str(store), "--config", str(conf), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["tier"]["deletedBelow"] == kept[0]
    assert set(status["tier"]["leftovers"]) == keys_of("broker-r/", gone)

    # The next run (a new process: a new uploader) deletes them; nothing more is removed.
    report = Uploader(store, config, clock_ms=lambda: now).run_once()
    assert report.removed == [] and report.deleted_below == kept[0]
    assert segment_keys(ceph, bucket, "broker-r/") == keys_of("broker-r/", kept)
    assert [s["base"] for s in manifest_doc(ceph, bucket, "broker-r/")["segments"]] == kept


def test_tier_clean_and_status_show_it(
    ceph: Any,
    bucket: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = cut(ceph, bucket, tmp_path, 0)
    store, now, gone, kept = c.store, c.now, c.gone, c.kept
    conf = write_conf(ceph, bucket, tmp_path)
    argv = ["tier", "clean", str(store), "--config", str(conf)]
    # By the real clock nothing is an hour old yet.
    assert cli.main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["removed"] == [] and doc["deleted"] == [] and doc["deletedBelow"] == 0
    # The command's clock, an hour on (its module's time: boto3 signs with its own).
    monkeypatch.setattr(
        "rocketstore.pipeline.tools.tier.time", types.SimpleNamespace(time_ns=lambda: now * 10**6)
    )
    before = segment_keys(ceph, bucket, "broker-r/")
    assert cli.main([*argv, "--dry-run", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["dryRun"] and doc["removed"] == gone and doc["deletedBelow"] == kept[0]
    assert set(doc["deleted"]) == keys_of("broker-r/", gone)
    assert segment_keys(ceph, bucket, "broker-r/") == before  # changed nothing
    assert manifest_doc(ceph, bucket, "broker-r/")["deleted"] == {"below": 0}

    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert f"removed {len(gone)} segments" in out and f"deleted.below {kept[0]}" in out
    assert segment_keys(ceph, bucket, "broker-r/") == keys_of("broker-r/", kept)
    assert cli.main(["tier", "status", str(store), "--config", str(conf), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["tier"]["deletedBelow"] == kept[0] and status["tier"]["start"] == kept[0]
    assert status["tier"]["leftovers"] == [] and status["pending"]["segments"] == 0
    assert cli.main(["tier", "status", str(store), "--config", str(conf)]) == 0
    assert f"deleted.below {kept[0]}" in capsys.readouterr().out
