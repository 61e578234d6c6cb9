"""What the source reads from the files, on a queue of a million units: planning (driver side)
reads O(log n) ConsumeQueue units per queue per call, and a partition reads the units of its
own range and no others."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files.mappedfile import MappedFile
from rocketstore.pipeline.layout import CQ_UNIT_SIZE
from rocketstore.source import brokerview, options, schema
from rocketstore.source.brokerview import BrokerView, QueueBounds
from rocketstore.source.planning import Limit, Planner, QueueRange
from rocketstore.source.read import ReadContext, read_queue_range

UNITS = 1_000_000
PER_FILE = 100_000  # ConsumeQueue units per file: ten files
MAX_UNITS_PER_CALL = 64  # about 3 x log2(UNITS); reading every unit would be 1M
CONFIG = StoreConfig(
    mapped_file_size_commitlog=64 << 20,
    mapped_file_size_consume_queue=PER_FILE * CQ_UNIT_SIZE,
)
QUEUE = ("big", "broker-0", 0)


PUTS = 8
T0 = 1_000_000


@pytest.fixture(scope="module")
def big_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One queue of UNITS messages written by the native put in PUTS puts, put k stored at
    ``T0 + 1000 k`` ms."""
    root = tmp_path_factory.mktemp("big")
    StoreRoot(root).ensure_topic("big", TopicMeta(1, 1))
    now = [T0]
    table = pa.table(
        {
            "topic": pa.array(["big"] * UNITS, pa.string()),
            "body": pa.array([b"x"] * UNITS, pa.binary()),
            "queueId": pa.array(np.zeros(UNITS, dtype=np.int32)),
        }
    )
    step = UNITS // PUTS
    with MessageStore(root / "broker-0", CONFIG, clock_ms=lambda: now[0]) as store:
        for k in range(PUTS):
            now[0] = T0 + 1000 * k
            store.put_batch(table.slice(k * step, step))
    return root


class Reads:
    """Bytes read by ``pread``, by kind of file."""

    def __init__(self) -> None:
        self.cq_bytes = 0
        self.log_bytes = 0

    @property
    def units(self) -> int:
        return self.cq_bytes // CQ_UNIT_SIZE

    def add(self, path: str, n: int) -> None:
        if f"{os.sep}consumequeue{os.sep}" in path:
            self.cq_bytes += n
        else:
            self.log_bytes += n


@pytest.fixture
def planning_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Reads]:
    """Counts what the broker view reads (every read it makes is a ``read`` of a segment it
    opened through the read seam, a :class:`MappedFile`)."""
    reads = Reads()
    real = MappedFile.read

    def counted(self: MappedFile, position: int, n: int) -> bytes:
        got = real(self, position, n)
        reads.add(self.where, len(got))
        return got

    monkeypatch.setattr(MappedFile, "read", counted)
    yield reads


@pytest.fixture
def file_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Reads]:
    """Counts every ``os.pread`` of this process, by the file its descriptor is open on."""
    reads = Reads()
    real = os.pread

    def counted(fd: int, n: int, offset: int) -> bytes:
        got = real(fd, n, offset)
        reads.add(os.readlink(f"/proc/self/fd/{fd}"), len(got))
        return got

    monkeypatch.setattr(os, "pread", counted)
    yield reads


def _parse(root: Path, **extra: str) -> options.ReadOptions:
    return options.parse({"path": str(root), "topic": "big", **extra}, streaming=True)


def test_queue_bounds_read_a_few_units(big_root: Path, planning_reads: Reads) -> None:
    view = BrokerView("broker-0", big_root / "broker-0")
    assert view.queue_bounds("big", 0) == QueueBounds(0, UNITS)
    assert 0 < planning_reads.units <= MAX_UNITS_PER_CALL
    # The newest record is checked, and nothing much besides.
    assert 0 < planning_reads.log_bytes <= 4096


@pytest.mark.parametrize(("at", "want"), [(T0 + 5000, 625_000), (T0 + 5001, 750_000)])
def test_a_store_time_search_reads_a_few_units_and_records(
    big_root: Path, planning_reads: Reads, at: int, want: int
) -> None:
    view = BrokerView("broker-0", big_root / "broker-0")
    assert view.offset_for_time("big", 0, at, QueueBounds(0, UNITS)) == want
    assert 0 < planning_reads.units <= MAX_UNITS_PER_CALL
    # One record head per unit looked at.
    assert 0 < planning_reads.log_bytes <= MAX_UNITS_PER_CALL * 128


