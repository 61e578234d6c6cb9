"""pipeline/engine/fencing.py: every kind of taker fences a writer that lost the store's lock.

Writer A runs on shared storage and loses its lock the way ``tests/test_fencing.py``'s
``lose_lock`` drops it (as a shared file system's servers do). Another writer takes the store,
finds ``abort``, appends and closes. Whatever that taker's setting or kind (rocketstore with
``sharedStorage=local``, rocketstore with ``auto`` on a FUSE file system it does not recognise,
a stock RocketMQ broker after ``rocketstore recover``), A's next put is refused and none of the
taker's acknowledged messages is lost.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline import cli
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine import fencing
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import FencedError
from rocketstore.pipeline.files import filesystem
from rocketstore.pipeline.files import lock as lock_module
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.tools import commands
from rocketstore.pipeline.tools.verify.check import verify
from tests.kit import stockrocketmq
from tests.kit.cli import run_cli
from tests.kit.faultfuse import mounted
from tests.kit.faultfuse import unavailable as fuse_unavailable
from tests.kit.fencing import CONFIG, QUEUES, TOPIC, bodies, expected, lose_lock, put_a
from tests.kit.fixtures import SMALL_CONFIG
from tests.kit.stockrocketmq import BROKER_CONF, BROKER_PORT, GEOMETRY, StockCluster

ROOT = Path(__file__).resolve().parent.parent

# A taker in a process of its own: opens with the given sharedStorage, puts bodies "B-<i>",
# prints each acknowledged offset and closes. "auto-untold": auto where the file system's type
# cannot be read (no mountinfo, as in some containers).
TAKER = textwrap.dedent(
    f"""
    import dataclasses, pathlib, sys
    from rocketstore.pipeline.files import filesystem
    from rocketstore.pipeline.format.message import Message
    from rocketstore.pipeline.engine.store import MessageStore
    from tests.kit.fencing import CONFIG

    if sys.argv[2] == "auto-untold":
        filesystem.MOUNTINFO = pathlib.Path("/nonexistent/mountinfo")
    cfg = dataclasses.replace(CONFIG, shared_storage=sys.argv[2].split("-")[0])
    with MessageStore(sys.argv[1], cfg) as store:
        assert store.abort_file_found
        for i in range(int(sys.argv[3])):
            r = store.put(Message("{TOPIC}", f"B-{{i}}".encode(), queue_id=i % {QUEUES}))
            print(r.commit_log_offset, flush=True)
    """
)


def take_turn(path: Path, shared_storage: str, messages: int) -> list[int]:
    """A taker's turn from start to clean close; the offsets it acknowledged."""
    proc = subprocess.run(
        [sys.executable, "-c", TAKER, str(path), shared_storage, str(messages)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [int(line) for line in proc.stdout.split()]


def check_fenced_and_nothing_lost(
    store: MessageStore, path: Path, a_count: int, b_count: int, config: StoreConfig = CONFIG
) -> None:
    before = {p.name: p.read_bytes() for p in (path / "commitlog").iterdir()}
    with pytest.raises(FencedError, match="no longer owns the store"):
        store.put(Message(TOPIC, b"late", queue_id=0))
    with pytest.raises(FencedError):
        store.close()
    assert {p.name: p.read_bytes() for p in (path / "commitlog").iterdir()} == before
    assert bodies(path, config) == expected(a_count, b_count)
    with MessageStore(path, config, read_only=True) as ro:
        assert verify(ro).ok


def reproduce(path: Path, taker_setting: str) -> None:
    """The issue's sequence: A (shared) loses its lock; a taker opens with ``taker_setting``,
    finds ``abort``, acknowledges 10 messages and closes; A's next put is refused, and the
    taker's messages are all there."""
    store = MessageStore(path, CONFIG)
    put_a(store, 0, 50)
    store.flush()
    lose_lock(store)
    offsets = take_turn(path, taker_setting, 10)
    assert len(offsets) == 10
    check_fenced_and_nothing_lost(store, path, 50, 10)
    # The taker recorded its epoch, whatever its setting resolved to, and fenced off A's end.
    epochs = fencing.read_epochs(path)
    assert [e.epoch for e in epochs] == [0, 1]
    assert epochs[1].start > epochs[1].fenced_end and min(offsets) == epochs[1].start


@pytest.mark.parametrize("setting", ["local", "auto-untold"])
def test_a_taker_that_resolves_to_local_storage_fences_a_shared_writer(
    tmp_path: Path, setting: str
) -> None:
    reproduce(tmp_path, setting)


def test_a_local_writer_on_a_store_that_has_epochs_is_fenced_too(tmp_path: Path) -> None:
    """Once a store has an epochs file, a writer whose setting says ``local`` checks its fence
    as well: it may be on the shared volume the file's first writer was on."""
    MessageStore(tmp_path, CONFIG).close()  # a writer on shared storage made the file
    store = MessageStore(tmp_path, dataclasses.replace(CONFIG, shared_storage="local"))
    put_a(store, 0, 50)
    store.flush()
    lose_lock(store)
    take_turn(tmp_path, "local", 10)
    check_fenced_and_nothing_lost(store, tmp_path, 50, 10)
    assert [e.epoch for e in fencing.read_epochs(tmp_path)] == [0, 1, 2]


def test_auto_on_an_unrecognised_fuse_file_system_fences_a_shared_writer(tmp_path: Path) -> None:
    """The same on a real FUSE mount of a type ``auto`` does not know (plain ``fuse``)."""
    why = fuse_unavailable()
    if why is not None:
        pytest.skip(why)
    with mounted(tmp_path / "fuse") as fs:
        assert filesystem.fs_type(fs.mount) == "fuse"
        reproduce(fs.mount / "store", "auto")


# -- a stock RocketMQ broker taking its turn ----------------------------------------------------

cluster = stockrocketmq.cluster  # the stock name server, as test_stock_rocketmq.py has it
SHARED_SMALL = dataclasses.replace(SMALL_CONFIG, shared_storage="shared")
TURN_TOPIC = "BrokerTurn"
# A's 20 messages and the 30 the stock producer sends (produce.sh: bodies "hello I").
BOTH_SIDES = sorted(
    [f"A-{i}".encode() for i in range(20)] + [f"hello {i}".encode() for i in range(30)]
)


def shared_writer_that_lost_its_lock(store_dir: Path) -> MessageStore:
    """Writer A: 20 messages of :data:`TURN_TOPIC` acknowledged and flushed (which names the
    topic in ``config/topics.json`` for the broker), then its lock lost. No background rounds:
    a retention round while the broker holds the lock would fence A for that first, and the
    tests want to see what A's own next put finds."""
    store = MessageStore(store_dir, SHARED_SMALL, background=False)
    for i in range(20):
        store.put(Message(TURN_TOPIC, f"A-{i}".encode(), keys=[f"a{i}"], queue_id=i % 2))
    store.flush()
    lose_lock(store)
    return store


def broker_bodies(store_dir: Path) -> list[bytes]:
    """Every body of :data:`TURN_TOPIC`, sorted, read as on the broker's host (the published
    point a shared reader stops at is rocketstore's, and the broker wrote after it)."""
    with MessageStore(store_dir, SMALL_CONFIG, read_only=True) as ro:
        assert verify(ro).ok
        out: list[bytes] = []
        for info in ro.queue_infos(TURN_TOPIC):
            got = ro.get_messages(TURN_TOPIC, info.queue_id, info.min_offset, 1000)
            out += [m.body for m in got.messages]
        return sorted(out)


@pytest.mark.slow
@pytest.mark.xdist_group("stock-rocketmq")
def test_a_stock_broker_takes_a_turn_only_after_recover_and_the_writer_is_fenced(
    cluster: StockCluster, tmp_path: Path
) -> None:
    """A stock broker records no epoch. While writer A's store is open (its lock lost or not)
    or after its unclean end, a broker refuses to load the directory; ``rocketstore recover``
    recovers it, records an epoch and closes it cleanly; then the broker takes its turn
    (stock producer, clean stop), and A's next put is refused: none of the broker's
    acknowledged messages is lost."""
    store_dir = tmp_path / "turns"
    store = shared_writer_that_lost_its_lock(store_dir)
    files = {p: p.read_bytes() for p in (store_dir / "commitlog").iterdir()}
    status, log = cluster.refused_broker(store_dir, BROKER_PORT, *BROKER_CONF)
    assert status != 0, log
    # It stopped at loading, as its store log says, and changed none of A's records.
    stop = store_dir / "commitlog" / lock_module.BROKER_STOP
    store_log = cluster.run_dir / "home" / "logs" / "rocketmqlogs" / "store.log"
    assert f"{stop}\t0 length not matched" in store_log.read_text(errors="replace")
    assert {p: p.read_bytes() for p in (store_dir / "commitlog").iterdir()} == files
    assert (store_dir / "abort").exists()
    conf = tmp_path / "store.properties"
    conf.write_text("".join(f"{k}={v}\n" for k, v in GEOMETRY.items()) + "sharedStorage=shared\n")
    recovered = run_cli("recover", str(store_dir), "--config", str(conf))
    assert recovered.returncode == 0, recovered.stderr
    with cluster.serving([store_dir], *BROKER_CONF):
        cluster.produce(TURN_TOPIC, 30)
    check_fenced(store, store_dir)
    assert broker_bodies(store_dir) == BOTH_SIDES


@pytest.mark.slow
@pytest.mark.xdist_group("stock-rocketmq")
def test_a_broker_let_in_by_hand_is_seen_by_the_abort_it_removed(
    cluster: StockCluster, tmp_path: Path
) -> None:
    """The one way round the broker's refusal: removing ``commitlog/rocketstore-writer-open``
    by hand. Then no epoch follows A's, but the broker's clean stop removes the ``abort`` A
    made, and A's next put is refused for that."""
    store_dir = tmp_path / "by-hand"
    store = shared_writer_that_lost_its_lock(store_dir)
    (store_dir / "commitlog" / lock_module.BROKER_STOP).unlink()
    with cluster.serving([store_dir], *BROKER_CONF):
        cluster.produce(TURN_TOPIC, 30)
    assert [e.epoch for e in fencing.read_epochs(store_dir)] == [0]
    with pytest.raises(FencedError, match="abort was removed or replaced"):
        store.put(Message(TURN_TOPIC, b"late", queue_id=0))
    check_fenced(store, store_dir)
    assert broker_bodies(store_dir) == BOTH_SIDES


def check_fenced(store: MessageStore, store_dir: Path) -> None:
    before = {p.name: p.read_bytes() for p in (store_dir / "commitlog").iterdir()}
    with pytest.raises(FencedError, match="no longer owns the store"):
        store.put(Message(TURN_TOPIC, b"late", queue_id=0))
    with pytest.raises(FencedError):
        store.put_batch([Message(TURN_TOPIC, b"late", queue_id=1)])
    with pytest.raises(FencedError):
        store.close()
    assert {p.name: p.read_bytes() for p in (store_dir / "commitlog").iterdir()} == before


# -- a taker whose host cached the epochs file --------------------------------------------------


def test_a_taker_whose_host_cached_an_old_epochs_file_appends_after_the_newest(
    tmp_path: Path,
) -> None:
    """Host 2 reads the store through a FUSE mount; host 1 writes the backing directory. Once
    the epochs file has one slot, host 2's cache goes stale on it (:meth:`FaultFS.stale`: reads
    through the cache show that copy, direct reads reach the file), and host 1's next writer
    appends a second. Host 2's writer then takes the store: it must record epoch 2 after both,
    not write epoch 1 over host 1's from the copy its host cached."""
    why = fuse_unavailable()
    if why is not None:
        pytest.skip(why)
    with mounted(tmp_path / "fuse") as fs:
        host1, host2 = fs.backing / "store", fs.mount / "store"
        with MessageStore(host1, CONFIG) as first:
            first.put(Message(TOPIC, b"host 1, epoch 0"))
        with MessageStore(host2, CONFIG, read_only=True) as ro:
            assert ro.max_offset(TOPIC, 0) == 1
        name = f"store/config/{fencing.FILE_NAME}"
        assert fs.stale(name) == [name]
        with MessageStore(host1, CONFIG) as second:
            second.put(Message(TOPIC, b"host 1, epoch 1"))
        newest = fencing.read_epochs(host1)[1]
        cached = fencing.path_of(host2)
        # The premise, by construction: through host 2's cache the file has one slot.
        assert len(fencing.parse(cached.read_bytes())) == 1
        assert cached.stat().st_size == fencing.MIN_SIZE
        with MessageStore(host2, CONFIG) as third:
            third.put(Message(TOPIC, b"host 2, epoch 2"))
        # It still had one slot there while host 2's writer took the store.
        assert len(fencing.parse(cached.read_bytes())) == 1
        epochs = fencing.read_epochs(host1)
        assert [e.epoch for e in epochs] == [0, 1, 2]
        assert epochs[1] == newest


# -- rocketstore clean --------------------------------------------------------------------------


def test_clean_checks_the_fence_before_it_deletes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``rocketstore clean`` opens the store and runs a retention round. If its lock is lost
    between the two and another writer takes the store, the round is refused: it deletes none
    of the files that writer now owns."""
    path = tmp_path / "s"
    with MessageStore(path, CONFIG) as first:
        put_a(first, 0, 2500)  # several 64 KiB segments
    segments = sorted(p for p in (path / "commitlog").iterdir() if p.name.isdigit())
    assert len(segments) > 3
    for seg in segments[:-1]:
        os.utime(seg, (1_000_000, 1_000_000))  # 1970: long expired

    class LosesTheStoreOnOpening(MessageStore):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            lose_lock(self)
            take_turn(path, "shared", 10)

    monkeypatch.setattr(commands, "MessageStore", LosesTheStoreOnOpening)
    conf = tmp_path / "store.toml"
    conf.write_text(
        f"mappedFileSizeCommitLog = {CONFIG.mapped_file_size_commitlog}\n"
        f"mappedFileSizeConsumeQueue = {CONFIG.mapped_file_size_consume_queue}\n"
        f"maxHashSlotNum = {CONFIG.max_hash_slot_num}\nmaxIndexNum = {CONFIG.max_index_num}\n"
        'sharedStorage = "shared"\n'
    )
    assert cli.main(["clean", str(path), "--config", str(conf)]) == cli.EXIT_ERROR
    assert [seg for seg in segments if not seg.exists()] == []
    assert "retention refused: this writer (epoch 1) no longer owns the store" in (
        capsys.readouterr().err
    )
    assert bodies(path) == expected(2500, 10)
