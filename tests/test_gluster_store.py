"""The store across two hosts: a writer through one mount of a shared file system, readers and
a second writer through the other, on a replicated GlusterFS volume (tests/kit/gluster.py) and
on CephFS through ceph-fuse (tests/kit/cephfs.py) (rocketstore.pipeline.files.visibility).

* Readers on the other mount (read-only re-opens, the source's planner and its partition
  reads) never see damage while 100,000 messages go in, and see every message right.
* Two writers never hold one broker at once; when the writer (or its whole mount) dies, a
  writer on the other mount takes the broker over, recovers, and every acknowledged message is
  there exactly once.
* GlusterFS: a lost brick (one of three) fails nothing; losing two (no quorum) fails writes cleanly, and
  once the bricks are back and healed, recovery keeps every acknowledged message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import StoreError, StoreLockedError
from rocketstore.pipeline.tools.verify.check import verify
from rocketstore.source import schema
from rocketstore.source.brokerview import BrokerView
from rocketstore.source.planning import KeyRange, QueueRange
from rocketstore.source.read import ReadContext, read_key, read_queue_range
from tests.kit.glusterstore import CONFIG, GEOMETRIES, QUEUES, body, table

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
CONF_TEXT = """\
mappedFileSizeCommitLog = 4194304
mappedFileSizeConsumeQueue = 60000
maxHashSlotNum = 5000
maxIndexNum = 200000
flushDiskType = "SYNC_FLUSH"
"""
TAKEOVER_BOUND_S = 30.0
ROUND_BOUND_S = 180  # the longest a reader's round may take (the writer's copy is in WRITER)


def check_message(queue_id: int, data: bytes) -> int:
    i = int(data.split(b":")[0][1:])
    assert data == body(i) and i % QUEUES == queue_id, (queue_id, data[:30])
    return i


WRITER = """
import os, sys, time
import pyarrow as pa
sys.path.insert(0, sys.argv[3])
from tests.kit.glusterstore import GEOMETRIES, table
from rocketstore.pipeline.engine.store import MessageStore
ROUND_BOUND_S = 180
path, batches, reads, geometry = sys.argv[1], int(sys.argv[2]), sys.argv[4], sys.argv[5]
with MessageStore(path, GEOMETRIES[geometry]) as store:
    for b in range(batches):
        store.put_batch(table(b * 1000, 1000))
        store.flush()
        # Every 10 batches, wait until the reader has finished one more round since the last
        # wait: however loaded the machine, reads and writes keep overlapping to the end. A
        # round's length follows the file system and the load (seconds on CephFS), so what
        # is bounded is the time without one.
        rounds, since = os.path.getsize(reads), time.monotonic()
        while b % 10 == 9 and os.path.getsize(reads) < (b + 1) // 10:
            if os.path.getsize(reads) > rounds:
                rounds, since = os.path.getsize(reads), time.monotonic()
            assert time.monotonic() - since < ROUND_BOUND_S, "the reader stopped reading"
            time.sleep(0.01)
