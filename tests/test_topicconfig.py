"""pipeline/files/topicconfig.py: ``config/topics.json`` in RocketMQ 4.9.4's own format, merged with
what a broker wrote, written crash-safely, shown by ``rocketstore topics``; and stock brokers
(../shared/rocketmq-4.9.4, tests/kit/stockrocketmq.py) loading and serving what it wrote."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketstore.pipeline import cli
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import TopicConfigError
from rocketstore.pipeline.files import durability
from rocketstore.pipeline.files.topicconfig import (
    TopicConfig,
    TopicsKeeper,
    ensure_topics,
    queue_counts,
    read_topics,
)
from rocketstore.pipeline.format.message import Message
from tests.kit.fixtures import SMALL_CONFIG
from tests.kit.powercut import PowerCut, PowerLost
from tests.kit.stockrocketmq import KIT, Consumed, StockCluster, parse_consumed, unavailable

CLOCK = 1_700_000_000_000


def clock() -> int:
    return CLOCK


def fastjson(text: str) -> bytes:
    """A file as fastjson pretty-prints it, from a readable literal: four spaces stand for its
    tab, the literal's first newline and trailing newline are not part of the file."""
    return text.strip("\n").replace("    ", "\t").encode()


# What a broker loads for two topics rocketstore adds to a directory that had no topics.json.
NEW_FILE = fastjson(
    """
{
    "dataVersion":{
        "counter":1,
        "timestamp":1700000000000
    },
    "topicConfigTable":{
        "TopicA":{
            "order":false,
            "perm":6,
            "readQueueNums":4,
            "topicFilterType":"SINGLE_TAG",
            "topicName":"TopicA",
            "topicSysFlag":0,
            "writeQueueNums":4
        },
        "TopicB":{
            "order":false,
            "perm":6,
            "readQueueNums":1,
            "topicFilterType":"SINGLE_TAG",
            "topicName":"TopicB",
            "topicSysFlag":0,
            "writeQueueNums":1
        }
    }
}
"""
)

# A broker's file with what a merge must keep: a system topic (perm 7), a read-only ordered
# topic with fewer write than read queues, an entry that leaves fields to their defaults (16
# queues), and fields this module does not know (a newer broker's), at both levels.
BROKER_FILE = {
    "dataVersion": {"counter": 7, "timestamp": 1_600_000_000_000},
    "topicConfigTable": {
        "broker-a": {
            "order": False,
            "perm": 7,
            "readQueueNums": 1,
            "topicFilterType": "SINGLE_TAG",
            "topicName": "broker-a",
            "topicSysFlag": 0,
            "writeQueueNums": 1,
        },
        "ReadOnly": {
            "attributes": {"+message.type": "FIFO"},
            "order": True,
            "perm": 4,
            "readQueueNums": 8,
            "topicFilterType": "MULTI_TAG",
            "topicName": "ReadOnly",
            "topicSysFlag": 1,
            "writeQueueNums": 4,
        },
        "Partial": {"topicName": "Partial"},
    },
    "futureField": [1, 2],
}


def write_json(path: Path, document: object) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = json.dumps(document, indent="\t", separators=(",", ":")).encode()
    path.write_bytes(raw)
    return raw


