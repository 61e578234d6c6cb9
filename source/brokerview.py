"""A read-only look at one broker store directory, for planning on the driver.

The planner needs, per message queue, the first offset still readable and the last offset whose
message is complete, and the offset of a store time. It gets them from the files directly, with
``pread`` of a few units and record headers (binary searches), not by opening a
:class:`~rocketstore.pipeline.engine.store.MessageStore`: opening a store runs recovery, which reads far more than a
micro-batch trigger can afford, and a writer may be appending in another process meanwhile.

On shared storage (:mod:`rocketstore.pipeline.files.visibility`) what is offered ends at what the writer
published, whatever more this host sees. On one host, what is offered (the ``max`` of
:meth:`BrokerView.queue_bounds`) is safe to read while a writer appends: the writer writes a record into the CommitLog before the ConsumeQueue unit that points
at it, so every valid unit's record is already there. The last unit and its record are checked
anyway (unit non-zero; the record by the native walk: magic, size, physical offset, queue,
queue offset, body CRC and no NUL in its topic or properties), and a unit whose record is not complete yet is not offered until
it is.

The first readable offset (``min``) follows retention: the first unit that still points into
the CommitLog (RocketMQ's ``correctMinOffset``), past any pre-blank units.

A file past the last one this host lists (:class:`rocketstore.pipeline.files.localsegments.LocalSegments`) is one a
writer on another host created since: on shared storage the directory is listed again once
for it, and what is still not listed is not offered yet, never taken for damage. Planning does
not wait for it: a later trigger offers it, and the executors reading what was offered wait
for the files they need (:mod:`rocketstore.source.read`).

Thread-safety: a :class:`BrokerView` holds no open files between calls; each call opens what it
reads, through the read seam (:mod:`rocketstore.pipeline.files.segmentread`), and closes it.
Files that retention deletes during a call make the call start again.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import NamedTuple, TypeVar

from rocketstore.pipeline.errors import SegmentGoneError, StoreError
from rocketstore.pipeline.files import visibility
from rocketstore.pipeline.files.localsegments import LocalSegments
from rocketstore.pipeline.files.segmentread import (
    OpenSegments,
    locate,
    unit_index,
    unit_position,
)
from rocketstore.pipeline.format import native, record
from rocketstore.pipeline.layout import CQ_UNIT_SIZE, PRE_BLANK_SIZE, UNIT

TAIL_CHECK_UNITS = 16  # how far back an incomplete tail is looked past before trusting units
RETRIES = 5

T = TypeVar("T")


class QueueBounds(NamedTuple):
    """``[min, max)``: the queue offsets that can be read now."""

    min: int
    max: int


class Tail(NamedTuple):
    """What the last look at a queue found: ``end``, one past its last valid unit, and
    ``complete``, the end it offered (before units whose record was not complete yet). A
    caller that polls keeps them per queue (see :meth:`BrokerView.queue_bounds`), so that a
    queue with nothing new costs two unit reads instead of a binary search and a record."""

    end: int
    complete: int


Tails = dict[tuple[str, int], Tail]


class _Files:
    """The segment files one call opens, CommitLog and ConsumeQueues alike, through the read
    seam (:mod:`rocketstore.pipeline.files.segmentread`): each read with ``pread`` through a
    descriptor opened on first use, and all closed together."""

    def __init__(self) -> None:
        self._open: list[OpenSegments] = []

    def of(self, directory: Path) -> tuple[LocalSegments, OpenSegments]:
        """The segments of ``directory``, and the ones opened there by this call."""
        files = LocalSegments(directory)
        opened = OpenSegments(files)
        self._open.append(opened)
        return files, opened

    def close(self) -> None:
        for opened in self._open:
            opened.close()
        self._open.clear()


@contextlib.contextmanager
def _files() -> Iterator[_Files]:
    files = _Files()
    try:
        yield files
    finally:
        files.close()


def _retrying(what: str, call: Callable[[], T]) -> T:
    """Run ``call`` again when retention deleted a file under it (a listing went stale)."""
    for _ in range(RETRIES - 1):
        try:
            return call()
        except SegmentGoneError:
            continue
    try:
        return call()
    except SegmentGoneError as exc:
        raise StoreError(f"{what}: files keep disappearing while reading ({exc})") from None


class _CommitLog:
    """The CommitLog segments of a broker as listed once per call, and once more when an
    offset past them is asked for (see the module docstring)."""

    def __init__(self, directory: Path, files: _Files) -> None:
        self.files, self.open = files.of(directory)
        self.segments = self.files.listed()
        self.segment_size = self.files.file_size()
        self._relist = True

    @property
    def min_offset(self) -> int:
        return self.segments[0] if self.segments else 0

    def listed(self, phys: int) -> bool:
        """Whether a listed segment holds ``phys``; one past them lists the directory again
        (once per call)."""
        if self._holds(phys):
            return True
        past = not self.segments or phys >= self.min_offset
        return past and self._relisted() and self._holds(phys)

    def _holds(self, phys: int) -> bool:
        if not self.segments or not self.segment_size or phys < self.min_offset:
            return False
        return self.files.is_listed(locate(phys, self.segment_size)[0])

    def _relisted(self) -> bool:
        """List the directory again, the first time it is asked for; whether it was."""
        if not self._relist:
            return False
        self._relist = False
        self.files.relist()
        self.segments = self.files.listed()
        if self.segments and not self.segment_size:
            self.segment_size = self.files.file_size()
        return True

    def read(self, phys: int, n: int) -> bytes | None:
        if not self.listed(phys):
            return None
        base, rel = locate(phys, self.segment_size)
        n = min(n, self.segment_size - rel)
        return self.open.get(base).read(rel, n)

    def store_timestamp(self, phys: int) -> int:
        raw = self.read(phys, record.OFF_BORNHOST + 20 + 8)
        if raw is None or len(raw) < record.OFF_BORNHOST + 8 + 8:
            return -1
        return record.store_timestamp_at(raw, 0)


class _Queue:
    """One ConsumeQueue's files as listed once per call (:meth:`relist`: again); units by
    queue offset."""

    def __init__(self, directory: Path, files: _Files) -> None:
        self.files, self.open = files.of(directory)
        self._take_listing()

    def relist(self) -> None:
        self.files.relist()
        self._take_listing()

    def _take_listing(self) -> None:
        self.segments = self.files.listed()
        # A writer that creates a file and then sizes it (RocketMQ does) can leave an empty
        # file at the end for a moment; it holds no units.
        if self.segments and self.files.size_of(self.segments[-1]) == 0:
            self.segments.pop()
        self.file_size = self.files.file_size() if self.segments else 0
        self.per_file = unit_index(0, self.file_size)

    @property
    def first(self) -> int:
        return unit_index(self.segments[0], 0) if self.segments else 0

    def unit(self, i: int) -> tuple[int, int, int]:
        base, position = unit_position(i, self.file_size)
        offset, size, tags = UNIT.unpack(self.open.get(base).read(position, CQ_UNIT_SIZE))
        return offset, size, tags

    def valid(self, i: int) -> bool:
        offset, size, _ = self.unit(i)
        return offset >= 0 and size > 0

    def end(self, hint: int | None = None) -> int:
        """One past the last valid unit: the first invalid unit of the last file that has any
        (a file created but not written yet holds none). ``hint``, the end a call before found,
        is checked first: when the units on either side of it still say so it is the end, else
        the search runs (from the hint, in steps that double, when the queue only grew within
        its last file: a few units more cost a few reads, not a search of the whole file)."""
        if hint is not None and self.segments:
            first = unit_index(self.segments[-1], 0)
            last = unit_index(self.segments[-1], self.file_size)
            if first < hint <= last and self.valid(hint - 1):
                if hint == last or not self.valid(hint):
                    return hint
                return _first_true_from(hint + 1, last, lambda i: not self.valid(i))
        for idx in range(len(self.segments) - 1, -1, -1):
            first = unit_index(self.segments[idx], 0)

            def invalid(k: int, first: int = first) -> bool:
                return not self.valid(first + k)

            count = _first_true(0, self.per_file, invalid)
            if count > 0 or idx == 0:
                return first + count
        return 0


def _first_true_from(lo: int, hi: int, pred: Callable[[int], bool]) -> int:
    """:func:`_first_true`, for an answer expected close to ``lo``: ``lo``, ``lo + 1``,
    ``lo + 3``, ``lo + 7``, ... are looked at until ``pred`` holds, then the search runs
    within the last step."""
    step = 1
    while lo < hi:
        probe = min(lo + step - 1, hi - 1)
        if pred(probe):
            return _first_true(lo, probe, pred) if probe > lo else probe
        lo = probe + 1
        step *= 2
    return hi


def _first_true(lo: int, hi: int, pred: Callable[[int], bool]) -> int:
    """The smallest ``i`` in ``[lo, hi)`` with ``pred(i)``, for a ``pred`` false then true;
    ``hi`` if there is none."""
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


class BrokerView:
    """One broker directory (see the module docstring). Cheap; picklable; holds no files."""

    def __init__(
        self, name: str, path: str | os.PathLike[str], shared_storage: str = "auto"
    ) -> None:
        self.name = name
        self.path = Path(path)
        self.shared = visibility.is_shared(self.path, shared_storage)

    def __repr__(self) -> str:
        return f"BrokerView({self.name!r}, {str(self.path)!r})"

    def queue_ids(self, topic: str) -> list[int]:
        """Queue ids of ``topic`` that have a ConsumeQueue directory on this broker."""
        try:
            entries = list((self.path / "consumequeue" / topic).iterdir())
        except FileNotFoundError:
            return []
        return sorted(int(p.name) for p in entries if p.name.isdigit() and p.is_dir())

    def commitlog_min_offset(self) -> int:
        with _files() as files:
            return _CommitLog(self.path / "commitlog", files).min_offset

    def queue_bounds(self, topic: str, queue_id: int, tails: Tails | None = None) -> QueueBounds:
        """The readable offsets of one queue now (see the module docstring). ``tails``, kept by
        a caller from one call to the next for this broker, starts from what the last call
        found; the answer is the same as without it."""
        return self._bounds(topic, [queue_id], tails)[queue_id]

    def all_bounds(
        self,
        topic: str,
        tails: Tails | None = None,
        published: visibility.Published | None = None,
    ) -> dict[int, QueueBounds]:
        """:meth:`queue_bounds` of every queue of ``topic`` on this broker. On shared storage,
        ``published`` is the published point when the caller has just read it (else it is
        read here)."""
        return self._bounds(topic, self.queue_ids(topic), tails, published)

    def _bounds(
        self,
        topic: str,
        queue_ids: list[int],
        tails: Tails | None,
        published: visibility.Published | None = None,
    ) -> dict[int, QueueBounds]:
        point = None
        if self.shared:
            point = published if published is not None else visibility.published(self.path)
        out: dict[int, QueueBounds] = {}
        with _files() as files:
            # One listing of the CommitLog for all the queues: it is the same for each. When
            # retention deletes a file under one queue's look, that queue is looked at again
            # with the CommitLog listed again, and the queues done stay done: over thousands
            # of queues, starting all over again would meet retention again.
            logs = [_CommitLog(self.path / "commitlog", files)]

            def look(q: int) -> QueueBounds:
                try:
                    return self._queue_bounds(files, logs[0], topic, q, tails, point)
                except SegmentGoneError:
                    logs[0] = _CommitLog(self.path / "commitlog", files)  # for the next look
                    raise

            for q in queue_ids:
                out[q] = _retrying(f"{self.path}/consumequeue/{topic}/{q}", partial(look, q))
        return out

    def _queue_bounds(
        self,
        files: _Files,
        log: _CommitLog,
        topic: str,
        queue_id: int,
        tails: Tails | None,
        point: visibility.Published | None,
    ) -> QueueBounds:
        cq = _Queue(self.path / "consumequeue" / topic / str(queue_id), files)
        want = 0 if point is None else point.queue_length(topic, queue_id)
        if not cq.segments and want > 0:
            cq.relist()  # published units in a first file this host does not list yet
        if not cq.segments:
            return QueueBounds(0, 0)
        last = None if tails is None else tails.get((topic, queue_id))
        raw_end = cq.end(None if last is None else last.end)
        if point is not None:
            # Shared storage: nothing past what the writer published (rocketstore.pipeline.files.visibility).
            if raw_end < want:
                # Published, but not seen here: this host's listing of the queue's files
                # lacks the newest, or it still caches older pages of the last ones. Ask the
                # file system again.
                cq.relist()
                for base in cq.segments[-2:]:
                    cq.files.forget_cached(base)
                raw_end = cq.end(None)
            raw_end = max(cq.first, min(raw_end, want))
        if last is not None and last == Tail(raw_end, raw_end):
            # The tail's record checked out last time and its unit is still there.
            end = raw_end
        else:
            end = self._complete_end(cq, log, queue_id, raw_end)
            if point is not None and end < raw_end:
                # Records below the published point that do not check out here: older
                # pages of the segment they are in, cached on this host.
                for base in log.segments[-2:]:
                    log.files.forget_cached(base)
                end = self._complete_end(cq, log, queue_id, raw_end)
        if tails is not None:
            tails[(topic, queue_id)] = Tail(raw_end, end)
        cl_min = log.min_offset

        def live(i: int) -> bool:
            offset, size, _ = cq.unit(i)
            return offset >= cl_min and 0 < size != PRE_BLANK_SIZE

        first = cq.first
        # Until retention reaches a queue its first unit is live: one read, no search.
        if first < end and live(first):
            return QueueBounds(first, end)
        return QueueBounds(_first_true(first, end, live), end)

    def _complete_end(self, cq: _Queue, log: _CommitLog, queue_id: int, end: int) -> int:
        """``end`` moved back past units whose record is not complete yet, or not in a
        segment this host lists."""
        i = end - 1
        while i >= cq.first and i >= end - TAIL_CHECK_UNITS:
            offset, size, _ = cq.unit(i)
            if size == PRE_BLANK_SIZE or offset < log.min_offset:
                return i + 1  # nothing to check: a pre-blank, or a record retention deleted
            if self.shared and not log.listed(offset):
                # Not visible here yet (see the module docstring), so not damage either: the
                # run of units counted as damage below starts before it. On one host the
                # listing is the directory, and a unit past the log is damage.
                end = i
                i -= 1
                continue
            raw = log.read(offset, size)
            if raw is not None and len(raw) == size:
                got = native.walk(raw, 0, size, offset, check_crc=True, max_records=1)
                if len(got) == 1 and (
                    int(got.sizes[0]),
                    int(got.queue_ids[0]),
                    int(got.queue_offsets[0]),
                ) == (size, queue_id, i):
                    return i + 1
            i -= 1
        # A long run of units whose records do not check out is damage, not a write in
        # progress: offer them, so that reading reports the damaged record instead of the
        # query silently stalling before it.
        return end if i >= cq.first else max(i + 1, cq.first)

    def offset_for_time(
        self, topic: str, queue_id: int, timestamp: int, bounds: QueueBounds
    ) -> int:
        """The first offset in ``bounds`` whose message was stored at or after ``timestamp`` (ms),
        ``bounds.max`` if there is none. A binary search over the units' store times, which
        rise with the queue offset (the store stamps records in CommitLog order)."""

        def search() -> int:
            with _files() as files:
                log = _CommitLog(self.path / "commitlog", files)
                cq = _Queue(self.path / "consumequeue" / topic / str(queue_id), files)
                if not cq.segments:
                    return bounds.max

                def at_or_after(i: int) -> bool:
                    if i < cq.first:
                        return False  # deleted by retention since the bounds: stored before
                    offset, _, _ = cq.unit(i)
                    return log.store_timestamp(offset) >= timestamp

                return _first_true(bounds.min, bounds.max, at_or_after)

        return _retrying(f"{self.path}/consumequeue/{topic}/{queue_id}", search)
