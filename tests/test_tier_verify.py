"""``rocketstore verify`` of the tier against a real radosgw (issue 41): the bucket's objects of
a store whose oldest segments are only there (tests/kit/tierstore.py), clean, then damaged
behind the tier's back with the test's own boto3 client: an object deleted, a segment
overwritten, an index object corrupted, the manifest broken or cut short. Each problem must
name the object and the offset the test damaged (taken from the messages as put and the bytes
it changed), and the exit status must be 1."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline import cli
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.format.segmentindex import build_segment_index
from rocketstore.pipeline.tier.objects import ObjectStore
from rocketstore.pipeline.tier.remote import RemoteSegments
from rocketstore.pipeline.tier.upload import Uploader
from rocketstore.pipeline.tools.verify.report import VerifyReport
from rocketstore.pipeline.tools.verify.tier import verify_tier
from tests.kit import tierstore
from tests.kit.tierstore import SEG, TieredStore

# What `verify --json` printed before the tier was checked: these stay, as they were.
V1_FIELDS = {
    "store", "ok", "counters", "seconds", "problemsSuppressed", "snapshotEnd", "restarts",
    "problems",
}  # fmt: skip


@pytest.fixture
def tiered(ceph: Any, bucket: str, tmp_path: Path) -> TieredStore:
    return tierstore.make(ceph, bucket, tmp_path)


def verify(t: TieredStore, *more: object) -> tuple[int, dict[str, Any]]:
    """``verify --json`` in a process of its own, which must end within two minutes."""
    command = [sys.executable, "-m", "rocketstore.pipeline.cli", "verify", str(t.path)]
    command += ["--config", str(t.conf), "--json", *map(str, more)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def problems(report: dict[str, Any]) -> set[tuple[str, str, int]]:
    return {(p["kind"], p["path"], p["offset"]) for p in report["problems"]}


def get(ceph: Any, t: TieredStore, key: str) -> bytearray:
    return bytearray(ceph.client().get_object(Bucket=t.bucket, Key=key)["Body"].read())


def put(ceph: Any, t: TieredStore, key: str, body: bytes) -> None:
    ceph.client().put_object(Bucket=t.bucket, Key=key, Body=body)


def test_a_whole_tier_verifies_and_says_what_it_read(
    ceph: Any, tiered: TieredStore, capsys: pytest.CaptureFixture[str]
) -> None:
    t = tiered
    rc, report = verify(t)
    assert rc == 0 and report["ok"] and report["problems"] == [], report["problems"]
    assert set(report) >= V1_FIELDS
    objects = ceph.objects(t.bucket, t.prefix)
    segments = [objects[t.key("commitlog", b)] for b in t.tier_bases]
    indexes = [objects[t.key("index", b)] for b in t.tier_bases]
    in_tier = [w for w in t.written if w.commit_log_offset < t.tier_bases[-1] + SEG]
    assert report["tier"] == {
        "bucket": f"s3://{t.bucket}/",
        "segments": len(t.tier_bases),
        "bytes": sum(map(len, segments)),
        "records": len(in_tier),
        "indexObjects": len(t.tier_bases),
        "indexBytes": sum(map(len, indexes)),
        "retired": 0,
    }
    # The local files' counters are the local files' alone.
    assert report["counters"]["records"] == sum(not t.tier_only(w) for w in t.written)

    rc, report = verify(t, "--no-tier")
    assert rc == 0 and report["tier"] is None
    assert cli.main(["verify", str(t.path), "--config", str(t.conf)]) == 0
    out = capsys.readouterr().out
    assert f"tier s3://{t.bucket}/: {len(t.tier_bases)} segments" in out


def test_tier_asked_for_with_the_tier_off_is_a_usage_error(
    tiered: TieredStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    off = tierstore.write_conf(tmp_path / "off.toml", {"mappedFileSizeCommitLog": SEG})
    assert cli.main(["verify", str(tiered.path), "--config", str(off), "--tier"]) == 2
    assert "option --tier" in capsys.readouterr().err


def test_deleted_objects_are_named(ceph: Any, tiered: TieredStore) -> None:
    t = tiered
    seg, idx = t.tier_bases[2], t.tier_bases[4]
    s3 = ceph.client()
    s3.delete_object(Bucket=t.bucket, Key=t.key("commitlog", seg))
    s3.delete_object(Bucket=t.bucket, Key=t.key("index", idx))
    metrics = t.path.parent / "verify.prom"
    rc, report = verify(t, "--metrics", metrics)
    assert rc == 1 and not report["ok"]
    # The textfile for Prometheus counts the bucket's problems as the local ones.
    text = metrics.read_text()
    assert 'rocketstore_verify_problems{broker="broker-a"} 2.0' in text, text
    assert 'rocketstore_verify_ok{broker="broker-a"} 0.0' in text, text
    url = f"s3://{t.bucket}/"
    assert problems(report) == {
        ("tier-object-missing", url + t.key("commitlog", seg), seg),
        ("tier-object-missing", url + t.key("index", idx), 0),
    }


def test_a_segment_overwritten_is_named_at_its_record_and_byte(
    ceph: Any, tiered: TieredStore
) -> None:
    t = tiered
    url = f"s3://{t.bucket}/"
    only = t.tier_bases[1]  # no local copy
    both = t.local_bases[0]  # still on disk too
    assert both in t.tier_bases and only not in t.local_bases
    want = set()
    for base, n in ((only, 3), (both, 7)):
        key = t.key("commitlog", base)
        body = get(ceph, t, key)
        victim = t.in_segment(base)[n]
        at = body.index(victim.body, victim.commit_log_offset - base) + 1  # in its body
        body[at] ^= 0x20
        put(ceph, t, key, bytes(body))
        want.add(("tier-record", url + key, victim.commit_log_offset))
        # Where it differs is known only where a local copy is left to compare.
        want.add(("tier-object-sha256", url + key, base + (at if base == both else 0)))
    short = t.tier_bases[3]
    key = t.key("commitlog", short)
    put(ceph, t, key, bytes(get(ceph, t, key)[:1000]))
    want.add(("tier-object-length", url + key, short + 1000))
    rc, report = verify(t)
    assert rc == 1
    assert problems(report) == want
    crc = [p for p in report["problems"] if p["kind"] == "tier-record"]
    assert all("CRC" in p["detail"] for p in crc), crc


def test_a_corrupted_index_object_is_named_at_the_byte(ceph: Any, tiered: TieredStore) -> None:
    t = tiered
    url = f"s3://{t.bucket}/"
    units_base, head_base = t.tier_bases[0], t.tier_bases[5]
    key = t.key("index", units_base)
    body = get(ceph, t, key)
    units_start = int.from_bytes(body[64 + 24 : 64 + 32], "big")  # the first queue row's
    at = units_start + 28 * 3 + 9  # the fourth unit's size: no head CRC covers it
    body[at] ^= 0x01
    put(ceph, t, key, bytes(body))
    head_key = t.key("index", head_base)
    head = get(ceph, t, head_key)
    head[64 + 12] ^= 0x01  # the first queue row's unit count: the head's CRC covers it
    put(ceph, t, head_key, bytes(head))
    rc, report = verify(t)
    assert rc == 1
    got = problems(report)
    for k, b in ((key, at), (head_key, 64 + 12)):
        assert ("tier-index", url + k, b) in got  # differs from the rebuilt index there
        assert ("tier-index", url + k, 56) in got  # the CRC of bytes 64..
        assert ("tier-object-sha256", url + k, b) in got
    head_problems = {p for p in got if p[1] == url + head_key} - {
        ("tier-index", url + head_key, b) for b in (56, 64 + 12)
    }
    # The head's own check, as a reader fetching it makes it, says so too.
    assert ("tier-index", url + head_key, 60) in head_problems
    assert {p[1] for p in got} == {url + key, url + head_key}


def test_a_broken_manifest_and_a_gap_between_the_tiers(ceph: Any, tiered: TieredStore) -> None:
    t = tiered
    url = f"s3://{t.bucket}/"
    key = f"{t.prefix}manifest.json"
    good = get(ceph, t, key)
    doc = json.loads(good)
    doc["segments"] = doc["segments"][:3]  # the tier now ends three segments in
    put(ceph, t, key, json.dumps(doc).encode())
    rc, report = verify(t)
    end = t.tier_bases[2] + SEG
    record = str(t.path / "config" / "rocketstore-tier.json")
    # The store's record says more is uploaded than this manifest holds: that too.
    assert rc == 1 and problems(report) == {
        ("tier-gap", url + key, end),
        ("tier-local-state", record, 0),
    }
    [gap] = [p for p in report["problems"] if p["kind"] == "tier-gap"]
    assert f"[{end}, {t.local_bases[0]})" in gap["detail"]

    put(ceph, t, key, bytes(good[: len(good) // 2]))
    rc, report = verify(t)
    assert rc == 1 and problems(report) == {("tier-manifest", url + key, 0)}
    assert "not JSON" in report["problems"][0]["detail"]


def test_the_stores_record_of_its_tier_is_checked_against_the_manifest(
    tiered: TieredStore,
) -> None:
    t = tiered
    path = t.path / "config" / "rocketstore-tier.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "storeId": "f" * 32}))
    rc, report = verify(t)
    assert rc == 1 and problems(report) == {("tier-local-state", str(path), 0)}
    assert "f" * 32 in report["problems"][0]["detail"]
    # Claiming more uploaded than the bucket holds: local retention would delete too much.
    past = t.tier_bases[-1] + 2 * SEG
    path.write_text(json.dumps({**record, "uploadedEnd": past}))
    rc, report = verify(t)
    assert rc == 1 and problems(report) == {("tier-local-state", str(path), 0)}
    assert f"uploadedEnd {past}" in report["problems"][0]["detail"]
    path.write_text(json.dumps(record))
    rc, report = verify(t)
    assert rc == 0 and report["problems"] == []


def test_segments_the_tiers_retention_removes_during_the_run_are_not_damage(
    tiered: TieredStore,
) -> None:
    """The tier's retention runs while verify is between two segments (its progress callback):
    the segments it removed are counted as retired, and nothing is a problem."""
    t = tiered
    config = StoreConfig.load(t.conf)
    later = max(w.store_timestamp for w in t.written) + 100 * 3_600_000

    def retention_once(done: int, _total: int) -> None:
        if done == 1:
            assert Uploader(t.path, config, clock_ms=lambda: later).run_once().removed

    report = VerifyReport(str(t.path))
    counts = verify_tier(t.path, config, report, progress=retention_once)
    assert report.problems == []
    assert counts.segments == 1 and counts.retired == len(t.tier_bases) - 1


def test_index_objects_of_version_1_verify_and_answer_key_look_ups(
    ceph: Any, tiered: TieredStore
) -> None:
    """A bucket uploaded before the key sample (index objects of version 1, without it): the
    manifest names them (length, SHA-256), verify rebuilds each in its own form and finds
    nothing, and a key look-up through the tier finds its messages."""
    t = tiered
    key = f"{t.prefix}manifest.json"
    doc = json.loads(get(ceph, t, key))
    for entry in doc["segments"]:
        segment = bytes(get(ceph, t, t.key("commitlog", entry["base"])))
        old = build_segment_index(segment, entry["base"], len(segment), version=1)
        assert old[4:8] == (1).to_bytes(4, "big") and len(old) < entry["index"]["length"]
        put(ceph, t, t.key("index", entry["base"]), old)
        entry["index"] = {"length": len(old), "sha256": hashlib.sha256(old).hexdigest()}
    put(ceph, t, key, json.dumps(doc).encode())
    rc, report = verify(t)
    assert rc == 0 and report["problems"] == [], report["problems"]
    assert report["tier"]["indexObjects"] == len(t.tier_bases)
    tier = RemoteSegments(ObjectStore(StoreConfig.load(t.conf)), t.prefix)
    for w in [w for w in t.written if t.tier_only(w)][::37]:
        [found] = tier.query_key(w.topic, w.key)
        assert (found.commit_log_offset, found.body) == (w.commit_log_offset, w.body)
