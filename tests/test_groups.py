"""RocketMQ consumer groups: ``config/consumerOffset.json`` read as a broker loads it
(pipeline/engine/groups.py), their lag in ``rocketstore lag``, and the source's
``startingOffsets=group:NAME``; then all of it against the stock RocketMQ 4.9.4 servers
(../shared/rocketmq-4.9.4, tests/kit/stockrocketmq.py): a stock producer, a Java consumer group that
commits part of a topic, ``rocketstore lag`` beside ``mqadmin consumerProgress``, and a Spark
read that takes over from the group."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline import cli
from rocketstore.pipeline.engine.groups import (
    BAK_NAME,
    FILE_NAME,
    broker_offsets,
    group_offsets,
    read_consumer_offsets,
)
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import ConfigError, ConsumerOffsetsError
from rocketstore.pipeline.format.message import Message
from rocketstore.source import options
from rocketstore.source.offsets import OffsetSpec
from rocketstore.source.planning import Planner
from tests.kit.fixtures import SMALL_CONFIG
from tests.kit.sourcekit import SMALL, make_root, message_table, write
from tests.kit.stockrocketmq import (
    BROKER_PORT,
    NAMESRV_PORT,
    QueueProgress,
    StockCluster,
    build_java,
    javac_unavailable,
    parse_consumed,
    unavailable,
)


def fastjson(text: str) -> bytes:
    """A file as fastjson pretty-prints it, from a readable literal: four spaces stand for its
    tab, the literal's first newline and trailing newline are not part of the file."""
    return text.strip("\n").replace("    ", "\t").encode()


# Bytes a stock 4.9.4 broker wrote for a pull consumer that committed queues 2 and 3.
BROKER_WRITTEN = b'{\n\t"offsetTable":{\n\t\t"Orders@billing":{2:5,3:12\n\t\t}\n\t}\n}'

# Two groups, a push consumer's retry topic, and what a broker never writes but loads: quoted
# queue ids, a negative offset (no offset), a field of a newer broker.
SEVERAL = fastjson(
    """
{
    "dataVersion":{
        "counter":3,
        "timestamp":1700000000000
    },
    "offsetTable":{
        "%RETRY%billing@billing":{0:0
        },
        "Orders@billing":{0:4,1:3,2:-1
        },
        "Orders@audit":{"0":1
        },
        "Events@audit":{0:2
        }
    }
}
"""
)


def put_config(broker_dir: Path, raw: bytes, name: str = FILE_NAME) -> Path:
    path = broker_dir / "config" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)
    return path


# -- the file -------------------------------------------------------------------------------------


def test_the_file_a_stock_broker_writes(tmp_path: Path) -> None:
    put_config(tmp_path, BROKER_WRITTEN)
    found = read_consumer_offsets(tmp_path / "config")
    assert found is not None
    assert found.path == tmp_path / "config" / FILE_NAME and not found.from_bak
    assert found.table == {"billing": {"Orders": {2: 5, 3: 12}}}


def test_groups_topics_and_what_a_broker_loads_but_never_writes(tmp_path: Path) -> None:
    put_config(tmp_path, SEVERAL)
    found = read_consumer_offsets(tmp_path / "config")
    assert found is not None
    assert found.table == {
        "billing": {"%RETRY%billing": {0: 0}, "Orders": {0: 4, 1: 3}},
        "audit": {"Orders": {0: 1}, "Events": {0: 2}},
    }


@pytest.mark.parametrize(
    ("main", "bak", "expect"),
    [
        (None, None, None),
        (b"", None, None),
        (None, BROKER_WRITTEN, BAK_NAME),  # a broker's rewrite between its delete and rename
        (b" \n", BROKER_WRITTEN, BAK_NAME),
        (BROKER_WRITTEN, b"{}", FILE_NAME),
    ],
)
def test_a_missing_or_empty_file_falls_back_on_the_bak_as_a_broker_does(
    tmp_path: Path, main: bytes | None, bak: bytes | None, expect: str | None
) -> None:
    (tmp_path / "config").mkdir()
    if main is not None:
        put_config(tmp_path, main)
    if bak is not None:
        put_config(tmp_path, bak, BAK_NAME)
    found = read_consumer_offsets(tmp_path / "config")
    if expect is None:
        assert found is None
        return
    assert found is not None and found.path.name == expect
    assert found.from_bak == (expect == BAK_NAME)
    assert found.table == {"billing": {"Orders": {2: 5, 3: 12}}}


