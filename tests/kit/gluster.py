"""A replicated GlusterFS volume on this machine, mounted twice: two "hosts" for tests.

GlusterFS from the Debian packages (``glusterfs-server``, ``glusterfs-client``), on loopback
only: one ``glusterd``, a replica-3 volume whose three bricks are directories on 127.0.0.2
(``force``: all on one host), and two FUSE mounts of it. Each mount has its own client cache,
which is what two hosts have; :meth:`Volume.in_namespace` gives a process a mount namespace of
its own with the volume mounted at a path of the caller's choosing (a Spark worker as a host).

:func:`volume` makes one with a unique name and always takes it down again: both mounts
(lazily if something still holds them), the volume (stopped with ``force``, deleted), its
bricks, and ``glusterd`` if it was started here (by its PID). :func:`unavailable` says why
this machine cannot, or None. Facts measured here: creating a volume takes 0.1 s, starting it
1.5 s, mounting 0.1 s; ``performance.stat-prefetch off`` stops a client from ever seeing
another client's writes to a file it has cached, so the volumes keep the default options.

Not thread-safe; one process manages a volume.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

HOST = "127.0.0.2"  # loopback only, ever
TOOLS = ("glusterd", "gluster", "glusterfs", "mount.glusterfs")
STATE_DIR = Path("/var/lib/glusterd")
TIMEOUT_S = 60.0


class GlusterUnavailable(Exception):
    """This machine cannot run a GlusterFS volume for tests (the reason is the message)."""


def unavailable() -> str | None:
    """Why a volume cannot be made here, or None when it can."""
    if os.geteuid() != 0:
        return "GlusterFS volumes need root (glusterd, FUSE mounts)"
    if not Path("/dev/fuse").exists():
        return "no /dev/fuse: the kernel cannot mount FUSE file systems here"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return (
            f"GlusterFS is not installed (no {', '.join(missing)}); "
            "apt-get install glusterfs-server glusterfs-client (.ci/run does)"
        )
    return None


def gluster(
    *args: str, check: bool = True, enter: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """``gluster --mode=script ARGS``, run under the command prefix ``enter`` when one is given
    (an ``nsenter`` into the namespaces of another glusterd: tests/kit/netcluster.py)."""
    done = subprocess.run(
        [*enter, "gluster", "--mode=script", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"gluster {' '.join(args)}: {done.stdout}{done.stderr}".strip())
    return done


def _poll(what: str, ready: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> None:
    """Poll ``ready`` until it holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(0.1)  # polling interval: the loop checks the condition itself


def _glusterd_answers() -> bool:
    return gluster("pool", "list", check=False).returncode == 0


@contextlib.contextmanager
def _glusterd(work: Path) -> Iterator[None]:
    """A running glusterd: the one already running, or one started here and stopped after."""
    if _glusterd_answers():
        yield
        return
    pid_file = work / "glusterd.pid"
    subprocess.run(
        ["glusterd", f"--pid-file={pid_file}", f"--log-file={work / 'glusterd.log'}"],
        check=True,
        timeout=TIMEOUT_S,
    )
    try:
        _poll("glusterd to answer", _glusterd_answers)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            pid = int(pid_file.read_text().strip())
            os.kill(pid, signal.SIGTERM)
            # Gone before the next volume asks: a glusterd still answering as it shuts down
            # would be taken for a running one and then vanish under that volume.
            _poll("glusterd to exit", lambda: not Path(f"/proc/{pid}").exists())


@contextlib.contextmanager
def daemon(work: Path) -> Iterator[None]:
    """A running glusterd for a whole test session (started here if none runs, stopped after),
    so that each volume does not start and stop its own."""
    with _glusterd(work):
        yield


def mount(name: str, point: Path) -> None:
    point.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "glusterfs", f"{HOST}:/{name}", str(point)],
        check=True,
        capture_output=True,
        timeout=TIMEOUT_S,
    )


def _pgrep(pattern: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False)
    return [int(x) for x in out.stdout.split()]


def client_pids(name: str) -> list[int]:
    """PIDs of the FUSE client processes of volume ``name`` (every mount, any namespace)."""
    return _pgrep(f"glusterfs .*--volfile-id=/{name} ")


def stop_clients(name: str) -> None:
    """Stop the FUSE clients of volume ``name`` that outlived their mounts. A mount made in a
    namespace of its own (:meth:`Volume.in_namespace`) is unmounted by the shell that made it;
    a test that kills that shell (killing a host) leaves the client, which keeps its namespace
    alive, and so its own mount: nothing else would ever stop it."""
    for pid in client_pids(name):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _poll(f"the clients of {name} to exit", lambda: not client_pids(name))


