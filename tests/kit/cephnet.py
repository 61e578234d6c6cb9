"""Hosts with a network on CephFS: tests/kit/netcluster.py's hosts and server namespaces, with
a throwaway Ceph (mon, mgr, OSD, MDS; ``../shared/ceph/ceph-up.sh --fs``) in the server's
namespaces instead of GlusterFS, bound to the bridge's address (``CEPH_ADDR``), and every host
mounting the file system's folder ``/rs`` with a ceph-fuse client of its own::

    netns <id>-srv  (+ mount ns)  ceph-mon, ceph-mgr, ceph-osd, ceph-mds, radosgw on 10.27.0.1
    |    +-- netns <id>-A  + mount ns: ceph-fuse -r /rs at .mount
    |    +-- netns <id>-B  + mount ns: ceph-fuse -r /rs at .mount
    |    +-- netns <id>-V  + mount ns: ceph-fuse -r /rs at .mount

:meth:`~tests.kit.netcluster.NetCluster.partition` and ``heal`` are the GlusterFS cluster's (an
nftables drop of everything on both ends of the host's veth). What differs, measured here:

* A client cut off does not give up: its processes wait on the mount (no error) until the
  partition heals. Meanwhile the MDS marks its session stale after the file system's
  ``session_timeout`` and closes it after ``session_autoclose`` (both set to
  :data:`SESSION_S`, 30 s, the least Ceph accepts), blocklisting the client at the OSDs: only
  then are its POSIX locks released, so a take-over waits for that (:meth:`lock_release_s`).
* Healed, a client whose session was closed is fenced for good: its processes get errors
  (``EIO``, ``ENOTCONN``, ``ESHUTDOWN``: :attr:`gone`) from that mount, or wait in it for
  good (an ``fsync`` that never returns: seen in CI, as Ceph's own QA sees calls on an evicted
  mount hang). The way back, as Ceph's documentation says of an evicted client, is a fresh
  mount: :meth:`rejoin` unmounts the old one lazily (processes holding files of it keep them,
  its client alive) and mounts a new client on the same path; :meth:`abort_stale` then does
  what ``umount -f`` does to a FUSE mount, aborting the old client's connection, so that
  whatever waits in it fails (``ENOTCONN``) instead.
* ``cut`` (some bricks only) has no meaning here: one OSD.

The Ceph's directory is a short folder of /tmp (admin sockets need paths under 108 bytes),
removed with the cluster; its daemons and clients are processes of the namespaces, killed -9
by the teardown with everything else there. Not thread-safe; one process manages a cluster.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.kit import ceph as ck
from tests.kit import gluster as gl
from tests.kit import netcluster as nc

SESSION_S = 30  # session_timeout and session_autoclose: the least Ceph 16.2 accepts
FOLDER = "rs"  # the file system's folder every host mounts
CEPH_PREFIX = "rscn"  # the Ceph's folder: /tmp/rscn<pid>-<n>


def unavailable() -> str | None:
    """Why this machine cannot make a CephFS cluster with a network, or None."""
    why = ck.unavailable()
    if why is not None:
        return why
    if not Path("/dev/fuse").exists():
        return "no /dev/fuse: ceph-fuse cannot mount"
    missing = [t for t in nc.TOOLS if shutil.which(t) is None]
    if missing:
        return f"no {', '.join(missing)}: apt-get install iproute2 nftables util-linux"
    return None


class CephNetCluster(nc.NetCluster):
    """A Ceph on the server namespace and hosts that mount its file system (module docstring)."""

    fs = "cephfs"
    gone = ("EIO", "ENOTCONN", "ESHUTDOWN", "EBADF", "ESTALE")

    def __init__(self, work: Path, hosts: Sequence[str]) -> None:
        super().__init__(work, hosts)
        self.ceph_dir = Path(f"/tmp/{CEPH_PREFIX}{self.id.removeprefix(nc.PREFIX)}")
        self.conf = self.ceph_dir / "ceph.conf"
        self._stale: dict[str, str] = {}  # host -> the FUSE connection of its old client

    def lock_release_s(self) -> float:
        """How long the MDS may keep the locks of a host cut off from it: ``session_autoclose``
        after the client's last renewal, seen at the MDS's next tick (1 s)."""
        return float(SESSION_S + 5)

    def gives_up_s(self) -> float | None:
        """A client cut off never fails its processes' calls on its own (module docstring)."""
        return None

    def ceph(self, *args: str) -> str:
        """The ``ceph`` CLI against this cluster, run in the server's namespaces."""
        done = self.run("srv", ["ceph", "-c", str(self.conf), "--connect-timeout", "60", *args])
        if done.returncode != 0:
            raise RuntimeError(f"ceph {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def blocklisted(self, host: str) -> bool:
        """Whether the OSDs refuse ``host``'s clients (its session closed or evicted)."""
        listed = self.ceph("osd", "blocklist", "ls")
        return any(line.startswith(f"{self.address(host)}:") for line in listed.splitlines())

    def rejoin(self, host: str) -> None:
        """After :meth:`heal`: ``host`` on the file system again, with a fresh client (its old
        session may have been closed, which fences that client for good)."""
        self._stale[host] = self._fuse_mounts(host)[str(self.mount)]
        self.run(host, ["umount", "-l", str(self.mount)])
        self._mount(host)
        self.wait_reachable(host)

    def abort_stale(self, host: str) -> None:
        """After :meth:`rejoin`: abort the FUSE connection of ``host``'s old client, as
        ``umount -f`` of a mount does (the kernel's fusectl ``abort``): every call waiting in
        it, or made through a file still open on it, fails with ``ENOTCONN``."""
        conn = self._stale.pop(host, None)
        if conn is None:
            return  # aborted already
        # A connection's name is its device's minor, which the kernel gives to the next mount
        # once the old client ended by itself: never abort one that is mounted now.
        if any(conn in self._fuse_mounts(h).values() for h in self.hosts):
            return
        control = Path("/sys/fs/fuse/connections")
        if not any(control.iterdir()):  # fusectl not mounted: there is always a connection here
            subprocess.run(["mount", "-t", "fusectl", "fusectl", str(control)], check=True)
        abort = control / conn / "abort"
        if abort.exists():  # gone when the old client ended by itself
            abort.write_text("1")

    def _fuse_mounts(self, host: str) -> dict[str, str]:
        """``host``'s FUSE mounts: mount point -> connection (as fusectl names it, the device's
        minor), from the mount table, which asks nothing of the file systems (a call on a
        fenced client's mount may never return)."""
        table = self.run(host, ["cat", "/proc/self/mountinfo"], check=True).stdout
        mounts = {}
        for line in table.splitlines():
            fields, _, fs = line.partition(" - ")
            major, minor = fields.split()[2].split(":")
            if fs.startswith("fuse") and major == "0":
                mounts[fields.split()[4]] = minor
        return mounts

    def _mount(self, host: str) -> None:
        log = self.work / "log" / f"ceph-fuse.{host}.log"
        done = self.run(host, ["ceph-fuse", "-c", str(self.conf), "-n", "client.admin",
                               "-r", f"/{FOLDER}", "--log-file", str(log), str(self.mount)])  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"ceph-fuse on {host}: {done.stdout}{done.stderr}".strip())

    def _ceph_up(self) -> None:
        (self.work / "log").mkdir(exist_ok=True)
        env = {**os.environ, "CEPH_ADDR": nc.SERVER}
        up = self.run("srv", ["bash", str(ck.UP), str(self.ceph_dir), "--fs"], env=env,
                      timeout=900)  # fmt: skip
        if up.returncode != 0:
            raise RuntimeError(f"ceph-up.sh in the server namespace failed:\n{up.stderr[-3000:]}")
        for setting in ("session_timeout", "session_autoclose"):
            self.ceph("fs", "set", "cephfs", setting, str(SESSION_S))
        # The MDS's tick as in the suite's own Ceph (docs/cluster.md, the published point).
        self.ceph("config", "set", "mds", "mds_tick_interval", "1")
        self.run("srv", ["mkdir", "-p", str(self.ceph_dir / "mnt" / FOLDER)], check=True)
        self.mount.mkdir()
        for host in self.hosts:
            self._mount(host)
        for host in self.hosts:
            self.wait_reachable(host)

    def _teardown(self) -> None:
        try:
            super()._teardown()  # every daemon and client killed with the namespaces
        finally:
            # Nothing is mounted in this namespace: the mounts were in the dead ones'.
            shutil.rmtree(self.ceph_dir, ignore_errors=True)


