"""A FUSE file system that passes everything through to a backing directory and fails chosen
writes and syncs with a real ``EIO``, for tests of what the store does when the disk fails.

The server is this file run as a process (mfusepy, on libfuse 3)::

    python tests/procs/faultfuse.py BACKING MOUNT

It mounts ``MOUNT`` showing the files of ``BACKING``. Every operation is forwarded to the
backing file; a file system ``write``, ``fsync``, ``flush`` or ``fsyncdir`` (an ``fsync`` of a
directory) that a rule matches fails with
``EIO`` instead. A rule names the operation, a glob over the path inside the mount
(``fnmatch``: ``*`` also matches ``/``) and, for writes, a byte range of the file; the first
``after`` calls it matches pass, the next ``times`` fail (every later one when ``times`` is
None). A write that starts before a failing range writes the bytes in front of it, then fails:
a disk whose sectors before the bad ones took the data.

What reaches the handlers is what the kernel sends: ``write(2)`` of a file opened without
``O_DIRECT`` is one ``write`` each (the mount caches no writes), a dirty page of a shared
mapping is written back by a ``write`` when the kernel chooses or ``msync``/``fsync`` asks,
and ``msync(MS_SYNC)`` and ``fsync`` are those writes followed by one ``fsync``. ``flush`` is
each ``close`` of a descriptor. An ``O_DIRECT`` read or write of any length reaches the
handlers, as on a network file system (the backing file is opened without ``O_DIRECT``). The
mount keeps the page cache across opens (``kernel_cache``), as a local disk does; a page whose
write-back failed is dropped from it (seen on Linux 6.18's FUSE), so a reread through the
mount shows what reached the backing file. Tests read what reached the disk from ``BACKING``
after unmounting, where nothing else can answer.

Control: one JSON object a line on the server's standard input, one JSON reply a line on its
standard output, so a command has taken effect when its reply has been read (no sleeping).
The first line the server writes is ``{"ready": true}``, once the kernel has finished mounting.
Closing its standard input makes the server unmount and exit. Commands:

* ``{"cmd": "fail", "op": "write", "pattern": "*commitlog/*", "start": 0, "end": null,
  "after": 0, "times": null}``: add a rule;
* ``{"cmd": "clear"}``: drop every rule;
* ``{"cmd": "injected"}``: the failures injected so far, oldest first, each
  ``{"op", "path", "offset", "size"}`` (offset and size of the write; 0 for syncs);
* ``{"cmd": "stale", "pattern": "store/config/rocketstore-epochs"}``: from now on the mount
  shows the files that match (regular files of ``BACKING``, now) as a network file system's
  client whose cache went stale shows them: every ``getattr`` answers their attributes as they
  are now, and every ``read`` of a descriptor opened without ``O_DIRECT`` their bytes as they
  are now, whatever later reaches the backing file. A read through an ``O_DIRECT`` descriptor
  reaches the backing file, past the frozen size too, as a client's direct reads reach its
  servers (not modelled: a client that answers them from a cache of its own, as GlusterFS's
  ``performance.quick-read``, on by default, does for small files). So does every write,
  ``truncate`` and ``fsync`` (the frozen view does not show them, not even to this mount).
  The reply names the files frozen (``"paths"``); a file frozen again is frozen as it is
  then;
* ``{"cmd": "fresh"}``: the cache catches up: every file frozen shows what is in ``BACKING``;
* ``{"cmd": "hold", "pattern": "store/commitlog/*"}``: from now on a ``read`` of a file that
  matches is not answered (its handler waits), as a client that never answers a read; ``{"cmd":
  "held"}`` says how many reads wait now (``"reads"``), ``{"cmd": "release"}`` answers them
  and ends the hold. What aborting the mount's FUSE connection frees is tested with it.

What makes the stale view the only one: each ``open`` of a frozen file (after ``stale``)
gets ``direct_io``, so the kernel neither serves its reads from the page cache that
``kernel_cache`` keeps nor cuts a direct read short at the size it cached, and both commands
make the kernel drop what it cached of each file (``fuse_invalidate_path``: attributes and
pages) before they reply: a read through a descriptor opened earlier, or a ``stat``, asks the
server again. A frozen file cannot be mapped shared (``ENODEV``: libfuse 3 does not ask for
``FUSE_DIRECT_IO_ALLOW_MMAP``).

The test side is :class:`tests.kit.faultfuse.FaultFS` (:func:`tests.kit.faultfuse.mounted`
makes one and always takes it down: the mount, lazily if something still holds it, and the
server, killed if it does not exit). :func:`tests.kit.faultfuse.unavailable` says why this
machine cannot mount one, or None.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import errno
import faulthandler
import fnmatch
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

OPS = ("write", "fsync", "flush", "fsyncdir")
STAT_KEYS = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks")


@dataclasses.dataclass
class Rule:
    """Fail ``op`` on files whose path matches ``pattern`` (see the module doc)."""

    op: str
    pattern: str
    start: int = 0
    end: int | None = None
    after: int = 0
    times: int | None = None
    seen: int = 0
    fired: int = 0

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"op must be one of {', '.join(OPS)}, got {self.op!r}")

    def matches(self, op: str, path: str, offset: int, size: int) -> bool:
        if op != self.op or not fnmatch.fnmatchcase(path, self.pattern):
            return False
        if op != "write":
            return True
        return offset + size > self.start and (self.end is None or offset < self.end)


@dataclasses.dataclass(frozen=True)
class Frozen:
    """A file as the stale view shows it: its attributes and bytes when ``stale`` was given."""

    attrs: dict[str, Any]
    data: bytes


def attrs_of(st: os.stat_result) -> dict[str, Any]:
    """What ``getattr`` answers for ``st`` (times in nanoseconds: the server has ``use_ns``)."""
    out: dict[str, Any] = {k: getattr(st, k) for k in STAT_KEYS}
    out.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
    return out


def freeze(backing: Path, pattern: str) -> dict[str, Frozen]:
    """The regular files of ``backing`` whose path inside it matches ``pattern``, as they are."""
    frozen: dict[str, Frozen] = {}
    for top, _dirs, names in os.walk(backing):
        for name in names:
            full = os.path.join(top, name)
            inside = os.path.relpath(full, backing)
            if not fnmatch.fnmatchcase(inside, pattern):
                continue
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    continue
                data = b""
                while chunk := os.pread(fd, 1 << 20, len(data)):
                    data += chunk
            finally:
                os.close(fd)
            attrs = attrs_of(st)
            attrs["st_size"] = len(data)
            frozen[inside] = Frozen(attrs, data)
    return frozen


class _Context(ctypes.Structure):
    """The head of libfuse's ``struct fuse_context``: the ``struct fuse *`` serving the call."""

    _fields_ = [("fuse", ctypes.c_void_p)]