"""


# A known failure on CephFS, open in issue 42 (docs/cluster.md, "CephFS: what was tested"):
# in 2 of about 12 runs of the 4 MiB geometry, a partition read on mount B read a published
# ConsumeQueue unit as empty for longer than visibilityWaitMs (30 s), through the page cache
# and past it alike, and reports it as damage. Not strict: it passes in most runs, and the
# summary says how each went (xfailed / xpassed).
CEPHFS_STALE_UNIT = pytest.mark.xfail(
    reason="issue 42: on CephFS a published ConsumeQueue unit can read as empty on the other "
    "mount for longer than visibilityWaitMs (cause not found yet)",
    raises=AssertionError,
    strict=False,
)


@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_readers_on_the_other_mount_never_see_damage(
    request: pytest.FixtureRequest, two_hosts: Any, geometry: str
) -> None:
    """The issue's case: 100 batches of 1,000 through mount A, each flushed; through mount B,
    over and over: read-only re-opens (queue reads, the newest message of each queue read
    again by msgId and by key), the source's planner, and partition reads and key look-ups of
    ranges planned through mount A (a driver on the writer's host, executors on this one:
    ranges reach files this host may not list yet).

    Key look-ups must never fail or give a wrong message; that they may miss the newest
    published messages (an index page newer than the entries it points at) is not checked."""
    if request.node.callspec.params.get("two_hosts") == "cephfs":
        request.applymarker(CEPHFS_STALE_UNIT)
    config = GEOMETRIES[geometry]
    a, b = two_hosts.a / "broker-0", two_hosts.b / "broker-0"
    reads = two_hosts.work / "reads"  # one byte per round of reads (local disk)
    reads.write_bytes(b"")
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(a), "100", str(ROOT), str(reads), geometry],
        stderr=subprocess.PIPE,
    )
    errors: list[str] = []
    opens = plans = 0
    seen_ro: set[int] = set()
    seen_src: set[int] = set()
    view = BrokerView("broker-0", b)
    planner = BrokerView("broker-0", a)
    ctx = ReadContext(schema=schema.arrow_schema(None), root=str(two_hosts.b), config=config)
    done_at: dict[int, int] = {}
    ro_at: dict[int, int] = {}
    try:
        # Bounded by the time without progress (nothing new read), not the whole run's: a
        # round takes seconds on CephFS, more under load.
        seen, since = 0, time.monotonic()
        while time.monotonic() - since < ROUND_BOUND_S:
            finished = writer.poll() is not None
            if not (b / "config" / "rocketstore.json").exists():
                assert not finished, "the writer ended before its first flush"
                continue  # nothing published yet: nothing to read
            try:
                with MessageStore(b, config, read_only=True) as ro:
                    opens += 1
                    for q in range(QUEUES):
                        # From where the last open stopped, and the unit before it again.
                        off = max(ro.min_offset("T", q), ro_at.get(q, 0) - 1)
                        hi = ro.max_offset("T", q)
                        while off < hi:
                            got = ro.get_messages("T", q, off, 2000)
                            seen_ro.update(check_message(q, m.body) for m in got.messages)
                            off = got.next_begin_offset
                        ro_at[q] = hi
                        if hi > ro.min_offset("T", q):
                            (newest,) = ro.get_messages("T", q, hi - 1, 1).messages
                            newest_id = check_message(q, newest.body)
                            assert ro.get_by_msg_id(newest.msg_id).body == newest.body
                            keyed = ro.query_by_key("T", f"k{newest_id}")
                            assert [m.body for m in keyed] in ([], [newest.body]), newest_id
                view.all_bounds("T")  # this host's own planner
                for q, bounds in planner.all_bounds("T").items():
                    plans += 1
                    start = done_at.get(q, 0)
                    rng = QueueRange("T", "broker-0", str(b), q, start, bounds.max)
                    last = -1
                    for batch in read_queue_range(rng, ctx):
                        for data in batch.column("body").to_pylist():
                            last = check_message(q, data)
                            seen_src.add(last)
                    done_at[q] = bounds.max
                    if last >= 0:
                        kr = KeyRange("T", "broker-0", str(b), f"k{last}", 0, 2**62)
                        keyed_src = [x for t in read_key(kr, ctx) for x in t.column("body")]
                        assert [x.as_py() for x in keyed_src] in ([], [body(last)]), last
            except (OSError, StoreError, AssertionError) as exc:
                # Whole, with where it came from: a false error must be diagnosable from the
                # one run that shows it.
                errors.append("".join(traceback.format_exception(exc)))
            with reads.open("ab") as f:
                f.write(b".")
            if finished and len(seen_ro) == len(seen_src) == 100_000:
                break
            if len(seen_ro) + len(seen_src) > seen:
                seen, since = len(seen_ro) + len(seen_src), time.monotonic()
    finally:
        if writer.poll() is None:
            writer.kill()
        _, err = writer.communicate()
    found = f"{len(errors)} error(s) in {opens} opens, {plans} plans:\n" + "\n".join(errors[:5])
    assert writer.returncode == 0, err.decode()[-2000:] + "\nthe readers: " + found
    assert errors == [], found
    assert seen_ro == seen_src == set(range(100_000))
    assert opens >= 10 and plans >= 10 * QUEUES, (opens, plans)


def produce(store: Path, lines: Path, conf: Path, **popen: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "rocketstore.pipeline.cli", "produce", str(store), str(lines),
         "--config", str(conf), "--batch-size", "200"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen,
    )  # fmt: skip


def input_lines(first: int, n: int) -> str:
    return "".join(
        json.dumps({"topic": "T", "queueId": i % QUEUES, "body": body(i).decode()}) + "\n"
        for i in range(first, first + n)
    )


def write_lines(path: Path, first: int, n: int) -> None:
    path.write_text(input_lines(first, n))


def acked_ids(lines: list[str], first: int) -> list[int]:
    rows = [json.loads(x) for x in lines if x.startswith("{")]
    return [first + int(r["line"]) - 1 for r in rows if r["status"] == "PUT_OK"]


def take_over(path: Path) -> tuple[MessageStore, float]:
    """Open ``path`` for writing as soon as its lock is free; returns the store and the wait."""
    t0 = time.monotonic()
    while True:
        try:
            return MessageStore(path, dataclasses.replace(CONFIG)), time.monotonic() - t0
        except StoreLockedError:
            assert time.monotonic() - t0 < TAKEOVER_BOUND_S, "the lock was not released"
            time.sleep(0.05)  # polling interval: the loop tries the lock itself


def all_ids(path: Path) -> list[int]:
    """Every message's id through the ConsumeQueues, duplicates kept."""
    with MessageStore(path, CONFIG, read_only=True) as ro:
        report = verify(ro, max_per_kind=None)
        assert report.ok, [str(p) for p in report.problems][:10]
        return read_ids(ro)


