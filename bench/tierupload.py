"""The ``tierupload`` part: how fast ``rocketstore tier upload`` moves sealed segments to a real
S3 (Ceph radosgw 16.2 on loopback, the throwaway one of ``../shared/ceph/ceph-up.sh``), with
one segment at a time and with several (``tieredStoreUploadThreads``).

Input: a store of 16 sealed CommitLog segments of 64 MiB (``--quick``: 4 of 8 MiB) written by
``put_batch`` of 1,000-byte messages over 8 queues. Timed, per run and thread count, each in a
fresh bucket: ``rocketstore tier upload STORE`` in a process of its own, start to exit (its
imports included, about 0.5 s), and that process's peak RSS (its VmHWM, read while it runs). Every run uploads
the same bytes: the segments' data and their indexes, each confirmed, the manifest once per
segment. The thread counts take turns in an order that rotates from run to run.

Reported: MB/s of segment bytes (median of ``--runs``), peak RSS, the load average.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import Options, PartResult, Row, log, scratch_dir, spread
from bench.s3clients import cluster, unavailable
from bench.store import make_table
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore

BODY = 1000
THREADS = (1, 2, 4)
FULL = (16, 64 << 20)  # sealed segments, segment size
QUICK = (4, 8 << 20)
# The target: the tier keeps pace with the sink (~40 MiB/s was one segment at a time).
TARGET_MB_S = 80.0


def _write_store(path: Path, segments: int, size: int, seed: int) -> int:
    """Messages until ``segments`` segments are sealed; returns their bytes on disk."""
    config = StoreConfig(mapped_file_size_commitlog=size, max_hash_slot_num=1000)
    with MessageStore(path, config) as store:
        first = 0
        while True:
            n = max(size // (BODY + 200) // 4, 100)
            got = store.put_batch(make_table(n, BODY, seed, first_key=first, queues=8))
            first += n
            if int(got.commit_log_offsets[-1]) >= segments * size:
                break
    return segments * size


def _hwm(pid: int) -> int:
    """The process's peak RSS so far (VmHWM), bytes; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _upload(store: Path, conf: Path) -> tuple[float, int, str]:
    """``rocketstore tier upload``: wall seconds, peak RSS in bytes, its stdout. The peak is
    read from /proc while it runs (``wait4``'s maxrss would carry this process's own over the
    fork), every 50 ms: it only grows, so the last reading is the peak but for its last
    50 ms."""
    argv = [sys.executable, "-m", "rocketstore.pipeline.cli", "tier", "upload", str(store)]
    argv += ["--config", str(conf)]
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _hwm(proc.pid))
        time.sleep(0.05)
    took = time.monotonic() - started
    out = proc.stdout.read().decode() if proc.stdout else ""
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"tier upload failed ({proc.returncode}): {err[-2000:]}")
    return took, peak, out


def run(options: Options) -> PartResult:
    why = unavailable()
    if why is not None:
        return PartResult("tierupload", [], {"skipped": why}, [f"skipped: {why}"])
    import boto3

    segments, size = QUICK if options.quick else FULL
    load_start = os.getloadavg()
    runs: dict[int, list[dict[str, float]]] = {t: [] for t in THREADS}
    with scratch_dir(options.work_dir, "tierupload-") as work, cluster() as c:
        store = work / "broker-u"
        log(f"tierupload: writing {segments} sealed segments of {size >> 20} MiB")
        total = _write_store(store, segments, size, options.seed)
        s3 = boto3.client(
            "s3",
            endpoint_url=c.env["S3_ENDPOINT"],
            region_name=c.env.get("S3_REGION", "us-east-1"),
            aws_access_key_id=c.env["S3_ACCESS_KEY"],
            aws_secret_access_key=c.env["S3_SECRET_KEY"],
        )
        for i in range(options.runs):
            order = THREADS[i % len(THREADS) :] + THREADS[: i % len(THREADS)]
            for threads in order:
                bucket = f"tu-{uuid.uuid4().hex[:12]}"
                s3.create_bucket(Bucket=bucket)
                settings: dict[str, Any] = {
                    "mappedFileSizeCommitLog": size,
                    "maxHashSlotNum": 1000,
                    "tieredStorageLevel": "NOT_IN_DISK",
                    "objectStoreEndpoint": c.env["S3_ENDPOINT"],
                    "objectStoreBucket": bucket,
                    "objectStoreRegion": c.env.get("S3_REGION", "us-east-1"),
                    "objectStoreAccessKey": c.env["S3_ACCESS_KEY"],
                    "objectStoreSecretKey": c.env["S3_SECRET_KEY"],
                    "tieredStoreUploadThreads": threads,
                }
                conf = work / f"t{threads}.toml"
                conf.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
                (store / "config" / "rocketstore-tier.json").unlink(missing_ok=True)
                took, rss, out = _upload(store, conf)
                if f"uploaded {segments} segments" not in out:
                    raise RuntimeError(f"tier upload did not upload {segments} segments: {out}")
                runs[threads].append({"s": took, "mb_s": total / took / 1e6, "rss": rss})
                log(f"tierupload: {threads} threads: {total / took / 1e6:.0f} MB/s, {took:.1f} s")
                for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                    keys = [{"Key": o["Key"]} for o in page.get("Contents", ())]
                    if keys:
                        s3.delete_objects(Bucket=bucket, Delete={"Objects": keys})
                s3.delete_bucket(Bucket=bucket)
                c.gc()
    load_end = os.getloadavg()
    one = spread([r["mb_s"] for r in runs[1]])
    rows = []
    for threads in THREADS:
        mb = spread([r["mb_s"] for r in runs[threads]])
        rows.append(
            Row.of(
                f"tier upload, {threads} segment(s) at once ({segments} x {size >> 20} MiB)",
                "MB/s",
                mb,
                baseline="1 at a time" if threads != 1 else "",
                ratio=mb["median"] / one["median"] if threads != 1 else None,
                target=f">= {TARGET_MB_S:.0f} MB/s" if threads == max(THREADS) else "",
                met=mb["median"] >= TARGET_MB_S if threads == max(THREADS) else None,
            )
        )
        peak = spread([r["rss"] / 2**20 for r in runs[threads]])
        rows.append(Row.of(f"  its peak RSS, {threads} at once", "MiB", peak))
    data = {
        "segments": segments,
        "segment_bytes": size,
        "runs": {str(t): r for t, r in runs.items()},
        "load_avg_before": load_start,
        "load_avg_after": load_end,
    }
    notes = [
        f"load average before {load_start[0]:.2f}, after {load_end[0]:.2f} "
        f"({os.cpu_count()} CPUs); radosgw and the OSD on the same CPUs",
        "each run: a process of its own, imports included; a fresh bucket",
    ]
    return PartResult("tierupload", rows, data, notes)
