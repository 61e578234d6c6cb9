"""The ``tier`` part: tiered storage (docs/tiering.md) against a real S3, the targets of issue 41.

A throwaway Ceph with radosgw on loopback (``../shared/ceph/ceph-up.sh``, restarted with
``tcp_nodelay=1`` as in the s3clients part) is started by the part and purged after it. The
stores use 64 MiB CommitLog segments (8 MiB with ``--quick``), not RocketMQ's 1 GiB: the
machine (2 vCPU, a shared disk, an OSD on a sparse file) must hold several of each. Messages
are the store part's (``bench.store.make_table``: 100-byte bodies, a key ``order-<i>`` and a
tag each; the store adds a UNIQ_KEY). Figures, in this order:

1. **Hot path**: ``hot_messages`` put into a fresh store in batch puts of 100,000, the puts
   pinned to one CPU as in the store part, three ways (:data:`HOT_MODES`) in an order rotating
   over ``--runs`` rounds: the tier off; on (early roll on: ``tieredStoreGroupCommitTimeout``
   1 s, and ``rocketstore tier upload --follow`` running beside it as the service it is,
   started and ready before the puts) with the uploader and the Ceph daemons kept to the other
   CPU; and on, all free to use either. Reported: msgs/s of each, the median of each round's
   ratio to the tier off (and of the CPU seconds' ratio), and the segments the uploader had
   uploaded when the puts ended.
2. **Cold streaming read**: a store of ``read_segments`` sealed segments over 8 queues, every
   sealed segment uploaded (the uploader, in process) and then deleted locally by the store's
   retention (the tier's gate lets it). A copy of the directory taken before the deletion is
   the local twin. Read without Spark, as the executors read (the source's planner, its
   partitions, then ``source.tierread.read_ranges`` over each): from the tiered root
   (all but the small last segment from the bucket) and from the local twin; and the floor:
   boto3 ranged GETs of the tier's CommitLog objects, once each, in the reader's 8 MiB
   read-ahead chunks, one thread (a partition reads on one). The three take turns, the order
   rotating from run to run. Also counted: the bytes radosgw sent for the cold read (its perf
   counters), against the objects' bytes. Then, once (not with ``--quick``), the cold and the
   local read through Spark (``readStream`` into ``noop``, ``availableNow``, ``local[2]``).
3. **One queue among 4,000** (``wide_messages`` over 4,000 queues, uploaded and deleted
   locally): the whole of one queue read from the tier with ``read_tier_range`` over an object
   store that counts every GET and its bytes: CommitLog bytes fetched against the queue's own
   message bytes (target < 2 x), and the index bytes beside (heads, units).
4. **Key look-ups in cold data**: ``keys`` keys of messages in the tier, each looked up with
   ``RemoteSegments.query_key`` (a new ``RemoteSegments`` each time: manifest and index heads
   fetched again; the client kept, as a process keeps it) and with the source's key read
   (``read_key_range`` of the planner's key ranges; the plan timed apart). Target: median
   < 200 ms.
5. **Local disk bounded while the tier holds more**: a writer paced at 10 MB/s (what the
   uploader sustains here beside it) into 16 MiB segments, the IndexFile and ConsumeQueue files
   scaled down with them (:func:`bounded_geometry`), for ``bounded_s`` (120 s), retention
   deleting what is uploaded every second, the uploader beside; the store directory's bytes on
   disk sampled every 0.25 s. Then, the uploader done, every message of the topic read across
   both tiers with the source (planner and partition reads) and checked: each acknowledged
   message once (each queue's offsets exactly 0 .. n - 1). Target: the tier's bytes >= 10 x
   the most the directory held, and every message once.
6. **Upload keeps pace**: a writer process putting batches of 100,000 messages as fast as the
   store takes them (the store's batch put: the Spark sink would take both CPUs itself and
   leave none to the uploader and radosgw; its rate is a quarter of the put's) for
   ``--minutes`` (default 10, ``--quick`` 0.5), with retention deleting what is uploaded every
   second, and ``rocketstore tier upload --follow`` beside it. Sampled every second: the
   writer's CommitLog end, the tier record's ``uploadedEnd``, the sealed segments pending and
   the upload lag (``tier status``'s). The run stops early, saying so, when the local backlog
   passes ``backlog_cap`` (the disk would fill: a writer outrunning its uploader stops at
   ``DiskFullError``) or the bucket passes ``bucket_cap`` (the OSD's size). Reported: writer and
   tier MB/s over the run, the largest lag (segments, seconds), the lag at the end, and the CPU
   seconds per GB of the writer, the uploader and radosgw with its OSD. Target:
   the tier's rate >= 0.95 x the writer's, and the run not stopped by the backlog.
7. **Upload keeps pace with the sink** (not with ``--quick``): figure 6 with the Spark sink as
   the writer, as the issue words the target: a streaming query of ``rate-micro-batch`` rows
   (500,000 a micro-batch, a 100-byte body and a key each) through
   ``foreachBatch(CommitLogSink)`` into one broker directory of 8 queues as fast as it goes,
   ``local[2]``, the sink's own retention deleting what is uploaded. The same samples, bounds
   and target; the writer's CPU is this process's tree less the uploader's.

The machine's load average is recorded at the start and end of every figure; other work runs
on this machine, which is why figures alternate and take medians. Needs root and
``../shared/ceph`` (skipped, saying which, otherwise).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench import s3clients
from bench.common import (
    MB,
    PROJECT_DIR,
    Options,
    PartResult,
    Row,
    log,
    median,
    pinned_to_one_cpu,
    process_tree_cpu_s,
    processes_pinned,
    scratch_dir,
    spread,
)
from bench.store import TOPIC, make_table
from bench.tier_ops import Counting, delete_uploaded
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files.localsegments import LocalSegments
from rocketstore.pipeline.tier import localstate
from rocketstore.pipeline.tier.manifest import tier_prefix
from rocketstore.pipeline.tier.objects import ObjectStore
from rocketstore.pipeline.tier.remote import READ_AHEAD, RemoteQueue, RemoteSegments
from rocketstore.pipeline.tier.upload import Uploader, flushed_offset, sealed_bases, upload_lag_s
from rocketstore.source import options as source_options
from rocketstore.source import schema
from rocketstore.source.planning import Planner, QueueRange
from rocketstore.source.read import ReadContext, read_context
from rocketstore.source.tierread import read_key_range, read_ranges, read_tier_range

MiB = 1 << 20
GiB = 1 << 30
GB = 10**9
BODY = 100
WIDE_QUEUES = 4000
WIDE_BODY = 200
HOT_BATCH = 100_000
# The bounded-disk figure: a writer paced to what the uploader sustains on this machine, small
# segments so that the tier holds many of them in a minute.
BOUNDED_SEGMENT = 16 * MiB
BOUNDED_MB_S = 10.0
BOUNDED_BATCH = 20_000
TARGET_TIER_OVER_LOCAL = 10.0
TARGET_HOT_RATIO = 0.95  # the put with the tier on, over the put with it off
TARGET_COLD_OVER_LOCAL = 0.5
TARGET_COLD_OVER_FLOOR = 0.7
TARGET_WIDE_AMPLIFICATION = 2.0
TARGET_KEY_MS = 200.0
TARGET_PACE = 0.95  # the tier's MB/s over the writer's
BROKER = "broker-0"  # a root's brokers are broker-<n>
# Figure 7's micro-batches: rows of the rate-micro-batch source each (the sink part's input
# files hold 1M rows; a batch this size keeps Spark's per-batch cost small beside its rows).
SINK_BATCH = 500_000


@dataclasses.dataclass(frozen=True)
class Sizes:
    segment: int
    hot_messages: int
    read_segments: int
    wide_messages: int
    keys: int
    minutes: float
    backlog_cap: int
    bucket_cap: int
    drain_s: float
    bounded_s: float


FULL = Sizes(
    segment=64 * MiB,
    hot_messages=4_000_000,
    read_segments=8,
    wide_messages=600_000,
    keys=20,
    minutes=10.0,
    backlog_cap=4 * GiB,
    bucket_cap=20 * GiB,
    drain_s=300.0,
    bounded_s=120.0,
)
QUICK = Sizes(
    segment=8 * MiB,
    hot_messages=200_000,
    read_segments=4,
    wide_messages=80_000,
    keys=5,
    minutes=0.5,
    backlog_cap=128 * MiB,
    bucket_cap=2 * GiB,
    drain_s=60.0,
    bounded_s=8.0,
)


def load() -> float:
    return os.getloadavg()[0]


# -- settings --------------------------------------------------------------------------------


class Tier:
    """The cluster's bucket and the settings of the stores under test."""

    def __init__(self, env: Mapping[str, str], bucket: str, segment: int) -> None:
        self.env = env
        self.bucket = bucket
        self.segment = segment

    def settings(self, *, tier: bool = True, **more: Any) -> dict[str, Any]:
        base: dict[str, Any] = {"mappedFileSizeCommitLog": self.segment}
        if tier:
            base.update(
                tieredStorageLevel="NOT_IN_DISK",
                objectStoreEndpoint=self.env["S3_ENDPOINT"],
                objectStoreBucket=self.bucket,
                objectStoreRegion=self.env.get("S3_REGION", "us-east-1"),
                objectStoreAccessKey=self.env["S3_ACCESS_KEY"],
                objectStoreSecretKey=self.env["S3_SECRET_KEY"],
            )
        return {**base, **more}

    def config(self, **kw: Any) -> StoreConfig:
        return StoreConfig().with_overrides(self.settings(**kw))

    def write_settings(self, path: Path, **kw: Any) -> Path:
        lines = [
            f"{k} = {v}" if isinstance(v, int) else f'{k} = "{v}"'
            for k, v in self.settings(**kw).items()
        ]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.env["S3_ENDPOINT"],
            region_name=self.env.get("S3_REGION", "us-east-1"),
            aws_access_key_id=self.env["S3_ACCESS_KEY"],
            aws_secret_access_key=self.env["S3_SECRET_KEY"],
            config=Config(s3={"addressing_style": "path"}),
        )


