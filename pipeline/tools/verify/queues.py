"""The ConsumeQueue checks of a scan (see :mod:`rocketstore.pipeline.tools.verify.check`).

:class:`QueueChecker` reads every queue before the CommitLog walk (whose resynchronisation
uses the unit offsets; :mod:`rocketstore.pipeline.tools.verify.load`), then checks the units
against each walked stretch of records, and, once the walk is over, blames the units and
records that contradict each other and checks that good units follow the CommitLog order.
"""

from __future__ import annotations

import bisect
import dataclasses

import numpy as np

from rocketstore.pipeline.files.localsegments import LocalSegments
from rocketstore.pipeline.files.segmentread import unit_position
from rocketstore.pipeline.format import native
from rocketstore.pipeline.layout import CQ_UNIT_SIZE
from rocketstore.pipeline.tools.verify.load import (
    SCHEDULE_TOPIC,
    QueueLoader,
    QueueRecord,
    UnitFile,
)
from rocketstore.pipeline.tools.verify.state import I64, Bools, Scan, Segment

MAX_CQ_CANDIDATES = 256  # ConsumeQueue offsets tried as a resynchronisation point


@dataclasses.dataclass
class _Units:
    """Units of one file selected for checking, column by column (``k``: unit numbers)."""

    k: I64
    offsets: I64
    sizes: I64
    tags: I64


