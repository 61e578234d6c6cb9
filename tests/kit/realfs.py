"""Real file systems for tests of real faults: a small tmpfs, loop-mounted ext4 and btrfs images,
and an ext4 in an image file of the test's choosing (on a fault FUSE mount, say).

Each is a context manager that mounts a fresh file system of the given size, yields its mount
point and always unmounts it (lazily when something still holds it) and removes what it made.
They need root; :func:`require_root_mounts` skips a test with the reason where mounting is not
possible (not root, no loop device, no mkfs). :func:`extents` says where on its device a file's
blocks are, for a test that fails writes of those blocks only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def require_root_mounts(kind: str = "tmpfs") -> None:
    """Skip the calling test unless this process can mount a ``kind`` file system here."""
    if os.geteuid() != 0:
        pytest.skip(f"mounting a {kind} needs root")
    package = {"ext4": "e2fsprogs", "btrfs": "btrfs-progs"}.get(kind)
    if package is not None:
        if shutil.which(f"mkfs.{kind}") is None:
            pytest.skip(f"no mkfs.{kind} (Debian package {package}) for a loop-mounted image")
        if not Path("/dev/loop-control").exists():
            pytest.skip(f"no loop devices (/dev/loop-control) for a loop-mounted {kind} image")
        if shutil.which("losetup") is None:
            pytest.skip(f"no losetup (Debian package mount) for a loop-mounted {kind} image")


def _unmount(point: Path) -> None:
    if subprocess.run(["umount", str(point)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


@contextlib.contextmanager
def _mounted(work: Path, point: Path, *mount_args: str) -> Iterator[Path]:
    """``mount MOUNT_ARGS POINT``, always unmounted again, and ``work`` removed."""
    try:
        _run("mount", *mount_args, str(point))
        try:
            yield point
        finally:
            _unmount(point)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def tmpfs(size: str) -> contextlib.AbstractContextManager[Path]:
    """A tmpfs of ``size`` (as ``mount -o size=``: ``6m``), mounted on a new directory."""
    point = Path(tempfile.mkdtemp(prefix="rs-tmpfs-"))
    return _mounted(point, point, "-t", "tmpfs", "-o", f"size={size}", "tmpfs")


@contextlib.contextmanager
def tmpfs_on(point: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on the existing directory ``point`` (of any file system),
    always unmounted again; ``point`` itself stays."""
    _run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point))
    try:
        yield point
    finally:
        _unmount(point)


@contextlib.contextmanager
def ext4_in_file(image: Path, point: Path, size_mib: int) -> Iterator[Path]:
    """An ext4 of ``size_mib`` MiB made as for a disk (a journal, 4 KiB blocks) in the new image
    file ``image``, attached to a loop device and mounted on the new directory ``point`` with
    ``errors=continue``. The image may live on any file system: on a fault FUSE mount
    (tests/kit/faultfuse.py) a write of the image that fails is a block I/O error under ext4.
    Always unmounted (lazily when something still holds it) and the device detached (when its
    last user lets go, if the unmount was lazy)."""
    with open(image, "wb") as f:
        f.truncate(size_mib << 20)
    # mkfs.ext4 gives a file system this small 1 KiB blocks; a disk's have 4 KiB.
    _run("mkfs.ext4", "-q", "-F", "-b", "4096", str(image))
    attach = subprocess.run(
        ["losetup", "--find", "--show", str(image)], check=True, capture_output=True, text=True
    )
    device = attach.stdout.strip()
    try:
        point.mkdir()
        # errors=continue: an I/O error leaves the file system writable (no remount read-only),
        # so that what the error reports is the only consequence a test sees.
        _run("mount", "-t", "ext4", "-o", "errors=continue", device, str(point))
        try:
            yield point
        finally:
            _unmount(point)
    finally:
        subprocess.run(["losetup", "-d", device], capture_output=True)


# linux/fiemap.h: FS_IOC_FIEMAP is _IOWR('f', 11, struct fiemap), a 32-byte header followed by
# fm_extent_count extents of 56 bytes.
_FIEMAP = "=QQIIII"
_EXTENT = "=QQQ16xI12x"
FS_IOC_FIEMAP = (3 << 30) | (struct.calcsize(_FIEMAP) << 16) | (ord("f") << 8) | 11
FIEMAP_FLAG_SYNC = 0x1
FIEMAP_EXTENT_LAST = 0x1
_MAX_EXTENTS = 256


def extents(path: Path) -> list[tuple[int, int]]:
    """The byte ranges ``[start, end)`` of its device that hold the blocks of file ``path``
    (written back first, so that every block has its place)."""
    out: list[tuple[int, int]] = []
    start = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            request = bytearray(
                struct.pack(_FIEMAP, start, 2**64 - 1 - start, FIEMAP_FLAG_SYNC, 0, _MAX_EXTENTS, 0)
            ) + bytes(struct.calcsize(_EXTENT) * _MAX_EXTENTS)
            fcntl.ioctl(fd, FS_IOC_FIEMAP, request)
            mapped = struct.unpack_from(_FIEMAP, request)[3]
            last = False
            for i in range(mapped):
                logical, physical, length, flags = struct.unpack_from(
                    _EXTENT, request, struct.calcsize(_FIEMAP) + i * struct.calcsize(_EXTENT)
                )
                out.append((physical, physical + length))
                start, last = logical + length, bool(flags & FIEMAP_EXTENT_LAST)
            if last or mapped == 0:
                return out
    finally:
        os.close(fd)


def ext4_image(size_mib: int) -> contextlib.AbstractContextManager[Path]:
    """An ext4 file system of ``size_mib`` MiB in an image file, loop-mounted on a new
    directory."""
    work = Path(tempfile.mkdtemp(prefix="rs-ext4-"))
    image, point = work / "fs.img", work / "mnt"
    point.mkdir()
    with open(image, "wb") as f:
        f.truncate(size_mib << 20)
    # No reserved blocks and no journal: the free space df shows is what a writer gets.
    _run("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", str(image))
    return _mounted(work, point, "-o", "loop", str(image))


def btrfs_image(size_mib: int) -> contextlib.AbstractContextManager[Path]:
    """A btrfs of ``size_mib`` MiB (at least 109, mkfs.btrfs's floor) in an image file,
    loop-mounted on a new directory. Separate data and metadata block groups, as on a real
    disk: mixed ones (``--mixed``) would allow a smaller image but behave unlike production."""
    work = Path(tempfile.mkdtemp(prefix="rs-btrfs-"))
    image, point = work / "fs.img", work / "mnt"
    point.mkdir()
    with open(image, "wb") as f:
        f.truncate(size_mib << 20)
    _run("mkfs.btrfs", "-q", "-f", str(image))
    return _mounted(work, point, "-o", "loop", str(image))


IMAGES = {"ext4": ext4_image, "btrfs": btrfs_image}


@contextlib.contextmanager
def real_fs(kind: str, size_mib: int) -> Iterator[Path]:
    """A file system of ``kind`` (``tmpfs``, ``ext4`` or ``btrfs``) and ``size_mib`` MiB."""
    require_root_mounts(kind)
    with tmpfs(f"{size_mib}m") if kind == "tmpfs" else IMAGES[kind](size_mib) as point:
        yield point
