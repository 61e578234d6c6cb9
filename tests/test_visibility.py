"""The visibility rule for shared storage (rocketstore.pipeline.files.visibility), on one host with
``sharedStorage = "shared"`` forced: readers see what the writer published, never more, and a
record that does not check out below the published point is waited for, then damage; a file
that this host's listing of its directory lacks is waited for, then not visible (never damage).

The same rule across two client caches (GlusterFS mounts) is tested in test_gluster_store.py."""

from __future__ import annotations

import dataclasses
import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketstore.pipeline.config import SYNC_FLUSH, StoreConfig
from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import (
    ConfigError,
    CorruptRecordError,
    NotVisibleError,
    OffsetOutOfRangeError,
)
from rocketstore.pipeline.files import visibility
from rocketstore.pipeline.files.indexservice import IndexService
from rocketstore.pipeline.files.localsegments import list_segments
from rocketstore.pipeline.files.mappedfile import segment_name
from rocketstore.pipeline.files.segments import SegmentQueue
from rocketstore.pipeline.layout import CQ_UNIT_SIZE
from rocketstore.source import options, schema
from rocketstore.source.brokerview import BrokerView
from rocketstore.source.planning import KeyRange, Planner, QueueRange
from rocketstore.source.read import ReadContext, read_key, read_queue_range
from tests.kit.sourcekit import SMALL, message_table

SHARED = dataclasses.replace(SMALL, shared_storage="shared", visibility_wait_ms=2000)
LOCAL = dataclasses.replace(SMALL, shared_storage="local")


def visible(path: Path, config: StoreConfig) -> tuple[int, int, int]:
    """(CommitLog end, units of orders/0, key hits for k5) a read-only open shows."""
    with MessageStore(path, config, read_only=True) as ro:
        return (
            ro.max_phy_offset,
            ro.max_offset("orders", 0),
            len(ro.query_by_key("orders", "k5")),
        )


def test_readers_see_only_what_a_flush_published(tmp_path: Path) -> None:
    path = tmp_path / "b"
    with MessageStore(path, SHARED, background=False) as w:
        w.put_batch(message_table("orders", list(range(10)), 1))
        w.flush()
        published = visible(path, SHARED)
        assert published[1] == 10 and published[2] == 1
        w.put_batch(message_table("orders", list(range(10, 30)), 1))
        # Written, in this host's page cache, not published: a shared-storage reader does not
        # see it, a one-host reader does.
        assert visible(path, SHARED) == published
        assert visible(path, LOCAL)[1] == 30
        bounds = BrokerView("b", path, "shared").queue_bounds("orders", 0)
        assert (bounds.min, bounds.max) == (0, 10)
        assert BrokerView("b", path, "local").queue_bounds("orders", 0).max == 30
        w.flush()
        assert visible(path, SHARED)[1] == 30
        assert BrokerView("b", path, "shared").queue_bounds("orders", 0).max == 30


def test_a_queue_created_after_the_published_point_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "b"
    with MessageStore(path, SHARED, background=False) as w:
        w.put_batch(message_table("orders", list(range(4)), 1))
        w.flush()
        w.put_batch(message_table("later", list(range(4)), 1))
        with MessageStore(path, SHARED, read_only=True) as ro:
            assert ro.max_offset("later", 0) == ro.min_offset("later", 0)
            assert ro.max_offset("orders", 0) == 4
        assert BrokerView("b", path, "shared").queue_bounds("later", 0).max == 0


def test_sync_flush_publishes_before_a_put_returns(tmp_path: Path) -> None:
    path = tmp_path / "b"
    config = dataclasses.replace(SHARED, flush_disk_type=SYNC_FLUSH)
    with MessageStore(path, config, background=False) as w:
        for n in range(1, 4):
            w.put_batch(message_table("orders", [n], 1))
            point = visibility.published(path)
            assert point is not None and point.queue_length("orders", 0) == n
            assert visible(path, config)[1] == n
            assert BrokerView("b", path, "shared").queue_bounds("orders", 0).max == n


