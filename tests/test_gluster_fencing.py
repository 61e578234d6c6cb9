"""Fencing reads what another host wrote a moment ago (rocketstore.pipeline.engine.fencing, "Stale
reads"), on a GlusterFS volume with its default options: two mounts of one volume are two hosts,
each with its own client caches (tests/kit/gluster.py).

Host B reads first (its caches learn the file, as a read-only open, a metrics scrape or a
writer's own check do), then host A's writer records an epoch or removes ``abort``, durably,
and at once B reads through the store's own functions: its reading of the epochs file, its
take-over, its fence check. Within a second of B's first read its caches still hold the file
as it was (GlusterFS's quick-read keeps the content of files up to 64 KiB, the kernel keeps
attributes and names for 1 s), which is the window each try hits; each try checks the same
thing, and every try must see A's write.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline.engine import fencing
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import FencedError
from rocketstore.pipeline.files import lock as lock_module
from rocketstore.pipeline.files.lock import DirectoryLock
from tests.kit.fencing import CONFIG

pytestmark = pytest.mark.gluster

TRIES = 5


def store_on_both(vol: Any, name: str) -> tuple[Path, Path]:
    """A new fenced store (epoch 0, closed cleanly), as host A and host B see it. Each try has
    one of its own: host B has never looked its files up, so its first read reaches the
    servers and fills its caches (a file it read before may be held by the caches or not,
    depending on when they last asked the servers)."""
    a, b = vol.a / name, vol.b / name
    with MessageStore(a, CONFIG):
        pass
    return a, b


@contextlib.contextmanager
def taken_by(store_dir: Path) -> Iterator[fencing.Epoch]:
    """What a writer on this host does to the epochs file when it takes the store and closes
    it: takes the lock, records the next epoch (durable on return), lets the lock go; yields
    the epoch. The lock's descriptor is closed on exit only: GlusterFS takes a second to close
    a descriptor of a file another client holds open, and another host's caches would expire
    meanwhile."""
    lock = DirectoryLock(store_dir)
    lock.acquire()
    try:
        fence = fencing.Fence.take(store_dir, lock, 0, 0, int(time.time() * 1000))
        fence.close()
        drop_lock(lock)
        yield fence.epoch
    finally:
        lock.release()


def drop_lock(lock: DirectoryLock) -> None:
    """Drop ``lock`` on its own descriptor (as GlusterFS's servers drop a cut-off client's;
    as a close does), leaving the descriptor open."""
    assert lock._fd is not None and lock.kind == "ofd" and lock_module._OFD_SETLK is not None
    fcntl.fcntl(lock._fd, lock_module._OFD_SETLK, lock_module._flock(fcntl.F_UNLCK))


def test_a_read_right_after_another_hosts_take_has_its_epoch(gluster_volume: Any) -> None:
    for i in range(TRIES):
        a, b = store_on_both(gluster_volume, f"store{i}")
        fencing.read_epochs(b)
        with taken_by(a) as newest:
            seen = fencing.read_epochs(b)
        assert len(seen) == newest.epoch + 1, (
            f"host B read {len(seen)} epochs, not {newest.epoch + 1}"
        )
        assert seen[-1] == newest and seen == fencing.read_epochs(a)


def test_a_taker_right_after_another_hosts_take_records_its_epoch_after_it(
    gluster_volume: Any,
) -> None:
    for i in range(TRIES):
        a, b = store_on_both(gluster_volume, f"store{i}")
        fencing.read_epochs(b)
        with taken_by(a) as theirs, taken_by(b) as ours:
            pass
        assert ours.epoch == theirs.epoch + 1, "host B's taker wrote over host A's epoch"
        assert fencing.read_epochs(a)[-2:] == [theirs, ours]


def test_an_older_versions_file_is_read_right_after_another_hosts_append(
    gluster_volume: Any,
) -> None:
    """A file an older version wrote is its slots and nothing more, small enough for a client
    to hold its content: host B reads it right after host A's older writer appended a slot;
    B's taker then records its epoch after it and pads the file."""
    for i in range(TRIES):
        a, b = store_on_both(gluster_volume, f"store{i}")
        path = fencing.path_of(a)
        first = fencing.read_epochs(a)
        older = fencing.Epoch(1, 0, 0, int(time.time() * 1000), 1)
        fd = os.open(path, os.O_RDWR)
        try:
            os.ftruncate(fd, fencing.SLOT.size)
            os.fsync(fd)
            assert fencing.read_epochs(b) == first
            # The older version's take: its slot, the file cut after it, synced.
            os.pwrite(fd, older.pack(), fencing.SLOT.size)
            os.ftruncate(fd, 2 * fencing.SLOT.size)
            os.fsync(fd)
        finally:
            os.close(fd)
        seen = fencing.read_epochs(b)
        assert seen == [*first, older], f"host B read {len(seen)} epochs, not 2"
        with taken_by(b) as ours:
            pass
        assert fencing.read_epochs(a) == [*first, older, ours]
        assert path.stat().st_size == fencing.MIN_SIZE


def test_a_writer_that_lost_its_lock_is_fenced_right_after_another_hosts_take(
    gluster_volume: Any,
) -> None:
    """Host B's writer, whose lock the servers dropped, checks its fence right after host A's
    writer took the store and closed it (nobody holds the lock: the check takes it back)."""
    for i in range(TRIES):
        a, b = store_on_both(gluster_volume, f"store{i}")
        lock = DirectoryLock(b)
        lock.acquire()
        try:
            fence = fencing.Fence.take(b, lock, 0, 0, int(time.time() * 1000))
            fence.check("a put")  # it owns the store
            drop_lock(lock)
            with (
                taken_by(a) as theirs,
                pytest.raises(FencedError, match=f"epoch {theirs.epoch} was taken"),
            ):
                fence.check("a put")
            fence.close()
        finally:
            lock.release()


def test_a_writer_that_lost_its_lock_is_fenced_right_after_abort_was_removed(
    gluster_volume: Any,
) -> None:
    """A taker that records no epoch (a stock broker let in by hand) is seen by the ``abort``
    it removed when it stopped cleanly: host B's writer checks right after host A's removal."""
    for i in range(TRIES):
        a, b = store_on_both(gluster_volume, f"store{i}")
        lock = DirectoryLock(b)
        lock.acquire()
        try:
            lock.mark_open()
            fence = fencing.Fence.take(b, lock, 0, 0, int(time.time() * 1000))
            fence.check("a put")
            drop_lock(lock)
            broker = DirectoryLock(a)
            broker.acquire()
            try:
                broker.mark_closed()  # its clean stop removes abort
                drop_lock(broker)
                with pytest.raises(FencedError, match="abort was removed or replaced"):
                    fence.check("a put")
            finally:
                broker.release()
            fence.close()
        finally:
            lock.release()
