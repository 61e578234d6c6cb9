"""The checked units of a scan's small ConsumeQueues, held in memory column by column (see
:mod:`rocketstore.pipeline.tools.verify.queues`).

A store of 40,000 queues of ten units each has 40,000 files to check against every stretch of
the log the scan walks: looked at one file at a time, each stretch costs a read and a few
dozen small array operations per queue, whatever the few units that point into it. So the
units of small queues (at most :data:`QUEUE_UNITS` checked units) are read once, when the
queues are loaded, into one set of columns in queue order, and a stretch finds the ones
pointing into it by one search over their offsets. Memory stays bounded: at most
:data:`BUDGET_UNITS` units (about 32 bytes each) are held for the whole scan; queues past that,
and big queues, are read from their files as each stretch needs them.

The first look at each queue (its first real unit and last valid one, what to check, whether
anything is wrong) is taken the same way, all at once for a batch of small one-file queues
(:func:`first_look`): 40,000 queues are 40,000 reads, not 40,000 rounds of array operations.

Not thread-safe; one scan's.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline.layout import PRE_BLANK_SIZE
from rocketstore.pipeline.tools.verify.state import I64, Bools

QUEUE_UNITS = 4096  # checked units of a queue held, at most (a bigger one is read per stretch)
BUDGET_UNITS = 1 << 21  # checked units held for a whole scan, at most (about 64 MiB)


class UnitColumns:
    """Checked units (valid, pointing at or past the log's first offset) of whole queues, in
    the order of their files (a file's number in the scan: the files of the queues in order),
    then of the units: per unit its file, its unit number in its queue, its offset, size and
    tagsCode. :meth:`take` (or :meth:`take_many`) until :meth:`freeze`, then read."""

    def __init__(self, budget: int = BUDGET_UNITS) -> None:
        self.budget = budget
        self.held = 0
        self._parts: list[I64] = []
        self._k: list[I64] = []
        self._offsets: list[I64] = []
        self._sizes: list[I64] = []
        self._tags: list[I64] = []
        empty = np.zeros(0, dtype=np.int64)
        self.part = self.k = self.offsets = self.sizes = self.tags = empty
        self._by_offset = self._sorted_offsets = empty

    def take(self, parts: list[tuple[int, I64, I64, I64, I64]]) -> bool:
        """Hold the checked units of one queue, ``(part, k, offsets, sizes, tags)`` per file,
        unless they are more than :data:`QUEUE_UNITS` or the budget has no room for them:
        then nothing is held and this returns False."""
        count = sum(len(k) for _, k, _, _, _ in parts)
        if count > QUEUE_UNITS or self.held + count > self.budget:
            return False
        self.held += count
        for part, k, offsets, sizes, tags in parts:
            self._parts.append(np.full(len(k), part, dtype=np.int64))
            self._k.append(k)
            self._offsets.append(offsets)
            self._sizes.append(sizes)
            self._tags.append(tags)
        return True

    def take_many(
        self, parts: I64, wanted: Bools, columns: tuple[I64, I64, I64, I64, I64]
    ) -> Bools:
        """:meth:`take` for many queues of one file each at once: queue ``i`` (file number
        ``parts[i]`` of the scan) has its checked units in ``columns`` (queue ``i``, k,
        offsets, sizes, tags per unit, queues in order); only those ``wanted`` may be held.
        Returns which were held."""
        room = self.budget - self.held
        counts = np.bincount(columns[0], minlength=len(parts))
        fits = wanted & (counts <= QUEUE_UNITS)
        total = np.cumsum(np.where(fits, counts, 0))
        held: Bools = fits & (total <= room)
        queue, k, offsets, sizes, tags = columns
        rows = np.flatnonzero(held[queue])
        self.held += int(counts[held].sum())
        self._parts.append(parts[queue[rows]])
        self._k.append(k[rows])
        self._offsets.append(offsets[rows])
        self._sizes.append(sizes[rows])
        self._tags.append(tags[rows])
        return held

    def freeze(self) -> None:
        """Join what was taken into columns in the order of the files (then of the units),
        and sort the offsets for :meth:`between`."""
        if self._k:
            part = np.concatenate(self._parts)
            order = np.argsort(part, kind="stable")
            self.part = part[order]
            self.k = np.concatenate(self._k)[order]
            self.offsets = np.concatenate(self._offsets)[order]
            self.sizes = np.concatenate(self._sizes)[order]
            self.tags = np.concatenate(self._tags)[order]
        self._parts, self._k, self._offsets, self._sizes, self._tags = [], [], [], [], []
        self._by_offset = np.argsort(self.offsets, kind="stable")
        self._sorted_offsets = self.offsets[self._by_offset]

    def between(self, lo: int, hi: int) -> I64:
        """The rows of the units whose offset lies in ``[lo, hi)``, in the order taken."""
        a, b = np.searchsorted(self._sorted_offsets, [lo, hi], side="left").tolist()
        rows: I64 = np.sort(self._by_offset[a:b])
        return rows


@dataclasses.dataclass
class FirstLook:
    """What :func:`first_look` found in a batch of one-file queues, per queue (arrays in batch
    order; unit numbers relative to the file): the first real unit and the last valid one,
    the units ``[lo, hi)`` to check and the range of their offsets (``min_off > max_off``:
    none), whether those offsets ascend, and whether the queue is ``clean`` (no hole, no
    garbage after its end, no unit past the log: nothing to report). ``checked`` holds the
    checked units of the whole batch, column by column, with their queue."""

    lead: I64
    last: I64
    lo: I64
    hi: I64
    min_off: I64
    max_off: I64
    ascending: Bools
    clean: Bools
    checked: tuple[I64, I64, I64, I64, I64]  # queue, k, offsets, sizes, tags


def first_look(
    units: npt.NDArray[np.void],
    counts: I64,
    lengths: I64,
    per_file: I64,
    base0: int,
    log_end: int,
) -> FirstLook:
    """The first look :class:`~rocketstore.pipeline.tools.verify.load.QueueLoader` takes at each
    queue, for a batch of queues of one file each, all at once: ``units`` holds, queue after
    queue, the ``counts[i]`` units that the file of queue ``i`` holds; ``lengths[i]`` are the
    units the scan checks (the snapshot's), ``per_file[i]`` its file's capacity in units. The
    same rules, unit for unit: a real unit is any but a pre-blank, and zeros past the units
    read (the file's holes) are real too; a valid unit has an offset >= 0 and a size > 0.

    Units of zeros after a queue's last unit that is not are dropped first: a file's data
    ends at a page or a block, so most of what is read past a few units is zeros, and those
    weigh nothing in the rules."""
    queue = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    pos = np.arange(len(units), dtype=np.int64) - (np.cumsum(counts) - counts)[queue]
    nonzero = units.view(np.uint8).reshape(-1, units.itemsize).any(axis=1)
    ends = np.zeros(len(counts), dtype=np.int64)
    np.maximum.at(ends, queue[nonzero], pos[nonzero] + 1)
    keep = pos < ends[queue]
    units, queue, pos = units[keep], queue[keep], pos[keep]
    offsets = units["offset"].astype(np.int64)
    sizes = units["size"].astype(np.int64)
    tags = units["tags_code"].astype(np.int64)
    never = np.iinfo(np.int64).max
    real = np.full(len(counts), never, dtype=np.int64)
    blank = sizes == PRE_BLANK_SIZE
    np.minimum.at(real, queue[~blank], pos[~blank])
    # No real unit among those kept: the first unit of zeros is, if the scan reaches it.
    lead = np.where(
        real != never, real, np.where(ends < np.minimum(per_file, lengths), ends, lengths)
    )
    valid = (offsets >= 0) & (sizes > 0)
    last = np.full(len(counts), -1, dtype=np.int64)
    np.maximum.at(last, queue[valid], pos[valid])
    last = np.maximum(last, lead - 1)
    lo = np.minimum(ends, np.maximum(0, lead))
    hi = np.minimum(ends, np.maximum(0, last + 1))
    inside = (pos >= lo[queue]) & (pos < hi[queue])
    after = pos >= np.maximum(lo, hi)[queue]
    checked = inside & (offsets >= base0) & (sizes > 0)
    trouble = (
        (inside & ~valid)
        | (after & ((offsets != 0) | (sizes != 0) | (tags != 0)))
        | (checked & (offsets >= log_end))
    )
    clean = np.ones(len(counts), dtype=bool)
    clean[queue[trouble]] = False
    low = np.full(len(counts), never, dtype=np.int64)
    np.minimum.at(low, queue[checked], offsets[checked])
    high = np.full(len(counts), -1, dtype=np.int64)
    np.maximum.at(high, queue[checked], offsets[checked])
    none = high < 0
    ascending = np.ones(len(counts), dtype=bool)
    pairs = inside[:-1] & inside[1:] & (queue[:-1] == queue[1:])
    ascending[queue[:-1][pairs & (offsets[1:] < offsets[:-1])]] = False
    rows = np.flatnonzero(checked)
    return FirstLook(
        lead=lead,
        last=last,
        lo=lo,
        hi=hi,
        min_off=np.where(none, 1, low),
        max_off=np.where(none, 0, high),
        ascending=ascending,
        clean=clean,
        checked=(queue[rows], pos[rows], offsets[rows], sizes[rows], tags[rows]),
    )
