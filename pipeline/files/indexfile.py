"""One IndexFile: a hash index from ``topic#key`` to CommitLog offsets.

Files live at ``index/<yyyyMMddHHmmssSSS>`` (creation time, local time) and have a fixed size of
``40 + 4 * maxHashSlotNum + 20 * maxIndexNum`` bytes::

    header (40 bytes)
     0               8               16              24              32      36      40
    +---------------+---------------+---------------+---------------+-------+-------+
    |beginTimestamp |endTimestamp   |beginPhyOffset |endPhyOffset   |hash   |index  |
    |(long)         |(long)         |(long)         |(long)         |SlotCnt|Count  |
    +---------------+---------------+---------------+---------------+-------+-------+
    slots: maxHashSlotNum ints, each the number of the newest entry in that slot (0 = empty)
    entries: maxIndexNum entries of 20 bytes
     0       4                       12      16      20
    +-------+-----------------------+-------+-------+
    |keyHash| phyOffset (long)      |time   |prev   |
    |       |                       |Diff(s)|Index  |
    +-------+-----------------------+-------+-------+

``keyHash`` is ``abs(("topic#key").hashCode())``; its slot is ``keyHash % maxHashSlotNum``.
Entries chain newest to oldest through ``prevIndex`` (0 ends the chain). ``timeDiff`` is the
store time minus ``beginTimestamp``, in whole seconds, except entry 1's: RocketMQ's ``putKey``
measures it against the header as it was (0, or where the previous file ended) and only then
sets ``beginTimestamp`` to that entry's store time, so entry 1's time is ``beginTimestamp``
itself. Entry 0 is never used, so ``indexCount`` starts at 1 and a file is full when it reaches
``maxIndexNum``.

Hashes collide, so a look-up returns candidates; the caller must re-check the real key (RocketMQ
does not, and we do).

Thread-safety: none (one writer per store). Crash behaviour: entries are derived data. The
header is updated after the entries and slots it describes, so a killed process leaves at worst
entries the header does not count; a lost machine may leave any mix of old and new pages.
Recovery keeps the entries ``putKey`` replayed from the start would have written and recomputes
the slots (:meth:`IndexFile.mend`), and the CommitLog gives the rest again.

Blocks (see :mod:`rocketstore.pipeline.files.mappedfile`): slots are written anywhere in their table, so a file
this process writes has the header and the whole slot table reserved first, and entries a
window at a time ahead of the count (:data:`ENTRY_AHEAD`). A file loaded from disk is trusted
to have no block at all until it is reserved again: RocketMQ leaves its slot tables sparse.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline.files import failpoints
from rocketstore.pipeline.files.mappedfile import MappedFile
from rocketstore.pipeline.files.mappings import MappingCache
from rocketstore.pipeline.format import native
from rocketstore.pipeline.layout import (
    INDEX_ENTRY,
    INDEX_ENTRY_DTYPE,
    INDEX_ENTRY_SIZE,
    INDEX_HEADER,
    INDEX_HEADER_SIZE,
    INDEX_SLOT,
    INDEX_SLOT_SIZE,
    index_file_size,
)

INT_MAX = 0x7FFFFFFF
ENTRY_AHEAD = 1 << 16  # entries reserved past the ones a write needs
RESERVE_AHEAD = ENTRY_AHEAD * INDEX_ENTRY_SIZE  # 1.25 MiB


class IndexHeader(NamedTuple):
    """An IndexFile's header, its fields in the order they are stored (the diagram above)."""

    begin_timestamp: int
    end_timestamp: int
    begin_phy_offset: int
    end_phy_offset: int
    hash_slot_count: int
    index_count: int

    @classmethod
    def parse(cls, data: bytes | memoryview) -> IndexHeader:
        """The header at the start of ``data`` (at least :data:`INDEX_HEADER_SIZE` bytes)."""
        return cls(*INDEX_HEADER.unpack_from(data, 0))


def read_header(path: Path) -> IndexHeader | None:
    """The header of the IndexFile at ``path``, read without mapping the file; None when the
    file is shorter than a header."""
    with open(path, "rb", buffering=0) as f:
        head = f.read(INDEX_HEADER_SIZE)
    return IndexHeader.parse(head) if len(head) == INDEX_HEADER_SIZE else None