@contextmanager
def uploader_service(store: Path, settings: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``rocketstore tier upload --follow STORE`` beside the writer, ready (its tier record
    written) when the block starts, stopped with SIGTERM after it."""
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    cli = Path(sys.executable).with_name("rocketstore")
    proc = subprocess.Popen(
        [str(cli), "tier", "upload", "--follow", str(store), "--config", str(settings)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while localstate.read(store) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"the uploader did not start (exit {proc.poll()}):\n{err}")
            time.sleep(0.05)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        err = proc.stderr.read().decode() if proc.stderr else ""
        if proc.returncode not in (0, -signal.SIGTERM) and err:
            log(f"tier: the uploader ended with {proc.returncode}:\n{err[-2000:]}")


def write_store(path: Path, config: StoreConfig, messages: int, queues: int, body: int) -> None:
    """``messages`` of ``TOPIC`` over ``queues`` queues, in batches; the store closed."""
    batch = 100_000
    with MessageStore(path, config) as store:
        for first in range(0, messages, batch):
            n = min(batch, messages - first)
            store.put_batch(make_table(n, body, first, first_key=first, queues=queues))


def fill_segments(path: Path, config: StoreConfig, segments: int, queues: int, body: int) -> int:
    """Messages until ``segments`` segments are sealed and the last holds a little; the count."""
    batch = 50_000
    written = 0
    with MessageStore(path, config) as store:
        while True:
            got = store.put_batch(
                make_table(batch, body, written, first_key=written, queues=queues)
            )
            written += batch
            if int(got.commit_log_offsets[-1]) >= segments * config.mapped_file_size_commitlog:
                return written


def tier_root(root: Path, queues: int) -> Path:
    """A store root with ``TOPIC`` of ``queues`` queues; its broker directory's path."""
    StoreRoot(root).ensure_topic(TOPIC, TopicMeta(1, queues))
    return root / BROKER


def upload_and_delete(store: Path, config: StoreConfig) -> list[int]:
    """Every sealed segment uploaded, then deleted locally by retention; the bases."""
    done = Uploader(store, config).run_once().uploaded
    with MessageStore(store, config, background=False) as s:
        delete_uploaded(s)
    left = LocalSegments(store / "commitlog").listed()
    if left and done and left[0] <= done[-1]:
        raise RuntimeError(f"{store}: uploaded {len(done)} segments, {left} still local")
    return done


# -- 1. the hot path -------------------------------------------------------------------------


def hot_path(c: s3clients.Cluster, tier: Tier, sizes: Sizes, options: Options) -> dict[str, Any]:
    table = make_table(sizes.hot_messages, BODY, options.seed)
    # Puts of HOT_BATCH messages, as the sink's micro-batches make them: between two puts the
    # flusher publishes its flushed point, so segments are sealed (and the uploader uploads
    # them) while the writer goes on. One put of all of them would hold the store's lock
    # throughout, and nothing would be sealed before it returned.
    batches = [table.slice(a, HOT_BATCH) for a in range(0, sizes.hot_messages, HOT_BATCH)]
    runs: list[dict[str, Any]] = []
    for i in range(options.runs):
        pair: dict[str, Any] = {"load1": load()}
        for mode in s3clients.rotate(HOT_MODES, i):
            with scratch_dir(options.work_dir, f"tier-hot-{mode}-") as work:
                pair[mode] = _hot_run(c, tier, work, batches, mode, f"hot{i}{mode}/", options.pin)
                pair[mode]["msgs_per_s"] = sizes.hot_messages / pair[mode]["wall_s"]
        for mode in ("apart", "shared"):
            pair[f"ratio_{mode}"] = pair[mode]["msgs_per_s"] / pair["off"]["msgs_per_s"]
            pair[f"cpu_ratio_{mode}"] = pair["off"]["cpu_s"] / pair[mode]["cpu_s"]
        runs.append(pair)
        log(
            f"tier: hot path run {i + 1}: on/off {pair['ratio_apart']:.3f} apart, "
            f"{pair['ratio_shared']:.3f} sharing the CPUs (load {pair['load1']:.1f})"
        )
    out: dict[str, Any] = {"runs": runs, "messages": sizes.hot_messages}
    for mode in HOT_MODES:
        out[f"{mode}_msgs_per_s"] = spread([r[mode]["msgs_per_s"] for r in runs])
    for mode in ("apart", "shared"):
        out[f"ratio_{mode}"] = spread([r[f"ratio_{mode}"] for r in runs])
        out[f"cpu_ratio_{mode}"] = spread([r[f"cpu_ratio_{mode}"] for r in runs])
        out[f"uploader_cpu_s_{mode}"] = spread([r[mode]["uploader_cpu_s"] for r in runs])
        out[f"server_cpu_s_{mode}"] = spread([r[mode]["server_cpu_s"] for r in runs])
        out[f"uploaded_{mode}"] = [r[mode]["uploaded_segments"] for r in runs]
    return out


# The hot path's three ways: the tier off; on, with the uploader and radosgw kept off the CPU
# the puts run on (as on a machine with more than this one's two vCPUs and an S3 server of its
# own: the target's case); on, all of them free to run on either CPU (this machine as it is).
HOT_MODES = ("off", "apart", "shared")


def _hot_run(
    c: s3clients.Cluster,
    tier: Tier,
    work: Path,
    batches: list[Any],
    mode: str,
    prefix: str,
    pin: bool,
) -> dict[str, Any]:
    store = work / BROKER
    on = mode != "off"
    settings = tier.write_settings(
        work / "store.toml", tier=on, tieredStoreGroupCommitTimeout=1000, objectStorePrefix=prefix
    )
    config = StoreConfig.load(settings)
    MessageStore(store, config).close()  # the directory the uploader follows
    service = uploader_service(store, settings) if on else None
    with service if service is not None else _nothing() as proc:
        s = MessageStore(store, config)
        try:
            with pinned_to_one_cpu(pin) as cpu:
                others = os.sched_getaffinity(0) if cpu is None else {cpu}
                rest = set(range(os.cpu_count() or 1)) - others
                beside = c.pids() + ([proc.pid] if proc is not None else [])
                keep_apart = (
                    processes_pinned(beside, rest) if mode == "apart" and rest else _nothing()
                )
                with keep_apart:
                    before = _beside_cpu_s(c, proc)
                    c0 = time.process_time()
                    t0 = time.perf_counter()
                    for batch in batches:
                        s.put_batch(batch)
                    wall = time.perf_counter() - t0
                    cpu_s = time.process_time() - c0
                    used = [b - a for a, b in zip(before, _beside_cpu_s(c, proc), strict=True)]
            # Read before the close: what the uploader did while the puts ran.
            state = localstate.read(store)
        finally:
            s.close()
    return {
        "wall_s": wall,
        "cpu_s": cpu_s,
        "uploaded_segments": state.bucket_segments if on and state else 0,
        # CPU seconds the uploader and radosgw + its OSD used meanwhile: on this machine they
        # share the writer's 2 vCPUs (in production the S3 server would not).
        "uploader_cpu_s": used[0],
        "server_cpu_s": used[1],
    }


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


def _beside_cpu_s(c: s3clients.Cluster, uploader: subprocess.Popen[bytes] | None) -> list[float]:
    """CPU seconds used so far by the uploader (0 without one) and by radosgw and its OSD."""
    return [process_tree_cpu_s(uploader.pid) if uploader is not None else 0.0, c.server_cpu_s()]


# -- 2. the cold streaming read --------------------------------------------------------------


def plan_read(opts: Mapping[str, str]) -> tuple[Planner, ReadContext]:
    """A batch read's planner and the context its partitions read with, as the source makes
    them on the driver."""
    parsed = source_options.parse(opts, streaming=False)
    return Planner(parsed), read_context(parsed)


def source_read(opts: Mapping[str, str]) -> dict[str, Any]:
    """Every message of the topic, planned and read as the executors read (no Spark)."""
    t0 = time.perf_counter()
    planner, ctx = plan_read(opts)
    partitions = planner.packed(*planner.batch_range())
    planned = time.perf_counter()
    rows = cold_rows = 0
    nbytes = 0
    for part in partitions:
        cold = all(r.cold for r in part)
        for batch in read_ranges(part, ctx):
            rows += batch.num_rows
            nbytes += batch.nbytes
            cold_rows += batch.num_rows if cold else 0
    done = time.perf_counter()
    return {
        "s": done - t0,
        "plan_s": planned - t0,
        "rows": rows,
        "cold_rows": cold_rows,
        "arrow_bytes": nbytes,
        "partitions": len(partitions),
    }


def floor_read(tier: Tier, keys: list[tuple[str, int]]) -> dict[str, Any]:
    """The tier's CommitLog objects, each once, in 8 MiB ranged GETs on one thread."""
    s3 = tier.client()
    t0 = time.perf_counter()
    got = 0
    for key, length in keys:
        for a in range(0, length, READ_AHEAD):
            b = min(length, a + READ_AHEAD)
            body = s3.get_object(Bucket=tier.bucket, Key=key, Range=f"bytes={a}-{b - 1}")["Body"]
            got += len(body.read())
    return {"s": time.perf_counter() - t0, "bytes": got}


def cold_read(
    c: s3clients.Cluster, tier: Tier, sizes: Sizes, options: Options, work: Path
) -> dict[str, Any]:
    root = work / "cold"
    store = tier_root(root, 8)
    # Each store its own prefix: two stores never share one.
    config = tier.config(objectStorePrefix="cold/")
    messages = fill_segments(store, config, sizes.read_segments, 8, BODY)
    local_root = work / "local"
    shutil.copytree(root, local_root)  # the twin, before retention deletes the sealed segments
    bases = upload_and_delete(store, config)
    prefix = tier_prefix(store, config)
    objects = [
        (f"{prefix}commitlog/{b:020d}", n)
        for b, n in ((b, _length(tier, f"{prefix}commitlog/{b:020d}")) for b in bases)
    ]
    object_bytes = sum(n for _, n in objects)
    cold_conf = tier.write_settings(work / "cold.toml", objectStorePrefix="cold/")
    local_conf = tier.write_settings(work / "local.toml", tier=False)
    cold_opts = {"path": str(root), "topic": TOPIC, "config": str(cold_conf)}
    local_opts = {"path": str(local_root), "topic": TOPIC, "config": str(local_conf)}
    source_read(cold_opts)  # warm-up: imports, the client, the native decoder
    runs: list[dict[str, Any]] = []
    for i in range(options.runs):
        run: dict[str, Any] = {"load1": load()}
        for what in s3clients.rotate(["local", "cold", "floor"], i):
            if what == "floor":
                run[what] = floor_read(tier, objects)
            elif what == "cold":
                before = c.perf()
                run[what] = source_read(cold_opts)
                after = c.perf()
                run[what]["rgw_get_bytes"] = after.get("get_b", 0) - before.get("get_b", 0)
                run[what]["rgw_gets"] = after.get("get", 0) - before.get("get", 0)
            else:
                run[what] = source_read(local_opts)
        if run["cold"]["rows"] != run["local"]["rows"] or run["local"]["rows"] != messages:
            raise RuntimeError(
                f"cold read {run['cold']['rows']} rows, local {run['local']['rows']}, "
                f"written {messages}"
            )
        run["cold_over_local"] = run["local"]["s"] / run["cold"]["s"]
        run["cold_over_floor"] = run["floor"]["s"] / run["cold"]["s"]
        runs.append(run)
        log(
            f"tier: cold read run {i + 1}: {run['cold']['s']:.2f} s, local "
            f"{run['local']['s']:.2f} s, floor {run['floor']['s']:.2f} s (load {run['load1']:.1f})"
        )
    spark = None
    if not options.quick:  # a Spark session is a minute on this machine: not for a smoke run
        log("tier: the same reads through Spark")
        spark = spark_reads(cold_opts, local_opts, work)
        for what in ("local", "cold"):
            if spark[what]["rows"] != messages:
                raise RuntimeError(f"Spark read {spark[what]['rows']} of {messages} ({what})")
    return {
        "runs": runs,
        "spark": spark,
        "messages": messages,
        "segments_in_tier": len(bases),
        "object_bytes": object_bytes,
        "cold_share": median([r["cold"]["cold_rows"] / r["cold"]["rows"] for r in runs]),
        "cold_msgs_per_s": spread([messages / r["cold"]["s"] for r in runs]),
        "local_msgs_per_s": spread([messages / r["local"]["s"] for r in runs]),
        "floor_mb_per_s": spread([r["floor"]["bytes"] / r["floor"]["s"] / MB for r in runs]),
        "cold_object_mb_per_s": spread([object_bytes / r["cold"]["s"] / MB for r in runs]),
        "cold_over_local": spread([r["cold_over_local"] for r in runs]),
        "cold_over_floor": spread([r["cold_over_floor"] for r in runs]),
        "rgw_bytes_over_objects": median([r["cold"]["rgw_get_bytes"] / object_bytes for r in runs]),
        "rgw_gets": median([r["cold"]["rgw_gets"] for r in runs]),
        "store": store,
        "config": config,
        "cold_opts": cold_opts,
    }


def spark_reads(
    cold_opts: Mapping[str, str], local_opts: Mapping[str, str], work: Path
) -> dict[str, Any]:
    """The same two reads once each through Spark (``readStream`` from the earliest offsets,
    ``availableNow``, into ``noop``, ``local[2]``), after an untimed warm-up of the local one:
    what a query sees, the session's and the Python workers' costs included."""
    from bench.session import local_session

    spark, owned = local_session("rocketstore-bench-tier")
    out: dict[str, Any] = {}
    try:
        for what, opts in (("warm-up", local_opts), ("local", local_opts), ("cold", cold_opts)):
            t0 = time.perf_counter()
            query = (
                spark.readStream.format("rocketstore")
                .options(**opts)
                .option("startingOffsets", "earliest")
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", str(work / f"checkpoint-{what}"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            rows = sum(int(p["numInputRows"]) for p in query.recentProgress)
            out[what] = {"s": time.perf_counter() - t0, "rows": rows, "load1": load()}
    finally:
        if owned:
            spark.stop()
    del out["warm-up"]
    out["cold_over_local"] = out["local"]["s"] / out["cold"]["s"]
    return out


def _length(tier: Tier, key: str) -> int:
    return int(tier.client().head_object(Bucket=tier.bucket, Key=key)["ContentLength"])


# -- 3. one queue among 4,000 -----------------------------------------------------------------


def one_queue(tier: Tier, sizes: Sizes, options: Options, work: Path) -> dict[str, Any]:
    root = work / "wide"
    store = tier_root(root, WIDE_QUEUES)
    config = tier.config(objectStorePrefix="wide/")
    write_store(store, config, sizes.wide_messages, WIDE_QUEUES, WIDE_BODY)
    bases = upload_and_delete(store, config)
    prefix = tier_prefix(store, config)
    ctx = ReadContext(schema=schema.arrow_schema(None), root=str(root), config=config)
    queue_id = random.Random(options.seed).randrange(WIDE_QUEUES)
    runs: list[dict[str, Any]] = []
    for _ in range(options.runs):
        counting = Counting(ObjectStore(config, check=False))
        remote = RemoteSegments(counting, prefix)
        q = RemoteQueue(remote, TOPIC, queue_id)
        first, end = q.min_offset(), q.max_offset()
        assert first is not None and end is not None
        message_bytes = int(q.units(first, end)["size"].sum())
        # A fresh reader for the read itself: what a partition of that queue costs.
        counting = Counting(ObjectStore(config, check=False))
        remote = RemoteSegments(counting, prefix)
        rng = QueueRange(TOPIC, BROKER, str(store), queue_id, first, end, prefix, True)
        t0 = time.perf_counter()
        rows = sum(b.num_rows for b in read_tier_range(rng, ctx, remote))
        runs.append(
            {
                "s": time.perf_counter() - t0,
                "rows": rows,
                "message_bytes": message_bytes,
                "commitlog_bytes": counting.commitlog_bytes,
                "commitlog_gets": counting.commitlog_gets,
                "other_bytes": counting.bytes - counting.commitlog_bytes,
                "other_gets": counting.gets - counting.commitlog_gets,
                "amplification": counting.commitlog_bytes / message_bytes,
            }
        )
        if rows != end - first:
            raise RuntimeError(f"queue {queue_id}: read {rows} of {end - first} messages")
    return {
        "queue_id": queue_id,
        "queues": WIDE_QUEUES,
        "segments_in_tier": len(bases),
        "runs": runs,
        "read_ms": spread([r["s"] * 1000 for r in runs]),
        "amplification": median([r["amplification"] for r in runs]),
    }


# -- 4. key look-ups -------------------------------------------------------------------------


def key_lookups(tier: Tier, sizes: Sizes, options: Options, cold: dict[str, Any]) -> dict[str, Any]:
    store: Path = cold["store"]
    config: StoreConfig = cold["config"]
    in_tier = cold["messages"] * cold["cold_share"]
    rnd = random.Random(options.seed)
    keys = [f"order-{rnd.randrange(int(in_tier * 0.98))}" for _ in range(sizes.keys)]
    client = ObjectStore(config)
    prefix = tier_prefix(store, config)
    direct: list[float] = []
    planned: list[float] = []
    read: list[float] = []
    for key in keys:
        t0 = time.perf_counter()
        found = RemoteSegments(client, prefix).query_key(TOPIC, key)
        direct.append((time.perf_counter() - t0) * 1000)
        if len(found) != 1:
            raise RuntimeError(f"query_key {key}: {len(found)} messages, expected 1")
        t0 = time.perf_counter()
        planner, ctx = plan_read({**cold["cold_opts"], "key": key})
        ranges = planner.key_ranges()
        t1 = time.perf_counter()
        rows = sum(b.num_rows for kr in ranges for b in read_key_range(kr, ctx))
        t2 = time.perf_counter()
        if rows != 1:
            raise RuntimeError(f"the source's key read of {key}: {rows} rows, expected 1")
        planned.append((t1 - t0) * 1000)
        read.append((t2 - t1) * 1000)
    return {
        "keys": len(keys),
        "query_key_ms": spread(direct),
        "source_read_ms": spread(read),
        "source_plan_ms": spread(planned),
    }


# -- 5. local disk bounded, every message once ------------------------------------------------


def _disk_bytes(path: Path) -> int:
    """Bytes the files under ``path`` hold on disk (allocated blocks: segments are sparse)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # retention deleted it meanwhile
                total += os.stat(os.path.join(folder, name)).st_blocks * 512
    return total


def read_offsets(opts: Mapping[str, str]) -> dict[int, list[npt.NDArray[np.int64]]]:
    """Each queue's offsets as the source reads the topic (both tiers), in reading order."""
    planner, ctx = plan_read(opts)
    out: dict[int, list[npt.NDArray[np.int64]]] = {}
    for part in planner.packed(*planner.batch_range()):
        for batch in read_ranges(part, ctx):
            offsets = batch.column("queueOffset").to_numpy().astype(np.int64)
            queue_id = batch.column("queueId")[0].as_py()
            out.setdefault(queue_id, []).append(offsets)
    return out


def bounded_geometry(segment: int) -> dict[str, int]:
    """RocketMQ's IndexFile and ConsumeQueue file sizes scaled down with the CommitLog segment
    from its 1 GiB: what the local directory keeps besides the segments is one IndexFile being
    filled (kept until the CommitLog it covers is gone) and a ConsumeQueue file a queue, so
    with 16 MiB segments and RocketMQ's 420 MB IndexFile the index alone would be most of the
    local disk (docs/tiering.md, "The local side")."""
    scale = segment / GiB
    units = max(1, round(300_000 * scale))
    return {
        "maxIndexNum": max(2, round(20_000_000 * scale)),
        "maxHashSlotNum": max(1, round(5_000_000 * scale)),
        "mappedFileSizeConsumeQueue": units * 20,
    }


def bounded(tier: Tier, sizes: Sizes, work: Path) -> dict[str, Any]:
    seg = Tier(tier.env, tier.bucket, BOUNDED_SEGMENT)
    root = work / "bounded"
    store = tier_root(root, 8)
    settings = seg.write_settings(
        work / "bounded.toml", objectStorePrefix="bounded/", **bounded_geometry(BOUNDED_SEGMENT)
    )
    config = StoreConfig.load(settings)
    MessageStore(store, config).close()
    status = work / "bounded.json"
    local: list[int] = []
    with uploader_service(store, settings):
        writer = subprocess.Popen(
            [sys.executable, "-m", "bench.tier_ops", "writer", str(store), str(settings),
             str(sizes.bounded_s), str(status), str(BOUNDED_BATCH), str(BOUNDED_MB_S)],
            cwd=PROJECT_DIR,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            while writer.poll() is None:
                time.sleep(0.25)
                local.append(_disk_bytes(store))
        finally:
            if writer.poll() is None:
                Path(f"{status}.stop").touch()
            writer.wait(timeout=300)
        if writer.returncode != 0:
            raise RuntimeError(f"the writer failed (exit {writer.returncode})")
        segments = LocalSegments(store / "commitlog", segment_size=BOUNDED_SEGMENT)
        _drain(store, segments, BOUNDED_SEGMENT, status, 120.0)
    acked = int(json.loads(status.read_text())["messages"])
    in_tier = RemoteSegments(ObjectStore(config), tier_prefix(store, config)).entries
    tier_bytes = sum(e.length for e in in_tier)
    got = read_offsets({"path": str(root), "topic": TOPIC, "config": str(settings)})
    # Every acknowledged message once: puts of BOUNDED_BATCH spread evenly over the 8 queues,
    # so each queue must give exactly offsets 0 .. acked / 8 - 1, whichever tier held them.
    once = sorted(got) == list(range(8)) and all(
        np.array_equal(np.sort(np.concatenate(parts)), np.arange(acked // 8))
        for parts in got.values()
    )
    return {
        "segment": BOUNDED_SEGMENT,
        "geometry": bounded_geometry(BOUNDED_SEGMENT),
        "mb_per_s": BOUNDED_MB_S,
        "seconds": sizes.bounded_s,
        "acked": acked,
        "read": sum(len(p) for parts in got.values() for p in parts),
        "exactly_once": once,
        "segments_in_tier": len(in_tier),
        "tier_bytes": tier_bytes,
        "max_local_bytes": max(local),
        "tier_over_local": tier_bytes / max(local),
    }


# -- 6. upload keeps pace --------------------------------------------------------------------


def upload_pace(
    c: s3clients.Cluster, tier: Tier, sizes: Sizes, options: Options, work: Path
) -> dict[str, Any]:
    """Figure 6 with the store's batch put as the writer (a process of its own)."""
    seconds = 60 * (options.minutes if options.minutes is not None else sizes.minutes)
    store = work / "pace" / BROKER
    settings = tier.write_settings(work / "pace.toml", objectStorePrefix="pace/")
    MessageStore(store, StoreConfig.load(settings)).close()
    status = work / "writer.json"
    with uploader_service(store, settings) as uploader:
        writer = subprocess.Popen(
            [sys.executable, "-m", "bench.tier_ops", "writer", str(store), str(settings),
             str(seconds), str(status)],
            cwd=PROJECT_DIR,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip

        def halt() -> None:
            Path(f"{status}.stop").touch()

        try:
            run = _pace_run(
                c, sizes, store, status, uploader, writing=lambda: writer.poll() is None,
                writer_cpu_s=lambda: process_tree_cpu_s(writer.pid), stop=halt,
            )  # fmt: skip
        finally:
            if writer.poll() is None:
                halt()
            writer.wait(timeout=300)
        if writer.returncode != 0:
            raise RuntimeError(f"the writer failed (exit {writer.returncode})")
        run.drain(c, uploader)
    return run.result(seconds, json.loads(status.read_text()))


def sink_pace(
    c: s3clients.Cluster, tier: Tier, sizes: Sizes, options: Options, work: Path
) -> dict[str, Any]:
    """Figure 7: figure 6 with the Spark sink as the writer, as the issue words the target: a
    streaming query of ``rate-micro-batch`` rows (a 100-byte body and a key each, as the sink
    part's input) through ``foreachBatch(CommitLogSink)`` into one broker directory of 8
    queues, micro-batch after micro-batch as fast as it goes, on ``local[2]`` beside the
    uploader and radosgw. The writer's end is the store's published flushed offset (each
    micro-batch's append closes the store, which publishes it)."""
    from pyspark.sql import functions as F

    from bench.session import local_session
    from rocketstore.sink.foreach import CommitLogSink

    seconds = 60 * (options.minutes if options.minutes is not None else sizes.minutes)
    root = work / "sinkpace"
    store = tier_root(root, 8)
    # Retention in the sink's appends (every 10 s) deletes each segment once uploaded (the
    # tier's gate keeps the rest), at any hour: the local disk holds the backlog, not the run.
    settings = tier.write_settings(
        work / "sinkpace.toml",
        objectStorePrefix="sinkpace/",
        fileReservedTime=0,
        deleteWhen=";".join(f"{h:02d}" for h in range(24)),
    )
    MessageStore(store, StoreConfig.load(settings)).close()
    status = work / "sink-writer.json"
    spark, owned = local_session("rocketstore-bench-tier-sink", **{"spark.driver.memory": "4g"})
    value = F.col("value")
    rows = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", SINK_BATCH)
        .load()
        .select(
            F.concat(F.lit("customer-"), (value % 100_000).cast("string")).alias("keys"),
            F.rpad(F.concat(F.lit("order-"), value.cast("string"), F.lit(" ")), BODY, "x")
            .cast("binary")
            .alias("body"),
        )
    )
    sink = CommitLogSink(str(root), topic=TOPIC, config=str(settings))
    # Stopped between micro-batches, not in one: a query stopped while its foreachBatch runs
    # interrupts the Python call (the JVM then fails formatting the error). Past the run's
    # end the function appends nothing; the query stops once the batch in hand is done.
    ending = threading.Event()
    idle = threading.Event()
    idle.set()

    def append(df: Any, batch_id: int) -> None:
        if ending.is_set():
            return
        idle.clear()
        try:
            sink(df, batch_id)
        finally:
            idle.set()

    def stop(query: Any) -> None:
        ending.set()
        idle.wait(timeout=600)
        query.stop()

    t0 = time.monotonic()

    def progress() -> None:
        end = flushed_offset(store)
        status.write_text(json.dumps({"t": time.monotonic() - t0, "end": end, "messages": 0}))

    try:
        with uploader_service(store, settings) as uploader:
            progress()
            query = (
                rows.writeStream.option("checkpointLocation", str(work / "sinkpace-checkpoint"))
                .foreachBatch(append)
                .start()
            )
            stop_at = time.monotonic() + seconds

            # This process's tree is the driver, its JVM and the Python workers, and the
            # uploader (a child too): the sink's share is the rest.
            def sink_cpu_s() -> float:
                return process_tree_cpu_s() - process_tree_cpu_s(uploader.pid)

            try:
                run = _pace_run(
                    c, sizes, store, status, uploader,
                    writing=lambda: query.isActive and time.monotonic() < stop_at,
                    writer_cpu_s=sink_cpu_s, stop=lambda: stop(query), before_sample=progress,
                )  # fmt: skip
            finally:
                stop(query)
            if query.exception() is not None:
                raise RuntimeError(f"the sink's query failed: {query.exception()}")
            progress()
            run.drain(c, uploader)
        final = json.loads(status.read_text())
        final["messages"] = sum(b.appended for b in sink.history)
    finally:
        if owned:
            spark.stop()
    out = run.result(seconds, final)
    out["batches"] = len(sink.history)
    return out


@dataclasses.dataclass
class _PaceRun:
    """What one upload run sampled (see :func:`_pace_run`); :meth:`drain` then times the
    uploader alone and :meth:`result` sums it all up."""

    store: Path
    segments: LocalSegments
    sizes: Sizes
    status: Path
    samples: list[dict[str, Any]]
    stopped: str
    cpu0: list[float]
    cpu1: list[float]
    load_start: float
    drained: dict[str, Any] = dataclasses.field(default_factory=dict)

    def drain(self, c: s3clients.Cluster, uploader: subprocess.Popen[bytes]) -> None:
        beside = _beside_cpu_s(c, uploader)
        drain = _drain(self.store, self.segments, self.sizes.segment, self.status,
                       self.sizes.drain_s)  # fmt: skip
        used = [b - a for a, b in zip(beside, _beside_cpu_s(c, uploader), strict=True)]
        self.drained = {
            **drain,
            "uploader_cpu_s_per_gb": used[0] / max(drain["bytes"], 1) * GB,
            "server_cpu_s_per_gb": used[1] / max(drain["bytes"], 1) * GB,
        }

    def result(self, seconds: float, final: dict[str, Any]) -> dict[str, Any]:
        samples = self.samples
        if not samples:
            raise RuntimeError("no sample of the upload run")
        duration = float(final["t"])
        last = samples[-1]
        writer_mb_s = final["end"] / duration / MB
        tier_mb_s = last["uploaded_end"] / last["t"] / MB
        return {
            "seconds_planned": seconds,
            "seconds": duration,
            "stopped_early": self.stopped,
            "segment": self.sizes.segment,
            "messages": final["messages"],
            "writer_mb_per_s": writer_mb_s,
            "tier_mb_per_s": tier_mb_s,
            "pace": tier_mb_s / writer_mb_s,
            "max_lag_segments": max(s["pending"] for s in samples),
            "max_lag_s": max(s["lag_s"] for s in samples),
            "end_lag_segments": last["pending"],
            "end_lag_s": last["lag_s"],
            "max_backlog_bytes": max(s["backlog_bytes"] for s in samples),
            "drain": self.drained,
            # CPU seconds per GB each side moved while the writer ran (the writer's per GB
            # it wrote; the others' per GB uploaded), sampled up to the last second of the run.
            "cpu_s_per_gb": {
                name: (b - a) / max(moved, 1) * GB
                for name, a, b, moved in zip(
                    ("writer", "uploader", "server"),
                    self.cpu0,
                    self.cpu1,
                    (last["writer_end"], last["uploaded_end"], last["uploaded_end"]),
                    strict=True,
                )
            },
            "load_start": self.load_start,
            "load_end": load(),
            "samples": samples,
        }


def _pace_run(
    c: s3clients.Cluster,
    sizes: Sizes,
    store: Path,
    status: Path,
    uploader: subprocess.Popen[bytes],
    *,
    writing: Callable[[], bool],
    writer_cpu_s: Callable[[], float],
    stop: Callable[[], None],
    before_sample: Callable[[], None] | None = None,
) -> _PaceRun:
    """Samples the upload every second while ``writing()``: the writer's end (from
    ``status``), the tier record, the sealed segments pending, the lag; stops the writer
    (``stop``) when the local backlog or the bucket passes its bound, saying which. CPU
    seconds of the writer, the uploader and radosgw with its OSD from the first sample to
    the last."""
    segments = LocalSegments(store / "commitlog", segment_size=sizes.segment)
    run = _PaceRun(store, segments, sizes, status, [], "", [], [], load())
    run.cpu0 = run.cpu1 = [writer_cpu_s(), *_beside_cpu_s(c, uploader)]
    t0 = time.monotonic()
    while writing():
        time.sleep(1.0)
        if before_sample is not None:
            before_sample()
        sample = _sample(store, segments, sizes.segment, status, time.monotonic() - t0)
        if sample is None:
            continue
        run.samples.append(sample)
        if not run.stopped and sample["backlog_bytes"] > sizes.backlog_cap:
            run.stopped = f"local backlog past {sizes.backlog_cap / GiB:.1f} GiB"
        elif not run.stopped and sample["bucket_bytes"] > sizes.bucket_cap:
            run.stopped = f"bucket past {sizes.bucket_cap / GiB:.1f} GiB"
        run.cpu1 = [writer_cpu_s(), *_beside_cpu_s(c, uploader)]
        if run.stopped:
            stop()
            break
    return run


def _drain(
    store: Path, segments: LocalSegments, size: int, status: Path, limit_s: float
) -> dict[str, Any]:
    """The uploader alone once the writer stopped: how fast it clears the backlog (what it
    can do with the machine to itself and radosgw), for at most ``limit_s``."""
    t0 = time.monotonic()
    first = _sample(store, segments, size, status, 0.0)
    assert first is not None
    last = first
    while last["pending"] and time.monotonic() - t0 < limit_s:
        time.sleep(1.0)
        got = _sample(store, segments, size, status, time.monotonic() - t0)
        last = got if got is not None else last
    uploaded = last["uploaded_end"] - first["uploaded_end"]
    return {
        "s": last["t"],
        "bytes": uploaded,
        "mb_per_s": uploaded / last["t"] / MB if last["t"] > 0 else 0.0,
        "pending_left": last["pending"],
    }


def _sample(
    store: Path, segments: LocalSegments, size: int, status: Path, t: float
) -> dict[str, Any] | None:
    try:
        writer = json.loads(status.read_text())
    except (OSError, ValueError):
        return None
    state = localstate.read(store)
    uploaded_end = state.uploaded_end if state is not None else 0
    segments.relist()
    sealed = sealed_bases(segments, size, flushed_offset(store))
    pending = [b for b in sealed if b >= uploaded_end]
    return {
        "t": t,
        "writer_end": writer["end"],
        "uploaded_end": uploaded_end,
        "pending": len(pending),
        "backlog_bytes": max(0, writer["end"] - uploaded_end),
        "lag_s": upload_lag_s(store, pending, segments, time.time_ns() // 1_000_000),
        "bucket_bytes": state.bucket_bytes if state is not None else 0,
        "load1": load(),
    }


# -- the table --------------------------------------------------------------------------------


def _at_least(
    name: str, unit: str, values: dict[str, float], baseline: str, ratio: float, target: float
) -> Row:
    """A row whose ratio to ``baseline`` (measured in the same run) must be >= ``target``."""
    return Row.of(
        name,
        unit,
        values,
        baseline=baseline,
        ratio=ratio,
        target=f">= {target} x",
        met=ratio >= target,
    )


def rows(data: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    hot = data.get("hot")
    if hot:
        out.append(Row.of("put, tier off", "msgs/s", hot["off_msgs_per_s"]))
        out.append(
            _at_least(
                "put, tier on (early roll, uploader beside, on the other CPU)",
                "msgs/s",
                hot["apart_msgs_per_s"],
                "tier off",
                hot["ratio_apart"]["median"],
                TARGET_HOT_RATIO,
            )
        )
        out.append(
            Row.of(
                "put, tier on, uploader and radosgw on either CPU",
                "msgs/s",
                hot["shared_msgs_per_s"],
                baseline="tier off",
                ratio=hot["ratio_shared"]["median"],
            )
        )
    cold = data.get("cold")
    if cold:
        out.append(Row.of("source read, local disk", "msgs/s", cold["local_msgs_per_s"]))
        out.append(Row.of("raw ranged GETs of the objects", "MB/s", cold["floor_mb_per_s"]))
        for name, unit, values, baseline, ratio, target in (
            ("vs local", "msgs/s", "cold_msgs_per_s", "local disk", "cold_over_local",
             TARGET_COLD_OVER_LOCAL),
            ("vs raw GETs", "MB/s", "cold_object_mb_per_s", "raw GETs, same bytes",
             "cold_over_floor", TARGET_COLD_OVER_FLOOR),
        ):  # fmt: skip
            out.append(
                _at_least(
                    f"source read, cold ({name})",
                    unit,
                    cold[values],
                    baseline,
                    cold[ratio]["median"],
                    target,
                )
            )
    spark = (cold or {}).get("spark")
    if spark:
        out.append(Row("Spark: source -> noop, local disk", "s", spark["local"]["s"]))
        out.append(
            Row(
                "Spark: source -> noop, cold (one run)",
                "s",
                spark["cold"]["s"],
                baseline="local disk",
                ratio=spark["cold_over_local"],
                target=f">= {TARGET_COLD_OVER_LOCAL} x",
                met=spark["cold_over_local"] >= TARGET_COLD_OVER_LOCAL,
            )
        )
    wide = data.get("wide")
    if wide:
        out.append(
            Row(
                f"one queue of {wide['queues']}: CommitLog bytes fetched",
                "x its bytes",
                wide["amplification"],
                target=f"< {TARGET_WIDE_AMPLIFICATION} x",
                met=wide["amplification"] < TARGET_WIDE_AMPLIFICATION,
            )
        )
    keys = data.get("keys")
    if keys:
        for label, name in (("query_key", "query_key_ms"), ("source key read", "source_read_ms")):
            out.append(
                Row.of(
                    f"key look-up, cold, {label}",
                    "ms",
                    keys[name],
                    target=f"< {TARGET_KEY_MS:g} ms",
                    met=keys[name]["median"] < TARGET_KEY_MS,
                )
            )
    bnd = data.get("bounded")
    if bnd:
        out.append(
            Row(
                "the tier's bytes over the most on local disk",
                "x",
                bnd["tier_over_local"],
                target=f">= {TARGET_TIER_OVER_LOCAL:g} x, every message once",
                met=bnd["tier_over_local"] >= TARGET_TIER_OVER_LOCAL and bnd["exactly_once"],
            )
        )
    for key, writer in (("pace", "batch put"), ("sinkpace", "Spark sink")):
        if data.get(key):
            out.extend(_pace_rows(data[key], writer))
    return out


def _pace_rows(pace: dict[str, Any], writer: str) -> list[Row]:
    keeps = pace["pace"] >= TARGET_PACE and not pace["stopped_early"].startswith("local")
    out = [
        Row(f"writer ({writer}, full rate)", "MB/s", pace["writer_mb_per_s"]),
        Row(
            f"tier upload beside the {writer}",
            "MB/s",
            pace["tier_mb_per_s"],
            baseline="writer",
            ratio=pace["pace"],
            target=f">= {TARGET_PACE} x, backlog bounded",
            met=keeps,
        ),
    ]
    if pace["drain"]["bytes"]:
        out.append(Row(f"tier upload alone, after the {writer}", "MB/s", pace["drain"]["mb_per_s"]))
    out.append(Row(f"largest upload lag ({writer})", "segments", pace["max_lag_segments"]))
    out.append(Row(f"largest upload lag ({writer})", "s", pace["max_lag_s"]))
    return out


def notes(data: dict[str, Any], sizes: Sizes) -> list[str]:
    out = [
        f"segments of {sizes.segment // MiB} MiB; load average 1 min at start "
        f"{data['load_start'][0]:.2f}, end {data['load_end'][0]:.2f}"
    ]
    hot = data.get("hot")
    if hot:
        for mode, name in (("apart", "on the other CPU"), ("shared", "on either CPU")):
            uploaded = hot[f"uploaded_{mode}"]
            out.append(
                f"hot path, uploader and radosgw {name}: {hot['messages']:,} messages in puts "
                f"of {HOT_BATCH:,}; CPU seconds off/on {hot[f'cpu_ratio_{mode}']['median']:.3f}; "
                f"the uploader had uploaded {min(uploaded)}-{max(uploaded)} segments when the "
                f"puts ended; meanwhile the uploader used "
                f"{hot[f'uploader_cpu_s_{mode}']['median']:.2f} CPU s and radosgw with its OSD "
                f"{hot[f'server_cpu_s_{mode}']['median']:.2f} (medians; the puts took "
                f"{median([r[mode]['wall_s'] for r in hot['runs']]):.2f} s)"
            )
    cold = data.get("cold")
    if cold:
        out.append(
            f"cold read: {cold['messages']:,} messages, {cold['cold_share']:.1%} from the tier "
            f"({cold['segments_in_tier']} segments, {cold['object_bytes'] / MB:.0f} MB); "
            f"radosgw sent {cold['rgw_bytes_over_objects']:.2f} x the objects' bytes in "
            f"{cold['rgw_gets']:.0f} GETs"
        )
    wide = data.get("wide")
    if wide:
        r = wide["runs"][0]
        out.append(
            f"one queue of {wide['queues']}: {r['rows']} messages, {r['message_bytes']:,} bytes; "
            f"CommitLog {r['commitlog_bytes']:,} bytes in {r['commitlog_gets']} GETs, index and "
            f"manifest {r['other_bytes']:,} bytes in {r['other_gets']} GETs; "
            f"{wide['read_ms']['median']:.0f} ms"
        )
    keys = data.get("keys")
    if keys:
        out.append(f"source key read: its plan took {keys['source_plan_ms']['median']:.0f} ms more")
    bnd = data.get("bounded")
    if bnd:
        out.append(
            f"bounded: {bnd['acked']:,} messages acknowledged at {bnd['mb_per_s']:g} MB/s for "
            f"{bnd['seconds']:g} s into {bnd['segment'] // MiB} MiB segments; the tier holds "
            f"{bnd['segments_in_tier']} ({bnd['tier_bytes'] / MB:.0f} MB), the store directory "
            f"at most {bnd['max_local_bytes'] / MB:.0f} MB on disk; read back across both tiers: "
            f"{bnd['read']:,} messages, "
            + ("each acknowledged one once" if bnd["exactly_once"] else "NOT each once")
        )
    for key, writer in (("pace", "batch put"), ("sinkpace", "Spark sink")):
        pace = data.get(key)
        if not pace:
            continue
        out.append(
            f"upload run beside the {writer}: {pace['seconds']:.0f} s of "
            f"{pace['seconds_planned']:.0f}"
            + (f" (stopped: {pace['stopped_early']})" if pace["stopped_early"] else "")
            + f"; lag at the end {pace['end_lag_segments']} segments, {pace['end_lag_s']:.1f} s"
        )
        per = pace.get("cpu_s_per_gb")
        if per:
            d = pace["drain"]
            out.append(
                f"upload run beside the {writer}, CPU s per GB: writer {per['writer']:.2f}, "
                f"uploader {per['uploader']:.2f}, radosgw with its OSD {per['server']:.2f}; "
                f"the upload alone: uploader {d['uploader_cpu_s_per_gb']:.2f}, radosgw with "
                f"its OSD {d['server_cpu_s_per_gb']:.2f}"
            )
    return out


@contextmanager
def phase(phases: dict[str, dict[str, float]], name: str) -> Iterator[None]:
    """Records the figure's time and the load average as it started and ended."""
    load_start, t0 = load(), time.monotonic()
    log(f"tier: {name} (load {load_start:.1f})")
    yield
    phases[name] = {"load1_start": load_start, "load1_end": load(), "s": time.monotonic() - t0}


# In the order they run; sinkpace (a Spark session) not with --quick.
FIGURES = ("hot", "cold", "wide", "keys", "bounded", "pace", "sinkpace")


def run(options: Options) -> PartResult:
    sizes = QUICK if options.quick else FULL
    want = set(options.figures or FIGURES)
    why = s3clients.unavailable()
    if why is not None:
        return PartResult("tier", [], {"skipped": why}, [f"skipped: {why}"])
    if options.quick:
        want.discard("sinkpace")  # a Spark session: not for a smoke run
    uploads = max(1, len(want & {"pace", "sinkpace"}))
    data: dict[str, Any] = {"sizes": dataclasses.asdict(sizes), "load_start": os.getloadavg()}
    phases: dict[str, dict[str, float]] = {}
    with (
        scratch_dir(options.work_dir, "tier-") as work,
        # Each upload run may fill its bound of the bucket: the OSD holds them all.
        s3clients.cluster("tier", osd_gb=int(uploads * sizes.bucket_cap // GiB) + 8) as c,
    ):
        c.restart_rgw("tcp_nodelay=1")
        tier = Tier(c.env, "rocketstore-bench", sizes.segment)
        tier.client().create_bucket(Bucket=tier.bucket)
        if "hot" in want:
            with phase(phases, "hot"):
                data["hot"] = hot_path(c, tier, sizes, options)
        if "cold" in want:
            with phase(phases, "cold"):
                cold = cold_read(c, tier, sizes, options, work)
            if "keys" in want:
                with phase(phases, "keys"):
                    data["keys"] = key_lookups(tier, sizes, options, cold)
            data["cold"] = {
                k: v for k, v in cold.items() if k not in ("store", "config", "cold_opts")
            }
            shutil.rmtree(work / "cold", ignore_errors=True)
            shutil.rmtree(work / "local", ignore_errors=True)
        if "wide" in want:
            with phase(phases, "wide"):
                data["wide"] = one_queue(tier, sizes, options, work)
            shutil.rmtree(work / "wide", ignore_errors=True)
        if "bounded" in want:
            with phase(phases, "bounded"):
                data["bounded"] = bounded(tier, sizes, work)
            shutil.rmtree(work / "bounded", ignore_errors=True)
        if "pace" in want:
            with phase(phases, "pace"):
                data["pace"] = upload_pace(c, tier, sizes, options, work)
            shutil.rmtree(work / "pace", ignore_errors=True)
        if "sinkpace" in want:
            with phase(phases, "sinkpace"):
                data["sinkpace"] = sink_pace(c, tier, sizes, options, work)
    data["phases"] = phases
    data["load_end"] = os.getloadavg()
    return PartResult("tier", rows(data), data, notes(data, sizes))
