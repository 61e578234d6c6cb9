"""The sink's options (no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocketstore.pipeline.config import SYNC_FLUSH, StoreConfig
from rocketstore.pipeline.errors import ConfigError
from rocketstore.sink.foreach import _option_name, writer_tasks
from rocketstore.sink.format import batch_writer, stream_writer
from rocketstore.sink.settings import SinkSettings


def test_options_left_out_take_their_defaults() -> None:
    s = SinkSettings.from_options({"path": "/r", "topic": "orders"})
    assert (s.root, s.topic, s.brokers, s.queues, s.body_format) == (
        "/r",
        "orders",
        None,
        None,
        "binary",
    )
    assert (s.lock_timeout_ms, s.chunk_rows, s.sink_id) == (600_000, 1_000_000, None)
    # The store settings every tool uses without a file named (that an edited
    # conf/store.toml reaches the sink is tests/test_defaults.py's business).
    assert s.store_config == StoreConfig.effective()
    assert s.store_config.origin == StoreConfig.effective().origin


def test_config_file_then_single_options_override(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("flushDiskType=SYNC_FLUSH\nmappedFileSizeCommitLog=65536\nbrokerName=b\n")
    # Spark lower-cases option names; both spellings must work.
    s = SinkSettings.from_options(
        {"path": "/r", "config": str(conf), "mappedfilesizecommitlog": "131072", "BROKERS": "3"}
    )
    assert s.store_config.flush_disk_type == SYNC_FLUSH
    assert s.store_config.mapped_file_size_commitlog == 131072
    assert s.brokers == 3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "option path"),
        ({"path": "/r", "brokers": "0"}, "option brokers='0'"),
        ({"path": "/r", "queues": "x"}, "option queues='x'"),
        ({"path": "/r", "bodyFormat": "xml"}, "option bodyFormat='xml': expected one of binary"),
        ({"path": "/r", "topic": "a b"}, "option topic='a b'"),
        ({"path": "/r", "flushDiskTyp": "SYNC_FLUSH"}, "unknown store setting 'flushdisktyp'"),
        ({"path": "/r", "config": "/nonexistent.toml"}, "cannot read store configuration"),
        ({"path": "/r", "writerTasks": "0"}, "option writerTasks='0'"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SinkSettings.from_options(options)


class _Context:
    defaultParallelism = 2  # local[2]


class _Conf:
    def __init__(self, value: str | None) -> None:
        self.value = value

    def get(self, key: str, default: str | None = None) -> str | None:
        assert key == "spark.default.parallelism"
        return self.value if self.value is not None else default


class _Classic:
    sparkContext = _Context()


class _Connect:
    """A Spark Connect session: no SparkContext, a conf to ask."""

    def __init__(self, parallelism: str | None) -> None:
        self.conf = _Conf(parallelism)


@pytest.mark.parametrize(
    ("session", "brokers", "wanted", "tasks"),
    [
        (_Classic(), 64, None, 2),  # the session's cores, not one task per broker
        (_Classic(), 1, None, 1),
        (_Classic(), 64, 8, 8),
        (_Classic(), 4, 8, 4),  # never more than one task per broker
        (_Connect("16"), 64, None, 16),
        (_Connect(None), 64, None, 64),
    ],
)
def test_writer_tasks(session: object, brokers: int, wanted: int | None, tasks: int) -> None:
    assert writer_tasks(session, brokers, wanted) == tasks  # type: ignore[arg-type]


@pytest.mark.parametrize("make", [batch_writer, stream_writer])
def test_the_data_source_writer_refuses_writer_tasks(make: object) -> None:
    from pyspark.sql.types import BinaryType, StructField, StructType

    schema = StructType([StructField("body", BinaryType())])
    options = {"path": "/r", "topic": "orders", "writerTasks": "2"}
    with pytest.raises(ConfigError, match="option writerTasks: the rocketstore data source"):
        make(options, schema, False)  # type: ignore[operator]


def test_python_keyword_names_map_to_option_names() -> None:
    assert _option_name("sharding_key") == "shardingKey"
    assert _option_name("writer_tasks") == "writerTasks"
    assert _option_name("lock_timeout_ms") == "lockTimeoutMs"
    assert _option_name("flushDiskType") == "flushDiskType"


def test_topics_from_a_column_are_recorded_with_the_sinks_layout(tmp_path: Path) -> None:
    import pyarrow as pa

    from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta
    from rocketstore.sink.plan import prepare, route_batches

    root = StoreRoot(tmp_path)
    root.ensure_topic("old", TopicMeta(1, 1))
    settings = SinkSettings.from_options({"path": str(tmp_path), "brokers": "2"})
    batch = pa.record_batch({"topic": ["new", "new"], "body": [b"a", b"b"]})
    plan = prepare(settings, batch.schema)
    assert len(list(route_batches(plan, [batch], 0))) == 1
    assert root.topic("new") == TopicMeta(2, 4)
    clash = pa.record_batch({"topic": ["old"], "body": [b"c"]})
    with pytest.raises(ConfigError, match="rows of one sink share one layout"):
        list(route_batches(plan, [clash], 0))