def read_ids(store: MessageStore) -> list[int]:
    """Every message a view offers, through each queue, duplicates kept."""
    ids: list[int] = []
    for q in range(QUEUES):
        off, hi = store.min_offset("T", q), store.max_offset("T", q)
        while off < hi:
            got = store.get_messages("T", q, off, 2000)
            ids.extend(check_message(q, m.body) for m in got.messages)
            off = got.next_begin_offset
    return ids


@pytest.mark.parametrize("loss", ["writer", "host", "evicted"])
def test_a_writer_on_the_other_mount_takes_over(two_hosts: Any, tmp_path: Path, loss: str) -> None:
    """kill -9 the writer (``produce``, SYNC_FLUSH) on mount A, or A's whole client (the host
    gone; on CephFS its MDS session evicted too, as whoever declares a host dead does), or, on
    CephFS, evict A's session while A's client and writer run on (a host fenced by an
    operator, or by the MDS after a partition): a writer through mount B gets the broker's
    lock, recovers and goes on; the writer on A stops with an error; every acknowledged
    message is there exactly once."""
    vol = two_hosts
    if loss == "evicted" and not hasattr(vol, "evict"):
        pytest.skip(
            "CephFS only: GlusterFS evicts no client (tests/test_partition.py cuts one off)"
        )
    conf = tmp_path / "store.toml"
    conf.write_text(CONF_TEXT)
    first = tmp_path / "first.jsonl"
    write_lines(first, 0, 40_000)
    proc = produce(vol.a / "broker-0", first, conf)
    assert proc.stdout is not None
    lines: list[str] = []
    while len(lines) < 2_000:  # some batches acknowledged, more in flight
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        lines.append(line)
    with pytest.raises(StoreLockedError):
        MessageStore(vol.b / "broker-0", CONFIG)  # two writers never hold one broker
    if loss == "writer":
        proc.send_signal(signal.SIGKILL)
    elif loss == "host":
        vol.lose_host(vol.a)
    else:
        vol.evict(vol.a)
    store, waited = take_over(vol.b / "broker-0")
    out, _ = proc.communicate(timeout=120)
    lines += out.splitlines()
    acked = acked_ids(lines, 0)
    assert proc.returncode != 0, "the writer on the lost side went on"
    assert waited < TAKEOVER_BOUND_S
    with store:
        store.put_batch(table(100_000, 1_000))
    ids = all_ids(vol.b / "broker-0")
    assert len(ids) == len(set(ids)), "a message stored twice"
    assert set(acked) <= set(ids)
    assert set(range(100_000, 101_000)) <= set(ids)
    # Whatever landed past the last acknowledgement is whole lines of the input, in order.
    landed = sorted(i for i in ids if i < 100_000)
    assert landed == list(range(len(landed)))


