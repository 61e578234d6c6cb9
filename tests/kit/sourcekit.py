"""Helpers of the source tests: building store roots, reading partitions without Spark, and
rendering rows the way the RocketMQ fixtures' ``read.txt`` renders messages."""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.source import options
from rocketstore.source.planning import Planner
from rocketstore.source.read import read_context
from rocketstore.source.tierread import read_part
from tests.kit.readtxt import born_text, store_text

SMALL = StoreConfig(
    mapped_file_size_commitlog=64 * 1024,
    mapped_file_size_consume_queue=20 * 50,
    max_hash_slot_num=64,
    max_index_num=256,
)
TAGS = ("TagA", "TagB", "TagC")


def message_table(
    topic: str,
    ids: Sequence[int],
    queues: int,
    *,
    tags: Sequence[str | None] | None = None,
    keys: Sequence[list[str] | None] | None = None,
    extra: Mapping[str, str] | None = None,
) -> pa.Table:
    """Messages whose body is ``m<id>:`` plus a payload that depends on the id, in queue
    ``id % queues``, with tag ``TAGS[id % 3]`` and keys ``[k<id>, g<id % 5>]`` by default."""
    props = [[*(extra or {}).items(), ("id", str(i))] for i in ids]
    return pa.table(
        {
            "topic": pa.array([topic] * len(ids), pa.string()),
            "body": pa.array([body_of(i) for i in ids], pa.binary()),
            "queueId": pa.array([i % queues for i in ids], pa.int32()),
            "keys": pa.array(
                keys if keys is not None else [[f"k{i}", f"g{i % 5}"] for i in ids],
                pa.list_(pa.string()),
            ),
            "tags": pa.array(tags if tags is not None else [TAGS[i % 3] for i in ids], pa.string()),
            "properties": pa.array(props, pa.map_(pa.string(), pa.string())),
        }
    )


def body_of(i: int) -> bytes:
    return f"m{i}:".encode() + bytes(97 + (i * 7 + k) % 26 for k in range(i % 40))


def write(
    root: Path,
    broker: int,
    table: pa.Table,
    *,
    config: StoreConfig = SMALL,
    clock_ms: int | None = None,
) -> None:
    """Append ``table`` to ``root/broker-<broker>`` (a writer open, closed afterwards)."""
    kwargs: dict[str, Any] = {} if clock_ms is None else {"clock_ms": lambda: clock_ms}
    with MessageStore(root / f"broker-{broker}", config, **kwargs) as store:
        store.put_batch(table)


def make_root(
    root: Path,
    topic: str,
    *,
    brokers: int = 2,
    queues: int = 2,
    count: int = 40,
    config: StoreConfig = SMALL,
    first_id: int = 0,
    clock_ms: int | None = None,
) -> list[int]:
    """A root with ``count`` messages of ``topic`` spread over brokers by id; returns the ids."""
    ids = list(range(first_id, first_id + count))
    StoreRoot(root).ensure_topic(topic, TopicMeta(brokers, queues))
    for b in range(brokers):
        mine = [i for i in ids if (i // queues) % brokers == b]
        if mine:
            write(root, b, message_table(topic, mine, queues), config=config, clock_ms=clock_ms)
    return ids


def read_all(opts: Mapping[str, str], *, streaming: bool = False) -> pa.Table:
    """A batch read without Spark: plan on the spot, read every partition, concatenate."""
    parsed = options.parse(opts, streaming=streaming)
    ctx = read_context(parsed)
    batches = [b for part in Planner(parsed).batch_parts() for b in read_part(part, ctx)]
    return pa.Table.from_batches(batches, schema=ctx.schema)


def ids_of(rows: Iterable[Mapping[str, Any]]) -> list[int]:
    """The ids (property ``id``) of rows, sorted."""
    return sorted(int(dict(r["properties"])["id"]) for r in rows)


# -- read.txt -------------------------------------------------------------------------------------

_DROP = re.compile(r",size=\d+|,prepTxOff=-?\d+|,bodyCRC=-?\d+(?=,bodyCRCcalc)")


def expected_msg_lines(fixture: Path) -> list[str]:
    """The MSG lines of a fixture's read.txt without the fields the source has no column for
    (record size, prepared transaction offset, the stored CRC), sorted."""
    text = (fixture / "read.txt").read_text(encoding="utf-8").splitlines()
    return sorted(_DROP.sub("", line) for line in text if line.startswith("MSG "))


def msg_line(row: Mapping[str, Any]) -> str:
    """A source row in read.txt's MSG format, less the fields :func:`expected_msg_lines` drops."""
    props = dict(row["properties"])
    ms = lambda ts: int(ts.timestamp() * 1000)  # noqa: E731
    body = row["body"]
    listed = ",".join(f"{k}={v}" for k, v in sorted(props.items()))
    return (
        f"MSG {row['topic']},{row['queueId']},{row['queueOffset']},{row['commitLogOffset']},"
        f"storeTs={ms(row['storeTimestamp'])},bornTs={ms(row['bornTimestamp'])},"
        f"sysFlag={row['sysFlag']},flag={row['flag']},reconsume={row['reconsumeTimes']},"
        f"born={born_text(row['bornHost'])},store={store_text(row['storeHost'])},"
        f"msgId={row['msgId']},keys={props.get('KEYS')},tags={row['tags']},"
        f"uniq={props.get('UNIQ_KEY')},bodyLen={len(body)},"
        f"bodyCRCcalc={zlib.crc32(body) & 0x7FFFFFFF},props={{{listed}}}"
    )


def stream(
    spark: Any, opts: Mapping[str, str], checkpoint: Path
) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """Run a query to the end of what is there (availableNow); returns the rows of each
    micro-batch and the query's progress reports."""
    batches: dict[int, list[dict[str, Any]]] = {}

    def collect(df: Any, batch_id: int) -> None:
        batches[batch_id] = [r.asDict(recursive=True) for r in df.collect()]

    reader = spark.readStream.format("rocketstore")
    for k, v in opts.items():
        reader = reader.option(k, v)
    query = (
        reader.load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return [batches[k] for k in sorted(batches)], list(query.recentProgress)
