"""Real I/O errors (``EIO``) from a FUSE file system under the store (tests/procs/faultfuse.py), where
tests/test_put_faults.py injects them with failpoints.

* The premise: ``msync`` of a shared mapping on the mount reaches the file system's ``write``
  and ``fsync`` handlers, and their ``EIO`` comes back from ``msync``; ``write(2)`` fails at
  once.
* A CommitLog, ConsumeQueue or index write that fails (at a chosen byte range of a chosen file,
  or after N writes), or an ``fsync`` that fails: fail-stop with the file and its bytes named,
  every later write refused; from what reached the disk, reopening recovers exactly the
  acknowledged messages (plus, at most once each, some of those not yet durable), ``verify``
  is clean and ``rocketstore recover`` repeats to the same bytes.
* A write that the disk takes only up to a few bytes before the end of a record: recovery
  does not keep the torn record, whose body CRC still matches (the zeros in its properties
  give it away).
* The progress file or the checkpoint: not fail-stop (:class:`ProgressNotRecordedError`);
  puts go on and the next flush records the point.
* A Spark sink whose CommitLog syncs fail: the query fails with the store's message; restarted
  from its checkpoint, it lands every row exactly once.

What reached the disk is read from the backing directory once the mount is gone: what a
reboot would leave, with no page cache to stand in for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import mmap
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine import store as store_module
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import ProgressNotRecordedError, StoreError, StoreFailedError
from rocketstore.pipeline.files.mappedfile import segment_name
from rocketstore.pipeline.format.message import Message
from tests.kit.crashdata import GEOMETRY, batch_table, expected, store_config
from tests.kit.faultcheck import check_store, recorded, recover_twice_identically
from tests.kit.faultfuse import FaultFS, mounted, unavailable
from tests.kit.sink import check_exactly_once, finish, job, outcomes, write_input

PAGE = mmap.PAGESIZE
# What the store's message says of a failed system call: ".. of bytes [a, b) of FILE')".
NAMED = re.compile(r"(msync|fsync|write) of bytes \[(\d+), (\d+)\) of ([^']+)'")


@pytest.fixture
def fault_fs(tmp_path: Path) -> Iterator[FaultFS]:
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    with mounted(tmp_path / "fuse") as fs:
        yield fs


def test_msync_of_a_shared_mapping_reaches_the_file_system(fault_fs: FaultFS) -> None:
    """The FUSE mount writes a shared mapping's dirty pages back through the file system's
    handlers: a failing write or fsync there is what ``msync`` returns, and a clean one puts
    the bytes in the backing file."""
    probe = fault_fs.mount / "probe"
    fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, 4 * PAGE)
        mm = mmap.mmap(fd, 4 * PAGE)
    finally:
        os.close(fd)
    with contextlib.closing(mm):
        # Armed before the page is dirtied: the kernel may write it back on its own at any
        # moment, and msync then reports that write-back's failure.
        fault_fs.fail("write", "probe", start=PAGE, end=2 * PAGE, times=1)
        mm[PAGE : PAGE + 4] = b"lost"
        with pytest.raises(OSError) as info:
            mm.flush(0, 4 * PAGE)
        assert info.value.errno == errno.EIO
        # No write(2) was made: the failed write is the kernel's writeback of the page.
        assert fault_fs.injected() == [
            {"op": "write", "path": "probe", "offset": PAGE, "size": PAGE}
        ]
        assert (fault_fs.backing / "probe").read_bytes()[PAGE : PAGE + 4] == b"\0" * 4

        mm[2 * PAGE : 2 * PAGE + 4] = b"sync"
        fault_fs.fail("fsync", "probe", times=1)
        with pytest.raises(OSError) as info:
            mm.flush(0, 4 * PAGE)
        assert info.value.errno == errno.EIO
        assert fault_fs.injected()[-1] == {"op": "fsync", "path": "probe", "offset": 0, "size": 0}
        # The writes before the failed fsync went through.
        assert (fault_fs.backing / "probe").read_bytes()[2 * PAGE : 2 * PAGE + 4] == b"sync"

        mm[3 * PAGE : 3 * PAGE + 4] = b"kept"
        mm.flush(0, 4 * PAGE)
        assert (fault_fs.backing / "probe").read_bytes()[3 * PAGE : 3 * PAGE + 4] == b"kept"

    fault_fs.fail("write", "probe", start=100)
    fd = os.open(probe, os.O_WRONLY)
    try:
        with pytest.raises(OSError) as info:
            os.pwrite(fd, b"x" * 200, 0)
        assert info.value.errno == errno.EIO
    finally:
        os.close(fd)
    # The bytes in front of the failing range were written, as on a disk with a bad sector.
    assert (fault_fs.backing / "probe").read_bytes()[:200] == b"x" * 100 + b"\0" * 100


# -- fail-stop --------------------------------------------------------------------------------

Arm = Callable[[FaultFS, MessageStore], None]


def commitlog_range(fs: FaultFS, store: MessageStore) -> None:
    """Every byte of the current CommitLog segment from the log's end on: a bad range."""
    size = GEOMETRY["mapped_file_size_commitlog"]
    end = store.max_phy_offset
    base = end - end % size
    fs.fail("write", f"store/commitlog/{segment_name(base)}", start=end - base)