def test_a_micro_batch_plans_with_a_few_units(big_root: Path, planning_reads: Reads) -> None:
    planner = Planner(_parse(big_root, maxMessagesPerTrigger="1000"))
    start = {QUEUE: 500_000}
    end = planner.next_end(start, Limit(max_rows=1000))
    assert end == {QUEUE: 501_000}
    assert planning_reads.units <= MAX_UNITS_PER_CALL
    before = planning_reads.units
    assert planner.ranges(start, end) == [
        QueueRange("big", "broker-0", str(big_root / "broker-0"), 0, 500_000, 501_000)
    ]
    assert planning_reads.units - before <= MAX_UNITS_PER_CALL
    before = planning_reads.units
    at = Planner(_parse(big_root, startingTimestamp=str(T0 + 7000))).initial_offsets()
    assert at == {QUEUE: 7 * UNITS // PUTS}
    # Its bounds, then the search.
    assert planning_reads.units - before <= 2 * MAX_UNITS_PER_CALL


@pytest.mark.parametrize(
    ("start", "end"),
    [(500_000, 501_000), (PER_FILE - 10, PER_FILE + 10), (UNITS - 3, UNITS)],
    ids=["middle", "across-files", "tail"],
)
def test_a_partition_reads_only_its_units(
    big_root: Path, file_reads: Reads, start: int, end: int
) -> None:
    ctx = ReadContext(schema.arrow_schema(None), str(big_root), chunk_units=700)
    rng = QueueRange("big", "broker-0", str(big_root / "broker-0"), 0, start, end)
    batches = list(read_queue_range(rng, ctx))
    offsets = pa.Table.from_batches(batches).column("queueOffset").to_pylist()
    assert offsets == list(range(start, end))
    assert file_reads.cq_bytes == (end - start) * CQ_UNIT_SIZE


def test_polling_a_queue_with_nothing_new_reads_two_units(
    big_root: Path, planning_reads: Reads
) -> None:
    """A streaming query asks for the latest offsets every few milliseconds while idle: with
    the tails kept from the call before, an unchanged queue costs the units around its end
    and its first unit (retention's check), and no record."""
    view = BrokerView("broker-0", big_root / "broker-0")
    tails: brokerview.Tails = {}
    assert view.queue_bounds("big", 0, tails) == QueueBounds(0, UNITS)
    units, log_bytes = planning_reads.units, planning_reads.log_bytes
    for _ in range(3):
        assert view.queue_bounds("big", 0, tails) == QueueBounds(0, UNITS)
    # The last file is full: the unit before the end and the first, per poll.
    assert planning_reads.units - units == 3 * 2
    assert planning_reads.log_bytes == log_bytes


SMALL = StoreConfig(
    mapped_file_size_commitlog=64 << 10, mapped_file_size_consume_queue=7 * CQ_UNIT_SIZE
)
SMALL_UNITS = 40  # six ConsumeQueue files of 7 units


@pytest.fixture(scope="module")
def small_queue(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[Path, bytes]]]:
    """A broker whose one queue has SMALL_UNITS units in 7-unit files, and those files' bytes."""
    path = tmp_path_factory.mktemp("small") / "broker-0"
    with MessageStore(path, SMALL) as store:
        for k in range(4):
            n = SMALL_UNITS // 4
            store.put_batch(
                pa.table({"topic": ["t"] * n, "body": [b"m%d" % (k * n + i) for i in range(n)]})
            )
    files = sorted((path / "consumequeue" / "t" / "0").iterdir())
    return path, [(f, f.read_bytes()) for f in files]