class QueueChecker(QueueLoader):
    """Checks the ConsumeQueues against the CommitLog's records.

    Shares with the rest of the scan, through ``scan``: the snapshot bound (the log's range,
    each queue's length), the report and its counters (queues, units), topic ids, the damaged
    stretches (units pointing into them are not checked) and the segments (a record's file and
    TAGS, for a problem's text). Gives the CommitLog walker the unit offsets it resynchronises
    on (:meth:`starts_after`). Its own: the queues' files and per-unit results, and the
    disagreements left to blame once the walk is over.

    What it costs follows the units, not the queues or the files' capacity: a file is read up
    to its last data (``SEEK_DATA``/``SEEK_HOLE``; a 6,000,000-byte file holding ten units is
    one page), with ``pread`` when that is at most :data:`READ_MAX` bytes and through its
    mapping when more (so 40,000 small queues map nothing); the per-unit results are one byte
    per unit between a queue's first and last; and a stretch of the log, or a resynchronisation
    point, looks at the files whose units point near it, found in arrays over all files
    rather than by visiting every queue."""

    def __init__(self, scan: Scan) -> None:
        super().__init__(scan)
        # Units that point at a record of another queue that no unit claims: which side is
        # wrong is known only once every unit has been matched (queue, unit, record fields).
        self.mismatched: list[tuple[QueueRecord, int, int, int, int, int]] = []

    def checked_units(
        self,
        q: QueueRecord,
        uf: UnitFile,
        n: int,
        lo: int = 0,
        hi: int = 1 << 62,
        most: int | None = None,
    ) -> _Units:
        """The units of file ``n`` that are checked against their records: valid ones from the
        queue's first real unit to its last valid one, whose records retention has not
        deleted; when the file's offsets ascend, only those pointing into ``[lo, hi)``, and
        of them at most the first ``most`` (else the caller filters)."""
        a = uf.lo
        units = self.file_units(q, n, uf.lo, uf.hi)
        if uf.ascending:
            offset = units["offset"]
            i = bisect.bisect_left(offset, lo, 0, len(units), key=int)
            j = bisect.bisect_left(offset, hi, i, len(units), key=int)
            if most is not None:
                j = min(j, i + most)
            units = units[i:j]
            a += i
        offsets = units["offset"].astype(np.int64)
        sizes = units["size"].astype(np.int64)
        keep = np.flatnonzero((offsets >= self.scan.base0) & (sizes > 0))
        return _Units(
            k=uf.k0 + a + keep,
            offsets=offsets[keep],
            sizes=sizes[keep],
            tags=units["tags_code"][keep].astype(np.int64),
        )

    def starts_after(self, phys: int) -> I64:
        """The nearest :data:`MAX_CQ_CANDIDATES` distinct unit offsets after ``phys``, over all
        queues, ascending: where the CommitLog walk may go on after a damaged record.

        Queues are visited nearest first (by the lowest offset any of their files past
        ``phys`` holds), and no further once that lowest offset is past the nearest ones
        found: the rest could not change them."""
        later = np.flatnonzero(self._max_off > phys)
        if not len(later):
            return np.zeros(0, dtype=np.int64)
        lowest = np.full(len(self.queues), np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(lowest, self._part_queue[later], self._min_off[later])
        candidates = np.unique(self._part_queue[later])
        near: I64 = np.zeros(0, dtype=np.int64)
        for i in candidates[np.argsort(lowest[candidates], kind="stable")].tolist():
            if len(near) >= MAX_CQ_CANDIDATES and lowest[i] >= near[-1]:
                break
            q = self.queues[i]
            # A queue's units ascend: its first files past ``phys`` hold its nearest offsets.
            found: list[I64] = [near]
            have = 0
            for n, uf in enumerate(q.parts):
                if uf.max_off <= phys:
                    continue
                offsets = self.checked_units(q, uf, n, phys + 1, most=MAX_CQ_CANDIDATES).offsets
                nearer = offsets[offsets > phys]
                found.append(nearer)
                have += len(nearer)
                if have >= MAX_CQ_CANDIDATES:
                    break
            near = np.unique(np.concatenate(found))[:MAX_CQ_CANDIDATES]
        return near

    def check(self, seg: Segment, lo: int, hi: int) -> None:
        """Check the units that point into ``[lo, hi)`` (inside one segment) against the
        walked records ``seg`` of that stretch, and that each of its records that belongs in a
        ConsumeQueue has its unit."""
        n = len(seg)
        claimed = np.zeros(n, dtype=bool)
        pointed = np.zeros(n, dtype=bool)
        dispatchable = seg.dispatchable()
        # Per file (its number in the scan), what its units that point into the stretch met.
        joined: list[tuple[int, QueueRecord, _Units, I64, Bools, Bools, Bools]] = []
        # The files whose units may point into the stretch, of the queues whose units are
        # not held: read one by one.
        near = np.flatnonzero((self._max_off >= lo) & (self._min_off < hi))
        for part, i, f in zip(
            near.tolist(),
            self._part_queue[near].tolist(),
            self._part_file[near].tolist(),
            strict=True,
        ):
            q = self.queues[i]
            if q.held_units:
                continue
            units = self.checked_units(q, q.parts[f], f, lo, hi)
            into = np.flatnonzero((units.offsets >= lo) & (units.offsets < hi))
            units = _Units(units.k[into], units.offsets[into], units.sizes[into], units.tags[into])
            rows, found, damaged = self.scan.lookup(seg, units.offsets)
            matched = (
                found
                & (seg.topic_ids[rows] == q.tid)
                & (seg.queue_ids[rows] == q.cq.queue_id)
                & (seg.queue_offsets[rows] == q.first + units.k)
            )
            claimed[rows[matched]] = True
            pointed[rows[found]] = True
            q.good[units.k[matched] - q.lead] = True
            joined.append((part, q, units, rows, found, damaged, matched))
            self.scan.report.units += int(np.count_nonzero(found))
        joined += self._check_held(seg, lo, hi, claimed, pointed, dispatchable)
        # Problems in the order of the files, as if each had been read in turn.
        joined.sort(key=lambda j: j[0])
        for _, q, units, rows, found, damaged, matched in joined:
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

    def _check_held(
        self, seg: Segment, lo: int, hi: int, claimed: Bools, pointed: Bools, dispatchable: Bools
    ) -> list[tuple[int, QueueRecord, _Units, I64, Bools, Bools, Bools]]:
        """:meth:`check` of the held units (:attr:`columns`) that point into ``[lo, hi)``, all
        at once; returns, per file with a unit that does not check out, what its units met,
        for :meth:`check` to report."""
        c = self.columns
        held = c.between(lo, hi)
        if not len(held):
            return []
        part = c.part[held]
        qi = self._part_queue[part]
        k, offsets, sizes, tags = c.k[held], c.offsets[held], c.sizes[held], c.tags[held]
        rows, found, damaged = self.scan.lookup(seg, offsets)
        matched = (
            found
            & (seg.topic_ids[rows] == self._tid[qi])
            & (seg.queue_ids[rows] == self._qid[qi])
            & (seg.queue_offsets[rows] == self._first[qi] + k)
        )
        claimed[rows[matched]] = True
        pointed[rows[found]] = True
        self._good[(self._good_at[qi] + k - self._lead[qi])[matched]] = True
        self.scan.report.units += int(np.count_nonzero(found))
        wrong = matched & (
            (sizes != seg.sizes[rows])
            | (~self._schedule[qi] & (tags != seg.tags_codes[rows]))
            | ~dispatchable[rows]
        )
        bad = (~found & ~damaged) | (found & ~matched) | wrong
        out = []
        for p in np.unique(part[bad]).tolist():
            a, b = np.searchsorted(part, [p, p + 1]).tolist()
            units = _Units(k[a:b], offsets[a:b], sizes[a:b], tags[a:b])
            q = self.queues[int(self._part_queue[p])]
            out.append((p, q, units, rows[a:b], found[a:b], damaged[a:b], matched[a:b]))
        return out

    def says(self, tid: int, qid: int, qoff: int) -> str:
        return f"{self.scan.topic_name(tid)}/{qid} offset {qoff}"

    def tags_of(self, phys: int) -> str | None:
        """The TAGS property of the valid record at ``phys``, for a problem's text."""
        mf = self.scan.files[self.scan.seg_index(phys)]
        batch = native.decode(
            mf.buffer,
            np.array([phys - mf.base], dtype=np.int64),
            mf.base,
            path=mf.where,
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
            if phys < self.scan.retained_from:
                q = self.queue_of.get((int(seg.topic_ids[r]), qid))
                if q is None or qoff < q.first:
                    continue  # retention deleted the record and its unit's file during the scan
            where = root / topic / str(qid)
            path, pos = str(where), qoff * CQ_UNIT_SIZE
            if qoff >= 0:
                base, pos = unit_position(qoff, file_size)
                path = LocalSegments(where).where(base)
            self.scan.problem(
                "cq-missing-unit",
                path,
                pos,
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
        if not (q.lead <= u <= q.last and u < q.length) or q.good[u - q.lead]:
            return False
        per_file = q.cq.units_per_file
        n = u // per_file
        unit = self.file_units(q, n)[u % per_file]
        offset, size = int(unit["offset"]), int(unit["size"])
        return offset >= self.scan.base0 and size > 0

    def check_ascending(self) -> None:
        """Units that match their records must follow the CommitLog order."""
        held = self._held_out_of_order()
        for q in self.queues:
            if q.held_units:
                for unit, offset, before in held.get(q.index, ()):
                    self._not_ascending(q, unit, offset, before)
                continue
            prev: tuple[int, int] | None = None  # (unit, offset) of the last good unit
            for n, uf in enumerate(q.parts):
                units = self.checked_units(q, uf, n)
                good = np.flatnonzero(q.good[units.k - q.lead])
                k, offs = units.k[good], units.offsets[good]
                if prev is not None and len(k):
                    k = np.concatenate([[prev[0]], k])
                    offs = np.concatenate([[prev[1]], offs])
                for j in (np.flatnonzero(np.diff(offs) <= 0) + 1).tolist():
                    self._not_ascending(q, int(k[j]), int(offs[j]), int(offs[j - 1]))
                if len(k):
                    prev = (int(k[-1]), int(offs[-1]))

    def _not_ascending(self, q: QueueRecord, k: int, offset: int, before: int) -> None:
        self.unit_problem(
            q,
            k,
            "cq-not-ascending",
            f"offset {offset} is not after the previous unit's {before}",
        )

    def _held_out_of_order(self) -> dict[int, list[tuple[int, int, int]]]:
        """:meth:`check_ascending` of the held units, all at once: per queue, the good units
        whose offset is not after the previous good unit's, ``(unit, offset, previous)``."""
        c = self.columns
        qi = self._part_queue[c.part]
        # What checked_units() with no bounds gives: a file whose offsets ascend is bisected
        # below 2**62.
        within = ~self._part_ascending[c.part] | (c.offsets < 1 << 62)
        good = np.flatnonzero(within & self._good[self._good_at[qi] + c.k - self._lead[qi]])
        queue, offsets = qi[good], c.offsets[good]
        out: dict[int, list[tuple[int, int, int]]] = {}
        later = (queue[1:] == queue[:-1]) & (offsets[1:] <= offsets[:-1])
        for j in (np.flatnonzero(later) + 1).tolist():
            out.setdefault(int(queue[j]), []).append(
                (int(c.k[good[j]]), int(offsets[j]), int(offsets[j - 1]))
            )
        return out