def test_a_store_without_a_progress_file_is_read_as_on_one_host(tmp_path: Path) -> None:
    """RocketMQ publishes nothing: readers fall back to checking the tail, as on one host."""
    path = tmp_path / "b"
    with MessageStore(path, SMALL) as w:
        w.put_batch(message_table("orders", list(range(7)), 1))
    (path / "config" / "rocketstore.json").unlink()
    assert visible(path, SHARED)[1] == 7
    assert BrokerView("b", path, "shared").queue_bounds("orders", 0).max == 7


def _planned(root: Path, config: StoreConfig) -> tuple[list[object], ReadContext]:
    parsed = options.parse({"path": str(root), "topic": "orders"}, streaming=False)
    parsed = dataclasses.replace(parsed, config=config)
    planner = Planner(parsed)
    start, end = planner.batch_range()
    ctx = ReadContext(schema=schema.arrow_schema(None), root=str(root), config=config)
    return list(planner.ranges(start, end)), ctx


def _damage_last_body(root: Path) -> tuple[Path, int, bytes]:
    segment = list_segments(root / "broker-0" / "commitlog")[0][1]
    data = bytearray(segment.read_bytes())
    at = data.rindex(b"m19:") + 1  # inside the last record's body: its CRC no longer holds
    before = bytes(data[at : at + 1])
    data[at] ^= 0xFF
    segment.write_bytes(bytes(data))
    return segment, at, before