def unmount(point: Path) -> None:
    if subprocess.run(["umount", str(point)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


@dataclasses.dataclass(frozen=True)
class Brick:
    """A running brick: its directory, its server process and the TCP port it listens on (0
    where the status names none)."""

    path: Path
    pid: int
    port: int


def running_bricks(status_xml: str) -> list[Brick]:
    """The running bricks in the output of ``gluster volume status VOL --xml`` (a brick that is
    down has no PID there and is left out; so are the self-heal daemon's entries)."""
    found = []
    for node in ET.fromstring(status_xml).iter("node"):
        path, pid, port = node.findtext("path"), node.findtext("pid"), node.findtext("port")
        if path and path.startswith("/") and pid and pid.isdigit() and int(pid) > 0:
            found.append(Brick(Path(path), int(pid), int(port) if port and port.isdigit() else 0))
    return found


def count_pending(heal_info: str, bricks: int) -> int:
    """Entries ``gluster volume heal VOL info`` says are still to heal, over all ``bricks``
    (-1 while a brick does not answer)."""
    counts = re.findall(r"Number of entries: (\S+)", heal_info)
    if len(counts) != bricks or not all(c.isdigit() for c in counts):
        return -1
    return sum(int(c) for c in counts)


class Volume:
    """A started replica-3 volume and its two mounts, ``a`` and ``b``."""

    def __init__(self, name: str, work: Path) -> None:
        self.name = name
        self.work = work
        self.bricks = [work / f"brick{i}" for i in range(3)]
        self.a = work / "a"
        self.b = work / "b"

    def brick_pids(self) -> dict[Path, int]:
        """PID of each running brick process, by brick directory."""
        xml = gluster("volume", "status", self.name, "--xml").stdout
        return {brick.path: brick.pid for brick in running_bricks(xml)}

    def kill_brick(self, index: int) -> int:
        """kill -9 one brick's server process (a lost disk or host); returns its PID."""
        pid = self.brick_pids()[self.bricks[index]]
        os.kill(pid, signal.SIGKILL)
        return pid

    def restart_bricks(self) -> None:
        """Start the bricks that are down (``volume start VOL force``)."""
        # glusterd may not have seen a brick die yet, and then "start force" leaves it down:
        # ask again until every brick runs.
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            gluster("volume", "start", self.name, "force")
            try:
                _poll(
                    f"every brick of {self.name} to run",
                    lambda: set(self.brick_pids()) == set(self.bricks),
                    timeout_s=min(5.0, max(0.1, deadline - time.monotonic())),
                )
                return
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise

    def pending_heals(self) -> int:
        """Entries the self-heal still has to copy, over all bricks (-1 while unknown)."""
        out = gluster("volume", "heal", self.name, "info", check=False).stdout
        return count_pending(out, len(self.bricks))

    def wait_for_heal(self, timeout_s: float = 120.0) -> None:
        gluster("volume", "heal", self.name, check=False)  # start it now, not at the next crawl
        _poll(f"the heal of {self.name}", lambda: self.pending_heals() == 0, timeout_s)

    def client_pid(self, point: Path) -> int:
        """PID of the FUSE client process serving the mount at ``point``."""
        pids = _pgrep(f"glusterfs.*--volfile-id=/{self.name} {point}$")
        if len(pids) != 1:
            raise RuntimeError(f"{len(pids)} client processes for {point}")
        return pids[0]

    def lose_host(self, point: Path) -> None:
        """The host of ``point`` is gone: its client killed -9 (the bricks see its connections
        close and release its locks)."""
        os.kill(self.client_pid(point), signal.SIGKILL)

    def in_namespace(
        self, cmd: Sequence[str], at: Path, **popen: object
    ) -> subprocess.Popen[bytes]:
        """Run ``cmd`` in a mount namespace of its own, where the volume is mounted at ``at``
        (a host of its own: its own client and cache; the caller's namespace does not see that
        mount). The mount goes when ``cmd`` ends. Other mounts are shared as they were."""
        script = (
            'set -e; mount -t glusterfs "$1:/$2" "$3"; shift 3; '
            'trap \'umount -l "$AT" 2>/dev/null || true\' EXIT; "$@"'
        )
        env = {**os.environ, "AT": str(at)}
        extra_env = popen.pop("env", None)
        if isinstance(extra_env, dict):
            env.update(extra_env)
        at.mkdir(parents=True, exist_ok=True)
        return subprocess.Popen(  # type: ignore[call-overload,no-any-return]
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
             HOST, self.name, str(at), *cmd],
            env=env,
            **popen,
        )  # fmt: skip


@contextlib.contextmanager
def volume(parent: Path | None = None) -> Iterator[Volume]:
    """A fresh volume mounted at ``.a`` and ``.b``, torn down afterwards whatever happens.
    Raises :class:`GlusterUnavailable` where this machine cannot make one."""
    why = unavailable()
    if why is not None:
        raise GlusterUnavailable(why)
    work = Path(tempfile.mkdtemp(prefix="rs-gluster-", dir=parent))
    vol = Volume(f"rs{uuid.uuid4().hex[:10]}", work)
    try:
        with _glusterd(work):
            for brick in vol.bricks:
                brick.mkdir()
            try:
                # Inside the try: a create that fails after glusterd recorded the volume
                # (glusterd lost mid-call) must not leave the volume behind.
                gluster("volume", "create", vol.name, "replica", "3",
                        *(f"{HOST}:{b}" for b in vol.bricks), "force")  # fmt: skip
                gluster("volume", "start", vol.name)
                try:
                    mount(vol.name, vol.a)
                    try:
                        mount(vol.name, vol.b)
                        try:
                            yield vol
                        finally:
                            unmount(vol.b)
                    finally:
                        unmount(vol.a)
                        stop_clients(vol.name)
                finally:
                    gluster("volume", "stop", vol.name, "force", check=False)
            finally:
                gluster("volume", "delete", vol.name, check=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