def _sweep_ceph_dirs() -> None:
    """The Ceph folders of clusters whose process died before its teardown."""
    for path in Path("/tmp").glob(f"{CEPH_PREFIX}*-*"):
        m = re.fullmatch(rf"{CEPH_PREFIX}(\d+)-\d+", path.name)
        if m and not Path(f"/proc/{m[1]}").exists():
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def cluster(
    parent: Path | None = None, hosts: Sequence[str] = ("A", "B", "V")
) -> Iterator[CephNetCluster]:
    """A started cluster (module docstring), every host's client mounted, torn down afterwards
    whatever happens. Raises :class:`~tests.kit.gluster.GlusterUnavailable` (the partition
    tests' "cannot be made here") where this machine cannot make one."""
    why = unavailable()
    if why is not None:
        raise gl.GlusterUnavailable(why)
    nc._sweep_orphans()
    _sweep_ceph_dirs()
    work = Path(tempfile.mkdtemp(prefix="rs-cephnet-", dir=parent))
    c = CephNetCluster(work, hosts)
    nc._live.add(c.id)
    try:
        c._network()
        for role in ("srv", *hosts):
            c._hold(role)
        c._ceph_up()
        yield c
    finally:
        try:
            c._teardown()
        finally:
            nc._live.discard(c.id)
            if parent is None:
                shutil.rmtree(work, ignore_errors=True)