def test_an_executor_waits_for_a_record_to_reach_its_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A published record that does not check out on this host is read again past the cache
    until it does (here: it "arrives" as the reader reads it past the page cache the second
    time; the first read went through the segment's mapping)."""
    StoreRoot(tmp_path).ensure_topic("orders", TopicMeta(1, 1))
    with MessageStore(tmp_path / "broker-0", SHARED) as w:
        w.put_batch(message_table("orders", list(range(20)), 1))
    ranges, ctx = _planned(tmp_path, SHARED)
    segment, at, good = _damage_last_body(tmp_path)
    direct_reads: list[int] = []
    real_read = visibility.read_direct

    def arriving(fd: int, position: int, n: int) -> bytes | None:
        if Path(os.readlink(f"/proc/self/fd/{fd}")) == segment:
            direct_reads.append(position)
            if len(direct_reads) == 2:
                with open(segment, "r+b") as f:
                    f.seek(at)
                    f.write(good)
        return real_read(fd, position, n)

    monkeypatch.setattr(visibility, "read_direct", arriving)
    (rng,) = ranges
    rows = pa.Table.from_batches(list(read_queue_range(rng, ctx))).column("queueOffset")
    assert rows.to_pylist() == list(range(20))
    assert len(direct_reads) == 2


def test_a_record_that_never_checks_out_is_damage_after_the_wait(tmp_path: Path) -> None:
    StoreRoot(tmp_path).ensure_topic("orders", TopicMeta(1, 1))
    config = dataclasses.replace(SHARED, visibility_wait_ms=50)
    with MessageStore(tmp_path / "broker-0", config) as w:
        w.put_batch(message_table("orders", list(range(20)), 1))
    ranges, ctx = _planned(tmp_path, config)
    segment, _, _ = _damage_last_body(tmp_path)
    (rng,) = ranges
    with pytest.raises(CorruptRecordError, match=str(segment)):
        list(read_queue_range(rng, ctx))
    # On one host the same damage is reported at once, without waiting.
    _, local_ctx = _planned(tmp_path, dataclasses.replace(config, shared_storage="local"))
    with pytest.raises(CorruptRecordError, match=str(segment)):
        list(read_queue_range(rng, local_ctx))


def test_auto_picks_shared_on_network_and_fuse_file_systems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kinds = {"fuse.glusterfs": True, "fuse.ceph-fuse": True, "nfs4": True, "ceph": True}
    kinds |= {"ext4": False, "tmpfs": False}
    for kind, shared in kinds.items():
        monkeypatch.setattr(visibility.filesystem, "fs_type", lambda _p, k=kind: k)
        assert visibility.is_shared(tmp_path) is shared, kind
        assert visibility.is_shared(tmp_path, "local") is False
        assert visibility.is_shared(tmp_path, "shared") is True


def test_the_setting_is_checked() -> None:
    with pytest.raises(ConfigError, match="sharedStorage='yes': must be one of auto, shared"):
        StoreConfig(shared_storage="yes")
    with pytest.raises(ConfigError, match="visibilityWaitMs=-1"):
        StoreConfig(visibility_wait_ms=-1)


def test_key_look_ups_stop_at_the_published_point(tmp_path: Path) -> None:
    path = tmp_path / "broker-0"
    with MessageStore(path, SHARED, background=False) as w:
        w.put_batch(message_table("orders", list(range(10)), 1))
        w.flush()
        w.put_batch(message_table("orders", list(range(10, 20)), 1))
        found = {}
        for config in (SHARED, LOCAL):
            ctx = ReadContext(schema=schema.arrow_schema(None), root=str(tmp_path), config=config)
            for key in ("k5", "k15"):
                kr = KeyRange("orders", "broker-0", str(path), key, 0, 2**62)
                found[config.shared_storage, key] = sum(b.num_rows for b in read_key(kr, ctx))
    assert found == {
        ("shared", "k5"): 1,
        ("shared", "k15"): 0,
        ("local", "k5"): 1,
        ("local", "k15"): 1,
    }


# -- files this host does not list yet ----------------------------------------------------------


class _Listed(list[os.DirEntry[str]]):
    """What ``os.scandir`` returns, as a list: iterable and a context manager."""

    def __enter__(self) -> _Listed:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class StaleListings:
    """Directory listings of this process as a shared file system's client answers them from
    its cache: a directory :meth:`freeze` was called for lists only the entries it had then
    (those still there) for its next ``lag`` listings, then as it is. Names are looked up as
    usual (a file opened by its name is found). Both ways Python lists a directory are
    covered: ``os.scandir`` and ``os.listdir`` (``Path.iterdir``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._frozen: dict[str, tuple[set[str], list[int]]] = {}
        self._scandir = os.scandir
        self._listdir = os.listdir
        monkeypatch.setattr(os, "scandir", self.scandir)
        monkeypatch.setattr(os, "listdir", self.listdir)

    def freeze(self, directory: Path, lag: int, names: set[str] | None = None) -> None:
        """List ``directory`` as it is now (or as holding ``names``) for ``lag`` listings."""
        shown = set(self._listdir(directory)) if names is None else names
        self._frozen[str(directory)] = (shown, [lag])

    def _shown(self, directory: Any) -> set[str] | None:
        if isinstance(directory, int):
            return None  # a directory opened as a descriptor (fencing's) is never frozen
        frozen = self._frozen.get(os.fspath(directory) if directory is not None else ".")
        if frozen is None or frozen[1][0] <= 0:
            return None
        frozen[1][0] -= 1
        return frozen[0]

    def scandir(self, directory: Any = None) -> _Listed:
        shown = self._shown(directory)
        with self._scandir(directory) as entries:
            return _Listed(e for e in entries if shown is None or e.name in shown)

    def listdir(self, directory: Any = None) -> list[str]:
        shown = self._shown(directory)
        return [n for n in self._listdir(directory) if shown is None or n in shown]


N = 1010  # messages _roll publishes


def _roll(path: Path, stale: StaleListings | None = None, lag: int = 0) -> None:
    """Publish 10 messages of orders/0, freeze this host's listings of the CommitLog and the
    queue for ``lag`` listings (with ``stale``), then publish 1,000 more (new CommitLog
    segments, new ConsumeQueue files): the reader's listings lack the files the last ones
    are in."""
    with MessageStore(path, SHARED, background=False) as w:
        w.put_batch(message_table("orders", list(range(10)), 1))
        w.flush()
        if stale is not None:
            stale.freeze(path / "commitlog", lag)
            stale.freeze(path / "consumequeue" / "orders" / "0", lag)
        w.put_batch(message_table("orders", list(range(10, N)), 1))
        w.flush()
    # Files, not bytes, are what the lagging listings hide: the log now has a third segment.
    assert (path / "commitlog" / segment_name(2 * SHARED.mapped_file_size_commitlog)).exists()


def test_a_lookup_past_the_listing_finds_a_segment_created_since(tmp_path: Path) -> None:
    """A reader lists the segments, a writer then starts the next one: a look-up past the
    reader's listing lists the directory again and finds it. On one host (no wait) the
    listing is the directory and the look-up is out of range."""
    writer = SegmentQueue(tmp_path, 4096, read_only=False)
    writer.load()
    writer.segment_for_write(0).write_at(0, b"a" * 100)
    reader = SegmentQueue(tmp_path, 4096, read_only=True, visibility_wait_ms=1000)
    one_host = SegmentQueue(tmp_path, 4096, read_only=True)
    reader.load()
    one_host.load()
    writer.segment_for_write(4096).write_at(0, b"b" * 100)
    writer.flush()
    found = reader.find(4096 + 50)
    assert (found.path.name, bytes(found.buffer[50:51])) == (segment_name(4096), b"b")
    # Taken in with nothing written: a view shows it only once its owner sets the end.
    assert reader.max_offset == 4096
    with pytest.raises(OffsetOutOfRangeError):
        one_host.find(4096 + 50)
    for q in (writer, reader, one_host):
        q.close()


def test_a_read_only_open_waits_for_files_its_listing_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opened read-only while this host's listings lag behind what the writer published: the
    view lists again until it shows every published message, and reads the newest."""
    path = tmp_path / "b"
    stale = StaleListings(monkeypatch)
    _roll(path, stale, lag=3)
    with MessageStore(path, SHARED, read_only=True) as ro:
        assert ro.max_offset("orders", 0) == N
        point = visibility.published(path)
        assert point is not None and ro.max_phy_offset == point.commitlog_end
        (newest,) = ro.get_messages("orders", 0, N - 1, 1).messages
        assert newest.body.startswith(f"m{N - 1}:".encode())
        assert ro.get_by_msg_id(newest.msg_id).body == newest.body


def test_a_read_only_view_ends_where_its_listing_does_after_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listings that lag for longer than visibilityWaitMs: the view ends at the files this
    host lists, and asking past them is out of range, not damage."""
    path = tmp_path / "b"
    stale = StaleListings(monkeypatch)
    _roll(path, stale, lag=10**6)
    point = visibility.published(path)
    assert point is not None
    config = dataclasses.replace(SHARED, visibility_wait_ms=50)
    with MessageStore(path, config, read_only=True) as ro:
        held = ro.commitlog.segments.files[-1]
        assert ro.max_phy_offset <= held.base + held.size < point.commitlog_end
        assert 10 <= ro.max_offset("orders", 0) < N
        with pytest.raises(OffsetOutOfRangeError):
            ro.get_message(point.commitlog_end - 1)


def test_planning_lists_again_and_offers_only_what_this_host_lists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planner lists a directory again when the published point lies past its listing;
    records in CommitLog segments it still does not list are not offered (not visible yet),
    never offered as damage."""
    path = tmp_path / "b"
    _roll(path)
    stale = StaleListings(monkeypatch)
    log, queue = path / "commitlog", path / "consumequeue" / "orders" / "0"
    with MessageStore(path, LOCAL, read_only=True) as ro:
        units = ro.read_units("orders", 0, 0, N)
    first_log_files = {segment_name(0)}
    first_queue_files = {segment_name(0)}
    stale.freeze(log, 1, first_log_files)
    stale.freeze(queue, 1, first_queue_files)
    assert BrokerView("b", path, "shared").queue_bounds("orders", 0) == (0, N)
    stale.freeze(log, 10**6, first_log_files)  # the CommitLog's listing never catches up
    stale.freeze(queue, 1, first_queue_files)
    ends = units["offset"].astype(np.int64) + units["size"]
    in_first = int(np.count_nonzero(ends <= SHARED.mapped_file_size_commitlog))
    assert BrokerView("b", path, "shared").queue_bounds("orders", 0) == (0, in_first)


def _published_range(broker: Path) -> QueueRange:
    """orders/0 up to what the writer published: a range a planner on another host offers."""
    point = visibility.published(broker)
    assert point is not None
    return QueueRange("orders", "broker-0", str(broker), 0, 0, point.queue_length("orders", 0))


def test_an_executor_waits_for_files_its_listing_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range planned on another host, read where the listings lag: every message is read,
    nothing is taken for data loss or damage."""
    StoreRoot(tmp_path).ensure_topic("orders", TopicMeta(1, 1))
    broker = tmp_path / "broker-0"
    stale = StaleListings(monkeypatch)
    _roll(broker, stale, lag=3)
    ctx = ReadContext(schema=schema.arrow_schema(None), root=str(tmp_path), config=SHARED)
    batches = list(read_queue_range(_published_range(broker), ctx))
    rows = pa.Table.from_batches(batches).column("queueOffset")
    assert rows.to_pylist() == list(range(N))


def test_a_file_not_found_after_the_wait_is_not_visible_not_lost(tmp_path: Path) -> None:
    """A range reaching into a ConsumeQueue file that this host finds neither by name nor in
    its listing (planned elsewhere, the file not visible here): after visibilityWaitMs it
    fails as not visible, not as data loss."""
    StoreRoot(tmp_path).ensure_topic("orders", TopicMeta(1, 1))
    broker = tmp_path / "broker-0"
    with MessageStore(broker, SHARED) as w:
        w.put_batch(message_table("orders", list(range(N)), 1))
    per_file = SHARED.mapped_file_size_consume_queue // CQ_UNIT_SIZE
    end = (N // per_file + 1) * per_file + 10  # 10 units into the file after the last
    rng = QueueRange("orders", "broker-0", str(broker), 0, 1000, end)
    config = dataclasses.replace(SHARED, visibility_wait_ms=50)
    ctx = ReadContext(schema=schema.arrow_schema(None), root=str(tmp_path), config=config)
    with pytest.raises(NotVisibleError, match="not visible here yet"):
        list(read_queue_range(rng, ctx))


def test_a_full_newest_index_file_has_its_directory_listed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only index whose newest listed file is full lists the directory once more, and
    finds the keys of the file that this host's first listing lacked."""
    path = tmp_path / "b"
    stale = StaleListings(monkeypatch)
    with MessageStore(path, SHARED, background=False) as w:
        w.put_batch(message_table("orders", list(range(50)), 1))  # 150 entries of 255
        w.flush()
        stale.freeze(path / "index", lag=1)
        w.put_batch(message_table("orders", list(range(50, 100)), 1))
        w.flush()
        (newest,) = w.query_by_key("orders", "k99")
    index = IndexService(
        path / "index",
        SHARED.max_hash_slot_num,
        SHARED.max_index_num,
        read_only=True,
        clock_ms=lambda: 0,
    )
    try:
        index.load()
        assert len(index.files) == 2
        assert newest.commit_log_offset in index.candidates("orders", "k99", 0, 2**62)
    finally:
        index.close()


@given(st.lists(st.tuples(st.integers(0, 20_000), st.integers(0, 9_000)), min_size=1, max_size=20))
@settings(max_examples=30, deadline=None)
def test_a_direct_read_returns_what_pread_returns(reads: list[tuple[int, int]]) -> None:
    """Reads past the page cache at any position and length, aligned or not, across the
    file's end: the bytes ``pread`` gives (ext4 here, which takes ``O_DIRECT``)."""
    with tempfile.TemporaryDirectory(dir=Path(__file__).parent) as d:
        path = Path(d) / "f"
        data = bytes(random.Random(len(reads)).randrange(256) for _ in range(21_000))
        path.write_bytes(data)
        fd = os.open(path, os.O_RDONLY)
        try:
            for position, n in reads:
                got = visibility.read_direct(fd, position, n)
                assert got == os.pread(fd, n, position)
        finally:
            os.close(fd)


def test_a_direct_read_where_the_file_system_refuses_it_says_so(tmp_path: Path) -> None:
    """Where ``O_DIRECT`` is refused the answer is None (the caller reads through the cache),
    never wrong bytes; the descriptor keeps its flags."""
    import fcntl

    for directory in (Path("/dev/shm"), tmp_path):
        path = directory / f"rs-direct-{os.getpid()}"
        path.write_bytes(b"abc" * 3000)
        fd = os.open(path, os.O_RDONLY)
        try:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            got = visibility.read_direct(fd, 5, 100)
            assert got in (None, (b"abc" * 3000)[5:105])
            assert fcntl.fcntl(fd, fcntl.F_GETFL) == flags
        finally:
            os.close(fd)
            path.unlink()
