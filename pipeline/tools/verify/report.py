"""What a scan finds: :class:`Problem` and :class:`VerifyReport`.

Both belong to the API of :mod:`rocketstore.pipeline.tools.verify.check` and are imported from there. They
live in this module, below the scan's other modules, so that those can fill a report without
importing the module that runs them.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class Problem:
    """One inconsistency: ``kind`` (one of the stable strings docs/operations.md lists, under
    "What verify checks", and docs/cli.md for the tier's), the file, the byte offset (the physical offset for the
    CommitLog, the position inside the file otherwise) and a text."""

    kind: str
    path: str
    offset: int
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "offset": self.offset, "detail": self.detail}

    def __str__(self) -> str:
        return f"{self.path} @ {self.offset}: {self.kind}: {self.detail}"


@dataclasses.dataclass
class VerifyReport:
    """What :func:`verify` found, and how much it checked."""

    store: str
    problems: list[Problem] = dataclasses.field(default_factory=list)
    suppressed: int = 0  # problems not listed (beyond the cap for their kind and file)
    segments: int = 0
    commitlog_bytes: int = 0  # CommitLog bytes scanned (whole segments)
    records: int = 0  # valid records
    record_bytes: int = 0
    blanks: int = 0
    damaged_records: int = 0
    damaged_bytes: int = 0  # CommitLog bytes skipped from damaged records to the next boundary
    queues: int = 0
    units: int = 0  # units checked against their record
    index_files: int = 0
    index_entries: int = 0  # entries checked against their record
    seconds: float = 0.0
    # CommitLog offset the scan stopped at because a writer was appending (None: the whole log)
    snapshot_end: int | None = None
    # Scans started over because retention deleted a file the read-only open had listed
    # (verify_read_only); what the report says is from the last, whole scan.
    restarts: int = 0
    # What the check of the tier's objects read (tools/verify/tier.py), None when not run;
    # its problems are among ``problems``.
    tier: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not self.problems and not self.suppressed

    def counters(self) -> dict[str, int]:
        return {
            "segments": self.segments,
            "bytes": self.commitlog_bytes,
            "records": self.records,
            "recordBytes": self.record_bytes,
            "blanks": self.blanks,
            "damagedRecords": self.damaged_records,
            "damagedBytes": self.damaged_bytes,
            "queues": self.queues,
            "units": self.units,
            "indexFiles": self.index_files,
            "indexEntries": self.index_entries,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "ok": self.ok,
            "counters": self.counters(),
            "seconds": round(self.seconds, 3),
            "problemsSuppressed": self.suppressed,
            "snapshotEnd": self.snapshot_end,
            "restarts": self.restarts,
            "tier": self.tier,
            "problems": [p.to_json() for p in self.problems],
        }
