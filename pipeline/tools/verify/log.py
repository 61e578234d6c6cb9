"""The CommitLog walk of a scan (see :mod:`rocketstore.pipeline.tools.verify.check`).

:class:`LogWalker` reads every segment from its start with the native record walk, in chunks
of records: it counts the valid records and blanks, reports damaged records, holes and
garbage, and finds where the log goes on after damage. Each walked stretch of records goes to
the checks of the ConsumeQueues and IndexFiles, then is dropped.

What it checks, and where it resynchronises after damage, is the CommitLog part of
:mod:`rocketstore.pipeline.tools.verify.check`. Dead regions that fencing made are stepped over, whatever
they hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from rocketstore.pipeline.engine import fencing
from rocketstore.pipeline.format import native, record
from rocketstore.pipeline.tools.verify.state import I64, Piece, Scan, Segment

SCAN_STEP = 4 << 20  # bytes searched at once for a magic code
ZERO_STEP = 1 << 20  # bytes tested at once for non-zero content

_MAGIC_BYTES = record.INT.pack(record.MAGIC)
_BLANK_BYTES = record.INT.pack(record.BLANK_MAGIC)

# Checks a walked stretch ``[lo, hi)`` of one segment is handed to, with its records.
StretchCheck = Callable[[Segment, int, int], None]


def _resumed(target: int | None) -> str:
    return f"; next record at {target}" if target is not None else "; no valid record follows"


def _kind_of(reason: str) -> str:
    """The problem kind of a whole-looking record the walk rejected, from its reason."""
    if reason.startswith("PHYSICALOFFSET"):
        return "commitlog-physical-offset"
    if reason.startswith("body CRC"):
        return "commitlog-crc"
    if reason.startswith("NUL byte"):
        return "commitlog-torn"
    return "commitlog-size"


class LogWalker:
    """Walks the CommitLog, reports what is wrong in it, and hands each walked stretch of
    records to ``checks``.

    Shares with the rest of the scan, through ``scan``: the segments and the snapshot bound,
    the report and its counters (records, record bytes, blanks), topic ids, and the damaged
    stretches, which it marks. It asks ``unit_starts(phys)`` for the nearest ConsumeQueue unit
    offsets after ``phys`` (ascending) when it resynchronises after damage; the dead regions
    are its own."""

    def __init__(
        self,
        scan: Scan,
        *,
        unit_starts: Callable[[int], I64],
        checks: Sequence[StretchCheck],
        chunk_records: int,
    ) -> None:
        self.scan = scan
        self.unit_starts = unit_starts
        self.checks = tuple(checks)
        self.chunk_records = chunk_records  # records walked, then checked, at once
        self.dead: list[tuple[int, int]] = []  # dead regions (rocketstore.pipeline.engine.fencing)

    def check_dead_regions(self) -> None:
        """Name what writers fenced off left in the dead regions their successors made; the
        walk then steps over each region, whatever it holds."""
        self.dead = fencing.dead_regions(fencing.read_epochs(self.scan.store.path))
        for e in fencing.read_epochs(self.scan.store.path):
            if e.dead is None or e.start > self.scan.log_end or e.fenced_end < self.scan.base0:
                continue
            junk = fencing.junk_bytes(self.scan.log, e.fenced_end, e.start)
            if junk:
                self.scan.problem(
                    "commitlog-fenced-writer",
                    self.scan.record_path(e.fenced_end),
                    e.fenced_end,
                    f"{junk} bytes in [{e.fenced_end}, {e.start}), the dead region epoch "
                    f"{e.epoch} began with: a writer that had lost the store wrote there; they "
                    "are not data, and `rocketstore recover` restores the region",
                )

    def walk(self) -> None:
        """Walk the log with the native record walk, ``chunk_records`` records at a time; once
        a stretch of the log is walked, hand its records to the checks of the units and index
        entries that point into it, then drop them (memory is bounded by a chunk of records,
        not the store)."""
        pos: int | None = self.scan.base0
        cq_done = self.scan.done
        pieces: list[Piece] = []
        lo = self.scan.base0  # start of the walked stretch not checked yet
        while pos is not None and pos < self.scan.log_end:
            i = self.scan.seg_index(pos)
            while self.scan.seg_index(lo) < i:
                # The walk left the segment of ``lo``: check up to that segment's end.
                hi = self.segment_end(lo)
                self.check_stretch(pieces, lo, hi)
                pieces, lo = [], hi
            mf = self.scan.files[i]
            limit = min(mf.size, self.scan.log_end - mf.base)
            dead = next(((x, e) for x, e in self.dead if x >= pos and e > pos), None)
            if dead is not None and dead[0] == pos:
                pos = dead[1]  # a dead region is not log (check_dead_regions named its bytes)
                continue
            if dead is not None and dead[0] < mf.base + limit:
                limit = dead[0] - mf.base
            w = native.walk(
                mf.buffer,
                pos - mf.base,
                limit,
                mf.base,
                check_crc=True,
                max_records=self.chunk_records,
            )
            if dead is not None and w.stop == native.STOP_END and w.end == dead[0]:
                if len(w):
                    pieces.append((w, len(w), self.topic_codes(w)))
                    self.count(w, len(w))
                pos = dead[1]
                continue
            pos = self.walked(i, w, pieces, full=len(w) == self.chunk_records)
            if pos is not None and sum(n for _, n, _ in pieces) >= self.chunk_records:
                # Everything before ``pos`` is walked (or marked damaged): check it now.
                self.check_stretch(pieces, lo, pos)
                pieces, lo = [], pos
            if pos is not None:
                self.scan.tick(cq_done + pos - self.scan.base0)
        while lo < self.scan.log_end:
            hi = self.segment_end(lo)
            self.check_stretch(pieces, lo, hi)
            pieces, lo = [], hi

    def segment_end(self, phys: int) -> int:
        mf = self.scan.files[self.scan.seg_index(phys)]
        return min(mf.base + mf.size, self.scan.log_end)

    def topic_codes(self, w: native.Walk) -> I64:
        """Store-wide topic ids of a walk's topics (-2 for one that is not valid UTF-8)."""
        return np.asarray([self.scan.raw_topic_id(t) for t in w.raw_topics], dtype=np.int64)

    def count(self, w: native.Walk, n: int) -> None:
        self.scan.report.records += n
        self.scan.report.record_bytes += int(w.sizes[:n].sum())

    def walked(self, i: int, w: native.Walk, pieces: list[Piece], *, full: bool) -> int | None:
        """Keep the valid records of walk ``w`` of segment ``i``; returns where to go on.
        ``full``: the walk stopped at its record limit, not at the end of the valid records."""
        mf = self.scan.files[i]
        ids = self.topic_codes(w)
        bad = np.flatnonzero(ids[w.topic_codes] == -2) if len(w) else np.zeros(0, dtype=np.int64)
        n = int(bad[0]) if len(bad) else len(w)
        if n:
            pieces.append((w, n, ids))
            self.count(w, n)
        if len(bad):
            return self.damaged_record(
                int(w.phys[n]), "commitlog-topic", "topic is not valid UTF-8"
            )
        if full and w.stop == native.STOP_END:
            return w.end
        r = w.end - mf.base
        if w.stop == native.STOP_INVALID:
            limit = min(mf.size, self.scan.log_end - mf.base)
            size, magic = record.SIZE_MAGIC.unpack_from(mf.buffer, r)
            if magic == record.MAGIC and size >= record.FIXED_SIZE_V4 and r + size <= limit:
                # A whole record whose header or body is wrong inside.
                return self.damaged_record(w.end, _kind_of(w.reason), w.reason)
        return self.boundary(i, r)

    def damaged_record(self, phys: int, kind: str, detail: str) -> int | None:
        target = self.resync(phys)
        self.scan.mark(phys, target)
        self.scan.problem(kind, self.scan.record_path(phys), phys, detail + _resumed(target))
        return target

    def boundary(self, i: int, r: int) -> int | None:
        """Where to go on from segment ``i`` position ``r``, where the quick walk stopped (the
        segment's end, a blank, zeros, or something that is not a record)."""
        mf = self.scan.files[i]
        limit = mf.size
        phys = mf.base + r
        if phys >= self.scan.log_end:
            return None  # the end of the snapshot
        if r >= limit:
            return mf.base + limit
        a = self.scan.array(i)
        if r + 8 > limit:
            if a[r:limit].any():
                return self.damaged_at(
                    phys,
                    "commitlog-bad-magic",
                    f"the last {limit - r} bytes of the segment are neither a record nor zeros",
                )
            return mf.base + limit
        size, magic = record.SIZE_MAGIC.unpack_from(mf.buffer, r)
        if magic == record.BLANK_MAGIC:
            if size == limit - r:
                self.scan.report.blanks += 1
                g = self.first_nonzero(phys + 8, mf.base + limit)
                if g is not None:
                    self.scan.problem(
                        "commitlog-garbage-after-blank",
                        mf.where,
                        g,
                        f"non-zero bytes after the END_OF_FILE blank at {phys}",
                    )
                return mf.base + limit
            return self.damaged_at(
                phys,
                "commitlog-blank",
                f"END_OF_FILE blank says {size} bytes remain in the segment, {limit - r} do",
            )
        if size == 0 and magic == 0:
            return self.zeros_at(phys)
        if magic != record.MAGIC:
            return self.damaged_at(
                phys, "commitlog-bad-magic", f"bad magic code 0x{magic & 0xFFFFFFFF:08X}"
            )
        return self.damaged_at(
            phys, "commitlog-size", f"bad total size {size} ({limit - r} bytes left in segment)"
        )

    def damaged_at(self, phys: int, kind: str, detail: str) -> int | None:
        """Report the record at ``phys`` and return the next record boundary (None: none)."""
        target = self.resync(phys)
        if target is None and kind == "commitlog-bad-magic" and not self.looks_like_record(phys):
            g = self.first_nonzero(phys, self.scan.log_end)
            self.scan.problem(
                "commitlog-garbage-after-end",
                self.scan.record_path(phys),
                phys,
                f"{detail}; no valid record follows (first non-zero byte at {g})",
            )
            return None
        self.scan.mark(phys, target)
        self.scan.problem(kind, self.scan.record_path(phys), phys, detail + _resumed(target))
        return target

    def zeros_at(self, phys: int) -> int | None:
        """A zero header where a record or blank was expected: the end of the log, unless
        something follows."""
        q = self.next_cq_start(phys)
        stop = q if q is not None else self.scan.log_end
        g = self.first_nonzero(phys, stop)
        path = self.scan.record_path(phys)
        if g is None:
            if q is None:
                return None
            self.scan.mark(phys, q)
            self.scan.problem(
                "commitlog-hole",
                path,
                phys,
                f"zeros from {phys} to {q}, where a record the ConsumeQueues know starts: "
                "a reader (and RocketMQ's recovery) stops here",
            )
            return q
        s = self.scan_valid(max(phys + 1, g - 3), stop)
        target = s if s is not None else q
        if target is None:
            self.scan.problem(
                "commitlog-garbage-after-end",
                self.scan.record_path(g),
                g,
                f"non-zero bytes after the end of the log at {phys}, and no valid record",
            )
            return None
        self.scan.mark(phys, target)
        if g >= target:
            self.scan.problem(
                "commitlog-hole",
                path,
                phys,
                f"zeros from {phys} to {target}, where the next record starts: a reader (and "
                "RocketMQ's recovery) stops here",
            )
            return target
        self.scan.problem(
            "commitlog-bad-magic",
            path,
            phys,
            f"zeroed header, then non-zero bytes from {g}; the next record starts at {target}",
        )
        return target

    def looks_like_record(self, phys: int) -> bool:
        i = self.scan.seg_index(phys)
        mf = self.scan.files[i]
        rel = phys - mf.base
        if rel + 36 > mf.size:
            return False
        magic = record.INT.unpack_from(mf.buffer, rel + 4)[0]
        return bool(
            magic == record.MAGIC
            or record.LONG.unpack_from(mf.buffer, rel + record.OFF_PHYSICALOFFSET)[0] == phys
        )

    def valid_at(self, phys: int) -> bool:
        """Whether a whole valid record, or a blank ending its segment, starts at ``phys``."""
        if not self.scan.base0 <= phys < self.scan.log_end:
            return False
        mf = self.scan.files[self.scan.seg_index(phys)]
        rel = phys - mf.base
        if rel + 8 > mf.size:
            return False
        size, magic = record.SIZE_MAGIC.unpack_from(mf.buffer, rel)
        if magic == record.BLANK_MAGIC:
            return bool(size == mf.size - rel)
        return self.scan.record_at(phys) is not None

    def next_cq_start(self, phys: int) -> int | None:
        """The first ConsumeQueue offset after ``phys`` that looks like a record start (a unit
        whose offset field was damaged points into the middle of a record: skipped)."""
        for c in self.unit_starts(phys).tolist():
            if c < self.scan.log_end and self.looks_like_record(c):
                return int(c)
        return None

    def resync(self, phys: int) -> int | None:
        """The next record boundary after a damaged record at ``phys``."""
        q = self.next_cq_start(phys)
        s = self.scan_valid(phys + 1, q if q is not None else self.scan.log_end)
        return s if s is not None else q

    def scan_valid(self, lo: int, hi: int) -> int | None:
        """The first position in ``[lo, hi)`` where a record certainly starts: a whole valid
        record or blank, or a (damaged) record whose PHYSICALOFFSET field holds its position."""
        for c, placed in self.candidates(lo, hi):
            if placed or self.valid_at(c):
                return c
        return None

    def candidates(self, lo: int, hi: int) -> Iterator[tuple[int, bool]]:
        """Positions in ``[lo, hi)``, in order, that have a magic or blank code 4 bytes on, or
        their own offset 28 bytes on (then paired with True)."""
        lo = max(lo, self.scan.base0)
        hi = min(hi, self.scan.log_end)
        while lo < hi:
            i = self.scan.seg_index(lo)
            mf = self.scan.files[i]
            size = mf.size
            buf = mf.buffer
            x = lo - mf.base
            x_end = min(hi, mf.base + size) - mf.base
            while x < x_end:
                x2 = min(x_end, x + SCAN_STEP)
                found: dict[int, bool] = {}
                data = bytes(buf[x + 4 : min(x2 + 7, size)])
                for pattern in (_MAGIC_BYTES, _BLANK_BYTES):
                    k = data.find(pattern)
                    while k != -1 and x + k < x2:
                        found[x + k] = False
                        k = data.find(pattern, k + 1)
                top = min(x2, size - 35)  # PHYSICALOFFSET must fit in the segment
                for shift in range(8):
                    first = x + shift
                    count = (top - first + 7) // 8
                    if count <= 0:
                        continue
                    field = np.frombuffer(
                        buf, dtype=">i8", count=count, offset=first + record.OFF_PHYSICALOFFSET
                    )
                    where = mf.base + first + 8 * np.arange(count, dtype=np.int64)
                    for rel in (np.flatnonzero(field == where) * 8 + first).tolist():
                        found[rel] = True
                for rel in sorted(found):
                    yield mf.base + rel, found[rel]
                x = x2
            lo = mf.base + size

    def first_nonzero(self, lo: int, hi: int) -> int | None:
        lo = max(lo, self.scan.base0)
        hi = min(hi, self.scan.log_end)
        while lo < hi:
            i = self.scan.seg_index(lo)
            mf = self.scan.files[i]
            a = self.scan.array(i)
            r = lo - mf.base
            r_end = min(hi, mf.base + mf.size) - mf.base
            while r < r_end:
                block = a[r : min(r_end, r + ZERO_STEP)]
                if block.any():
                    return mf.base + r + int(np.argmax(block != 0))
                r += len(block)
            lo = mf.base + mf.size
        return None

    def check_stretch(self, pieces: list[Piece], lo: int, hi: int) -> None:
        """Hand the records the walk kept for ``[lo, hi)`` (inside one segment), its
        ``pieces``, to the checks of the units and index entries that point into it."""
        seg = Segment.of(pieces)
        for check in self.checks:
            check(seg, lo, hi)
