"""The ConsumeQueue checks of a scan (see :mod:`rocketstore.pipeline.verify`).

:class:`QueueChecker` reads every queue before the CommitLog walk (whose resynchronisation
uses the unit offsets), then checks the units against each walked stretch of records, and,
once the walk is over, blames the units and records that contradict each other and checks
that good units follow the CommitLog order.
"""

from __future__ import annotations

import bisect
import dataclasses
from pathlib import Path

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline import native
from rocketstore.pipeline.config import CQ_UNIT_SIZE
from rocketstore.pipeline.consumequeue import PRE_BLANK_SIZE, UNIT_DTYPE, ConsumeQueue
from rocketstore.pipeline.mapped_file import MappedFile, segment_name
from rocketstore.pipeline.verify_state import I64, Bools, Scan, Segment

MAX_CQ_CANDIDATES = 256  # ConsumeQueue offsets tried as a resynchronisation point
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"  # its tagsCode is a delivery time, not a tag hash


@dataclasses.dataclass
class _UnitFile:
    """One ConsumeQueue file of a queue: the units of it to check are ``[lo, hi)`` (relative to
    the file), whose offsets lie in ``[min_off, max_off]`` (``min_off > max_off``: none)."""

    mf: MappedFile
    k0: int  # unit number (relative to the queue's first) of the file's unit 0
    lo: int
    hi: int
    min_off: int
    max_off: int
    ascending: bool  # the offsets of units lo .. hi never go down: bisect them


@dataclasses.dataclass
class _Queue:
    """One ConsumeQueue: its files, the units checked (``lead`` to ``last``) and, per unit,
    whether it matched its record."""

    cq: ConsumeQueue
    first: int  # queue offset of unit 0 of its first file
    length: int  # units in the files (up to the snapshot's length)
    lead: int  # first unit that is not a pre-blank
    last: int  # last valid unit
    parts: list[_UnitFile]
    good: Bools  # per unit: matches its record (filled in segment by segment)


@dataclasses.dataclass
class _Units:
    """Units of one file selected for checking, column by column (``k``: unit numbers)."""

    k: I64
    offsets: I64
    sizes: I64
    tags: I64


