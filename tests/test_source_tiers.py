"""The source across both tiers against a real radosgw (tests/kit/ceph.py): a broker whose older
segments are only in the bucket (uploaded, then deleted locally by retention) read from the
earliest offset, by batch and by stream, exactly once and at the offsets the store handed out;
a reader with only the bucket (``path=s3://...``); local retention running between planning
and reading; a store time that falls in the tier.

Expected rows come from what the test wrote (each put's queue offset and its body), never from
the reader."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from rocketstore.pipeline import Message, MessageStore
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.retention.policy import RetentionPolicy
from rocketstore.pipeline.engine.retention.service import RetentionService
from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta
from rocketstore.pipeline.errors import ConfigError
from rocketstore.pipeline.format import bodyformat
from rocketstore.pipeline.tier.upload import Uploader
from rocketstore.source import options
from rocketstore.source.planning import Limit, Planner, pack_ranges
from rocketstore.source.tierread import read_range, read_ranges
from tests.kit.sourcekit import read_all
from tests.test_source_spark import batch_read, flat, stream

SEG = 64 * 1024
NOW = 10**13  # ms: every segment is long expired for the retention runs below
TOPIC = "orders"
QUEUES = 3

Row = tuple[int, int, bytes]  # queue id, queue offset, body


def settings_file(path: Path, settings: Mapping[str, Any]) -> Path:
    lines = [f"{k} = {v!r}" if isinstance(v, int) else f'{k} = "{v}"' for k, v in settings.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


class Broker:
    """``root/broker-0`` with the tier on in ``bucket``: what was written, uploads, and local
    retention as the store runs it."""

    def __init__(
        self, root: Path, ceph: Any, bucket: str, clock_ms: Callable[[], int] | None = None
    ) -> None:
        self.root = root
        self.path = root / "broker-0"
        self.settings = {
            "mappedFileSizeCommitLog": SEG,
            "maxHashSlotNum": 64,
            "maxIndexNum": 512,
            "fileReservedTime": 1,
            **ceph.settings(bucket, objectStorePrefix="pre/"),
        }
        self.config = StoreConfig().with_overrides(self.settings)
        self.conf = settings_file(root.parent / "store.toml", self.settings)
        clock = {} if clock_ms is None else {"clock_ms": clock_ms}
        self.store = MessageStore(self.path, self.config, **clock)
        self.rows: list[Row] = []
        self.offsets: dict[Row, int] = {}  # CommitLog offset of each row
        self.stamps: dict[Row, int] = {}

    def write(self, n: int) -> None:
        start = len(self.rows)
        for i in range(start, start + n):
            body = f"{i:06d}".encode() * 40
            keys = [f"k{i}"] + (["every25"] if i % 25 == 0 else [])
            r = self.store.put(Message(TOPIC, body, queue_id=i % QUEUES, keys=keys))
            row = (i % QUEUES, r.queue_offset, body)
            self.rows.append(row)
            self.offsets[row] = r.commit_log_offset
            self.stamps[row] = r.store_timestamp
        self.store.flush()

    def segments(self) -> list[int]:
        return sorted(int(p.name) for p in (self.path / "commitlog").iterdir() if p.name.isdigit())

    def upload(self) -> list[int]:
        return Uploader(self.path, self.config).run_once().uploaded

    def clean(self) -> None:
        old = 1.0  # every local segment's mtime far in the past
        for base in self.segments():
            os.utime(self.path / "commitlog" / f"{base:020d}", (old, old))
        svc = RetentionService(
            self.store,
            RetentionPolicy.from_config(self.config, max_files_per_run=1000),
            clock_ms=lambda: NOW,
            disk_usage=lambda _p: 0.1,
            disk_total=lambda _p: 10 << 20,
        )
        with self.store.writer_lock():
            svc.run(NOW, force_expired=True)

    def opts(self, **more: str) -> dict[str, str]:
        return {"path": str(self.root), "topic": TOPIC, "config": str(self.conf), **more}


@pytest.fixture
def broker(ceph: Any, bucket: str, tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path / "root", ceph, bucket)
    (tmp_path / "root").mkdir(exist_ok=True)
    try:
        yield b
    finally:
        b.store.close()


def tiered(broker: Broker, n: int = 900) -> None:
    """``n`` messages, all sealed segments uploaded and deleted locally."""
    broker.write(n)
    before = broker.segments()
    assert broker.upload() == before[:-1]
    broker.clean()
    assert broker.segments() == before[-1:]  # the tail only: the rest is in the bucket


def rows_of(table_rows: list[dict[str, Any]]) -> list[Row]:
    return [(r["queueId"], r["queueOffset"], bytes(r["body"])) for r in table_rows]


def test_a_batch_read_from_earliest_reads_both_tiers_once(broker: Broker) -> None:
    tiered(broker)
    got = rows_of(read_all(broker.opts()).to_pylist())
    assert sorted(got) == sorted(broker.rows)


def test_the_planner_cuts_each_queue_where_the_local_files_take_over(broker: Broker) -> None:
    tiered(broker)
    local_first = broker.segments()[0]
    planner = Planner(options.parse(broker.opts(), streaming=False))
    start, end = planner.batch_range()
    ranges = planner.ranges(start, end)
    for qid in range(QUEUES):
        mine = sorted((r.start, r.end, r.cold, r.segment) for r in ranges if r.queue_id == qid)
        written = sorted(row for row in broker.rows if row[0] == qid)
        # The first offset of the queue whose message is in the local tail: independent of
        # the planner, from the CommitLog offsets the puts returned.
        takes_over = min(row[1] for row in written if broker.offsets[row] >= local_first)
        *cold, local = mine
        assert local == (takes_over, len(written), False, -1)
        # The tier's part, cut at its segments: contiguous from 0, each piece's messages in
        # the one segment it names.
        assert [c[0] for c in cold] == [0] + [c[1] for c in cold[:-1]]
        assert cold[-1][1] == takes_over and all(c[2] for c in cold)
        segments = {c[3] for c in cold}
        assert len(segments) == len(cold) > 1
        for a, b, _, base in cold:
            assert all(base <= broker.offsets[row] < base + SEG for row in written[a:b])


def test_local_retention_between_planning_and_reading_reads_from_the_tier(
    broker: Broker,
) -> None:
    broker.write(900)
    sealed = broker.segments()[:-1]
    assert broker.upload() == sealed
    parsed = options.parse(broker.opts(), streaming=False)
    planner = Planner(parsed)
    start, end = planner.batch_range()
    ranges = planner.ranges(start, end)
    assert not any(r.cold for r in ranges)  # everything was local when planned
    broker.clean()  # ... and is not when read
    assert broker.segments() == broker.segments()[-1:]
    ctx = _context(parsed)
    got = [row for rng in ranges for b in read_range(rng, ctx) for row in rows_of(b.to_pylist())]
    assert sorted(got) == sorted(broker.rows)


def _context(parsed: options.ReadOptions) -> Any:
    from rocketstore.source import schema
    from rocketstore.source.read import ReadContext

    return ReadContext(schema=schema.arrow_schema(None), root=parsed.path, config=parsed.config)


def test_a_store_time_in_the_tier_starts_there(broker: Broker) -> None:
    tiered(broker)
    local_first = broker.segments()[0]
    cold = [row for row in broker.rows if broker.offsets[row] < local_first]
    at = broker.stamps[cold[len(cold) // 2]]
    got = rows_of(read_all(broker.opts(startingTimestamp=str(at))).to_pylist())
    assert sorted(got) == sorted(row for row in broker.rows if broker.stamps[row] >= at)


def test_a_key_is_found_in_both_tiers_once(broker: Broker) -> None:
    tiered(broker)
    local_first = broker.segments()[0]
    every25 = [row for i, row in enumerate(broker.rows) if i % 25 == 0]
    assert {broker.offsets[r] < local_first for r in every25} == {True, False}  # both tiers
    got = read_all(broker.opts(key="every25")).to_pylist()
    assert rows_of(got) == every25  # CommitLog order, each once
    cold = next(i for i, row in enumerate(broker.rows) if broker.offsets[row] < local_first)
    assert rows_of(read_all(broker.opts(key=f"k{cold}")).to_pylist()) == [broker.rows[cold]]
    assert read_all(broker.opts(key="nowhere")).num_rows == 0


@pytest.mark.slow
def test_a_stream_from_earliest_goes_through_the_tier_then_the_tail(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    tiered(broker, 600)
    opts = broker.opts(startingOffsets="earliest", maxMessagesPerTrigger="200")
    batches, _ = stream(spark, opts, tmp_path / "ckpt")
    first = rows_of(flat(batches))
    assert len(batches) >= 3  # the rate limit cut it: batches across the tiers' seam
    assert sorted(first) == sorted(broker.rows)

    # More, sealed, uploaded and deleted locally behind the query's back: the same query
    # goes on from its checkpoint with exactly the new messages.
    seen = list(broker.rows)
    tiered(broker, 600)
    batches, _ = stream(spark, opts, tmp_path / "ckpt")
    second = rows_of(flat(batches))
    assert sorted(second) == sorted(set(broker.rows) - set(seen))
    assert len(first) + len(second) == len(broker.rows)


@pytest.mark.slow
def test_a_reader_with_only_the_bucket_reads_what_is_sealed(
    spark: Any, broker: Broker, ceph: Any, bucket: str, tmp_path: Path
) -> None:
    broker.write(900)
    last = broker.segments()[-1]
    broker.upload()
    sealed = sorted(row for row in broker.rows if broker.offsets[row] < last)
    # Only what a bucket reader needs: the endpoint and the keys, no store root.
    creds = settings_file(
        tmp_path / "s3.toml",
        {"objectStoreAccessKey": ceph.access_key, "objectStoreSecretKey": ceph.secret_key},
    )
    opts = {
        "path": f"s3://{bucket}/pre/",
        "topic": TOPIC,
        "config": str(creds),
        "objectStoreEndpoint": ceph.endpoint,
    }
    got = rows_of([r.asDict() for r in batch_read(spark, opts).collect()])
    assert sorted(got) == sealed
    keyed = [r.asDict() for r in batch_read(spark, {**opts, "key": "every25"}).collect()]
    assert sorted(rows_of(keyed)) == [r for r in sealed if int(r[2][:6]) % 25 == 0]
    # One broker's prefix is a root of one broker, as a store directory is.
    alone = {**opts, "path": f"s3://{bucket}/pre/broker-0/", "startingOffsets": "earliest"}
    batches, _ = stream(spark, alone, tmp_path / "ckpt")
    assert sorted(rows_of(flat(batches))) == sealed
    assert {r["brokerName"] for r in flat(batches)} == {"broker-0"}


def test_a_bucket_reader_names_what_is_wrong(ceph: Any, bucket: str, tmp_path: Path) -> None:
    creds = settings_file(
        tmp_path / "s3.toml",
        {"objectStoreAccessKey": ceph.access_key, "objectStoreSecretKey": "wrong"},
    )
    base = {"topic": TOPIC, "config": str(creds), "objectStoreEndpoint": ceph.endpoint}
    with pytest.raises(ConfigError, match=r"objectStoreSecretKey|AWS_SECRET_ACCESS_KEY"):
        options.parse({**base, "path": f"s3://{bucket}/"}, streaming=False)
    with pytest.raises(ConfigError, match="no bucket"):
        options.parse({**base, "path": "s3:///pre/"}, streaming=False)


def test_a_bucket_reader_cannot_start_from_a_group(broker: Broker, ceph: Any, bucket: str) -> None:
    tiered(broker, 300)
    opts = {
        "path": f"s3://{bucket}/pre/",
        "topic": TOPIC,
        "config": str(broker.conf),
        "startingOffsets": "group:billing",
    }
    planner = Planner(options.parse(opts, streaming=True))
    with pytest.raises(ConfigError, match=r"consumerOffset\.json"):
        planner.initial_offsets()


def test_a_live_writer_the_uploader_and_retention_beside_a_stream_every_message_once(
    ceph: Any, bucket: str, tmp_path: Path
) -> None:
    """The writer puts and runs retention (every uploaded segment goes at once: its clock is
    hours ahead), the uploader uploads what is sealed, and a stream started half-way plans and
    reads from the earliest offset, 150 messages a batch, until it has caught up: every
    message read once, at its offset, the tiers' seam moving under it."""
    ahead = 2 * 3_600_000
    (tmp_path / "root").mkdir()
    broker = Broker(
        tmp_path / "root", ceph, bucket, clock_ms=lambda: time.time_ns() // 1_000_000 + ahead
    )
    total = 3000
    done, half = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def write() -> None:
        try:
            while len(broker.rows) < total:
                broker.write(30)
                broker.store.clean(force_expired=True)
                if len(broker.rows) >= total // 2:
                    half.set()
        except BaseException as exc:  # reported by the test, not lost in the thread
            failures.append(exc)
        finally:
            done.set()

    def upload() -> None:
        try:
            uploader = Uploader(broker.path, broker.config)
            while not done.is_set():
                uploader.run_once()
        except BaseException as exc:
            failures.append(exc)

    broker.write(30)  # the topic exists before the query starts
    threads = [threading.Thread(target=write), threading.Thread(target=upload)]
    for t in threads:
        t.start()
    try:
        # The query starts late, so that its first batches are in the bucket only.
        half.wait(timeout=300)
        planner = Planner(options.parse(broker.opts(startingOffsets="earliest"), streaming=True))
        ctx = _context(planner.options)
        start = planner.initial_offsets()
        got: list[Row] = []
        cold_reads = 0
        while True:
            finished = done.is_set()  # before planning: a plan after it sees every message
            end = planner.next_end(start, Limit(max_rows=150))
            ranges = planner.ranges(start, end)
            cold_reads += sum(r.cold for r in ranges)
            for part in pack_ranges(ranges, None):
                got.extend(row for b in read_ranges(part, ctx) for row in rows_of(b.to_pylist()))
            start = end
            if finished and sum(end.values()) == total:
                break
    finally:
        done.set()
        for t in threads:
            t.join()
        broker.store.close()
    assert not failures
    assert len(got) == len(set(got)) == total
    assert sorted(got) == sorted(broker.rows)
    assert cold_reads > 0  # the stream did read from the bucket


