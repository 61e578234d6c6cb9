"""What of a store is local and what waits for its upload, from the store's own files.

:func:`backlog` lists the CommitLog segments (their apparent sizes), the sealed ones (a later
segment exists and the published flushed point has passed the segment's end:
:func:`~rocketstore.pipeline.tier.upload.sealed_bases`), the sealed ones at or past an upload
end (pending) and the upload lag: seconds since the oldest pending segment was sealed (its
file's last write). ``tier status`` gives it the manifest's end; the metrics and the console
give it the store's record (``uploadedEnd`` of ``config/rocketstore-tier.json``, read with
the rest of the record by :func:`recorded_backlog`), so a scrape asks the bucket nothing: what
the bucket holds is what the uploader recorded when it last read or committed the manifest.

Owns: nothing (reads a directory listing, the flush progress file, one stat per segment, the
tier record).
Thread-safety: a call stands alone. Crash behaviour: reads only; a segment deleted while it
is read is left out. Requires: the store's ``commitlog/`` directory (missing: no segments).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.files.localsegments import LocalSegments
from rocketstore.pipeline.tier import localstate
from rocketstore.pipeline.tier.localstate import TierState
from rocketstore.pipeline.tier.upload import flushed_offset, sealed_bases, upload_lag_s


@dataclasses.dataclass(frozen=True)
class Backlog:
    """One store directory's CommitLog against its upload (see the module docstring)."""

    local: list[int]  # the bases of the segment files, ascending
    local_bytes: int
    sealed: list[int]
    pending: list[int]
    pending_bytes: int
    lag_s: float


def backlog(store: Path, config: StoreConfig, uploaded_end: int, now_ms: int) -> Backlog:
    """The segments of ``store`` and those sealed at or past ``uploaded_end`` (pending), as of
    ``now_ms`` (wall time, ms) for the lag."""
    size = config.mapped_file_size_commitlog
    segments = LocalSegments(store / "commitlog", segment_size=size)
    # One stat per file, of the listing's own paths: a scrape of a store of thousands of
    # segments would spend more on building paths again than on the stats.
    sizes = {base: _size(path) for base, path in segments.entries}
    sealed = sealed_bases(segments, size, flushed_offset(store))
    pending = [b for b in sealed if b >= uploaded_end]
    return Backlog(
        list(sizes),
        sum(sizes.values()),
        sealed,
        pending,
        sum(sizes[b] for b in pending),
        upload_lag_s(store, pending, segments, now_ms),
    )


def _size(path: Path) -> int:
    """A listed file's size; 0 when retention deleted it since the listing."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def recorded_backlog(
    store: Path, config: StoreConfig, now_ms: int
) -> tuple[Backlog, TierState | None]:
    """The store's tier record (None: it never uploaded) and its backlog against the record's
    ``uploadedEnd``. A record that cannot be read is a :class:`TierError` naming it."""
    record = localstate.read(store)
    return backlog(store, config, record.uploaded_end if record else 0, now_ms), record