def listing(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


# -- format and round trip ------------------------------------------------------------------------


def test_a_new_file_is_what_a_broker_writes(tmp_path: Path) -> None:
    assert ensure_topics(tmp_path / "config", {"TopicA": 4, "TopicB": 1}, clock_ms=clock)
    assert (tmp_path / "config" / "topics.json").read_bytes() == NEW_FILE
    # Nothing was there before, so there is nothing to keep as a .bak; no temporary file stays.
    assert listing(tmp_path / "config") == ["topics.json"]


def test_round_trip(tmp_path: Path) -> None:
    ensure_topics(tmp_path, {"TopicA": 4, "TopicB": 1}, clock_ms=clock)
    found = read_topics(tmp_path)
    assert found is not None
    assert (found.path, found.counter, found.timestamp) == (tmp_path / "topics.json", 1, CLOCK)
    assert found.topics == {
        "TopicA": TopicConfig("TopicA", 4, 4, 6, "SINGLE_TAG", 0, False),
        "TopicB": TopicConfig("TopicB", 1, 1, 6, "SINGLE_TAG", 0, False),
    }
    assert found.topics["TopicA"].perm_text == "RW-"
    assert TopicConfig("X", perm=7).perm_text == "RWX"
    assert TopicConfig("X", perm=4).perm_text == "R--"
    assert read_topics(tmp_path / "elsewhere") is None


@settings(max_examples=40)
@given(
    st.lists(
        st.dictionaries(st.sampled_from(["A", "B", "C"]), st.integers(1, 12), min_size=1),
        min_size=1,
        max_size=6,
    )
)
def test_counts_only_grow_and_each_change_is_one_version(calls: list[dict[str, int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp)
        wanted: dict[str, int] = {}
        versions = 0
        for asked in calls:
            before = (config / "topics.json").read_bytes() if wanted else None
            grows = any(wanted.get(topic, 0) < n for topic, n in asked.items())
            assert ensure_topics(config, asked, clock_ms=clock) == grows
            for topic, n in asked.items():
                wanted[topic] = max(wanted.get(topic, 0), n)
            if grows:
                versions += 1
                if before is not None:
                    assert (config / "topics.json.bak").read_bytes() == before
            else:
                assert (config / "topics.json").read_bytes() == before
            found = read_topics(config)
            assert found is not None
            assert found.counter == versions
            got = {t: (c.read_queue_nums, c.write_queue_nums) for t, c in found.topics.items()}
            assert got == {t: (n, n) for t, n in wanted.items()}


def test_queue_counts_cover_the_highest_queue_id() -> None:
    assert queue_counts([("A", 0), ("A", 5), ("B", 0), ("A", 2)]) == {"A": 6, "B": 1}
    assert queue_counts([]) == {}


@pytest.mark.parametrize("count", [0, -1, True, 2.0, "3"])
def test_a_queue_count_below_one_or_not_an_integer_is_refused(tmp_path: Path, count: Any) -> None:
    with pytest.raises(ValueError, match="queue count must be an integer >= 1"):
        ensure_topics(tmp_path, {"TopicA": count})
    with pytest.raises(ValueError, match="must not be empty"):
        ensure_topics(tmp_path, {"": 1})
    assert listing(tmp_path) == []


# -- merging --------------------------------------------------------------------------------------


def test_a_merge_keeps_what_a_broker_wrote_and_only_raises_counts(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    original = write_json(path, BROKER_FILE)
    asked = {"broker-a": 1, "ReadOnly": 10, "Partial": 16, "New": 2}
    assert ensure_topics(tmp_path, asked, clock_ms=clock)

    expected: dict[str, Any] = json.loads(json.dumps(BROKER_FILE))
    expected["dataVersion"] = {"counter": 8, "timestamp": CLOCK}
    read_only = expected["topicConfigTable"]["ReadOnly"]
    read_only["readQueueNums"] = read_only["writeQueueNums"] = 10
    # Partial's absent counts are 16 to a broker: enough, so its entry stays as it was.
    expected["topicConfigTable"]["New"] = TopicConfig("New", 2, 2).to_json()
    assert json.loads(path.read_bytes()) == expected
    # The broker's topics keep their order, the new one comes last.
    assert list(json.loads(path.read_bytes())["topicConfigTable"]) == [
        "broker-a",
        "ReadOnly",
        "Partial",
        "New",
    ]
    assert (tmp_path / "topics.json.bak").read_bytes() == original

    found = read_topics(tmp_path)
    assert found is not None
    assert found.topics["ReadOnly"] == TopicConfig("ReadOnly", 10, 10, 4, "MULTI_TAG", 1, True)
    assert found.topics["Partial"] == TopicConfig("Partial", 16, 16, 6, "SINGLE_TAG", 0, False)

    # Never lowered: fewer queues asked for than the file has changes nothing.
    changed = path.read_bytes()
    assert not ensure_topics(tmp_path, {"ReadOnly": 3, "Partial": 1, "New": 1})
    assert path.read_bytes() == changed


def test_a_merge_raises_read_and_write_counts_separately(tmp_path: Path) -> None:
    write_json(tmp_path / "topics.json", BROKER_FILE)
    assert ensure_topics(tmp_path, {"ReadOnly": 6}, clock_ms=clock)
    found = read_topics(tmp_path)
    assert found is not None
    # Read stays 8 (more than asked); write rises from 4 to 6.
    ro = found.topics["ReadOnly"]
    assert (ro.read_queue_nums, ro.write_queue_nums) == (8, 6)


def test_nothing_is_written_when_nothing_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "topics.json"
    write_json(path, BROKER_FILE)
    before = os.stat(path)

    def refuse(*args: object) -> None:
        raise AssertionError("wrote although nothing changed")

    def no_clock() -> int:
        raise AssertionError("a new version although nothing changed")

    monkeypatch.setattr(durability, "write_file", refuse)
    monkeypatch.setattr(durability, "make_dirs", refuse)
    # Each at most what the file has, each way (ReadOnly: 8 read, 4 write queues).
    asked = {"broker-a": 1, "ReadOnly": 4, "Partial": 16}
    assert not ensure_topics(tmp_path, asked, clock_ms=no_clock)
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (
        before.st_ino,
        before.st_mtime_ns,
        before.st_size,
    )
    assert listing(tmp_path) == ["topics.json"]


@pytest.mark.parametrize("main", ["missing", "empty", "blank"])
def test_a_missing_or_empty_file_falls_back_on_the_bak_as_a_broker_does(
    tmp_path: Path, main: str
) -> None:
    # What a broker's own rewrite leaves when it dies between deleting topics.json and renaming
    # topics.json.tmp into place (or what a power cut leaves of a file it never synced).
    bak = write_json(tmp_path / "topics.json.bak", BROKER_FILE)
    if main != "missing":
        (tmp_path / "topics.json").write_bytes(b"" if main == "empty" else b" \n\t")
    found = read_topics(tmp_path)
    assert found is not None
    assert found.path == tmp_path / "topics.json.bak"
    assert set(found.topics) == {"broker-a", "ReadOnly", "Partial"}

    assert ensure_topics(tmp_path, {"New": 1}, clock_ms=clock)
    merged = read_topics(tmp_path)
    assert merged is not None
    assert merged.path == tmp_path / "topics.json"
    assert set(merged.topics) == {"broker-a", "ReadOnly", "Partial", "New"}
    assert merged.counter == 8
    # The .bak was the state the merge started from; an empty file is no state worth keeping.
    assert (tmp_path / "topics.json.bak").read_bytes() == bak


# -- damaged files ----------------------------------------------------------------------------------

BAD_FILES = [
    pytest.param(
        b'{\n\t"topicConfigTable":{\n\t\t"A":{"perm":6,,}\n\t}\n}',
        "not valid JSON at line 3, column 17",
        id="stray-comma",
    ),
    pytest.param(b'{"dataVersion":{"counter":1', "not valid JSON at line 1, column 28", id="cut"),
    pytest.param(b"[]", "holds a JSON array ([])", id="not-an-object"),
    pytest.param(b"null", "holds null", id="null"),
    pytest.param(
        b'{"topicConfigTable":{"A":{"readQueueNums":"4"}}}',
        'topicConfigTable.A.readQueueNums is a JSON string ("4"), expected an integer',
        id="count-as-text",
    ),
    pytest.param(
        b'{"topicConfigTable":{"A":{"perm":true}}}',
        "topicConfigTable.A.perm is a JSON boolean (true)",
        id="perm-as-bool",
    ),
    pytest.param(
        b'{"topicConfigTable":{"A":4}}',
        "topicConfigTable.A is a JSON number (4), expected an object",
        id="entry",
    ),
    pytest.param(
        b'{"topicConfigTable":[]}',
        "topicConfigTable is a JSON array ([]), expected an object",
        id="table",
    ),
    pytest.param(
        b'{"dataVersion":{"counter":1.5}}',
        "dataVersion.counter is a JSON number (1.5), expected an integer",
        id="counter",
    ),
    pytest.param(b'{"topicConfigTable":{"\xff":{}}}', "not UTF-8 at byte 22", id="not-utf8"),
]


@pytest.mark.parametrize(("raw", "message"), BAD_FILES)
def test_a_damaged_file_is_refused_with_where_and_left_alone(
    tmp_path: Path, raw: bytes, message: str
) -> None:
    path = tmp_path / "topics.json"
    path.write_bytes(raw)
    # A good .bak beside it changes nothing: a broker would quietly load it and forget what
    # the damaged file held; rocketstore asks for a person instead.
    bak = write_json(tmp_path / "topics.json.bak", BROKER_FILE)
    for call in (
        lambda: read_topics(tmp_path),
        lambda: ensure_topics(tmp_path, {"TopicA": 1}, clock_ms=clock),
    ):
        with pytest.raises(TopicConfigError) as caught:
            call()
        assert str(caught.value).startswith(f"{path}: ")
        assert message in str(caught.value)
    assert path.read_bytes() == raw
    assert (tmp_path / "topics.json.bak").read_bytes() == bak
    assert listing(tmp_path) == ["topics.json", "topics.json.bak"]


def test_a_damaged_bak_is_refused_when_it_is_what_a_broker_would_load(tmp_path: Path) -> None:
    (tmp_path / "topics.json.bak").write_bytes(b"{oops")
    with pytest.raises(TopicConfigError, match=r"topics\.json\.bak: not valid JSON at line 1"):
        ensure_topics(tmp_path, {"TopicA": 1})
    assert listing(tmp_path) == ["topics.json.bak"]


# -- crash safety ---------------------------------------------------------------------------------

OLDER = {"dataVersion": {"counter": 1, "timestamp": 1}, "topicConfigTable": {}}
OLD = {
    "dataVersion": {"counter": 2, "timestamp": 2},
    "topicConfigTable": {"TopicA": TopicConfig("TopicA", 2, 2).to_json()},
}


def seed(config: Path, before: str) -> tuple[bytes | None, bytes | None]:
    """The directory as a change finds it: ``none``, ``file`` (topics.json only) or
    ``file+bak``; returns (topics.json, topics.json.bak) as written, None for absent."""
    config.mkdir(parents=True)
    old = write_json(config / "topics.json", OLD) if "file" in before else None
    older = write_json(config / "topics.json.bak", OLDER) if "bak" in before else None
    return old, older


def state(config: Path) -> tuple[bytes | None, bytes | None]:
    main, bak = config / "topics.json", config / "topics.json.bak"
    return (
        main.read_bytes() if main.exists() else None,
        bak.read_bytes() if bak.exists() else None,
    )


@pytest.mark.parametrize("before", ["none", "file", "file+bak"])
def test_a_power_cut_at_any_barrier_leaves_the_old_or_the_new_file(
    tmp_path: Path, before: str
) -> None:
    """The power is cut at each durability barrier of a change in turn (tests/kit/powercut.py:
    what was not synced is lost); topics.json is then the old or the new file, whole, and
    the .bak holds the previous state (or the one before it, if the cut came first)."""
    change = {"TopicA": 4, "TopicB": 1}
    seed(tmp_path / "reference" / "config", before)
    ensure_topics(tmp_path / "reference" / "config", change, clock_ms=clock)
    new, _ = state(tmp_path / "reference" / "config")
    assert new is not None
    outcomes = []
    for fail_at in range(1, 20):
        run = tmp_path / str(fail_at)
        old, older = seed(run / "config", before)
        with PowerCut(run) as cut:
            cut.fail_at = fail_at
            try:
                ensure_topics(run / "config", change, clock_ms=clock)
                finished = True
            except PowerLost:
                finished = False
            cut.cut()
        main, bak = state(run / "config")
        assert main in (old, new)
        if main == new:
            assert bak == old  # the change is in place: the state before it is the .bak
        else:
            assert bak in (older, old)
        # What a broker would load is whole: one of the two states.
        loaded = read_topics(run / "config")
        versions = {2, 3} if old is not None else {None, 1}
        assert (None if loaded is None else loaded.counter) in versions
        outcomes.append(main == new)
        if finished:
            break
    else:
        pytest.fail("the change never finished")
    # Cut before its last barrier the change is lost; past it (the run that finished) it holds.
    assert outcomes[0] is False and outcomes[-1] is True
    assert len(outcomes) > 2


@pytest.mark.parametrize(
    ("step", "nth"),
    [("fsync", 1), ("replace", 1), ("fsync", 2), ("replace", 2), ("fsync_dir", 2)],
)
def test_a_failed_step_leaves_the_old_or_the_new_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, nth: int
) -> None:
    """An I/O error at a step (the first fsync or rename is the .bak's, the second the new
    file's): the error reaches the caller, topics.json is the old or the new file, the .bak
    is there, no temporary file is left, and the next call completes the change."""
    old, older = seed(tmp_path / "config", "file+bak")
    config = tmp_path / "config"
    real = getattr(durability, step)
    calls = 0

    def failing(*args: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == nth:
            raise OSError(errno.EIO, f"injected failure of {step}")
        real(*args)

    monkeypatch.setattr(durability, step, failing)
    with pytest.raises(OSError, match="injected"):
        ensure_topics(config, {"TopicA": 4}, clock_ms=clock)
    main, bak = state(config)
    if main == old:
        assert bak in (older, old)
    else:
        assert json.loads(main or b"")["topicConfigTable"]["TopicA"]["readQueueNums"] == 4
        assert bak == old
    assert listing(config) == ["topics.json", "topics.json.bak"]

    monkeypatch.setattr(durability, step, real)
    ensure_topics(config, {"TopicA": 4}, clock_ms=clock)
    found = read_topics(config)
    assert found is not None
    assert found.topics["TopicA"].read_queue_nums == 4


# -- TopicsKeeper ----------------------------------------------------------------------------------


def test_the_keeper_reads_the_file_only_for_something_new(tmp_path: Path) -> None:
    keeper = TopicsKeeper(tmp_path, clock_ms=clock)
    assert keeper.update([("A", 0), ("A", 2), ("B", 0)])
    good = (tmp_path / "topics.json").read_bytes()
    found = read_topics(tmp_path)
    assert found is not None
    assert {t: c.read_queue_nums for t, c in found.topics.items()} == {"A": 3, "B": 1}

    # Damage the file behind the keeper's back: a call with nothing new does not look at it...
    (tmp_path / "topics.json").write_bytes(b"{")
    assert not keeper.update([("A", 1), ("B", 0)])
    # ...one with a new queue does, and fails; the failure is not remembered as done.
    with pytest.raises(TopicConfigError):
        keeper.update([("A", 3)])
    (tmp_path / "topics.json").write_bytes(good)
    assert keeper.update([("A", 3)])
    found = read_topics(tmp_path)
    assert found is not None
    assert found.topics["A"].read_queue_nums == 4


# -- rocketstore topics -------------------------------------------------------------------------------


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    """A store with TopicA on queues 0-2 and TopicB on queue 0, and its geometry as a file; as
    written before rocketstore kept topics.json (the tests write their own)."""
    path = tmp_path / "broker-a"
    with MessageStore(path, SMALL_CONFIG) as store:
        for topic, qid in (("TopicA", 0), ("TopicA", 1), ("TopicA", 2), ("TopicB", 0)):
            store.put(Message(topic, b"body", queue_id=qid))
    for name in ("topics.json", "topics.json.bak"):
        (path / "config" / name).unlink(missing_ok=True)
    (tmp_path / "store.properties").write_text(
        "".join(
            f"{name}={getattr(SMALL_CONFIG, field)}\n"
            for name, field in (
                ("mappedFileSizeCommitLog", "mapped_file_size_commitlog"),
                ("mappedFileSizeConsumeQueue", "mapped_file_size_consume_queue"),
                ("maxHashSlotNum", "max_hash_slot_num"),
                ("maxIndexNum", "max_index_num"),
            )
        )
    )
    return path


def topics_cli(capsys: pytest.CaptureFixture[str], store: Path, *opts: str) -> tuple[int, str, str]:
    conf = store.parent / "store.properties"
    rc = cli.main(["topics", str(store), "--config", str(conf), *opts])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_cli_topics_without_a_topics_file(
    capsys: pytest.CaptureFixture[str], store_dir: Path
) -> None:
    rc, out, err = topics_cli(capsys, store_dir)
    assert rc == 0
    assert out.splitlines() == [
        "topic   readQueueNums  writeQueueNums  perm  order  diskQueues",
        "TopicA                                                       3",
        "TopicB                                                       1",
    ]
    assert "topics.json (or it is empty): a stock broker with autoCreateTopicEnable=false" in err


def test_cli_topics_shows_the_settings_and_what_a_broker_would_not_serve(
    capsys: pytest.CaptureFixture[str], store_dir: Path
) -> None:
    config = store_dir / "config"
    write_json(
        config / "topics.json",
        {
            "topicConfigTable": {
                "TopicA": TopicConfig("TopicA", 2, 1, perm=4).to_json(),
                "SCHEDULE_TOPIC_XXXX": TopicConfig("SCHEDULE_TOPIC_XXXX", 18, 18).to_json(),
            }
        },
    )
    rc, out, err = topics_cli(capsys, store_dir)
    assert rc == 0
    assert out.splitlines() == [
        "topic                readQueueNums  writeQueueNums  perm  order  diskQueues",
        "SCHEDULE_TOPIC_XXXX             18              18  RW-   false",
        "TopicA                           2               1  R--   false           3",
        "TopicB                                                                    1",
    ]
    assert (
        "'TopicA' has queues 0..2 on disk but readQueueNums 2: a broker serves queues 0..1" in err
    )
    assert f"'TopicB' is on disk but not in {config / 'topics.json'}" in err

    rc, out, err = topics_cli(capsys, store_dir, "--json", "--topic", "TopicB")
    assert rc == 0
    assert [json.loads(line) for line in out.splitlines()] == [
        {
            "topic": "TopicB",
            "order": None,
            "perm": None,
            "readQueueNums": None,
            "topicFilterType": None,
            "topicSysFlag": None,
            "writeQueueNums": None,
            "diskQueues": 1,
        }
    ]

    # Once rocketstore has written the file, every topic on disk is served in full.
    assert ensure_topics(config, {"TopicA": 3, "TopicB": 1})
    rc, out, err = topics_cli(capsys, store_dir, "--json")
    assert rc == 0
    assert err == ""
    rows = {row["topic"]: row for row in map(json.loads, out.splitlines())}
    assert rows["TopicA"] == {
        "topic": "TopicA",
        "order": False,
        "perm": 4,
        "readQueueNums": 3,
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": 0,
        "writeQueueNums": 3,
        "diskQueues": 3,
    }
    assert rows["SCHEDULE_TOPIC_XXXX"]["diskQueues"] is None


def test_cli_topics_reports_a_damaged_file(
    capsys: pytest.CaptureFixture[str], store_dir: Path
) -> None:
    (store_dir / "config" / "topics.json").write_text('{"topicConfigTable":{\n"A":}')
    rc, out, err = topics_cli(capsys, store_dir)
    assert (rc, out) == (cli.EXIT_ERROR, "")
    assert err.startswith(f"rocketstore: error: {store_dir / 'config' / 'topics.json'}: not valid")
    assert "line 2, column 5" in err


# -- stock brokers --------------------------------------------------------------------------------


@pytest.fixture
def stock_kit() -> Path:
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    return KIT


@dataclasses.dataclass
class Written:
    """What rocketstore stored, in the form the stock consumer prints it."""

    rows: list[Consumed] = dataclasses.field(default_factory=list)

    def put(self, store: MessageStore, topic: str, queue_id: int, n: int) -> None:
        for i in range(n):
            keys, tags = f"{topic}-{queue_id}-{i}", f"T{i % 3}"
            body = f"{store.path.name}/{topic}/{queue_id}/{i}".encode()
            result = store.put(Message(topic, body, queue_id=queue_id, keys=keys, tags=tags))
            self.rows.append(
                Consumed(topic, store.path.name, queue_id, result.queue_offset, keys, tags, body)
            )

    def of(self, topic: str) -> list[Consumed]:
        return sorted(r for r in self.rows if r.topic == topic)


def after_change(
    stock: bytes, counter: int, queues: dict[str, int], added: dict[str, int]
) -> bytes:
    """The broker's file as rocketstore must leave it: the same bytes, but for the version,
    the queue counts of ``queues``' topics and an entry per ``added`` topic at the end."""
    text = stock.decode()
    text = re.sub(r'"counter":\d+', f'"counter":{counter}', text, count=1)
    text = re.sub(r'"timestamp":\d+', f'"timestamp":{CLOCK}', text, count=1)
    for topic, n in queues.items():
        start = text.index(f'\t\t"{topic}":{{')
        end = text.index("\t\t}", start)
        block = re.sub(r'"(read|write)QueueNums":\d+', rf'"\1QueueNums":{n}', text[start:end])
        text = text[:start] + block + text[end:]
    tail = "\n\t}\n}"
    assert text.endswith(tail)
    for topic, n in added.items():
        entry = fastjson(
            f"""
        "{topic}":{{
            "order":false,
            "perm":6,
            "readQueueNums":{n},
            "topicFilterType":"SINGLE_TAG",
            "topicName":"{topic}",
            "topicSysFlag":0,
            "writeQueueNums":{n}
        }}
"""
        ).decode()
        text = text[: -len(tail)] + ",\n" + entry + tail
    return text.encode()


@pytest.mark.slow
def test_a_stock_broker_loads_the_merged_file_and_serves_both_writers_topics(
    stock_kit: Path, tmp_path: Path
) -> None:
    """rocketstore writes TopicA; a stock broker serves the directory, and an administrator
    makes TopicA read-only with 2 queues (fewer than its 3 on disk) and creates Admin. Then
    rocketstore adds TopicB and merges topics.json; the broker, started again, serves TopicA's
    3 queues and TopicB, and keeps everything as it was merged."""
    store_dir = tmp_path / "broker-a"
    written = Written()
    with MessageStore(store_dir, StoreConfig()) as store:
        for qid in range(3):
            written.put(store, "TopicA", qid, 2)

    with StockCluster(tmp_path / "rmq-run") as cluster:
        broker = cluster.broker(store_dir)
        at = ["-n", cluster.namesrv, "-b", "127.0.0.1:20911"]
        cluster.tool(
            "mqadmin.sh", "updateTopic", *at, "-t", "TopicA", "-r", "2", "-w", "2", "-p", "4"
        )
        cluster.tool(
            "mqadmin.sh", "updateTopic", *at, "-t", "Admin", "-r", "8", "-w", "4", "-p", "6"
        )
        cluster.stop(broker)

        stock = (store_dir / "config" / "topics.json").read_bytes()
        by_broker = read_topics(store_dir / "config")
        assert by_broker is not None
        assert by_broker.topics["TopicA"] == TopicConfig("TopicA", 2, 2, perm=4)
        assert by_broker.topics["Admin"] == TopicConfig("Admin", 8, 4)
        system = {"SCHEDULE_TOPIC_XXXX", "SELF_TEST_TOPIC", "broker-a", "DefaultCluster"}
        assert system <= set(by_broker.topics)

        with MessageStore(store_dir, StoreConfig()) as store:
            for qid in range(2):
                written.put(store, "TopicB", qid, 3)
            assert ensure_topics(store.path / "config", queue_counts(store.queues), clock_ms=clock)

        merged = (store_dir / "config" / "topics.json").read_bytes()
        assert merged == after_change(stock, by_broker.counter + 1, {"TopicA": 3}, {"TopicB": 2})
        assert (store_dir / "config" / "topics.json.bak").read_bytes() == stock
        served = read_topics(store_dir / "config")
        assert served is not None
        assert served.topics["TopicA"] == TopicConfig("TopicA", 3, 3, perm=4)

        broker = cluster.broker(store_dir)
        for topic in ("TopicA", "TopicB"):
            assert sorted(cluster.consume(topic)) == written.of(topic)
        cluster.stop(broker)

    after = read_topics(store_dir / "config")
    assert after is not None
    for topic in ("TopicA", "TopicB", "Admin", *system):
        assert after.topics[topic] == served.topics[topic]
    assert not ensure_topics(store_dir / "config", {"TopicA": 3, "TopicB": 2})


@pytest.mark.slow
def test_stock_brokers_serve_every_message_rocketstore_wrote(
    stock_kit: Path, tmp_path: Path
) -> None:
    """A root of two broker directories rocketstore wrote, its topics.json kept as a writer
    would keep it (a TopicsKeeper fed the store's queues after each batch), served by stock
    brokers with autoCreateTopicEnable=false: the stock consumer reads every message, with its
    keys, tags, body, queue and offset (serve-and-consume.sh)."""
    root = tmp_path / "root"
    written = Written()
    layout = {"broker-a": {"Orders": 4, "Events": 1}, "broker-b": {"Orders": 2, "Events": 3}}
    for name, topics in layout.items():
        with MessageStore(root / name, StoreConfig()) as store:
            keeper = TopicsKeeper(store.path / "config")
            for topic, queues in topics.items():
                for qid in range(queues):
                    written.put(store, topic, qid, 5 + qid)
                    keeper.update(store.queues)
        found = read_topics(root / name / "config")
        assert found is not None
        assert {t: c.read_queue_nums for t, c in found.topics.items()} == topics

    done = subprocess.run(
        [str(stock_kit / "serve-and-consume.sh"), str(root), "Orders", "Events"],
        capture_output=True,
        text=True,
        env={**os.environ, "NETNS": "1", "RMQ_RUN": str(tmp_path / "rmq-run"), "IDLE_MS": "3000"},
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    consumed = parse_consumed(done.stdout)
    assert sorted(consumed) == sorted(written.rows)
    assert len(consumed) == sum(
        5 + q for t in layout.values() for n in t.values() for q in range(n)
    )


def test_a_store_names_what_it_wrote_in_topics_json_once_flushed(tmp_path: Path) -> None:
    """The writer keeps topics.json itself: after a flush (and a close) every topic it holds is
    there with 1 + its highest queue id, beside a topic a broker had put there; a fenced or
    read-only store writes nothing (it never records progress)."""
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    ensure_topics(config_dir, {"BrokerOwn": 8})
    with MessageStore(tmp_path, SMALL_CONFIG) as store:
        store.put_batch([Message("Orders", b"x", queue_id=q) for q in (0, 5, 2)])
        store.put(Message("Audit", b"y", queue_id=0))
        store.flush()
        loaded = read_topics(config_dir)
        assert loaded is not None
        counts = {
            name: (t.read_queue_nums, t.write_queue_nums) for name, t in loaded.topics.items()
        }
        assert counts == {"BrokerOwn": (8, 8), "Orders": (6, 6), "Audit": (1, 1)}
        store.put(Message("Orders", b"z", queue_id=7))
    loaded = read_topics(config_dir)
    assert loaded is not None and loaded.topics["Orders"].read_queue_nums == 8
    before = (config_dir / "topics.json").read_bytes()
    with MessageStore(tmp_path, SMALL_CONFIG, read_only=True) as ro:
        assert ro.max_offset("Orders", 7) == 1
    assert (config_dir / "topics.json").read_bytes() == before
