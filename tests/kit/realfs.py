"""Real file systems for tests of real faults: a small tmpfs, loop-mounted ext4 and btrfs images.

Each is a context manager that mounts a fresh file system of the given size, yields its mount
point and always unmounts it (lazily when something still holds it) and removes what it made.
They need root; :func:`require_root_mounts` skips a test with the reason where mounting is not
possible (not root, no loop device, no mkfs).
"""

from __future__ import annotations

import contextlib
import os
import shutil
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
