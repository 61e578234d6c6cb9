"""How far the consumers of a store are behind (``rocketstore lag``, and the demo's summary):
a Spark query, by its checkpoint's committed offsets, and RocketMQ consumer groups, by the
offsets in each broker directory's ``config/consumerOffset.json`` (:mod:`rocketstore.pipeline.engine.groups`),
each beside the queues' bounds.

Reads only: the checkpoint's files, the offset files and the brokers, opened read-only (no
lock, nothing written).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.groups import (
    ConsumerOffsets,
    broker_offsets,
    group_offsets,
    groups_of,
    require_group,
)
from rocketstore.pipeline.engine.root import StoreRoot
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import StoreError
from rocketstore.pipeline.tools.bothtiers import BothTiers
from rocketstore.pipeline.tools.output import emit, print_table

QueueKey = tuple[str, str, int]  # (topic, brokerName, queueId), as the Spark source names a queue
# One broker directory's queues: (topic, queueId) -> (min offset, max offset).
BrokerBounds = dict[tuple[str, int], tuple[int, int]]
# How the bounds of a broker are read: (brokerName, directory) -> its queues' bounds.
BoundsReader = Callable[[str, Path], BrokerBounds]


@dataclasses.dataclass(frozen=True)
class CommittedOffsets:
    """What a Spark checkpoint says a query has read: ``offsets`` are the next queue offsets
    to read after ``batch_id``, the last committed micro-batch (``None``: nothing committed)."""

    batch_id: int | None
    offsets: dict[QueueKey, int]


@dataclasses.dataclass(frozen=True)
class QueueLag:
    """One message queue: ``committed`` is ``None`` when the checkpoint (or group) does not
    name it yet (the source starts such a queue at its min offset), ``max_offset`` ``None``
    when the store has no such queue."""

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


def _order(key: QueueKey) -> tuple[str, int, str, int]:
    """Topic, then brokers as the root numbers them (``broker-2`` before ``broker-10``)."""
    topic, broker, qid = key
    number = broker.rpartition("-")[2]
    return topic, int(number) if number.isdigit() else -1, broker, qid


def _brokers(root: str | os.PathLike[str]) -> list[tuple[str, Path]]:
    """The broker directories of ``root``; :class:`StoreError` when it has none."""
    brokers = StoreRoot(root).brokers()
    if not brokers:
        raise StoreError(
            f"{root}: neither a store root (broker-N directories) nor a RocketMQ store directory"
        )
    return brokers


def store_bounds(config: StoreConfig, topics: Collection[str] | None = None) -> BoundsReader:
    """Reads a broker's bounds by opening it read-only (no lock, nothing written), as
    ``rocketstore queues`` does (across both tiers with the tier on); only of ``topics``, when
    given."""

    def read(name: str, path: Path) -> BrokerBounds:
        if config.tier_on:
            # Across both tiers: a queue starts where the bucket's oldest segment holding it
            # does, when local retention deleted what the tier keeps.
            with BothTiers.open(path, config) as both:
                return {
                    (s.info.topic, s.info.queue_id): (s.info.min_offset, s.info.max_offset)
                    for s in both.spans(topics=topics)
                }
        with MessageStore(path, config, read_only=True) as store:
            return {
                (i.topic, i.queue_id): (i.min_offset, i.max_offset)
                for i in store.queue_infos(topics=topics)
            }

    return read


def group_topics(
    brokers: dict[str, ConsumerOffsets], group: str | None, topics: Sequence[str] | None
) -> set[str]:
    """The topics :func:`group_lag` shows for these arguments (none for a group that
    committed nothing: it raises there)."""
    names = [group] if group is not None else groups_of(brokers, topics)
    return {t for name in names for t, _, _ in group_offsets(brokers, name, topics)}


def read_once(read: BoundsReader) -> BoundsReader:
    """``read``, each broker directory read at most once: for a caller that shows several
    consumers of one root at one time (a checkpoint and every group: each broker is opened
    once, not once per section), with a ``read`` of every topic they show. Not
    thread-safe."""
    seen: dict[Path, BrokerBounds] = {}

    def once(name: str, path: Path) -> BrokerBounds:
        if path not in seen:
            seen[path] = read(name, path)
        return seen[path]

    return once


def _bounds(
    root: str | os.PathLike[str], read: BoundsReader, topics: set[str]
) -> tuple[dict[QueueKey, tuple[int, int]], set[str]]:
    """``(min, max)`` offsets of every queue of ``topics`` in the brokers of ``root``, and the
    names of the brokers that hold a store."""
    bounds: dict[QueueKey, tuple[int, int]] = {}
    stores: set[str] = set()
    for name, path in _brokers(root):
        if not (path / "commitlog").is_dir():
            continue  # a broker directory no task has written yet
        stores.add(name)
        if not topics:
            continue
        for (topic, queue_id), pair in read(name, path).items():
            if topic in topics:
                bounds[(topic, name, queue_id)] = pair
    return bounds, stores


def consumer_lag(
    root: str | os.PathLike[str],
    committed: dict[QueueKey, int],
    config: StoreConfig,
    topics: Sequence[str] | None = None,
    *,
    read_bounds: BoundsReader | None = None,
) -> list[QueueLag]:
    """Per message queue of ``topics`` (default: the topics ``committed`` names), the committed
    offset beside the queue's bounds in the store root (or single store directory) ``root``.

    Every queue of those topics in any broker is listed, and every queue the checkpoint names
    even if the store no longer has it. Brokers are opened read-only (no lock, nothing written),
    or their bounds read by ``read_bounds`` (:mod:`rocketstore.pipeline.tools.storestats`'s).
    """
    wanted = set(topics) if topics else {t for t, _, _ in committed}
    bounds, _ = _bounds(root, read_bounds or store_bounds(config, wanted), wanted)
    keys = set(bounds) | {k for k in committed if k[0] in wanted}
    rows = []
    for key in sorted(keys, key=_order):
        low, high = bounds.get(key, (None, None))
        rows.append(QueueLag(key[0], key[1], key[2], committed.get(key), low, high))
    return rows


@dataclasses.dataclass(frozen=True)
class GroupLag:
    """One RocketMQ consumer group's queues (see :func:`group_lag`)."""

    group: str
    queues: list[QueueLag]

    @property
    def total(self) -> int:
        return sum(q.lag for q in self.queues if q.lag is not None)


def group_lag(
    root: str | os.PathLike[str],
    config: StoreConfig,
    *,
    group: str | None = None,
    topics: Sequence[str] | None = None,
    brokers: dict[str, ConsumerOffsets] | None = None,
    read_bounds: BoundsReader | None = None,
) -> list[GroupLag]:
    """The lag of each RocketMQ consumer group with offsets in the ``config/consumerOffset.json``
    of a broker directory of ``root`` (a store root or one store directory), or only of
    ``group``; only ``topics``, when given. Groups by name, then queues as
    :func:`consumer_lag` orders them.

    Per group, every queue of the topics it committed offsets for, in every broker of the root:

    * committed: lag = max offset - committed offset, as ``mqadmin consumerProgress`` counts
      it (a committed offset retention has passed counts the deleted messages too). A queue the
      broker directory has no ConsumeQueue for has offsets 0 to 0, as a broker says.
    * not committed (``committed`` None): lag = max offset - min offset, what the source's
      ``startingOffsets=group:NAME`` reads from it. ``consumerProgress`` counts such a queue
      from offset 0 (the same unless retention deleted its start), and leaves out a broker on
      which the group committed nothing for the topic.

    Raises :class:`~rocketstore.pipeline.errors.NotFoundError` when ``group`` committed nothing (for
    ``topics``), :class:`~rocketstore.pipeline.engine.groups.ConsumerOffsetsError` for a damaged offset file.
    ``brokers``: the offset files, when the caller has read them (:func:`broker_offsets`);
    ``read_bounds``: as for :func:`consumer_lag`."""
    if brokers is None:
        brokers = broker_offsets(root)
    if group is not None:
        require_group(root, brokers, group, topics)
    names = [group] if group is not None else groups_of(brokers, topics)
    committed = {name: group_offsets(brokers, name, topics) for name in names}
    wanted = {t for offsets in committed.values() for t, _, _ in offsets}
    bounds, stores = _bounds(root, read_bounds or store_bounds(config, wanted), wanted)
    out = []
    for name in names:
        offsets = committed[name]
        own = {t for t, _, _ in offsets}
        keys = {k for k in bounds if k[0] in own} | set(offsets)
        rows = []
        for key in sorted(keys, key=_order):
            low, high = bounds.get(key, (0, 0) if key[1] in stores else (None, None))
            rows.append(QueueLag(key[0], key[1], key[2], offsets.get(key), low, high))
        out.append(GroupLag(name, rows))
    return out


HEADER = ("topic", "brokerName", "queueId", "committedOffset", "maxOffset", "lag")


@dataclasses.dataclass
class _Section:
    """What one kind of consumer prints: a table (or, with --json, its rows as JSON objects:
    only the one printed is made), then totals."""

    header: tuple[str, ...]
    table: list[list[object]]
    objects: list[dict[str, object]]
    totals: list[str]


def _cells(row: QueueLag) -> list[object]:
    return [row.topic, row.broker, row.queue_id, row.committed, row.max_offset, row.lag]


def cmd_lag(args: argparse.Namespace) -> int:
    """``rocketstore lag ROOT [--checkpoint DIR] [--group NAME] [--topic T]``: the Spark
    query's queues and total, then every consumer group's (or ``--group``'s) queues and a total
    per group (:func:`group_lag`); each broker is opened once for both. An error when there
    is nothing to show."""
    config = StoreConfig.effective(args.config)
    topics = [args.topic] if args.topic else None
    _brokers(args.root)
    progress = None
    if args.checkpoint is not None:
        progress = read_committed_offsets(args.checkpoint)
        if topics is None and not progress.offsets:
            raise StoreError(
                f"{args.checkpoint}: the query has not committed a batch yet; name the topic it "
                "reads with --topic to see the whole backlog"
            )
    brokers = broker_offsets(args.root)
    # Every broker read once for both sections, its queues of the topics they show only.
    shown = set(topics) if topics else {t for t, _, _ in progress.offsets} if progress else set()
    shown |= group_topics(brokers, args.group, topics)
    read = read_once(store_bounds(config, shown))
    sections: list[_Section] = []
    if progress is not None:
        rows = consumer_lag(args.root, progress.offsets, config, topics, read_bounds=read)
        batch = (
            "no batch committed yet"
            if progress.batch_id is None
            else f"batch {progress.batch_id} committed"
        )
        total = sum(r.lag for r in rows if r.lag is not None)
        sections.append(
            _Section(
                HEADER,
                [] if args.json else [_cells(r) for r in rows],
                [
                    {**dict(zip(HEADER, _cells(r), strict=True)), "batchId": progress.batch_id}
                    for r in rows
                ]
                if args.json
                else [],
                [f"{batch}; total lag {total} message(s) in {len(rows)} queue(s)"],
            )
        )
    for name, offsets in brokers.items():
        if offsets.from_bak:
            # What a broker loads while its own rewrite has the file deleted (or left empty).
            print(
                f"rocketstore: note: {name}: read {offsets.path} ({offsets.path.stem} is "
                "missing or empty)",
                file=sys.stderr,
            )
    groups = group_lag(
        args.root, config, group=args.group, topics=topics, brokers=brokers, read_bounds=read
    )
    if groups:
        sections.append(
            _Section(
                ("group", *HEADER),
                [] if args.json else [[g.group, *_cells(r)] for g in groups for r in g.queues],
                [
                    {"group": g.group, **dict(zip(HEADER, _cells(r), strict=True))}
                    for g in groups
                    for r in g.queues
                ]
                if args.json
                else [],
                [
                    f"group {g.group}: total lag {g.total} message(s) in {len(g.queues)} queue(s)"
                    for g in groups
                ],
            )
        )
    if not sections:
        scope = f" for topic {args.topic}" if args.topic else ""
        raise StoreError(
            f"{args.root}: no consumer group has committed offsets{scope} there (in a broker "
            "directory's config/consumerOffset.json); name a Spark query's checkpoint with "
            "--checkpoint"
        )
    for number, section in enumerate(sections):
        if args.json:
            for obj in section.objects:
                emit(obj)
            continue
        if number:
            print()
        if section.table:
            print_table(section.header, section.table)
        for line in section.totals:
            print(line)
    return 0
