"""The ``rocketstore`` command line (rocketstore.pipeline.cli), run in-process and as the console script."""

from __future__ import annotations

import base64
import errno
import json
import os
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import pytest

from rocketstore.pipeline import cli
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import InvalidMessageError
from rocketstore.pipeline.files import failpoints
from rocketstore.pipeline.format import record
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.tools.produce import READ_SIZE, InputLines, batches
from tests.kit.fixtures import fixture_dir

SCRIPT = Path(sys.executable).parent / "rocketstore"
FIXTURE_TOML = """\
mappedFileSizeCommitLog = 1048576
mappedFileSizeConsumeQueue = 6000
maxHashSlotNum = 1000
maxIndexNum = 4000
"""


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    rc = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def write_lines(path: Path, lines: Sequence[object]) -> Path:
    """One line per item: dicts as JSON, strings verbatim."""
    text = "".join((json.dumps(x) if isinstance(x, dict) else str(x)) + "\n" for x in lines)
    path.write_text(text, encoding="utf-8")
    return path


def produce(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    store: Path,
    lines: Sequence[object],
    *opts: str,
) -> tuple[int, list[dict[str, Any]], str]:
    src = write_lines(tmp_path / "input.jsonl", lines)
    rc, out, err = run(capsys, "produce", store, src, *opts)
    return rc, jsonl(out), err


def assert_one_error_line(err: str, *needles: str) -> None:
    assert err.startswith("rocketstore: error: ")
    assert err.count("\n") == 1
    assert "Traceback" not in err
    for n in needles:
        assert n in err


