"""The metrics of a store root (rocketstore.pipeline.tools.metrics, .storestats): the figures
against the root as the test wrote it and against ``rocketstore queues`` / ``lag``; bounds
after retention, without a progress file and behind a RocketMQ broker's flush; the writer's
state from a real writer process; per-queue series and their limit; and that a scrape writes
nothing."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from tests.kit import PROCS
from tests.kit.consolekit import (
    CHECKPOINT_OFFSETS,
    GROUP_OFFSETS,
    ORDERS_PER_QUEUE,
    SMALL,
    SMALL_TOML,
    make_root,
)

pytest.importorskip("prometheus_client", reason="the metrics need the 'console' extra")

from rocketstore.pipeline import cli
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine import fencing
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files.checkpoint import StoreCheckpoint
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.tools.metrics import StoreCollector, Target
from rocketstore.pipeline.tools.storestats import StoreStats
from tests.kit.files import snapshot
from tests.kit.samples import by, scrape


def cli_json(*argv: str) -> list[dict[str, object]]:
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(list(argv)) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.fixture
def root(tmp_path: Path) -> tuple[Path, Path]:
    return make_root(tmp_path)


def test_figures_are_the_root_as_written(root: tuple[Path, Path]) -> None:
    store_root, checkpoint = root
    m = scrape(StoreCollector(Target(store_root, SMALL, (("reader", checkpoint),))))
    written: dict[tuple[str, str], float] = {}
    for (broker, _), n in ORDERS_PER_QUEUE.items():
        written[(broker, "orders")] = written.get((broker, "orders"), 0) + n
    written[("broker-0", "logs")] = 3
    assert by(m["rocketmq_messages_in_total"], "broker", "topic") == written
    assert by(m["rocketstore_messages"], "broker", "topic") == written
    assert by(m["rocketstore_queue_max_offset"], "broker", "topic", "queue_id") == {
        **{(b, "orders", str(q)): n for (b, q), n in ORDERS_PER_QUEUE.items()},
        ("broker-0", "logs", "0"): 3,
    }
    # billing committed queues 0 and 1 of orders on broker-0 only: broker-1's queues count
    # from their min offset (0), as rocketstore lag counts them.
    group = {
        ("broker-0", "0"): ORDERS_PER_QUEUE[("broker-0", 0)] - GROUP_OFFSETS["orders@billing"]["0"],
        ("broker-0", "1"): ORDERS_PER_QUEUE[("broker-0", 1)] - GROUP_OFFSETS["orders@billing"]["1"],
        ("broker-1", "0"): ORDERS_PER_QUEUE[("broker-1", 0)],
        ("broker-1", "1"): ORDERS_PER_QUEUE[("broker-1", 1)],
    }
    assert by(m["rocketstore_consumer_queue_lag_messages"], "broker", "queue_id") == group
    committed = CHECKPOINT_OFFSETS["orders"]
    query = {
        (b, str(q)): ORDERS_PER_QUEUE[(b, q)] - committed[b].get(str(q), 0)
        for b, q in ORDERS_PER_QUEUE
    }
    assert by(m["rocketstore_query_queue_lag_messages"], "broker", "queue_id") == query
    assert by(m["rocketstore_query_lag_messages"], "query", "broker") == {
        ("reader", b): sum(v for (b2, _), v in query.items() if b2 == b)
        for b in ("broker-0", "broker-1")
    }
    assert m["rocketstore_query_committed_batch"] == {(("query", "reader"),): 1}
    assert by(m["rocketstore_broker_info"], "broker", "bounds") == {
        ("broker-0", "progress"): 1,
        ("broker-1", "progress"): 1,
    }


def test_lag_and_bounds_are_what_the_commands_print(root: tuple[Path, Path]) -> None:
    store_root, checkpoint = root
    conf = store_root.parent / "small.toml"
    m = scrape(StoreCollector(Target(store_root, SMALL, (("q", checkpoint),))))
    for broker in ("broker-0", "broker-1"):
        rows = cli_json("queues", str(store_root / broker), "--json", "--config", str(conf))
        assert {
            (r["topic"], str(r["queueId"])): (r["minOffset"], r["maxOffset"]) for r in rows
        } == {
            (t, q): (lo, m["rocketstore_queue_max_offset"][k])
            for k, lo in m["rocketstore_queue_min_offset"].items()
            for b, q, t in [(dict(k)["broker"], dict(k)["queue_id"], dict(k)["topic"])]
            if b == broker
        }
    rows = cli_json(
        "lag", str(store_root), "--checkpoint", str(checkpoint), "--json", "--config", str(conf)
    )
    query = {(r["brokerName"], str(r["queueId"])): r["lag"] for r in rows if "batchId" in r}
    groups = {
        (r["group"], r["brokerName"], str(r["queueId"])): r["lag"] for r in rows if "group" in r
    }
    assert by(m["rocketstore_query_queue_lag_messages"], "broker", "queue_id") == query
    assert (
        by(m["rocketstore_consumer_queue_lag_messages"], "consumer_group", "broker", "queue_id")
        == groups
    )


def test_lag_latency_is_the_age_of_the_oldest_unconsumed_message(root: tuple[Path, Path]) -> None:
    store_root, checkpoint = root
    now = int(time.time() * 1000) + 60_000
    collector = StoreCollector(
        Target(store_root, SMALL, (("q", checkpoint),)), clock_ms=lambda: now
    )
    m = scrape(collector)
    # The query's first unread message on broker-0 is offset 10 of queue 0 (queue 1 is read
    # to its end); read its store time through the store's own reader.
    with MessageStore(store_root / "broker-0", SMALL, read_only=True) as store:
        stored = store.get_messages("orders", 0, 10, 1).messages[0].store_timestamp
        group_first = min(
            store.get_messages("orders", q, o, 1).messages[0].store_timestamp
            for q, o in ((0, 12), (1, 3))
        )
    latency = by(m["rocketstore_query_lag_latency"], "broker")
    assert latency[("broker-0",)] == now - stored
    assert by(m["rocketmq_consumer_lag_latency"], "broker")[("broker-0",)] == now - group_first


def test_a_scrape_changes_no_store_file(root: tuple[Path, Path]) -> None:
    store_root, checkpoint = root
    before = snapshot(store_root.parent)
    collector = StoreCollector(Target(store_root, SMALL, (("q", checkpoint),)))
    for _ in range(3):
        scrape(collector)
    assert snapshot(store_root.parent) == before


def _fill(path: Path, config: StoreConfig, count: int) -> None:
    with MessageStore(path, config) as store:
        for start in range(0, count, 500):
            store.put_batch(
                [
                    Message("T", b"x" * 900, queue_id=i % 3, keys=[f"k{i}"])
                    for i in range(start, min(count, start + 500))
                ]
            )


def _open_bounds(path: Path, config: StoreConfig) -> dict[tuple[str, int], tuple[int, int]]:
    with MessageStore(path, config, read_only=True) as store:
        return {(i.topic, i.queue_id): (i.min_offset, i.max_offset) for i in store.queue_infos()}


def test_min_offsets_follow_retention(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _fill(store, SMALL, 4000)  # about 4 MiB: four 1 MiB CommitLog segments
    conf = tmp_path / "small.toml"
    conf.write_text(SMALL_TOML)
    stats = StoreStats(SMALL)
    before = stats.broker("store", store)
    assert {k: lo for k, (lo, _) in before.bounds.items()} == {("T", q): 0 for q in range(3)}
    segments = sorted((store / "commitlog").iterdir())
    assert len(segments) >= 4
    old = time.time() - 100 * 3600
    for seg in segments[:2]:
        os.utime(seg, (old, old))
    cli_json("clean", str(store), "--json", "--config", str(conf))
    # Retention took the first ConsumeQueue files too: the min offsets come from a listing.
    assert not (store / "consumequeue" / "T" / "0" / f"{0:020d}").exists()
    after = stats.broker("store", store)  # the cache sees the first segment change
    assert after.commitlog_min == int(sorted((store / "commitlog").iterdir())[0].name) > 0
    assert after.bounds == _open_bounds(store, SMALL)
    assert all(lo > 0 for lo, _ in after.bounds.values())
    m = scrape(StoreCollector(Target(store, SMALL)))
    assert by(m["rocketstore_commitlog_files_deleted_total"], "broker") == {("store",): 2}


def test_unit_offsets_and_record_times_are_the_stores(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _fill(store, SMALL, 4000)  # four 1 MiB segments: the records below are in three of them
    wanted = [("T", 0, 0), ("T", 0, 1), ("T", 1, 700), ("T", 2, 1300)]
    with MessageStore(store, SMALL, read_only=True) as s:
        found = [s.get_messages(t, q, o, 1).messages[0] for t, q, o in wanted]
    stats = StoreStats(SMALL)
    phys = [stats.unit_offset(store, t, q, o) for t, q, o in wanted]
    assert phys == [m.commit_log_offset for m in found]
    assert len({p // SMALL.mapped_file_size_commitlog for p in phys if p is not None}) == 3
    assert stats.unit_offset(store, "T", 0, 1334) is None  # past the queue's end
    assert stats.unit_offset(store, "nope", 0, 0) is None
    offsets = [p for p in phys if p is not None]
    # An offset inside a record, or past the CommitLog's end, has no store time.
    times = stats.record_times(store, [*offsets, offsets[0] + 1, 10 * 2**20])
    assert times == {m.commit_log_offset: m.store_timestamp for m in found}


def test_a_store_the_progress_file_does_not_describe_is_opened(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _fill(store, SMALL, 300)
    expected = _open_bounds(store, SMALL)
    described = StoreStats(SMALL).broker("store", store)
    assert (described.source, described.bounds) == ("progress", expected)
    # A RocketMQ broker flushed after the last rocketstore writer: its checkpoint is newer.
    cp = StoreCheckpoint.read(store / "checkpoint")
    cp.physic_msg_timestamp += 1000
    cp.write(store / "checkpoint", sync=False)
    behind = StoreStats(SMALL).broker("store", store)
    assert (behind.source, behind.bounds) == ("open", expected)
    (store / "config" / "rocketstore.json").unlink()  # as RocketMQ writes a store
    none = StoreStats(SMALL).broker("store", store)
    assert (none.source, none.bounds) == ("open", expected)


def test_a_cached_open_that_a_commit_has_passed_is_opened_again(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _fill(store, SMALL, 30)  # 10 messages in each of queues 0-2 of T
    (store / "config" / "rocketstore.json").unlink()  # as RocketMQ writes a store: opened
    collector = StoreCollector(Target(store, SMALL), StoreStats(SMALL, open_ttl=3600))
    first = scrape(collector)
    assert by(first["rocketstore_queue_max_offset"], "queue_id")[("0",)] == 10
    _fill(store, SMALL, 60)  # 20 more in each queue
    (store / "config" / "rocketstore.json").unlink()
    offsets = {"offsetTable": {"T@billing": {"0": 25, "1": 5}}}
    (store / "config" / "consumerOffset.json").write_text(json.dumps(offsets))
    m = scrape(collector)
    # Queue 0's commit (25) passed the cached max offset (10): the store is opened again.
    assert by(m["rocketstore_queue_max_offset"], "queue_id") == {(q,): 30 for q in "012"}
    assert by(m["rocketstore_consumer_queue_lag_messages"], "queue_id") == {
        ("0",): 5,
        ("1",): 25,
        ("2",): 30,
    }
    # A commit within the cached bounds leaves the cache as it is (open_ttl).
    _fill(store, SMALL, 3)
    (store / "config" / "rocketstore.json").unlink()
    m = scrape(collector)
    assert by(m["rocketstore_queue_max_offset"], "queue_id")[("0",)] == 30


def test_per_queue_series_are_left_out_above_the_limit(root: tuple[Path, Path]) -> None:
    store_root, checkpoint = root
    queues = len(ORDERS_PER_QUEUE) + 1
    for limit, present in ((queues, True), (queues - 1, False)):
        m = scrape(StoreCollector(Target(store_root, SMALL, (("q", checkpoint),), limit)))
        assert ("rocketstore_queue_max_offset" in m) is present
        assert ("rocketstore_query_queue_lag_messages" in m) is present
        assert m["rocketstore_per_queue_series"] == {(): 1.0 if present else 0.0}
        assert "rocketstore_query_lag_messages" in m  # per topic and broker: always


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    store = tmp_path / "live"
    proc = subprocess.Popen(
        [sys.executable, str(PROCS / "live_writer.py"), str(store)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield store, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_writer_state_from_a_real_writer(
    writer: tuple[Path, subprocess.Popen[str]],
) -> None:
    store, proc = writer
    from tests.procs.live_writer import CONFIG

    collector = StoreCollector(Target(store, CONFIG))
    live = scrape(collector)
    name = store.name
    assert live["rocketstore_writer_locked"] == {(("broker", name),): 1}
    assert live["rocketstore_abort_file"] == {(("broker", name),): 1}
    assert "rocketstore_writer_epoch" not in live  # a local disk: no epochs
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    dead = scrape(collector)
    assert dead["rocketstore_writer_locked"] == {(("broker", name),): 0}
    assert dead["rocketstore_abort_file"] == {(("broker", name),): 1}
    # Two epochs, the second taken from a writer that had not closed (a dead region).
    (store / "config" / fencing.FILE_NAME).write_bytes(
        fencing.Epoch(0, 0, 0, 1, 1).pack() + fencing.Epoch(1, 4096, 262144, 2, 2).pack()
    )
    fenced = scrape(collector)
    assert fenced["rocketstore_writer_epoch"] == {(("broker", name),): 1}
    assert fenced["rocketstore_writer_unclean_takeovers_total"] == {(("broker", name),): 1}
