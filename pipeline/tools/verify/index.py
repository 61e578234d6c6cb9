"""The IndexFile checks of a scan (see :mod:`rocketstore.pipeline.tools.verify.check`).

:class:`IndexChecker` checks each IndexFile on its own before the CommitLog walk (header,
slots, prevIndex chains, unused entries), one file at a time, and finds the oldest record an
entry points at. Then it checks the entries against each walked stretch of records (key hash,
time difference), and that every key of every record from the oldest one indexed on has its
entry.

In a file a writer is filling, only the entries before the snapshot's end are checked, with
the slots as they were then.
"""

from __future__ import annotations

import bisect
import dataclasses

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline.files.indexfile import INT_MAX, IndexFile, IndexHeader
from rocketstore.pipeline.layout import (
    INDEX_ENTRY_DTYPE,
    INDEX_ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    INDEX_SLOT_SIZE,
    index_file_size,
)
from rocketstore.pipeline.tools.verify.state import I64, Scan, Segment

_HEADER_FIELDS = (
    ("beginTimestamp", 0),
    ("endTimestamp", 8),
    ("beginPhyOffset", 16),
    ("endPhyOffset", 24),
    ("hashSlotCount", 32),
    ("indexCount", 36),
)


@dataclasses.dataclass
class _IndexState:
    """What the checks of one IndexFile's entries against the records need, between segments."""

    f: IndexFile
    entries_at: int
    entries: npt.NDArray[np.void]  # used entries 1 .. count - 1 (mapped, or a snapshot copy)
    begin_ts: int
    min_phy: int
    max_phy: int
    ascending: bool  # the entries' phyOffsets never go down: bisect them
    times_ok: bool  # whether entry time differences are checked against beginTimestamp

    def entry_at(self, number: int) -> int:
        return self.entries_at + INDEX_ENTRY_SIZE * number


