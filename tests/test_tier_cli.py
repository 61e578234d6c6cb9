"""``rocketstore tier status|upload`` on a real radosgw, and the faults of issue 41 against it:
a missing bucket or wrong credentials at open, kill -9 in the middle of an upload, radosgw
gone while uploading. What the bucket holds is read back by another client and compared with
the local files the test reads itself."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline import cli
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.tier import localstate
from tests.kit import ROOT

SEG = 64 * 1024
# A small IndexFile: the default's 400 MB file is not what these tests are about.
SMALL = {"maxHashSlotNum": 1000, "maxIndexNum": 20000}


def write_conf(path: Path, settings: dict[str, Any]) -> Path:
    lines = [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def fill(store: Path, config: StoreConfig, messages: int, body: int = 1000) -> None:
    with MessageStore(store, config) as s:
        for at in range(0, messages, 200):
            s.put_batch(
                [
                    Message(f"T{k % 2}", bytes([k % 250]) * body, queue_id=k % 4)
                    for k in range(at, min(messages, at + 200))
                ]
            )


def commitlog(store: Path) -> list[Path]:
    return sorted(p for p in (store / "commitlog").iterdir() if p.name.isdigit())


def upload_argv(store: Path, conf: Path, *more: str) -> list[str]:
    """``rocketstore tier upload STORE --config CONF ...`` as a process of its own runs it."""
    command = ["tier", "upload", str(store), "--config", str(conf), *more]
    return [sys.executable, "-m", "rocketstore.pipeline.cli", *command]


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    rc = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def poll(cond: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {seconds} s for {what}")
        time.sleep(0.05)


def manifest_of(ceph: Any, bucket: str, prefix: str) -> dict[str, Any] | None:
    try:
        raw = ceph.client().get_object(Bucket=bucket, Key=f"{prefix}manifest.json")["Body"].read()
    except Exception:
        return None
    doc: dict[str, Any] = json.loads(raw)
    return doc


def check_named_objects_are_whole(ceph: Any, bucket: str, prefix: str, store: Path) -> int:
    """Every segment the manifest names is in the bucket, the local file's bytes up to its
    length, with the manifest's digest; returns how many it names."""
    manifest = manifest_of(ceph, bucket, prefix)
    assert manifest is not None
    s3 = ceph.client()
    for seg in manifest["segments"]:
        name = f"{seg['base']:020d}"
        body = s3.get_object(Bucket=bucket, Key=f"{prefix}commitlog/{name}")["Body"].read()
        assert len(body) == seg["length"], name
        path = store / "commitlog" / name
        if path.exists():  # local retention may have deleted it since
            assert body == path.read_bytes()[: seg["length"]], name
        assert hashlib.sha256(body).hexdigest() == seg["sha256"], name
        index = s3.get_object(Bucket=bucket, Key=f"{prefix}index/{name}")["Body"].read()
        assert hashlib.sha256(index).hexdigest() == seg["index"]["sha256"], name
    return len(manifest["segments"])


