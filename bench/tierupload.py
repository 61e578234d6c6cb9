"""The ``tierupload`` part: how fast ``rocketstore tier upload`` moves sealed segments to a real
S3 (Ceph radosgw 16.2 on loopback, the throwaway one of ``../shared/ceph/ceph-up.sh``), with
one segment at a time and with several (``tieredStoreUploadThreads``).

Input: a store of 16 sealed CommitLog segments of 64 MiB (``--quick``: 4 of 8 MiB) written by
``put_batch`` of 1,000-byte messages over 8 queues. Timed, per run and thread count, each in a
fresh bucket: ``rocketstore tier upload STORE`` in a process of its own, start to exit (its
imports included, about 0.5 s), that process's peak RSS (its VmHWM, read while it runs) and
its CPU seconds per GB. Every run uploads the same bytes: the segments' data and their
indexes, each confirmed, the manifest once per segment. The thread counts take turns in an
order that rotates from run to run.

Then **beside a writer**: a process writing 1,000-byte messages with ``put_batch`` as fast as
it can for 60 s or 40 segments, whichever comes first (``--quick``: 10 s) into a fresh store with the tier on (a stand-in for the
Spark sink at its full rate: the same put path without Spark's own costs), and ``tier upload
--follow`` with the default thread count beside it. Sampled every 0.2 s: the sealed end (the
store's flushed point, down to a segment boundary) and ``uploadedEnd``; reported: the writer's
MB/s, the upload's MB/s over the same time, the largest backlog (sealed segments not uploaded
yet), its mean in each third of the time (steady or growing), and how long the backlog took to
drain once the writer stopped. Figures of one run; the load average with them.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import signal
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
from rocketstore.pipeline.tier import localstate
from rocketstore.pipeline.tier.upload import flushed_offset

BODY = 1000
THREADS = (1, 2, 4)
FULL = (16, 64 << 20)  # sealed segments, segment size
QUICK = (4, 8 << 20)
# The target: the tier keeps pace with the sink (~40 MiB/s was one segment at a time).
TARGET_MB_S = 80.0
# The writer beside the upload stops after this many segments, whatever the time.
BESIDE_SEGMENTS = 40


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


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _upload(store: Path, conf: Path) -> tuple[float, int, str, float]:
    """``rocketstore tier upload``: wall seconds, peak RSS in bytes, its stdout, its CPU
    seconds (the children's, before and after it: it is the only one reaped meanwhile). The peak is
    read from /proc while it runs (``wait4``'s maxrss would carry this process's own over the
    fork), every 50 ms: it only grows, so the last reading is the peak but for its last
    50 ms."""
    argv = [sys.executable, "-m", "rocketstore.pipeline.cli", "tier", "upload", str(store)]
    argv += ["--config", str(conf)]
    cpu = _children_cpu_s()
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
    return took, peak, out, _children_cpu_s() - cpu


def _settings(env: dict[str, str], bucket: str, size: int, threads: int) -> dict[str, Any]:
    return {
        "mappedFileSizeCommitLog": size,
        "maxHashSlotNum": 1000,
        "tieredStorageLevel": "NOT_IN_DISK",
        "objectStoreEndpoint": env["S3_ENDPOINT"],
        "objectStoreBucket": bucket,
        "objectStoreRegion": env.get("S3_REGION", "us-east-1"),
        "objectStoreAccessKey": env["S3_ACCESS_KEY"],
        "objectStoreSecretKey": env["S3_SECRET_KEY"],
        "tieredStoreUploadThreads": threads,
    }


def _write_for(path: str, conf: str, seconds: float, limit: int, seed: int) -> None:
    """The writer beside the upload (a process of its own): put_batch for ``seconds``, or
    until ``limit`` bytes are written (the OSD's disk is 16 GB)."""
    table = make_table(2000, BODY, seed, queues=8)
    deadline = time.monotonic() + seconds
    with MessageStore(path, StoreConfig.load(conf)) as store:
        while time.monotonic() < deadline:
            if int(store.put_batch(table).commit_log_offsets[-1]) >= limit:
                break


def _beside_writer(
    env: dict[str, str], s3: Any, work: Path, size: int, seconds: float, seed: int
) -> dict[str, Any]:
    """The upload (``--follow``, default threads) beside a writer at its full rate."""
    bucket = f"tw-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    threads = StoreConfig().tiered_store_upload_threads
    conf = work / "beside.toml"
    settings = _settings(env, bucket, size, threads)
    conf.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
    store = work / "broker-w"
    writer = multiprocessing.get_context("spawn").Process(
        target=_write_for, args=(str(store), str(conf), seconds, BESIDE_SEGMENTS * size, seed)
    )
    argv = [sys.executable, "-m", "rocketstore.pipeline.cli", "tier", "upload", str(store)]
    argv += ["--config", str(conf), "--follow", "--interval", "0.2"]
    started = time.monotonic()
    writer.start()
    errors = work / "beside.err"
    with open(errors, "wb") as err:
        uploader = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
    backlog = 0
    samples: list[tuple[float, int]] = []  # (s since the start, segments not uploaded)
    try:
        while writer.is_alive():
            sealed = flushed_offset(store) // size * size
            behind = max(0, (sealed - localstate.uploaded_end(store)) // size)
            samples.append((round(time.monotonic() - started, 2), behind))
            backlog = max(backlog, behind)
            time.sleep(0.2)
        wrote_s = time.monotonic() - started
        written = flushed_offset(store)
        uploaded_then = localstate.uploaded_end(store)
        # Every segment but the last file is sealed now that the writer closed the store.
        last = max(int(p.name) for p in (store / "commitlog").iterdir() if p.name.isdigit())
        drained = time.monotonic()
        while localstate.uploaded_end(store) < last:
            if uploader.poll() is not None:
                raise RuntimeError(f"tier upload --follow ended: {errors.read_text()[-2000:]}")
            time.sleep(0.2)
        drain_s = time.monotonic() - drained
    finally:
        uploader.send_signal(signal.SIGTERM)
        uploader.wait(timeout=120)
        writer.join(timeout=60)
    return {
        "threads": threads,
        "seconds": wrote_s,
        "written_bytes": written,
        "writer_mb_s": written / wrote_s / 1e6,
        "uploaded_while_writing": uploaded_then,
        "upload_mb_s": uploaded_then / wrote_s / 1e6,
        "max_backlog_segments": backlog,
        "backlog_samples": samples,
        "drain_s": drain_s,
    }


def _backlog_thirds(samples: list[tuple[float, int]]) -> list[float]:
    """The mean backlog in each third of the writing time: steady, or growing?"""
    if not samples:
        return [0.0]
    end = samples[-1][0] or 1.0
    out = []
    for k in range(3):
        part = [b for t, b in samples if k * end / 3 <= t <= (k + 1) * end / 3]
        out.append(sum(part) / len(part) if part else 0.0)
    return out


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
                settings = _settings(c.env, bucket, size, threads)
                conf = work / f"t{threads}.toml"
                conf.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
                (store / "config" / "rocketstore-tier.json").unlink(missing_ok=True)
                took, rss, out, cpu = _upload(store, conf)
                if f"uploaded {segments} segments" not in out:
                    raise RuntimeError(f"tier upload did not upload {segments} segments: {out}")
                runs[threads].append(
                    {
                        "s": took,
                        "mb_s": total / took / 1e6,
                        "rss": rss,
                        "cpu_s_per_gb": cpu / total * 1e9,
                    }
                )
                log(f"tierupload: {threads} threads: {total / took / 1e6:.0f} MB/s, {took:.1f} s")
                for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                    keys = [{"Key": o["Key"]} for o in page.get("Contents", ())]
                    if keys:
                        s3.delete_objects(Bucket=bucket, Delete={"Objects": keys})
                s3.delete_bucket(Bucket=bucket)
                c.gc()
        log("tierupload: the upload beside a writer at its full rate")
        beside = _beside_writer(
            c.env, s3, work, size, 10.0 if options.quick else 60.0, options.seed
        )
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
        per_gb = spread([r["cpu_s_per_gb"] for r in runs[threads]])
        rows.append(Row.of(f"  its CPU per GB, {threads} at once", "s/GB", per_gb))
    rows.append(
        Row(
            f"beside a writer for {beside['seconds']:.0f} s: the writer",
            "MB/s",
            beside["writer_mb_s"],
        )
    )
    rows.append(
        Row(
            f"  the upload ({beside['threads']} at once) over the same time",
            "MB/s",
            beside["upload_mb_s"],
            baseline="the writer",
            ratio=beside["upload_mb_s"] / beside["writer_mb_s"],
        )
    )
    rows.append(Row("  its largest backlog", "segments", beside["max_backlog_segments"]))
    thirds = _backlog_thirds(beside["backlog_samples"])
    rows.append(Row("  its backlog, mean of each third of the time", "segments", thirds[-1]))
    rows.append(Row("  the backlog drained after the writer stopped in", "s", beside["drain_s"]))
    data = {
        "beside_writer": beside,
        "segments": segments,
        "segment_bytes": size,
        "runs": {str(t): r for t, r in runs.items()},
        "load_avg_before": load_start,
        "load_avg_after": load_end,
    }
    notes = [
        "backlog beside the writer, mean of each third of the time: "
        + " / ".join(f"{b:.1f}" for b in thirds)
        + " segments",
        f"load average before {load_start[0]:.2f}, after {load_end[0]:.2f} "
        f"({os.cpu_count()} CPUs); radosgw and the OSD on the same CPUs",
        "each run: a process of its own, imports included; a fresh bucket",
    ]
    return PartResult("tierupload", rows, data, notes)
