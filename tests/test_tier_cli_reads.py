"""The reading commands across both tiers against a real radosgw (issue 41): ``queues``,
``dump``, ``get``, ``query-time``, ``query-key`` and ``lag`` of a store whose oldest segments
local retention deleted after the uploader put them in the bucket (tests/kit/tierstore.py).
What they must print is the messages as they were put; the faults (an object deleted, one
overwritten, an index damaged, behind the tier's back with the test's own boto3 client) must
fail naming the object and the offset, in a process of its own with a deadline, having printed
nothing that is not as written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline import cli
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.tier.remote import RemoteSegments
from rocketstore.pipeline.tier.upload import Uploader
from tests.kit import tierstore
from tests.kit.tierstore import SEG, TieredStore, Written


@pytest.fixture
def tiered(ceph: Any, bucket: str, tmp_path: Path) -> TieredStore:
    return tierstore.make(ceph, bucket, tmp_path)


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    rc = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def run_apart(*argv: object) -> subprocess.CompletedProcess[str]:
    """The CLI in a process of its own, which must end within a minute (never hang)."""
    command = [sys.executable, "-m", "rocketstore.pipeline.cli", *map(str, argv)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def tierstore_fields() -> list[str]:
    return list(tierstore.Written("", 0, 0, 0, 0, 0, b"", "", "", "").fields())


def same(got: list[dict[str, Any]], want: list[Written]) -> bool:
    names = tierstore_fields()
    return [{k: g[k] for k in names} for g in got] == [w.fields() for w in want]


def dump_order(t: TieredStore) -> list[Written]:
    return [w for q in t.queues() for w in t.queue(*q)]


def test_queues_start_in_the_tier_and_say_where_each_range_lives(
    tiered: TieredStore, capsys: pytest.CaptureFixture[str]
) -> None:
    t = tiered
    rc, out, err = run(capsys, "queues", t.path, "--config", t.conf, "--json")
    assert rc == 0, err
    got = lines(out)
    assert [(g["topic"], g["queueId"]) for g in got] == t.queues()
    for g in got:
        q = t.queue(g["topic"], g["queueId"])
        local = [w for w in q if not t.tier_only(w)]
        in_tier = [w for w in q if w.commit_log_offset < t.tier_bases[-1] + SEG]
        assert t.tier_only(q[0]) and local  # the setup: the queue spans both tiers
        assert g["minOffset"] == 0 and g["maxOffset"] == len(q)
        assert g["maxPhysicOffset"] == q[-1].commit_log_offset + q[-1].size
        assert (g["tierMinOffset"], g["tierMaxOffset"]) == (0, len(in_tier))
        assert (g["localMinOffset"], g["localMaxOffset"]) == (local[0].queue_offset, len(q))

    rc, out, err = run(capsys, "queues", t.path, "--config", t.conf)
    assert rc == 0, err
    head, *rows = out.splitlines()
    assert head.split()[-2:] == ["inTier", "local"]
    first = t.queue(*t.queues()[0])
    in_tier = sum(w.commit_log_offset < t.tier_bases[-1] + SEG for w in first)
    local0 = next(w.queue_offset for w in first if not t.tier_only(w))
    assert rows[0].split()[:5] == [
        "T0",
        "0",
        "0",
        str(len(first)),
        str(first[-1].commit_log_offset + first[-1].size),
    ]
    assert f"[0, {in_tier})" in rows[0] and f"[{local0}, {len(first)})" in rows[0]


def test_with_the_tier_off_nothing_changes_and_boto3_is_not_imported(
    tiered: TieredStore, tmp_path: Path
) -> None:
    t = tiered
    off = tierstore.write_conf(
        tmp_path / "off.toml",
        {"mappedFileSizeCommitLog": SEG, "maxHashSlotNum": 1000, "maxIndexNum": 20000},
    )
    probe = (
        "import sys; from rocketstore.pipeline import cli; "
        f"rc = cli.main(['queues', {str(t.path)!r}, '--config', {str(off)!r}, '--json']); "
        "sys.stderr.write(repr(('boto3' in sys.modules, rc)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stderr.endswith("(False, 0)"), done.stderr
    for g in lines(done.stdout):
        q = t.queue(g["topic"], g["queueId"])
        local = [w for w in q if not t.tier_only(w)]
        assert set(g) == {"topic", "queueId", "minOffset", "maxOffset", "maxPhysicOffset"}
        assert (g["minOffset"], g["maxOffset"]) == (local[0].queue_offset, len(q))


def test_dump_prints_every_message_of_both_tiers(
    tiered: TieredStore, capsys: pytest.CaptureFixture[str]
) -> None:
    t = tiered
    rc, out, err = run(capsys, "dump", t.path, "--config", t.conf)
    assert rc == 0, err
    want = dump_order(t)
    assert sum(map(t.tier_only, want)) > 100  # most of it is read from the bucket
    assert same(lines(out), want)
    rc, out, err = run(capsys, "dump", t.path, "--config", t.conf, "--topic", "T1")
    assert rc == 0 and same(lines(out), [w for w in want if w.topic == "T1"])


def test_dump_in_log_order_fetches_each_segment_object_once(
    tiered: TieredStore, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--order log``: every message in CommitLog order, and of the segment objects only the
    tier holds each byte fetched at most once (queue by queue, the 4 interleaved queues fetch
    most of each object once per queue)."""
    t = tiered
    fetched: dict[str, int] = {"queue": 0, "log": 0}
    order = ["queue"]
    real = RemoteSegments.fetch

    def counting(self: RemoteSegments, key: str, start: int, end: int, base: int) -> bytes:
        if "/commitlog/" in key:
            fetched[order[0]] += end - start
        return real(self, key, start, end, base)

    monkeypatch.setattr(RemoteSegments, "fetch", counting)
    rc, out, err = run(capsys, "dump", t.path, "--config", t.conf)
    assert rc == 0, err
    order[0] = "log"
    rc, out, err = run(capsys, "dump", t.path, "--config", t.conf, "--order", "log")
    assert rc == 0, err
    assert same(lines(out), sorted(t.written, key=lambda w: w.commit_log_offset))
    tier_only = [w for w in t.written if t.tier_only(w)]
    assert len(tier_only) > 100
    objects = sum(
        min(SEG, t.local_bases[0] - base) for base in t.tier_bases if base < t.local_bases[0]
    )
    assert sum(w.size for w in tier_only) <= fetched["log"] <= objects
    assert fetched["queue"] > 2 * fetched["log"]

    rc, out, err = run(
        capsys, "dump", t.path, "--config", t.conf, "--order", "log", "--topic", "T1"
    )
    assert rc == 0, err
    assert same(lines(out), [w for w in t.written if w.topic == "T1"])


