"""The tier in ``/metrics`` and on the console against a real radosgw and the real uploader:
the figures a scrape gives against the store's files (listed here) and the bucket (listed with
the fixture's own client); radosgw stopped under ``tier upload --follow``: the errors counted
and the lag growing, then the backlog uploaded and the lag back to 0."""

from __future__ import annotations

import signal
import subprocess
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the exporter needs the 'console' extra")
pytest.importorskip("prometheus_client", reason="the exporter needs the 'console' extra")
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

from prometheus_client.parser import text_string_to_metric_families

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.console.app import create_app
from rocketstore.pipeline.console.exporter import create_exporter_app
from rocketstore.pipeline.console.views import Console
from rocketstore.pipeline.tools.metrics import StoreCollector, Target
from tests.kit import ROOT
from tests.kit.consolekit import cells
from tests.test_tier_cli import SEG, SMALL, commitlog, fill, poll, run, upload_argv, write_conf

BROKER = "broker-a"


def metrics(store: Path, config: StoreConfig) -> dict[str, float]:
    """The exporter's ``/metrics`` of one store directory, over HTTP: ``name`` or
    ``name{tier}`` -> value, for the tier's samples."""
    app = create_exporter_app(StoreCollector(Target(store, config)), store, None)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        r = client.get("/metrics")
    assert r.status_code == 200
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            if s.name.startswith("rocketstore_tier_"):
                assert s.labels["broker"] == BROKER
                name = f"{s.name}{{{s.labels['tier']}}}" if "tier" in s.labels else s.name
                out[name] = s.value
    return out


def bucket_listing(ceph: Any, bucket: str, prefix: str) -> dict[str, int]:
    """Key -> size of every object under ``prefix``, from the fixture's own client."""
    s3 = ceph.client()
    out: dict[str, int] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out.update({o["Key"]: o["Size"] for o in page.get("Contents", ())})
    return out


def expected(ceph: Any, bucket: str, prefix: str, store: Path) -> dict[str, float]:
    """The figures the store's files and the bucket give, read here: the segments the bucket
    holds (its ``commitlog/`` objects), their bytes with their indexes', the local files, and
    the sealed ones (all but the last: the writer closed the store) past the bucket's end."""
    listed = bucket_listing(ceph, bucket, prefix)
    objects = sorted(int(k.rsplit("/", 1)[1]) for k in listed if "/commitlog/" in k)
    end = objects[-1] + SEG if objects else 0
    local = commitlog(store)
    pending = [p for p in local[:-1] if int(p.name) >= end]
    return {
        "rocketstore_tier_up": 1,
        "rocketstore_tier_segments{local}": len(local),
        "rocketstore_tier_bytes{local}": sum(p.stat().st_size for p in local),
        "rocketstore_tier_segments{bucket}": len(objects),
        "rocketstore_tier_bytes{bucket}": sum(
            size for k, size in listed.items() if "/commitlog/" in k or "/index/" in k
        ),
        "rocketstore_tier_pending_segments": len(pending),
        "rocketstore_tier_pending_bytes": sum(p.stat().st_size for p in pending),
        "rocketstore_tier_uploaded_offset_bytes": end,
    }


