"""RocketMQ 4.9.4's own servers and clients on the files rocketstore writes and reads, both ways
(../shared/rocketmq-4.9.4 through tests/kit/stockrocketmq.py, in a network namespace):

* a root the Spark sink wrote, served by three stock brokers with autoCreateTopicEnable=false:
  the stock consumer reads every row exactly, ``mqadmin`` finds messages by key and by msgId
  and reports each queue's offsets, ``verify`` is clean after the brokers ran, and what
  rocketstore appends afterwards is served too;
* one directory taking turns: served by a stock broker, written by rocketstore (``produce`` and
  the Spark sink), served again, several times, with each side refused while the other holds
  it (and a broker refused before it loads a directory a writer holds);
* a stock producer sending to a running broker while the rocketstore streaming source and the
  CLI read its store directory.

One stock name server serves the whole module (started by the first test that needs it); each
test starts and stops its own brokers, on topics and directories of its own.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import dataclasses
import hashlib
import json
import random
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline import cli
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import StoreLockedError
from rocketstore.pipeline.files import lock
from rocketstore.pipeline.format import record
from rocketstore.pipeline.format.message import Message
from tests.kit import stockrocketmq
from tests.kit.fixtures import SMALL_CONFIG
from tests.kit.stockrocketmq import (
    BROKER_CONF,
    BROKER_PORT,
    GEOMETRY,
    Consumed,
    StockCluster,
    as_consumed,
    assert_dense,
    check_sent,
    content,
    parse_message,
    parse_query_by_key,
    parse_topic_status,
    serve_and_consume,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("stock-rocketmq")]

cluster = stockrocketmq.cluster  # the stock name server and brokers, one set for this module

SINK_OPTIONS = {name: str(value) for name, value in GEOMETRY.items()}
WAIT_S = 300  # a deadline for conditions polled on a loaded two-core machine


@pytest.fixture
def props(tmp_path: Path) -> Path:
    """The geometry as a broker.conf-style file, for the CLI's ``--config``."""
    path = tmp_path / "store.properties"
    path.write_text("".join(f"{name}={value}\n" for name, value in GEOMETRY.items()))
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def sink_write(spark: Any, root: Path, rows: list[tuple[Any, ...]], **options: str) -> None:
    """``df.write.format("rocketstore")`` of (topic, keys, tags, body) rows into ``root``."""
    df = spark.createDataFrame(rows, "topic string, keys string, tags string, body binary")
    writer = df.write.format("rocketstore").mode("append").option("path", str(root))
    for name, value in {**SINK_OPTIONS, **options}.items():
        writer = writer.option(name, value)
    writer.save()


# -- a root the Spark sink wrote, served by three stock brokers ---------------------------------


def root_rows(start: int, n: int) -> list[tuple[str, str | None, str | None, bytes]]:
    """Orders with two keys (one shared by 20 of every 3,000), a tag and a binary body; every
    fifth row an Audit row, every other of those without keys or tags."""
    rng = random.Random(start)
    rows: list[tuple[str, str | None, str | None, bytes]] = []
    for i in range(start, start + n):
        body = f"{i}:".encode() + rng.randbytes(rng.randrange(0, 300))
        if i % 5 == 4:
            plain = i % 10 == 9
            rows.append(("Audit", None if plain else f"audit-{i}", None if plain else "A", body))
        else:
            rows.append(("Orders", f"order-{i} cust-{i % 150}", f"T{i % 3}", body))
    return rows


def expected(rows: list[tuple[str, str | None, str | None, bytes]], topic: str) -> Any:
    return collections.Counter(
        (t, keys or "null", tags or "null", body) for t, keys, tags, body in rows if t == topic
    )


