"""Where a put's bytes go: records into the CommitLog's mapped segments, units into the
ConsumeQueues, entries into the index.

:class:`Appender` is the write path of :class:`~rocketstore.pipeline.engine.store.MessageStore`, which
checks the store is writable, owns it (fencing) and has disk to spare before each call, holds
its lock through it, and flushes after it. Not thread-safe: one call at a time, under that
lock.

Crash behaviour is the store's fail-stop contract: everything that can fail for want of a
file or a block fails before the first byte of the CommitLog is written, with nothing written
(:class:`~rocketstore.pipeline.errors.SegmentCreateError`); a failure after it goes to the
store's ``stop_writes``, and recovery repairs the half-written put from the durable dispatch
point. :attr:`Appender.dispatched_end` and :attr:`Appender.last_record` are what the store's
next flush records as that point.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine import dispatch, storehost
from rocketstore.pipeline.engine.results import BatchPutResult, PutResult
from rocketstore.pipeline.errors import SegmentCreateError
from rocketstore.pipeline.files import failpoints
from rocketstore.pipeline.files.commitlog import CommitLog
from rocketstore.pipeline.files.consumequeue.queue import ConsumeQueue
from rocketstore.pipeline.files.filecreation import limit_note
from rocketstore.pipeline.files.indexservice import IndexService
from rocketstore.pipeline.files.mappedfile import MappedFile
from rocketstore.pipeline.format import encode, native, record
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.layout import CQ_UNIT_SIZE

_NO_INDEX = (None, 0, 0, 0, 0)  # the single put's index arguments without a key index
SINGLE_RESERVE = 64 * 1024  # the largest record a single put writes without the batch path

QueueOffsets = dict[tuple[str, int], int]


class Appender:
    """Writes puts into one store's files (see the module's docstring for the contract)."""

    def __init__(
        self,
        *,
        path: Path,
        commitlog: CommitLog,
        queues: dict[tuple[str, int], ConsumeQueue],
        queue: Callable[[str, int], ConsumeQueue],
        index: IndexService | None,
        config: StoreConfig,
        next_queue_offset: QueueOffsets,
        last_record: tuple[int, int] | None,
        stop_writes: Callable[[str, BaseException], NoReturn],
    ) -> None:
        self.path = path
        self.commitlog = commitlog
        self.queues = queues
        # Finds or makes a queue's ConsumeQueue (the store's, so recovery and puts share them).
        self.queue = queue
        self.index = index
        self.config = config
        self.sync_flush = config.sync_flush
        self.store_host = storehost.store_host(config)
        self.store_host_field = record.encode_host(self.store_host)[0]
        self.store_host_hex = self.store_host_field.hex().upper()
        # Each queue's next offset; a put takes its offsets only once it succeeded. A queue
        # not in it yet starts where its ConsumeQueue ends (asked when first put to, so that
        # a store of many queues does not ask each of them at open).
        self.next_queue_offset = next_queue_offset
        # (offset, store time) of the newest record written: what the progress file names as
        # the last flushed record.
        self.last_record = last_record
        # Everything before this offset is in the CommitLog and dispatched to the ConsumeQueues
        # and the index: the durable dispatch point a flush records.
        self.dispatched_end = commitlog.max_offset
        self._stop_writes = stop_writes
        self._single = native.SinglePut(
            self.store_host_field,
            config.max_message_size,
            config.mapped_file_size_commitlog,
            config.max_hash_slot_num,
            config.max_index_num,
        )
        self._uniq = encode.UniqKeyGenerator()

    def _next_offset(self, key: tuple[str, int]) -> int:
        got = self.next_queue_offset.get(key)
        if got is None:
            cq = self.queues.get(key)
            got = self.next_queue_offset[key] = cq.max_offset if cq is not None else 0
        return got

    def put_one(self, m: Message, now: int) -> PutResult | None:
        """The single-put path, or None (nothing done) when ``m`` needs the batch path.

        The message's validation, its record, ConsumeQueue unit and index entries are one
        native call (:class:`rocketstore.pipeline._native.SinglePut`); Python finds where they go and
        takes note of what was written. Under SYNC_FLUSH, or with a failpoint armed, the call
        stops between its write steps to flush the CommitLog and to hit the failpoints, in the
        same order as the batch path."""
        topic, qid = m.topic, m.queue_id
        if type(topic) is not str or type(qid) is not int:
            return None
        key = (topic, qid)
        cq = self.queues.get(key)
        if cq is None:
            return None
        queue_offset = self._next_offset(key)
        unit_file = cq.tail_for(queue_offset)
        if unit_file is None:
            return None
        mf = self.commitlog.segments.last
        if mf is None or not mf.wrote_position:
            return None  # a new store, or one whose last segment is still empty
        rel = mf.wrote_position
        pos = mf.base + rel
        index_file = None
        at: tuple[memoryview | None, int, int, int, int] = _NO_INDEX
        if self.index is not None:
            if not self.index.files:
                return None
            index_file = self.index.files[-1]
        # Blocks for what this put writes (see _prepare), a window at a time: a record of up
        # to SINGLE_RESERVE bytes, one unit and, since each KEYS token is at least one
        # character, at most 1 + len(keys) index entries. A longer record is left to the
        # batch path, which reserves what it needs.
        keys = m.keys
        try:
            mf.reserve(rel + SINGLE_RESERVE)
            unit_file.reserve(unit_file.wrote_position + CQ_UNIT_SIZE)
            if index_file is not None:
                index_file.reserve(1 + (len(keys) if keys else 0))
        except SegmentCreateError as exc:
            raise SegmentCreateError(f"{exc}; the put of 1 message wrote nothing") from exc
        if index_file is not None:
            at = (
                index_file.mapping,
                index_file.index_count,
                index_file.begin_timestamp,
                index_file.begin_phy_offset,
                index_file.hash_slot_count,
            )
        uniq = m.uniq_key or self._uniq.next_id(now)
        hook = (
            functools.partial(self._single_step, mf, rel)
            if self.sync_flush or failpoints.armed()
            else None
        )
        try:
            # The record's view ends where the reserved blocks do: a record that does not fit
            # is left to the batch path, whose prepare step reserves what it needs.
            done = self._single.put(
                m, uniq, now, mf.buffer[: mf.allocated], rel, pos, unit_file.buffer,
                unit_file.wrote_position, queue_offset, *at, hook,
            )  # fmt: skip
        except BaseException as exc:
            self._stop_writes(f"put of 1 message at CommitLog offset {pos}", exc)
        if done is None:
            return None
        size, entries, new_slots = done
        mf.wrote_position = rel + size
        cq.appended_one(unit_file, pos + size)
        if index_file is not None:
            index_file.took_entries(entries, new_slots, pos, now)
        self.next_queue_offset[key] = queue_offset + 1
        self.dispatched_end = pos + size
        self.last_record = (pos, now)
        return PutResult(
            "PUT_OK",
            f"{self.store_host_hex}{pos:016X}",
            pos,
            queue_offset,
            size,
            now,
            uniq,
        )

    def _single_step(self, mf: MappedFile, rel: int, step: str, size: int) -> None:
        """Between the write steps of a single put (see :meth:`put_one`)."""
        if step == "record-sealed":
            mf.wrote_position = rel + size
            if self.sync_flush:
                failpoints.hit("flush")
                self.commitlog.flush()
        else:
            failpoints.hit(step)

    def put_batch(
        self, batch: pa.Table | pa.RecordBatch | Sequence[Message], now: int
    ) -> BatchPutResult:
        """Validate, encode and store a batch (see :mod:`rocketstore.pipeline.format.message` for the
        columns); on :class:`~rocketstore.pipeline.errors.InvalidMessageError` nothing is
        written."""
        b = encode.prepare(batch, self.config, self._uniq, now, self.store_host)
        if b.n == 0:
            return BatchPutResult(
                np.zeros(0, np.int64),
                np.zeros(0, np.int64),
                np.zeros(0, np.int64),
                now,
                pa.array([], pa.string()),
                self.store_host_field,
                False,
            )
        queue_offsets, next_offsets, runs = self._assign_queue_offsets(b)
        phys, blanks = self.commitlog.plan(b.sizes)
        self._prepare(b, phys, queue_offsets, runs)
        try:
            self._write_records(b, phys, blanks, queue_offsets, now)
            if self.sync_flush:
                failpoints.hit("flush")
                self.commitlog.flush()
            dispatch.apply(
                dispatch.from_prepared(b, phys, queue_offsets, now, runs),
                self.queue,
                self.index,
            )
        except BaseException as exc:
            self._stop_writes(f"put of {b.n} message(s) at CommitLog offset {int(phys[0])}", exc)
        self.next_queue_offset.update(next_offsets)
        self.dispatched_end = int(phys[-1] + b.sizes[-1])
        self.last_record = (int(phys[-1]), now)
        return BatchPutResult(
            phys,
            queue_offsets,
            b.sizes,
            now,
            b.uniq_keys,
            self.store_host_field,
            self.sync_flush,
        )

    def _prepare(
        self,
        b: encode.PreparedBatch,
        phys: npt.NDArray[np.int64],
        queue_offsets: npt.NDArray[np.int64],
        runs: dispatch.QueueRuns,
    ) -> None:
        """Create every file the batch will write (CommitLog segments, ConsumeQueue files,
        IndexFiles) and reserve the blocks its bytes will land in, before the first byte of the
        CommitLog: a full disk or a missing descriptor fails here, as
        :class:`SegmentCreateError`, with nothing written and the store usable. Past this point
        no write touches a page without a block, so none can die of SIGBUS."""
        try:
            self.commitlog.prepare_segments(int(phys[0]), int(phys[-1] + b.sizes[-1]))
            queues, make = self.queues, self.queue
            cqs = [queues.get(key) or make(*key) for key in runs.keys]
            firsts = queue_offsets[runs.rows[runs.starts[:-1]]].tolist()
            counts = np.diff(runs.starts).tolist()
            for cq, first, count in zip(cqs, firsts, counts, strict=True):
                cq.prepare(first, count)
            runs.queues = cqs
            if self.index is not None:
                self.index.prepare(len(b.key_hashes))
        except SegmentCreateError as exc:
            raise SegmentCreateError(
                f"{exc}; nothing of the put of {b.n} message(s) was written"
            ) from exc
        except OSError as exc:
            where = exc.filename or self.path
            raise SegmentCreateError(
                f"{where}: cannot create a file for a put of {b.n} message(s): "
                f"{exc.strerror or exc} ({limit_note(exc, self.path)}); nothing was written"
            ) from exc

    def _assign_queue_offsets(
        self, b: encode.PreparedBatch
    ) -> tuple[npt.NDArray[np.int64], QueueOffsets, dispatch.QueueRuns]:
        """Queue offsets per (topic, queueId) in batch order, 0 for messages that get no
        ConsumeQueue unit (PREPARED / ROLLBACK), which do not consume an offset; each queue's
        next offset once the batch is stored (taken only when the put succeeds); and the rows
        that get units, split by queue, for the dispatch. Vectorised: one look-up per queue."""
        offsets = np.zeros(b.n, dtype=np.int64)
        rows = np.flatnonzero(record.consume_queue_mask(b.sys_flags))
        runs = dispatch.group_runs(b.topics, b.topic_codes, b.queue_ids, rows)
        if not len(runs):
            return offsets, {}, runs
        bases = np.fromiter(
            (self._next_offset(key) for key in runs.keys), dtype=np.int64, count=len(runs)
        )
        counts = np.diff(runs.starts)
        run_of = np.repeat(np.arange(len(runs)), counts)
        offsets[runs.rows] = bases[run_of] + (np.arange(len(rows)) - runs.starts[run_of])
        next_offsets = dict(zip(runs.keys, (bases + counts).tolist(), strict=True))
        return offsets, next_offsets, runs

    def _write_records(
        self,
        b: encode.PreparedBatch,
        phys: npt.NDArray[np.int64],
        blanks: list[int],
        queue_offsets: npt.NDArray[np.int64],
        now: int,
    ) -> None:
        """Encode the batch straight into the CommitLog's mapped segments, one run of records
        per segment, with the END_OF_FILE blanks between them."""
        segment_of = phys // self.config.mapped_file_size_commitlog
        bounds = np.flatnonzero(segment_of[1:] != segment_of[:-1]) + 1
        blank_iter = iter(blanks)
        next_blank = next(blank_iter, None)
        for lo, hi in zip([0, *bounds.tolist()], [*bounds.tolist(), b.n], strict=True):
            while next_blank is not None and next_blank < int(phys[lo]):
                self.commitlog.write_blank(next_blank)
                next_blank = next(blank_iter, None)
            failpoints.hit("commitlog-write")
            self.commitlog.write_encoded(b.encoder, lo, hi, phys, queue_offsets, b.sizes, now)
