"""Two hosts on CephFS for tests: ceph-fuse clients of the session's Ceph (tests/kit/ceph.py,
started with ``--fs``), each mount a client of its own, as on two hosts.

:func:`hosts` makes a fresh folder of the file system for one test and mounts it (``ceph-fuse
-r``) at ``.a`` and ``.b``; :meth:`Hosts.in_namespace` runs a command in a mount namespace of its
own with a third client mounted there (a Spark worker as a host). They give what
tests/kit/gluster.py's :class:`~tests.kit.gluster.Volume` gives, so that a test takes either.
Everything is unmounted and every client started here stopped afterwards, whatever happens.

Facts measured here (Ceph 16.2, ceph-fuse): a mount takes 0.3 s. A ceph-fuse killed -9 keeps its
MDS session, and with it its POSIX locks and caps, until the MDS closes the session after the
file system's ``session_autoclose`` (300 s by default, 30 s at least): another client's lock
request waited 302 s. Evicting the session (``ceph tell mds.<id> client evict id=N``, what an
operator or a cluster manager does to fence a host it has declared dead) releases them at once
(0.28 s), so :meth:`Hosts.lose_host` kills a client and evicts it.

Not thread-safe; one process manages a set of hosts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.kit.ceph import Ceph

TIMEOUT_S = 60.0


def _poll(what: str, ready: object, timeout_s: float = TIMEOUT_S) -> None:
    assert callable(ready)
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(0.05)  # polling interval: the loop checks the condition itself


def _mounted(point: Path) -> bool:
    with open("/proc/self/mounts") as mounts:
        return any(
            line.split()[1] == str(point) and line.split()[2] == "fuse.ceph-fuse" for line in mounts
        )


def unmount(point: Path) -> None:
    if subprocess.run(["umount", str(point)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


class Hosts:
    """Mounts ``a`` and ``b`` of one fresh folder of the session's CephFS (see the module)."""

    def __init__(self, ceph: Ceph, work: Path, folder: str) -> None:
        self.ceph = ceph
        self.work = work
        self.folder = folder
        self.a = work / "a"
        self.b = work / "b"
        self.conf = ceph.directory / "ceph.conf"

    def _client_args(self, at: Path) -> list[str]:
        """ceph-fuse's arguments for a client of this folder at ``at``; the log names the
        mount, and the arguments hold ``self.work`` (how :meth:`client_pids` finds them)."""
        log = self.work / f"ceph-fuse.{at.name}.log"
        return ["ceph-fuse", "-c", str(self.conf), "-n", "client.admin", "-r", f"/{self.folder}",
                "--log-file", str(log), str(at)]  # fmt: skip

    def mount(self, at: Path) -> None:
        """Mount the folder at ``at`` with a client of its own (ceph-fuse forks once mounted)."""
        at.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            self._client_args(at), capture_output=True, text=True, timeout=TIMEOUT_S
        )
        if done.returncode != 0 or not _mounted(at):
            raise RuntimeError(f"ceph-fuse at {at} failed: {done.stdout}{done.stderr}".strip())

    def client_pids(self) -> list[int]:
        """PIDs of the clients of these hosts (every mount, any namespace)."""
        out = subprocess.run(
            ["pgrep", "-f", f"^ceph-fuse .* {self.work}/"], capture_output=True, text=True
        )
        return [int(x) for x in out.stdout.split()]

    def client_pid(self, point: Path) -> int:
        """PID of the client serving the mount at ``point``."""
        out = subprocess.run(
            ["pgrep", "-f", f"^ceph-fuse .* {point}$"], capture_output=True, text=True
        )
        pids = [int(x) for x in out.stdout.split()]
        if len(pids) != 1:
            raise RuntimeError(f"{len(pids)} client processes for {point}")
        return pids[0]

    def ceph_cli(self, *args: str) -> str:
        done = subprocess.run(
            ["ceph", "-c", str(self.conf), "--connect-timeout", "60", *args],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        if done.returncode != 0:
            raise RuntimeError(f"ceph {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def session_id(self, point: Path) -> int:
        """The MDS session id of the client mounted at ``point`` (its ``client.N``)."""
        for session in json.loads(self.ceph_cli("tell", "mds.a", "client", "ls")):
            if session.get("client_metadata", {}).get("mount_point") == str(point):
                return int(session["id"])
        raise RuntimeError(f"no MDS session for the client at {point}")

    def evict(self, point: Path) -> None:
        """Evict the session of the client at ``point`` while it runs (an operator fencing a
        host it cannot reach, or the MDS closing a partitioned client's session): the MDS drops
        its caps and locks, and the OSDs refuse its writes (``blocklist``)."""
        self.ceph_cli("tell", "mds.a", "client", "evict", f"id={self.session_id(point)}")

    def lose_host(self, point: Path) -> None:
        """The host of ``point`` is gone: its client killed -9, and its session evicted, as
        whoever declared it dead does (see the module: else its locks stay 300 s)."""
        session = self.session_id(point)
        os.kill(self.client_pid(point), signal.SIGKILL)
        self.ceph_cli("tell", "mds.a", "client", "evict", f"id={session}")

    def in_namespace(
        self, cmd: Sequence[str], at: Path, **popen: object
    ) -> subprocess.Popen[bytes]:
        """Run ``cmd`` in a mount namespace of its own where a client of its own mounts the
        folder at ``at`` (a host of its own); the mount goes when ``cmd`` ends. A host killed
        with its shell leaves its client, which :func:`hosts` stops at the end."""
        script = 'set -e; "$@" >/dev/null; trap \'umount -l "$AT" 2>/dev/null || true\' EXIT; '
        script += 'shift "$N"; "$@"'
        args = self._client_args(at)
        env = {**os.environ, "AT": str(at), "N": str(len(args))}
        extra_env = popen.pop("env", None)
        if isinstance(extra_env, dict):
            env.update(extra_env)
        at.mkdir(parents=True, exist_ok=True)
        return subprocess.Popen(  # type: ignore[call-overload,no-any-return]
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *args, *cmd],
            env=env,
            **popen,
        )

    def stop_clients(self) -> None:
        """Stop every client of these hosts that outlived its mount: a client closes its MDS
        session as it exits after its unmount, so each gets a moment for that first; one
        killed instead keeps its caps on the files for ``session_autoclose`` (removing the
        test's folder waited 35 s for them)."""
        with contextlib.suppress(TimeoutError):
            _poll("the clients to exit after their unmount", lambda: not self.client_pids(), 10)
        for pid in self.client_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _poll("the clients to exit", lambda: not self.client_pids())


@contextlib.contextmanager
def hosts(ceph: Ceph, parent: Path | None = None) -> Iterator[Hosts]:
    """A fresh folder of ``ceph``'s file system mounted at ``.a`` and ``.b``; unmounted and
    its clients stopped afterwards (the folder goes with the cluster)."""
    top = ceph.env.get("CEPHFS_MOUNT", "")
    if not top:
        raise RuntimeError(f"the Ceph at {ceph.directory} has no CephFS (started without --fs)")
    folder = f"rs-{uuid.uuid4().hex[:10]}"
    (Path(top) / folder).mkdir()
    work = Path(tempfile.mkdtemp(prefix="rs-cephfs-", dir=parent))
    made = Hosts(ceph, work, folder)
    try:
        made.mount(made.a)
        made.mount(made.b)
        yield made
    finally:
        for point in (made.b, made.a):
            if _mounted(point):
                unmount(point)
        made.stop_clients()
        for point in (made.a, made.b):
            with contextlib.suppress(OSError):
                os.rmdir(point)  # empty unless a mount is left: nothing under it is deleted
        # The folder stays: the session's Ceph is purged whole at its end, and removing a
        # store's files one by one through the MDS took a minute of the suite under load
        # (waiting on caps the clients just stopped still held).