def show_units(files: list[tuple[Path, bytes]], end: int, spare: bool = False) -> None:
    """Make the queue hold units ``[0, end)``: files up to the one the end falls in, zeros after
    it in that file, and no file after it (with ``spare``, one more file of zeros, as a writer
    that created its next file leaves it). Units appear as a writer adds them, or are cut back
    as recovery cuts a tail."""
    size = len(files[0][1])
    next_base = -(-end * CQ_UNIT_SIZE // size) * size  # the first file boundary at or past end
    base = 0
    for k, (f, content) in enumerate(files):
        keep = max(0, min(size, end * CQ_UNIT_SIZE - base))
        if k == 0 or keep > 0 or (spare and base == next_base):
            f.write_bytes(content[:keep] + bytes(size - keep))
        else:
            f.unlink(missing_ok=True)
        base += size


@settings(max_examples=60)
@given(
    ends=st.lists(st.tuples(st.integers(0, SMALL_UNITS), st.booleans()), min_size=1, max_size=12)
)
def test_bounds_from_kept_tails_equal_a_fresh_look(
    small_queue: tuple[Path, list[tuple[Path, bytes]]], ends: list[tuple[int, bool]]
) -> None:
    """The queue's end moves up and down (growth within and across files, cuts back, nothing
    new) between polls: a view that keeps its tails answers what a view without them does."""
    path, files = small_queue
    view = BrokerView("broker-0", path)
    tails: brokerview.Tails = {}
    try:
        for end, spare in ends:
            show_units(files, end, spare)
            fresh = view.queue_bounds("t", 0)
            assert fresh.max == end
            assert view.queue_bounds("t", 0, tails) == fresh
    finally:
        show_units(files, SMALL_UNITS)


@pytest.mark.parametrize("grown", [1, 2, 3, 100, 1000])
def test_a_queue_that_grew_by_a_few_units_costs_a_few_unit_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, grown: int
) -> None:
    """The tail kept from the plan before is where the search for the new end starts, in
    steps that double: reads grow with the log of what was added, not of the file's size."""
    config = StoreConfig(mapped_file_size_consume_queue=200_000 * CQ_UNIT_SIZE)
    path = tmp_path / "broker-0"

    def put(first: int, n: int) -> None:
        with MessageStore(path, config) as store:
            store.put_batch(
                pa.table(
                    {"topic": ["t"] * n, "body": [b"m%d" % i for i in range(first, first + n)]}
                )
            )

    put(0, 50)
    view = BrokerView("broker-0", path)
    tails: brokerview.Tails = {}
    view.queue_bounds("t", 0, tails)
    put(50, grown)
    units = []
    real = brokerview._Queue.unit

    def counted(self: brokerview._Queue, i: int) -> tuple[int, int, int]:
        units.append(i)
        return real(self, i)

    monkeypatch.setattr(brokerview._Queue, "unit", counted)
    assert view.queue_bounds("t", 0, tails).max == 50 + grown
    # The units either side of the old end, a read per doubling to pass the new end and as
    # many to find it within the last step, the new last unit (its record's check) and the
    # first (retention's). The whole file's search costs 22 whatever was added.
    assert len(units) <= 2 * (grown.bit_length() + 1) + 2


def test_retention_under_one_queues_look_redoes_that_queue_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention deleting a file under the bounds of one queue (here: every queue's first look
    fails as a deleted file makes it) costs that queue one more look, with the CommitLog
    listed again; the queues done are not looked at again, so a topic of many queues is not
    starved by retention (the whole topic looked at again needed one pass per queue). A queue
    whose files keep disappearing is named."""
    from rocketstore.pipeline.errors import SegmentGoneError, StoreError

    StoreRoot(tmp_path).ensure_topic("t", TopicMeta(1, 8))
    with MessageStore(tmp_path / "broker-0", CONFIG) as store:
        store.put_batch(
            pa.table(
                {
                    "topic": pa.array(["t"] * 80, pa.string()),
                    "body": pa.array([b"x"] * 80, pa.binary()),
                    "queueId": pa.array(np.arange(80, dtype=np.int32) % 8),
                }
            )
        )
    view = BrokerView("broker-0", tmp_path / "broker-0")
    expected = view.all_bounds("t")
    real = BrokerView._queue_bounds
    looks: list[int] = []

    def deleted_under_first_look(self: BrokerView, files: Any, log: Any, topic: str, q: int,
                                 *rest: Any) -> QueueBounds:  # fmt: skip
        looks.append(q)
        if looks.count(q) == 1:
            raise SegmentGoneError(f"queue {q}'s file was deleted")
        return real(self, files, log, topic, q, *rest)

    monkeypatch.setattr(BrokerView, "_queue_bounds", deleted_under_first_look)
    assert view.all_bounds("t") == expected
    assert looks == [q for q in range(8) for _ in range(2)]

    def always_deleted(self: BrokerView, files: Any, log: Any, topic: str, q: int,
                       *rest: Any) -> QueueBounds:  # fmt: skip
        if q == 3:
            raise SegmentGoneError("deleted again")
        return real(self, files, log, topic, q, *rest)

    monkeypatch.setattr(BrokerView, "_queue_bounds", always_deleted)
    with pytest.raises(StoreError, match="consumequeue/t/3: files keep disappearing"):
        view.all_bounds("t")
