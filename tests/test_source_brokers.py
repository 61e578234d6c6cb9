"""Planning over many brokers (rocketstore.source.brokercache): a plan reads the brokers whose
files changed since the last one, the others cost a check of their progress file, and what it
answers is always what a plan from scratch answers, whatever writers, retention and recovery
did in between."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files.localsegments import LocalSegments, list_segments
from rocketstore.pipeline.files.progress import FlushProgress
from rocketstore.pipeline.layout import CQ_UNIT_SIZE
from rocketstore.source import brokercache, options
from rocketstore.source.planning import Planner
from tests.kit.sourcekit import SMALL, make_root, message_table, write

# No background flush while a test looks: a writer's records stay past the flushed end until
# the test flushes or closes it.
QUIET = dataclasses.replace(SMALL, flush_interval_commitlog=3_600_000)
HOUR_MS = 3_600_000


def planner(root: Path, shared: bool = False) -> Planner:
    opts = options.parse({"path": str(root), "topic": "orders"}, streaming=True)
    if shared:
        opts = dataclasses.replace(opts, config=StoreConfig(shared_storage="shared"))
    return Planner(opts)


def reads(p: Planner) -> int:
    return p.work.read


def test_a_plan_reads_only_the_brokers_that_changed(tmp_path: Path) -> None:
    make_root(tmp_path, "orders", brokers=16, queues=2, count=320)
    p = planner(tmp_path)
    first = p.latest()
    assert len(first) == 32 and reads(p) == 16
    assert p.latest() == first
    assert (p.work.read, p.work.checked) == (16, 16)

    write(tmp_path, 3, message_table("orders", [1000, 1001, 1002], 2))
    after = p.latest()
    assert reads(p) == 17
    assert after == planner(tmp_path).latest()
    assert after[("orders", "broker-3", 0)] == first[("orders", "broker-3", 0)] + 2
    # latestOffset, then partitions, of the same micro-batch: the second reads nothing.
    p.ranges(first, after)
    assert reads(p) == 17

    for b in range(16):
        write(tmp_path, b, message_table("orders", [2000 + b], 2))
    assert p.latest() == planner(tmp_path).latest()
    assert reads(p) == 33


def test_a_writer_with_unflushed_records_is_read_at_every_plan(tmp_path: Path) -> None:
    """On one host a reader sees a put at once; kept bounds must not hide it until the flush."""
    make_root(tmp_path, "orders", brokers=2, queues=2, count=40)
    p = planner(tmp_path)
    p.latest()
    with MessageStore(tmp_path / "broker-0", QUIET) as store:
        for k in range(3):
            store.put_batch(message_table("orders", [100 + k], 2))
            before = reads(p)
            assert p.latest() == planner(tmp_path).latest()
            assert reads(p) == before + 1
        # Flushed, nothing past the flushed end: kept again.
        store.flush()
        p.latest()
        before = reads(p)
        assert p.latest() == planner(tmp_path).latest()
        assert reads(p) == before


def test_retention_makes_the_broker_read_again(tmp_path: Path) -> None:
    broker = tmp_path / "broker-0"
    with MessageStore(broker, SMALL) as store:
        for k in range(12):
            store.put_batch(message_table("orders", list(range(k * 100, k * 100 + 100)), 2))
    p = planner(tmp_path)
    old = p.latest()
    earliest = p.bounds()
    with MessageStore(broker, SMALL) as store:
        assert store.retention is not None
        # Retention in a writer that stays open (its cleaner runs every 10 s) records no
        # progress: only the CommitLog's first segment, gone, says the earliest offsets moved.
        store.retention.run(
            int(time.time() * 1000) + 100 * HOUR_MS, force_expired=True, max_files=2
        )
        before = reads(p)
        now = p.bounds()
        assert reads(p) == before + 1
        assert now == planner(tmp_path).bounds()
        assert all(now[q].min > earliest[q].min for q in now)
        assert {q: b.max for q, b in now.items()} == old


def test_a_plan_whose_listing_retention_overtook_reads_the_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention deletes the CommitLog's first segment between the plan's listing of the
    segments and its look at them: the plan reads the broker afresh, it does not fail."""
    broker = tmp_path / "broker-0"
    with MessageStore(broker, SMALL) as store:
        for k in range(12):
            store.put_batch(message_table("orders", list(range(k * 100, k * 100 + 100)), 2))
    assert len(list_segments(broker / "commitlog")) > 2
    deleted: list[Path] = []

    class ListedThenDeleted(LocalSegments):
        def relist(self, leftovers: list[Path] | None = None) -> None:
            super().relist(leftovers)
            if not deleted:
                deleted.append(self.entries[0][1])
                deleted[0].unlink()  # retention, right after the plan's listing

    monkeypatch.setattr(brokercache, "LocalSegments", ListedThenDeleted)
    p = planner(tmp_path)
    assert p.latest() == planner(tmp_path).latest()
    assert p.work.read == 1 and deleted and not deleted[0].exists()


