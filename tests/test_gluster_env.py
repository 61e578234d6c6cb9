"""The GlusterFS test environment itself (tests/kit/gluster.py), and the properties of a shared
file system the store relies on (docs/cluster.md, "What the store needs"), checked through two
mounts: a write on one is read on the other after it is synced; a POSIX record lock taken on one
conflicts on the other; a lost brick leaves the volume usable and heals; a namespace mount is
a host of its own, and its client is stopped at teardown even when the host was killed."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gluster


def test_a_synced_write_on_one_mount_is_read_on_the_other(gluster_volume: Any) -> None:
    """After fsync on A, a client that had the file cached sees the new size once its cached
    attributes are refreshed: at once after listing the directory (which the store's readers
    do before they read a published point), else within the attribute timeout (1 s)."""
    a, b = gluster_volume.a, gluster_volume.b
    for name in ("listed", "waited"):
        (b / name).write_bytes(b"")  # the other client has the file cached before the write
        assert (b / name).read_bytes() == b""
        fd = os.open(a / name, os.O_RDWR)
        try:
            os.pwrite(fd, b"x" * 5000, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
    os.listdir(b)
    assert (b / "listed").read_bytes() == b"x" * 5000
    deadline = time.monotonic() + 3.0
    while (b / "waited").read_bytes() != b"x" * 5000:
        assert time.monotonic() < deadline, "not seen within 3 s"
        time.sleep(0.05)  # polling interval; the loop checks the file itself


def test_a_record_lock_on_one_mount_conflicts_on_the_other(gluster_volume: Any) -> None:
    a, b = gluster_volume.a, gluster_volume.b
    (a / "lock").write_bytes(b"")
    holder = os.open(a / "lock", os.O_RDWR)
    other = os.open(b / "lock", os.O_RDWR)
    try:
        fcntl.lockf(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(OSError):
            fcntl.lockf(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(holder, fcntl.LOCK_UN)
        fcntl.lockf(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(other)
        os.close(holder)


def test_a_lost_brick_leaves_the_volume_usable_and_heals(gluster_volume: Any) -> None:
    vol = gluster_volume
    vol.kill_brick(0)
    assert vol.bricks[0] not in vol.brick_pids()
    (vol.a / "during").write_bytes(b"written with a brick down")
    assert (vol.b / "during").read_bytes() == b"written with a brick down"
    vol.restart_bricks()
    vol.wait_for_heal()
    assert (vol.bricks[0] / "during").read_bytes() == b"written with a brick down"


def test_a_namespace_mount_is_a_host_of_its_own(gluster_volume: Any, tmp_path: Path) -> None:
    vol = gluster_volume
    (vol.a / "hello").write_text("from host a")
    at = tmp_path / "host-c"
    proc = vol.in_namespace(
        ["sh", "-c", f'cat "{at}/hello"; echo; grep -c " {at} " /proc/self/mounts'],
        at,
        stdout=subprocess.PIPE,
    )
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert out.decode().splitlines() == ["from host a", "1"]  # mounted there, inside
    with open("/proc/self/mounts") as mounts:
        assert f" {at} " not in mounts.read()  # and not here


def test_teardown_stops_the_client_of_a_killed_host(gluster_daemon: None, tmp_path: Path) -> None:
    from tests.kit.gluster import _poll, client_pids, volume

    with volume(tmp_path) as vol:
        at = tmp_path / "host-d"
        proc = vol.in_namespace(["sleep", "600"], at, start_new_session=True)
        _poll("the namespace's mount", lambda: len(client_pids(vol.name)) == 3)
        os.killpg(proc.pid, signal.SIGKILL)  # the host dies: its shell cannot unmount
        proc.wait(timeout=60)
        assert len(client_pids(vol.name)) == 3  # what the teardown has to deal with
        name = vol.name
    assert client_pids(name) == []