def _libfuse() -> ctypes.CDLL:
    """libfuse 3 (the library mfusepy runs on), with the two calls invalidation needs."""
    lib = ctypes.CDLL(ctypes.util.find_library("fuse3"))
    lib.fuse_get_context.restype = ctypes.POINTER(_Context)
    lib.fuse_invalidate_path.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.fuse_invalidate_path.restype = ctypes.c_int
    return lib


def _serve(backing: Path, mount: Path) -> int:
    # mfusepy takes libfuse 2 when both are installed (ceph-fuse and ceph-osd bring it); the
    # stale view needs libfuse 3's config and invalidation, and a struct fuse from one library
    # handed to the other crashes the server.
    os.environ["FUSE_LIBRARY_NAME"] = "fuse3"
    import mfusepy

    if mfusepy.fuse_version_major != 3:
        sys.stderr.write(f"faultfuse needs libfuse 3; mfusepy loaded {mfusepy._libfuse_path}\n")
        return 2

    libfuse = _libfuse()

    class FaultOps(mfusepy.Operations):  # type: ignore[misc]
        """Passthrough to ``backing`` by descriptor, with :class:`Rule` failures and the stale
        view of :class:`Frozen` files. Runs with ``raw_fi``: the handlers of open files get
        libfuse's ``fuse_file_info`` (``fi.fh`` is the backing descriptor), so that ``open``
        can ask for ``direct_io``."""

        use_ns = True

        def __init__(self) -> None:
            self._rules: list[Rule] = []
            self._events: list[dict[str, Any]] = []
            self._frozen: dict[str, Frozen] = {}
            self._direct: set[int] = set()  # backing descriptors of O_DIRECT opens
            self._mutex = threading.Lock()
            self._fuse: int | None = None  # libfuse's struct fuse, for invalidations
            self._hold: str | None = None  # reads of files matching it wait (``hold``)
            self._released = threading.Event()
            self._held = 0

        # Failure rules.
        def _check(self, op: str, path: str | None, offset: int = 0, size: int = 0) -> Rule | None:
            name = _name(path)
            with self._mutex:
                for rule in self._rules:
                    if not rule.matches(op, name, offset, size):
                        continue
                    rule.seen += 1
                    if rule.seen <= rule.after:
                        continue
                    if rule.times is not None and rule.fired >= rule.times:
                        continue
                    rule.fired += 1
                    self._events.append({"op": op, "path": name, "offset": offset, "size": size})
                    return rule
            return None

        def command(self, request: dict[str, Any]) -> dict[str, Any]:
            cmd = request.pop("cmd", None)
            if cmd in ("stale", "fresh"):
                return self._stale(request.get("pattern")) if cmd == "stale" else self._fresh()
            with self._mutex:
                if cmd == "hold" and isinstance(request.get("pattern"), str):
                    self._hold, self._released = request["pattern"], threading.Event()
                    return {"ok": True}
                if cmd == "held":
                    return {"ok": True, "reads": self._held}
                if cmd == "release":
                    self._hold = None
                    self._released.set()
                    return {"ok": True}
                if cmd == "fail":
                    self._rules.append(Rule(**request))
                    return {"ok": True}
                if cmd == "clear":
                    self._rules.clear()
                    return {"ok": True}
                if cmd == "injected":
                    return {"ok": True, "events": list(self._events)}
            return {"ok": False, "error": f"unknown command {cmd!r}"}

        # The stale view.
        def _stale(self, pattern: Any) -> dict[str, Any]:
            if not isinstance(pattern, str):
                return {"ok": False, "error": f"stale needs a pattern, got {pattern!r}"}
            frozen = freeze(backing, pattern)
            with self._mutex:
                self._frozen.update(frozen)
            return self._invalidate(sorted(frozen), {"ok": True, "paths": sorted(frozen)})

        def _fresh(self) -> dict[str, Any]:
            with self._mutex:
                names = sorted(self._frozen)
                self._frozen.clear()
            return self._invalidate(names, {"ok": True})

        def _invalidate(self, names: list[str], answer: dict[str, Any]) -> dict[str, Any]:
            """Make the kernel drop what it cached of ``names`` (attributes and pages): what it
            shows of them next, it asks for. Outside the mutex: dropping pages may wait for a
            request in flight, whose handler may want the mutex."""
            for name in names:
                done = libfuse.fuse_invalidate_path(self._fuse, ("/" + name).encode())
                # ENOENT: the kernel knows nothing of the file, so it has nothing cached.
                if done not in (0, -errno.ENOENT):
                    return {"ok": False, "error": f"invalidating {name}: {os.strerror(-done)}"}
            return answer

        def _view(self, path: str | None, fh: int | None) -> Frozen | None:
            """The frozen file ``path`` is, when reads through ``fh`` (None: any) show it."""
            with self._mutex:
                if fh is not None and fh in self._direct:
                    return None
                return self._frozen.get(_name(path))

        # Passthrough.
        def _real(self, path: str) -> str:
            return str(backing) + path

        def init_with_config(self, conn: Any, config: Any) -> None:
            if config is not None:
                # No page cache drop on each open, as on a local disk (see the module doc).
                config.kernel_cache = 1
            self._fuse = libfuse.fuse_get_context().contents.fuse
            _reply({"ready": True})

        def getattr(self, path: str | None, fi: Any = None) -> dict[str, Any]:
            frozen = self._view(path, None)
            if frozen is not None:
                return dict(frozen.attrs)
            st = os.fstat(fi.fh) if fi is not None else os.lstat(self._real(path or "/"))
            return attrs_of(st)

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *os.listdir(self._real(path))]

        def statfs(self, path: str) -> dict[str, int]:
            st = os.statvfs(self._real(path))
            keys = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files")
            return {k: getattr(st, k) for k in (*keys, "f_ffree", "f_favail", "f_namemax")}

        def access(self, path: str, amode: int) -> int:
            if not os.access(self._real(path), amode):
                raise mfusepy.FuseOSError(errno.EACCES)
            return 0

        def mkdir(self, path: str, mode: int) -> int:
            os.mkdir(self._real(path), mode)
            return 0

        def rmdir(self, path: str) -> int:
            os.rmdir(self._real(path))
            return 0

        def unlink(self, path: str) -> int:
            os.unlink(self._real(path))
            return 0

        def rename(self, old: str, new: str) -> int:
            os.rename(self._real(old), self._real(new))
            return 0

        def chmod(self, path: str, mode: int) -> int:
            os.chmod(self._real(path), mode)
            return 0

        def chown(self, path: str, uid: int, gid: int) -> int:
            os.chown(self._real(path), uid, gid)
            return 0

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            if times is None:
                os.utime(self._real(path))
            else:
                os.utime(self._real(path), ns=times)
            return 0

        def truncate(self, path: str | None, length: int, fi: Any = None) -> int:
            if fi is not None:
                os.ftruncate(fi.fh, length)
            else:
                os.truncate(self._real(path or "/"), length)
            return 0

        def _opened(self, path: str, fi: Any, fd: int) -> int:
            """Hand ``fd`` to the kernel; a frozen file's open gets ``direct_io``."""
            fi.fh = fd
            with self._mutex:
                if fi.flags & os.O_DIRECT:
                    self._direct.add(fd)
                else:
                    self._direct.discard(fd)
                if _name(path) in self._frozen:
                    fi.direct_io = 1
            return 0

        # The backing file is opened without O_DIRECT, which the local disk under it takes
        # only for aligned buffers and lengths (the reads here are neither): the kernel has
        # already sent the O_DIRECT read past its cache, and a network file system's client
        # serves direct reads of any length from its servers.
        def open(self, path: str, fi: Any) -> int:
            flags = fi.flags & ~(os.O_CREAT | os.O_DIRECT)
            return self._opened(path, fi, os.open(self._real(path), flags))

        def create(self, path: str, mode: int, fi: Any) -> int:
            flags = (fi.flags | os.O_CREAT) & ~os.O_DIRECT
            return self._opened(path, fi, os.open(self._real(path), flags, mode))

        def read(self, path: str | None, size: int, offset: int, fi: Any) -> bytes:
            with self._mutex:
                hold = self._hold is not None and fnmatch.fnmatchcase(_name(path), self._hold)
                released = self._released
                self._held += hold
            if hold:
                released.wait()
                with self._mutex:
                    self._held -= 1
            frozen = self._view(path, fi.fh)
            if frozen is not None:
                return frozen.data[offset : offset + size]
            return os.pread(fi.fh, size, offset)

        def write(self, path: str | None, data: bytes, offset: int, fi: Any) -> int:
            rule = self._check("write", path, offset, len(data))
            if rule is not None:
                front = max(0, min(len(data), rule.start - offset))
                if front:
                    os.pwrite(fi.fh, data[:front], offset)
                raise mfusepy.FuseOSError(errno.EIO)
            return os.pwrite(fi.fh, data, offset)

        def fallocate(self, path: str | None, mode: int, offset: int, size: int, fi: Any) -> int:
            if mode != 0:
                raise mfusepy.FuseOSError(errno.EOPNOTSUPP)
            os.posix_fallocate(fi.fh, offset, size)
            return 0

        def fsync(self, path: str | None, datasync: int, fi: Any) -> int:
            if self._check("fsync", path) is not None:
                raise mfusepy.FuseOSError(errno.EIO)
            (os.fdatasync if datasync else os.fsync)(fi.fh)
            return 0

        def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
            if self._check("fsyncdir", path) is not None:
                raise mfusepy.FuseOSError(errno.EIO)
            fd = os.open(self._real(path or "/"), os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            return 0

        def flush(self, path: str | None, fi: Any) -> int:
            if self._check("flush", path) is not None:
                raise mfusepy.FuseOSError(errno.EIO)
            return 0

        def release(self, path: str | None, fi: Any) -> int:
            with self._mutex:
                self._direct.discard(fi.fh)
            os.close(fi.fh)
            return 0

    ops = FaultOps()

    def control() -> None:
        for line in sys.stdin:
            try:
                answer = ops.command(json.loads(line))
            except (ValueError, TypeError, OSError) as exc:
                answer = {"ok": False, "error": str(exc)}
            _reply(answer)
        # The test is gone (or done): no mount may outlive it.
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)

    threading.Thread(target=control, name="faultfuse-control", daemon=True).start()
    mfusepy.FUSE(ops, str(mount), foreground=True, fsname="faultfuse", raw_fi=True)
    return 0


def _name(path: str | None) -> str:
    """The path inside the mount that rules and frozen files name. libfuse names the file of
    every call (no nullpath_ok); an open file unlinked meanwhile is renamed to .fuse_hidden*
    beside its old name."""
    return (path or "").lstrip("/")


_out_lock = threading.Lock()


def _reply(obj: dict[str, Any]) -> None:
    with _out_lock:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    # A crash in libfuse or in a ctypes call leaves no Python traceback: this prints the stacks
    # of every thread to the server's log (its standard error) when one happens.
    faulthandler.enable(all_threads=True)
    sys.exit(_serve(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()))