@pytest.mark.parametrize(
    ("raw", "where", "needle"),
    [
        # Cut short, as a disk that filled up leaves a file.
        (b'{\n\t"offsetTable":{\n\t\t"Orders@billing":{2:5,3:', "line 3, column 27", "end of file"),
        (b'{"offsetTable":{"Orders@billing":{0:7 1:2}}}', "line 1, column 39", "expected ',' or"),
        (b'{"offsetTable":{"Orders@billing":{0:"7"}}}', "line 1, column 37", 'a string ("7")'),
        (b'{"offsetTable":{"Orders@billing":{0:1.5}}}', "line 1, column 37", "the number 1.5"),
        (b'{"offsetTable":{"Orders@billing":{x:1}}}', "line 1, column 35", "expected a key"),
        (b'{"offsetTable":{"Orders@billing":{"q":1}}}', "line 1, column 35", 'queue id "q"'),
        (b'{"offsetTable":{"Orders@billing":{-1:1}}}', "line 1, column 35", "queue id -1"),
        (b'{"offsetTable":{\n"Ordersbilling":{0:1}}}', "line 2, column 1", "not topic@group"),
        (b'{"offsetTable":{"a@b@c":{0:1}}}', "line 1, column 17", "not topic@group"),
        (b'{"offsetTable":{"Orders@billing":[0]}}', "line 1, column 17", "an array, expected"),
        (b'{"offsetTable":[]}', "line 1, column 2", "offsetTable is an array"),
        (b'{"offsetTable":{}}}', "line 1, column 19", "text after the end"),
        (b'{"offsetTable":{"Or\tders@g":{}}}', "line 1, column 20", "control character"),
        (b'{"offsetTable":{"Orders@g', "line 1, column 26", "end of file inside a string"),
        (b"[1]", "line 1, column 1", "expected an object"),
    ],
)
def test_a_damaged_file_is_refused_with_file_line_and_column(
    tmp_path: Path, raw: bytes, where: str, needle: str
) -> None:
    path = put_config(tmp_path, raw)
    with pytest.raises(ConsumerOffsetsError) as caught:
        read_consumer_offsets(tmp_path / "config")
    message = str(caught.value)
    assert message.startswith(f"{path}: {where} ")
    assert needle in message


def test_a_damaged_file_is_refused_even_beside_a_good_bak(tmp_path: Path) -> None:
    """A broker would load the .bak here, one rewrite older: offsets from it would read
    messages again, so the damage is reported instead (and not UTF-8 is damage too)."""
    put_config(tmp_path, BROKER_WRITTEN, BAK_NAME)
    path = put_config(tmp_path, b'{"offsetTable":{"Orders@billing":{0:\xff}}}')
    with pytest.raises(ConsumerOffsetsError, match=f"^{path}: not UTF-8 at byte 36$"):
        read_consumer_offsets(tmp_path / "config")


