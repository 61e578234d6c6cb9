"""One ``syncfs`` for a flush of many ConsumeQueues (rocketstore.pipeline.engine.queueset) must
be as good as an fsync of each:

* A write-back error on the file system of ``consumequeue/`` since the store opened fails the
  flush (``StoreFailedError``) and the progress file keeps naming the last durable point, even
  when another process's ``syncfs`` took the error first. Shown on a real chain: ext4 in an
  image file on the fault FUSE mount (tests/procs/faultfuse.py), attached to a loop device,
  so that a failed write of the image is a block I/O error under ext4.
* One ``syncfs`` is used only where the kernel reports write-back errors from it (Linux 5.8)
  and where the file system ``consumequeue/`` is on (a mount point or a symlink may take it
  off the store root's) is made durable by it; elsewhere each queue is fsynced.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import StoreError, StoreFailedError
from rocketstore.pipeline.files import durability, filesystem
from rocketstore.pipeline.files.progress import FlushProgress
from rocketstore.pipeline.format.message import Message
from tests.kit import faultfuse, realfs
from tests.kit.faultfuse import FaultFS

TOPICS = 25
QUEUES = TOPICS * 4  # past the 64 queues from which a flush may use one syncfs
CONFIG = StoreConfig(
    mapped_file_size_commitlog=1 << 20,
    mapped_file_size_consume_queue=40 * 20,
    max_hash_slot_num=509,
    max_index_num=2_000,
    flush_interval_commitlog=3_600_000,  # flushes where the tests make them
)
IMAGE = "ext4.img"


def batch(round_: int) -> list[Message]:
    """One message for each queue."""
    return [
        Message(f"T{i % TOPICS:02d}", b"r%d-m%d" % (round_, i), queue_id=i // TOPICS)
        for i in range(QUEUES)
    ]


_libc = ctypes.CDLL(None, use_errno=True)


def raw_syncfs(fd: int) -> int:
    """syncfs(2) of ``fd``'s file system: 0 or the errno."""
    return 0 if _libc.syncfs(fd) == 0 else ctypes.get_errno()


def third_party_syncfs(path: Path) -> subprocess.CompletedProcess[str]:
    """``sync -f``: another process's syncfs of the file system holding ``path``."""
    return subprocess.run(["sync", "-f", str(path)], capture_output=True, text=True, check=False)


def fail_writes_of(fs: FaultFS, files: list[Path]) -> list[tuple[int, int]]:
    """Make every write of the image to the blocks of ``files`` fail; returns those ranges."""
    ranges = sorted(r for f in files for r in realfs.extents(f))
    merged: list[tuple[int, int]] = []
    for start, end in ranges:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    for start, end in merged:
        fs.fail("write", IMAGE, start=start, end=end)
    return merged


@pytest.fixture
def ext4_on_fault_fs(tmp_path: Path) -> Iterator[tuple[FaultFS, Path]]:
    """An ext4 whose device is a file on the fault FUSE mount, mounted on ``tmp_path/ext4``."""
    why = faultfuse.unavailable()
    if why is not None:
        pytest.skip(why)
    realfs.require_root_mounts("ext4")
    if shutil.which("sync") is None:
        pytest.skip("no sync(1) (coreutils) to run another process's syncfs")
    with (
        faultfuse.mounted(tmp_path / "fuse") as fs,
        realfs.ext4_in_file(fs.mount / IMAGE, tmp_path / "ext4", 64) as point,
    ):
        try:
            yield fs, point
        finally:
            fs.clear()  # nothing may fail while the file system is unmounted


