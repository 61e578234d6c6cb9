"""The state one :func:`rocketstore.pipeline.tools.verify.check.verify` scan shares among its parts.

A scan has three jobs, each in its own module: walking the CommitLog
(:mod:`~rocketstore.pipeline.tools.verify.log`), checking the ConsumeQueues against the records
(:mod:`~rocketstore.pipeline.tools.verify.queues`) and checking the IndexFiles
(:mod:`~rocketstore.pipeline.tools.verify.index`). What they all use is here, in one :class:`Scan`:

* the report and its problems, capped per kind and file (:meth:`Scan.problem`), and the
  progress in bytes (:meth:`Scan.tick`);
* the CommitLog's segments, read as byte arrays (only the last :data:`KEPT_ARRAYS` kept), and
  the snapshot the scan stops at while a writer appends (``log_end``, ``queue_lengths``);
* store-wide topic ids, and the one valid record at an offset (:meth:`Scan.record_at`);
* the damaged stretches the walk marks (:meth:`Scan.mark`), inside which the checks look at
  nothing (:meth:`Scan.lookup`).

:class:`Segment` is how a walked stretch of records reaches the checks.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files import mappings
from rocketstore.pipeline.files.lock import is_locked_elsewhere
from rocketstore.pipeline.files.progress import FlushProgress
from rocketstore.pipeline.files.segmentread import SegmentFile
from rocketstore.pipeline.format import native, record
from rocketstore.pipeline.layout import index_file_size
from rocketstore.pipeline.tools.verify.report import Problem, VerifyReport

I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
# Told (bytes scanned so far, bytes to scan) as a scan advances.
ProgressCallback = Callable[[int, int], None]
# Records of one native walk: the walk, how many of its records are valid, their topic ids.
Piece = tuple[native.Walk, int, I64]

# Segment arrays the scan keeps at once (see Scan.array).
KEPT_ARRAYS = 4
# The oldest segments a scan of a view keeps mapped throughout (a descriptor each), and at most
# how many ConsumeQueue files besides (those before each queue's last: retention deletes a
# queue's oldest files, never its last), within a share of the process's descriptor budget.
PINNED_SEGMENTS = 32
PINNED_QUEUE_FILES = 1024


@dataclasses.dataclass
class Segment:
    """The valid records of a walked stretch of one CommitLog segment, column by column, from
    the record walk: what the walker hands the ConsumeQueue and IndexFile checks. Rows are in
    log order (``phys`` ascends)."""

    phys: I64
    sizes: I64
    queue_ids: npt.NDArray[np.int32]
    queue_offsets: I64
    sys_flags: npt.NDArray[np.int32]
    store_ts: I64
    tags_codes: I64
    topic_ids: I64  # store-wide topic ids
    key_rows: I64  # index entries the records need, in RocketMQ's order: record row ...
    key_hashes: npt.NDArray[np.int32]  # ... and key hash

    @classmethod
    def of(cls, pieces: list[Piece]) -> Segment:
        """The first ``n`` records of each walk, whose topic codes ``ids`` map to topic ids.
        The walk's columns are kept as they are (no copy) when one walk covers the segment."""

        def cat(parts: list[npt.NDArray[Any]]) -> npt.NDArray[Any]:
            if len(parts) == 1:
                return parts[0]
            return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

        rows: list[I64] = []
        hashes: list[npt.NDArray[np.int32]] = []
        ids: list[I64] = []
        done = 0
        for w, n, tids in pieces:
            if n == len(w):
                rows.append(w.key_rows + done if done else w.key_rows)
                hashes.append(w.key_hashes)
            else:
                keep = w.key_rows < n
                rows.append(w.key_rows[keep] + done)
                hashes.append(w.key_hashes[keep])
            ids.append(tids[w.topic_codes[:n]])
            done += n
        return cls(
            phys=cat([w.phys[:n] for w, n, _ in pieces]),
            sizes=cat([w.sizes[:n] for w, n, _ in pieces]),
            queue_ids=cat([w.queue_ids[:n] for w, n, _ in pieces]),
            queue_offsets=cat([w.queue_offsets[:n] for w, n, _ in pieces]),
            sys_flags=cat([w.sys_flags[:n] for w, n, _ in pieces]),
            store_ts=cat([w.store_ts[:n] for w, n, _ in pieces]),
            tags_codes=cat([w.tags_codes[:n] for w, n, _ in pieces]),
            topic_ids=cat(ids),
            key_rows=cat(rows),
            key_hashes=cat(hashes),
        )

    def __len__(self) -> int:
        return len(self.phys)

    def dispatchable(self) -> Bools:
        """Per record: whether it belongs in a ConsumeQueue (not PREPARED or ROLLBACK)."""
        return record.consume_queue_mask(self.sys_flags)