def test_a_tail_cut_back_makes_the_broker_read_again(tmp_path: Path) -> None:
    """Recovery that cuts the last record (damage past what a crash leaves) without a new
    progress file: the kept bounds would be ahead of the files, so they go."""
    make_root(tmp_path, "orders", brokers=1, queues=1, count=5)
    p = planner(tmp_path)
    assert p.latest() == {("orders", "broker-0", 0): 5}
    cut_last_record(tmp_path / "broker-0")
    assert p.latest() == planner(tmp_path).latest() == {("orders", "broker-0", 0): 4}


def test_shared_storage_keeps_bounds_until_the_writer_publishes(tmp_path: Path) -> None:
    """On shared storage readers stop at the published point: a writer's unpublished puts
    change nothing a plan may offer, so the broker is not read again until the next flush."""
    make_root(tmp_path, "orders", brokers=2, queues=2, count=40, config=QUIET)
    p = planner(tmp_path, shared=True)
    first = p.latest()
    with MessageStore(tmp_path / "broker-0", QUIET) as store:
        store.put_batch(message_table("orders", [100, 101], 2))
        before = reads(p)
        assert p.latest() == first == planner(tmp_path, shared=True).latest()
        assert reads(p) == before
        store.flush()
        published = p.latest()
        assert reads(p) == before + 1
        assert published == planner(tmp_path, shared=True).latest() != first


def test_shared_storage_reads_a_broker_again_until_this_host_sees_what_was_published(
    tmp_path: Path,
) -> None:
    """A published length this host's files do not reach yet (its client still caches old
    pages or listings) is offered up to what the files show, and looked at again next plan."""
    make_root(tmp_path, "orders", brokers=1, queues=1, count=5, config=QUIET)
    config = tmp_path / "broker-0" / "config"
    progress = FlushProgress.read(config)
    assert progress is not None
    ahead = dataclasses.replace(progress, queues={"orders/0": 6})
    ahead.write(config)
    p = planner(tmp_path, shared=True)
    for k in range(3):
        assert p.latest() == {("orders", "broker-0", 0): 5}
        assert reads(p) == k + 1


@pytest.mark.parametrize("shared", [False, True], ids=["one-host", "shared"])
def test_progress_attributes_changing_alone_keep_the_bounds(tmp_path: Path, shared: bool) -> None:
    """A FUSE client may answer a ``stat`` of the progress file from attributes it cached
    before the file was whole, then give the true ones: the same record, so the broker's bounds
    stay kept. The same inode with another record in it is read again."""
    make_root(tmp_path, "orders", brokers=2, queues=2, count=40, config=QUIET)
    p = planner(tmp_path, shared=shared)
    first = p.latest()
    assert reads(p) == 2
    path = tmp_path / "broker-0" / "config" / "rocketstore.json"
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - 5_000_000_000))
    for k in range(2):
        assert p.latest() == first
        assert (reads(p), p.work.checked) == (2, 2 + 2 * k)
    progress = FlushProgress.read(path.parent)
    assert progress is not None
    other = dataclasses.replace(progress, store_timestamp=progress.store_timestamp + 1)
    inode = path.stat().st_ino
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    other.write(scratch)
    with open(path, "r+b") as f:
        f.write((scratch / path.name).read_bytes())
        f.truncate()
    assert path.stat().st_ino == inode
    assert p.latest() == first
    assert reads(p) == 3


