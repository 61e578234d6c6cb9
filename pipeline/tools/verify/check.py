"""A full consistency scan of a store directory (``rocketstore verify STORE``).

:func:`verify` reads every byte of the CommitLog, the ConsumeQueues and the IndexFiles and
checks that each is well formed and that they agree with one another. It changes nothing and
never stops at the first problem: each one becomes a :class:`Problem` naming the file, the byte
offset (the physical offset for the CommitLog, the position inside the file for a ConsumeQueue
or an IndexFile) and its kind, a stable string; the scan carries on. What is checked in each
file, which side of a disagreement is blamed, what no scan can check, and the kinds:
docs/operations.md ("What verify checks"). At most :data:`MAX_PROBLEMS_PER_KIND` problems of
one kind are listed per file; the rest are counted in :attr:`VerifyReport.suppressed`.

How it reads: the one native record walk recovery and dispatch use
(:func:`rocketstore.pipeline.format.native.walk`), so records are checked exactly as they are
read back and the tagsCode and index keys expected are the ones dispatch writes;
:data:`CHUNK_RECORDS` records at a time, each stretch's units and index entries checked
against its records and the records then dropped, so memory does not grow with the store (one
byte per unit and the damaged stretches stay). Each IndexFile's header, slots and chains are
checked on their own before the walk. The parts: :mod:`~rocketstore.pipeline.tools.verify.log`
(the CommitLog), :mod:`~rocketstore.pipeline.tools.verify.queues`,
:mod:`~rocketstore.pipeline.tools.verify.index`, sharing
:mod:`~rocketstore.pipeline.tools.verify.state`; :func:`verify` runs them in order.

Thread-safety: reads only. Requires: a store opened read-only, or the writer's thread between
puts. A live store: the scan stops at the durable point recorded when the read-only view opened
(``config/rocketstore.json``), so a writer's appends report nothing; it holds the oldest
CommitLog segments (up to :data:`~rocketstore.pipeline.tools.verify.state.PINNED_SEGMENTS`)
mapped from its start, so retention deleting them changes nothing; a file lost all the same
raises :class:`~rocketstore.pipeline.errors.SegmentGoneError`, and :func:`verify_read_only`
opens the store again and starts over, up to :data:`ATTEMPTS` scans (counted in the report).
The CLI, the console and the soak bench verify through it.
"""

from __future__ import annotations

import time
from pathlib import Path

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import SegmentGoneError
from rocketstore.pipeline.tools.verify.index import IndexChecker
from rocketstore.pipeline.tools.verify.log import LogWalker
from rocketstore.pipeline.tools.verify.queues import QueueChecker
from rocketstore.pipeline.tools.verify.report import Problem, VerifyReport
from rocketstore.pipeline.tools.verify.state import ProgressCallback, Scan

__all__ = [
    "CHUNK_RECORDS",
    "MAX_PROBLEMS_PER_KIND",
    "Problem",
    "ProgressCallback",
    "VerifyReport",
    "verify",
    "verify_read_only",
]

MAX_PROBLEMS_PER_KIND = 100
CHUNK_RECORDS = 1 << 17  # records walked, then checked against units and entries, at once
ATTEMPTS = 5  # scans of a live store that retention deleted files under, before giving up


def verify(
    store: MessageStore,
    *,
    progress: ProgressCallback | None = None,
    max_per_kind: int | None = MAX_PROBLEMS_PER_KIND,
) -> VerifyReport:
    """Check the whole store; see the module docstring. ``progress(done, total)`` is called
    with byte counts as the scan advances. At most ``max_per_kind`` problems of one kind are
    listed per file (None: all); the others are only counted."""
    scan = Scan(store, progress, max_per_kind)
    queues = QueueChecker(scan)
    index = IndexChecker(scan)
    try:
        return _run(scan, queues, index)
    finally:
        # Views of the mapped segments must not outlive the scan: closing the store would
        # fail while one exists.
        scan.release()
        queues.release()
        index.release()


def verify_read_only(
    path: str | Path,
    config: StoreConfig | None = None,
    *,
    progress: ProgressCallback | None = None,
    max_per_kind: int | None = MAX_PROBLEMS_PER_KIND,
    attempts: int | None = None,
) -> VerifyReport:
    """:func:`verify` on a read-only open of the store at ``path`` (no lock taken, nothing
    written). When retention deletes a file this open listed before the scan reads it, the
    store is opened again and scanned from its new beginning, up to ``attempts`` scans in all
    (default :data:`ATTEMPTS`); :attr:`VerifyReport.restarts` counts the scans started over.
    Raises :class:`SegmentGoneError` if the last one also lost a file."""
    tries = max(1, ATTEMPTS if attempts is None else attempts)
    restarts = 0
    while True:
        try:
            with MessageStore(path, config, read_only=True) as store:
                report = verify(store, progress=progress, max_per_kind=max_per_kind)
        except SegmentGoneError as exc:
            restarts += 1
            if restarts < tries:
                continue
            raise SegmentGoneError(
                f"{path}: retention deleted files under each of {tries} scans "
                f"(last: {exc}); verify the store when its writer is idle, or run "
                "retention less often"
            ) from exc
        report.restarts = restarts
        return report


def _run(scan: Scan, queues: QueueChecker, index: IndexChecker) -> VerifyReport:
    """The scan in its order: the queues and the index files are read first (the walk
    resynchronises on unit offsets, and checks entries only from the oldest record indexed
    on), then the log is walked stretch by stretch, each checked against the units and entries
    that point into it; what needs every unit matched comes last."""
    started = time.perf_counter()
    report = scan.report
    report.segments = len(scan.files)
    report.commitlog_bytes = scan.cl_total
    queues.list_files()
    queues.load()
    index.load()
    walked_from = scan.done
    walker = LogWalker(
        scan,
        unit_starts=queues.starts_after,
        checks=(queues.check, index.check),
        chunk_records=CHUNK_RECORDS,  # read at each call: the tests change it
    )
    walker.check_dead_regions()
    walker.walk()
    scan.tick(walked_from + scan.cl_total)
    queues.check_mismatched()
    queues.check_ascending()
    scan.tick(scan.total)
    report.damaged_records = len(scan.damaged)
    report.seconds = time.perf_counter() - started
    return report
