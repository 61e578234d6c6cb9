"""An independent reader of CommitLog segment files for tests: it walks the raw bytes with the
layout's rules only (no store code), checking what a RocketMQ-format log must look like."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from rocketstore.pipeline.format import record


def commitlog_entries(store: Path) -> Iterator[tuple[int, bytes | None]]:
    """(physical offset, record bytes) of every record of a store's CommitLog, in order, and
    (offset, None) for each END_OF_FILE blank. Asserts that a blank covers the rest of its
    segment and is followed by zeros, and that nothing but zeros follows the last record."""
    for seg in sorted((store / "commitlog").iterdir()):
        base = int(seg.name)
        data = seg.read_bytes()
        pos = 0
        while pos + 8 <= len(data):
            size, magic = record.SIZE_MAGIC.unpack_from(data, pos)
            if magic == record.BLANK_MAGIC:
                assert size == len(data) - pos, f"{seg}: blank must cover the rest of the file"
                assert not any(data[pos + 8 :]), f"{seg}: bytes after the blank at {pos}"
                yield base + pos, None
                break
            if magic != record.MAGIC:
                assert not any(data[pos:]), f"{seg}: garbage after the last record at {pos}"
                break
            yield base + pos, data[pos : pos + size]
            pos += size


def commitlog_records(store: Path) -> list[tuple[int, bytes]]:
    """The records of :func:`commitlog_entries`, without the blanks."""
    return [(phys, raw) for phys, raw in commitlog_entries(store) if raw is not None]
