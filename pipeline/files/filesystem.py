"""What kind of file system holds a store, where that changes how its files must be written.

Three properties matter. First, whether *reading* a hole of a sparse file through a shared
mapping needs a new block. On ext4, xfs, btrfs or a FUSE mount a read fault on a hole maps a
page of zeros; on tmpfs (and the other memory-backed file systems) it allocates a page, so on a
full tmpfs a reader that merely looks past the data of a sparse file dies of SIGBUS. On such a
file system every store file is created with all its blocks (:mod:`rocketstore.pipeline.files.mappedfile`), so it
has no hole for anyone to read, and a full disk is an error when the file is created.

Second, whether a block reserved with ``posix_fallocate`` can still need space when written. On
a copy-on-write file system it can: btrfs writes into a preallocated extent in place only the
first time and puts every later write of a block somewhere new, so a mapped write of a page
already written once can still fail on a full disk, and a mapped write that fails is a SIGBUS. On btrfs the store's directories get the ``NOCOW`` attribute
(``chattr +C``) at a writable open; files created in them afterwards inherit it and are written
in place, into their reserved blocks. It does not change files that already hold data (btrfs
only allows it on empty files), and a snapshot makes the next write of each block copy once
more, so on btrfs the guarantee holds for files the store creates and as long as no snapshot
of the volume is taken. ZFS has no such attribute: there the disk-use limit of retention and a
dataset reservation are the only defence (see docs/operations.md).

Third, whether one ``syncfs(2)`` of the file system a directory is on can stand for an fsync of
every file written under it (:func:`syncfs_replaces_fsyncs`): only where that file system's
sync reaches the disk and the kernel reports write-back errors from syncfs (Linux 5.8 on).

The type is read from ``/proc/self/mountinfo``: the mount with the longest mount point that
holds the path (symlinks resolved), as the process sees it (mount namespaces included). Where
that file is missing (not Linux), nothing is assumed about holes and syncfs is not used.

Thread-safety: stateless.
"""

from __future__ import annotations

import fcntl
import os
import re
import struct
from pathlib import Path

# Memory-backed file systems, whose read faults on holes allocate.
READS_ALLOCATE = frozenset({"tmpfs", "shmem", "ramfs", "hugetlbfs"})
MOUNTINFO = Path("/proc/self/mountinfo")
# File systems whose syncfs(2) writes every dirty page and name of the file system to disk (a
# journal commit and a cache flush), so that one call can stand for an fsync of every file
# written. A FUSE file system's is not sent to its server; network file systems' vary.
SYNCFS_DURABLE = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs"} | READS_ALLOCATE)
# The first Linux whose syncfs(2) returns the file system's write-back errors (each once to
# every open file, counted from its open); before it, syncfs returned 0 whatever was lost.
SYNCFS_REPORTS_ERRORS_SINCE = (5, 8)
# Copy-on-write file systems with a per-file switch to write in place.
NOCOW_CAPABLE = frozenset({"btrfs"})

# linux/fs.h: FS_IOC_GETFLAGS/SETFLAGS are _IOR/_IOW('f', 1/2, long); the kernel reads an int.
_LONG = struct.calcsize("l")
FS_IOC_GETFLAGS = (2 << 30) | (_LONG << 16) | (ord("f") << 8) | 1
FS_IOC_SETFLAGS = (1 << 30) | (_LONG << 16) | (ord("f") << 8) | 2
FS_NOCOW_FL = 0x00800000
# FS_IOC_GETVERSION is _IOR('v', 1, long): the inode's generation, which a file system that
# reuses inode numbers (ext4, btrfs, xfs) changes when it reuses one.
FS_IOC_GETVERSION = (2 << 30) | (_LONG << 16) | (ord("v") << 8) | 1


def file_identity(fd: int, st: os.stat_result | None = None) -> tuple[int, int, int]:
    """What tells an open file from another that later got the same name: ``st_dev``,
    ``st_ino`` and the inode's generation (0 where the file system does not say: FUSE file
    systems, whose inode numbers GlusterFS derives from a file's unique id). An inode number
    alone is not enough: ext4 gives a deleted file's number to the next file it creates."""
    if st is None:
        st = os.fstat(fd)
    try:
        (generation,) = struct.unpack("i", fcntl.ioctl(fd, FS_IOC_GETVERSION, bytes(4)))
    except OSError:
        generation = 0
    return st.st_dev, st.st_ino, generation & 0xFFFFFFFF


def same_file(recorded: tuple[int, int, int], now: tuple[int, int, int]) -> bool:
    """Whether ``now`` is the file ``recorded`` names (a generation of 0 on either side: not
    known, the inode number decides)."""
    if recorded[:2] != now[:2]:
        return False
    return not recorded[2] or not now[2] or recorded[2] == now[2]


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as octal escapes.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def fs_type(path: Path) -> str | None:
    """The file system type of the mount holding ``path`` (``ext4``, ``tmpfs``,
    ``fuse.glusterfs``, ...), or None where mountinfo cannot be read."""
    try:
        lines = MOUNTINFO.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best, best_len = None, -1
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5:
            continue
        mount_point = _unescape(fields[4])
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        # Later lines over-mount earlier ones at the same point, so >= keeps the last.
        if inside and len(mount_point) >= best_len:
            best, best_len = right.split()[0], len(mount_point)
    return best


def syncfs_durable(path: Path) -> bool:
    """Whether one ``syncfs`` of the file system under ``path`` makes every file on it
    durable (:data:`SYNCFS_DURABLE`; memory-backed file systems hold nothing to sync)."""
    return fs_type(path) in SYNCFS_DURABLE


def syncfs_reports_errors(release: str) -> bool:
    """Whether a kernel of ``release`` (``os.uname().release``: ``6.18.44-fc``) reports
    write-back errors from ``syncfs`` (:data:`SYNCFS_REPORTS_ERRORS_SINCE`). A release that
    does not start with ``MAJOR.MINOR`` is taken as one that does not."""
    version = re.match(r"(\d+)\.(\d+)", release)
    return version is not None and (int(version[1]), int(version[2])) >= SYNCFS_REPORTS_ERRORS_SINCE


def syncfs_replaces_fsyncs(directory: Path) -> bool:
    """Whether one ``syncfs`` of the file system ``directory`` is on (symlinks followed, so
    not necessarily its parent's) may stand for an fsync of every file written under it: that
    file system's sync reaches the disk (:func:`syncfs_durable`) and this kernel reports a
    write-back error from ``syncfs`` (:func:`syncfs_reports_errors`), without which a sync
    that lost data would look like one that did not."""
    return syncfs_reports_errors(os.uname().release) and syncfs_durable(directory)


def reads_allocate(path: Path) -> bool:
    """Whether reading a hole through a mapping of a file under ``path`` allocates a block."""
    return fs_type(path) in READS_ALLOCATE


def nocow(path: Path) -> bool:
    """Whether ``path`` (a file or directory) has the ``NOCOW`` attribute."""
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = fcntl.ioctl(fd, FS_IOC_GETFLAGS, bytes(4))
    finally:
        os.close(fd)
    return bool(struct.unpack("i", buf)[0] & FS_NOCOW_FL)


def set_nocow(directory: Path) -> None:
    """Give ``directory`` the ``NOCOW`` attribute, so that files and directories created in it
    from now on are written in place. Raises OSError where the file system refuses."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (flags,) = struct.unpack("i", fcntl.ioctl(fd, FS_IOC_GETFLAGS, bytes(4)))
        if not flags & FS_NOCOW_FL:
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("i", flags | FS_NOCOW_FL))
    finally:
        os.close(fd)
