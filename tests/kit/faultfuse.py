"""The test side of the fault file system: a FUSE file system that passes everything through
to a backing directory, fails chosen writes and syncs with a real ``EIO``, and shows chosen
files as a client with a stale cache would (:meth:`FaultFS.stale`). Its server runs
as a process of its own (tests/procs/faultfuse.py, whose docstring says what it fails and how
it is controlled); :class:`FaultFS` starts and drives it, :func:`mounted` makes one and always
takes it down, and :func:`unavailable` says why this machine cannot mount one, or None.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from tests.kit import PROCS

SERVER = PROCS / "faultfuse.py"
TIMEOUT_S = 60.0


def unavailable() -> str | None:
    """Why a fault file system cannot be mounted here, or None when it can."""
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"/dev/fuse cannot be opened ({exc.strerror}): no FUSE mounts here"
    if os.geteuid() != 0:
        return "mounting the fault file system needs root (it mounts and unmounts directly)"
    if ctypes.util.find_library("fuse3") is None:
        return "no libfuse 3 (Debian package fuse3 brings it; .ci/run installs it)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"the FUSE binding mfusepy cannot be loaded ({exc}); pip install -e '.[dev]'"
    return None


class FaultFS:
    """A running fault file system: ``backing`` shown at ``mount``."""

    def __init__(self, backing: Path, mount: Path, log: Path) -> None:
        self.backing, self.mount, self.log = backing, mount, log
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""

    def start(self) -> None:
        """Mount; returns once the kernel has the mount (the server's ready line)."""
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mount.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as err:
            self._proc = subprocess.Popen(
                [sys.executable, str(SERVER), str(self.backing), str(self.mount)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        ready = self._read()
        if not ready.get("ready"):
            raise RuntimeError(f"faultfuse did not start: {ready}")

    def fail(
        self,
        op: str,
        pattern: str,
        *,
        start: int = 0,
        end: int | None = None,
        after: int = 0,
        times: int | None = None,
    ) -> None:
        """Add a rule (see tests/procs/faultfuse.py); in force when this returns."""
        self._call(
            cmd="fail", op=op, pattern=pattern, start=start, end=end, after=after, times=times
        )

    def clear(self) -> None:
        """Drop every rule; the file system passes everything through from now on."""
        self._call(cmd="clear")

    def stale(self, pattern: str) -> list[str]:
        """Freeze what this mount shows of the files matching ``pattern`` (their paths in it,
        returned) as they are now: a client whose cache went stale. ``getattr`` and reads
        through descriptors opened without ``O_DIRECT`` show them so until :meth:`fresh`,
        whatever reaches the backing files; direct reads, writes and syncs reach them (see
        tests/procs/faultfuse.py). In force when this returns, whatever the kernel cached."""
        paths: list[str] = self._call(cmd="stale", pattern=pattern)["paths"]
        return paths

    def fresh(self) -> None:
        """The cache catches up: every file :meth:`stale` froze shows the backing file again."""
        self._call(cmd="fresh")

    def hold(self, pattern: str) -> None:
        """From now on reads of the files matching ``pattern`` are not answered (a server that
        never replies) until :meth:`release`."""
        self._call(cmd="hold", pattern=pattern)

    def held(self) -> int:
        """How many reads wait on a hold now."""
        reads: int = self._call(cmd="held")["reads"]
        return reads

    def release(self) -> None:
        self._call(cmd="release")

    def injected(self) -> list[dict[str, Any]]:
        """Every failure injected so far, oldest first."""
        events: list[dict[str, Any]] = self._call(cmd="injected")["events"]
        return events

    def stop(self) -> None:
        """Unmount (lazily when something still holds the mount) and end the server."""
        proc = self._proc
        if proc is None:
            return
        self._proc = None
        if os.path.ismount(self.mount):
            done = subprocess.run(["umount", str(self.mount)], capture_output=True, check=False)
            if done.returncode != 0:
                subprocess.run(["umount", "-l", str(self.mount)], capture_output=True, check=False)
        assert proc.stdin is not None and proc.stdout is not None
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            # A lazy unmount keeps the connection until the last user lets go; killing the
            # server aborts it, and every later access fails instead of hanging.
            proc.kill()
            proc.wait()
        proc.stdout.close()

    def _call(self, **request: Any) -> dict[str, Any]:
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise RuntimeError("faultfuse is not running")
        proc.stdin.write(json.dumps(request).encode() + b"\n")
        proc.stdin.flush()
        answer = self._read()
        if not answer.get("ok"):
            raise RuntimeError(f"faultfuse refused {request}: {answer.get('error')}")
        return answer

    def _read(self) -> dict[str, Any]:
        """The server's next line; fails when it exits or says nothing for TIMEOUT_S."""
        assert self._proc is not None and self._proc.stdout is not None
        out: IO[bytes] = self._proc.stdout
        deadline = time.monotonic() + TIMEOUT_S
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                raise TimeoutError(f"faultfuse said nothing for {TIMEOUT_S} s; see {self.log}")
            chunk = os.read(out.fileno(), 65536)
            if not chunk:
                raise RuntimeError(f"faultfuse exited: {self.log.read_text()[-4000:]}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        answer: dict[str, Any] = json.loads(line)
        return answer


@contextlib.contextmanager
def mounted(work: Path) -> Iterator[FaultFS]:
    """A fault file system on ``work/mnt`` over ``work/backing`` (server log in
    ``work/faultfuse.log``), always taken down again. A test that needs the mount to show an
    old copy of a file, as another host's client with a stale cache would, freezes it with
    :meth:`FaultFS.stale`: what the kernel caches, and for how long, is not for a test to
    count on."""
    fs = FaultFS(work / "backing", work / "mnt", work / "faultfuse.log")
    try:
        fs.start()
        yield fs
    finally:
        fs.stop()