def test_a_root_the_sink_wrote_served_by_three_stock_brokers(
    spark: Any,
    cluster: StockCluster,
    tmp_path: Path,
    props: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Three broker directories written by the Spark sink (their msgIds naming the ports the
    brokers will listen on), served by stock brokers with autoCreateTopicEnable=false: the
    stock pull consumer reads every row exactly once with its topic, keys, tags and body, at
    dense offsets; mqadmin's topicStatus, queryMsgByKey and queryMsgById agree with the store; verify is clean after the brokers ran; and after rocketstore appends
    to the directories they served, a second stock run reads everything."""
    root = tmp_path / "root"
    host = {"brokerIP1": "127.0.0.1", "listenPort": str(BROKER_PORT)}
    written = root_rows(0, 3000)
    sink_write(spark, root, written, brokers="3", queues="2", **host)
    dirs = [root / f"broker-{b}" for b in range(3)]
    assert all(d.is_dir() for d in dirs)

    with cluster.serving(dirs, *BROKER_CONF) as ports:
        for topic in ("Orders", "Audit"):
            consumed = cluster.consume(topic)
            assert content(consumed) == expected(written, topic)
            assert_dense(consumed)
            # The same messages at the same places as rocketstore reads them.
            assert sorted(consumed) == sorted(r for d in dirs for r in as_consumed(d, topic))

        status = parse_topic_status(cluster.mqadmin("topicStatus", "-t", "Orders"))
        on_disk = {}
        for d in dirs:
            with MessageStore(d, SMALL_CONFIG, read_only=True) as store:
                for info in store.queue_infos("Orders"):
                    on_disk[(d.name, info.queue_id)] = (info.min_offset, info.max_offset)
        assert status == on_disk and len(status) == 6

        check_lookups(cluster, dirs, ports)

    for d in dirs:
        rc, out, _ = run_cli(capsys, "verify", str(d), "--config", str(props))
        assert rc == 0, out

    more = root_rows(3000, 600)
    sink_write(spark, root, more, brokers="3", queues="2", **host)
    with cluster.serving(dirs, *BROKER_CONF):
        for topic in ("Orders", "Audit"):
            consumed = cluster.consume(topic)
            assert content(consumed) == expected(written + more, topic)
            assert_dense(consumed)


def check_lookups(cluster: StockCluster, dirs: list[Path], ports: list[int]) -> None:
    """mqadmin's look-ups by key and by msgId against what rocketstore stored."""
    by_key: dict[str, list[record.MessageExt]] = collections.defaultdict(list)
    samples: list[record.MessageExt] = []
    for d in dirs:
        with MessageStore(d, SMALL_CONFIG, read_only=True) as store:
            for key in ("order-17", "cust-7"):
                by_key[key] += store.query_by_key("Orders", key, max_count=64)
            info = store.queue_infos("Orders")[-1]
            samples.append(store.get_messages("Orders", info.queue_id, 5, 1).messages[0])
    assert len(by_key["order-17"]) == 1 and len(by_key["cust-7"]) == 20

    for key, messages in by_key.items():
        rows = parse_query_by_key(cluster.mqadmin("queryMsgByKey", "-t", "Orders", "-k", key))
        # The tool prints a message's UNIQ_KEY as its id, with its queue and offset.
        assert sorted(rows) == sorted((m.uniq_key, m.queue_id, m.queue_offset) for m in messages)

    for m, port in zip(samples, ports, strict=True):
        # rocketstore stamped the port of the broker that serves the directory: the tool's
        # request goes there.
        assert m.store_host == f"127.0.0.1:{port}"
        shown = parse_message(cluster.mqadmin("queryMsgById", "-i", m.msg_id))
        assert shown["OffsetID"] == m.msg_id
        assert (shown["Topic"], shown["Keys"]) == ("Orders", f"[{m.properties['KEYS']}]")
        assert (int(shown["Queue ID"]), int(shown["Queue Offset"])) == (m.queue_id, m.queue_offset)
        assert shown["Store Host"] == m.store_host


# -- one directory taking turns -----------------------------------------------------------------

TURNS = "Turns"


def test_turns_between_a_stock_broker_and_rocketstore_on_one_directory(
    spark: Any,
    cluster: StockCluster,
    tmp_path: Path,
    props: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Three turns: rocketstore writes the directory (``produce``, then the Spark sink), then a
    stock broker serves it while the stock producer adds to it. While the broker runs,
    rocketstore is refused (the store, ``produce`` and the sink all name the lock), and the
    stock consumer reads every message written so far, by either side, at dense offsets.
    rocketstore stamps the directory's store host: its default before any broker served it,
    the broker's own afterwards, which makes its msgIds ones the broker's queryMsgById finds."""
    root = tmp_path / "root"
    store_dir = root / "broker-0"
    layout = {"brokers": "1", "queues": "4"}
    want: collections.Counter[tuple[str, str, str, bytes]] = collections.Counter()
    consumed: list[Consumed] = []
    for turn in range(3):
        lines = tmp_path / f"produce-{turn}.jsonl"
        lines.write_text(
            "".join(
                json.dumps(
                    {"topic": TURNS, "body": f"produce {turn} {i}", "keys": f"p{turn}-{i}"}
                    | {"tags": "P", "queueId": i % 4}
                )
                + "\n"
                for i in range(40)
            )
        )
        rc, out, err = run_cli(
            capsys, "produce", str(store_dir), "--config", str(props), str(lines)
        )
        assert rc == 0, err
        results = [json.loads(line) for line in out.splitlines()]
        assert [r["status"] for r in results] == ["PUT_OK"] * 40
        rows = [(TURNS, f"s{turn}-{i}", "S", f"sink {turn} {i}".encode()) for i in range(200)]
        sink_write(spark, root, rows, **layout)
        want += collections.Counter(
            (TURNS, f"p{turn}-{i}", "P", f"produce {turn} {i}".encode()) for i in range(40)
        )
        want += collections.Counter((t, k, g, b) for t, k, g, b in rows)
        hosts = {record.parse_msg_id(r["msgId"])[0] for r in results}
        assert hosts == {"127.0.0.1:10911" if turn == 0 else f"127.0.0.1:{BROKER_PORT}"}

        with cluster.serving([store_dir], *BROKER_CONF):
            with pytest.raises(StoreLockedError, match="store is locked by another process"):
                MessageStore(store_dir, SMALL_CONFIG)
            rc, out, err = run_cli(
                capsys, "produce", str(store_dir), "--config", str(props), str(lines)
            )
            assert (rc, out) == (cli.EXIT_ERROR, "")
            assert "store is locked by another process (a running broker" in err
            if turn == 0:
                with pytest.raises(Exception, match=r"still locked after waiting 2000 ms"):
                    sink_write(spark, root, rows, lockTimeoutMs="2000", **layout)

            cluster.produce(TURNS, 100)
            want += collections.Counter(
                (TURNS, f"k{i}", "ABC"[i % 3], f"hello {i}".encode()) for i in range(100)
            )
            consumed = cluster.consume(TURNS)
            assert content(consumed) == want
            assert_dense(consumed)
            if turn > 0:
                shown = parse_message(cluster.mqadmin("queryMsgById", "-i", results[7]["msgId"]))
                assert (shown["Topic"], shown["Keys"]) == (TURNS, f"[p{turn}-7]")
            else:
                # Before the broker's turn rocketstore's msgIds name no broker; the Dashboard's
                # fallback, the topic's UNIQ_KEY index, finds the message all the same.
                uniq = results[7]["uniqKey"]
                shown = parse_message(
                    cluster.mqadmin("queryMsgByUniqueKey", "-t", TURNS, "-i", uniq)
                )
                assert (shown["Topic"], shown["Keys"]) == (TURNS, "[p0-7]")
        assert sorted(as_consumed(store_dir, TURNS)) == sorted(consumed)

    rc, out, _ = run_cli(capsys, "verify", str(store_dir), "--config", str(props))
    assert rc == 0, out


def test_a_stock_broker_refuses_a_held_directory_before_loading_it(
    cluster: StockCluster, tmp_path: Path, props: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stock broker takes the directory's lock only after loading and recovering it, and,
    finding a writer's abort file, it would recover as after a crash: index the newest record
    again, into the IndexFile the writer has open, whose next entries then go over those. So a
    writer keeps ``commitlog/rocketstore-writer-open`` while it has the directory open, a file
    that is not a whole segment: the broker's loading refuses it (its store log names it) and
    the broker exits before it recovers anything. The directory is as the writer left it."""
    store_dir = tmp_path / "held"
    with MessageStore(store_dir, SMALL_CONFIG) as store:
        for i in range(20):
            store.put(Message("Held", f"m{i}".encode(), keys=f"key-{i}", queue_id=i % 2))
        store.flush()
        status, log = cluster.refused_broker(store_dir, BROKER_PORT, *BROKER_CONF)
        assert status != 0, log
        stop = store_dir / "commitlog" / lock.BROKER_STOP
        store_log = cluster.run_dir / "home" / "logs" / "rocketmqlogs" / "store.log"
        assert f"{stop}\t0 length not matched" in store_log.read_text(errors="replace")
        store.put(Message("Held", b"after", keys="key-after"))
    assert not stop.exists()

    rc, out, _ = run_cli(capsys, "verify", str(store_dir), "--config", str(props))
    assert rc == 0, out
    with MessageStore(store_dir, SMALL_CONFIG, read_only=True) as store:
        for key, body in (("key-19", b"m19"), ("key-after", b"after")):
            assert [m.body for m in store.query_by_key("Held", key)] == [body]


# -- a live broker's store ------------------------------------------------------------------------

LIVE = "Live"
LIVE_STEPS = 4
LIVE_STEP = 2_500
LIVE_MESSAGES = LIVE_STEPS * LIVE_STEP


def test_the_source_and_the_cli_read_a_live_brokers_store_exactly_once(
    spark: Any,
    cluster: StockCluster,
    tmp_path: Path,
    props: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A stock broker on a new directory, its topic created through the admin API; the stock
    producer sends 10,000 messages in four runs while a rocketstore streaming query reads the
    directory (1 s triggers) and the CLI's ``queues``, ``get`` and ``query-key`` look into it.
    The query reads every message exactly once, in at least four micro-batches (the test waits
    for it to catch up after each run), the same messages at the same offsets as the stock
    consumer reads; the CLI sees each queue only grow and finds the newest message it shows by
    its key. The broker runs throughout; it is stopped only after the query and the consumer."""
    store_dir = tmp_path / "live"
    batches: list[tuple[float, list[dict[str, Any]]]] = []

    def collect(df: Any, batch_id: int) -> None:
        picked = df.select("brokerName", "queueId", "queueOffset", "keys", "tags", "body")
        batches.append((time.monotonic(), [r.asDict() for r in picked.collect()]))

    def read() -> int:
        return sum(len(rows) for _, rows in batches)

    with cluster.serving([store_dir], *BROKER_CONF) as (port,):
        namesrv_port = cluster.namesrv.rpartition(":")[2]
        cluster.tool("createtopic.sh", namesrv_port, str(port), LIVE, "4")
        query = (
            spark.readStream.format("rocketstore")
            .option("path", str(store_dir))
            .option("topic", LIVE)
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="1 second")
            .start()
        )
        try:
            # Four sends of 2,500: after each of the first three the test waits for the query
            # to catch up, so that it reads the store in steps while the broker appends.
            looked = 0
            for step in range(LIVE_STEPS):
                producer = cluster.spawn("produce.sh", namesrv_port, LIVE, str(LIVE_STEP))
                looked += look_with_the_cli(producer, store_dir, props, capsys, step + 1)
                out, err = producer.communicate(timeout=WAIT_S)
                assert producer.returncode == 0, err[-3000:]
                check_sent(out, LIVE_STEP)
                deadline = time.monotonic() + WAIT_S
                while read() < LIVE_STEP * (step + 1) and time.monotonic() < deadline:
                    assert query.exception() is None
                    query.processAllAvailable()
            # Once more with everything there: a message read twice would come now.
            query.processAllAvailable()
            assert query.exception() is None
        finally:
            query.stop()
        served = cluster.consume(LIVE)

    rows = [r for _, got in batches for r in got]
    assert len(rows) == LIVE_MESSAGES, f"{len(rows)} rows read"
    read_rows = [
        Consumed(
            LIVE, r["brokerName"], r["queueId"], r["queueOffset"], k, r["tags"], bytes(r["body"])
        )
        for r in rows
        for k in [" ".join(r["keys"])]
    ]
    assert_dense(read_rows)
    # Exactly what the broker serves, message for message.
    assert sorted(read_rows) == sorted(served)
    assert content(read_rows) == collections.Counter(
        (LIVE, f"k{i}", "ABC"[i % 3], f"hello {i}".encode())
        for _ in range(LIVE_STEPS)
        for i in range(LIVE_STEP)
    )
    assert sum(1 for _, got in batches if got) >= LIVE_STEPS
    assert looked >= 2, f"the CLI found a new message only {looked} time(s) while it was sent"


def look_with_the_cli(
    producer: subprocess.Popen[str],
    store_dir: Path,
    props: Path,
    capsys: pytest.CaptureFixture[str],
    sends: int,
) -> int:
    """While ``producer`` runs (the stock producer's ``sends``-th run): each queue's bounds
    (``queues``) only grow, the newest message of the longest queue (``get``) is the stock
    producer's, and ``query-key`` finds it by its key, newest first, after its copies of the
    earlier runs. Returns how many times a message was looked up that way."""
    conf = ["--config", str(props)]
    seen: dict[int, int] = {}
    looked = 0
    while producer.poll() is None:
        if not (store_dir / "consumequeue" / LIVE).is_dir():
            # The broker has dispatched nothing yet: wait a little for the producer instead.
            with contextlib.suppress(subprocess.TimeoutExpired):
                producer.wait(timeout=0.2)
            continue
        rc, out, err = run_cli(capsys, "queues", str(store_dir), *conf, "--topic", LIVE, "--json")
        assert rc == 0, err
        bounds = {q["queueId"]: q["maxOffset"] for q in map(json.loads, out.splitlines())}
        if not any(bounds.values()):
            continue
        assert all(bounds.get(q, 0) >= n for q, n in seen.items()), (seen, bounds)
        seen = bounds
        queue_id, end = max(bounds.items(), key=lambda item: item[1])
        args = ["--topic", LIVE, "--queue", str(queue_id), "--offset", str(end - 1), "--json"]
        rc, out, err = run_cli(capsys, "get", str(store_dir), *conf, *args, "--max", "1")
        assert rc == 0, err
        (newest,) = json.loads(out)["messages"]
        # The stock producer's message i: body "hello i", key "ki".
        number = base64.b64decode(newest["body"]).removeprefix(b"hello ").decode()
        key = newest["keys"]
        assert key == f"k{number}", newest
        rc, out, err = run_cli(
            capsys, "query-key", str(store_dir), *conf, "--topic", LIVE, "--key", key, "--json"
        )
        assert rc == 0, err
        found = [json.loads(line) for line in out.splitlines()]
        # The newest message may still be the previous run's, one copy fewer.
        assert [m["body"] for m in found] in ([newest["body"]] * n for n in (sends - 1, sends))
        assert (found[0]["queueId"], found[0]["queueOffset"]) == (queue_id, end - 1)
        looked += 1
    return looked


RESUMED = "Resumed"
FILLER = "Filler"


def test_a_queue_resumed_after_retention_is_served_at_its_offsets(
    cluster: StockCluster, tmp_path: Path
) -> None:
    """A queue none of whose records the log holds any more (retention deleted them, then its
    ConsumeQueue directory was lost) is rebuilt ending where its offsets ended, with units
    that point below the log's first record. A stock broker serving the directory takes it as
    RocketMQ's own expired units: its next message gets the next offset, not 0, and the
    consumer reads it there; rocketstore reads the same."""
    store_dir = tmp_path / "broker-0"
    later = int(time.time() * 1000) + 100 * 3_600_000
    with MessageStore(store_dir, SMALL_CONFIG, background=False) as store:
        for first in range(0, 120, 40):
            store.put_batch([Message(RESUMED, b"old %d" % i) for i in range(first, first + 40)])
        for _ in range(40):
            store.put_batch([Message(FILLER, b"f" * 1000, queue_id=q % 4) for q in range(80)])
    with MessageStore(store_dir, SMALL_CONFIG, background=False, clock_ms=lambda: later) as store:
        store.clean(force_expired=True, max_files=100)
        assert store.commitlog.min_offset > 120 * 200  # every RESUMED record is gone
    for unit_file in (store_dir / "consumequeue" / RESUMED / "0").iterdir():
        unit_file.unlink()
    with MessageStore(store_dir, SMALL_CONFIG, background=False, full_check=True) as store:
        assert store.recovery.queues_resumed == {f"{RESUMED}/0": 120}  # `rocketstore recover`

    with cluster.serving([store_dir], *BROKER_CONF):
        cluster.produce(RESUMED, 10)
        consumed = cluster.consume(RESUMED)
    assert sorted(r.queue_offset for r in consumed) == list(range(120, 130))
    assert sorted(as_consumed(store_dir, RESUMED)) == sorted(consumed)


ROLLED = "Rolled"


def test_early_rolled_segments_are_served_and_kept_by_a_stock_broker(
    cluster: StockCluster, tmp_path: Path
) -> None:
    """With the tier on, rocketstore ends a segment early (an END_OF_FILE blank part-way,
    the next file created at once; rocketstore.pipeline.engine.earlyroll). A stock broker
    loads the directory, serves every message at dense offsets, appends after the last roll,
    and leaves every rolled segment byte for byte as it was: what the tier uploaded stays
    the local file."""
    store_dir = tmp_path / "broker-0"
    config = dataclasses.replace(
        SMALL_CONFIG,
        tiered_storage_level="NOT_IN_DISK",
        object_store_bucket="unused",
        tiered_store_group_commit_timeout=1000,
    )
    now = [time.time_ns() // 1_000_000 - 600_000]
    want: collections.Counter[tuple[str, str, str, bytes]] = collections.Counter()
    with MessageStore(store_dir, config, clock_ms=lambda: now[0]) as store:
        for turn in range(3):
            for i in range(20):
                body = f"rolled {turn} {i}".encode()
                store.put(Message(ROLLED, body, queue_id=i % 4, keys=[f"r{turn}-{i}"], tags="R"))
                want[(ROLLED, f"r{turn}-{i}", "R", body)] += 1
            now[0] += 2000  # the next put (or the close) ends this segment early
    segments = sorted(p for p in (store_dir / "commitlog").iterdir() if p.name.isdigit())
    assert len(segments) == 4  # three rolled, and the empty one the last roll created
    rolled = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in segments[:-1]}

    consumed = serve_and_consume(cluster, store_dir, ROLLED, 30, want)
    assert {
        name: hashlib.sha256((store_dir / "commitlog" / name).read_bytes()).hexdigest()
        for name in rolled
    } == rolled
    assert sorted(as_consumed(store_dir, ROLLED)) == sorted(consumed)
