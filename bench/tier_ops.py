"""What the ``tier`` part (bench/tier.py) runs beside its own process, and what both use:

* ``python -m bench.tier_ops writer STORE CONFIG SECONDS STATUS [BATCH MB_PER_S]``: the writer
  of the upload figures: batch puts of BATCH (100,000) 100-byte messages as fast as the store
  takes them, or at MB_PER_S of CommitLog, a retention round (gated by the tier: only uploaded
  segments go) every second, and its progress written to the STATUS file, until SECONDS have
  passed or the file ``STATUS.stop`` appears;
* :class:`Counting`: the read side's ``ObjectReads`` over the S3 face, counting requests and
  bytes (CommitLog objects apart from the rest);
* :func:`delete_uploaded`: local retention as the store runs it, its clock moved on, so that
  every uploaded segment is expired.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from bench.store import make_table
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.retention.policy import statvfs_used_ratio
from rocketstore.pipeline.engine.retention.service import RetentionService
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.tier.remote import ObjectReads

# The writer's batch: large enough that a put's fixed cost is nothing, small enough that the
# status file moves several times a second.
WRITER_BATCH = 100_000
BODY = 100
# Retention's clock this far ahead: every segment is past fileReservedTime (72 h), so the
# tier's gate (uploaded or not) is what decides.
AHEAD_MS = 10 * 24 * 3600 * 1000


class Counting:
    """``ObjectReads`` over ``inner`` that counts GETs and bytes (see the module docstring)."""

    def __init__(self, inner: ObjectReads) -> None:
        self.inner = inner
        self.gets = 0
        self.bytes = 0
        self.commitlog_gets = 0
        self.commitlog_bytes = 0

    def _count(self, key: str, n: int) -> None:
        self.gets += 1
        self.bytes += n
        if "/commitlog/" in key:
            self.commitlog_gets += 1
            self.commitlog_bytes += n

    def get(self, key: str) -> tuple[bytes, str]:
        data, etag = self.inner.get(key)
        self._count(key, len(data))
        return data, etag

    def get_range(self, key: str, start: int, end: int) -> bytes:
        data = self.inner.get_range(key, start, end)
        self._count(key, len(data))
        return data

    def head(self, key: str) -> tuple[int, str] | None:
        return self.inner.head(key)

    def list(self, prefix: str) -> list[tuple[str, int]]:
        return self.inner.list(prefix)


def retention_ahead(store: MessageStore) -> None:
    """The store's retention with its clock :data:`AHEAD_MS` on (the store's own clock, which
    stamps the messages, stays the wall clock)."""
    store.retention = RetentionService(
        store,
        clock_ms=lambda: time.time_ns() // 1_000_000 + AHEAD_MS,
        disk_usage=statvfs_used_ratio,
    )


def delete_uploaded(store: MessageStore) -> None:
    """Delete every local segment the tier holds (retention decides; the tier's gate keeps the
    rest)."""
    retention_ahead(store)
    store.clean(force_expired=True, max_files=100_000)


def writer(
    store_path: Path,
    config_path: Path,
    seconds: float,
    status: Path,
    batch: int = WRITER_BATCH,
    mb_per_s: float = 0.0,
) -> None:
    config = StoreConfig.load(config_path)
    tables = [make_table(batch, BODY, 7 + i, first_key=i * batch) for i in range(4)]
    stop = Path(f"{status}.stop")
    messages = 0
    end = 0
    with MessageStore(store_path, config) as store:
        retention_ahead(store)
        t0 = time.monotonic()
        cleaned = t0
        i = 0
        while time.monotonic() - t0 < seconds and not stop.exists():
            got = store.put_batch(tables[i % len(tables)])
            i += 1
            messages += batch
            end = int(got.commit_log_offsets[-1])
            if mb_per_s > 0:
                # Paced: wait until the bytes written so far are due.
                time.sleep(max(0.0, t0 + end / (mb_per_s * 1e6) - time.monotonic()))
            now = time.monotonic()
            if now - cleaned >= 1.0:
                store.clean(force_expired=True, max_files=100_000)
                cleaned = now
            tmp = status.with_suffix(".tmp")
            tmp.write_text(json.dumps({"t": now - t0, "messages": messages, "end": end}))
            os.replace(tmp, status)
    # After close (its flush): the final figures.
    tmp = status.with_suffix(".tmp")
    tmp.write_text(
        json.dumps({"t": time.monotonic() - t0, "messages": messages, "end": end, "done": True})
    )
    os.replace(tmp, status)


def main(argv: list[str]) -> int:
    if len(argv) in (5, 7) and argv[0] == "writer":
        more = (int(argv[5]), float(argv[6])) if len(argv) == 7 else ()
        writer(Path(argv[1]), Path(argv[2]), float(argv[3]), Path(argv[4]), *more)
        return 0
    print(
        "usage: python -m bench.tier_ops writer STORE CONFIG SECONDS STATUS [BATCH MB_PER_S]",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