FAULTS: dict[str, Arm] = {
    "commitlog-write-range": commitlog_range,
    "commitlog-write-after-2": lambda fs, _: fs.fail("write", "store/commitlog/*", after=2),
    # Segments only: the fsync of a segment being created fails the put before its first
    # byte, with the store unchanged (SegmentCreateError), which is not fail-stop.
    "commitlog-fsync": lambda fs, _: fs.fail("fsync", "store/commitlog/[0-9]*[0-9]"),
    "consumequeue-write-after-5": lambda fs, _: fs.fail("write", "store/consumequeue/*", after=5),
    "consumequeue-fsync": lambda fs, _: fs.fail("fsync", "store/consumequeue/*[0-9]"),
    "index-write-after-1": lambda fs, _: fs.fail("write", "store/index/*", after=1),
}


@dataclasses.dataclass
class Acked:
    """What the store acknowledged: every put that returned, and how many of them a flush
    made durable, besides the put itself under SYNC_FLUSH."""

    puts: list[tuple[int, int, list[int]]] = dataclasses.field(default_factory=list)
    durable: int = 0


def put_until_failure(
    store: MessageStore, fs: FaultFS, arm: Arm, sync: bool
) -> tuple[Acked, int, str]:
    """Puts and flushes on ``store`` (on ``fs``) until one fails after ``arm``; the acknowledged
    puts, the sequence number after the last message put (acknowledged or not) and the
    failure's message."""
    acked, seq, tried = Acked(), 1, 1

    def put(n: int) -> None:
        nonlocal seq, tried
        tried = seq + n
        result = store.put_batch(batch_table(seq, n))
        acked.puts.append((seq, n, result.commit_log_offsets.tolist()))
        seq += n
        if sync:
            acked.durable = len(acked.puts)

    def flush() -> None:
        store.flush()
        acked.durable = len(acked.puts)

    for n in (40, 90, 130):
        put(n)
    flush()
    arm(fs, store)
    with pytest.raises(StoreFailedError) as info:
        for _ in range(12):
            put(170)
            flush()
    assert acked.durable >= 3
    # Fail-stop: no put is taken until the store is reopened.
    assert store.failed is not None
    with pytest.raises(StoreFailedError):
        store.put_batch(batch_table(10**6, 1))
    with pytest.raises(StoreFailedError):
        store.put(expected(10**6).message())
    return acked, tried, str(info.value)


def check_named(message: str, fs: FaultFS) -> None:
    """The failure names a file the file system failed, and bytes of it that include the
    failed write."""
    named = NAMED.search(message)
    assert named, message
    first, end, path = int(named[2]), int(named[3]), Path(named[4])
    failed = [e for e in fs.injected() if fs.mount / e["path"] == path]
    assert failed, (message, fs.injected())
    if failed[0]["op"] == "write":
        assert first <= failed[0]["offset"] < end, (message, failed[0])


def stored_seqs(path: Path) -> dict[int, int]:
    """Every message of the store read through its queues: sequence number -> CommitLog
    offset, each message checked against what was put and seen once."""
    found: dict[int, int] = {}
    with MessageStore(path, store_config("ASYNC_FLUSH"), read_only=True) as store:
        for info in store.queue_infos():
            offset = info.min_offset
            while offset < info.max_offset:
                got = store.get_messages(info.topic, info.queue_id, offset, 1000).messages
                assert got, (info, offset)
                for m in got:
                    text = m.properties.get("seq")
                    assert text is not None, (
                        f"the record at {m.commit_log_offset} lost its properties: {m.properties}"
                    )
                    seq = int(text)
                    want = expected(seq)
                    assert seq not in found, f"message {seq} stored twice"
                    assert (m.topic, m.queue_id, m.body, m.uniq_key) == (
                        want.topic,
                        want.queue_id,
                        want.body,
                        want.uniq_key,
                    )
                    found[seq] = m.commit_log_offset
                offset = got[-1].queue_offset + 1
    return found