def test_get_reads_offsets_only_the_tier_holds(
    tiered: TieredStore, capsys: pytest.CaptureFixture[str]
) -> None:
    t = tiered
    q = t.queue("T0", 1)
    local0 = next(w.queue_offset for w in q if not t.tier_only(w))
    argv = ("get", t.path, "--config", t.conf, "--topic", "T0", "--queue", 1, "--json")
    rc, out, err = run(capsys, *argv, "--offset", 3, "--max", 10)
    assert rc == 0, err
    got = json.loads(out)
    assert (got["status"], got["nextBeginOffset"]) == ("FOUND", 13)
    assert (got["minOffset"], got["maxOffset"]) == (0, len(q))
    assert same(got["messages"], q[3:13])

    # Up to where the local files start, then from them.
    rc, out, err = run(capsys, *argv, "--offset", local0 - 2, "--max", 10)
    got = json.loads(out)
    assert got["nextBeginOffset"] == local0 and same(got["messages"], q[local0 - 2 : local0])
    rc, out, err = run(capsys, *argv, "--offset", local0, "--max", 4)
    got = json.loads(out)
    assert same(got["messages"], q[local0 : local0 + 4]) and got["minOffset"] == 0

    # A tag filter: the units' tags codes, then the tags themselves.
    rc, out, err = run(capsys, *argv, "--offset", 0, "--max", 5, "--tags", "tag2")
    got = json.loads(out)
    assert same(got["messages"], [w for w in q if w.tags == "tag2"][:5])


