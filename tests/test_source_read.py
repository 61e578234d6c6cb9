"""The source's file side, without Spark: queue bounds while a writer appends, retention, store
times, the vectorised decoding against the engine's own reads, tag filters, key look-ups, CRC
and pointer damage, data loss under a running read, and the RocketMQ 4.9.4 fixtures."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import CorruptRecordError, DataLossError, StoreError
from rocketstore.pipeline.files.localsegments import list_segments
from rocketstore.pipeline.format import record
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.layout import CQ_UNIT_SIZE
from rocketstore.source import options, read, schema
from rocketstore.source.brokerview import BrokerView, QueueBounds
from rocketstore.source.planning import Planner
from rocketstore.source.read import ReadContext, read_queue_range
from tests.kit.fixtures import fixture_dir
from tests.kit.sourcekit import (
    SMALL,
    body_of,
    expected_msg_lines,
    ids_of,
    make_root,
    message_table,
    msg_line,
    read_all,
    write,
)

HOUR_MS = 3_600_000


def _cq_file(broker: Path, topic: str, qid: int) -> Path:
    return list_segments(broker / "consumequeue" / topic / str(qid))[-1][1]


# -- bounds while a writer appends ----------------------------------------------------------------


def test_only_units_whose_record_is_complete_are_offered(tmp_path: Path) -> None:
    broker = tmp_path / "broker-0"
    write(tmp_path, 0, message_table("orders", list(range(6)), 1))
    view = BrokerView("broker-0", broker)
    assert view.queue_bounds("orders", 0) == QueueBounds(0, 6)

    # A writer that has written the unit of message 6 but not all of its record yet (the
    # writer never does this order, but a reader must not trust the order it sees).
    with MessageStore(broker, SMALL, read_only=True) as store:
        phys = store.max_phy_offset
    rec = record.encode_record(
        topic="orders",
        body=b"late",
        properties={"TAGS": "TagA"},
        queue_id=0,
        queue_offset=6,
        physical_offset=phys,
        born_timestamp=1,
        store_timestamp=2,
        born_host="127.0.0.1:1",
        store_host="127.0.0.1:2",
    )
    cq = _cq_file(broker, "orders", 0)
    with open(cq, "r+b") as f:
        f.seek(6 * CQ_UNIT_SIZE)
        f.write(struct.pack(">qiq", phys, len(rec), 0))
    seg_size = SMALL.mapped_file_size_commitlog
    log_file = broker / "commitlog" / f"{phys - phys % seg_size:020d}"
    body_end = 88 + len(b"late")
    for written in (0, 8, 40, 90, body_end - 1, body_end + 1):
        # The record written up to ``written`` bytes (front to back, as a copy writes it).
        with open(log_file, "r+b") as f:
            f.seek(phys % seg_size)
            f.write(rec[:written])
        assert view.queue_bounds("orders", 0) == QueueBounds(0, 6), written
    with open(log_file, "r+b") as f:
        f.seek(phys % seg_size)
        f.write(rec)
    assert view.queue_bounds("orders", 0) == QueueBounds(0, 7)
    rows = read_all({"path": str(tmp_path), "topic": "orders"}).to_pylist()
    assert rows[-1]["body"] == b"late" and rows[-1]["queueOffset"] == 6


def test_bounds_follow_a_writer_that_stays_open(tmp_path: Path) -> None:
    view = BrokerView("broker-0", tmp_path / "broker-0")
    with MessageStore(tmp_path / "broker-0", SMALL) as store:
        for n in range(1, 40, 7):
            store.put_batch(message_table("orders", list(range(n)), 3))
            got = {q: view.queue_bounds("orders", q) for q in view.queue_ids("orders")}
            want = {
                q.queue_id: QueueBounds(q.min_offset, q.max_offset) for q in store.queue_infos()
            }
            assert got == want


def test_retention_moves_the_earliest_offset(tmp_path: Path) -> None:
    broker = tmp_path / "broker-0"
    with MessageStore(broker, SMALL) as store:
        for k in range(12):
            store.put_batch(message_table("orders", list(range(k * 100, k * 100 + 100)), 2))
        assert len(store.commitlog.segments.files) >= 4
        assert store.retention is not None
        store.retention.run(
            int(time.time() * 1000) + 100 * HOUR_MS, force_expired=True, max_files=2
        )
        want = {q.queue_id: QueueBounds(q.min_offset, q.max_offset) for q in store.queue_infos()}
    view = BrokerView("broker-0", broker)
    got = {q: view.queue_bounds("orders", q) for q in view.queue_ids("orders")}
    assert got == want
    assert all(b.min > 0 for b in got.values())
    with MessageStore(broker, SMALL, read_only=True) as store:
        assert view.commitlog_min_offset() == store.min_phy_offset


def test_offset_for_time_is_the_first_message_at_or_after(tmp_path: Path) -> None:
    for k, t in enumerate((1000, 2000, 2000, 3000)):
        write(tmp_path, 0, message_table("orders", list(range(k * 10, k * 10 + 10)), 2), clock_ms=t)
    view = BrokerView("broker-0", tmp_path / "broker-0")
    with MessageStore(tmp_path / "broker-0", SMALL, read_only=True) as store:
        for qid in (0, 1):
            bounds = view.queue_bounds("orders", qid)
            times = [m.store_timestamp for m in store.get_messages("orders", qid, 0, 100).messages]
            for ts in (0, 999, 1000, 1001, 2000, 2500, 3000, 3001):
                want = next((i for i, t in enumerate(times) if t >= ts), len(times))
                assert view.offset_for_time("orders", qid, ts, bounds) == want


# -- decoding against the engine ------------------------------------------------------------------

HOSTS = ["127.0.0.1:5000", "10.1.2.3:65535", "[::1]:5006", "[fe80::1]:10911"]


@st.composite
def messages(draw: st.DrawFn) -> list[Message]:
    out = []
    for _ in range(draw(st.integers(1, 25))):
        props = draw(
            st.dictionaries(
                st.text(
                    st.characters(blacklist_characters="\x00\x01\x02", codec="utf-8"),
                    min_size=1,
                    max_size=6,
                ),
                st.text(
                    st.characters(blacklist_characters="\x00\x01\x02", codec="utf-8"), max_size=8
                ),
                max_size=3,
            )
        )
        props = {k: v for k, v in props.items() if k not in ("KEYS", "TAGS", "UNIQ_KEY")}
        out.append(
            Message(
                topic="orders",
                body=draw(st.binary(max_size=300)),
                queue_id=draw(st.integers(0, 2)),
                keys=draw(
                    st.one_of(st.none(), st.lists(st.sampled_from(["a", "bb", "中"]), max_size=3))
                ),
                tags=draw(st.one_of(st.none(), st.sampled_from(["TagA", "TagB", "Aa", "BB"]))),
                properties=props or None,
                flag=draw(st.integers(-(2**31), 2**31 - 1)),
                born_host=draw(st.sampled_from(HOSTS)),
                reconsume_times=draw(st.integers(0, 16)),
                born_timestamp=draw(st.integers(0, 2**41)),
            )
        )
    return out


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=messages(), v6=st.booleans())
def test_decoding_matches_the_engine(
    tmp_path_factory: pytest.TempPathFactory, batch: list[Message], v6: bool
) -> None:
    root = tmp_path_factory.mktemp("root")
    config = StoreConfig(
        mapped_file_size_commitlog=4096,
        mapped_file_size_consume_queue=200,
        broker_ip1="fe80::2" if v6 else "10.0.0.9",
    )
    with MessageStore(root / "broker-0", config) as store:
        store.put_batch(batch)
        want = {}
        for info in store.queue_infos("orders"):
            for m in store.get_messages("orders", info.queue_id, 0, 1000).messages:
                want[(m.queue_id, m.queue_offset)] = m
    rows = read_all({"path": str(root), "topic": "orders", "includeAll": "true"}).to_pylist()
    assert len(rows) == len(batch) == len(want)
    for row in rows:
        m = want[(row["queueId"], row["queueOffset"])]
        assert row["commitLogOffset"] == m.commit_log_offset
        assert row["msgId"] == m.msg_id
        assert row["body"] == m.body
        assert dict(row["properties"]) == m.properties
        assert [k for k, _ in row["properties"]] == list(m.properties)
        assert row["keys"] == (m.keys if "KEYS" in m.properties else None)
        assert row["tags"] == m.tags
        assert row["bornHost"] == m.born_host and row["storeHost"] == m.store_host
        assert row["flag"] == m.flag and row["sysFlag"] == m.sys_flag
        assert row["reconsumeTimes"] == m.reconsume_times
        assert row["bornTimestamp"].timestamp() * 1000 == pytest.approx(m.born_timestamp)
        assert row["storeTimestamp"].timestamp() * 1000 == pytest.approx(m.store_timestamp)
        assert row["topic"] == "orders" and row["brokerName"] == "broker-0"


def test_output_has_exactly_the_declared_schema(tmp_path: Path) -> None:
    make_root(tmp_path, "orders", count=5)
    table = read_all({"path": str(tmp_path), "topic": "orders"})
    assert table.schema.equals(schema.arrow_schema(None))
    assert table.schema.field("storeTimestamp").type == pa.timestamp("us", tz="UTC")


# -- tags, keys -----------------------------------------------------------------------------------


def test_tag_filter_checks_the_real_tag_after_the_hash(tmp_path: Path) -> None:
    # "Aa" and "BB" have the same Java hash, so their units pass the same hash filter.
    tags = ["Aa", "BB", "TagA", None, "Aa", "BB", "TagB", "TagA"]
    ids = list(range(len(tags)))
    StoreRoot(tmp_path).ensure_topic("orders", TopicMeta(1, 2))
    write(tmp_path, 0, message_table("orders", ids, 2, tags=tags))
    base = {"path": str(tmp_path), "topic": "orders", "includeProperties": "true"}
    assert ids_of(read_all({**base, "subExpression": "Aa"}).to_pylist()) == [0, 4]
    assert ids_of(read_all({**base, "subExpression": "BB || TagA"}).to_pylist()) == [1, 2, 5, 7]
    assert ids_of(read_all({**base, "subExpression": "*"}).to_pylist()) == ids
    assert ids_of(read_all({**base, "subExpression": " "}).to_pylist()) == []


def test_key_read_returns_exactly_that_keys_messages(tmp_path: Path) -> None:
    StoreRoot(tmp_path).ensure_topic("orders", TopicMeta(2, 1))
    # "Aa"/"BB" collide in the index (same Java hash of "orders#Aa" and "orders#BB").
    keys = [["Aa"], ["BB"], ["x", "Aa"], ["y"], ["Aa"]]
    write(tmp_path, 0, message_table("orders", [0, 1, 2], 1, keys=keys[:3]), clock_ms=1_000)
    write(tmp_path, 1, message_table("orders", [3, 4], 1, keys=keys[3:]), clock_ms=5_000)
    write(tmp_path, 1, message_table("other", [5], 1, keys=[["Aa"]]), clock_ms=5_000)
    with MessageStore(tmp_path / "broker-1", SMALL) as store:
        store.put(
            Message("orders", b"half", keys=["Aa"], sys_flag=record.TRANSACTION_PREPARED_TYPE)
        )
    base = {"path": str(tmp_path), "topic": "orders", "key": "Aa", "includeProperties": "true"}
    assert ids_of(read_all(base).to_pylist()) == [0, 2, 4]
    assert ids_of(read_all({**base, "endTimestamp": "4999"}).to_pylist()) == [0, 2]
    assert ids_of(read_all({**base, "startTimestamp": "1001"}).to_pylist()) == [4]
    assert ids_of(read_all({**base, "key": "BB"}).to_pylist()) == [1]
    uniq = read_all({**base, "key": "y"}).to_pylist()[0]
    by_uniq = read_all({**base, "key": dict(uniq["properties"])["UNIQ_KEY"]}).to_pylist()
    assert ids_of(by_uniq) == [3]
    assert ids_of(read_all({**base, "subExpression": "TagB"}).to_pylist()) == [4]


# -- damage ---------------------------------------------------------------------------------------


def test_a_crc_mismatch_names_broker_file_and_offset(tmp_path: Path) -> None:
    make_root(tmp_path, "orders", brokers=2, queues=1, count=6)
    broker = tmp_path / "broker-1"
    with MessageStore(broker, SMALL, read_only=True) as store:
        victim = store.get_messages("orders", 0, 1, 1).messages[0]
    body_at = victim.commit_log_offset + 88 + 2
    segment = list_segments(broker / "commitlog")[0][1]
    with open(segment, "r+b") as f:
        f.seek(body_at)
        byte = f.read(1)
        f.seek(body_at)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptRecordError) as err:
        read_all({"path": str(tmp_path), "topic": "orders"})
    assert err.value.path == str(segment)
    assert err.value.offset == victim.commit_log_offset
    assert "broker-1" in str(err.value) and "body CRC mismatch" in str(err.value)


def test_a_unit_pointing_at_another_record_is_reported_against_the_consume_queue(
    tmp_path: Path,
) -> None:
    make_root(tmp_path, "orders", brokers=1, queues=1, count=4)
    cq = _cq_file(tmp_path / "broker-0", "orders", 0)
    data = bytearray(cq.read_bytes())
    data[20:40], data[40:60] = data[40:60], data[20:40]
    cq.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError) as err:
        read_all({"path": str(tmp_path), "topic": "orders"})
    assert err.value.path == str(cq) and err.value.offset == 20
    assert "unit 1 of orders/0 points at CommitLog offset" in str(err.value)


# -- data loss while reading ----------------------------------------------------------------------


def _plan(root: Path, **extra: str) -> tuple[Planner, ReadContext]:
    parsed = options.parse({"path": str(root), "topic": "orders", **extra}, streaming=False)
    ctx = ReadContext(
        schema=schema.arrow_schema(None),
        root=str(root),
        fail_on_data_loss=parsed.fail_on_data_loss,
    )
    return Planner(parsed), ctx


def test_segments_deleted_after_planning_are_data_loss(tmp_path: Path) -> None:
    broker = tmp_path / "broker-0"
    StoreRoot(tmp_path).ensure_topic("orders", TopicMeta(1, 1))
    for k in range(4):
        write(tmp_path, 0, message_table("orders", list(range(k * 150, k * 150 + 150)), 1))
    planner, ctx = _plan(tmp_path)
    start, end = planner.batch_range()
    (rng,) = planner.ranges(start, end)
    first_segment = list_segments(broker / "commitlog")[0][1]
    os.unlink(first_segment)
    with pytest.raises(DataLossError) as err:
        list(read_queue_range(rng, ctx))
    assert "orders/broker-0/0" in str(err.value) and "CommitLog segment was deleted" in str(
        err.value
    )

    planner, ctx = _plan(tmp_path, failOnDataLoss="false")
    rows = pa.Table.from_batches(list(read_queue_range(rng, ctx))).to_pylist()
    offsets = [r["queueOffset"] for r in rows]
    assert offsets == list(range(offsets[0], 600)) and offsets[0] > 0
    assert all(r["body"] == body_of(r["queueOffset"]) for r in rows)

    # Planned now, the deleted messages are below the earliest offset.
    planner, _ = _plan(tmp_path, startingOffsets='{"orders": {"broker-0": {"0": 3}}}')
    with pytest.raises(DataLossError, match=r"orders/broker-0/0: offsets \[3, "):
        start, end = planner.batch_range()
        planner.ranges(start, end)


def test_a_consume_queue_file_deleted_after_planning_is_data_loss(tmp_path: Path) -> None:
    StoreRoot(tmp_path).ensure_topic("orders", TopicMeta(1, 1))
    write(tmp_path, 0, message_table("orders", list(range(120)), 1))
    planner, ctx = _plan(tmp_path)
    start, end = planner.batch_range()
    (rng,) = planner.ranges(start, end)
    first = list_segments(tmp_path / "broker-0" / "consumequeue" / "orders" / "0")[0][1]
    os.unlink(first)
    with pytest.raises(DataLossError, match=r"offsets \[0, 50\) \(50 messages\): its ConsumeQueue"):
        list(read_queue_range(rng, ctx))
    _, lenient = _plan(tmp_path, failOnDataLoss="false")
    rows = pa.Table.from_batches(list(read_queue_range(rng, lenient))).to_pylist()
    assert [r["queueOffset"] for r in rows] == list(range(50, 120))


def test_a_consume_queue_file_deleted_between_the_listing_and_the_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention deletes the queue's oldest file after a chunk's read listed the directory and
    before it looked at the file: the units past it are read, the deleted ones are data lost."""
    StoreRoot(tmp_path).ensure_topic("orders", TopicMeta(1, 1))
    write(tmp_path, 0, message_table("orders", list(range(120)), 1))
    _, ctx = _plan(tmp_path, failOnDataLoss="false")
    planner, _ = _plan(tmp_path)
    start, end = planner.batch_range()
    (rng,) = planner.ranges(start, end)

    class ListedThenDeleted(read.LocalSegments):
        def relist(self, leftovers: list[Path] | None = None) -> None:
            super().relist(leftovers)
            if self.entries and self.entries[0][1].parent.name == "0":
                self.entries[0][1].unlink(missing_ok=True)

    monkeypatch.setattr(read, "LocalSegments", ListedThenDeleted)
    rows = pa.Table.from_batches(list(read_queue_range(rng, ctx))).to_pylist()
    assert [r["queueOffset"] for r in rows] == list(range(50, 120))