def test_the_figures_are_the_files_and_the_buckets(
    ceph: Any, bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = {"mappedFileSizeCommitLog": SEG, **SMALL, **ceph.settings(bucket)}
    conf = write_conf(tmp_path / "s.toml", {**settings, "objectStorePrefix": "m/"})
    config = StoreConfig.load(conf)
    store = tmp_path / BROKER  # one store directory, as the exporter may be given
    fill(store, config, 300)
    started = time.time()
    rc, _out, err = run(capsys, "tier", "upload", store, "--config", conf)
    ended = time.time()
    assert rc == 0, err
    fill(store, config, 150)  # sealed, not uploaded
    prefix = f"m/{BROKER}/"
    want = expected(ceph, bucket, prefix, store)
    assert want["rocketstore_tier_segments{bucket}"] >= 2
    assert want["rocketstore_tier_pending_segments"] >= 2
    before = time.time()
    got = metrics(store, config)
    after = time.time()
    assert {k: got[k] for k in want} == want
    assert got["rocketstore_tier_upload_errors_total"] == 0
    assert "rocketstore_tier_last_error_timestamp_seconds" not in got
    assert started <= got["rocketstore_tier_last_upload_timestamp_seconds"] <= ended
    oldest = min(
        p.stat().st_mtime
        for p in commitlog(store)
        if int(p.name) >= want["rocketstore_tier_uploaded_offset_bytes"]
    )
    assert before - oldest - 0.01 <= got["rocketstore_tier_upload_lag_seconds"] <= after - oldest

    # The console's overview: the same figures.
    with TestClient(create_app(Console(store, config)), base_url="http://127.0.0.1") as client:
        rows = cells(client.get("/").text, "tiers")
    assert [(r[0], r[1], r[3], r[5], r[9]) for r in rows] == [
        (
            BROKER,
            str(want["rocketstore_tier_segments{local}"]),
            str(want["rocketstore_tier_segments{bucket}"]),
            str(want["rocketstore_tier_pending_segments"]),
            "0",
        )
    ]

    rc, _out, err = run(capsys, "tier", "upload", store, "--config", conf)
    assert rc == 0, err
    want = expected(ceph, bucket, prefix, store)
    assert want["rocketstore_tier_pending_segments"] == 0
    got = metrics(store, config)
    assert {k: got[k] for k in want} == want
    assert got["rocketstore_tier_upload_lag_seconds"] == 0


def test_radosgw_stopped_under_follow(ceph: Any, bucket: str, tmp_path: Path) -> None:
    """radosgw stopped while ``tier upload --follow`` runs: each failed run is counted and
    the lag grows while the backlog waits; radosgw back, the backlog is uploaded, the lag is
    0 again and the count stays (a counter)."""
    settings = {"mappedFileSizeCommitLog": SEG, **SMALL, **ceph.settings(bucket)}
    conf = write_conf(tmp_path / "s.toml", settings)
    config = StoreConfig.load(conf)
    store = tmp_path / BROKER  # one store directory, as the exporter may be given
    fill(store, config, 150)
    follower = subprocess.Popen(
        upload_argv(store, conf, "--follow", "--interval", "0.2"),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        poll(
            lambda: (
                metrics(store, config)["rocketstore_tier_pending_segments"] == 0
                and metrics(store, config)["rocketstore_tier_segments{bucket}"] > 0
            ),
            120,
            "the first upload",
        )
        stopped = time.time()
        ceph.stop_rgw()
        try:
            fill(store, config, 150)  # more sealed segments while the bucket is gone
            first = poll(
                lambda: (
                    (m := metrics(store, config))["rocketstore_tier_upload_errors_total"] > 0 and m
                ),
                120,
                "an error counted",
            )
            assert first["rocketstore_tier_pending_segments"] >= 2
            assert first["rocketstore_tier_last_error_timestamp_seconds"] >= stopped
            assert first["rocketstore_tier_upload_lag_seconds"] > 0
            later = poll(
                lambda: (
                    (m := metrics(store, config))["rocketstore_tier_upload_errors_total"]
                    > first["rocketstore_tier_upload_errors_total"]
                    and m
                ),
                120,
                "a second error counted",
            )
            assert (
                later["rocketstore_tier_upload_lag_seconds"]
                > first["rocketstore_tier_upload_lag_seconds"]
            )
            assert (
                later["rocketstore_tier_pending_segments"]
                == first["rocketstore_tier_pending_segments"]
            )
            assert (
                later["rocketstore_tier_segments{bucket}"]
                == first["rocketstore_tier_segments{bucket}"]
            )
        finally:
            ceph.start_rgw()
        back = time.time()
        done = poll(
            lambda: (m := metrics(store, config))["rocketstore_tier_pending_segments"] == 0 and m,
            180,
            "the backlog uploaded",
        )
    finally:
        follower.send_signal(signal.SIGTERM)
        try:
            follower.wait(timeout=120)
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.wait()
    assert follower.returncode == 0
    assert done["rocketstore_tier_upload_lag_seconds"] == 0
    assert (
        done["rocketstore_tier_upload_errors_total"]
        >= later["rocketstore_tier_upload_errors_total"]
    )
    assert done["rocketstore_tier_last_upload_timestamp_seconds"] >= back
    want = expected(ceph, bucket, f"{BROKER}/", store)
    assert {k: done[k] for k in want} == want