def test_status_then_upload_then_status(
    ceph: Any, bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = write_conf(
        tmp_path / "s.toml",
        {"mappedFileSizeCommitLog": SEG, **SMALL, **ceph.settings(bucket, objectStorePrefix="x/")},
    )
    store = tmp_path / "broker-a"
    fill(store, StoreConfig.load(conf), 300)
    local = commitlog(store)
    rc, out, err = run(capsys, "tier", "status", store, "--config", conf, "--json")
    assert rc == 0, err
    before = json.loads(out)
    assert before["local"]["segments"] == len(local)
    assert before["tier"]["segments"] == 0 and before["storeId"] is None
    assert before["pending"]["segments"] == len(local) - 1
    assert before["pending"]["bytes"] == sum(p.stat().st_size for p in local[:-1])
    assert before["pending"]["lagSeconds"] >= 0

    rc, out, err = run(capsys, "tier", "upload", store, "--config", conf)
    assert rc == 0, err
    assert f"uploaded {len(local) - 1} segments" in out
    assert check_named_objects_are_whole(ceph, bucket, "x/broker-a/", store) == len(local) - 1

    ceph.client().put_object(Bucket=bucket, Key="x/broker-a/commitlog/99", Body=b"stray")
    rc, out, err = run(capsys, "tier", "status", store, "--config", conf, "--json")
    after = json.loads(out)
    assert after["tier"]["segments"] == len(local) - 1
    assert after["tier"]["end"] == int(local[-1].name)
    assert after["pending"] == {"segments": 0, "bytes": 0, "lagSeconds": 0.0}
    assert after["storeId"] == after["tier"]["owner"] == localstate.read(store).store_id  # type: ignore[union-attr]
    assert after["tier"]["leftovers"] == ["x/broker-a/commitlog/99"]
    rc, out, err = run(capsys, "tier", "status", store, "--config", conf)
    assert rc == 0 and "leftovers" in out and "upload lag: 0.0 s" in out


def test_a_missing_bucket_or_wrong_key_fails_at_open_naming_the_setting(
    ceph: Any, bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "b"
    fill(store, StoreConfig(mapped_file_size_commitlog=SEG), 10)
    conf = write_conf(
        tmp_path / "nb.toml", {"mappedFileSizeCommitLog": SEG, **ceph.settings("nope-bucket")}
    )
    rc, _out, err = run(capsys, "tier", "upload", store, "--config", conf)
    assert rc == 2
    assert "nope-bucket" in err and "objectStoreBucket" in err and "no such bucket" in err
    conf = write_conf(
        tmp_path / "wk.toml",
        {"mappedFileSizeCommitLog": SEG, **ceph.settings(bucket, objectStoreSecretKey="wrong")},
    )
    rc, _out, err = run(capsys, "tier", "status", store, "--config", conf)
    assert rc == 2 and "access denied" in err and "objectStoreAccessKey" in err
    assert "wrong" not in err.replace("wrong credentials", "")


BIG_SEG = 32 * 1024 * 1024


def test_kill_9_mid_upload_then_a_rerun_completes(ceph: Any, bucket: str, tmp_path: Path) -> None:
    """``tier upload`` killed (SIGKILL) once the first segment is committed: the manifest
    names only whole, verified objects; a second run uploads the rest and aborts what the
    killed one left open."""
    conf = write_conf(
        tmp_path / "s.toml",
        {"mappedFileSizeCommitLog": BIG_SEG, **SMALL, **ceph.settings(bucket)},
    )
    store = tmp_path / "kb"
    fill(store, StoreConfig.load(conf), 8 * 500, body=64 * 1024)  # 8 segments of 32 MiB
    sealed = len(commitlog(store)) - 1
    assert sealed >= 6
    proc = subprocess.Popen(
        upload_argv(store, conf),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        poll(
            lambda: (manifest_of(ceph, bucket, "kb/") or {}).get("generation", 0) >= 1,
            120,
            "the first segment committed",
        )
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    named = check_named_objects_are_whole(ceph, bucket, "kb/", store)
    assert 1 <= named < sealed, "the upload ended before the kill: nothing was cut short"
    recorded = localstate.read(store)
    assert recorded is not None and recorded.uploaded_end <= (named) * BIG_SEG

    again = subprocess.run(
        upload_argv(store, conf),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert check_named_objects_are_whole(ceph, bucket, "kb/", store) == sealed
    assert localstate.read(store).uploaded_end == sealed * BIG_SEG  # type: ignore[union-attr]
    assert ceph.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_radosgw_gone_while_uploading(ceph: Any, bucket: str, tmp_path: Path) -> None:
    """radosgw killed under ``tier upload --follow``: the follower says so and retries,
    local retention deletes nothing not uploaded meanwhile; radosgw back, the backlog goes
    up, and SIGTERM ends the follower cleanly."""
    settings = {"mappedFileSizeCommitLog": SEG, "fileReservedTime": 0, **SMALL}
    settings.update(ceph.settings(bucket))
    conf = write_conf(tmp_path / "s.toml", settings)
    config = StoreConfig.load(conf)
    store = tmp_path / "gb"
    fill(store, config, 150)
    follower = subprocess.Popen(
        upload_argv(store, conf, "--follow", "--interval", "0.2"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.extend(follower.stderr or ()), daemon=True)
    reader.start()
    try:
        first = len(commitlog(store)) - 1
        poll(lambda: localstate.uploaded_end(store) >= first * SEG, 120, "the first upload")
        ceph.stop_rgw()
        try:
            fill(store, config, 150)  # more sealed segments while the bucket is gone
            now = commitlog(store)
            with MessageStore(store, config) as s:
                s.clean(force_expired=True)  # all expired: only uploaded ones may go
            left = commitlog(store)
            assert [p.name for p in left] == [
                p.name for p in now if int(p.name) >= localstate.uploaded_end(store)
            ]
            assert len(left) > 1
            poll(lambda: any("does not answer" in e for e in errors), 120, "the follower's error")
        finally:
            ceph.start_rgw()
        end = int(commitlog(store)[-1].name)
        poll(lambda: localstate.uploaded_end(store) >= end, 180, "the backlog uploaded")
        follower.send_signal(signal.SIGTERM)
        follower.wait(timeout=120)  # its stdout is a few lines: no pipe fills meanwhile
        out = follower.stdout.read() if follower.stdout else ""
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    reader.join(timeout=60)
    err = "".join(errors)
    assert follower.returncode == 0, err
    assert "does not answer" in err and "(retrying)" in err
    assert "stopped; uploadedEnd" in out
    check_named_objects_are_whole(ceph, bucket, "gb/", store)
    manifest = manifest_of(ceph, bucket, "gb/")
    assert manifest is not None and manifest["segments"][-1]["base"] + SEG == end
    assert manifest["segments"][0]["base"] == 0