class IndexChecker:
    """Checks the IndexFiles, each on its own and against the CommitLog's records.

    Shares with the rest of the scan, through ``scan``: the snapshot bound, the report and its
    counters (index files, entries), topic names, the damaged stretches (entries pointing into
    them are not checked) and the record at an offset (for the header's timestamps and the
    oldest record indexed). Its own: what each file's entry checks need between segments, the
    files' beginPhyOffsets and the oldest record indexed."""

    def __init__(self, scan: Scan) -> None:
        self.scan = scan
        self.indexes: list[_IndexState] = []
        self.index_begins: list[int] = []  # beginPhyOffset of every IndexFile
        self.oldest_indexed: int | None = None  # oldest record an index entry points at

    def release(self) -> None:
        """Drop the entries of every file (views of their mappings, or copies)."""
        self.indexes.clear()

    def load(self) -> None:
        """Check every IndexFile on its own (header, slots, chains), and find the oldest record
        an entry points at; the entries are checked against the records segment by segment."""
        index = self.scan.store.index
        if index is None or not index.files:
            return
        for n, f in enumerate(index.files):
            self.index_begins.append(self.check_index_file(f, last=n == len(index.files) - 1))
            self.scan.report.index_files += 1
            self.scan.tick(self.scan.done + index_file_size(f.slot_num, f.index_num))

    def check(self, seg: Segment, lo: int, hi: int) -> None:
        """Check the index entries that point into ``[lo, hi)`` (inside one segment) against
        the walked records ``seg`` of that stretch, and that every key of its records from the
        oldest one indexed on has its entry."""
        if not self.indexes:
            return
        known = np.sort(seg.key_rows << 32 | (seg.key_hashes.astype(np.int64) & 0xFFFFFFFF))
        indexed: list[I64] = []
        for s in self.indexes:
            if s.max_phy < lo or s.min_phy >= hi:
                continue
            path = s.f.path
            if s.ascending:
                column = s.entries["phy_offset"]
                a = bisect.bisect_left(column, lo, key=int)
                into = np.arange(a, bisect.bisect_left(column, hi, a, key=int), dtype=np.int64)
            else:
                phy = s.entries["phy_offset"].astype(np.int64)
                into = np.flatnonzero((phy >= lo) & (phy < hi))
                del phy
            used = s.entries[into]
            phy = used["phy_offset"].astype(np.int64)
            key_hash = used["key_hash"].astype(np.int64)
            time_diff = used["time_diff"].astype(np.int64)
            rows, found, damaged = self.scan.lookup(seg, phy)
            for j in np.flatnonzero(~found & ~damaged).tolist():
                number = int(into[j]) + 1
                self.scan.problem(
                    "index-entry-points-nowhere",
                    path,
                    s.entry_at(number),
                    f"entry {number}: no record starts at phyOffset {int(phy[j])}",
                )
            ok = np.flatnonzero(found)
            self.scan.report.index_entries += len(ok)
            pairs = rows[ok] << 32 | (key_hash[ok] & 0xFFFFFFFF)
            indexed.append(pairs)
            if len(known):
                at = np.minimum(np.searchsorted(known, pairs), len(known) - 1)
                hit = known[at] == pairs
            else:
                hit = np.zeros(len(ok), dtype=bool)
            for j in ok[~hit].tolist():
                number = int(into[j]) + 1
                self.scan.problem(
                    "index-entry-hash",
                    path,
                    s.entry_at(number),
                    f"entry {number}: key hash {int(key_hash[j])} is none of the keys of the "
                    f"record at {int(phy[j])}",
                )
            if s.times_ok:
                # RocketMQ computes entry 1's timeDiff before it sets beginTimestamp; from entry
                # 2 on every difference is from entry 1's store time.
                later = ok[into[ok] >= 1]
                stored = seg.store_ts[rows[later]]
                if s.begin_ts <= 0:
                    expected = np.zeros(len(later), dtype=np.int64)
                else:
                    expected = np.clip((stored - s.begin_ts) // 1000, 0, INT_MAX)
                for j in later[time_diff[later] != expected].tolist():
                    number = int(into[j]) + 1
                    self.scan.problem(
                        "index-entry-time",
                        path,
                        s.entry_at(number),
                        f"entry {number}: timeDiff {int(time_diff[j])}, but its message was "
                        f"stored {int(seg.store_ts[rows[j]]) - s.begin_ts} ms after "
                        "beginTimestamp",
                    )
        self.check_missing_entries(seg, np.sort(np.concatenate(indexed)) if indexed else None)

    def check_missing_entries(self, seg: Segment, indexed: I64 | None) -> None:
        """Every key of every record from the oldest one indexed on (older ones may have gone
        with deleted index files) must have its entry. The walk lists the keys dispatch
        indexes: none for ROLLBACK records, none for an empty UNIQ_KEY."""
        if self.oldest_indexed is None or not len(seg.key_rows):
            return
        keep = seg.phys[seg.key_rows] >= self.oldest_indexed
        rows, hashes = seg.key_rows[keep], seg.key_hashes[keep].astype(np.int64)
        wanted = rows << 32 | (hashes & 0xFFFFFFFF)
        if indexed is None or not len(indexed):
            missing = np.arange(len(wanted))
        else:
            at = np.minimum(np.searchsorted(indexed, wanted), len(indexed) - 1)
            missing = np.flatnonzero(indexed[at] != wanted)
        files = self.scan.store.index.files if self.scan.store.index is not None else []
        for j in missing.tolist():
            r, h = int(rows[j]), int(hashes[j])
            phys = int(seg.phys[r])
            # The file that should hold it: the last one that begins at or before it.
            n = max(0, int(np.searchsorted(np.asarray(self.index_begins), phys, side="right")) - 1)
            f = files[n]
            self.scan.problem(
                "index-missing-entry",
                f.path,
                INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * (h % f.slot_num),
                f"no entry for key hash {h} of the record at {phys} "
                f"({self.scan.topic_name(int(seg.topic_ids[r]))}); it belongs in this slot's chain"
                + self.scan.repair_note(phys),
            )

    def find_oldest_indexed(self, phys: I64) -> None:
        """Lower :attr:`oldest_indexed` to the oldest valid record among ``phys`` (an
        IndexFile's live entries), if older. Candidates are tried from the smallest up; the
        first is almost always a record, so the whole array is sorted only when it is not."""
        rest = phys[phys < self.oldest_indexed] if self.oldest_indexed is not None else phys
        for _ in range(8):
            if not len(rest):
                return
            c = int(rest.min())
            if self.scan.record_at(c) is not None:
                self.oldest_indexed = c
                return
            rest = rest[rest > c]
        for c in np.unique(rest).tolist():
            if self.scan.record_at(c) is not None:
                self.oldest_indexed = c
                return

    def check_index_file(self, f: IndexFile, *, last: bool) -> int:
        """Check one file on its own; returns its beginPhyOffset."""
        # Through the store's own mapping: a file retention deleted since the view listed it
        # is a SegmentGoneError (verify_read_only scans again), not an I/O error.
        mm = np.frombuffer(f.mapping, dtype=np.uint8)
        try:
            return self._check_index_file(f, mm, last)
        finally:
            del mm

    def _index_snapshot(
        self, slots: I64, entries: npt.NDArray[np.void]
    ) -> tuple[int, I64, npt.NDArray[np.void]]:
        """The entries of the file being written that lie before the snapshot's end, and its
        slots as they were then: a slot head past them is followed down its chain. Entries are
        copied after the slots, and a writer sets a slot only after writing its entry, so every
        head read has its entry in the copy."""
        entries = entries.copy()
        phy = entries["phy_offset"][1:].astype(np.int64)
        used = np.flatnonzero(phy > 0)
        end = int(used[-1]) + 1 if len(used) else 0
        count = 1 + int(np.searchsorted(phy[:end], self.scan.log_end))
        prev = entries["prev_index"].astype(np.int64)
        heads = slots.copy()
        for _ in range(len(entries)):
            over = np.flatnonzero(heads >= count)
            if not len(over):
                break
            heads[over] = prev[np.clip(heads[over], 0, len(prev) - 1)]
        entries[count:] = np.zeros(len(entries) - count, dtype=INDEX_ENTRY_DTYPE)
        return count, heads, entries

    def _check_index_file(self, f: IndexFile, mm: npt.NDArray[np.uint8], last: bool) -> int:
        slot_num, index_num = f.slot_num, f.index_num
        entries_at = INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * slot_num
        if len(mm) != entries_at + INDEX_ENTRY_SIZE * index_num:
            self.scan.problem(
                "index-header", f.path, 0, f"file is {len(mm)} bytes, not as configured"
            )
            return 0
        header = IndexHeader.parse(bytes(mm[:INDEX_HEADER_SIZE]))
        slots = np.frombuffer(mm, dtype=">i4", count=slot_num, offset=INDEX_HEADER_SIZE).astype(
            np.int64
        )
        entries = np.frombuffer(mm, dtype=INDEX_ENTRY_DTYPE, count=index_num, offset=entries_at)
        raw_count = header.index_count
        count = min(max(raw_count, 1), index_num)
        # In a file a writer is filling, the header, slots and tail move during the scan.
        moving = False
        if self.scan.report.snapshot_end is not None:
            count, slots, entries = self._index_snapshot(slots, entries)
            moving = last or count < raw_count
        v = _File(f, header, slots, entries, count, moving, entries_at)
        self._check_header(v, last)
        self._check_unused_entries(v)
        used = entries[1:count]
        # The file's own widths: an IndexFile may hold 20M entries (160 MB per int64 column).
        key_hash = used["key_hash"].astype(np.int32)
        phy = used["phy_offset"].astype(np.int64)
        self._check_chains(v, key_hash, used["prev_index"].astype(np.int32))
        live = self._check_entry_targets(v, phy, used["time_diff"].astype(np.int32))
        inside = phy[live & (phy < self.scan.log_end)]
        # The oldest record an entry of this file points at (entries may point nowhere).
        self.find_oldest_indexed(inside)
        times_ok = self._check_header_against_entries(v, phy, live)
        if len(inside):
            self.indexes.append(
                _IndexState(
                    f,
                    entries_at,
                    used,
                    v.begin_ts,
                    int(inside.min()),
                    int(inside.max()),
                    bool(np.all(np.diff(phy) >= 0)),
                    times_ok,
                )
            )
        return v.begin_phy

    def _head(self, v: _File, field: int, detail: str) -> None:
        """A problem with header field ``field`` (an index of :data:`_HEADER_FIELDS`)."""
        name, at = _HEADER_FIELDS[field]
        self.scan.problem("index-header", v.f.path, at, f"{name} {v.header[field]}: {detail}")

    def _check_header(self, v: _File, last: bool) -> None:
        """The header's counts against the configured geometry and the slots in use, and its
        begin/end pairs against each other."""
        index_num, slot_num = v.f.index_num, v.f.slot_num
        begin_ts, end_ts, begin_phy, end_phy, slot_count, raw_count = v.header
        if not 0 <= raw_count <= index_num:
            self._head(v, 5, f"outside [0, maxIndexNum={index_num}]")
        elif not last and raw_count != index_num:
            self._head(
                v, 5, f"the file is not full (maxIndexNum={index_num}), yet a later one exists"
            )
        used_slots = int(np.count_nonzero(v.slots))
        if not 0 <= slot_count <= slot_num:
            self._head(v, 4, f"outside [0, maxHashSlotNum={slot_num}]")
        elif slot_count != used_slots and not v.moving:
            self._head(v, 4, f"but {used_slots} slots are in use")
        if v.count > 1 and begin_ts > end_ts:
            self._head(v, 0, f"after endTimestamp {end_ts}")
        if v.count > 1 and begin_phy > end_phy:
            self._head(v, 2, f"after endPhyOffset {end_phy}")

    def _check_unused_entries(self, v: _File) -> None:
        """Entry 0 and the entries after the count hold nothing."""
        raw_entries = v.entries.view(np.uint8).reshape(-1, INDEX_ENTRY_SIZE)
        if raw_entries[0].any():
            self.scan.problem(
                "index-unused-entry", v.f.path, v.entries_at, "entry 0 (never used) is not zero"
            )
        tail = np.flatnonzero(raw_entries[v.count :].any(axis=1))
        if len(tail) and not v.moving:
            j = v.count + int(tail[0])
            self.scan.problem(
                "index-unused-entry",
                v.f.path,
                v.entry_at(j),
                f"{len(tail)} non-zero entries after indexCount {v.header.index_count}",
            )

    def _check_chains(
        self, v: _File, key_hash: npt.NDArray[np.int32], prev: npt.NDArray[np.int32]
    ) -> None:
        """Slot heads and prevIndex chains: each slot holds an entry of its own slot, each
        link goes down to an entry of the same slot, and every entry is reached exactly once."""
        path, slots, count = v.f.path, v.slots, v.count
        numbers = np.arange(1, count, dtype=np.int32)
        slot_of = np.mod(key_hash, v.f.slot_num)
        bad_head = (slots < 0) | (slots >= count)
        for s in np.flatnonzero(bad_head).tolist():
            self.scan.problem(
                "index-slot",
                path,
                INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * s,
                f"slot {s} holds entry {int(slots[s])}, outside [0, indexCount={count})",
            )
        heads = np.flatnonzero(~bad_head & (slots > 0))
        for s in heads[slot_of[slots[heads] - 1] != heads].tolist():
            self.scan.problem(
                "index-slot",
                path,
                INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * s,
                f"slot {s} holds entry {int(slots[s])}, whose key hash belongs to slot "
                f"{int(slot_of[slots[s] - 1])}",
            )
        bad_prev = (prev < 0) | (prev >= numbers)
        for j in np.flatnonzero(bad_prev).tolist():
            self.scan.problem(
                "index-chain",
                path,
                v.entry_at(j + 1),
                f"entry {j + 1}: prevIndex {int(prev[j])} does not go down (must be in [0, "
                f"{j + 1}))",
            )
        links = np.flatnonzero(~bad_prev & (prev > 0))
        for j in links[slot_of[prev[links] - 1] != slot_of[links]].tolist():
            self.scan.problem(
                "index-chain",
                path,
                v.entry_at(j + 1),
                f"entry {j + 1} (slot {int(slot_of[j])}) links to entry {int(prev[j])} in slot "
                f"{int(slot_of[prev[j] - 1])}",
            )
        refs = np.bincount(
            np.concatenate([prev[links], slots[heads].astype(np.int32)]), minlength=count
        )
        for number in (np.flatnonzero(refs[1:count] != 1) + 1).tolist():
            many = int(refs[number])
            self.scan.problem(
                "index-chain",
                path,
                v.entry_at(number),
                f"entry {number} is "
                + ("not reachable from its slot" if many == 0 else f"linked from {many} places"),
            )

    def _check_entry_targets(
        self, v: _File, phy: I64, time_diff: npt.NDArray[np.int32]
    ) -> npt.NDArray[np.bool_]:
        """Entries that point outside the log, and negative time differences; returns which
        entries point at live records' offsets (at or past the CommitLog's first)."""
        # Entries go in CommitLog order, so those of messages retention deleted (below the
        # CommitLog's first offset) come first; one below it after a live one is damaged.
        live: npt.NDArray[np.bool_] = phy >= self.scan.base0
        seen_live = np.logical_or.accumulate(live)
        expired = ~live & (phy >= 0) & ~seen_live
        # Entries pointing outside the log meet no segment's records: reported here.
        for j in np.flatnonzero(
            ~expired & ((phy < self.scan.base0) | (phy >= self.scan.log_end))
        ).tolist():
            self.scan.problem(
                "index-entry-points-nowhere",
                v.f.path,
                v.entry_at(j + 1),
                f"entry {j + 1}: no record starts at phyOffset {int(phy[j])}",
            )
        for j in np.flatnonzero(time_diff < 0).tolist():
            self.scan.problem(
                "index-entry-time",
                v.f.path,
                v.entry_at(j + 1),
                f"negative timeDiff {int(time_diff[j])}",
            )
        return live

    def _check_header_against_entries(
        self, v: _File, phy: I64, live: npt.NDArray[np.bool_]
    ) -> bool:
        """The header's begin/end offsets and timestamps against the first and last entries
        and their records. Returns whether the entries' time differences can be checked
        against beginTimestamp."""
        if v.count <= 1 or v.moving:
            return False
        begin_ts, end_ts, begin_phy, end_phy, _, _ = v.header
        if begin_phy != phy[0]:
            self._head(v, 2, f"but entry 1 is at {int(phy[0])}")
        if end_phy != phy[-1]:
            self._head(v, 3, f"but the last entry is at {int(phy[-1])}")
        times_ok = True
        first = self.scan.record_at(int(phy[0])) if live[0] else None
        if first is not None:
            first_ts = int(first.store_ts[0])
            if begin_ts != first_ts:
                self._head(v, 0, f"but entry 1's message was stored at {first_ts}")
                times_ok = False
        final = self.scan.record_at(int(phy[-1])) if live[-1] else None
        if final is not None and end_ts != int(final.store_ts[0]):
            self._head(v, 1, f"but the last entry's message was stored at {int(final.store_ts[0])}")
        return times_ok


@dataclasses.dataclass
class _File:
    """One IndexFile as :meth:`IndexChecker.check_index_file` reads it: the header's six
    fields, the slots and entries (as the snapshot had them, for a file a writer fills), the
    entry count the checks go by, and whether the file is moving under the scan."""

    f: IndexFile
    header: IndexHeader
    slots: I64
    entries: npt.NDArray[np.void]
    count: int
    moving: bool
    entries_at: int

    @property
    def begin_ts(self) -> int:
        return self.header.begin_timestamp

    @property
    def begin_phy(self) -> int:
        return self.header.begin_phy_offset

    def entry_at(self, number: int) -> int:
        return self.entries_at + INDEX_ENTRY_SIZE * number
