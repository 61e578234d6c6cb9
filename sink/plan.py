"""Driver-side preparation shared by both faces of the sink (no Spark imports).

:func:`prepare` checks the input schema, records the topic in the store root (brokers and
queues are fixed by the first write) and registers the body schema, and returns the
:class:`~rocketstore.sink.rows.Layout` the tasks route by. :func:`route_batches` is the executor side of
routing, used by both faces.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import pyarrow as pa

from rocketstore.pipeline.engine.root import TopicMeta
from rocketstore.pipeline.errors import ConfigError
from rocketstore.sink.rows import Layout, check_schema, route, shape
from rocketstore.sink.settings import SinkSettings


@dataclasses.dataclass(frozen=True)
class Plan:
    settings: SinkSettings
    layout: Layout
    brokers: int
    queues: int


def prepare(settings: SinkSettings, schema: pa.Schema) -> Plan:
    """Check ``schema`` and fix the topic's layout. Runs on the driver, once per batch or query."""
    body_schema = check_schema(schema, settings.topic, settings.body_format, settings.sharding_key)
    root = settings.store_root
    schemas: tuple[str, ...] = ()
    if body_schema is not None:
        root.register_schema(body_schema.fingerprint, body_schema.document())
        schemas = (body_schema.fingerprint,)
    if settings.topic is not None:
        meta = root.ensure_topic(
            settings.topic, settings.topic_meta(root.topic(settings.topic), schemas)
        )
    else:
        # Topics come from a column and are recorded by the tasks as they meet them; they all
        # get the sink's layout.
        meta = settings.topic_meta(None, schemas)
    layout = Layout(
        settings.topic, meta.total_queues, settings.sharding_key, settings.body_format, body_schema
    )
    return Plan(settings, layout, meta.brokers, meta.queues)


def route_batches(
    plan: Plan, batches: Iterable[pa.RecordBatch], row_base: int
) -> Iterator[pa.RecordBatch]:
    """Route input batches (executor side); with a topic column, record each new topic in the
    store root.

    Batches that already carry ``__rs_row`` and ``__rs_mq`` (computed in Spark by
    :func:`rocketstore.sink.rows.queue_expression`) keep them; others are numbered from ``row_base`` and
    routed here.
    """
    seen: set[str] = set()
    count = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        if "__rs_mq" in batch.schema.names:
            rows = batch.column("__rs_row").to_numpy()
            mq = batch.column("__rs_mq").to_numpy()
            extra = [c for c in ("__rs_row", "__rs_mq", "__rs_pk") if c in batch.schema.names]
            routed = shape(batch.drop_columns(extra), plan.layout, rows, mq)
        else:
            routed = route(batch, plan.layout, row_base + count)
        count += batch.num_rows
        if plan.settings.topic is None:
            _record_topics(plan, routed, seen)
        yield routed


def _record_topics(plan: Plan, routed: pa.RecordBatch, seen: set[str]) -> None:
    root = plan.settings.store_root
    for topic in set(routed.column("topic").unique().to_pylist()) - seen:
        if topic is None:
            continue  # refused with a clear error by the append's validation
        schemas = (plan.layout.body_schema.fingerprint,) if plan.layout.body_schema else ()
        have = root.topic(topic)
        if have is not None and (have.brokers, have.queues) != (plan.brokers, plan.queues):
            raise ConfigError(
                f"topic {topic!r} in {root.path} has {have.brokers} brokers x {have.queues} "
                f"queues; rows of one sink share one layout ({plan.brokers} x {plan.queues}). "
                "Write it with a topic option, or give brokers/queues to match"
            )
        # Records a new topic (a concurrent creator with another layout still fails here).
        root.ensure_topic(
            topic, TopicMeta(plan.brokers, plan.queues, plan.settings.body_format, schemas)
        )
        seen.add(topic)