def test_chunks_and_min_partitions_read_every_message_once(tmp_path: Path) -> None:
    ids = make_root(tmp_path, "orders", brokers=2, queues=3, count=300)
    parsed = options.parse(
        {"path": str(tmp_path), "topic": "orders", "minPartitions": "17"}, streaming=False
    )
    planner = Planner(parsed)
    start, end = planner.batch_range()
    ranges = planner.ranges(start, end)
    assert len(ranges) == 17
    ctx = ReadContext(
        schema=schema.arrow_schema(None, frozenset({"properties"})),
        root=str(tmp_path),
        chunk_units=7,
    )
    batches = [b for r in ranges for b in read_queue_range(r, ctx)]
    assert max(b.num_rows for b in batches) <= 7
    rows = pa.Table.from_batches(batches).to_pylist()
    assert ids_of(rows) == ids
    assert all(r["body"] == body_of(int(dict(r["properties"])["id"])) for r in rows)
    keys = {(r["brokerName"], r["queueId"], r["queueOffset"]) for r in rows}
    assert len(keys) == len(rows)


# -- RocketMQ 4.9.4 stores ------------------------------------------------------------------------


@pytest.mark.fixtures
@pytest.mark.parametrize("name", ["basic", "transactions", "crashed"])
def test_fixture_reads_as_rocketmq_read_it(name: str) -> None:
    fixture = fixture_dir(name)
    rows = read_all(
        {"path": str(fixture / "store"), "topic": "TopicA,TopicB", "includeAll": "true"}
    ).to_pylist()
    assert sorted(msg_line(r) for r in rows) == expected_msg_lines(fixture)
    for r in rows:
        assert r["brokerName"] == "store"
        assert r["keys"] == dict(r["properties"])["KEYS"].split(" ")
    keyed = read_all(
        {"path": str(fixture / "store"), "topic": "TopicA", "key": "grp-4"}
    ).to_pylist()
    assert keyed and all("grp-4" in r["keys"] for r in keyed)
    assert len(keyed) == sum(1 for r in rows if r["topic"] == "TopicA" and "grp-4" in r["keys"])
    np.testing.assert_array_equal(
        sorted(r["commitLogOffset"] for r in keyed),
        sorted(
            r["commitLogOffset"] for r in rows if r["topic"] == "TopicA" and "grp-4" in r["keys"]
        ),
    )


