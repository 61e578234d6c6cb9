"""The tier's own retention: the bucket keeps a segment ``tieredStoreFileReservedTime`` hours
after its newest record (the manifest's ``maxStoreTimestamp``); ``0`` keeps every segment for
ever.

**What expires.** The oldest segments of the tier whose newest record is older than now minus
the reserved time, up to the first that is not: segments leave from the front only, so the
tier stays one contiguous run ``[deleted.below, end)``.

**In this order** (:meth:`TierRetention.apply`):

1. a manifest commit (conditional, as every change: :meth:`ManifestStore.commit`) drops them
   and raises ``deleted.below`` to the first base kept (the tier's end when none is);
2. their objects (``B/commitlog/<base>`` and ``B/index/<base>``) are deleted.

So no manifest ever names an object that is gone, and a reader holding an older manifest that
then finds an object missing re-reads the manifest, sees the segment below ``deleted.below``
and reports it as retention (``SegmentGoneError``: :mod:`.remote`). A run killed between 1 and
2 leaves objects below ``deleted.below`` that no manifest names; the next run's first round
lists the keys below ``deleted.below`` and deletes them (:meth:`TierRetention.sweep`), as it
does every time ``deleted.below`` moves.

Owns: removing objects from the bucket (nothing local: the store's files have their own
retention). Thread-safety: one thread uses a :class:`TierRetention`; two of them (two
uploaders) are kept apart by the manifest's conditional writes, and deleting a key twice is
no error. Crash behaviour: above. Requires: the store's identity (its ``storeId``, for the
manifest's owner check) and the tier's settings.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from rocketstore.pipeline.files.mappedfile import segment_name
from rocketstore.pipeline.tier.manifest import Manifest, ManifestStore, TierSegment
from rocketstore.pipeline.tier.objects import ObjectStore

log = logging.getLogger(__name__)

HOUR_MS = 3_600_000
_FOLDERS = ("commitlog/", "index/")
_NAME_DIGITS = 20


@dataclasses.dataclass(frozen=True)
class RetentionReport:
    """What one application of the tier's retention did (or, planned, would do)."""

    removed: list[int]  # bases dropped from the manifest, in order
    deleted_below: int  # the manifest's deleted.below after it
    deleted: list[str]  # keys deleted: the removed segments' objects and older leftovers
    manifest: Manifest | None = None  # the manifest after it (None: the tier holds nothing)


def expired(manifest: Manifest, hours: int, now_ms: int) -> list[TierSegment]:
    """The tier's oldest segments whose newest record is older than ``now_ms`` minus
    ``hours``, up to the first that is not (none with ``hours`` 0: kept for ever)."""
    if hours <= 0:
        return []
    limit = now_ms - hours * HOUR_MS
    out: list[TierSegment] = []
    for segment in manifest.segments:
        if segment.max_store_timestamp >= limit:
            break
        out.append(segment)
    return out


def key_base(key: str, folder: str) -> int | None:
    """The base a segment's object key names (``<folder><20 digits>``), None for another key."""
    name = key[len(folder) :] if key.startswith(folder) else ""
    return int(name) if len(name) == _NAME_DIGITS and name.isdigit() else None


class TierRetention:
    """The retention of the tier under ``manifests.prefix`` (see the module docstring):
    ``hours`` is ``tieredStoreFileReservedTime``; ``clock_ms`` the time now, in ms."""

    def __init__(
        self,
        objects: ObjectStore,
        manifests: ManifestStore,
        hours: int,
        clock_ms: Callable[[], int],
    ) -> None:
        self.objects = objects
        self.manifests = manifests
        self.hours = hours
        self.clock_ms = clock_ms
        # deleted.below as of the last sweep (None: none yet, so the first round sweeps what
        # a run killed between its commit and its deletions left).
        self._swept_below: int | None = None

    def apply(self) -> RetentionReport:
        """Remove the expired segments (commit, then delete) and any object left below
        ``deleted.below`` by a run that died in between."""
        manifest, removed = self.commit_expired()
        if manifest is None:
            return RetentionReport([], 0, [])
        below = manifest.deleted_below
        deleted = self.sweep(below) if self._swept_below != below else []
        if removed:
            log.info(
                "tier retention: removed segments %s from %s (deleted.below %d)",
                ", ".join(segment_name(b) for b in removed),
                self.manifests.where,
                below,
            )
        return RetentionReport(removed, below, deleted, manifest)

    def commit_expired(self) -> tuple[Manifest | None, list[int]]:
        """Step 1: the manifest without the expired segments, ``deleted.below`` raised past
        them; returns the manifest now and the bases this commit removed. Their objects stay
        until :meth:`sweep`."""
        now = self.clock_ms()
        removed: list[int] = []

        def update(m: Manifest | None) -> Manifest | None:
            removed.clear()  # a lost race applies this again, to the winner's manifest
            if m is None:
                return None
            gone = expired(m, self.hours, now)
            if not gone:
                return None
            removed.extend(s.base for s in gone)
            return m.trimmed(gone[-1].base + m.segment_size)

        done = self.manifests.commit(update)
        return done.manifest, removed if done.wrote else []

    def leftovers(self, below: int) -> list[str]:
        """The keys of segment objects (commitlog and index) below ``below`` in the bucket:
        listed up to ``below`` only (keys sort as the 20-digit bases do)."""
        keys: list[str] = []
        for folder in _FOLDERS:
            at = self.manifests.prefix + folder
            for key, _size in self.objects.list(at, until=f"{at}{segment_name(below)}"):
                base = key_base(key, at)
                if base is not None and base < below:
                    keys.append(key)
        return keys

    def sweep(self, below: int) -> list[str]:
        """Step 2: delete every segment object below ``below`` (``deleted.below``); returns
        the keys deleted."""
        keys = self.leftovers(below)
        self.objects.delete(keys)
        self._swept_below = below
        return keys

    def plan(self) -> RetentionReport:
        """What :meth:`apply` would do now, changing nothing (``tier clean --dry-run``)."""
        loaded = self.manifests.load()
        if loaded is None:
            return RetentionReport([], 0, [])
        manifest = loaded[0]
        gone = expired(manifest, self.hours, self.clock_ms())
        below = gone[-1].base + manifest.segment_size if gone else manifest.deleted_below
        return RetentionReport([s.base for s in gone], below, self.leftovers(below))