class QueueChecker:
    """Checks the ConsumeQueues against the CommitLog's records.

    Shares with the rest of the scan, through ``scan``: the snapshot bound (the log's range,
    each queue's length), the report and its counters (queues, units), topic ids, the damaged
    stretches (units pointing into them are not checked) and the segments (a record's file and
    TAGS, for a problem's text). Gives the CommitLog walker the unit offsets it resynchronises
    on (:meth:`starts_after`). Its own: the queues' files and per-unit results, and the
    disagreements left to blame once the walk is over."""

    def __init__(self, scan: Scan) -> None:
        self.scan = scan
        self.queues: list[_Queue] = []
        self.queue_of: dict[tuple[int, int], _Queue] = {}
        # Units that point at a record of another queue that no unit claims: which side is
        # wrong is known only once every unit has been matched (queue, unit, record fields).
        self.mismatched: list[tuple[_Queue, int, int, int, int, int]] = []

    def release(self) -> None:
        """Drop the queues (and, with them, what refers to their mappings)."""
        self.queues.clear()
        self.queue_of.clear()

    def file_units(self, q: _Queue, n: int) -> npt.NDArray[np.void]:
        """The units of the queue's file ``n`` (up to the snapshot's length): a view of the
        mapping, to be dropped before the next file is used (mappings are bounded)."""
        per_file = q.cq.units_per_file
        count = max(0, min(per_file, q.length - n * per_file))
        mf = q.cq.segments.files[n]
        return np.frombuffer(mf.buffer, dtype=UNIT_DTYPE, count=per_file)[:count]

    def checked_units(
        self,
        q: _Queue,
        uf: _UnitFile,
        n: int,
        lo: int = 0,
        hi: int = 1 << 62,
        most: int | None = None,
    ) -> _Units:
        """The units of file ``n`` that are checked against their records: valid ones from the
        queue's first real unit to its last valid one, whose records retention has not
        deleted; when the file's offsets ascend, only those pointing into ``[lo, hi)``, and
        of them at most the first ``most`` (else the caller filters)."""
        units = self.file_units(q, n)
        a, b = uf.lo, uf.hi
        if uf.ascending:
            offset = units["offset"]
            a = bisect.bisect_left(offset, lo, a, b, key=int)
            b = bisect.bisect_left(offset, hi, a, b, key=int)
            if most is not None:
                b = min(b, a + most)
        units = units[a:b]
        offsets = units["offset"].astype(np.int64)
        sizes = units["size"].astype(np.int64)
        keep = np.flatnonzero((offsets >= self.scan.base0) & (sizes > 0))
        return _Units(
            k=uf.k0 + a + keep,
            offsets=offsets[keep],
            sizes=sizes[keep],
            tags=units["tags_code"][keep].astype(np.int64),
        )

    def load(self) -> None:
        """Read every queue before the walk (its units guide resynchronisation): find each
        one's first real unit and last valid one, report holes, garbage after the end and
        units past the log, and note per file which units the segment checks will meet."""
        for (_, _), cq in sorted(self.scan.store.queues.items()):
            files = list(cq.segments.files)
            if not files:
                continue
            per_file = cq.units_per_file
            first = files[0].base // CQ_UNIT_SIZE
            length = per_file * len(files)
            if self.scan.queue_lengths is not None:
                # A writer is appending: units past the snapshot's length are not checked.
                length = min(
                    length,
                    max(0, self.scan.queue_lengths.get(f"{cq.topic}/{cq.queue_id}", 0) - first),
                )
            q = _Queue(cq, first, length, -1, -1, [], np.zeros(0, dtype=bool))
            # RocketMQ's "pre-blank" units fill a queue's first file up to its first unit.
            lead: int | None = None
            last = -1
            for n in range(len(files)):
                units = self.file_units(q, n)
                k0 = n * per_file
                if lead is None:
                    real = np.flatnonzero(units["size"] != PRE_BLANK_SIZE)
                    if len(real):
                        lead = k0 + int(real[0])
                valid = np.flatnonzero((units["offset"] >= 0) & (units["size"] > 0))
                if len(valid):
                    last = max(last, k0 + int(valid[-1]))
                del units
            q.lead = length if lead is None else lead
            q.last = max(last, q.lead - 1)
            q.good = np.zeros(length, dtype=bool)
            stray, stray_at = 0, -1
            for n, mf in enumerate(files):
                units = self.file_units(q, n)
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
                q.parts.append(
                    _UnitFile(
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
            self.queues.append(q)
            self.queue_of[(self.scan.topic_id(cq.topic), cq.queue_id)] = q
            self.scan.report.queues += 1
            self.scan.tick(self.scan.done + cq.file_size * len(files))

    def unit_location(self, q: _Queue, k: int) -> tuple[Path, int]:
        per_file = q.cq.units_per_file
        return q.cq.segments.files[k // per_file].path, (k % per_file) * CQ_UNIT_SIZE

    def unit_problem(self, q: _Queue, k: int, kind: str, detail: str) -> None:
        path, pos = self.unit_location(q, k)
        self.scan.problem(
            kind, path, pos, f"{q.cq.topic}/{q.cq.queue_id} unit {q.first + k}: {detail}"
        )

    def points_nowhere(self, q: _Queue, k: int, offset: int, size: int) -> None:
        self.unit_problem(
            q,
            k,
            "cq-unit-points-nowhere",
            f"no record starts at CommitLog offset {offset} (unit size {size})",
        )

    def starts_after(self, phys: int) -> I64:
        """The nearest :data:`MAX_CQ_CANDIDATES` distinct unit offsets after ``phys``, over all
        queues, ascending: where the CommitLog walk may go on after a damaged record."""
        found: list[I64] = []
        for q in self.queues:
            # A queue's units ascend: its first files past ``phys`` hold its nearest offsets.
            have = 0
            for n, uf in enumerate(q.parts):
                if uf.max_off <= phys:
                    continue
                offsets = self.checked_units(q, uf, n, phys + 1, most=MAX_CQ_CANDIDATES).offsets
                later = offsets[offsets > phys]
                found.append(later)
                have += len(later)
                if have >= MAX_CQ_CANDIDATES:
                    break
        if not found:
            return np.zeros(0, dtype=np.int64)
        near: I64 = np.unique(np.concatenate(found))[:MAX_CQ_CANDIDATES]
        return near

    def check(self, seg: Segment, lo: int, hi: int) -> None:
        """Check the units that point into ``[lo, hi)`` (inside one segment) against the
        walked records ``seg`` of that stretch, and that each of its records that belongs in a
        ConsumeQueue has its unit."""
        n = len(seg)
        claimed = np.zeros(n, dtype=bool)
        pointed = np.zeros(n, dtype=bool)
        joined: list[tuple[_Queue, _Units, I64, Bools, Bools, Bools]] = []
        for q in self.queues:
            tid = self.scan.topic_id(q.cq.topic)
            for f, uf in enumerate(q.parts):
                if uf.max_off < lo or uf.min_off >= hi:
                    continue
                units = self.checked_units(q, uf, f, lo, hi)
                into = np.flatnonzero((units.offsets >= lo) & (units.offsets < hi))
                units = _Units(
                    units.k[into], units.offsets[into], units.sizes[into], units.tags[into]
                )
                rows, found, damaged = self.scan.lookup(seg, units.offsets)
                matched = (
                    found
                    & (seg.topic_ids[rows] == tid)
                    & (seg.queue_ids[rows] == q.cq.queue_id)
                    & (seg.queue_offsets[rows] == q.first + units.k)
                )
                claimed[rows[matched]] = True
                pointed[rows[found]] = True
                q.good[units.k[matched]] = True
                joined.append((q, units, rows, found, damaged, matched))
                self.scan.report.units += int(np.count_nonzero(found))
        for q, units, rows, found, damaged, matched in joined:
            for j in np.flatnonzero(~found & ~damaged).tolist():
                self.points_nowhere(q, int(units.k[j]), int(units.offsets[j]), int(units.sizes[j]))
            for j in np.flatnonzero(found & ~matched).tolist():
                u, r = int(units.k[j]), int(rows[j])
                phys = int(seg.phys[r])
                fields = (int(seg.topic_ids[r]), int(seg.queue_ids[r]), int(seg.queue_offsets[r]))
                if claimed[r]:
                    self.unit_problem(
                        q,
                        u,
                        "cq-unit-wrong-queue",
                        f"points at the record at {phys}, which is {self.says(*fields)} and has "
                        "its own unit",
                    )
                else:
                    self.mismatched.append((q, u, phys, *fields))
            fine = np.flatnonzero(matched)
            for j in fine[units.sizes[fine] != seg.sizes[rows[fine]]].tolist():
                r = int(rows[j])
                self.unit_problem(
                    q,
                    int(units.k[j]),
                    "cq-unit-size-mismatch",
                    f"size {int(units.sizes[j])}, but the record at {int(seg.phys[r])} is "
                    f"{int(seg.sizes[r])} bytes",
                )
            if q.cq.topic != SCHEDULE_TOPIC:
                for j in fine[units.tags[fine] != seg.tags_codes[rows[fine]]].tolist():
                    r = int(rows[j])
                    phys = int(seg.phys[r])
                    self.unit_problem(
                        q,
                        int(units.k[j]),
                        "cq-unit-tags-code",
                        f"tagsCode {int(units.tags[j])}, but the record at {phys} has TAGS "
                        f"{self.tags_of(phys)!r} (hash {int(seg.tags_codes[r])}): the unit or "
                        "the record's TAGS property is damaged",
                    )
            dispatchable = seg.dispatchable()
            for j in fine[~dispatchable[rows[fine]]].tolist():
                r = int(rows[j])
                self.unit_problem(
                    q,
                    int(units.k[j]),
                    "cq-unit-not-dispatchable",
                    f"the record at {int(seg.phys[r])} is a PREPARED or ROLLBACK "
                    f"transaction (sysflag 0x{int(seg.sys_flags[r]) & 0xFFFFFFFF:X})",
                )
        self.check_missing_units(seg, pointed)

    def says(self, tid: int, qid: int, qoff: int) -> str:
        return f"{self.scan.topic_name(tid)}/{qid} offset {qoff}"

    def tags_of(self, phys: int) -> str | None:
        """The TAGS property of the valid record at ``phys``, for a problem's text."""
        mf = self.scan.files[self.scan.seg_index(phys)]
        batch = native.decode(
            mf.buffer,
            np.array([phys - mf.base], dtype=np.int64),
            mf.base,
            path=str(mf.path),
            limit=min(mf.size, self.scan.log_end - mf.base),
            columns=native.Columns.TAGS,
        )
        tags: str | None = batch.column("tags")[0].as_py()
        return tags

    def check_missing_units(self, seg: Segment, pointed: Bools) -> None:
        root = self.scan.store.path / "consumequeue"
        file_size = self.scan.store.config.mapped_file_size_consume_queue
        for r in np.flatnonzero(seg.dispatchable() & ~pointed).tolist():
            topic = self.scan.topic_name(int(seg.topic_ids[r]))
            qid, qoff = int(seg.queue_ids[r]), int(seg.queue_offsets[r])
            phys = int(seg.phys[r])
            pos = qoff * CQ_UNIT_SIZE
            base = pos - pos % file_size
            where = root / topic / str(qid)
            self.scan.problem(
                "cq-missing-unit",
                where / segment_name(base) if pos >= 0 else where,
                pos - base if pos >= 0 else pos,
                f"no unit points at the record at {phys} ({topic}/{qid} offset {qoff})"
                + self.scan.repair_note(phys),
            )

    def check_mismatched(self) -> None:
        """Blame each unit that points at another queue's unclaimed record, or that record.

        The unit is wrong when the unit at the record's own coordinates points at yet another
        record that does not claim it either (units swapped or shifted); otherwise the record
        is, once."""
        blamed: set[int] = set()
        for q, u, phys, tid, qid, qoff in self.mismatched:
            says = self.says(tid, qid, qoff)
            if self.slot_misused(tid, qid, qoff):
                self.unit_problem(
                    q,
                    u,
                    "cq-unit-wrong-queue",
                    f"points at the record at {phys}, which is {says}, where the unit points "
                    "at yet another record (units swapped or shifted)",
                )
            elif phys not in blamed:
                blamed.add(phys)
                path, pos = self.unit_location(q, u)
                self.scan.problem(
                    "commitlog-record-mismatch",
                    self.scan.record_path(phys),
                    phys,
                    f"record says {says}, but it is unit {q.first + u} of "
                    f"{q.cq.topic}/{q.cq.queue_id} ({path} @ {pos}) and no unit of its own "
                    "points at it",
                )
        self.mismatched.clear()

    def slot_misused(self, tid: int, qid: int, qoff: int) -> bool:
        q = self.queue_of.get((tid, qid))
        if q is None:
            return False
        u = qoff - q.first
        if not (q.lead <= u <= q.last and u < q.length) or q.good[u]:
            return False
        per_file = q.cq.units_per_file
        n = u // per_file
        unit = self.file_units(q, n)[u % per_file]
        offset, size = int(unit["offset"]), int(unit["size"])
        return offset >= self.scan.base0 and size > 0

    def check_ascending(self) -> None:
        """Units that match their records must follow the CommitLog order."""
        for q in self.queues:
            prev: tuple[int, int] | None = None  # (unit, offset) of the last good unit
            for n, uf in enumerate(q.parts):
                units = self.checked_units(q, uf, n)
                good = np.flatnonzero(q.good[units.k])
                k, offs = units.k[good], units.offsets[good]
                if prev is not None and len(k):
                    k = np.concatenate([[prev[0]], k])
                    offs = np.concatenate([[prev[1]], offs])
                for j in (np.flatnonzero(np.diff(offs) <= 0) + 1).tolist():
                    self.unit_problem(
                        q,
                        int(k[j]),
                        "cq-not-ascending",
                        f"offset {int(offs[j])} is not after the previous unit's "
                        f"{int(offs[j - 1])}",
                    )
                if len(k):
                    prev = (int(k[-1]), int(offs[-1]))
