"""Power loss: what survives when everything not synced is lost (tests/kit/powercut.py).

A writer in this process runs a scripted workload (batches over two topics and three queues,
with keys, rolling CommitLog, ConsumeQueue and index files; a flush every few batches) while
every durability barrier goes to the power-cut recorder. The power is cut at each barrier of
the workload in turn (the barrier itself does not happen), and at random barriers of random
workloads; then the store is opened again, which recovers it, and:

* under SYNC_FLUSH every acknowledged message is there, in its queue and found by its key;
* under ASYNC_FLUSH every message acknowledged before the last completed flush is there (at
  most what was written since that flush is lost);
* either way what survived is a prefix of what was written, in CommitLog order (no holes, no
  resurrected cut-off records), ``verify`` finds nothing wrong, and the store takes new puts.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from rocketstore.pipeline.config import ASYNC_FLUSH, SYNC_FLUSH, StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files import durability
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.tools.verify.check import verify
from tests.kit.powercut import PowerCut, PowerLost, abandon

BASE = StoreConfig(
    mapped_file_size_commitlog=16 * 1024,
    mapped_file_size_consume_queue=20 * 40,
    max_hash_slot_num=31,
    max_index_num=120,
    # No background flush in the window of a test: flushes happen where the script says.
    flush_interval_commitlog=3_600_000,
)
TOPICS = ("TopicA", "TopicB")


@dataclasses.dataclass
class Script:
    """Batches of message bodies, and after which batches to flush."""

    batches: list[list[Message]]
    flush_after: set[int]


def make_script(seed: int, batches: int = 14) -> Script:
    rng = random.Random(seed)
    out: list[list[Message]] = []
    n = 0
    for _ in range(batches):
        batch = []
        for _k in range(rng.randrange(1, 25)):
            batch.append(
                Message(
                    TOPICS[n % 2],
                    f"m{n:05d}-".encode() + rng.randbytes(rng.randrange(0, 300)),
                    queue_id=rng.randrange(3),
                    keys=[f"k{n}"],
                    tags=rng.choice((None, "TagA")),
                )
            )
            n += 1
        out.append(batch)
    flush_after = {b for b in range(batches) if rng.random() < 0.3}
    return Script(out, flush_after)


@dataclasses.dataclass
class Run:
    acked: list[bytes]  # bodies of acknowledged messages, in CommitLog order
    durable: int  # how many of them a completed flush (or SYNC_FLUSH) made durable
    written: list[bytes]  # bodies handed to the store (acknowledged or in flight)
    cut: bool  # whether the power cut came during the script
    barriers: int


def run_script(path: Path, script: Script, config: StoreConfig, fail_at: int | None) -> Run:
    path.mkdir(parents=True)
    sync = config.sync_flush
    acked: list[bytes] = []
    written: list[bytes] = []
    durable = 0
    store: MessageStore | None = None
    with PowerCut(path) as pc:
        pc.fail_at = fail_at
        try:
            store = MessageStore(path, config)
            for b, batch in enumerate(script.batches):
                written.extend(m.body for m in batch)
                store.put_batch(batch)
                acked.extend(m.body for m in batch)
                if sync:
                    durable = len(acked)
                if b in script.flush_after:
                    store.flush()
                    durable = len(acked)
        except PowerLost:
            pass
        cut = pc.dead
        if store is not None:
            abandon(store)
        pc.cut()
        return Run(acked, durable, written, cut, pc.barriers)


def survivors(store: MessageStore) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    for info in store.queue_infos():
        offset = info.min_offset
        while offset < info.max_offset:
            got = store.get_messages(info.topic, info.queue_id, offset, 64)
            assert got.status == "FOUND", (info, offset, got.status)
            out.extend((m.commit_log_offset, m.body) for m in got.messages)
            offset = got.next_begin_offset
    return sorted(out)


def check_after_cut(path: Path, run: Run, config: StoreConfig, context: str) -> int:
    """Reopen (recover) and check the store; returns how many messages survived."""
    with MessageStore(path, config) as store:
        bodies = [body for _, body in survivors(store)]
        assert bodies == run.written[: len(bodies)], f"{context}: survivors are not a prefix"
        assert len(bodies) >= run.durable, (
            f"{context}: {run.durable} messages were durable, {len(bodies)} survived"
        )
        report = verify(store)
        assert report.ok, (context, [str(p) for p in report.problems])
        for body in bodies[: run.durable][-3:]:
            n = int(body[1:6])
            hits = store.query_by_key(TOPICS[n % 2], f"k{n}")
            assert [m.body for m in hits] == [body], (context, n)
        store.put(Message("TopicA", b"after", keys=["after"]))
    with MessageStore(path, config, read_only=True) as store:
        report = verify(store)
        assert report.ok, (context, "after a put", [str(p) for p in report.problems])
    return len(bodies)


def barrier_count(tmp_path: Path, script: Script, config: StoreConfig) -> int:
    run = run_script(tmp_path / "count", script, config, None)
    assert not run.cut
    return run.barriers


@pytest.mark.parametrize("flush", [SYNC_FLUSH, ASYNC_FLUSH])
def test_a_cut_at_every_barrier_of_a_workload(tmp_path: Path, flush: str) -> None:
    config = dataclasses.replace(BASE, flush_disk_type=flush)
    script = make_script(seed=11)
    total = barrier_count(tmp_path, script, config)
    assert total > 50  # the workload rolls files and flushes: many barriers
    lost_acked = acked_total = survived_total = 0
    for k in range(1, total + 1):
        path = tmp_path / f"cut{k}"
        run = run_script(path, script, config, k)
        assert run.cut
        context = f"{flush}, cut at barrier {k} of {total}"
        survived = check_after_cut(path, run, config, context)
        lost_acked += max(0, len(run.acked) - survived)
        acked_total += len(run.acked)
        survived_total += survived
        if flush == SYNC_FLUSH:
            assert survived >= len(run.acked), context
    print(
        f"\n{flush}: {total} cuts; {acked_total} acknowledged, {survived_total} survived, {lost_acked} acknowledged lost"
    )
    if flush == ASYNC_FLUSH:
        # Not vacuous: some cuts must have lost acknowledged, unflushed messages.
        assert lost_acked > 0


@pytest.mark.parametrize("flush", [SYNC_FLUSH, ASYNC_FLUSH])
def test_cuts_at_random_barriers_of_random_workloads(tmp_path: Path, flush: str) -> None:
    config = dataclasses.replace(BASE, flush_disk_type=flush)
    master = random.Random(2024)
    for trial in range(12):
        seed = master.randrange(1 << 30)
        script = make_script(seed, batches=master.randrange(4, 20))
        total = barrier_count(tmp_path / f"t{trial}", script, config)
        k = random.Random(seed).randrange(1, total + 1)
        path = tmp_path / f"t{trial}" / "cut"
        run = run_script(path, script, config, k)
        context = f"{flush}, workload seed {seed}, cut at barrier {k} of {total}"
        survived = check_after_cut(path, run, config, context)
        if flush == SYNC_FLUSH:
            assert survived >= len(run.acked), context


def test_without_a_cut_nothing_is_lost(tmp_path: Path) -> None:
    """The recorder itself: after a full script and a close, a cut changes nothing."""
    config = BASE
    script = make_script(seed=5)
    path = tmp_path / "s"
    path.mkdir()
    with PowerCut(path) as pc:
        with MessageStore(path, config) as store:
            for batch in script.batches:
                store.put_batch(batch)
        pc.cut()
    with MessageStore(path, config, read_only=True) as store:
        bodies = [b for _, b in survivors(store)]
    assert bodies == [m.body for batch in script.batches for m in batch]


def test_unsynced_writes_and_names_are_lost(tmp_path: Path) -> None:
    """The recorder itself: unsynced content, a new name and a deletion are undone."""
    root = tmp_path / "r"
    root.mkdir()
    (root / "kept").write_bytes(b"old")
    (root / "gone").write_bytes(b"here")
    with PowerCut(root) as pc:
        (root / "kept").write_bytes(b"new")
        (root / "created").write_bytes(b"x")
        (root / "gone").unlink()
        pc.cut()
    assert (root / "kept").read_bytes() == b"old"
    assert not (root / "created").exists()
    assert (root / "gone").read_bytes() == b"here"


def test_a_syncfs_of_the_root_s_file_system_makes_everything_under_it_durable(
    tmp_path: Path,
) -> None:
    """The recorder itself: what a syncfs found is kept, what came after it is undone."""
    root = tmp_path / "r"
    root.mkdir()
    (root / "kept").write_bytes(b"old")
    (root / "gone").write_bytes(b"here")
    with PowerCut(root) as pc:
        (root / "kept").write_bytes(b"new")
        (root / "d").mkdir()
        (root / "d" / "created").write_bytes(b"x")
        (root / "gone").unlink()
        sync = durability.FileSystemSync(root)
        try:
            sync.sync()
        finally:
            sync.close()
        (root / "d" / "created").write_bytes(b"later")
        (root / "after").write_bytes(b"lost")
        pc.cut()
    assert (root / "kept").read_bytes() == b"new"
    assert (root / "d" / "created").read_bytes() == b"x"
    assert not (root / "gone").exists()
    assert not (root / "after").exists()
