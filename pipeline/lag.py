"""How far a Spark query that reads a store is behind: its checkpoint's committed offsets
beside the queues' bounds (``rocketstore lag``, and the demo's summary).

Reads only: the checkpoint's files and the brokers, opened read-only (no lock, nothing written).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path

from pipeline.config import StoreConfig
from pipeline.errors import StoreError
from pipeline.output import emit, print_table
from pipeline.root import StoreRoot
from pipeline.store import MessageStore

QueueKey = tuple[str, str, int]  # (topic, brokerName, queueId), as the Spark source names a queue


@dataclasses.dataclass(frozen=True)
class CommittedOffsets:
    """What a Spark checkpoint says a query has read: ``offsets`` are the next queue offsets
    to read after ``batch_id``, the last committed micro-batch (``None``: nothing committed)."""

    batch_id: int | None
    offsets: dict[QueueKey, int]


@dataclasses.dataclass(frozen=True)
class QueueLag:
    """One message queue: ``committed`` is ``None`` when the checkpoint does not name it yet
    (the source will start it at its min offset), ``max_offset`` ``None`` when the store has
    no such queue."""

    topic: str
    broker: str
    queue_id: int
    committed: int | None
    min_offset: int | None
    max_offset: int | None

    @property
    def lag(self) -> int | None:
        """Messages the query has still to read (``None`` when the store lacks the queue)."""
        if self.max_offset is None:
            return None
        start = self.committed if self.committed is not None else self.min_offset or 0
        return self.max_offset - start


def _batch_files(directory: Path) -> dict[int, Path]:
    """Spark's metadata log files by batch id (``.N.crc`` and temporary files skipped)."""
    if not directory.is_dir():
        return {}
    return {int(p.name): p for p in directory.iterdir() if p.name.isdigit()}


def _as_offsets(value: object) -> dict[QueueKey, int] | None:
    """``value`` as rocketstore source offsets (``{topic: {broker: {queueId: offset}}}``), or
    ``None`` when it has another shape (another source's offset, the batch metadata)."""
    if not isinstance(value, dict) or not value:
        return None
    out: dict[QueueKey, int] = {}
    for topic, brokers in value.items():
        if not isinstance(brokers, dict):
            return None
        for broker, queues in brokers.items():
            if not isinstance(queues, dict):
                return None
            for qid, offset in queues.items():
                if not (str(qid).isdigit() and isinstance(offset, int)):
                    return None
                if isinstance(offset, bool):
                    return None
                out[(str(topic), str(broker), int(qid))] = offset
    return out


def read_committed_offsets(checkpoint: str | os.PathLike[str]) -> CommittedOffsets:
    """The rocketstore source offsets of the last committed batch of a Spark checkpoint.

    A checkpoint holds ``offsets/N`` (written when batch N is planned: a version line, a batch
    metadata line, then one line per source, ``-`` for a source without an offset) and
    ``commits/N`` (written once batch N's output is committed). The committed progress is the
    offsets file of the highest N that has a commit file. Lines of other sources are skipped;
    the offsets of several rocketstore sources in one query are merged.

    Raises :class:`StoreError` when ``checkpoint`` is not a Spark checkpoint directory or its
    offsets hold no rocketstore source offsets.
    """
    text = os.fspath(checkpoint)
    root = Path(text.removeprefix("file://") if text.startswith("file://") else text)
    offsets_dir = root / "offsets"
    if not offsets_dir.is_dir():
        raise StoreError(f"{root}: not a Spark streaming checkpoint (no offsets/ directory)")
    planned = _batch_files(offsets_dir)
    committed = sorted(set(_batch_files(root / "commits")) & set(planned))
    if not committed:
        return CommittedOffsets(None, {})
    batch = committed[-1]
    path = planned[batch]
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines or not lines[0].startswith("v"):
        raise StoreError(f"{path}: not a Spark offsets file (no version line)")
    found: dict[QueueKey, int] = {}
    seen_source = False
    for line in lines[1:]:
        try:
            value = json.loads(line)
        except ValueError:
            continue  # "-": a source with no offset in this batch
        offsets = _as_offsets(value)
        if offsets is not None:
            seen_source = True
            found.update(offsets)
    if not seen_source:
        raise StoreError(
            f"{path}: no rocketstore source offsets (is this the checkpoint of a query reading "
            "with format('rocketstore')?)"
        )
    return CommittedOffsets(batch, found)


def consumer_lag(
    root: str | os.PathLike[str],
    committed: dict[QueueKey, int],
    config: StoreConfig,
    topics: Sequence[str] | None = None,
) -> list[QueueLag]:
    """Per message queue of ``topics`` (default: the topics ``committed`` names), the committed
    offset beside the queue's bounds in the store root (or single store directory) ``root``.

    Every queue of those topics in any broker is listed, and every queue the checkpoint names
    even if the store no longer has it. Brokers are opened read-only (no lock, nothing written).
    """
    wanted = set(topics) if topics else {t for t, _, _ in committed}
    bounds: dict[QueueKey, tuple[int, int]] = {}
    store_root = StoreRoot(root)
    brokers = store_root.brokers()
    if not brokers:
        raise StoreError(
            f"{root}: neither a store root (broker-N directories) nor a RocketMQ store directory"
        )
    for name, path in brokers:
        if not (path / "commitlog").is_dir():
            continue  # a broker directory no task has written yet
        with MessageStore(path, config, read_only=True) as store:
            for info in store.queue_infos():
                if info.topic in wanted:
                    bounds[(info.topic, name, info.queue_id)] = (info.min_offset, info.max_offset)
    keys = set(bounds) | {k for k in committed if k[0] in wanted}

    def order(key: QueueKey) -> tuple[str, int, str, int]:
        topic, broker, qid = key
        number = broker.rpartition("-")[2]
        return topic, int(number) if number.isdigit() else -1, broker, qid

    rows = []
    for key in sorted(keys, key=order):
        low, high = bounds.get(key, (None, None))
        rows.append(QueueLag(key[0], key[1], key[2], committed.get(key), low, high))
    return rows


def cmd_lag(args: argparse.Namespace) -> int:
    """``rocketstore lag ROOT --checkpoint DIR``: one row per queue, then a total."""
    progress = read_committed_offsets(args.checkpoint)
    topics = [args.topic] if args.topic else None
    if topics is None and not progress.offsets:
        raise StoreError(
            f"{args.checkpoint}: the query has not committed a batch yet; name the topic it "
            "reads with --topic to see the whole backlog"
        )
    rows = consumer_lag(args.root, progress.offsets, StoreConfig.effective(args.config), topics)
    header = ("topic", "brokerName", "queueId", "committedOffset", "maxOffset", "lag")
    table = [[r.topic, r.broker, r.queue_id, r.committed, r.max_offset, r.lag] for r in rows]
    if args.json:
        for row in table:
            emit({**dict(zip(header, row, strict=True)), "batchId": progress.batch_id})
        return 0
    if table:
        print_table(header, table)
    batch = (
        "no batch committed yet"
        if progress.batch_id is None
        else f"batch {progress.batch_id} committed"
    )
    total = sum(r.lag for r in rows if r.lag is not None)
    print(f"{batch}; total lag {total} message(s) in {len(rows)} queue(s)")
    return 0