def test_a_bucket_reader_decodes_avro_bodies_with_the_catalog(
    ceph: Any, bucket: str, tmp_path: Path
) -> None:
    """The uploader copies the root's topics.json and schemas beside the brokers, so a reader
    with only the bucket knows an avro topic's schemas (two versions here), as a reader of the
    root does."""
    root = tmp_path / "root"
    root.mkdir()
    broker = Broker(root, ceph, bucket)
    meta = StoreRoot(root)
    ids = list(range(1600))
    v1 = pa.table({"id": pa.array(ids[:1500], pa.int64()), "name": [f"n{i}" for i in ids[:1500]]})
    v2 = pa.table(
        {
            "id": pa.array(ids[1500:], pa.int64()),
            "name": [f"n{i}" for i in ids[1500:]],
            "score": pa.array([0.5] * 100, pa.float64()),
        }
    )
    offsets: list[int] = []
    try:
        for table in (v1, v2):
            body_schema = bodyformat.BodySchema.from_arrow(table.schema, "people")
            meta.register_schema(body_schema.fingerprint, body_schema.document())
            meta.ensure_topic("people", TopicMeta(1, 1, "avro", (body_schema.fingerprint,)))
            n = len(table)
            done = broker.store.put_batch(
                pa.table(
                    {
                        "topic": pa.array(["people"] * n),
                        "body": bodyformat.encode_bodies(table, body_schema, "avro"),
                        "properties": pa.array(
                            [[(bodyformat.SCHEMA_PROPERTY, body_schema.fingerprint)]] * n,
                            pa.map_(pa.string(), pa.string()),
                        ),
                    }
                )
            )
            offsets.extend(done.commit_log_offsets.tolist())
        broker.store.flush()
        last = broker.segments()[-1]
        assert broker.upload()
    finally:
        broker.store.close()
    objects = ceph.objects(bucket, "pre/")
    assert objects["pre/topics.json"] == (root / "topics.json").read_bytes()
    assert {k for k in objects if k.startswith("pre/schemas/")} == {
        f"pre/schemas/{p.name}" for p in (root / "schemas").iterdir()
    }
    want = sorted(
        (i, f"n{i}", 0.5 if i >= 1500 else None)
        for i, o in zip(ids, offsets, strict=True)
        if o < last
    )
    assert 0 < len(want) < len(ids)
    creds = settings_file(
        tmp_path / "s3.toml",
        {"objectStoreAccessKey": ceph.access_key, "objectStoreSecretKey": ceph.secret_key},
    )
    for path in (f"s3://{bucket}/pre/", f"s3://{bucket}/pre/broker-0/"):
        opts = {
            "path": path,
            "topic": "people",
            "config": str(creds),
            "objectStoreEndpoint": ceph.endpoint,
        }
        got = read_all(opts).to_pylist()
        assert sorted((r["id"], r["name"], r["score"]) for r in got) == want