@pytest.fixture
def sample(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> Path:
    """A store with 10 messages of topic T in queues 0 and 1, tags TagA/TagB/TagC."""
    store = tmp_path / "store"
    lines = [
        {
            "topic": "T",
            "body": f"message {i}",
            "queueId": i % 2,
            "tags": f"Tag{'ABC'[i % 3]}",
            "keys": [f"k{i}", "every"],
        }
        for i in range(10)
    ]
    rc, results, _ = produce(capsys, tmp_path, store, lines)
    assert rc == 0 and [r["status"] for r in results] == ["PUT_OK"] * 10
    return store


# -- help -----------------------------------------------------------------------------------


def test_help_names_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--help")
    assert rc == 0
    for name in (
        "dump",
        "queues",
        "get",
        "query-key",
        "query-time",
        "query-offset",
        "query-msgid",
        "produce",
        "config",
    ):
        assert name in out
    rc, out, _ = run(capsys, "produce", "--help")
    assert rc == 0 and "PUT_OK" in out and "--linger-ms" in out


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run(capsys, "get", tmp_path, "--topic", "T")[0] == 2  # --queue, --offset missing
    assert run(capsys, "nonsense")[0] == 2
    rc, _, err = run(capsys, "produce", tmp_path / "s", "--batch-size", "0")
    assert rc == 2 and "argument --batch-size: expected a positive integer, got '0'" in err


# -- produce and dump -------------------------------------------------------------------------


def test_produce_then_dump_round_trip(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    store = tmp_path / "store"
    raw = bytes(range(256))
    lines: list[object] = [
        {"topic": "Orders", "body": "grüße, 世界 ✓", "keys": "k1 k2", "tags": "TagA"},
        {"topic": "Orders", "bodyBase64": base64.b64encode(raw).decode(), "keys": ["k3", "k4"]},
        {
            "topic": "Audit",
            "body": "",
            "queueId": 3,
            "properties": {"région": "ouest", "n": "1"},
            "flag": -7,
        },
        {"topic": "Orders", "body": "third", "properties": {"KEYS": "k5"}, "tags": None},
    ]
    rc, results, err = produce(capsys, tmp_path, store, lines)
    assert (rc, err) == (0, "")
    assert [r["line"] for r in results] == [1, 2, 3, 4]
    assert all(r["status"] == "PUT_OK" for r in results)
    assert [r["queueOffset"] for r in results] == [0, 1, 0, 2]
    offsets = [r["commitLogOffset"] for r in results]
    assert offsets == sorted(offsets) and offsets[0] == 0
    for r in results:
        assert set(r) == {
            "line",
            "status",
            "msgId",
            "commitLogOffset",
            "queueOffset",
            "storeTimestamp",
            "uniqKey",
        }

    rc, out, _ = run(capsys, "dump", store)
    assert rc == 0
    dumped = jsonl(out)
    # Topics sorted (Audit before Orders), then queue, then queue offset.
    assert [(d["topic"], d["queueId"], d["queueOffset"]) for d in dumped] == [
        ("Audit", 3, 0),
        ("Orders", 0, 0),
        ("Orders", 0, 1),
        ("Orders", 0, 2),
    ]
    audit, first, binary, third = dumped
    assert base64.b64decode(first["body"]).decode() == "grüße, 世界 ✓"
    assert (first["keys"], first["tags"]) == ("k1 k2", "TagA")
    assert base64.b64decode(binary["body"]) == raw
    assert binary["keys"] == "k3 k4" and binary["tags"] is None
    assert audit["body"] == "" and audit["flag"] == -7
    assert audit["properties"]["région"] == "ouest" and audit["properties"]["n"] == "1"
    assert third["keys"] == "k5"
    by_line = dict(zip((1, 2, 3, 4), results, strict=True))
    assert first["msgId"] == by_line[1]["msgId"]
    assert first["properties"]["UNIQ_KEY"] == by_line[1]["uniqKey"]
    assert audit["commitLogOffset"] == by_line[3]["commitLogOffset"]

    rc, out, _ = run(capsys, "dump", store, "--topic", "Audit")
    assert [d["topic"] for d in jsonl(out)] == ["Audit"]
    rc, out, err = run(capsys, "dump", store, "--topic", "Nope")
    assert (rc, out) == (0, "") and "Nope" in err


def test_produce_reads_standard_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = b'{"topic":"T","body":"a"}\n\n   \n{"topic":"T","body":"b"}\n'
    (tmp_path / "in.jsonl").write_bytes(data)
    # A real file: produce reads standard input's descriptor, not the sys.stdin object.
    with open(tmp_path / "in.jsonl") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        rc, out, _ = run(capsys, "produce", tmp_path / "s")
    assert rc == 0
    # Blank lines give no result but still count in the line numbers.
    assert [(r["line"], r["status"]) for r in jsonl(out)] == [(1, "PUT_OK"), (4, "PUT_OK")]


@pytest.mark.parametrize("batch_size", [1, 2, 1000])
def test_bad_lines_are_reported_and_the_rest_stored(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, batch_size: int
) -> None:
    conf = tmp_path / "store.toml"
    conf.write_text("maxMessageSize = 64\n")
    store = tmp_path / "store"
    lines: list[object] = [
        {"topic": "T", "body": "ok-1"},  # 1
        "{not json",  # 2
        {"topic": "bad topic!", "body": "x"},  # 3: refused by the store itself
        {"topic": "T", "body": "ok-4"},  # 4
        {"topic": "T", "body": "x" * 65},  # 5: larger than maxMessageSize (store)
        {"body": "no topic"},  # 6
        {"topic": "T", "body": "a", "bodyBase64": "YQ=="},  # 7
        {"topic": "T", "bodyBase64": "***"},  # 8
        {"topic": "T", "body": "a", "queueId": 2**31},  # 9
        {"topic": "T", "body": "a", "keys": ["k", 5]},  # 10
        {"topic": "T", "body": "a", "properties": {"p": "v\u0001w"}},  # 11
        {"topic": "T", "body": "a", "properties": {"": "v"}},  # 12
        {"topic": "T", "body": "a", "tag": "typo"},  # 13
        "[1, 2]",  # 14
        {"topic": "T", "body": "a", "keys": "x", "properties": {"KEYS": "y"}},  # 15 (store)
        {"topic": "T", "body": "ok-16", "queueId": 1},  # 16
        {"topic": "T", "body": "\ud800"},  # 17: lone surrogate
        {"topic": "T", "body": "ok-18"},  # 18
    ]
    rc, results, err = produce(
        capsys, tmp_path, store, lines, "--config", str(conf), "--batch-size", str(batch_size)
    )
    assert rc == 1 and err == ""
    assert [r["line"] for r in results] == list(range(1, 19))
    ok = {r["line"] for r in results if r["status"] == "PUT_OK"}
    assert ok == {1, 4, 16, 18}
    for r in results:
        if r["line"] not in ok:
            assert r["status"] == "MESSAGE_ILLEGAL"
            assert r["error"].startswith(f"line {r['line']}: ")
            assert "msgId" not in r
    errors = {r["line"]: r["error"] for r in results if "error" in r}
    assert (
        errors[2]
        == "line 2: not valid JSON: Expecting property name enclosed in double quotes at column 2"
    )
    assert errors[3].startswith("line 3: field 'topic' ('bad topic!') has characters outside")
    assert errors[5] == (
        "line 5: field 'body' is 65 bytes as UTF-8; at most maxMessageSize=64 are accepted"
    )
    assert errors[6] == "line 6: field 'topic' is missing"
    assert "exactly one" in errors[7]
    assert "base64" in errors[8]
    assert "queueId" in errors[9]
    assert "keys" in errors[10]
    assert "reserved" in errors[11]
    assert "empty property name" in errors[12]
    assert "'tag'" in errors[13]
    assert "object" in errors[14]
    assert "KEYS" in errors[15]
    # Stored in input order, with consecutive queue offsets.
    by_line = {r["line"]: r for r in results}
    assert [by_line[n]["queueOffset"] for n in (1, 4, 18)] == [0, 1, 2]
    assert by_line[1]["commitLogOffset"] < by_line[4]["commitLogOffset"]
    assert by_line[16]["commitLogOffset"] < by_line[18]["commitLogOffset"]
    rc, out, _ = run(capsys, "dump", store, "--config", conf)
    bodies = [base64.b64decode(d["body"]).decode() for d in jsonl(out)]
    assert bodies == ["ok-1", "ok-4", "ok-18", "ok-16"]


def test_produce_errors_speak_of_the_input_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    conf = tmp_path / "store.toml"
    conf.write_text("maxMessageSize = 8\n")
    truncated = '{"topic": "T", "body": "a"'
    lines: list[object] = [
        truncated,
        {"topic": 5, "body": "a"},
        {"topic": None, "body": "a"},
        {"topic": "T", "bodyBase64": base64.b64encode(b"123456789").decode()},
        {"topic": "T", "body": "a", "queueId": "1"},
        {"topic": "T", "body": "a", "properties": []},
        {"topic": "T", "body": "a", "keys": ["k", True]},
        {"topic": "T", "body": "a", "flag": 1.5},
    ]
    rc, results, _ = produce(capsys, tmp_path, tmp_path / "store", lines, "--config", str(conf))
    assert rc == 1
    assert [r["error"] for r in results] == [
        # The column is the line's own: where the object breaks off, not past the newline.
        f"line 1: not valid JSON: Expecting ',' delimiter at column {len(truncated) + 1}",
        "line 2: field 'topic' must be a string, got a number",
        "line 3: field 'topic' is missing",
        "line 4: field 'bodyBase64' decodes to 9 bytes; at most maxMessageSize=8 are accepted",
        "line 5: field 'queueId' must be an integer, got a string",
        "line 6: field 'properties' must be an object, got an array",
        "line 7: field 'keys' must be a string, got true",
        "line 8: field 'flag' must be an integer, got a number",
    ]


def test_bodies_may_hold_any_character(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    store = tmp_path / "store"
    text = "a\u0001b\u0002c\u0000\n"
    rc, results, _ = produce(capsys, tmp_path, store, [{"topic": "T", "body": text}])
    assert rc == 0 and results[0]["status"] == "PUT_OK"
    rc, out, _ = run(capsys, "dump", store)
    assert base64.b64decode(jsonl(out)[0]["body"]).decode() == text
    rc, out, _ = run(capsys, "query-offset", store, 0)
    assert "a\\x01b\\x02c\\x00\\n (7 bytes)" in out


def test_store_refusal_without_a_usable_position(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the store names no valid position, messages are put one by one, still in order."""
    real_put_batch = MessageStore.put_batch

    def put_batch(self: MessageStore, batch: Any) -> Any:
        try:
            return real_put_batch(self, batch)
        except InvalidMessageError as exc:
            raise InvalidMessageError(exc.reason, index=len(batch) + 5) from None

    monkeypatch.setattr(MessageStore, "put_batch", put_batch)
    lines: list[object] = [
        {"topic": "T", "body": "one"},
        {"topic": "no such!", "body": "x"},
        {"topic": "T", "body": "two"},
    ]
    rc, results, _ = produce(capsys, tmp_path, tmp_path / "store", lines)
    assert rc == 1
    assert [r["status"] for r in results] == ["PUT_OK", "MESSAGE_ILLEGAL", "PUT_OK"]
    assert [results[0]["queueOffset"], results[2]["queueOffset"]] == [0, 1]
    assert "no such!" in results[1]["error"]


def test_properties_too_long(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    store = tmp_path / "store"
    # KEYS\x01k + \x02 + UNIQ_KEY\x01<32> + \x02 + p\x01<value>: find the exact limit.
    fixed = len("KEYS\x01k\x02UNIQ_KEY\x01") + 32 + len("\x02p\x01")
    fits = "v" * (32767 - fixed)
    lines: list[object] = [
        {"topic": "T", "body": "a", "keys": "k", "properties": {"p": fits}},
        {"topic": "T", "body": "b", "keys": "k", "properties": {"p": fits + "v"}},
        {"topic": "T", "body": "c", "properties": {"p": "é" * 20000}},
    ]
    rc, results, _ = produce(capsys, tmp_path, store, lines)
    assert rc == 1
    assert [r["status"] for r in results] == [
        "PUT_OK",
        "PROPERTIES_SIZE_EXCEEDED",
        "PROPERTIES_SIZE_EXCEEDED",
    ]
    assert "32767" in results[1]["error"] and results[1]["error"].startswith("line 2: ")


def test_batches_close_at_the_batch_size(tmp_path: Path) -> None:
    (tmp_path / "in").write_bytes(b"x\n" * 5)
    with open(tmp_path / "in", "rb", buffering=0) as f:
        got = [[n for n, _ in b] for b in batches(InputLines(f.fileno()), 2, 60.0)]
    assert got == [[1, 2], [3, 4], [5]]


def test_input_lines_as_they_arrive() -> None:
    """Lines split across writes are joined, blank lines are skipped but counted, the last
    line needs no line break, and a wait with nothing to read ends at its timeout."""
    r, w = os.pipe()
    try:
        lines = InputLines(r)
        assert lines.get(0) is None  # nothing written yet, the input still open
        os.write(w, b'{"a"')
        assert lines.get(0) is None  # half a line is no line yet
        os.write(w, b"}\r\n\n  \n last")
        assert lines.get() == (1, b'{"a"}\r')
        assert lines.get(0) is None  # " last" may go on
        os.close(w)
        w = -1
        assert lines.get() == (4, b" last")
        assert lines.get() is None and lines.get(0) is None
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_input_lines_longer_than_a_read(tmp_path: Path) -> None:
    long = b"y" * (3 * READ_SIZE + 7)
    (tmp_path / "in").write_bytes(b"a\n" + long + b"\nb\n")
    with open(tmp_path / "in", "rb", buffering=0) as f:
        lines = InputLines(f.fileno())
        assert [lines.get(), lines.get(), lines.get(), lines.get()] == [
            (1, b"a"),
            (2, long),
            (3, b"b"),
            None,
        ]


def test_a_read_error_comes_after_the_lines_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch holding the lines read before the error is still yielded, then the error."""
    reads = iter([b"x\ny\n"])

    def read(fd: int, n: int) -> bytes:
        chunk = next(reads, None)
        if chunk is None:
            raise OSError(errno.EIO, "Input/output error")
        return chunk

    (tmp_path / "in").write_bytes(b"")
    with open(tmp_path / "in", "rb", buffering=0) as f:
        monkeypatch.setattr(os, "read", read)
        got = batches(InputLines(f.fileno()), 10, 60.0)
        assert next(got) == [(1, b"x"), (2, b"y")]
        with pytest.raises(OSError, match="Input/output error"):
            next(got)


def test_dump_pages_through_large_queues_and_rolled_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "# broker.conf with a small geometry\n"
        "brokerClusterName = DefaultCluster\n"
        "mappedFileSizeCommitLog=65536\n"
        "mappedFileSizeConsumeQueue: 6000\n"
        "maxHashSlotNum=100\n"
        "maxIndexNum=400\n"
    )
    store = tmp_path / "store"
    lines: list[object] = [
        {"topic": "Big", "body": f"{i:05d}" + "z" * 100, "keys": f"key-{i}"} for i in range(2500)
    ]
    rc, results, _ = produce(capsys, tmp_path, store, lines, "--config", str(conf))
    assert rc == 0 and len(results) == 2500
    assert len(list((store / "commitlog").iterdir())) > 3
    assert len(list((store / "consumequeue" / "Big" / "0").iterdir())) == 9
    assert len(list((store / "index").iterdir())) > 1

    rc, out, _ = run(capsys, "dump", store, "--config", conf)
    dumped = jsonl(out)
    assert [d["queueOffset"] for d in dumped] == list(range(2500))
    assert [base64.b64decode(d["body"])[:5] for d in dumped] == [
        f"{i:05d}".encode() for i in range(2500)
    ]
    rc, out, _ = run(
        capsys, "query-key", store, "--config", conf, "--topic", "Big", "--key", "key-7"
    )
    assert rc == 0 and "key-7" in out

    # Opened with the wrong geometry, the store is refused with one clear line.
    rc, out, err = run(capsys, "dump", store)
    assert rc == 2 and out == ""
    assert_one_error_line(err, "mappedFileSize")


def test_dump_in_log_order(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``--order log``: the messages the queues hold in CommitLog order, over rolled segments
    and interleaved queues, a transaction's prepared half (no queue holds it) left out, as
    queue order leaves it out; ``--topic`` keeps one topic; a damaged record stops it, naming
    the segment and the offset, after the messages before it."""
    conf = tmp_path / "store.toml"
    conf.write_text("mappedFileSizeCommitLog = 65536\nmaxHashSlotNum = 100\nmaxIndexNum = 400\n")
    store = tmp_path / "store"
    put = []
    with MessageStore(store, StoreConfig.load(conf)) as s:
        for k in range(900):
            flag = record.TRANSACTION_PREPARED_TYPE if k % 97 == 5 else 0
            m = Message(f"T{k % 3}", b"%05d" % k * 20, queue_id=k % 2, sys_flag=flag)
            r = s.put(m)
            if not flag:
                put.append((m.topic, m.queue_id, r.queue_offset, r.commit_log_offset))
    assert len(list((store / "commitlog").iterdir())) > 2
    rc, out, err = run(capsys, "dump", store, "--config", conf, "--order", "log")
    assert rc == 0, err
    got = [(d["topic"], d["queueId"], d["queueOffset"], d["commitLogOffset"]) for d in jsonl(out)]
    assert got == put
    rc, out, _ = run(capsys, "dump", store, "--config", conf)
    by_queue = [
        (d["topic"], d["queueId"], d["queueOffset"], d["commitLogOffset"]) for d in jsonl(out)
    ]
    assert sorted(by_queue, key=lambda d: d[3]) == put
    rc, out, _ = run(capsys, "dump", store, "--config", conf, "--order", "log", "--topic", "T1")
    assert [d["commitLogOffset"] for d in jsonl(out)] == [p[3] for p in put if p[0] == "T1"]

    victim = put[len(put) // 2]
    segment = max(p for p in (store / "commitlog").iterdir() if int(p.name) <= victim[3])
    with open(segment, "r+b") as f:  # a byte of the body, which the body CRC covers
        f.seek(victim[3] - int(segment.name) + 120)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    rc, out, err = run(capsys, "dump", store, "--config", conf, "--order", "log")
    assert rc == 2
    assert f"{segment} @ offset {victim[3]}" in err
    printed = [d["commitLogOffset"] for d in jsonl(out)]
    assert printed == [p[3] for p in put[: len(printed)]] and victim[3] not in printed


# -- reading commands ---------------------------------------------------------------------------


def test_queues_table_and_json(capsys: pytest.CaptureFixture[str], sample: Path) -> None:
    rc, out, _ = run(capsys, "queues", sample)
    assert rc == 0
    header, *rows = out.splitlines()
    assert header.split() == ["topic", "queueId", "minOffset", "maxOffset", "maxPhysicOffset"]
    assert [r.split()[:4] for r in rows] == [["T", "0", "0", "5"], ["T", "1", "0", "5"]]
    # Aligned: every row as wide as the header (numbers right-aligned under it).
    assert {len(r) for r in rows} == {len(header)}
    rc, out, _ = run(capsys, "queues", sample, "--json", "--topic", "T")
    infos = jsonl(out)
    assert [(i["topic"], i["queueId"], i["minOffset"], i["maxOffset"]) for i in infos] == [
        ("T", 0, 0, 5),
        ("T", 1, 0, 5),
    ]
    assert all(i["maxPhysicOffset"] > 0 for i in infos)
    rc, out, err = run(capsys, "queues", sample, "--topic", "Other")
    assert (rc, out) == (0, "") and "Other" in err


def test_get_with_tag_filter(capsys: pytest.CaptureFixture[str], sample: Path) -> None:
    # Queue 0 holds messages 0, 2, 4, 6, 8: tags A, C, B, A, C.
    rc, out, _ = run(capsys, "get", sample, "--topic", "T", "--queue", 0, "--offset", 0, "--json")
    (result,) = jsonl(out)
    assert result["status"] == "FOUND" and result["nextBeginOffset"] == 5
    assert [m["tags"] for m in result["messages"]] == ["TagA", "TagC", "TagB", "TagA", "TagC"]

    args = ["get", sample, "--topic", "T", "--queue", 0, "--offset", 0, "--tags", "TagA || TagB"]
    rc, out, _ = run(capsys, *args, "--json", "--max", 2)
    (result,) = jsonl(out)
    assert [m["queueOffset"] for m in result["messages"]] == [0, 2]
    assert result["nextBeginOffset"] == 3
    assert (result["minOffset"], result["maxOffset"]) == (0, 5)

    rc, out, _ = run(capsys, *args)
    assert rc == 0
    status, header, *rows = out.splitlines()
    assert "status: FOUND" in status and "nextBeginOffset: 5" in status
    assert header.split()[:4] == ["topic", "queueId", "queueOffset", "commitLogOffset"]
    assert [r.split()[2] for r in rows] == ["0", "2", "3"]
    assert "message 0" in rows[0] and "k0 every" in rows[0]

    _, out, _ = run(capsys, "get", sample, "--topic", "T", "--queue", 0, "--offset", 5)
    assert "OFFSET_OVERFLOW_ONE" in out and "nextBeginOffset: 5" in out
    _, out, _ = run(capsys, "get", sample, "--topic", "U", "--queue", 0, "--offset", 0, "--json")
    assert jsonl(out)[0]["status"] == "NO_MATCHED_LOGIC_QUEUE"


def test_query_commands(capsys: pytest.CaptureFixture[str], sample: Path) -> None:
    rc, out, _ = run(capsys, "query-key", sample, "--topic", "T", "--key", "every", "--json")
    found = jsonl(out)
    # Newest first.
    assert [base64.b64decode(m["body"]).decode() for m in found] == [
        f"message {i}" for i in range(9, -1, -1)
    ]
    rc, out, _ = run(
        capsys, "query-key", sample, "--topic", "T", "--key", "every", "--max", 3, "--json"
    )
    assert len(jsonl(out)) == 3
    rc, out, _ = run(capsys, "query-key", sample, "--topic", "T", "--key", "k3")
    header, row = out.splitlines()
    assert "msgId" in header and "message 3" in row
    rc, out, _ = run(
        capsys, "query-key", sample, "--topic", "T", "--key", "every", "--begin", 1, "--end", 2
    )
    assert (rc, out) == (0, "")

    target = found[-1]  # message 0
    rc, out, _ = run(capsys, "query-offset", sample, target["commitLogOffset"], "--json")
    assert jsonl(out) == [target]
    rc, out, _ = run(capsys, "query-offset", sample, target["commitLogOffset"])
    text = dict(line.split(None, 1) for line in out.splitlines() if len(line.split(None, 1)) == 2)
    assert text["msgId"] == target["msgId"] and text["tags"] == "TagA"
    assert text["body"] == "message 0 (9 bytes)"
    assert text["UNIQ_KEY"] == target["properties"]["UNIQ_KEY"]

    rc, out, _ = run(capsys, "query-msgid", sample, target["msgId"].lower(), "--json")
    assert jsonl(out) == [target]
    rc, out, _ = run(capsys, "query-msgid", sample, target["msgId"])
    assert target["msgId"] in out and "message 0" in out

    # One batch shares one store timestamp: any offset holding it is a right answer.
    ts = target["storeTimestamp"]
    rc, out, _ = run(
        capsys, "query-time", sample, "--topic", "T", "--queue", 0, "--timestamp", ts, "--json"
    )
    (answer,) = jsonl(out)
    assert {k: answer[k] for k in ("topic", "queueId", "timestamp")} == {
        "topic": "T",
        "queueId": 0,
        "timestamp": ts,
    }
    assert 0 <= answer["offset"] < 5
    rc, out, _ = run(
        capsys, "query-time", sample, "--topic", "T", "--queue", 1, "--timestamp", 2**62
    )
    header, row = out.splitlines()
    assert header.split() == ["topic", "queueId", "timestamp", "offset"]
    assert row.split() == ["T", "1", str(2**62), "4"]


def test_query_errors_are_one_line(capsys: pytest.CaptureFixture[str], sample: Path) -> None:
    rc, out, err = run(capsys, "query-offset", sample, 10**9)
    assert rc == 3 and out == ""
    assert_one_error_line(err, "outside the log")
    rc, _, err = run(capsys, "query-offset", sample, 3)  # inside the first record
    assert rc == 3
    assert_one_error_line(err, "no record starts at CommitLog offset 3")
    rc, _, err = run(capsys, "query-msgid", sample, "XYZ")
    assert rc == 2
    assert_one_error_line(err, "msgId")
    # A well-formed id whose offset holds no record start: not found, not "damaged".
    rc, out, _ = run(capsys, "query-offset", sample, 0, "--json")
    msg_id = jsonl(out)[0]["msgId"]
    rc, _, err = run(capsys, "query-msgid", sample, msg_id[:-1] + "3")
    assert rc == 3
    assert_one_error_line(err, "no record starts at CommitLog offset 3")
    rc, out, err = run(capsys, "query-time", sample, "--topic", "T", "--queue", 7, "--timestamp", 0)
    assert (rc, out) == (3, "")
    assert_one_error_line(err, "topic 'T' has no queue 7 (its queues: 0, 1)")


def test_reading_while_a_writer_has_the_store_open(
    capsys: pytest.CaptureFixture[str], sample: Path
) -> None:
    with MessageStore(sample) as writer:
        writer.put(Message("T", b"late", queue_id=0))
        rc, out, _ = run(capsys, "queues", sample, "--json")
        assert rc == 0
        assert [i["maxOffset"] for i in jsonl(out)] == [6, 5]
        rc, out, _ = run(capsys, "dump", sample)
        assert rc == 0 and len(jsonl(out)) == 11


# -- configuration ------------------------------------------------------------------------------


def test_config_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, _ = run(capsys, "config")
    assert rc == 0
    table = dict(line.split(None, 1) for line in out.splitlines()[1:])
    assert table["mappedFileSizeCommitLog"] == "1073741824"
    assert table["messageIndexEnable"] == "true"
    assert table["brokerIP1"] == table["listenPort"] == "(unset)"
    assert "in a new directory 127.0.0.1:10911 (a store root's broker-N: the port + 10 N)" in out
    assert "ignored" not in out

    props = tmp_path / "broker.conf"
    props.write_text("brokerId=0\nnamesrvAddr=localhost:9876\nmaxMessageSize=1024\n")
    rc, out, _ = run(capsys, "config", "--config", props)
    assert re.search(r"\nmaxMessageSize +1024\n", out)
    assert "ignored (not store settings): brokerId, namesrvAddr" in out
    rc, out, _ = run(capsys, "config", "--config", props, "--json")
    (conf,) = jsonl(out)
    assert conf["settings"]["maxMessageSize"] == 1024
    assert conf["settings"]["flushDiskType"] == "ASYNC_FLUSH"
    assert conf["ignoredKeys"] == ["brokerId", "namesrvAddr"]

    toml = tmp_path / "store.toml"
    toml.write_text('[store]\nflushDiskType = "SYNC_FLUSH"\n')
    rc, out, _ = run(capsys, "config", "--config", toml, "--json")
    assert jsonl(out)[0]["settings"]["flushDiskType"] == "SYNC_FLUSH"


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("bad.toml", "mappedFileSizeComitLog = 65536\n", "mappedFileSizeComitLog"),
        ("bad.toml", "maxIndexNum = \n", "TOML"),
        ("broker.conf", "mappedFileSizeCommitLog=tiny\n", "mappedFileSizeCommitLog"),
        ("missing.toml", None, "missing.toml"),
    ],
)
def test_config_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, text: str | None, needle: str
) -> None:
    conf = tmp_path / name
    if text is not None:
        conf.write_text(text)
    for argv in (["config"], ["queues", tmp_path], ["produce", tmp_path / "new"]):
        rc, out, err = run(capsys, *argv, "--config", conf)
        assert rc == 2 and out == ""
        assert_one_error_line(err, needle)
    assert not (tmp_path / "new").exists()


# -- store errors -------------------------------------------------------------------------------


def test_path_that_is_not_a_store(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, err = run(capsys, "queues", tmp_path / "absent")
    assert rc == 2 and out == ""
    assert_one_error_line(err, "absent")
    rc, _, err = run(capsys, "dump", tmp_path)  # a directory without commitlog/
    assert rc == 2
    assert_one_error_line(err, "not a RocketMQ store")
    other = tmp_path / "docs"
    other.mkdir()
    (other / "notes.txt").write_text("hello")
    write_lines(tmp_path / "in.jsonl", [{"topic": "T", "body": "x"}])
    rc, out, err = run(capsys, "produce", other, tmp_path / "in.jsonl")
    assert rc == 2 and out == ""
    assert_one_error_line(err, "not a RocketMQ store")
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]
    rc, _, err = run(capsys, "produce", tmp_path / "s", tmp_path / "no-such-input")
    assert rc == 2
    assert_one_error_line(err, "no-such-input")


def test_produce_into_a_locked_store(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_lines(tmp_path / "in.jsonl", [{"topic": "T", "body": "x"}])
    with MessageStore(store):
        rc, out, err = run(capsys, "produce", store, tmp_path / "in.jsonl")
    assert rc == 2 and out == ""
    assert_one_error_line(err, "already open for writing")


@pytest.mark.skipif(not SCRIPT.exists(), reason="console script not installed")
def test_console_script_fails_at_once_on_a_locked_store(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with MessageStore(store):
        # stdin stays open: the command must not wait for input before taking the lock.
        proc = subprocess.Popen(
            [SCRIPT, "produce", store],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            rc = proc.wait(timeout=60)
            assert proc.stdout is not None and proc.stderr is not None
            out, err = proc.stdout.read(), proc.stderr.read().decode()
        finally:
            stop(proc)
    assert rc == 2 and out == b""
    assert_one_error_line(err, "locked by another process")


# -- the console script, streaming ---------------------------------------------------------------


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill a console-script process if it still runs, and close its pipes."""
    proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def _readline(stream: IO[bytes], timeout: float = 60.0) -> dict[str, Any]:
    box: queue.Queue[bytes] = queue.Queue()
    threading.Thread(target=lambda: box.put(stream.readline()), daemon=True).start()
    try:
        line = box.get(timeout=timeout)
    except queue.Empty:
        pytest.fail(f"no result line within {timeout} s")
    assert line.endswith(b"\n")
    result: dict[str, Any] = json.loads(line)
    return result


@pytest.mark.skipif(not SCRIPT.exists(), reason="console script not installed")
def test_console_script_acknowledges_while_input_still_flows(tmp_path: Path) -> None:
    store = tmp_path / "store"
    proc = subprocess.Popen(
        [SCRIPT, "produce", store, "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        proc.stdin.write(b'{"topic": "Live", "body": "first", "keys": "one"}\n')
        proc.stdin.flush()
        first = _readline(proc.stdout)  # stdin is still open: the linger flushed it
        assert (first["line"], first["status"], first["queueOffset"]) == (1, "PUT_OK", 0)

        proc.stdin.write('{"topic": "Live", "body": "zweite ü"}\n{broken\n'.encode())
        proc.stdin.flush()
        second, third = _readline(proc.stdout), _readline(proc.stdout)
        assert (second["line"], second["status"], second["queueOffset"]) == (2, "PUT_OK", 1)
        assert (third["line"], third["status"]) == (3, "MESSAGE_ILLEGAL")
        assert third["error"].startswith("line 3: ")

        proc.stdin.write(b'{"topic": "Live", "body": "last"}\n')
        proc.stdin.close()
        fourth = _readline(proc.stdout)
        assert (fourth["line"], fourth["queueOffset"]) == (4, 2)
        assert proc.wait(timeout=60) == 1  # line 3 was refused
        assert proc.stdout.read() == b"" and proc.stderr.read() == b""
    finally:
        stop(proc)

    done = subprocess.run([SCRIPT, "dump", store], capture_output=True, check=True, timeout=60)
    bodies = [base64.b64decode(d["body"]).decode() for d in jsonl(done.stdout.decode())]
    assert bodies == ["first", "zweite ü", "last"]
    done = subprocess.run(
        [SCRIPT, "query-key", store, "--topic", "Live", "--key", "one", "--json"],
        capture_output=True,
        check=True,
        timeout=60,
    )
    assert jsonl(done.stdout.decode())[0]["msgId"] == first["msgId"]


@pytest.mark.skipif(not SCRIPT.exists(), reason="console script not installed")
@pytest.mark.parametrize("source", ["stdin", "fifo"])
def test_console_script_exits_when_a_put_fails_while_input_is_open(
    tmp_path: Path, source: str
) -> None:
    """The fourth put fails (an injected I/O error) while the producer keeps its end of the
    input open: the command must exit by itself with status 2 and the store's error, not
    wait for more input, hang closing a FILE that is a FIFO, or abort at exit over standard
    input; the three lines acknowledged before are in the store, the failed one is not."""
    store = tmp_path / "store"
    bodies = [f"m{n}" for n in range(5)]
    data = "".join(json.dumps({"topic": "T", "body": b}) + "\n" for b in bodies).encode()
    argv = [str(SCRIPT), "produce", str(store), "--batch-size", "1", "--linger-ms", "0"]
    env = {**os.environ, failpoints.ENV: "commitlog-write=raise@4"}
    writer = -1
    if source == "fifo":
        fifo = tmp_path / "in.fifo"
        os.mkfifo(fifo)
        # Read-write, so that this open does not wait for the command's (Linux semantics).
        writer = os.open(fifo, os.O_RDWR)
        argv.append(str(fifo))
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if source == "stdin" else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        if proc.stdin is not None:
            proc.stdin.write(data)
            proc.stdin.flush()
        else:
            os.write(writer, data)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("produce still runs 60 s after its put failed, its input open")
        out, err = proc.stdout.read().decode(), proc.stderr.read().decode()
    finally:
        stop(proc)  # only now is the pipe's write end closed
        if writer >= 0:
            os.close(writer)

    assert "Fatal Python error" not in err, err
    assert rc == 2, (rc, err)
    assert err.startswith("rocketstore: error: a put failed at line 4-4: "), err
    assert "failed part-way" in err and "injected fault at failpoint 'commitlog-write'" in err
    results = jsonl(out)
    assert [(r["line"], r["status"]) for r in results] == [
        (1, "PUT_OK"),
        (2, "PUT_OK"),
        (3, "PUT_OK"),
        (4, "NOT_STORED"),
    ]
    with MessageStore(store) as s:  # a writer's open: recovery runs first
        for r in results[:3]:
            assert s.get_message(r["commitLogOffset"]).body == bodies[r["line"] - 1].encode()
        held = [m.body for m in s.get_messages("T", 0, 0, 32).messages]
    assert held == [b"m0", b"m1", b"m2"]


# -- the RocketMQ-written fixture store ------------------------------------------------------------


@pytest.fixture
def basic(tmp_path: Path) -> tuple[Path, Path]:
    conf = tmp_path / "fixture.toml"
    conf.write_text(FIXTURE_TOML)
    return fixture_dir("basic") / "store", conf


@pytest.mark.fixtures
def test_fixture_queues(capsys: pytest.CaptureFixture[str], basic: tuple[Path, Path]) -> None:
    store, conf = basic
    rc, out, _ = run(capsys, "queues", store, "--config", conf, "--json")
    assert rc == 0
    infos = jsonl(out)
    assert [(i["topic"], i["queueId"]) for i in infos] == [
        (t, q) for t in ("TopicA", "TopicB") for q in range(4)
    ]
    assert all((i["minOffset"], i["maxOffset"]) == (0, 625) for i in infos)
    assert infos[0]["maxPhysicOffset"] == 2314362


@pytest.mark.fixtures
def test_fixture_dump_topic(capsys: pytest.CaptureFixture[str], basic: tuple[Path, Path]) -> None:
    store, conf = basic
    rc, out, _ = run(capsys, "dump", store, "--config", conf, "--topic", "TopicA")
    assert rc == 0
    dumped = jsonl(out)
    assert len(dumped) == 2500
    assert [(d["queueId"], d["queueOffset"]) for d in dumped] == [
        (q, o) for q in range(4) for o in range(625)
    ]
    first = dumped[0]  # message 0
    assert first["keys"] == "key-0 grp-0" and first["tags"] == "TagA"
    assert first["properties"]["p_utf8"] == "värde-ü-中"
    assert base64.b64decode(first["body"]) == b"body-0-"


@pytest.mark.fixtures
def test_fixture_queries(capsys: pytest.CaptureFixture[str], basic: tuple[Path, Path]) -> None:
    store, conf = basic
    rc, out, _ = run(
        capsys,
        "query-key",
        store,
        "--config",
        conf,
        "--topic",
        "TopicB",
        "--key",
        "key-1",
        "--json",
    )
    (found,) = jsonl(out)
    assert found["commitLogOffset"] == 203 and found["queueOffset"] == 0
    rc, out, _ = run(capsys, "query-msgid", store, "--config", conf, found["msgId"], "--json")
    assert jsonl(out) == [found]
    rc, out, _ = run(
        capsys,
        "get",
        store,
        "--config",
        conf,
        "--topic",
        "TopicA",
        "--queue",
        0,
        "--offset",
        0,
        "--max",
        1000,
        "--tags",
        "TagA || TagC",
        "--json",
    )
    assert rc == 0
    (result,) = jsonl(out)
    assert (result["status"], result["nextBeginOffset"]) == ("FOUND", 625)
    assert len(result["messages"]) == 417  # read.txt: FILTER TopicA 0 'TagA || TagC' matched=417
    assert {m["tags"] for m in result["messages"]} == {"TagA", "TagC"}


# -- engine defects found while building the CLI ----------------------------------------------------


@pytest.mark.parametrize(
    "bad_properties",
    [{"": "v"}, {"p": "v\u0001w"}],
    ids=["empty-property-name", "reserved-separator"],
)
def test_engine_names_the_refused_message_of_a_batch(
    tmp_path: Path, bad_properties: dict[str, str]
) -> None:
    """``InvalidMessageError.index`` must be the bad message's position in the batch.

    For property problems the store reports a position in the flattened list of all property
    names (empty name) or always 0 (reserved separator). The CLI checks these itself so it is not
    misled, but other callers that drop ``batch[exc.index]`` and retry would drop a good message.
    """
    batch = [
        Message("T", b"good", properties={"a": "1", "b": "2", "c": "3"}),
        Message("T", b"bad", properties=bad_properties),
    ]
    with MessageStore(tmp_path / "store") as store:
        with pytest.raises(InvalidMessageError) as caught:
            store.put_batch(batch)
        assert caught.value.index == 1, caught.value.reason