# -- rocketstore lag --------------------------------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """broker-0: Orders queues 0-2 (5, 3, 2 messages), Events queue 0 (4); broker-1: Orders
    queue 0 (6). billing committed on broker-0 only (its retry topic too); audit on both."""
    root = tmp_path / "root"
    for broker, counts in {
        "broker-0": {("Orders", 0): 5, ("Orders", 1): 3, ("Orders", 2): 2, ("Events", 0): 4},
        "broker-1": {("Orders", 0): 6},
    }.items():
        with MessageStore(root / broker, SMALL_CONFIG) as store:
            for (topic, qid), n in counts.items():
                store.put_batch([Message(topic, f"{i}".encode(), queue_id=qid) for i in range(n)])
    put_config(root / "broker-0", SEVERAL)
    put_config(root / "broker-1", b'{"offsetTable":{"Orders@audit":{0:6}}}')
    return root


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "small.toml"
    path.write_text(
        "mappedFileSizeCommitLog = 1048576\nmappedFileSizeConsumeQueue = 6000\n"
        "maxHashSlotNum = 1000\nmaxIndexNum = 4000\n"
    )
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    rc = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def lag_rows(capsys: pytest.CaptureFixture[str], *argv: object) -> list[dict[str, Any]]:
    rc, out, err = run(capsys, "lag", *argv, "--json")
    assert rc == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_lag_of_every_group_per_queue(
    capsys: pytest.CaptureFixture[str], root: Path, config: Path
) -> None:
    rows = lag_rows(capsys, root, "--config", config)
    fields = ("group", "topic", "brokerName", "queueId", "committedOffset", "maxOffset", "lag")
    got = [tuple(r[f] for f in fields) for r in rows]
    assert got == [
        ("audit", "Events", "broker-0", 0, 2, 4, 2),
        ("audit", "Orders", "broker-0", 0, 1, 5, 4),
        # Not committed: counted from the queue's min offset, where group:NAME starts it.
        ("audit", "Orders", "broker-0", 1, None, 3, 3),
        ("audit", "Orders", "broker-0", 2, None, 2, 2),
        ("audit", "Orders", "broker-1", 0, 6, 6, 0),
        # No ConsumeQueue for the retry topic: 0 to 0, as a broker says.
        ("billing", "%RETRY%billing", "broker-0", 0, 0, 0, 0),
        ("billing", "Orders", "broker-0", 0, 4, 5, 1),
        ("billing", "Orders", "broker-0", 1, 3, 3, 0),
        # The offset -1 is no offset.
        ("billing", "Orders", "broker-0", 2, None, 2, 2),
        # billing committed nothing on broker-1: its queues are still to read.
        ("billing", "Orders", "broker-1", 0, None, 6, 6),
    ]

    rc, out, err = run(capsys, "lag", root, "--config", config)
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    header = " ".join(lines[0].split())
    assert header == "group topic brokerName queueId committedOffset maxOffset lag"
    assert lines[3].split() == ["audit", "Orders", "broker-0", "1", "3", "3"]
    assert lines[-2:] == [
        "group audit: total lag 11 message(s) in 5 queue(s)",
        "group billing: total lag 9 message(s) in 5 queue(s)",
    ]


def test_group_and_topic_options(
    capsys: pytest.CaptureFixture[str], root: Path, config: Path
) -> None:
    rows = lag_rows(capsys, root, "--config", config, "--group", "audit", "--topic", "Orders")
    assert {r["group"] for r in rows} == {"audit"} and {r["topic"] for r in rows} == {"Orders"}
    assert sum(r["lag"] for r in rows) == 9

    rc, out, err = run(capsys, "lag", root, "--config", config, "--group", "biling")
    assert (rc, out) == (cli.EXIT_NOT_FOUND, "")
    assert "consumer group 'biling' has no committed offsets" in err
    assert "groups there: audit, billing" in err
    rc, _, err = run(
        capsys, "lag", root, "--config", config, "--group", "billing", "--topic", "Events"
    )
    assert rc == cli.EXIT_NOT_FOUND
    assert "for topic Events" in err and "groups there for topic Events: audit" in err


def test_a_checkpoint_and_the_groups_side_by_side(
    capsys: pytest.CaptureFixture[str], root: Path, config: Path, tmp_path: Path
) -> None:
    ck = tmp_path / "ck"
    for part in ("offsets", "commits"):
        (ck / part).mkdir(parents=True)
    (ck / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0}\n{"Events":{"broker-0":{"0":3}}}')
    (ck / "commits" / "0").write_text("v1\n{}")
    rc, out, _ = run(
        capsys, "lag", root, "--config", config, "--checkpoint", ck, "--group", "audit"
    )
    assert rc == 0
    checkpoint, groups = out.split("\n\n")
    assert checkpoint.splitlines()[1].split() == ["Events", "broker-0", "0", "3", "4", "1"]
    assert checkpoint.splitlines()[-1] == "batch 0 committed; total lag 1 message(s) in 1 queue(s)"
    assert groups.splitlines()[-1] == "group audit: total lag 11 message(s) in 5 queue(s)"

    rows = lag_rows(capsys, root, "--config", config, "--checkpoint", ck, "--topic", "Events")
    assert [(r.get("batchId"), r.get("group"), r["lag"]) for r in rows] == [
        (0, None, 1),
        (None, "audit", 2),
    ]


def test_nothing_to_show_and_a_damaged_file(
    capsys: pytest.CaptureFixture[str], root: Path, config: Path, tmp_path: Path
) -> None:
    other = tmp_path / "plain"
    with MessageStore(other, SMALL_CONFIG) as store:
        store.put(Message("Orders", b"x"))
    rc, out, err = run(capsys, "lag", other, "--config", config)
    assert (rc, out) == (cli.EXIT_ERROR, "")
    assert "no consumer group has committed offsets there" in err and "--checkpoint" in err

    path = put_config(root / "broker-1", b'{"offsetTable":{"Orders@audit":{0:}}}')
    rc, out, err = run(capsys, "lag", root, "--config", config)
    assert (rc, out) == (cli.EXIT_ERROR, "")
    assert (
        err == f"rocketstore: error: {path}: line 1, column 35 (character 34): expected a value\n"
    )


def test_the_bak_a_broker_left_is_read_and_said(
    capsys: pytest.CaptureFixture[str], root: Path, config: Path
) -> None:
    (root / "broker-1" / "config" / FILE_NAME).rename(root / "broker-1" / "config" / BAK_NAME)
    rc, _, err = run(capsys, "lag", root, "--config", config, "--group", "audit")
    assert rc == 0
    bak = root / "broker-1" / "config" / BAK_NAME
    assert err == f"rocketstore: note: broker-1: read {bak} ({FILE_NAME} is missing or empty)\n"


def test_offsets_of_a_root_by_broker(root: Path) -> None:
    brokers = broker_offsets(root)
    assert sorted(brokers) == ["broker-0", "broker-1"]
    assert group_offsets(brokers, "audit", ["Orders"]) == {
        ("Orders", "broker-0", 0): 1,
        ("Orders", "broker-1", 0): 6,
    }
    assert group_offsets(brokers, "nobody") == {}


# -- startingOffsets=group:NAME ---------------------------------------------------------------------


def test_the_option_names_a_group(root: Path) -> None:
    parsed = options.parse(
        {"path": str(root), "topic": "Orders", "startingOffsets": " Group:billing "},
        streaming=True,
    )
    assert parsed.starting == OffsetSpec("group", group="billing")
    for bad in ("group:", "group:a b", "group:x@y"):
        with pytest.raises(ConfigError, match="is not a consumer group name"):
            options.parse(
                {"path": str(root), "topic": "Orders", "startingOffsets": bad}, streaming=True
            )
    with pytest.raises(ConfigError, match="a consumer group is not allowed here"):
        options.parse(
            {"path": str(root), "topic": "Orders", "endingOffsets": "group:billing"},
            streaming=False,
        )


def test_the_planner_starts_where_the_group_committed(root: Path) -> None:
    opts = {"path": str(root), "topic": "Orders,Events", "startingOffsets": "group:audit"}
    planner = Planner(options.parse(opts, streaming=False))
    start, end = planner.batch_range()
    assert start == {
        ("Orders", "broker-0", 0): 1,
        ("Orders", "broker-0", 1): 0,
        ("Orders", "broker-0", 2): 0,
        ("Orders", "broker-1", 0): 6,
        ("Events", "broker-0", 0): 2,
    }
    assert end[("Orders", "broker-0", 0)] == 5

    opts = {"path": str(root), "topic": "Events", "startingOffsets": "group:billing"}
    with pytest.raises(ConfigError) as caught:
        Planner(options.parse(opts, streaming=True)).initial_offsets()
    assert str(caught.value).startswith("option startingOffsets=group:billing: consumer group")
    assert "groups there for topic Events: audit" in str(caught.value)


@pytest.mark.slow
def test_a_stream_takes_over_from_the_group_and_goes_on_from_its_checkpoint(
    spark: Any, tmp_path: Path
) -> None:
    """A query started from group:billing reads exactly what the group has not; restarted from
    its checkpoint it goes on from there, even with the group's file gone."""
    root = tmp_path / "root"
    ids = make_root(root, "orders", brokers=2, queues=2, count=40)
    put_config(root / "broker-0", b'{"offsetTable":{"orders@billing":{0:7,1:10}}}')
    put_config(root / "broker-1", b'{"offsetTable":{"orders@billing":{1:3}}}')
    # Per queue, the ids of make_root's layout in offset order: broker (i // 2) % 2, queue i % 2.
    layout: dict[tuple[str, int], list[int]] = {}
    for i in ids:
        layout.setdefault((f"broker-{(i // 2) % 2}", i % 2), []).append(i)
    committed = {("broker-0", 0): 7, ("broker-0", 1): 10, ("broker-1", 1): 3}
    expected = sorted(
        i for queue, members in layout.items() for i in members[committed.get(queue, 0) :]
    )

    def run_stream() -> list[int]:
        got: list[int] = []
        query = (
            spark.readStream.format("rocketstore")
            .option("path", str(root))
            .option("topic", "orders")
            .option("startingOffsets", "group:billing")
            .load()
            .writeStream.foreachBatch(
                lambda df, _: got.extend(int(r.body.split(b":")[0][1:]) for r in df.collect())
            )
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        return sorted(got)

    assert run_stream() == expected
    for name in ("broker-0", "broker-1"):
        (root / name / "config" / FILE_NAME).unlink()
    write(root, 1, message_table("orders", [40, 41], 2), config=SMALL)
    assert run_stream() == [40, 41]


# -- the stock servers ------------------------------------------------------------------------------

JAVA = Path(__file__).resolve().parent / "java"


@pytest.mark.slow
def test_lag_equals_consumer_progress_and_spark_takes_over_from_the_group(
    request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Two stock brokers on a root's broker-0 and broker-1, topic Orders with 4 queues on each;
    the stock producer sends 200 messages; a Java consumer group (tests/java/CommitConsume.java,
    the stock pull consumer) reads part of them and commits: 7 of broker-0/0, nothing of
    broker-0/1 but an offset 0, all of broker-0/2, 13 of broker-1/1, and no commit at all for
    the other four queues. Per queue, ``rocketstore lag`` on the files the brokers left equals
    ``mqadmin consumerProgress`` on the live brokers, and so does the total; a Spark batch read
    from ``group:billing`` reads exactly the messages the group has not: together they are
    every message sent, once."""
    why = unavailable() or javac_unavailable()
    if why is not None:
        pytest.skip(why)
    spark = request.getfixturevalue("spark")  # only once it is sure to be needed (10-20 s)
    classes = build_java(JAVA / "CommitConsume.java", tmp_path / "classes")
    root = tmp_path / "root"
    sent = 200
    take = "broker-0/0=7,broker-0/1=0,broker-0/2=1000,broker-1/1=13"
    with StockCluster(tmp_path / "rmq-run") as cluster:
        ports = [BROKER_PORT + 10 * i for i in range(2)]
        brokers = [cluster.broker(root / f"broker-{i}", port) for i, port in enumerate(ports)]
        for port in ports:
            cluster.tool("createtopic.sh", str(NAMESRV_PORT), str(port), "Orders", "4")
        produced = cluster.tool("produce.sh", str(NAMESRV_PORT), "Orders", str(sent))
        assert f"SENT ok={sent} notOk=0 failed=0" in produced
        out = cluster.java(classes, "CommitConsume", cluster.namesrv, "Orders", "billing", take)
        by_java = parse_consumed(out)
        commits = {
            (f[1], int(f[2])): int(f[3])
            for f in (line.split("\t") for line in out.splitlines())
            if f[0] == "COMMIT"
        }
        progress, diff_total = cluster.consumer_progress("billing")
        for broker in brokers:
            cluster.stop(broker)  # a broker writes consumerOffset.json as it stops

    # Every message is in some queue; the group read what it committed, from offset 0 of each
    # queue it named, all of broker-0/2.
    assert sum(q.broker_offset for q in progress.values()) == sent
    everything = progress[("Orders", "broker-0", 2)].broker_offset
    assert commits == {
        ("broker-0", 0): 7,
        ("broker-0", 1): 0,
        ("broker-0", 2): everything,
        ("broker-1", 1): 13,
    }
    assert sorted((m.broker, m.queue_id, m.queue_offset) for m in by_java) == sorted(
        (broker, qid, n) for (broker, qid), end in commits.items() for n in range(end)
    )

    config = tmp_path / "stock.toml"  # the stock broker's file sizes
    config.write_text(
        "mappedFileSizeCommitLog = 1073741824\nmappedFileSizeConsumeQueue = 6000000\n"
    )
    rows = lag_rows(capsys, root, "--group", "billing", "--config", config)
    ours = {
        ("Orders", r["brokerName"], r["queueId"]): QueueProgress(
            r["maxOffset"], r["committedOffset"] or 0, r["lag"]
        )
        for r in rows
    }
    assert ours == progress
    assert sum(r["lag"] for r in rows) == diff_total
    assert {(r["brokerName"], r["queueId"]): r["committedOffset"] for r in rows} == {
        (b, q): commits.get((b, q)) for b in ("broker-0", "broker-1") for q in range(4)
    }

    df = (
        spark.read.format("rocketstore")
        .option("path", str(root))
        .option("topic", "Orders")
        .option("startingOffsets", "group:billing")
        .load()
    )
    by_spark = [
        (r.brokerName, r.queueId, r.queueOffset, bytes(r.body))
        for r in df.select("brokerName", "queueId", "queueOffset", "body").collect()
    ]
    assert sorted((b, q, o) for b, q, o, _ in by_spark) == sorted(
        (broker, qid, n)
        for (_, broker, qid), queue in progress.items()
        for n in range(queue.consumer_offset, queue.broker_offset)
    )
    bodies = sorted([m.body for m in by_java] + [body for *_, body in by_spark])
    assert bodies == sorted(f"hello {i}".encode() for i in range(sent))
