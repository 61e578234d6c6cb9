"""What a retention round deletes or would delete (:mod:`rocketstore.pipeline.engine.retention.service`):
each file with its reason, each queue whose min offset moved, and the round's plan (``--dry-run``)
or report, as ``rocketstore clean`` prints them (``--json``: :meth:`CleanPlan.to_json`).

Plain data; not thread-safe.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class FileDeletion:
    """One file deleted (or, in a plan, to be deleted)."""

    path: Path
    kind: str  # "commitlog", "consumequeue" or "index"
    bytes: int  # file length
    allocated: int  # disk space it holds (files are sparse until written)
    reason: str  # "expired", "disk-pressure", "forced" or "below-min-offset"
    mtime_ms: int

    def to_json(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "kind": self.kind,
            "bytes": self.bytes,
            "allocatedBytes": self.allocated,
            "reason": self.reason,
            "mtime": self.mtime_ms,
        }


@dataclasses.dataclass(frozen=True)
class QueueMinOffset:
    """A ConsumeQueue whose min offset moved (queue offsets, not bytes)."""

    topic: str
    queue_id: int
    before: int
    after: int

    def to_json(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "queueId": self.queue_id,
            "minOffsetBefore": self.before,
            "minOffsetAfter": self.after,
        }


@dataclasses.dataclass
class CleanPlan:
    """What a run at ``now_ms`` would do; nothing was changed to find out.

    For forced deletion the plan assumes each deleted file gives back its allocated bytes of a
    filesystem of ``disk_total_bytes``; a run measures the disk again after each file instead.
    """

    store: Path
    now_ms: int
    disk_used_ratio: float
    triggers: list[str]
    files: list[FileDeletion]
    queues: list[QueueMinOffset]
    commitlog_min_offset_before: int
    commitlog_min_offset_after: int
    disk_used_ratio_after: float
    disk_full: bool

    dry_run = True

    def deleted(self, kind: str | None = None) -> list[FileDeletion]:
        return [f for f in self.files if kind is None or f.kind == kind]

    @property
    def bytes(self) -> int:
        """Total length of the files."""
        return sum(f.bytes for f in self.files)

    @property
    def bytes_freed(self) -> int:
        """Disk space the files held."""
        return sum(f.allocated for f in self.files)

    def to_json(self) -> dict[str, object]:
        return {
            "store": str(self.store),
            "dryRun": self.dry_run,
            "now": self.now_ms,
            "diskUsedRatio": round(self.disk_used_ratio, 6),
            "triggers": list(self.triggers),
            "files": [f.to_json() for f in self.files],
            "queues": [q.to_json() for q in self.queues],
            "commitLogMinOffsetBefore": self.commitlog_min_offset_before,
            "commitLogMinOffsetAfter": self.commitlog_min_offset_after,
            "bytes": self.bytes,
            "bytesFreed": self.bytes_freed,
            "diskUsedRatioAfter": round(self.disk_used_ratio_after, 6),
            "diskFull": self.disk_full,
        }


@dataclasses.dataclass
class CleanReport(CleanPlan):
    """What a run did. ``deferred`` lists files kept because a reader still maps them (they are
    tried again next run); ``complete`` is False when a per-run limit or a deferred file left
    work for the next run."""

    deferred: list[Path] = dataclasses.field(default_factory=list)
    complete: bool = True

    dry_run = False

    def to_json(self) -> dict[str, object]:
        out = super().to_json()
        out["deferred"] = [str(p) for p in self.deferred]
        out["complete"] = self.complete
        return out
