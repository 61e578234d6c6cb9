"""A store root: several broker store directories and the topic metadata they share.

The Spark sink and source see a *store root*, laid out like this::

    root/
      topics.json            topic -> brokers, queues per broker, body format, schemas
      schemas/<fp>.json      one registered body schema each (see rocketstore.pipeline.format.bodyformat)
      broker-0/              a complete RocketMQ store directory (commitlog/, consumequeue/, ...)
      broker-1/
      ...

A single RocketMQ store directory (one with ``commitlog/`` in it, as a real broker writes) is
also accepted as a root of one broker, named after the directory, so that a broker's own store
can be read.

Message queues of a topic are numbered as RocketMQ's client numbers the queues of a topic route:
broker by broker, queue ids ascending within each, so queue ``i`` of ``brokers * queues`` is
``(broker-<i // queues>, i % queues)``. :func:`select_queues` assigns rows to them the way
RocketMQ's ``SelectMessageQueueByHash`` does: ``abs(key.hashCode() % n)``.

Thread- and process-safety: ``topics.json`` and the schema files are only changed under an
exclusive ``flock`` on ``root/.meta.lock`` and replaced atomically (temporary file, fsync,
rename), so concurrent writers of different topics never lose each other's entries and readers
never see a torn file. Reading needs no lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from rocketstore.pipeline.errors import ConfigError, NotAStoreError
from rocketstore.pipeline.files import durability

# TopicMeta and the file names are the root's: they live in files/ (the tier's copy of the
# catalog reads them too, below the engine) and are the root's names to its users.
from rocketstore.pipeline.files.topicmeta import SCHEMAS_DIR as SCHEMAS_DIR
from rocketstore.pipeline.files.topicmeta import TOPICS_FILE as TOPICS_FILE
from rocketstore.pipeline.files.topicmeta import TopicMeta as TopicMeta
from rocketstore.pipeline.files.topicmeta import parse_topics_file
from rocketstore.pipeline.format import javahash

BROKER_PREFIX = "broker-"
DEFAULT_QUEUES = 4  # RocketMQ's defaultTopicQueueNums
_BROKER_RE = re.compile(r"^broker-(\d+)$")


def broker_name(index: int) -> str:
    return f"{BROKER_PREFIX}{index}"


def is_store_dir(path: Path) -> bool:
    """A broker store directory has a ``commitlog`` directory."""
    return (path / "commitlog").is_dir()


class StoreRoot:
    """A store root directory (see the module docstring). Cheap to create; holds no files open.

    Picklable: Spark ships it to executors inside readers and writers.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        # Each broker directory's path as first listed: a planner lists the root at every
        # trigger, and building a Path costs more than the listing's share of it.
        self._broker_paths: dict[str, Path] = {}

    def __repr__(self) -> str:
        return f"StoreRoot({str(self.path)!r})"

    # -- brokers ---------------------------------------------------------------------------------

    @property
    def single_store(self) -> bool:
        """Whether the root is itself one broker's store directory."""
        return is_store_dir(self.path)

    def brokers(self) -> list[tuple[str, Path]]:
        """The broker directories present, as ``(brokerName, path)`` in broker order."""
        if self.single_store:
            return [(self.path.resolve().name, self.path)]
        if not self.path.is_dir():
            return []
        found: list[tuple[int, str, Path]] = []
        # One listing, its entries' types from the directory itself: the source plans with
        # this at every trigger, and a root may hold dozens of brokers.
        with os.scandir(self.path) as entries:
            for entry in entries:
                m = _BROKER_RE.match(entry.name)
                if m and entry.is_dir():
                    path = self._broker_paths.get(entry.name)
                    if path is None:
                        path = self._broker_paths[entry.name] = self.path / entry.name
                    found.append((int(m.group(1)), entry.name, path))
        return [(name, path) for _, name, path in sorted(found)]

    def broker_path(self, index: int) -> Path:
        return self.path / broker_name(index)

    def check_readable(self, option: str = "path") -> None:
        """Raise :class:`NotAStoreError` unless the root exists and is a root or a store."""
        if not self.path.is_dir():
            raise NotAStoreError(f"option {option}={self.path}: no such directory")
        if not self.single_store and not self.brokers() and not (self.path / TOPICS_FILE).exists():
            raise NotAStoreError(
                f"option {option}={self.path}: not a store root (no broker-N directories and no "
                f"{TOPICS_FILE}) and not a RocketMQ store directory (no commitlog/)"
            )

    # -- topics ----------------------------------------------------------------------------------

    def topics(self) -> dict[str, TopicMeta]:
        """Every topic recorded in ``topics.json`` (empty for a single store directory)."""
        try:
            raw = (self.path / TOPICS_FILE).read_text()
        except FileNotFoundError:
            return {}
        return parse_topics_file(raw, str(self.path / TOPICS_FILE))

    def topic(self, name: str) -> TopicMeta | None:
        return self.topics().get(name)

    @contextlib.contextmanager
    def _meta_lock(self) -> Iterator[None]:
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / ".meta.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the flock

    def ensure_topic(self, name: str, wanted: TopicMeta) -> TopicMeta:
        """The topic's metadata, recording ``wanted`` if the topic is new.

        For a known topic, the recorded broker and queue counts win; asking for different ones
        raises :class:`ConfigError`, because rows already stored were routed by the old counts.
        A new schema fingerprint is appended to the topic's schema list.
        """
        with self._meta_lock():
            topics = self.topics()
            have = topics.get(name)
            if have is None:
                topics[name] = wanted
                self._write_topics(topics)
                return wanted
            if (have.brokers, have.queues) != (wanted.brokers, wanted.queues):
                raise ConfigError(
                    f"topic {name!r} in {self.path} was created with {have.brokers} brokers x "
                    f"{have.queues} queues; it cannot be written with {wanted.brokers} x "
                    f"{wanted.queues} (leave brokers/queues unset to use the recorded values)"
                )
            if have.body_format != wanted.body_format:
                raise ConfigError(
                    f"topic {name!r} in {self.path} holds bodyFormat={have.body_format} "
                    f"messages; it cannot be written with bodyFormat={wanted.body_format}"
                )
            new = [s for s in wanted.schemas if s not in have.schemas]
            if new:
                have = dataclasses.replace(have, schemas=have.schemas + tuple(new))
                topics[name] = have
                self._write_topics(topics)
            return have

    def _write_topics(self, topics: dict[str, TopicMeta]) -> None:
        body = {"topics": {t: m.to_json() for t, m in sorted(topics.items())}}
        atomic_write(self.path / TOPICS_FILE, json.dumps(body, indent=2, sort_keys=True) + "\n")

    # -- schemas ---------------------------------------------------------------------------------

    def schema_path(self, fingerprint: str) -> Path:
        return self.path / SCHEMAS_DIR / f"{fingerprint}.json"

    def register_schema(self, fingerprint: str, document: dict[str, Any]) -> None:
        """Store a schema document under its fingerprint (idempotent)."""
        path = self.schema_path(fingerprint)
        if path.exists():
            return
        with self._meta_lock():
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(path, json.dumps(document, indent=2, sort_keys=True) + "\n")

    def load_schema(self, fingerprint: str) -> dict[str, Any]:
        path = self.schema_path(fingerprint)
        try:
            return json.loads(path.read_text())  # type: ignore[no-any-return]
        except FileNotFoundError:
            raise NotAStoreError(
                f"{path}: body schema {fingerprint} is referenced by messages but not registered"
            ) from None


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that a crash leaves the old or the new file, whole."""
    durability.write_file(path, text.encode(), path.with_name(f".{path.name}.{os.getpid()}.tmp"))


def select_queues(
    sharding_keys: pa.Array | pa.ChunkedArray, row_ids: npt.NDArray[np.int64], total: int
) -> npt.NDArray[np.int64]:
    """Message queue index (``0 <= i < total``) of each row, as RocketMQ's hash selector picks it.

    Rows with a null or empty sharding key are spread round-robin by ``row_ids``.
    """
    keys = (
        sharding_keys.combine_chunks()
        if isinstance(sharding_keys, pa.ChunkedArray)
        else sharding_keys
    )
    valid = keys.is_valid().to_numpy(zero_copy_only=False)
    filled = keys.fill_null("")
    hashes = javahash.java_hash_array(filled).astype(np.int64)
    # Java's % truncates toward zero, then the selector takes abs().
    chosen = np.abs(np.fmod(hashes, total))
    empty = ~valid | (pc.binary_length(filled).to_numpy(zero_copy_only=False) == 0)
    chosen[empty] = row_ids[empty] % total
    return chosen.astype(np.int64)