class Scan:
    """The bookkeeping of one scan, shared by the CommitLog walker, the ConsumeQueue checker
    and the IndexFile checker (see the module docstring). It checks nothing itself; it holds
    what they must agree on, so that each of them owns only its own files' state."""

    def __init__(
        self, store: MessageStore, progress: ProgressCallback | None, max_per_kind: int | None
    ) -> None:
        self.store = store
        self.max_per_kind = max_per_kind
        self.report = VerifyReport(str(store.path))
        self.progress = progress
        self.log = store.commitlog
        self.files: Sequence[SegmentFile] = self.log.segments.files
        self.seg_size = self.log.segment_size
        self.base0 = self.files[0].base if self.files else 0
        self.log_end = self.files[-1].base + self.seg_size if self.files else 0
        # A view's snapshot is the progress file it read when it opened, before it listed any
        # file, so that every file the snapshot names is one the view has; a writer's own
        # scan reads the file now.
        flushed = (
            store.progress_at_open if store.read_only else FlushProgress.read(store.path / "config")
        )
        self.durable_end = flushed.flushed_offset if flushed is not None else None
        self.crashed = (store.path / "abort").exists()
        # Queue lengths at the snapshot ("topic/queueId" -> length); None: no bound.
        self.queue_lengths: dict[str, int] | None = None
        if store.read_only and is_locked_elsewhere(store.path):
            if flushed is not None and flushed.flushed_offset >= self.base0:
                self.log_end = min(self.log_end, flushed.flushed_offset)
                self.queue_lengths = flushed.queues
            else:
                self.log_end = min(self.log_end, store.commitlog.max_offset)
            self.report.snapshot_end = self.log_end
        self._arrays: dict[int, npt.NDArray[np.uint8]] = {}
        # The oldest segments, held open for the scan: retention deletes from the oldest on,
        # and a file held open stays readable after its name goes, so a scan of a live store
        # is not started over for them (see verify_read_only).
        self._pins = contextlib.ExitStack()
        self._queue_pins = 0
        if store.read_only:
            for mf in self.files[:PINNED_SEGMENTS]:
                self._pins.enter_context(mf.pinned())
        # Where the log began once the queues were listed (note_retention): records before it
        # were deleted by retention during the scan, and their queues' files with them.
        self.retained_from = self.base0
        self._counts: dict[tuple[str, str], int] = {}
        self.topic_ids: dict[bytes, int] = {}
        self.topics: list[str] = []
        self.damaged: list[tuple[int, int]] = []  # [start, end) of each damaged stretch
        self.damaged_starts: I64 = np.zeros(0, dtype=np.int64)
        self.damaged_ends: I64 = np.zeros(0, dtype=np.int64)
        self.spans_stale = False  # damaged_starts/ends lag behind damaged
        self.cl_total = sum(mf.size for mf in self.files)
        self.done = 0
        self.total = self.cl_total
        index_files = store.index.files if store.index is not None else []
        for f in index_files:
            self.total += index_file_size(f.slot_num, f.index_num)
        # The ConsumeQueue files are added when they are listed (QueueChecker.list_files).

    def hold(self, files: Sequence[SegmentFile]) -> None:
        """Keep ``files`` (a queue's, all but its last) readable to the end of a view's scan,
        as the oldest segments are (``_pins``, :meth:`SegmentFile.pinned`), while fewer than
        :data:`PINNED_QUEUE_FILES` and a quarter of the descriptor budget are held: retention
        may delete them before the scan reads them."""
        if not self.store.read_only:
            return
        room = min(PINNED_QUEUE_FILES, mappings.descriptor_budget() // 4) - self._queue_pins
        for mf in files[: max(0, room)]:
            self._pins.enter_context(mf.pinned())
            self._queue_pins += 1

    def note_retention(self) -> None:
        """Take :attr:`retained_from` as the first segment of the scan still in the directory
        now (the scan holds the oldest ones mapped, see ``_pins``, but retention may have
        deleted the ConsumeQueue files that pointed into them before they were listed)."""
        self.retained_from = next(
            (mf.base for mf in self.log.segments.files if self.log.segments.exists(mf)),
            self.log_end,
        )

    def problem(self, kind: str, path: str | Path, offset: int, detail: str) -> None:
        """Report a problem; past ``max_per_kind`` of its kind in its file, only count it."""
        key = (kind, str(path))
        seen = self._counts.get(key, 0)
        self._counts[key] = seen + 1
        if self.max_per_kind is not None and seen >= self.max_per_kind:
            self.report.suppressed += 1
            return
        self.report.problems.append(Problem(kind, str(path), int(offset), detail))

    def tick(self, done: int) -> None:
        """``done`` bytes of :attr:`total` are scanned: tell ``progress``."""
        self.done = done
        if self.progress is not None:
            self.progress(min(done, self.total), self.total)

    def release(self) -> None:
        """Drop the segment arrays: views of the mappings must not outlive the scan."""
        self._arrays.clear()
        self._pins.close()

    def array(self, i: int) -> npt.NDArray[np.uint8]:
        """Segment ``i`` as a byte array. Only the last few are kept: each pins its segment's
        mapping, and with it a descriptor (see :mod:`rocketstore.pipeline.files.mappings`)."""
        a = self._arrays.pop(i, None)
        if a is None:
            a = np.frombuffer(self.files[i].buffer, dtype=np.uint8)
        self._arrays[i] = a
        while len(self._arrays) > KEPT_ARRAYS:
            del self._arrays[next(iter(self._arrays))]
        return a

    def mark(self, phys: int, end: int | None) -> None:
        """Note a damaged record (or hole) at ``phys``, reaching to the next boundary ``end``."""
        stop = self.log_end if end is None else end
        self.damaged.append((phys, stop))
        self.report.damaged_bytes += stop - phys
        self.spans_stale = True

    def repair_note(self, phys: int) -> str:
        """Why a record past the durable point lacks a unit or an entry, and what repairs it."""
        if self.durable_end is not None and phys >= self.durable_end:
            where = f"past the durable point {self.durable_end} (config/rocketstore.json)"
        elif self.durable_end is None and self.crashed:
            where = "after a writer stopped without closing the store (abort file present)"
        else:
            return ""
        return (
            f"; the record is {where}: the writer stopped before dispatching it, and "
            "`rocketstore recover` (or the next writable open) repairs it"
        )

    def seg_index(self, phys: int) -> int:
        """The place in :attr:`files` of the segment holding ``phys``."""
        return self.log.segments.index_of(phys)

    def topic_name(self, tid: int) -> str:
        return self.topics[tid] if 0 <= tid < len(self.topics) else "?"

    def topic_id(self, topic: str) -> int:
        return self.raw_topic_id(topic.encode("utf-8"))

    def raw_topic_id(self, raw: bytes) -> int:
        """The store-wide id of a stored topic name; -2 when it is not valid UTF-8."""
        tid = self.topic_ids.get(raw)
        if tid is None:
            try:
                topic = raw.decode("utf-8")
            except UnicodeDecodeError:
                return -2
            tid = self.topic_ids[raw] = len(self.topics)
            self.topics.append(topic)
        return tid

    def record_path(self, phys: int) -> str:
        return self.files[self.seg_index(phys)].where

    def record_at(self, phys: int) -> native.Walk | None:
        """The one whole, valid record (UTF-8 topic included) at ``phys``, or None."""
        if not self.base0 <= phys < self.log_end:
            return None
        mf = self.files[self.seg_index(phys)]
        limit = min(mf.size, self.log_end - mf.base)
        w = native.walk(mf.buffer, phys - mf.base, limit, mf.base, check_crc=True, max_records=1)
        if len(w) != 1 or self.raw_topic_id(w.raw_topics[0]) == -2:
            return None
        return w

    def lookup(self, seg: Segment, offsets: I64) -> tuple[I64, Bools, Bools]:
        """(record row, is a valid record start, lies in a damaged stretch) per offset."""
        n = len(seg)
        if n:
            rows = np.minimum(np.searchsorted(seg.phys, offsets), n - 1)
            found = seg.phys[rows] == offsets
        else:
            rows = np.zeros(len(offsets), dtype=np.int64)
            found = np.zeros(len(offsets), dtype=bool)
        # Inside a damaged stretch: what is there cannot be checked (the stretch is reported).
        if self.spans_stale:
            spans = np.asarray(sorted(self.damaged), dtype=np.int64).reshape(-1, 2)
            self.damaged_starts, self.damaged_ends = spans[:, 0].copy(), spans[:, 1].copy()
            self.spans_stale = False
        if len(self.damaged_starts):
            span = np.searchsorted(self.damaged_starts, offsets, side="right") - 1
            damaged = (span >= 0) & (offsets < self.damaged_ends[np.maximum(span, 0)])
        else:
            damaged = np.zeros(len(offsets), dtype=bool)
        return rows.astype(np.int64), found, damaged