def check_exact(path: Path, acked: Acked, failed_up_to: int, tmp_path: Path) -> None:
    """Reopen the store at ``path`` (recovery) and compare it with the model: every durable
    acknowledged message at its offset, nothing else but messages put after the last durable
    one (up to ``failed_up_to``), none twice; verify clean; recovery repeatable."""
    durable = acked.puts[: acked.durable]
    later = range(durable[-1][0] + durable[-1][1], failed_up_to)
    check_store(path, durable, later)
    found = stored_seqs(path)
    model = {
        seq: offset
        for first, n, offsets in durable
        for seq, offset in zip(range(first, first + n), offsets, strict=True)
    }
    assert {seq: found.get(seq) for seq in model} == model
    assert set(found) - set(model) <= set(later)
    recover_twice_identically(path, tmp_path)


@pytest.mark.parametrize("flush", ["SYNC_FLUSH", "ASYNC_FLUSH"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_real_eio_under_a_put_is_fail_stop_and_recovers_exactly(
    fault_fs: FaultFS, tmp_path: Path, fault: str, flush: str
) -> None:
    store = MessageStore(fault_fs.mount / "store", store_config(flush), background=False)
    try:
        acked, seq, message = put_until_failure(
            store, fault_fs, FAULTS[fault], flush == "SYNC_FLUSH"
        )
    finally:
        # Close flushes what it can; while the disk still fails, so does that flush, and
        # close raises the failure again.
        with contextlib.suppress(StoreFailedError):
            store.close()
    assert "Input/output error" in message
    check_named(message, fault_fs)
    fault_fs.stop()
    check_exact(fault_fs.backing / "store", acked, seq, tmp_path)


def test_a_write_torn_after_a_records_body_does_not_survive_recovery(
    fault_fs: FaultFS, tmp_path: Path
) -> None:
    """The disk takes a put's bytes up to 8 bytes before the end of its first record, then
    fails (a bad sector there): the put fails, and the torn record, whose body still checks
    out, must not come back after recovery (a Spark sink's retry looks its rows up by the
    UNIQ_KEY property, so it would also store the row twice)."""
    config = store_config("SYNC_FLUSH")
    batch = batch_table(261, 10)
    with MessageStore(tmp_path / "scratch", config, background=False) as scratch:
        first_size = int(scratch.put_batch(batch).sizes[0])
    acked = Acked()
    store = MessageStore(fault_fs.mount / "store", config, background=False)
    try:
        for first, n in ((1, 40), (41, 90), (131, 130)):
            result = store.put_batch(batch_table(first, n))
            acked.puts.append((first, n, result.commit_log_offsets.tolist()))
        acked.durable = len(acked.puts)
        end = store.max_phy_offset
        base = end - end % GEOMETRY["mapped_file_size_commitlog"]
        segment = f"store/commitlog/{segment_name(base)}"
        fault_fs.fail("write", segment, start=end - base + first_size - 8)
        with pytest.raises(StoreFailedError):
            store.put_batch(batch)
    finally:
        with contextlib.suppress(StoreFailedError):
            store.close()
    fault_fs.stop()
    check_exact(fault_fs.backing / "store", acked, 271, tmp_path)


# -- progress and checkpoint ------------------------------------------------------------------


@pytest.mark.parametrize("op", ["write", "fsync"])
@pytest.mark.parametrize("target", ["config/rocketstore.json*", "checkpoint*"])
def test_real_eio_recording_progress_is_not_fail_stop(
    fault_fs: FaultFS, tmp_path: Path, target: str, op: str
) -> None:
    """The data files are flushed; only the record of how far fails: puts go on, the
    recorded point stays where it was and moves once a flush can write it again."""
    path = fault_fs.mount / "store"
    puts: list[tuple[int, int, list[int]]] = []
    seq = 1
    with MessageStore(path, store_config("SYNC_FLUSH"), background=False) as store:

        def put(n: int) -> None:
            nonlocal seq
            result = store.put_batch(batch_table(seq, n))
            puts.append((seq, n, result.commit_log_offsets.tolist()))
            seq += n

        put(60)
        store.flush()
        before = recorded(path)
        fault_fs.fail(op, f"store/{target}")
        put(80)
        with pytest.raises(ProgressNotRecordedError) as info:
            store.flush()
        # The error names the call and the file (a write also its bytes).
        named = rf"Input/output error: {op} of (bytes \[0, \d+\) of )?"
        assert re.search(named + re.escape(str(path / target.rstrip("*"))), str(info.value))
        assert fault_fs.injected(), "the file system failed nothing"
        assert all(e["op"] == op for e in fault_fs.injected())
        assert store.failed is None
        if target.startswith("config/"):
            assert recorded(path) == before < store.max_phy_offset
        put(50)
        fault_fs.clear()
        store.flush()
        assert recorded(path) == store.max_phy_offset
    fault_fs.stop()
    # Every put was durable: the store holds exactly them.
    check_exact(fault_fs.backing / "store", Acked(puts, len(puts)), seq, tmp_path)


# -- the Spark sink ---------------------------------------------------------------------------


@pytest.mark.slow
def test_sink_failing_on_real_eio_restarts_and_lands_every_row_once(
    fault_fs: FaultFS, tmp_path: Path
) -> None:
    """Every CommitLog fsync of every broker fails: the query fails with the store's error,
    naming the file and bytes (the Python worker raises it; nothing dies of a signal);
    restarted from its checkpoint once the disk works, it lands every row exactly once, on the
    disk. Both faces, each into a root of its own, one after the other in one driver, and
    again in the restart's."""
    faces = ["foreach", "format"]
    rows = write_input(tmp_path / "in", files=2, rows_per_file=400)
    root = fault_fs.mount / "root-{face}"
    fault_fs.fail("fsync", "root-*/*/commitlog/[0-9]*[0-9]")
    proc = job(tmp_path, "local[2]", ",".join(faces), root=root)
    out, err = proc.communicate(timeout=600)
    assert "crashed" not in err and "exited unexpectedly" not in err, err[-4000:]
    got = outcomes(out)
    for face in faces:
        error = got[face]["error"]
        assert error is not None, f"{face}: the sink wrote through a failing disk without failing"
        check_named(str(error), fault_fs)
        assert f"root-{face}/" in str(error), error
    assert proc.returncode != 0
    fault_fs.clear()
    finish(job(tmp_path, "local[2]", ",".join(faces), root=root))
    fault_fs.stop()
    for face in faces:
        check_exactly_once(tmp_path, rows, fault_fs.backing / f"root-{face}")


def test_a_retention_round_that_fails_stops_puts(
    fault_fs: FaultFS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cleaner thread's round deletes a segment and the directory's fsync fails with a real
    ``EIO``: the thread stops, and the next put says so instead of going on with retention
    stopped (a disk that then fills up would do so silently)."""
    monkeypatch.setattr(store_module, "RUN_INTERVAL_MS", 20)
    not_now = f"{(time.localtime().tm_hour + 12) % 24:02d}"
    cfg = StoreConfig(
        mapped_file_size_commitlog=64 * 1024,
        file_reserved_time=0,
        delete_when=not_now,
        shared_storage="local",
    )
    used = [0.5]
    store = MessageStore(fault_fs.mount / "s", cfg, disk_usage=lambda _p: used[0])
    for _ in range(200):
        store.put(Message("T", b"x" * 1000))
    assert len(list((fault_fs.mount / "s" / "commitlog").glob("0*"))) >= 3
    fault_fs.fail("fsyncdir", "s/commitlog")
    # Over diskMaxUsedSpaceRatio (75 %), under the 90 % that refuses puts: expired segments go.
    used[0] = 0.8
    cleaner = store._cleaner
    assert cleaner is not None
    deadline = time.monotonic() + 60
    while cleaner._thread.is_alive() and time.monotonic() < deadline:
        cleaner._thread.join(0.05)
    with pytest.raises(
        StoreError, match=r"rocketstore-clean:s failed and stopped .*Input/output error"
    ):
        store.put(Message("T", b"after"))
    with pytest.raises(StoreError, match="rocketstore-clean:s failed"):
        store.put_batch([Message("T", b"after")])
    assert [e["op"] for e in fault_fs.injected()] == ["fsyncdir"]
    fault_fs.clear()
    store.close()
