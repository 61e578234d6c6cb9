"""What kind of file system holds a store, where that changes how its files must be written.

Only one property matters today: whether *reading* a hole of a sparse file through a shared
mapping needs a new block. On ext4, xfs, btrfs or a FUSE mount a read fault on a hole maps a
page of zeros; on tmpfs (and the other memory-backed file systems) it allocates a page, so on a
full tmpfs a reader that merely looks past the data of a sparse file dies of SIGBUS. On such a
file system every store file is created with all its blocks (:mod:`pipeline.mapped_file`), so it
has no hole for anyone to read, and a full disk is an error when the file is created.

The type is read from ``/proc/self/mountinfo``: the mount with the longest mount point that
holds the path, as the process sees it (mount namespaces included). Where that file is missing
(not Linux), nothing is assumed about holes.

Thread-safety: stateless.
"""

from __future__ import annotations

import os
from pathlib import Path

# Memory-backed file systems, whose read faults on holes allocate.
READS_ALLOCATE = frozenset({"tmpfs", "shmem", "ramfs", "hugetlbfs"})
MOUNTINFO = Path("/proc/self/mountinfo")


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


def reads_allocate(path: Path) -> bool:
    """Whether reading a hole through a mapping of a file under ``path`` allocates a block."""
    return fs_type(path) in READS_ALLOCATE