def test_another_process_s_syncfs_takes_an_error_from_descriptors_opened_after_it(
    ext4_on_fault_fs: tuple[FaultFS, Path],
) -> None:
    """The kernel's rule (Linux 5.8 on; seen on 6.18): syncfs reports a write-back error to a
    descriptor opened before it, once; a descriptor opened after it hears of it only if no
    syncfs has reported it yet. sync(2) reports nothing and leaves the error to syncfs."""
    fs, point = ext4_on_fault_fs
    files = [point / f"f{i}" for i in range(8)]
    for f in files:
        f.write_bytes(b"a" * 4096)
    os.sync()
    fail_writes_of(fs, files)
    before = os.open(point, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for f in files:
            with open(f, "r+b") as fh:
                fh.write(b"b" * 4096)
        os.sync()
        assert fs.injected(), "the write-back did not reach the failing blocks"
        opened_after_sync = os.open(point, os.O_RDONLY | os.O_DIRECTORY)
        try:
            third = third_party_syncfs(point)
            assert third.returncode != 0 and "Input/output error" in third.stderr, third
            opened_after_third = os.open(point, os.O_RDONLY | os.O_DIRECTORY)
            try:
                assert raw_syncfs(opened_after_third) == 0  # the error is missed here
            finally:
                os.close(opened_after_third)
            assert raw_syncfs(opened_after_sync) == errno.EIO
            assert raw_syncfs(before) == errno.EIO
            assert raw_syncfs(before) == 0  # reported once
        finally:
            os.close(opened_after_sync)
    finally:
        os.close(before)


def test_a_write_back_error_another_process_took_first_fails_the_flush(
    ext4_on_fault_fs: tuple[FaultFS, Path],
) -> None:
    fs, point = ext4_on_fault_fs
    path = point / "store"
    s = MessageStore(path, CONFIG, background=False)
    try:
        s.put_batch(batch(0))
        s.flush()
        recorded = FlushProgress.read(path / "config")
        assert recorded is not None and set(recorded.queues.values()) == {1}
        queue_files = [p for p in (path / "consumequeue").glob("*/*/*") if p.is_file()]
        assert len(queue_files) == QUEUES
        fail_writes_of(fs, queue_files)
        s.put_batch(batch(1))
        # Every other file of the store is written out now (as the kernel's background
        # write-back may do at any time), so that only the queues' pages are left to fail.
        for f in path.rglob("*"):
            if f.is_file() and "consumequeue" not in f.relative_to(path).parts:
                fd = os.open(f, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        third = third_party_syncfs(point)
        assert third.returncode != 0 and "Input/output error" in third.stderr, third
        assert all(e["op"] == "write" for e in fs.injected())
        with pytest.raises(StoreFailedError, match=r"syncfs .*consumequeue"):
            s.flush()
        # The progress file still names the units of the first batch only.
        assert FlushProgress.read(path / "config") == recorded
    finally:
        with contextlib.suppress(StoreError):
            s.close()


# -- where one syncfs is used --------------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "reports"),
    [
        ("3.10.0-1160.el7.x86_64", False),
        ("4.19.0-26-amd64", False),
        ("5.4.0", False),
        ("5.4.0-150-generic", False),
        ("5.7.19", False),
        ("5.8.0", True),
        ("5.10.0-rc1", True),
        ("6.18.44-fc", True),
        ("6.18.44-fc-v1272", True),
        ("10.1", True),
        ("", False),
        ("unknown", False),
    ],
)
def test_syncfs_reports_write_back_errors_from_linux_5_8(release: str, reports: bool) -> None:
    assert filesystem.syncfs_reports_errors(release) is reports


@pytest.mark.parametrize(("release", "one_syncfs"), [("5.4.0-150-generic", False), ("5.8.0", True)])
def test_a_flush_of_many_queues_uses_syncfs_only_on_kernels_where_it_reports_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release: str, one_syncfs: bool
) -> None:
    if filesystem.fs_type(tmp_path) not in filesystem.SYNCFS_DURABLE:
        pytest.skip(f"{tmp_path} is on {filesystem.fs_type(tmp_path)}, where syncfs is not used")
    real = os.uname()
    fake = os.uname_result((real.sysname, real.nodename, release, real.version, real.machine))
    monkeypatch.setattr(os, "uname", lambda: fake)
    with MessageStore(tmp_path / "store", CONFIG, background=False) as s:
        s.put_batch(batch(0))
        s.work.reset()
        s.flush()
        if one_syncfs:
            assert s.work.synced_all == 1 and s.work.synced <= 2  # the CommitLog, the index
        else:
            assert s.work.synced_all == 0 and s.work.synced >= QUEUES


@pytest.fixture
def fault_fs(tmp_path: Path) -> Iterator[FaultFS]:
    why = faultfuse.unavailable()
    if why is not None:
        pytest.skip(why)
    with faultfuse.mounted(tmp_path / "fuse") as fs:
        yield fs


