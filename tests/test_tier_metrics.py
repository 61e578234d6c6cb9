"""The tier in ``/metrics`` and on the console's overview, from a store's files and its tier
record, with no bucket: the figures against the segment files the test lists and the record
it wrote; an older record without the monitoring fields; a damaged one; and the tier off
(no tier series, nothing of the tier or boto3 imported). Against a real radosgw and a real
uploader: tests/test_tier_metrics_s3.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the console needs the 'console' extra")
pytest.importorskip("prometheus_client", reason="the metrics need the 'console' extra")
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.console.app import create_app
from rocketstore.pipeline.console.views import Console
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import TierError
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.tier import localstate
from rocketstore.pipeline.tier.localstate import TierState
from rocketstore.pipeline.tools.metrics import StoreCollector, Target
from tests.kit import ROOT
from tests.kit.consolekit import cells
from tests.kit.files import snapshot
from tests.kit.samples import by, scrape

SEG = 64 * 1024
# The scrapes' clock; the console's is the wall clock, which is later.
NOW_MS = time.time_ns() // 1_000_000
TIER_ON = StoreConfig(
    mapped_file_size_commitlog=SEG,
    max_hash_slot_num=1000,
    max_index_num=20000,
    tiered_storage_level="NOT_IN_DISK",
    object_store_bucket="never-asked",
)


def write(store: Path, config: StoreConfig, messages: int = 300) -> list[Path]:
    """``messages`` of ~1 KiB (several segments), the store closed; its segment files."""
    with MessageStore(store, config) as s:
        s.put_batch(
            [Message("T", bytes([k % 250]) * 1000, queue_id=k % 2) for k in range(messages)]
        )
    return sorted((store / "commitlog").iterdir())


def sealed_at(files: list[Path]) -> dict[Path, int]:
    """Each segment's last write set to a known time (ms): the k-th an hour minus k minutes
    before NOW_MS (the upload lag is measured from these)."""
    out = {}
    for k, path in enumerate(files):
        at = NOW_MS - 3_600_000 + k * 60_000
        os.utime(path, ns=(at * 1_000_000, at * 1_000_000))
        out[path] = at
    return out


def kib(n: int) -> str:
    assert 1024 <= n < 1 << 20
    return f"{n / 1024:.1f} KiB"


def collector(root: Path, config: StoreConfig = TIER_ON) -> StoreCollector:
    return StoreCollector(Target(root, config), clock_ms=lambda: NOW_MS)


def test_an_older_record_reads_its_monitoring_fields_as_0(tmp_path: Path) -> None:
    path = localstate.path_of(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 1, "storeId": "abc", "uploadedEnd": 4096}))
    assert localstate.read(tmp_path) == TierState("abc", 4096, 0, 0, 0, 0, 0)
    full = TierState("abc", 4096, 3, 5000, 1_700_000_000_000, 7, 1_700_000_001_000)
    localstate.write(tmp_path, full)
    assert localstate.read(tmp_path) == full
    doc = json.loads(path.read_text())
    assert (doc["version"], doc["storeId"], doc["uploadedEnd"]) == (1, "abc", 4096)
    assert (doc["uploadErrors"], doc["lastErrorMs"]) == (7, 1_700_000_001_000)
    doc["uploadErrors"] = -1
    path.write_text(json.dumps(doc))
    with pytest.raises(TierError, match="uploadErrors must be an integer >= 0") as caught:
        localstate.read(tmp_path)
    assert str(path) in str(caught.value)
    assert localstate.uploaded_end(tmp_path) == 0  # retention then deletes nothing


def test_before_any_upload_everything_sealed_is_pending(tmp_path: Path) -> None:
    root = tmp_path / "root"
    files = write(root / "broker-0", TIER_ON)
    assert len(files) >= 4
    times = sealed_at(files)
    before = snapshot(root)
    got = scrape(collector(root))
    assert snapshot(root) == before, "a scrape changed the store"
    assert by(got["rocketstore_tier_up"], "broker") == {("broker-0",): 1}
    assert by(got["rocketstore_tier_segments"], "broker", "tier") == {
        ("broker-0", "local"): len(files),
        ("broker-0", "bucket"): 0,
    }
    assert by(got["rocketstore_tier_bytes"], "broker", "tier") == {
        ("broker-0", "local"): sum(p.stat().st_size for p in files),
        ("broker-0", "bucket"): 0,
    }
    # The writer closed the store: every segment but the last is sealed.
    sealed = files[:-1]
    assert got["rocketstore_tier_pending_segments"] == {(("broker", "broker-0"),): len(sealed)}
    assert got["rocketstore_tier_pending_bytes"] == {
        (("broker", "broker-0"),): sum(p.stat().st_size for p in sealed)
    }
    lag = (NOW_MS - times[sealed[0]]) / 1000
    assert got["rocketstore_tier_upload_lag_seconds"] == {(("broker", "broker-0"),): lag}
    assert got["rocketstore_tier_upload_errors_total"] == {(("broker", "broker-0"),): 0}
    assert got["rocketstore_tier_uploaded_offset_bytes"] == {(("broker", "broker-0"),): 0}
    assert "rocketstore_tier_last_upload_timestamp_seconds" not in got


def test_the_figures_follow_the_record(tmp_path: Path) -> None:
    """What an uploader records (written here by hand: two segments in the bucket, three
    failed runs) is what the metrics and the overview show; a damaged record is reported."""
    root = tmp_path / "root"
    files = write(root / "broker-0", TIER_ON)
    times = sealed_at(files)
    bases = [int(p.name) for p in files]
    record = TierState(
        "id",
        uploaded_end=bases[2],
        bucket_segments=2,
        bucket_bytes=123_456,
        last_upload_ms=NOW_MS - 30_000,
        upload_errors=3,
        last_error_ms=NOW_MS - 5_000,
    )
    localstate.write(root / "broker-0", record)
    got = scrape(collector(root))
    one = (("broker", "broker-0"),)
    assert by(got["rocketstore_tier_segments"], "tier") == {("local",): len(files), ("bucket",): 2}
    assert by(got["rocketstore_tier_bytes"], "tier")[("bucket",)] == 123_456
    pending = files[2:-1]
    assert got["rocketstore_tier_pending_segments"] == {one: len(pending)}
    assert got["rocketstore_tier_pending_bytes"] == {one: sum(p.stat().st_size for p in pending)}
    assert got["rocketstore_tier_upload_lag_seconds"] == {one: (NOW_MS - times[files[2]]) / 1000}
    assert got["rocketstore_tier_uploaded_offset_bytes"] == {one: bases[2]}
    assert got["rocketstore_tier_upload_errors_total"] == {one: 3}
    assert got["rocketstore_tier_last_upload_timestamp_seconds"] == {one: (NOW_MS - 30_000) / 1000}
    assert got["rocketstore_tier_last_error_timestamp_seconds"] == {one: (NOW_MS - 5_000) / 1000}

    with TestClient(create_app(Console(root, TIER_ON)), base_url="http://127.0.0.1") as client:
        page = client.get("/")
        assert page.status_code == 200
        rows = cells(page.text, "tiers")
        assert rows[0][:7] == [
            "broker-0",
            str(len(files)),
            kib(sum(p.stat().st_size for p in files)),
            "2",
            "120.6 KiB",  # 123,456 bytes
            str(len(pending)),
            kib(sum(p.stat().st_size for p in pending)),
        ]
        # The console's clock is the wall clock, later than NOW_MS.
        assert int(rows[0][7].removesuffix(" s")) >= (NOW_MS - times[files[2]]) // 1000
        assert rows[0][9] == "3"

        localstate.path_of(root / "broker-0").write_text('{"version": 1, "storeId": 7}')
        rows = cells(client.get("/").text, "tiers")
        assert rows[0][0] == "broker-0" and "cannot read the tier" in rows[0][1]
        assert "rocketstore-tier.json" in rows[0][1] and "storeId" in rows[0][1]
    got = scrape(collector(root))
    assert got["rocketstore_tier_up"] == {one: 0}
    assert "rocketstore_tier_segments" not in got
    assert got["rocketstore_broker_up"] == {one: 1}  # the rest of the broker is still read


def test_with_the_tier_off_nothing_of_it(tmp_path: Path) -> None:
    """No tier series, no tier table, and neither boto3 nor the tier's modules (but the local
    record, which the engine reads for retention) imported by a scrape (checked in a fresh
    interpreter)."""
    root = tmp_path / "root"
    off = StoreConfig(mapped_file_size_commitlog=SEG, max_hash_slot_num=1000, max_index_num=20000)
    write(root / "broker-0", off, 100)
    got = scrape(collector(root, off))
    assert "rocketstore_broker_up" in got
    assert not [n for n in got if n.startswith("rocketstore_tier_")]
    with TestClient(create_app(Console(root, off)), base_url="http://127.0.0.1") as client:
        page = client.get("/")
        assert page.status_code == 200 and 'id="brokers"' in page.text
        assert 'id="tiers"' not in page.text
    script = f"""
import sys
from pathlib import Path
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.tools.metrics import StoreCollector, Target
config = StoreConfig(mapped_file_size_commitlog={SEG})
names = [m.name for m in StoreCollector(Target(Path({str(root)!r}), config)).scrape()]
assert "rocketstore_broker_up" in names, names
tier = ("backlog", "upload", "manifest", "objects", "remote")
print(sorted(m for m in sys.modules if m.startswith("boto") or m.split(".")[-1] in tier))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
