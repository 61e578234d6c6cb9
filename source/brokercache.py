"""Each broker's queue bounds kept between plans, re-read only for brokers whose files changed.

A streaming query plans every trigger (``latestOffset``, then ``partitions``), and an idle query
triggers again and again: reading every queue of every broker each time costs a few listings,
``stat`` calls and unit reads per queue, so a root of 64 brokers costs tens of milliseconds a
plan, however few brokers a writer touched. :class:`BoundsCache` keeps what the last read of a
broker found, with a :class:`Stamp` of the broker's files taken before that read, and reads
the broker again only when the stamp no longer holds.

The stamp rests on the progress file ``config/rocketstore.json``
(:mod:`rocketstore.pipeline.files.progress`), which a writer replaces (a new inode, by a rename)
after every flush that stored a record, naming the CommitLog's flushed end, the last record
before it and every queue's length then. A broker's bounds are kept only when that file
describes them exactly: every queue of the query has the length the file records, every queue
the file records for the query's topics was found, and (on one host) no record follows the
flushed end. A stamp holds while

* the progress file is the same file (``st_ino``, ``st_size``, ``st_mtime_ns``,
  ``st_ctime_ns``), or, when those changed, it still records the same progress: a writer that
  flushed since replaced it with a newer record (its flush time at least differs), while a FUSE
  client may answer a ``stat`` from attributes it cached before the file was whole and later
  give the true ones (a GlusterFS mount was seen to report a replaced file one byte short,
  then its full size, same inode and times), which changes nothing a read would find;
* the first CommitLog segment is still there: retention deletes it first, which moves the
  queues' earliest offsets;
* on one host (not shared storage), the last record still ends at the flushed end and
  nothing follows it: a writer that appended since without flushing yet, or one that a crash
  and a recovery cut back, changed those bytes. One host shares one page cache, so a fresh read
  would see such an append at once, and so does this check.

On shared storage (:mod:`rocketstore.pipeline.files.visibility`) readers offer nothing past the
published point, which is the progress file's content: an unchanged file with a writer on
another host appending after it is what a fresh read would offer too, so the third check does
not apply there. A broker this host has not caught up with yet (a queue below its published
length: pages or listings it still caches) is not kept, so the next plan looks again.

So a kept value is never ahead of what a fresh read would give, and it is dropped as soon as
the progress file changes. A broker without a progress file (written by RocketMQ itself), or
whose writer is appending (records past the flushed end), is read at every plan, as before.
What a check costs: on one host two ``stat`` calls and one small read (the last record's
header and the 8 bytes after it), on shared storage a listing of ``config/`` (it refreshes a
FUSE client's entry of the renamed file) and two ``stat`` calls; :class:`PlanWork` counts
checks and reads (reading the progress file again, when its attributes changed, is part of a
check). A replaced file always has a new inode (the new one is created while the
old one still exists); only two rewrites between plans could bring an inode number back, and
with it an equal size and time, and on one host the check of the log's tail still sees the
records they flushed.

Driver side (the source's planner); not thread-safe (Spark plans from one thread).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Collection, Sequence
from pathlib import Path

from rocketstore.pipeline.errors import SegmentGoneError
from rocketstore.pipeline.files import visibility
from rocketstore.pipeline.files.localsegments import LocalSegments
from rocketstore.pipeline.files.progress import FILE_NAME as PROGRESS_FILE
from rocketstore.pipeline.files.progress import FlushProgress
from rocketstore.pipeline.files.segmentread import locate
from rocketstore.pipeline.format import record
from rocketstore.source.brokerview import BrokerView, QueueBounds, Tails

_HEAD = record.SIZE_MAGIC  # a record's TOTALSIZE and MAGIC (signed, as MAGIC is)
FileId = tuple[int, int, int, int]  # st_ino, st_size, st_mtime_ns, st_ctime_ns
TopicBounds = dict[str, dict[int, QueueBounds]]  # topic -> queue id -> bounds


@dataclasses.dataclass
class PlanWork:
    """What planning did to the brokers' files since the planner was made."""

    checked: int = 0  # brokers whose kept bounds were checked against their files (a stamp)
    read: int = 0  # brokers whose queues were read (listings, units, tail records)

    def snapshot(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, eq=False)
class Stamp:
    """What a broker's files were when its bounds were read (see the module docstring). Paths
    are kept as strings: a check is a few system calls, and building paths would cost more."""

    progress_path: str
    progress: FileId
    recorded: FlushProgress  # what the progress file said, read after ``progress`` was taken
    log: str  # the CommitLog's directory
    first_segment: int  # the base of its first segment
    # The last flushed record: the base of the segment it is in, where, and its size; then
    # where the next record would start (the same segment, or the next when it filled it).
    record_base: int
    record_pos: int
    record_size: int
    next_base: int
    next_pos: int


def _file_id(path: str) -> FileId | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _read(log: LocalSegments, base: int, position: int, n: int) -> bytes:
    """``n`` bytes of the segment at ``base`` (zeros past its end; none when it is not
    there)."""
    try:
        return log.read(base, position, n)
    except SegmentGoneError:
        return b""


# The last record and the bytes after it in one read, when it is no bigger than this.
_ONE_READ = 4096