class IndexFile:
    def __init__(
        self,
        path: Path,
        slot_num: int,
        index_num: int,
        *,
        read_only: bool,
        create: bool = False,
        prev_end_phy: int = 0,
        prev_end_ts: int = 0,
        cache: MappingCache | None = None,
        ahead: int = RESERVE_AHEAD,
    ) -> None:
        self.path = path
        self.slot_num = slot_num
        self.index_num = index_num
        size = index_file_size(slot_num, index_num)
        self._mf = MappedFile(
            path,
            0,
            size,
            read_only=read_only,
            create=create,
            cache=cache,
            ahead=ahead,
        )
        # Read without mapping: a store lists its index files at open, and maps one only when
        # a look-up or a put needs its slots and entries.
        fields = IndexHeader.parse(self._mf.read(0, INDEX_HEADER_SIZE))
        self.begin_timestamp: int = fields.begin_timestamp
        self.end_timestamp: int = fields.end_timestamp
        self.begin_phy_offset: int = fields.begin_phy_offset
        self.end_phy_offset: int = fields.end_phy_offset
        self.hash_slot_count: int = fields.hash_slot_count
        self.index_count: int = fields.index_count
        if create:
            # A new file continues where the previous one ended, until its first entry.
            self.begin_phy_offset = self.end_phy_offset = prev_end_phy
            self.begin_timestamp = self.end_timestamp = prev_end_ts
        # A header of zeros: a file created ahead of need (a spare, see IndexService) or one
        # whose writer died before its first header write.
        self.unstarted = not any(fields)
        if self.index_count <= 0:
            self.index_count = 1
        self._mf.wrote_position = self._mf.size
        if not create:
            self._mf.forget_allocation()
        # Entries below this number have their blocks (and so do the header and the slots).
        self.reserved_upto = 0
        # Written since the last flush (a file opened may hold what a crash left unsynced).
        self._dirty = not read_only

    @property
    def _entries_at(self) -> int:
        return INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * self.slot_num

    def reserve(self, entries: int) -> None:
        """Reserve the blocks of the header, every slot and the entries up to the ``entries``-th
        past the count (see :meth:`MappedFile.reserve`): raises :class:`SegmentCreateError`
        on a full disk, with nothing written."""
        upto = min(self.index_count + entries, self.index_num)
        if upto <= self.reserved_upto:
            return  # the common case, on every single put
        self._mf.reserve(self._entries_at + INDEX_ENTRY_SIZE * upto)
        self.reserved_upto = (self._mf.allocated - self._entries_at) // INDEX_ENTRY_SIZE

    def start(self, prev_end_phy: int, prev_end_ts: int) -> None:
        """Begin an unstarted file where the previous one ended, and write its header."""
        self.begin_phy_offset = self.end_phy_offset = prev_end_phy
        self.begin_timestamp = self.end_timestamp = prev_end_ts
        self.index_count = 1
        self.hash_slot_count = 0
        self.reserve(0)
        self.write_header()
        self.unstarted = False

    # Views made per use, not kept: a kept view would pin the mapping (see rocketstore.pipeline.files.mappings).
    @property
    def _slots(self) -> npt.NDArray[np.int32]:
        return np.frombuffer(
            self._mf.buffer, dtype=">i4", count=self.slot_num, offset=INDEX_HEADER_SIZE
        )

    @property
    def _entries(self) -> npt.NDArray[np.void]:
        return np.frombuffer(
            self._mf.buffer,
            dtype=INDEX_ENTRY_DTYPE,
            count=self.index_num,
            offset=INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * self.slot_num,
        )

    @property
    def is_full(self) -> bool:
        return self.index_count >= self.index_num

    @property
    def entry_count(self) -> int:
        return self.index_count - 1

    def write_header(self) -> None:
        # Every change of the file ends with its header written (or, on the single-put path,
        # with took_entries): from here the next flush has something to sync.
        self._dirty = True
        self._mf.reserve(INDEX_HEADER_SIZE)
        INDEX_HEADER.pack_into(
            self._mf.buffer,
            0,
            self.begin_timestamp,
            self.end_timestamp,
            self.begin_phy_offset,
            self.end_phy_offset,
            self.hash_slot_count,
            self.index_count,
        )

    # -- writing ----------------------------------------------------------------------------
    def put(
        self,
        key_hashes: npt.NDArray[np.int32],
        phy_offsets: npt.NDArray[np.int64],
        store_timestamps: npt.NDArray[np.int64],
    ) -> int:
        """Add entries in order until the file is full; returns how many were added.

        Equivalent to RocketMQ's ``putKey`` called once per entry, done for the whole batch.
        """
        take = min(len(key_hashes), self.index_num - self.index_count)
        if take <= 0:
            return 0
        self.reserve(take)
        failpoints.hit("index-put")
        phys = np.ascontiguousarray(phy_offsets[:take], dtype=np.int64)
        times = np.ascontiguousarray(store_timestamps[:take], dtype=np.int64)
        buf = self._mf.buffer
        slots_end = INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * self.slot_num
        new_slots = native.index_put(
            buf[INDEX_HEADER_SIZE:slots_end],
            buf[slots_end:],
            self.index_count,
            self.begin_timestamp,
            np.ascontiguousarray(key_hashes[:take], dtype=np.int32),
            phys,
            times,
        )
        if self.index_count <= 1:
            # As putKey: the first entry's time difference is taken from the header as it was
            # (0, or where the previous file ended), then the file begins at that entry.
            self.begin_phy_offset = int(phys[0])
            self.begin_timestamp = int(times[0])
        self.hash_slot_count += new_slots
        self.index_count += take
        self.end_phy_offset = int(phys[-1])
        self.end_timestamp = int(times[-1])
        self.write_header()
        return take

    @property
    def mapping(self) -> memoryview:
        """A zero-copy view of the whole file (see :attr:`MappedFile.buffer`): for the
        single-put path, which writes entries, slots and the header itself and then calls
        :meth:`took_entries`, and for verify's reading of a whole file."""
        return self._mf.buffer

    def took_entries(self, n: int, new_slots: int, phys: int, store_ts: int) -> None:
        """Take note of ``n`` entries of the message at ``phys`` stored at ``store_ts``, written
        with the header as :meth:`put` writes them, ``new_slots`` of them into empty slots."""
        if not n:
            return
        self._dirty = True
        if self.index_count <= 1:
            self.begin_phy_offset, self.begin_timestamp = phys, store_ts
        self.index_count += n
        self.hash_slot_count += new_slots
        self.end_phy_offset, self.end_timestamp = phys, store_ts

    def truncate_from(self, phys: int, store_time: Callable[[int], int]) -> int:
        """Drop the entries of messages at CommitLog offset ``phys`` or later (they are at the end:
        entries are added in CommitLog order). Slot heads that pointed at dropped entries are
        moved down their chains to the newest remaining entry. ``store_time(offset)`` gives a
        kept message's store time, for the new end timestamp. Returns the entries dropped."""
        count = self.index_count
        if count <= 1 or self.end_phy_offset < phys:
            return 0  # every entry is of an earlier message (entries are in CommitLog order)
        used = self._entries[1:count]
        keep = 1 + int(np.searchsorted(used["phy_offset"].astype(np.int64), phys, side="left"))
        if keep >= count:
            return 0
        # Slots are rewritten below, and RocketMQ leaves the slot table sparse.
        self._mf.reserve(self._entries_at + INDEX_ENTRY_SIZE * count)
        dropped = self._entries[keep:count]
        # A slot's chain runs through its entries in ascending number, so the oldest dropped
        # entry of each slot points (prevIndex) at the newest kept one: the slot's new head.
        slots = dropped["key_hash"].astype(np.int64) % self.slot_num
        affected, first = np.unique(slots, return_index=True)
        heads = dropped["prev_index"][first].astype(np.int64)
        heads[(heads <= 0) | (heads >= keep)] = 0
        self._slots[affected] = heads
        self.hash_slot_count -= int(np.count_nonzero(heads == 0))
        self._entries[keep:count] = np.zeros(count - keep, dtype=INDEX_ENTRY_DTYPE)
        self._end_at(keep, store_time)
        return count - keep

    def _end_at(self, keep: int, store_time: Callable[[int], int]) -> None:
        """Make entry ``keep - 1`` the file's last: count, end offset and time, header."""
        self.index_count = keep
        if keep > 1:
            self.end_phy_offset = int(self._entries[keep - 1]["phy_offset"])
            self.end_timestamp = store_time(self.end_phy_offset)
        else:
            self.end_phy_offset = self.begin_phy_offset
            self.end_timestamp = self.begin_timestamp
        self.write_header()

    def mend(self, phys: int, store_time: Callable[[int], int]) -> tuple[int, int]:
        """Make the file hold exactly its trustworthy entries of messages before CommitLog
        offset ``phys``, whatever a crash left of the rest. Returns (entries dropped, slot heads
        rewritten).

        A process killed mid-put leaves slots naming entries the header never counted. When
        the machine is lost instead (a power cut, or the client of a shared file system that
        dies with the writer), each page of the mapping reached storage on its own schedule:
        the header may count entries whose page never arrived, and a slot may name an entry
        that did not arrive or miss one that did. So the header's count is an upper bound,
        the entries kept are the longest prefix that is in CommitLog order, before ``phys``
        and linked exactly as its hashes say, every slot head is recomputed from the kept
        entries (a chain is fixed by the hashes and the order of its entries), and every entry
        past them is zeroed.
        """
        count = min(max(self.index_count, 1), self.index_num)
        self._mf.reserve(self._entries_at + INDEX_ENTRY_SIZE * count)
        buf = self._mf.buffer
        keep, rewritten, used_slots, stale = native.index_mend(
            buf[INDEX_HEADER_SIZE : self._entries_at], buf[self._entries_at :], count, phys
        )
        if stale is not None:
            # Entries past the kept ones, counted or not, are zeroed; a page that holds one
            # that is not zero has its block already, but CoW file systems want it reserved.
            self._mf.reserve(self._entries_at + INDEX_ENTRY_SIZE * (stale + 1))
            self._entries[keep : stale + 1] = np.zeros(stale + 1 - keep, dtype=INDEX_ENTRY_DTYPE)
        del buf
        self.hash_slot_count = used_slots
        self._end_at(keep, store_time)
        return count - keep, rewritten

    # -- reading ----------------------------------------------------------------------------
    def is_time_matched(self, begin: int, end: int) -> bool:
        return (
            (begin < self.begin_timestamp and end > self.end_timestamp)
            or (self.begin_timestamp <= begin <= self.end_timestamp)
            or (self.begin_timestamp <= end <= self.end_timestamp)
        )

    def candidates(
        self, key_hash: int, begin: int, end: int, min_phys: int = 0
    ) -> list[tuple[int, int]]:
        """(phyOffset, approximate store time) of entries with ``key_hash`` stored in
        ``[begin, end]`` at CommitLog offsets from ``min_phys`` on, newest first, following the
        slot's chain (entries are added in log order, so a chain's offsets only go down).

        The stored time is rounded down to the second, so a message up to 999 ms after
        ``begin`` may look earlier: entries are only excluded, and the walk only stopped, when
        they are certainly outside the range. Callers re-check the exact store time.
        """
        found: list[tuple[int, int]] = []
        if self.index_count <= 1:
            return found
        count = self.index_count
        # struct, not numpy views: a look-up touches a slot and a few entries in each of many
        # files, and making numpy views cost more than the walk itself. A list, not a
        # generator: a paused walk would hold the view, and a held view pins the mapping.
        buf = self._mf.buffer
        entries_at = INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * self.slot_num
        (current,) = INDEX_SLOT.unpack_from(
            buf, INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * (key_hash % self.slot_num)
        )
        while 0 < current < self.index_num:
            h, phy, diff, prev = INDEX_ENTRY.unpack_from(
                buf, entries_at + INDEX_ENTRY_SIZE * current
            )
            # An entry at or past the count this view read is one a live writer (a stock broker,
            # or a writer in another process) added since: newer than anything the view offers,
            # and it heads the slot's chain now. Step past it to the entries the view counts.
            if current < count:
                if diff < 0:
                    break
                # Entry 1's stored difference is not from beginTimestamp (see the module).
                approx = (
                    self.begin_timestamp if current == 1 else self.begin_timestamp + diff * 1000
                )
                if phy < min_phys:
                    break
                if h == key_hash and approx <= end and approx + 999 >= begin:
                    found.append((phy, approx))
                if approx + 999 < begin:
                    break
            # Chains only go down, so the walk ends; anything else is not a chain to follow.
            if prev <= 0 or prev >= current:
                break
            current = prev
        return found

    def entries(self) -> npt.NDArray[np.void]:
        """A copy of the used entries (1 .. indexCount-1)."""
        return self._entries[1 : self.index_count].copy()

    def slots(self) -> npt.NDArray[np.int32]:
        return self._slots.copy()

    def flush(self) -> None:
        """Sync the whole file (its slots are written anywhere in it) when something was
        written since the last flush."""
        if not self._dirty:
            return
        self._mf.flushed_position = 0
        self._mf.flush()
        self._dirty = False

    def close(self) -> None:
        self._mf.close()
