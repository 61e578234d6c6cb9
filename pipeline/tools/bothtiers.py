"""A store directory as the reading commands see it with the tier on: the local files and,
below them, the sealed segments in the bucket that local retention may have deleted
(docs/tiering.md, docs/cli.md#tiered-storage).

:class:`BothTiers` wraps a read-only :class:`MessageStore` and the store's tier
(:func:`~rocketstore.pipeline.tier.remote.open_tier`: None with the tier off, and then every
call is the store's own, and boto3 is never imported). What the local files hold is read from
them; only queue offsets below a queue's local min offset, and key look-ups in segments the
local files no longer hold, go to the bucket, through the tier's read side
(:mod:`rocketstore.pipeline.tier.remote`: the segment indexes' units, then the records they
name by ranged GETs), decoded with every check (:func:`native.decode`, the body CRC included)
and each checked to be its unit's record.

Bounds: a queue's range in the tier is ``[its first offset in the tier's segments (the index
heads), its next offset at the tier's end (the manifest's queues))``; the queue starts at the
tier's first offset when that is below its local min offset. Offsets between the tier's end
and the local min offset (segments in neither tier: local retention ran while the tier was
off) are :attr:`QueueSpan.gap`: lost, a get there answers ``OFFSET_TOO_SMALL`` pointing at
the local files' start, as a local queue answers below its min offset.

Errors: an object the manifest names that is missing, shorter than it says or damaged raises
:class:`CorruptRecordError` (:class:`CorruptIndexError` for an index object) naming the
object and the byte; nothing of it is returned as good. What the tier's own retention removed
is :class:`SegmentGoneError`.

Owns: nothing on disk; the manifest and index heads it fetched (memory). Thread-safety: none
(one command's thread). Crash behaviour: reads only. Requires: the store opened read-only, and
with the tier on the 'tier' extra (boto3) and the bucket's credentials.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine import logread
from rocketstore.pipeline.engine.results import GetResult, QueueInfo
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import CorruptIndexError, NotFoundError, OffsetOutOfRangeError
from rocketstore.pipeline.files.mappedfile import segment_name
from rocketstore.pipeline.files.segmentread import locate
from rocketstore.pipeline.format import native
from rocketstore.pipeline.format.record import MessageExt
from rocketstore.pipeline.format.segmentindex import UNIT_SIZE, Units
from rocketstore.pipeline.format.subscription import Subscription

if TYPE_CHECKING:  # the tier's S3 modules load only when the tier is on (boto3 with them)
    from rocketstore.pipeline.tier.remote import RemoteQueue, RemoteSegments

PAGE = 1000  # units read from the tier's indexes at once
# As RocketMQ's pull: at most this many units scanned per get (16000 bytes of ConsumeQueue).
SCAN_UNITS = 800


@dataclasses.dataclass(frozen=True)
class QueueSpan:
    """One queue across both tiers: ``info`` its bounds as a reader sees them (min from the
    tier where the tier holds older offsets than the local files), ``local`` and ``tier`` the
    ``[first, end)`` each holds (None: none of it), ``gap`` offsets in neither (between the
    tier's end and the local min offset)."""

    info: QueueInfo
    local: tuple[int, int] | None
    tier: tuple[int, int] | None
    gap: tuple[int, int] | None = None

    @property
    def tier_only(self) -> tuple[int, int] | None:
        """The offsets only the tier holds, read from it: ``[tier first, local first)`` (to
        the tier's end, before a gap)."""
        if self.tier is None:
            return None
        end = self.tier[1] if self.local is None else min(self.tier[1], self.local[0])
        return (self.tier[0], end) if self.tier[0] < end else None


class BothTiers:
    """A store directory's reads across both tiers (see the module docstring)."""

    def __init__(self, store: MessageStore, tier: RemoteSegments | None) -> None:
        self.store = store
        self.tier = tier

    @classmethod
    def open(cls, path: str | Path, config: StoreConfig) -> BothTiers:
        """The store at ``path`` opened read-only, and its tier when ``config`` turns it on
        (the bucket asked once: wrong credentials fail here, naming the setting)."""
        store = MessageStore(path, config, read_only=True)
        try:
            if not config.tier_on:
                return cls(store, None)
            from rocketstore.pipeline.tier.remote import open_tier

            return cls(store, open_tier(Path(path), config))
        except BaseException:
            store.close()
            raise

    def __enter__(self) -> BothTiers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.store.close()

    # -- bounds -----------------------------------------------------------------------------
    def spans(
        self, topic: str | None = None, *, topics: Collection[str] | None = None
    ) -> list[QueueSpan]:
        """Every queue (of ``topic``, or of ``topics``) of the local files or the tier, sorted."""
        infos = self.store.queue_infos(topic, topics=topics)
        local = {(i.topic, i.queue_id): i for i in infos}
        if self.tier is None:
            return [QueueSpan(i, (i.min_offset, i.max_offset), None) for i in infos]
        ends = {
            (t, int(q)): end
            for t, queues in self.tier.manifest.queues.items()
            if (topic is None or t == topic) and (topics is None or t in topics)
            for q, end in queues.items()
        }
        return [self._span(k, local.get(k), ends.get(k)) for k in sorted(set(local) | set(ends))]

    def span(self, topic: str, queue_id: int) -> QueueSpan | None:
        """One queue's span (no other queue's read); None when neither tier has the queue."""
        infos = self.store.queue_infos(topic)
        info = next((i for i in infos if i.queue_id == queue_id), None)
        if self.tier is None:
            return (
                None if info is None else QueueSpan(info, (info.min_offset, info.max_offset), None)
            )
        end = self.tier.manifest.queues.get(topic, {}).get(str(queue_id))
        if info is None and end is None:
            return None
        return self._span((topic, queue_id), info, end)

    def _span(
        self, key: tuple[str, int], info: QueueInfo | None, tier_end: int | None
    ) -> QueueSpan:
        assert self.tier is not None
        local = None if info is None else (info.min_offset, info.max_offset)
        tier = None
        if tier_end and (local is None or local[0] > 0):
            # Only a queue that starts past 0 locally can have older offsets in the tier: the
            # others cost no GET.
            first = _queue(self.tier, *key).min_offset()
            if first is not None and first < tier_end:
                tier = (first, tier_end)
        if tier is None:
            end = tier_end or 0
            return QueueSpan(info or QueueInfo(*key, end, end, 0), local, None)
        if info is not None and local is not None and (local[0] < local[1] or tier[1] < local[0]):
            low = min(tier[0], local[0])
            gap = (tier[1], local[0]) if tier[1] < local[0] else None
            return QueueSpan(dataclasses.replace(info, min_offset=low), local, tier, gap)
        # The tier holds all of the queue there is: its last unit says where its records end.
        last = _queue(self.tier, *key).units(tier[1] - 1, tier[1])
        max_phys = int(last["offset"][0]) + int(last["size"][0]) if len(last) else 0
        high = tier[1] if local is None else max(tier[1], local[1])
        return QueueSpan(QueueInfo(*key, tier[0], high, max_phys), local, tier)

    # -- messages ---------------------------------------------------------------------------
    def tier_messages(self, topic: str, queue_id: int, a: int, b: int) -> Iterator[MessageExt]:
        """The messages of queue offsets ``[a, b)``, which the tier must hold, in order: its
        units, then the records they name, each decoded with every check and checked to be
        its unit's (a unit naming another record is the index object's damage)."""
        assert self.tier is not None
        tier, queue = self.tier, _queue(self.tier, topic, queue_id)
        for pos in range(a, b, PAGE):
            stop = min(b, pos + PAGE)
            units = queue.units(pos, stop)
            if len(units) != stop - pos:
                raise OffsetOutOfRangeError(
                    f"{tier.location}: {topic}/{queue_id} offsets [{pos + len(units)}, {stop}) "
                    f"are not in the tier, which holds the queue up to {queue.max_offset()}"
                )
            yield from self._records(queue, list(range(pos, stop)), units)

    def log_messages(self, topic: str | None = None) -> Iterator[MessageExt]:
        """Every message a queue holds (of ``topic``) in CommitLog order across both tiers:
        first the tier's segments below the local files, each object's records fetched once
        for all its queues (its index's units of them, sorted by offset, read as the queues'
        reads read a run of records), then the local files (:func:`logread.log_batches`)."""
        if self.tier is not None:
            local_start = self.store.min_phy_offset
            for entry in self.tier.entries:
                if entry.base >= local_start:
                    break
                yield from self._segment_messages(entry.base, topic)
        for batch in logread.log_batches(self.store, topic):
            yield from native.messages(batch)

    def log_gap(self) -> tuple[int, int] | None:
        """CommitLog offsets ``[a, b)`` in neither tier (between the tier's end and the local
        files' start: local retention ran while the tier was off); None when there are none."""
        if self.tier is None or not self.tier.entries:
            return None
        # Past the tier's last segment (its data end is followed by the blank to its end).
        end = self.tier.entries[-1].base + self.tier.file_size()
        local_start = self.store.min_phy_offset
        return (end, local_start) if end < local_start else None

    def _segment_messages(self, base: int, topic: str | None) -> Iterator[MessageExt]:
        """The messages of the tier's segment at ``base`` (of ``topic``), in log order; each
        checked to be the record its unit names (:class:`CorruptIndexError` otherwise)."""
        tier = self.tier
        assert tier is not None
        index = tier.index(base)
        rows = [r for r in index.rows if topic is None or r.topic == topic]
        if not rows:
            return
        lo = min(r.start for r in rows)
        hi = max(r.start + UNIT_SIZE * r.units for r in rows)
        raw = tier.fetch(tier.index_key(base), lo, hi, base)
        units = np.concatenate(
            [
                index.units(r, raw[r.start - lo : r.start - lo + UNIT_SIZE * r.units], r.start)
                for r in rows
            ]
        )
        owner = np.repeat(np.arange(len(rows)), [r.units for r in rows])
        nth = np.concatenate([np.arange(r.units) for r in rows])
        phys = units["offset"].astype(np.int64)
        order = np.argsort(phys, kind="stable")
        rel = phys[order] - base
        sizes = units["size"].astype(np.int64)[order]
        for start, data, run in tier.read_records(base, rel, sizes):
            batch = native.decode(
                data, rel[run] - start, base + start, path=tier.where(base), sizes=sizes[run]
            )
            for k, msg in zip(order[run].tolist(), native.messages(batch), strict=True):
                row = rows[int(owner[k])]
                want = (row.topic, row.queue_id, row.first + int(nth[k]))
                if (msg.topic, msg.queue_id, msg.queue_offset) != want:
                    raise CorruptIndexError(
                        index.where,
                        row.start + UNIT_SIZE * int(nth[k]),
                        f"unit {want[2]} of {row.topic}:{row.queue_id} names CommitLog offset "
                        f"{msg.commit_log_offset}, where the record is "
                        f"{msg.topic}:{msg.queue_id} at queue offset {msg.queue_offset}",
                    )
                yield msg

    def _records(
        self, queue: RemoteQueue, offsets: list[int], units: Units
    ) -> Iterator[MessageExt]:
        """The records ``units`` name, in their order; ``offsets``: each unit's queue offset."""
        tier = queue.tier
        phys = units["offset"].astype(np.int64)
        sizes = units["size"].astype(np.int64)
        bases, rel = locate(phys, tier.file_size())
        out: list[MessageExt | None] = [None] * len(units)
        for idx in np.split(np.arange(len(phys)), np.flatnonzero(np.diff(bases)) + 1):
            if not len(idx):
                continue
            base = int(bases[idx[0]])
            for start, raw, run in tier.read_records(base, rel[idx], sizes[idx]):
                at = idx[run]
                batch = native.decode(
                    raw, rel[at] - start, base + start, path=tier.where(base), sizes=sizes[at]
                )
                for i, msg in zip(at.tolist(), native.messages(batch), strict=True):
                    want = (queue.topic, queue.queue_id, offsets[i])
                    if (msg.topic, msg.queue_id, msg.queue_offset) != want:
                        where, byte = self._unit_at(queue, offsets[i])
                        raise CorruptIndexError(
                            where,
                            byte,
                            f"unit {offsets[i]} of {queue.topic}/{queue.queue_id} names the "
                            f"record at CommitLog offset {msg.commit_log_offset} of "
                            f"{segment_name(base)}, which is {msg.topic}/{msg.queue_id}/"
                            f"{msg.queue_offset}",
                        )
                    out[i] = msg
        for got in out:
            assert got is not None
            yield got

    @staticmethod
    def _unit_at(queue: RemoteQueue, offset: int) -> tuple[str, int]:
        found = queue.locate(offset)
        if found is None:
            return queue.tier.location, offset
        base, row = found
        return queue.tier.index(base).where, row.start + UNIT_SIZE * (offset - row.first)

    def queue_messages(self, span: QueueSpan) -> Iterator[MessageExt]:
        """Every message of the tier-only part of a queue (``span.tier_only``), in order."""
        part = span.tier_only
        if part is not None:
            yield from self.tier_messages(span.info.topic, span.info.queue_id, *part)

    def get_messages(
        self, topic: str, queue_id: int, offset: int, max_count: int, tags: str | None
    ) -> GetResult:
        """:meth:`MessageStore.get_messages` across both tiers: an offset only the tier holds
        is read from it, up to where the local files start (``nextBeginOffset`` says where to
        go on); the bounds reported are the queue's across both."""
        local = self.store.get_messages(topic, queue_id, offset, max_count, tags)
        span = self.span(topic, queue_id) if self.tier is not None else None
        if span is None:
            return local
        lo, hi = span.info.min_offset, span.info.max_offset
        part = span.tier_only
        if part is None or not part[0] <= offset < part[1]:
            if offset < lo:
                return GetResult("OFFSET_TOO_SMALL", [], lo, lo, hi)
            if local.status in ("NO_MATCHED_LOGIC_QUEUE", "NO_MESSAGE_IN_QUEUE") and offset >= hi:
                status = "OFFSET_OVERFLOW_ONE" if offset == hi else "OFFSET_OVERFLOW_BADLY"
                return GetResult(status, [], offset if offset == hi else lo, lo, hi)
            return dataclasses.replace(local, min_offset=lo, max_offset=max(hi, local.max_offset))
        sub = Subscription.parse(tags)
        assert self.tier is not None
        queue = _queue(self.tier, topic, queue_id)
        found: list[MessageExt] = []
        pos = offset
        stop_at = min(part[1], offset + max(SCAN_UNITS, max_count))
        while pos < stop_at and len(found) < max_count:
            stop = min(stop_at, pos + PAGE)
            units = queue.units(pos, stop)
            keep = np.flatnonzero(sub.hash_filter(units["tags_code"].astype(np.int64)))
            scanned = len(units)
            kept = self._records(queue, (pos + keep).tolist(), units[keep])
            for i, msg in zip(keep.tolist(), kept, strict=True):
                if sub.matches_tag(msg.tags):
                    found.append(msg)
                    if len(found) >= max_count:
                        scanned = i + 1
                        break
            pos += scanned
            if scanned == 0:
                break
        return GetResult("FOUND" if found else "NO_MATCHED_MESSAGE", found, pos, lo, hi)

    def offset_by_time(self, topic: str, queue_id: int, timestamp: int) -> int:
        """:meth:`MessageStore.offset_by_time`, from the tier when the first message stored at
        or after ``timestamp`` is in the queue's tier-only offsets (or the local files hold
        none of the queue)."""
        span = self.span(topic, queue_id) if self.tier is not None else None
        part = span.tier_only if span is not None else None
        if self.tier is not None and span is not None and part is not None:
            got = _queue(self.tier, topic, queue_id).offset_by_time(timestamp)
            if got is not None and got < part[1]:
                return max(got, part[0])
            if span.local is None or span.local[0] == span.local[1]:
                return part[1] if got is None else min(got, part[1])
        return self.store.offset_by_time(topic, queue_id, timestamp)

    def tier_message_at(self, offset: int) -> MessageExt | None:
        """The message at CommitLog offset ``offset`` when only the tier holds it (below the
        local files' start); None when the local files are the ones to ask. Raises
        :class:`NotFoundError` when the tier holds the offset but no record starts there."""
        tier = self.tier
        if tier is None or offset >= self.store.min_phy_offset:
            return None
        first = tier.first()
        if first is None or not first <= offset < tier.end():
            return None
        msg = tier.record_at(offset)
        if msg is None:
            raise NotFoundError(
                f"{tier.location}: no record starts at CommitLog offset {offset} (it lies "
                "inside another record, or past the end of a segment's data); records start "
                "where `dump` or `queues` show their commitLogOffset"
            )
        return msg

    def log_start(self) -> int:
        """The first CommitLog offset either tier holds."""
        first = self.tier.first() if self.tier is not None else None
        local = self.store.min_phy_offset
        return local if first is None else min(first, local)

    def query_by_key(
        self, topic: str, key: str, *, begin: int, end: int, max_count: int | None
    ) -> list[MessageExt]:
        """:meth:`MessageStore.query_by_key` and the tier's segments the local files no longer
        hold (the local index covers the rest), newest first, at most ``max_count`` (capped by
        maxMsgsNumBatch)."""
        found = self.store.query_by_key(topic, key, begin=begin, end=end, max_count=max_count)
        if self.tier is None:
            return found
        batch = self.store.config.max_msgs_num_batch
        limit = min(max_count or batch, batch)
        local_start = self.store.min_phy_offset
        more = self.tier.query_key(
            topic, key, begin=begin, end=end, limit=limit, before=local_start
        )
        seen = {m.commit_log_offset for m in found}
        merged = found + [m for m in more if m.commit_log_offset not in seen]
        merged.sort(key=lambda m: (m.store_timestamp, m.commit_log_offset), reverse=True)
        return merged[:limit]


def _queue(tier: RemoteSegments | None, topic: str, queue_id: int) -> RemoteQueue:
    """The tier's view of one queue (the tier is on: its module is imported here, not before)."""
    from rocketstore.pipeline.tier.remote import RemoteQueue

    assert tier is not None
    return RemoteQueue(tier, topic, queue_id)