def _ends_at_flushed(stamp: Stamp) -> bool:
    """Whether the last flushed record is still there, of its size, and nothing follows it
    (zeros, or no segment file for it yet)."""
    n = _HEAD.size
    log = LocalSegments(stamp.log)
    if stamp.next_base == stamp.record_base and stamp.record_size <= _ONE_READ:
        raw = _read(log, stamp.record_base, stamp.record_pos, stamp.record_size + n)
        head, after = raw[:n], raw[stamp.record_size :]
    else:
        head = _read(log, stamp.record_base, stamp.record_pos, n)
        after = _read(log, stamp.next_base, stamp.next_pos, n)
    if len(head) < n or _HEAD.unpack(head) != (stamp.record_size, record.MAGIC):
        return False
    return not any(after)


def _progress_file(view: BrokerView) -> str:
    config = os.path.join(view.path, "config")
    if view.shared:
        # A FUSE client answers a look-up of the renamed file from its cached entry until the
        # directory is listed (rocketstore.pipeline.files.visibility.published).
        with contextlib.suppress(OSError):
            os.listdir(config)
    return os.path.join(config, PROGRESS_FILE)


def take_stamp(view: BrokerView) -> Stamp | None:
    """The stamp of ``view``'s files now (``recorded``: the progress file it rests on); None
    when the broker has no usable progress file, or (on one host) a writer has appended past
    its flushed end."""
    path = _progress_file(view)
    before = _file_id(path)
    if before is None:
        return None
    progress = FlushProgress.read(Path(path).parent)
    if progress is None:
        return None
    last, end = progress.last_record_offset, progress.flushed_offset
    log = LocalSegments(view.path / "commitlog")
    segments = log.listed()
    if not segments or not 0 <= last < end:
        return None
    size = log.file_size()
    if size <= 0:
        return None
    record_base, record_pos = locate(last, size)
    next_base, next_pos = locate(end, size)
    stamp = Stamp(
        path,
        before,
        progress,
        log.location,
        segments[0],
        record_base,
        record_pos,
        end - last,
        next_base,
        next_pos,
    )
    if not view.shared and not _ends_at_flushed(stamp):
        return None
    return stamp


def holds(view: BrokerView, stamp: Stamp) -> Stamp | None:
    """``stamp`` if it still describes ``view``'s files (see the module docstring), with the
    progress file's attributes as they are now; None when it does not."""
    config = os.path.dirname(stamp.progress_path)
    if view.shared:
        with contextlib.suppress(OSError):
            os.listdir(config)
    now = _file_id(stamp.progress_path)
    if now is None:
        return None
    if now != stamp.progress:
        # Replaced (a newer record), or the same record with attributes the file system now
        # reports differently: only reading it tells which.
        if FlushProgress.read(Path(config)) != stamp.recorded:
            return None
        stamp = dataclasses.replace(stamp, progress=now)
    if LocalSegments(stamp.log).size_of(stamp.first_segment) < 0:
        return None
    if not view.shared and not _ends_at_flushed(stamp):
        return None
    return stamp


def described(bounds: TopicBounds, progress: FlushProgress) -> bool:
    """Whether ``bounds`` are exactly what ``progress`` records for their topics: every queue
    read has the recorded length, and every queue recorded with units was read."""
    recorded: dict[str, dict[int, int]] = {topic: {} for topic in bounds}
    for name, length in progress.queues.items():
        topic, _, qid = name.rpartition("/")
        if topic in recorded and qid.isdigit():
            recorded[topic][int(qid)] = length
    for topic, queues in bounds.items():
        lengths = recorded[topic]
        if any(qid not in queues for qid, length in lengths.items() if length > 0):
            return False
        if any(b.max != lengths.get(qid, 0) for qid, b in queues.items()):
            return False
    return True


@dataclasses.dataclass
class _Kept:
    stamp: Stamp
    bounds: TopicBounds


class BoundsCache:
    """Per broker, the bounds the last read found and the stamp they rest on."""

    def __init__(self) -> None:
        self._kept: dict[str, _Kept] = {}
        self.work = PlanWork()

    def bounds(self, view: BrokerView, topics: Sequence[str], tails: Tails) -> TopicBounds:
        """Every queue's bounds of ``topics`` on ``view``'s broker: the kept ones while their
        stamp holds, else read afresh (:meth:`BrokerView.all_bounds`, with ``tails``)."""
        kept = self._kept.get(view.name)
        if kept is not None:
            self.work.checked += 1
            stamp = holds(view, kept.stamp) if kept.bounds.keys() >= set(topics) else None
            if stamp is not None:
                kept.stamp = stamp
                return {t: kept.bounds[t] for t in topics}
        self._kept.pop(view.name, None)
        # Taken before the read: what the read finds is at least as new as the stamp, so a
        # stamp that still holds later vouches for it.
        taken = take_stamp(view)
        self.work.read += 1
        point = None
        if taken is not None and view.shared:
            point = visibility.Published(taken.recorded.flushed_offset, taken.recorded.queues)
        found = {t: view.all_bounds(t, tails, point) for t in topics}
        if taken is not None and described(found, taken.recorded):
            self._kept[view.name] = _Kept(taken, found)
        return found

    def keep_only(self, names: Collection[str]) -> None:
        """Drop what is kept of brokers not in ``names`` (gone from the root)."""
        for name in [n for n in self._kept if n not in names]:
            del self._kept[name]