def test_a_key_read_of_a_store_without_index_says_so(tmp_path: Path) -> None:
    StoreRoot(tmp_path).ensure_topic("orders", TopicMeta(1, 1))
    no_index = StoreConfig(
        mapped_file_size_commitlog=SMALL.mapped_file_size_commitlog,
        mapped_file_size_consume_queue=SMALL.mapped_file_size_consume_queue,
        message_index_enable=False,
    )
    write(tmp_path, 0, message_table("orders", [1, 2], 1), config=no_index)
    with pytest.raises(StoreError, match="no IndexFiles, so option key cannot be looked up"):
        read_all({"path": str(tmp_path), "topic": "orders", "key": "k1"})


def test_a_segment_deleted_between_the_listing_and_its_size_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention deletes the oldest segment while a partition read starts: the read takes the
    segment size and the first offset from the oldest segment still there (a soak run hit
    this as a FileNotFoundError out of the read)."""
    from rocketstore.source import segfiles as read_module

    store_dir = tmp_path / "store"
    with MessageStore(store_dir, SMALL) as store:
        for i in range(1200):
            store.put(Message("T", b"x" * 100, keys=[f"k{i}"]))
    segments = list_segments(store_dir / "commitlog")
    assert len(segments) >= 3

    class ListedThenDeleted(read_module.LocalSegments):
        def relist(self, leftovers: list[Path] | None = None) -> None:
            super().relist(leftovers)
            segments[0][1].unlink(missing_ok=True)  # retention, right after the listing

    monkeypatch.setattr(read_module, "LocalSegments", ListedThenDeleted)
    cache = read_module.SegmentCache(store_dir / "commitlog")
    assert cache.min_offset == segments[1][0]
    assert cache.segment_size == SMALL.mapped_file_size_commitlog
    assert cache.get(segments[0][0]) is None
