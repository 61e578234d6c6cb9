"""The sink's options: parsed and checked once, on the driver, into a picklable value.

Both faces of the sink (the ``foreachBatch`` callable and the ``rocketstore`` data source
writer) accept the same options, named as in docs/sink.md. Store settings come from the file
named by ``config`` (TOML or a RocketMQ broker.conf), else from ``conf/store.toml`` or the
built-in defaults as for every tool (:meth:`~rocketstore.pipeline.config.StoreConfig.effective`), then from
single options carrying RocketMQ ``MessageStoreConfig`` names (``flushDiskType``, ...).

Runs on the driver; :class:`SinkSettings` travels to executors inside the tasks' closures.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.root import DEFAULT_QUEUES, StoreRoot, TopicMeta
from rocketstore.pipeline.errors import ConfigError
from rocketstore.pipeline.format import batchcolumns, bodyformat
from rocketstore.pipeline.wholenumbers import parse_count

# Sink options that are not store settings (lower-cased: Spark lower-cases option names).
SINK_OPTIONS = {
    "path": "store root directory (required)",
    "topic": "topic of every row (wins over a topic column)",
    "brokers": "broker directories of a new topic (default 4)",
    "queues": "queues per broker of a new topic (default 4)",
    "shardingkey": "column whose value picks the queue (default: the keys)",
    "bodyformat": "binary | avro | json",
    "config": "store configuration file (TOML or broker.conf)",
    "locktimeoutms": "how long a task waits for a broker's lock (default 600000)",
    "sinkid": "identity of the writer for replay detection (default: the query id)",
    "chunkrows": "rows appended per batch put (default 1000000)",
    "writertasks": "tasks that append a foreachBatch micro-batch (default: the brokers or "
    "Spark's default parallelism, whichever is fewer)",
}
_SPARK_NOISE = {"checkpointlocation", "queryname", "mode"}
# How docs/sink.md spells the options this module reads in lower case.
_NAMES = {"locktimeoutms": "lockTimeoutMs", "chunkrows": "chunkRows", "writertasks": "writerTasks"}


@dataclasses.dataclass(frozen=True)
class SinkSettings:
    """Everything an executor needs to append a micro-batch (picklable)."""

    root: str
    topic: str | None
    brokers: int | None
    queues: int | None
    sharding_key: str | None
    body_format: str
    store_config: StoreConfig
    lock_timeout_ms: int = 600_000
    sink_id: str | None = None
    chunk_rows: int = 1_000_000
    writer_tasks: int | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> SinkSettings:
        opts = {str(k).lower(): v for k, v in options.items() if v is not None}
        root = opts.pop("path", None)
        if not root:
            raise ConfigError("option path: the store root directory is required")
        # Resolved here, on the driver: executors get the settings, not a path to look up.
        store_config = StoreConfig.effective(opts.pop("config", None))
        sink_values = {k: opts.pop(k) for k in list(opts) if k in SINK_OPTIONS}
        for k in _SPARK_NOISE:
            opts.pop(k, None)
        try:
            store_config = store_config.with_overrides(opts)
        except ConfigError as exc:
            raise ConfigError(f"{exc}; sink options: {', '.join(sorted(SINK_OPTIONS))}") from None
        topic = sink_values.get("topic")
        if topic is not None:
            problem = batchcolumns.topic_problem(str(topic))
            if problem:
                raise ConfigError(f"option topic={topic!r}: {problem}")
        return cls(
            root=str(root),
            topic=str(topic) if topic is not None else None,
            brokers=_positive(sink_values, "brokers"),
            queues=_positive(sink_values, "queues"),
            sharding_key=sink_values.get("shardingkey"),
            body_format=bodyformat.check_format(str(sink_values.get("bodyformat", "binary"))),
            store_config=store_config,
            lock_timeout_ms=_positive(sink_values, "locktimeoutms") or 600_000,
            sink_id=sink_values.get("sinkid"),
            chunk_rows=_positive(sink_values, "chunkrows") or 1_000_000,
            writer_tasks=_positive(sink_values, "writertasks"),
        )

    def topic_meta(self, existing: TopicMeta | None, schemas: tuple[str, ...]) -> TopicMeta:
        """The metadata to record for a new topic (or check against an existing one)."""
        brokers = self.brokers or (existing.brokers if existing else 4)
        queues = self.queues or (existing.queues if existing else DEFAULT_QUEUES)
        return TopicMeta(brokers, queues, self.body_format, schemas)

    @property
    def store_root(self) -> StoreRoot:
        return StoreRoot(self.root)


def _positive(values: dict[str, Any], name: str) -> int | None:
    raw = values.get(name)
    return None if raw is None else parse_count(raw, f"option {_NAMES.get(name, name)}")
