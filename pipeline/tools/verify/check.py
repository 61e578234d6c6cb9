"""A full consistency scan of a store directory (``rocketstore verify STORE``).

:func:`verify` reads every byte of the CommitLog, the ConsumeQueues and the IndexFiles and checks
that each is well formed and that they agree with one another. It changes nothing and never
stops at the first problem: each one becomes a :class:`Problem` naming the file, the byte offset
(the physical offset for the CommitLog, the position inside the file for a ConsumeQueue or an
IndexFile) and what is wrong, and the scan carries on.

CommitLog
    Every segment is walked from its start. Each record must have the magic code, a TOTALSIZE
    that fits the segment and equals the sum of its field lengths, PHYSICALOFFSET equal to its
    position, a body CRC that matches and a UTF-8 topic; an END_OF_FILE blank moves on to the
    next segment and must cover exactly the rest of its segment. After a damaged record the
    walk resynchronises on the next record boundary: the next ConsumeQueue unit's offset that
    looks like a record start, or, before it or when there is none, the next position where a
    whole valid record starts (its PHYSICALOFFSET must equal that position, so a stray copy of
    the magic code inside a body is not taken for one). Zeros where a record was expected are
    the end of the log, unless data follows them (a hole); non-zero bytes after the end are
    reported as garbage.

ConsumeQueues
    Every unit between the first and the last valid one must point at a record that starts at
    that offset, with TOTALSIZE equal to the unit's size, the queue's topic and queue id, the
    unit's number as QUEUEOFFSET and the Java hash of its TAGS as tagsCode; units must follow
    the CommitLog order, and no invalid unit may come before the last valid one. Every record
    that belongs in a ConsumeQueue (not a PREPARED or ROLLBACK transaction) must have its unit.

IndexFiles
    The header must be sane and agree with the entries, every file but the last must be full,
    every used entry must point at a record
    whose ``topic#key`` hash (UNIQ_KEY or a KEYS token) is the entry's key hash and whose store
    time gives the entry's time difference; slot heads and ``prevIndex`` links must stay inside
    the used entries, go strictly down, stay in one slot, and reach every entry exactly once.
    Every key (UNIQ_KEY, KEYS tokens) of every record from the oldest one indexed on must have
    its entry.

A unit or entry that points at a damaged record is not checked further (the record is reported).

A consistent snapshot
    While another process writes the store (it holds the ``lock``), the scan stops at the
    durable point recorded when the read-only view opened (``config/rocketstore.json``, read
    before the view listed any file: the flushed CommitLog offset and each queue's length
    then, all of whose units and index entries were on disk before the file was written). Records, units and index entries past it are the writer's
    work in progress and are not checked, so appends during the scan report nothing. Without
    a progress file the bound is the end of the log that the read-only open found.

After a crash
    A writer that stopped between appending and dispatching leaves its newest records without
    their ConsumeQueue units or index entries (``cq-missing-unit``, ``index-missing-entry``).
    When such a record lies past the durable point, the problem says so, and that
    ``rocketstore recover`` (or the next writable open) repairs it.
When a unit and the record it points at disagree, the problem is blamed on the side the rest of
the store contradicts: a unit pointing at a record that its own unit (the one at the record's
topic, queue id and queue offset) already claims is wrong itself, and so are units that point
at each other's records (swapped or shifted); a record that claims a place no unit backs, or
one that another record rightly holds, is wrong itself.

What cannot be checked: RocketMQ 4.x protects only the body with a CRC. FLAG, the timestamps,
the hosts, RECONSUMETIMES, the prepared-transaction offset, the transaction-type bits (beyond
ConsumeQueue membership) and properties other than TAGS, KEYS and UNIQ_KEY have no second copy
anywhere in the store, so damage to them cannot be detected, here or by RocketMQ. A changed TAGS
value and a changed unit tagsCode look the same, and are reported at the unit; likewise a changed
KEYS or UNIQ_KEY value is reported at the index entries that no longer match it.

Problem kinds (stable strings):

=================================== ==========================================================
commitlog-bad-magic                 neither the message magic nor a blank where one must start
commitlog-size                      TOTALSIZE out of range, or the field lengths do not add up
commitlog-physical-offset           PHYSICALOFFSET is not the record's position
commitlog-crc                       body CRC mismatch
commitlog-topic                     the topic is not valid UTF-8
commitlog-torn                      a NUL byte in the topic or properties: zeros a write torn
                                    after the body left (no whole record has one there)
commitlog-blank                     an END_OF_FILE blank that does not end its segment
commitlog-hole                      zeros where a record or blank was expected, data after
commitlog-garbage-after-end         non-zero bytes after the last record of the log
commitlog-garbage-after-blank       non-zero bytes after an END_OF_FILE blank
commitlog-fenced-writer             bytes in a dead region (rocketstore.pipeline.engine.fencing): a writer that had
                                    lost the store wrote there; recovery restores the region
commitlog-record-mismatch           a record's topic, queue id, queue offset or transaction type
                                    contradicts the ConsumeQueue unit pointing at it
cq-unit-points-nowhere              no record starts at the unit's offset
cq-unit-wrong-queue                 the record belongs to another queue or queue offset
cq-unit-size-mismatch               unit size differs from the record's TOTALSIZE
cq-unit-tags-code                   unit tagsCode differs from the hash of the record's TAGS
cq-unit-not-dispatchable            the unit points at a PREPARED or ROLLBACK record
cq-not-ascending                    units out of CommitLog order
cq-hole                             an invalid unit before the last valid one
cq-garbage-after-end                non-zero bytes after the last valid unit
cq-missing-unit                     a record has no unit in its queue
index-header                        header field out of range or contradicting the entries
index-slot                          slot head out of range or in the wrong slot
index-chain                         bad prevIndex, or an entry unreachable or reached twice
index-entry-points-nowhere          no record starts at the entry's phyOffset
index-entry-hash                    the entry's key hash is none of the record's keys
index-entry-time                    the entry's time difference contradicts the record
index-unused-entry                  non-zero bytes in entry 0 (never used) or after indexCount
index-missing-entry                 a key of a record has no entry (reported at its slot)
=================================== ==========================================================

By default at most :data:`MAX_PROBLEMS_PER_KIND` problems of one kind are listed per file; the
rest are counted in :attr:`VerifyReport.suppressed`.

How the scan reads the log: with the one native record walk (:func:`rocketstore.pipeline.format.native.walk`)
that recovery and dispatch use, so it checks records exactly as they are read back, and the
tagsCode and index keys it expects are the ones dispatch writes (the walk lists the key hashes:
none for an empty UNIQ_KEY or KEYS token, none for a ROLLBACK record). :data:`CHUNK_RECORDS`
records at a time: once a stretch of the log is walked, the units and index entries that point
into it are checked against its records and the records are dropped, so memory does not grow
with the store. What stays for the whole scan is one byte per ConsumeQueue unit (whether it
matched its record) and the damaged stretches; each IndexFile's header, slots and chains are
checked on their own, one file at a time, before the walk. ConsumeQueue and IndexFile entries
are read from their mappings a file at a time, and bisected where their offsets ascend.

The scan's parts: :mod:`~rocketstore.pipeline.tools.verify.log` walks the CommitLog,
:mod:`~rocketstore.pipeline.tools.verify.queues` checks the ConsumeQueues and
:mod:`~rocketstore.pipeline.tools.verify.index` the IndexFiles; they share the scan's bookkeeping
(:mod:`~rocketstore.pipeline.tools.verify.state`), and :func:`verify` runs them in order.

Thread-safety: reads only. Run it on a store opened read-only, or from the writer's thread
between puts.

A live store: a read-only open lists the files once, and retention may delete the oldest of
them before the scan reads them. The scan maps the oldest CommitLog segments (up to
:data:`~rocketstore.pipeline.tools.verify.state.PINNED_SEGMENTS`) when it starts and holds them
to its end, so they stay readable; a record among them whose unit's file retention deleted
before the queues were listed is not reported missing. A file lost all the same raises
:class:`~rocketstore.pipeline.errors.SegmentGoneError`: :func:`verify_read_only` opens the
store again and starts over when that happens, up to :data:`ATTEMPTS` scans, and counts the
restarts in the report; the CLI, the console and the soak bench verify through it.
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
