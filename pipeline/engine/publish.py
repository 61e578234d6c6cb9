"""What a flush records once the data files are flushed: how far they reach.

Three files name that point, each replaced whole or not at all, in this order: the progress
file ``config/rocketstore.json`` (the durable dispatch point, each queue's length, the notes:
:mod:`rocketstore.pipeline.files.progress`), the ``checkpoint`` RocketMQ keeps (flush timestamps:
:mod:`rocketstore.pipeline.files.checkpoint`), and ``config/topics.json`` (the topics a broker serves:
:mod:`rocketstore.pipeline.files.topicconfig`). A failure leaves each naming an earlier point that is
still true. :class:`FlushPointRecorder` is used by the writer's flush, under the store's lock; not
thread-safe on its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from rocketstore.pipeline.errors import TopicConfigError
from rocketstore.pipeline.files import failpoints
from rocketstore.pipeline.files.checkpoint import StoreCheckpoint
from rocketstore.pipeline.files.commitlog import CommitLog
from rocketstore.pipeline.files.consumequeue.queue import ConsumeQueue
from rocketstore.pipeline.files.indexservice import IndexService
from rocketstore.pipeline.files.progress import FlushProgress
from rocketstore.pipeline.files.topicconfig import TopicsKeeper

_log = logging.getLogger(__name__)

MAX_NOTES = 64  # notes a store keeps (the least recently set go first)


class FlushPointRecorder:
    """Records, in the three files the module names, the point up to which one store
    directory's data files are flushed."""

    def __init__(
        self,
        path: Path,
        *,
        commitlog: CommitLog,
        queues: dict[tuple[str, int], ConsumeQueue],
        index: IndexService | None,
        checkpoint: StoreCheckpoint,
        notes: dict[str, list[int]],
        clock_ms: Callable[[], int],
    ) -> None:
        self.path = path
        self.commitlog = commitlog
        self.queues = queues
        self.index = index
        self.checkpoint = checkpoint
        # Small facts kept with the store (rocketstore.pipeline.files.progress), durable with the next
        # progress file; the store sets them, this writes them.
        self.notes = notes
        self._topics = TopicsKeeper(path / "config", clock_ms=clock_ms)
        # Each queue's length as the last record had it, and the queues written since
        # (see _lengths).
        self._known: dict[str, int] | None = None
        self._pending: list[ConsumeQueue] = []
        self._topics_error: str | None = None

    def set_note(self, name: str, value: list[int]) -> None:
        """Keep ``value`` as note ``name`` for the next progress file."""
        self.notes.pop(name, None)
        self.notes[name] = [int(x) for x in value]
        while len(self.notes) > MAX_NOTES:
            del self.notes[next(iter(self.notes))]

    def record(self, end: int, last_record: tuple[int, int] | None) -> None:
        """Write the progress file (when this writer wrote a record: ``last_record`` is its
        offset and store time), then the checkpoint. Each is replaced whole or not at all, so a
        failure (an ``OSError``) leaves both naming an earlier point that is still true."""
        if last_record is not None:
            failpoints.hit("progress-write")
            last_offset, last_ts = last_record
            FlushProgress(end, last_offset, last_ts, self._lengths(), dict(self.notes)).write(
                self.path / "config"
            )
        failpoints.hit("checkpoint-write")
        self._write_checkpoint(last_record)

    def flushed(self, queues: Iterable[ConsumeQueue]) -> None:
        """These queues were written since the last record: their lengths go into the next
        one (the others' are as the last one had them)."""
        if self._known is not None:
            self._pending.extend(queues)

    def _lengths(self) -> dict[str, int]:
        """Every queue's length, as the progress file records them: taken from each queue the
        first time, then from the queues written since (so that a record costs what changed,
        whatever the number of queues)."""
        if self._known is None or len(self._known) != len(self.queues):
            self._known = {f"{t}/{q}": cq.max_offset for (t, q), cq in self.queues.items()}
        else:
            known = self._known
            for cq in self._pending:
                known[cq.name] = cq.max_offset
        self._pending.clear()
        return self._known

    def update_topics(self) -> None:
        """Name every topic and queue count in ``config/topics.json``, after the data it
        describes is flushed. A file that cannot be written or read is logged, not raised: the
        data is whole, only a broker would not see the new topics, and the next flush tries
        again (``rocketstore topics`` shows what a broker would see)."""
        try:
            self._topics.update(self.queues)
        except (OSError, TopicConfigError) as exc:
            text = str(exc)
            if text != self._topics_error:
                _log.warning("%s: config/topics.json not updated: %s", self.path, text)
            self._topics_error = text
        else:
            self._topics_error = None

    def _write_checkpoint(self, last_record: tuple[int, int] | None) -> None:
        last_ts = last_record[1] if last_record else self._last_store_timestamp()
        if last_ts > 0:
            self.checkpoint.physic_msg_timestamp = last_ts
            self.checkpoint.logics_msg_timestamp = last_ts
        if self.index is not None and self.index.end_timestamp > 0:
            self.checkpoint.index_msg_timestamp = self.index.end_timestamp
        self.checkpoint.write(self.path / "checkpoint", sync=True)

    def _last_store_timestamp(self) -> int:
        best = 0
        for cq in self.queues.values():
            if cq.max_offset > cq.min_offset:
                u = cq.read(cq.max_offset - 1, 1)[0]
                best = max(best, self.commitlog.store_timestamp(int(u["offset"]), int(u["size"])))
        return best
