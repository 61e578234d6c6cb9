"""The ConsumeQueue files of a scan, and the first look at them (see
:mod:`rocketstore.pipeline.tools.verify.queues`, whose checker builds on this).

:class:`QueueLoader` lists every queue's files, then reads each queue once before the
CommitLog walk: it finds each queue's first real unit and last valid one, reports holes,
garbage after the end and units past the log, and notes per file which units the
segment-by-segment checks will meet, in arrays over every file of every queue.

What it costs follows the units, not the queues or the files' capacity: a file is read up to
its last data (``SEEK_DATA``/``SEEK_HOLE``; a 6,000,000-byte file holding ten units is one
page), with ``pread`` when that is at most :data:`READ_MAX` bytes and through its mapping when
more (so 40,000 small queues map nothing), and the small one-file queues are looked at
:data:`LOAD_BATCH` at a time with array operations (:func:`~rocketstore.pipeline.tools.verify.units.first_look`).
Queues the store has not loaded are listed for the scan alone and closed with it, so a scan
leaves a store of 40,000 queues as lightly loaded as it found it.

Not thread-safe; one scan's.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline.files.consumequeue.queue import ConsumeQueue
from rocketstore.pipeline.files.segmentread import SegmentFile, unit_index, unit_position
from rocketstore.pipeline.files.segments import SegmentQueue
from rocketstore.pipeline.layout import CQ_UNIT_SIZE, PRE_BLANK_SIZE, UNIT_DTYPE
from rocketstore.pipeline.tools.verify.state import I64, Bools, Scan
from rocketstore.pipeline.tools.verify.units import UnitColumns, first_look

# Bytes of a ConsumeQueue file's units read with pread; a file holding more is read through its
# mapping (a copy of that much per file would cost more than the mapping does).
READ_MAX = 64 * 1024
LOAD_BATCH = 2048  # queues read, then looked at, at once (see QueueLoader.load)
LOAD_BYTES = 2 << 20  # ... at most about this many bytes of their units
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"  # its tagsCode is a delivery time, not a tag hash


@dataclasses.dataclass(slots=True)
class UnitFile:
    """One ConsumeQueue file of a queue: the units of it to check are ``[lo, hi)`` (relative to
    the file), whose offsets lie in ``[min_off, max_off]`` (``min_off > max_off``: none)."""

    mf: SegmentFile
    k0: int  # unit number (relative to the queue's first) of the file's unit 0
    lo: int
    hi: int
    min_off: int
    max_off: int
    ascending: bool  # the offsets of units lo .. hi never go down: bisect them


@dataclasses.dataclass(slots=True)
class QueueRecord:
    """One ConsumeQueue: its files, the units checked (``lead`` to ``last``) and, per unit
    from ``lead`` to ``last``, whether it matched its record."""

    cq: ConsumeQueue
    files: list[SegmentFile]
    index: int  # in QueueChecker.queues
    tid: int  # store-wide topic id
    first: int  # queue offset of unit 0 of its first file
    length: int  # units in the files (up to the snapshot's length)
    held: list[int]  # per file: units worth reading (past them, up to its end, only zeros)
    lead: int  # first unit that is not a pre-blank
    last: int  # last valid unit
    parts: list[UnitFile]
    part0: int  # the scan's number of its first file (QueueChecker's per-file arrays)
    good: Bools  # unit lead + i matches its record (filled in segment by segment)
    held_units: bool  # its checked units are in QueueChecker.columns


class QueueLoader:
    """The queues of a scan: their files, records (:attr:`queues`), the held units of the
    small ones (:attr:`columns`), per-file and per-queue arrays, and the one byte per unit
    that says whether it matched its record (:attr:`QueueRecord.good`)."""

    def __init__(self, scan: Scan) -> None:
        self.scan = scan
        self.queues: list[QueueRecord] = []
        self.queue_of: dict[tuple[int, int], QueueRecord] = {}
        # Each queue's files (see list_files), and the listings made for the scan.
        self._files: dict[tuple[str, int], list[SegmentFile]] = {}
        self._listings: list[SegmentQueue] = []
        # Every file of every queue, in queue order: the range of its checked units' offsets,
        # its queue (an index into ``queues``) and its number in the queue.
        self._min_off: I64 = np.zeros(0, dtype=np.int64)
        self._max_off: I64 = np.zeros(0, dtype=np.int64)
        self._part_queue: I64 = np.zeros(0, dtype=np.int64)
        self._part_file: I64 = np.zeros(0, dtype=np.int64)
        self._part_ascending: Bools = np.zeros(0, dtype=bool)
        # The checked units of small queues, and per queue what matching them needs.
        self.columns = UnitColumns()
        self._tid: I64 = np.zeros(0, dtype=np.int64)
        self._qid: I64 = np.zeros(0, dtype=np.int64)
        self._first: I64 = np.zeros(0, dtype=np.int64)
        self._lead: I64 = np.zeros(0, dtype=np.int64)
        self._good_at: I64 = np.zeros(0, dtype=np.int64)
        self._schedule: Bools = np.zeros(0, dtype=bool)
        # One byte per unit from each queue's first real unit to its last valid one (each
        # queue's ``good`` is a view of its stretch of it).
        self._good: Bools = np.zeros(0, dtype=bool)

    def release(self) -> None:
        """Drop the queues (and, with them, what refers to their mappings), and close the
        listings made for the scan."""
        self.queues.clear()
        self.queue_of.clear()
        for seg in self._listings:
            seg.close()
        self._listings.clear()
        self._files.clear()

    def list_files(self) -> None:
        """List every queue's files (adding them to the scan's total): a queue the store has
        loaded gives its own, the others are listed for the scan alone (and closed by
        :meth:`release`), so that a store of 40,000 queues does not load them all, nor keep
        them loaded after the scan."""
        for key, cq in sorted(self.scan.store.queues.items()):
            files: list[SegmentFile]
            if cq.loaded:
                files = list(cq.segments.files)
            else:
                seg = cq.listing()
                self._listings.append(seg)
                files = list(seg.files)
            self._files[key] = files
            self.scan.total += cq.file_size * len(files)
            self.scan.hold(files[:-1])
        self.scan.note_retention()

    def file_units(
        self, q: QueueRecord, n: int, start: int = 0, stop: int | None = None
    ) -> npt.NDArray[np.void]:
        """Units ``[start, stop)`` of the queue's file ``n``, up to the units it holds
        (:attr:`QueueRecord.held`): read with ``pread`` when they are few, else a view of the
        mapping, to be dropped before the next file is used (mappings are bounded)."""
        held = q.held[n]
        stop = held if stop is None else max(start, min(stop, held))
        mf = q.files[n]
        if held * CQ_UNIT_SIZE > READ_MAX:
            return np.frombuffer(mf.buffer, dtype=UNIT_DTYPE, count=held)[start:stop]
        out = np.empty(stop - start, dtype=UNIT_DTYPE)
        mf.read_into(start * CQ_UNIT_SIZE, out.view(np.uint8).data)
        return out

    def load(self) -> None:
        """Read every queue before the walk (its units guide resynchronisation): find each
        one's first real unit and last valid one, report holes, garbage after the end and
        units past the log, and note per file which units the segment checks will meet.

        Queues are taken :data:`LOAD_BATCH` at a time (fewer when they hold more than
        :data:`LOAD_BYTES`): the small one-file queues of a batch are read, then looked at
        all at once (:func:`first_look`); the others, and any small one with something to
        report, one by one, in order."""
        part, held = 0, 0
        batch: list[QueueRecord] = []
        for key, cq in sorted(self.scan.store.queues.items()):
            files = self._files.get(key)
            if not files:
                continue
            q = self._record(cq, files)
            q.part0 = part
            part += len(files)
            held += sum(q.held)
            batch.append(q)
            if len(batch) >= LOAD_BATCH or held * CQ_UNIT_SIZE >= LOAD_BYTES:
                self._load_batch(batch)
                batch, held = [], 0
        self._load_batch(batch)
        self.columns.freeze()
        every = [uf for q in self.queues for uf in q.parts]
        self._min_off = np.array([uf.min_off for uf in every], dtype=np.int64)
        self._max_off = np.array([uf.max_off for uf in every], dtype=np.int64)
        self._part_ascending = np.array([uf.ascending for uf in every], dtype=bool)
        self._part_queue = np.array([q.index for q in self.queues for _ in q.parts], dtype=np.int64)
        self._part_file = np.array(
            [n for q in self.queues for n in range(len(q.parts))], dtype=np.int64
        )
        self._tid = np.array([q.tid for q in self.queues], dtype=np.int64)
        self._qid = np.array([q.cq.queue_id for q in self.queues], dtype=np.int64)
        self._first = np.array([q.first for q in self.queues], dtype=np.int64)
        self._lead = np.array([q.lead for q in self.queues], dtype=np.int64)
        self._schedule = np.array([q.cq.topic == SCHEDULE_TOPIC for q in self.queues], dtype=bool)
        widths = np.array([q.last + 1 - q.lead for q in self.queues], dtype=np.int64)
        self._good_at = np.cumsum(widths) - widths
        self._good = np.zeros(int(widths.sum()), dtype=bool)
        for q, at, width in zip(self.queues, self._good_at.tolist(), widths.tolist(), strict=True):
            q.good = self._good[at : at + width]

    def _load_batch(self, batch: list[QueueRecord]) -> None:
        small = [
            i
            for i, q in enumerate(batch)
            if len(q.files) == 1 and q.held[0] * CQ_UNIT_SIZE <= READ_MAX
        ]
        # The small queues' units, read one after another into one array.
        counts = np.array([batch[i].held[0] for i in small], dtype=np.int64)
        ends = np.cumsum(counts)
        units = np.empty(int(ends[-1]) if small else 0, dtype=UNIT_DTYPE)
        raw = units.view(np.uint8).data
        for i, end, count in zip(small, ends.tolist(), counts.tolist(), strict=True):
            batch[i].files[0].read_into(0, raw[(end - count) * CQ_UNIT_SIZE : end * CQ_UNIT_SIZE])
        read = [
            units[end - count : end]
            for end, count in zip(ends.tolist(), counts.tolist(), strict=True)
        ]
        if small:
            looked = first_look(
                units,
                counts,
                np.array([batch[i].length for i in small], dtype=np.int64),
                np.array([batch[i].cq.units_per_file for i in small], dtype=np.int64),
                self.scan.base0,
                self.scan.log_end,
            )
            held = self.columns.take_many(
                np.array([batch[i].part0 for i in small], dtype=np.int64),
                looked.clean,
                looked.checked,
            )
            for j, i in enumerate(small):
                if looked.clean[j]:
                    q = batch[i]
                    q.lead, q.last = int(looked.lead[j]), int(looked.last[j])
                    q.held_units = bool(held[j])
                    lo, hi = int(looked.lo[j]), int(looked.hi[j])
                    q.parts.append(
                        UnitFile(
                            q.files[0],
                            0,
                            lo,
                            hi,
                            int(looked.min_off[j]),
                            int(looked.max_off[j]),
                            bool(looked.ascending[j]),
                        )
                    )
        units_of = dict(zip(small, read, strict=True))
        for i, q in enumerate(batch):
            if not q.parts:  # not looked at, or something to report: one by one
                got = units_of.get(i)
                self._find_ends(q, None if got is None else [got])
                self._check_files(q, None if got is None else [got])
            q.index = len(self.queues)
            self.queues.append(q)
            self.queue_of[(q.tid, q.cq.queue_id)] = q
            self.scan.report.queues += 1
            self.scan.done += q.cq.file_size * len(q.files)
        self.scan.tick(self.scan.done)  # once a batch: a store of 40,000 queues is 40,000

    def _record(self, cq: ConsumeQueue, files: list[SegmentFile]) -> QueueRecord:
        """A queue's record, with the units each of its files holds (see
        :attr:`QueueRecord.held`), its ends not found yet."""
        per_file = cq.units_per_file
        first = unit_index(files[0].base, 0)
        length = per_file * len(files)
        if self.scan.queue_lengths is not None:
            # A writer is appending: units past the snapshot's length are not checked.
            length = min(
                length,
                max(0, self.scan.queue_lengths.get(f"{cq.topic}/{cq.queue_id}", 0) - first),
            )
        held = []
        for n, mf in enumerate(files):
            count = max(0, min(per_file, length - n * per_file))
            if count:
                count = min(count, -(-mf.data_end() // CQ_UNIT_SIZE))
            held.append(count)
        return QueueRecord(
            cq,
            files,
            -1,
            self.scan.topic_id(cq.topic),
            first,
            length,
            held,
            -1,
            -1,
            [],
            0,
            np.zeros(0, dtype=bool),
            False,
        )

    def _find_ends(self, q: QueueRecord, read: list[npt.NDArray[np.void]] | None) -> None:
        """Find the queue's first real unit and last valid one (``read``: its files' units,
        when read already)."""
        per_file = q.cq.units_per_file
        length = q.length
        # RocketMQ's "pre-blank" units fill a queue's first file up to its first unit.
        lead: int | None = None
        last = -1
        for n in range(len(q.files)):
            units = read[n] if read is not None else self.file_units(q, n)
            k0 = n * per_file
            if lead is None:
                real = np.flatnonzero(units["size"] != PRE_BLANK_SIZE)
                if len(real):
                    lead = k0 + int(real[0])
                elif len(units) < min(per_file, length - k0):
                    lead = k0 + len(units)  # the zeros past the file's data are not pre-blanks
            valid = np.flatnonzero((units["offset"] >= 0) & (units["size"] > 0))
            if len(valid):
                last = max(last, k0 + int(valid[-1]))
            del units
        q.lead = length if lead is None else lead
        q.last = max(last, q.lead - 1)

    def _check_files(self, q: QueueRecord, read: list[npt.NDArray[np.void]] | None) -> None:
        """Report a queue's holes, garbage after its end and units past the log, and note per
        file the units the segment checks will meet (:attr:`QueueRecord.parts`); a small queue's
        checked units go to :attr:`columns`."""
        per_file = q.cq.units_per_file
        stray, stray_at = 0, -1
        checked_units: list[tuple[int, I64, I64, I64, I64]] = []
        for n, mf in enumerate(q.files):
            units = read[n] if read is not None else self.file_units(q, n)
            k0 = n * per_file
            lo = min(len(units), max(0, q.lead - k0))
            hi = min(len(units), max(0, q.last + 1 - k0))
            offsets = units["offset"].astype(np.int64)
            sizes = units["size"].astype(np.int64)
            tags = units["tags_code"].astype(np.int64)
            del units
            invalid = np.flatnonzero((offsets[lo:hi] < 0) | (sizes[lo:hi] <= 0)) + lo
            for j in invalid.tolist():
                self.unit_problem(
                    q,
                    k0 + j,
                    "cq-hole",
                    f"invalid unit (offset {int(offsets[j])}, size {int(sizes[j])}) before "
                    f"the queue's last unit {q.first + q.last}: consumers stop here",
                )
            t = max(lo, hi)
            extra = np.flatnonzero((offsets[t:] != 0) | (sizes[t:] != 0) | (tags[t:] != 0))
            if len(extra):
                if stray_at < 0:
                    stray_at = k0 + t + int(extra[0])
                stray += len(extra)
            checked = (offsets[lo:hi] >= self.scan.base0) & (sizes[lo:hi] > 0)
            offs = offsets[lo:hi][checked]
            if read is not None:
                rows = np.flatnonzero(checked) + lo
                checked_units.append(
                    (q.part0 + n, k0 + rows, offsets[rows], sizes[rows], tags[rows])
                )
            q.parts.append(
                UnitFile(
                    mf,
                    k0,
                    lo,
                    hi,
                    int(offs.min()) if len(offs) else 1,
                    int(offs.max()) if len(offs) else 0,
                    bool(np.all(np.diff(offsets[lo:hi]) >= 0)),
                )
            )
            # Units past the log cannot meet a record in the segment-by-segment checks.
            for j in (
                np.flatnonzero(checked & (offsets[lo:hi] >= self.scan.log_end)) + lo
            ).tolist():
                self.points_nowhere(q, k0 + j, int(offsets[j]), int(sizes[j]))
        if stray:
            self.unit_problem(
                q,
                stray_at,
                "cq-garbage-after-end",
                f"{stray} non-zero unit(s) after the queue's last valid unit",
            )
        q.held_units = read is not None and self.columns.take(checked_units)

    def unit_location(self, q: QueueRecord, k: int) -> tuple[str, int]:
        base, position = unit_position(q.first + k, q.cq.file_size)
        return next(f.where for f in q.files if f.base == base), position

    def unit_problem(self, q: QueueRecord, k: int, kind: str, detail: str) -> None:
        path, pos = self.unit_location(q, k)
        self.scan.problem(
            kind, path, pos, f"{q.cq.topic}/{q.cq.queue_id} unit {q.first + k}: {detail}"
        )

    def points_nowhere(self, q: QueueRecord, k: int, offset: int, size: int) -> None:
        self.unit_problem(
            q,
            k,
            "cq-unit-points-nowhere",
            f"no record starts at CommitLog offset {offset} (unit size {size})",
        )