def test_query_time_finds_a_time_only_the_tier_holds(
    tiered: TieredStore, capsys: pytest.CaptureFixture[str]
) -> None:
    t = tiered
    q = t.queue("T1", 0)
    at = q[7].store_timestamp
    want = next(w.queue_offset for w in q if w.store_timestamp >= at)
    assert t.tier_only(q[want])
    rc, out, err = run(
        capsys, "query-time", t.path, "--config", t.conf, "--topic", "T1", "--queue", 0,
        "--timestamp", at, "--json",
    )  # fmt: skip
    assert rc == 0, err
    assert json.loads(out)["offset"] == want


def test_query_key_finds_keys_in_both_tiers(
    tiered: TieredStore, capsys: pytest.CaptureFixture[str]
) -> None:
    t = tiered
    old = next(w for w in t.written if t.tier_only(w))
    new = t.written[-1]
    assert not t.tier_only(new)
    for w in (old, new, t.written[len(t.written) // 2]):
        rc, out, err = run(
            capsys, "query-key", t.path, "--config", t.conf, "--topic", w.topic, "--key", w.key,
            "--json",
        )  # fmt: skip
        assert rc == 0, err
        assert same(lines(out), [w])
    rc, out, err = run(
        capsys, "query-key", t.path, "--config", t.conf, "--topic", "T1", "--key", old.key, "--json"
    )
    assert rc == 0 and out == ""  # old is T0's


def test_query_offset_and_msgid_read_a_record_only_the_tier_holds(
    tiered: TieredStore, capsys: pytest.CaptureFixture[str]
) -> None:
    t = tiered
    w = next(w for w in reversed(t.written) if t.tier_only(w))
    rc, out, err = run(
        capsys, "query-offset", t.path, "--config", t.conf, w.commit_log_offset, "--json"
    )
    assert rc == 0, err
    assert same(lines(out), [w])
    rc, out, err = run(capsys, "query-msgid", t.path, "--config", t.conf, w.msg_id, "--json")
    assert rc == 0, err
    assert same(lines(out), [w])
    # Inside that record: not a record's start, which is not found (not damage).
    rc, out, err = run(capsys, "query-offset", t.path, "--config", t.conf, w.commit_log_offset + 7)
    assert rc == 3 and f"no record starts at CommitLog offset {w.commit_log_offset + 7}" in err
    # The same offset under another host (an IPv4 msgId: 8 hex digits of address first).
    other_host = ("0A0B0C0D" if w.msg_id[:8] != "0A0B0C0D" else "0D0C0B0A") + w.msg_id[8:]
    rc, out, err = run(capsys, "query-msgid", t.path, "--config", t.conf, other_host)
    assert rc == 3 and f"has id {w.msg_id}" in err


def test_lag_counts_from_the_tiers_first_offset(
    tiered: TieredStore, capsys: pytest.CaptureFixture[str]
) -> None:
    t = tiered
    (t.path / "config" / "consumerOffset.json").write_text('{"offsetTable":{"T0@billing":{"0":5}}}')
    rc, out, err = run(capsys, "lag", t.path, "--config", t.conf, "--json")
    assert rc == 0, err
    got = {(g["topic"], g["queueId"]): g for g in lines(out)}
    assert set(got) == {("T0", 0), ("T0", 1)}
    assert got[("T0", 0)]["lag"] == len(t.queue("T0", 0)) - 5
    # Not committed: counted from the queue's first offset, which is the tier's (0).
    assert got[("T0", 1)]["lag"] == len(t.queue("T0", 1))


# -- faults in the bucket -----------------------------------------------------------------------


def test_a_segment_deleted_in_the_bucket_is_named(ceph: Any, tiered: TieredStore) -> None:
    t = tiered
    base = t.tier_bases[1]
    key = t.key("commitlog", base)
    ceph.client().delete_object(Bucket=t.bucket, Key=key)
    done = run_apart("dump", t.path, "--config", t.conf)
    assert done.returncode == 2
    assert f"s3://{t.bucket}/{key} @ offset" in done.stderr and "not in the bucket" in done.stderr
    printed = lines(done.stdout)
    assert same(printed, dump_order(t)[: len(printed)])  # what came before is as written
    victim = next(w for w in t.in_segment(base) if w.topic == "T0")
    done = run_apart("query-key", t.path, "--config", t.conf, "--topic", "T0", "--key", victim.key)
    assert done.returncode == 2 and f"s3://{t.bucket}/{key} @ offset" in done.stderr


def test_a_segment_overwritten_in_the_bucket_is_named_at_the_record(
    ceph: Any, tiered: TieredStore
) -> None:
    t = tiered
    base = t.tier_bases[1]
    key = t.key("commitlog", base)
    s3 = ceph.client()
    body = bytearray(s3.get_object(Bucket=t.bucket, Key=key)["Body"].read())
    victim = t.in_segment(base)[5]
    # A byte of its body, which the body CRC covers (the format has no check of the rest).
    at = body.index(victim.body, victim.commit_log_offset - base) + 2
    assert at < victim.commit_log_offset - base + victim.size
    body[at] ^= 0xFF
    s3.put_object(Bucket=t.bucket, Key=key, Body=bytes(body))
    done = run_apart("dump", t.path, "--config", t.conf)
    assert done.returncode == 2
    assert f"s3://{t.bucket}/{key} @ offset {victim.commit_log_offset}" in done.stderr
    printed = lines(done.stdout)
    assert same(printed, dump_order(t)[: len(printed)])
    assert victim.fields() not in [{k: p[k] for k in victim.fields()} for p in printed]
    done = run_apart("dump", t.path, "--config", t.conf, "--order", "log")
    assert done.returncode == 2
    assert f"s3://{t.bucket}/{key} @ offset {victim.commit_log_offset}" in done.stderr
    printed = lines(done.stdout)
    assert same(printed, t.written[: len(printed)])
    assert len(printed) <= t.written.index(victim)
    done = run_apart(
        "query-key", t.path, "--config", t.conf, "--topic", victim.topic, "--key", victim.key
    )
    assert done.returncode == 2
    assert f"s3://{t.bucket}/{key} @ offset {victim.commit_log_offset}" in done.stderr


def test_an_index_object_corrupted_in_the_bucket_is_named(ceph: Any, tiered: TieredStore) -> None:
    t = tiered
    base = t.tier_bases[0]
    key = t.key("index", base)
    s3 = ceph.client()
    body = bytearray(s3.get_object(Bucket=t.bucket, Key=key)["Body"].read())
    body[64 + 8] ^= 0x01  # the first queue row's queue id: the head's CRC covers it
    s3.put_object(Bucket=t.bucket, Key=key, Body=bytes(body))
    for argv in (
        ("dump",),
        ("dump", "--order", "log"),
        ("query-key", "--topic", "T0", "--key", t.written[0].key),
        ("get", "--topic", "T0", "--queue", 0, "--offset", 0),
        ("queues",),
    ):
        done = run_apart(argv[0], t.path, "--config", t.conf, *argv[1:])
        assert done.returncode == 2, (argv, done.stderr)
        assert f"s3://{t.bucket}/{key} @ offset" in done.stderr, (argv, done.stderr)
        assert "CRC" in done.stderr


def test_offsets_in_neither_tier_are_a_gap_the_commands_name(
    ceph: Any, bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tier turned off while retention ran: segments after the uploaded ones were deleted
    without being uploaded. The commands read what each tier holds and name what neither does."""
    on = tierstore.write_conf(tmp_path / "on.toml", tierstore.settings(ceph, bucket))
    off_settings = {**tierstore.settings(ceph, bucket), "tieredStorageLevel": "DISABLE"}
    off = tierstore.write_conf(tmp_path / "off.toml", off_settings)
    store = tmp_path / "broker-a"
    config = StoreConfig.load(on)
    written = []
    with MessageStore(store, config) as s:
        for k in range(1200):
            if k == 400:
                s.flush()  # publishes the flushed point the uploader seals by
                assert Uploader(store, config).run_once().uploaded
            r = s.put(Message("T", f"m{k} ".encode() * 40, queue_id=0, keys=[f"key{k}"]))
            written.append((r.queue_offset, r.commit_log_offset, f"key{k}"))
    manifest = json.loads(
        ceph.client()
        .get_object(Bucket=bucket, Key=f"{tierstore.PREFIX}broker-a/manifest.json")["Body"]
        .read()
    )
    tier_end = manifest["segments"][-1]["base"] + SEG
    segments = sorted(p for p in (store / "commitlog").iterdir() if p.name.isdigit())
    for p in segments:
        os.utime(p, (1, 1))
    assert cli.main(["clean", str(store), "--config", str(off), "--max-files",
                     str(len(segments) - 2)]) == 0  # fmt: skip
    local_start = min(int(p.name) for p in (store / "commitlog").iterdir() if p.name.isdigit())
    assert local_start > tier_end  # the setup: a gap
    in_tier = [w for w in written if w[1] < tier_end]
    local = [w for w in written if w[1] >= local_start]
    capsys.readouterr()

    rc, out, err = run(capsys, "queues", store, "--config", on, "--json")
    assert rc == 0, err
    [got] = lines(out)
    assert (got["minOffset"], got["maxOffset"]) == (0, len(written))
    assert (got["tierMinOffset"], got["tierMaxOffset"]) == (0, len(in_tier))
    assert got["localMinOffset"] == local[0][0]
    assert f"T/0 offsets [{len(in_tier)}, {local[0][0]}) are in neither" in err

    rc, out, err = run(capsys, "dump", store, "--config", on)
    assert rc == 0, err
    assert [(d["queueOffset"], d["commitLogOffset"]) for d in lines(out)] == [
        w[:2] for w in in_tier + local
    ]
    assert f"[{len(in_tier)}, {local[0][0]})" in err
    rc, out, err = run(capsys, "dump", store, "--config", on, "--order", "log")
    assert rc == 0, err
    assert [(d["queueOffset"], d["commitLogOffset"]) for d in lines(out)] == [
        w[:2] for w in in_tier + local
    ]
    assert f"CommitLog offsets [{tier_end}, {local_start}) are in neither" in err

    argv = ("get", store, "--config", on, "--topic", "T", "--queue", 0, "--json")
    rc, out, err = run(capsys, *argv, "--offset", len(in_tier), "--max", 3)
    got = json.loads(out)
    assert (got["status"], got["nextBeginOffset"], got["minOffset"]) == (
        "OFFSET_TOO_SMALL", local[0][0], 0,
    )  # fmt: skip
    for w in (in_tier[3], local[-1]):
        rc, out, err = run(capsys, "query-key", store, "--config", on, "--topic", "T",
                           "--key", w[2], "--json")  # fmt: skip
        assert rc == 0 and [d["commitLogOffset"] for d in lines(out)] == [w[1]]


def test_a_bucket_that_refuses_fails_the_command_naming_the_setting(
    ceph: Any, tiered: TieredStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t = tiered
    wrong = {**tierstore.settings(ceph, t.bucket), "objectStoreSecretKey": "not-the-key"}
    conf = tierstore.write_conf(tmp_path / "wrong.toml", wrong)
    for argv in (("queues",), ("dump",), ("query-key", "--topic", "T0", "--key", "key0")):
        done = run_apart(argv[0], t.path, "--config", conf, *argv[1:])
        assert done.returncode == 2 and done.stdout == "", (argv, done.stderr)
        assert "objectStoreSecretKey" in done.stderr, (argv, done.stderr)
