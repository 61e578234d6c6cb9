"""One ``syncfs`` for a flush of many ConsumeQueues (rocketstore.pipeline.engine.queueset) must
be as good as an fsync of each: it is used only where the kernel reports write-back errors
from it (Linux 5.8) and where the file system ``consumequeue/`` is on (a mount point or a
symlink may take it off the store root's) is made durable by it; elsewhere each queue is
fsynced.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import StoreFailedError
from rocketstore.pipeline.files import filesystem
from rocketstore.pipeline.format.message import Message
from tests.kit import faultfuse
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


def batch(round_: int) -> list[Message]:
    """One message for each queue."""
    return [
        Message(f"T{i % TOPICS:02d}", b"r%d-m%d" % (round_, i), queue_id=i // TOPICS)
        for i in range(QUEUES)
    ]


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