def test_an_evicted_idle_writer_is_refused_after_a_take_over(
    two_hosts: Any, tmp_path: Path
) -> None:
    """CephFS: a writer on mount A (``produce`` reading its standard input) stores a batch and
    waits; A's session is evicted while its client runs on; a writer through mount B takes the
    broker and stores more; then A is given more lines. A refuses them (its lock cannot be
    confirmed), nothing of them lands, and everything A and B acknowledged is there once."""
    vol = two_hosts
    if not hasattr(vol, "evict"):
        pytest.skip(
            "CephFS only: GlusterFS evicts no client (tests/test_partition.py cuts one off)"
        )
    conf = tmp_path / "store.toml"
    conf.write_text(CONF_TEXT)
    proc = produce(vol.a / "broker-0", Path("-"), conf, stdin=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(input_lines(0, 200))
    proc.stdin.flush()
    lines = [proc.stdout.readline() for _ in range(200)]
    assert len(acked_ids(lines, 0)) == 200, lines[-3:]
    vol.evict(vol.a)
    store, waited = take_over(vol.b / "broker-0")
    assert waited < TAKEOVER_BOUND_S
    with store:
        store.put_batch(table(100_000, 1_000))
    out, err = proc.communicate(input_lines(200, 200), timeout=120)
    assert proc.returncode != 0 and "no longer owns the store" in err, err[-2000:]
    assert acked_ids(lines + out.splitlines(), 0) == list(range(200))
    ids = all_ids(vol.b / "broker-0")
    assert sorted(ids) == [*range(200), *range(100_000, 101_000)]


@pytest.mark.gluster
def test_a_lost_brick_fails_nothing_and_two_fail_cleanly(gluster_volume: Any) -> None:
    vol = gluster_volume
    path = vol.a / "broker-0"
    acked: list[int] = []
    store = MessageStore(path, CONFIG)
    try:
        store.put_batch(table(0, 5_000))
        acked += range(5_000)
        vol.kill_brick(0)
        for k in range(1, 6):  # one of three down: writes and reads go on
            store.put_batch(table(k * 5_000, 5_000))
            store.flush()
            acked += range(k * 5_000, (k + 1) * 5_000)
        vol.kill_brick(1)  # no quorum left: the client refuses writes
        with pytest.raises(StoreError) as failed:
            for k in range(6, 40):
                store.put_batch(table(k * 5_000, 5_000))
                store.flush()
                acked += range(k * 5_000, (k + 1) * 5_000)
    finally:
        # A close without quorum may fail too; the lock goes with it either way.
        with contextlib.suppress(StoreError):
            store.close()
    print(f"without quorum: {failed.value!r}")
    vol.restart_bricks()
    vol.wait_for_heal()
    with MessageStore(vol.b / "broker-0", CONFIG) as again:  # recovers on the other mount
        assert again.recovery is not None
    ids = all_ids(vol.b / "broker-0")
    assert len(ids) == len(set(ids))
    assert set(acked) <= set(ids)
    landed = sorted(ids)
    assert landed == list(range(len(landed)))


OLD_WRITER = """
import os, signal, sys
sys.path.insert(0, sys.argv[2])
from tests.kit.glusterstore import CONFIG, table
from rocketstore.pipeline.engine.store import MessageStore
store = MessageStore(sys.argv[1], CONFIG)
store.put_batch(table(0, 500))
store.flush()
print("published", flush=True)
sys.stdin.readline()  # the other host opens the files meanwhile
for k in range(1, 4):
    store.put_batch(table(k * 500, 500))
    store.flush()
if sys.argv[3] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
store.close()
"""


# A known failure on CephFS, open in issue 42 (docs/cluster.md, "Pages a host maps are never
# refreshed"): a read-only view reads through the page cache, so on a host where another view
# maps the files it can read their stale pages; once (kill -9, 2026-12-06) verify on A found
# index entries missing that way. Not strict: it passes in most runs.
CEPHFS_VIEW_PINNED = pytest.mark.xfail(
    reason="issue 42: on CephFS a fresh read-only view can read pages another view on its host "
    "maps, stale (views do not read past the page cache yet)",
    raises=AssertionError,
    strict=False,
)


@pytest.mark.parametrize("end", ["close", "kill"])
def test_readers_on_the_old_writers_host_after_a_take_over(
    request: pytest.FixtureRequest, two_hosts: Any, end: str
) -> None:
    """Host B has the store's files open (a read-only view) while host A's writer writes them
    through its mappings, then A's writer closes (or is killed -9) and a writer on B takes
    over and appends to the same files. On ceph-fuse, A's client then keeps serving the pages
    it cached for as long as they stay cached, and B's client the pages B read (see
    docs/cluster.md, CephFS). The taker must open, and readers on A, one of them a view held
    open on A across the take-over, must read every message once and right, and verify must
    find no damage."""
    if request.node.callspec.params.get("two_hosts") == "cephfs":
        request.applymarker(CEPHFS_VIEW_PINNED)
    vol = two_hosts
    a, b = vol.a / "broker-0", vol.b / "broker-0"
    old = subprocess.Popen(
        [sys.executable, "-c", OLD_WRITER, str(a), str(ROOT), end],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert old.stdout is not None and old.stdin is not None
    assert old.stdout.readline() == "published\n", old.stderr.read() if old.stderr else ""
    with MessageStore(b, CONFIG, read_only=True) as on_b:
        assert sorted(read_ids(on_b)) == list(range(500))
        old.stdin.write("\n")
        old.stdin.flush()
        _, err = old.communicate(timeout=120)
    assert old.returncode == (0 if end == "close" else -signal.SIGKILL), err[-2000:]
    with MessageStore(a, CONFIG, read_only=True) as held:  # fills A's cache, maps the files
        before = read_ids(held)
        assert sorted(before) == list(range(2000))
        store, _ = take_over(b)
        with store:
            for k in range(4):
                store.put_batch(table(10_000 + k * 250, 250))
                store.flush()
        assert read_ids(held) == before  # a view ends where it ended at its open
        ids = all_ids(a)  # a fresh view on A, with verify, while A still maps the files
    assert sorted(ids) == [*range(2000), *range(10_000, 11_000)]
    assert sorted(all_ids(a)) == sorted(ids)  # and after the held view closed


MOUNT_TYPES = {"glusterfs": "fuse.glusterfs", "cephfs": "fuse.ceph-fuse"}


def test_auto_resolves_to_shared_storage(two_hosts: Any, request: pytest.FixtureRequest) -> None:
    """``sharedStorage = auto`` (the default) on the real mount: the type mountinfo names,
    readers held to the published point, and a writer that fences (records an epoch), so
    that a second writer on the other host is refused the lock."""
    from rocketstore.pipeline.engine import fencing
    from rocketstore.pipeline.files import filesystem, visibility

    a = two_hosts.a
    assert filesystem.fs_type(a) == MOUNT_TYPES[request.node.callspec.params["two_hosts"]]
    assert visibility.is_shared(a)
    with MessageStore(a / "broker-0", CONFIG) as store:
        assert store.shared
        store.put_batch(table(0, 100))
        store.flush()
        assert len(fencing.read_epochs(two_hosts.b / "broker-0")) == 1
        with pytest.raises(StoreLockedError):
            MessageStore(two_hosts.b / "broker-0", CONFIG)
    with MessageStore(two_hosts.b / "broker-0", CONFIG, read_only=True) as ro:
        assert ro.shared and sorted(read_ids(ro)) == list(range(100))


@pytest.mark.parametrize("mapped", ["consumequeue", "commitlog"])
def test_a_partition_reads_published_data_while_its_host_maps_its_file(
    two_hosts: Any, mapped: str
) -> None:
    """Another process on the reader's host maps a queue's file or a CommitLog segment (a
    tool, a view held open) while the writer on the other host appends to it. On CephFS,
    pages a host maps are never refreshed by the other host's writes, and dropping cached
    pages cannot drop mapped ones (docs/cluster.md, "The page cache of ceph-fuse"): a partition
    read must still see the published messages, not wait out ``visibilityWaitMs`` and report
    damage. Both failed on CephFS before units and records read again went past the page
    cache."""
    import mmap

    config = dataclasses.replace(CONFIG, shared_storage="shared", visibility_wait_ms=5000)
    a, b = two_hosts.a / "broker-0", two_hosts.b / "broker-0"
    with MessageStore(a, config) as writer:
        writer.put_batch(table(0, 400))
        writer.flush()
        held_file = (
            b / "consumequeue" / "T" / "0" / f"{0:020d}"
            if mapped == "consumequeue"
            else b / "commitlog" / f"{0:020d}"
        )
        with open(held_file, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as held:
            assert held[:20] != bytes(20)
            for page in range(0, len(held), mmap.PAGESIZE):
                held[page]  # every page mapped, the ones the writer will fill next too
            writer.put_batch(table(400, 400))
            writer.flush()
            end = BrokerView("broker-0", a).queue_bounds("T", 0).max
            assert end == 200
            ctx = ReadContext(
                schema=schema.arrow_schema(None), root=str(two_hosts.b), config=config
            )
            rng = QueueRange("T", "broker-0", str(b), 0, 0, end)
            got = [
                check_message(0, data)
                for batch in read_queue_range(rng, ctx)
                for data in batch.column("body").to_pylist()
            ]
    assert got == list(range(0, 800, QUEUES))