# -- against plans from scratch ------------------------------------------------------------------


def cut_last_record(broker: Path) -> None:
    """Zero the last flushed record and the unit that points at it, as a recovery cutting the
    log back there would, and leave the progress file as it was."""
    progress = FlushProgress.read(broker / "config")
    assert progress is not None
    last, end = progress.last_record_offset, progress.flushed_offset
    segments = list_segments(broker / "commitlog")
    size = segments[0][1].stat().st_size
    with open(broker / "commitlog" / f"{last - last % size:020d}", "r+b") as f:
        f.seek(last % size)
        f.write(bytes(end - last))
    for queue in (broker / "consumequeue" / "orders").iterdir():
        files = list_segments(queue)
        for _, path in reversed(files):
            data = path.read_bytes()
            units = [data[i : i + CQ_UNIT_SIZE] for i in range(0, len(data), CQ_UNIT_SIZE)]
            live = [i for i, u in enumerate(units) if any(u)]
            if not live:
                continue
            if int.from_bytes(units[live[-1]][:8], "big") == last:
                with open(path, "r+b") as f:
                    f.seek(live[-1] * CQ_UNIT_SIZE)
                    f.write(bytes(CQ_UNIT_SIZE))
            break


KINDS = ("put", "live", "close", "flush", "retain", "cut", "touch", "plan")
# (what, which broker, how many messages): writers that close, stay open, flush; retention; a
# tail cut back; a progress file rewritten as it was; a plan.
OPS = st.lists(
    st.tuples(st.sampled_from(KINDS), st.integers(0, 2), st.integers(1, 30)),
    min_size=1,
    max_size=14,
)


@contextlib.contextmanager
def scratch_root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        make_root(root, "orders", brokers=3, queues=2, count=60, config=QUIET)
        yield root


@settings(max_examples=40)
@given(ops=OPS)
def test_kept_bounds_equal_a_plan_from_scratch(ops: list[tuple[str, int, int]]) -> None:
    """After each step, the planner that keeps bounds answers what a new planner answers, and
    a plan right after a plan reads only brokers whose writer has unflushed records or whose
    tail was cut since the last flush."""
    next_id = 10_000
    with scratch_root() as root, contextlib.ExitStack() as stack:
        live: dict[int, MessageStore] = {}
        cut: set[int] = set()
        p = planner(root)
        p.bounds()
        for op in ops:
            kind, b, n = op
            broker = root / f"broker-{b}"
            published = progress_inode(broker)
            if kind in ("put", "live"):
                table = message_table("orders", list(range(next_id, next_id + n)), 2)
                next_id += n
                if kind == "put" and b not in live:
                    write(root, b, table, config=QUIET)
                else:
                    if b not in live:
                        live[b] = stack.enter_context(MessageStore(broker, QUIET))
                    live[b].put_batch(table)
            elif kind == "close" and b in live:
                live.pop(b).close()
            elif kind == "flush" and b in live:
                live[b].flush()
            elif kind == "retain":
                store = live.get(b) or stack.enter_context(MessageStore(broker, QUIET))
                assert store.retention is not None
                store.retention.run(
                    int(time.time() * 1000) + 100 * HOUR_MS, force_expired=True, max_files=1
                )
                if b not in live:
                    store.close()
            elif kind == "cut" and b not in live:
                cut_last_record(broker)
                cut.add(b)
            elif kind == "touch":
                progress = FlushProgress.read(broker / "config")
                if progress is not None:
                    progress.write(broker / "config")
                    published = progress_inode(broker)  # the same record, cut or not
            if progress_inode(broker) != published:
                cut.discard(b)  # a flush recorded the log as it is now (a new file, renamed)
            assert p.bounds() == planner(root).bounds(), op
            before = reads(p)
            p.bounds()
            unflushed = {n for n, s in live.items() if s.max_phy_offset > flushed_end(s.path)}
            assert reads(p) - before == len(unflushed | cut), op


def progress_inode(broker: Path) -> int:
    return (broker / "config" / "rocketstore.json").stat().st_ino


def flushed_end(broker: Path) -> int:
    progress = FlushProgress.read(broker / "config")
    return -1 if progress is None else progress.flushed_offset