@pytest.mark.parametrize("how", ["mounted on it", "a symlink to it"])
def test_consumequeue_on_a_fuse_mount_under_a_store_on_ext4_is_fsynced_queue_by_queue(
    tmp_path: Path, how: str
) -> None:
    """The store root's ext4 would take one syncfs, which never reaches the FUSE file system
    ``consumequeue/`` is on: each queue's fsync must, and its failure fails the flush."""
    why = faultfuse.unavailable()
    if why is not None:
        pytest.skip(why)
    if filesystem.fs_type(tmp_path) not in filesystem.SYNCFS_DURABLE:
        pytest.skip(f"{tmp_path} is on {filesystem.fs_type(tmp_path)}, where syncfs is not used")
    path = tmp_path / "store"
    cq = path / "consumequeue"
    path.mkdir()
    if how == "mounted on it":
        cq.mkdir()
        fs = FaultFS(tmp_path / "backing", cq, tmp_path / "faultfuse.log")
    else:
        fs = FaultFS(tmp_path / "backing", tmp_path / "mnt", tmp_path / "faultfuse.log")
        cq.symlink_to(fs.mount)
    try:
        fs.start()
        assert (filesystem.fs_type(cq) or "").startswith("fuse")
        with MessageStore(path, CONFIG, background=False) as s:
            s.put_batch(batch(0))
            fs.fail("fsync", "*")
            try:
                with pytest.raises(StoreFailedError, match=r"fsync of .*consumequeue"):
                    s.flush()
            finally:
                fs.clear()
            assert s.work.synced_all == 0
            assert fs.injected()[0]["op"] == "fsync"
    finally:
        fs.stop()


def test_consumequeue_on_tmpfs_under_a_store_on_fuse_takes_one_syncfs_of_the_tmpfs(
    fault_fs: FaultFS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store root's FUSE file system would be fsynced file by file; ``consumequeue/`` is
    a tmpfs mounted on it, made durable by one syncfs of its own file system."""
    realfs.require_root_mounts("tmpfs")
    path = fault_fs.mount / "store"
    cq = path / "consumequeue"
    cq.mkdir(parents=True)
    synced: list[int] = []
    real = durability.syncfs

    def recording(fd: int, where: Path) -> None:
        synced.append(os.fstat(fd).st_dev)
        real(fd, where)

    monkeypatch.setattr(durability, "syncfs", recording)
    with realfs.tmpfs_on(cq, "16m"), MessageStore(path, CONFIG, background=False) as s:
        s.put_batch(batch(0))
        s.work.reset()
        s.flush()
        assert s.work.synced_all == 1
        assert synced == [os.stat(cq).st_dev]


def test_a_symlink_to_tmpfs_is_synced_on_the_tmpfs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``consumequeue/`` a symlink to a directory in /dev/shm: the decision and the syncfs
    follow it to the tmpfs."""
    if filesystem.fs_type(Path("/dev/shm")) not in filesystem.READS_ALLOCATE:
        pytest.skip("/dev/shm is not a tmpfs here")
    shm = Path(tempfile.mkdtemp(prefix="rs-cq-", dir="/dev/shm"))
    try:
        path = tmp_path / "store"
        path.mkdir()
        (path / "consumequeue").symlink_to(shm)
        synced: list[int] = []
        real = durability.syncfs

        def recording(fd: int, where: Path) -> None:
            synced.append(os.fstat(fd).st_dev)
            real(fd, where)

        monkeypatch.setattr(durability, "syncfs", recording)
        with MessageStore(path, CONFIG, background=False) as s:
            s.put_batch(batch(0))
            s.flush()
        assert synced == [os.stat(shm).st_dev]
    finally:
        shutil.rmtree(shm)


def _open_directories() -> list[str]:
    fds = Path("/proc/self/fd")
    out = []
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):
            out.append(os.readlink(fd))
    return out


def test_the_syncfs_descriptor_is_held_from_the_open_to_the_close(tmp_path: Path) -> None:
    """Opened with the store (before anything is written), so that it hears of every error
    since; closed with it."""
    if not filesystem.syncfs_replaces_fsyncs(tmp_path):
        pytest.skip(f"{tmp_path} is on {filesystem.fs_type(tmp_path)}, where syncfs is not used")
    path = tmp_path / "store"
    cq = str(path / "consumequeue")
    with MessageStore(path, CONFIG, background=False) as s:
        assert _open_directories().count(cq) == 1
        s.put_batch(batch(0))
        s.flush()
        assert s.work.synced_all == 1
        assert _open_directories().count(cq) == 1
    assert cq not in _open_directories()
    with MessageStore(path, CONFIG, read_only=True):
        assert cq not in _open_directories()
