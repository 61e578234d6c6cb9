"""Store files written through a descriptor survive short writes (a write that returns fewer
bytes than asked, as a nearly full disk can make one): the writer goes on until all is down."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from rocketstore.pipeline.files.checkpoint import StoreCheckpoint
from rocketstore.pipeline.files.fileio import pwrite_all
from rocketstore.pipeline.files.progress import FlushProgress

CHUNK = 7  # bytes a short write takes at most


@pytest.fixture
def short_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make every ``os.write`` and ``os.pwrite`` write at most :data:`CHUNK` bytes; returns
    the sizes the writes asked for."""
    asked: list[int] = []
    real_write: Callable[[int, bytes], int] = os.write
    real_pwrite: Callable[[int, bytes, int], int] = os.pwrite

    def write(fd: int, data: bytes) -> int:
        asked.append(len(data))
        return real_write(fd, memoryview(data)[:CHUNK])

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        asked.append(len(data))
        return real_pwrite(fd, memoryview(data)[:CHUNK], offset)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "pwrite", pwrite)
    return asked


def test_progress_file_is_written_whole(tmp_path: Path, short_writes: list[int]) -> None:
    progress = FlushProgress(123_456, 120_000, 1_700_000_000_000, {"TopicA/0": 42}, {"n": [1, 2]})
    progress.write(tmp_path)
    assert FlushProgress.read(tmp_path) == progress
    assert len(short_writes) > 1


def test_checkpoint_is_written_whole(tmp_path: Path, short_writes: list[int]) -> None:
    path = tmp_path / "checkpoint"
    cp = StoreCheckpoint(1_700_000_000_001, 1_700_000_000_002, 1_700_000_000_003)
    cp.write(path, sync=False)
    assert StoreCheckpoint.read(path) == cp
    assert path.stat().st_size == 4096
    assert len(short_writes) > 1


def test_a_write_that_makes_no_progress_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: 0)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with pytest.raises(OSError, match="at 5 made no progress"):
            pwrite_all(fd, b"abc", 5)
    finally:
        os.close(fd)
