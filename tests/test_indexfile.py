"""pipeline/files/indexfile.py and pipeline/files/indexservice.py: the key index and its files."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketstore.pipeline.files.indexfile import IndexFile
from rocketstore.pipeline.files.indexservice import IndexService, index_file_name
from rocketstore.pipeline.format.javahash import index_key_hash

SLOTS = 8
ENTRIES = 10
T0 = 1_700_000_000_000  # ms
HEADER = struct.Struct(">qqqqii")


def arrays(
    hashes: list[int], phys: list[int], times: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.array(hashes, dtype=np.int32),
        np.array(phys, dtype=np.int64),
        np.array(times, dtype=np.int64),
    )


def new_file(path: Path, slots: int = SLOTS, entries: int = ENTRIES, **kw: int) -> IndexFile:
    return IndexFile(path, slots, entries, read_only=False, create=True, **kw)


def header(path: Path) -> tuple[int, ...]:
    return HEADER.unpack_from(path.read_bytes(), 0)


def entry(path: Path, slots: int, i: int) -> tuple[int, int, int, int]:
    return struct.unpack_from(">iqii", path.read_bytes(), 40 + 4 * slots + 20 * i)


def slot(path: Path, s: int) -> int:
    return struct.unpack_from(">i", path.read_bytes(), 40 + 4 * s)[0]


# -- IndexFile -----------------------------------------------------------------------------


def test_file_size_and_empty_header(tmp_path: Path) -> None:
    f = new_file(tmp_path / "idx")
    assert (tmp_path / "idx").stat().st_size == 40 + 4 * SLOTS + 20 * ENTRIES
    assert f.index_count == 1
    assert f.entry_count == 0
    assert not f.is_full
    assert list(f.candidates(3, 0, 2**62)) == []
    f.close()


def test_header_after_puts(tmp_path: Path) -> None:
    path = tmp_path / "idx"
    f = new_file(path)
    # hashes 3 and 11 share slot 3; 5 has its own slot
    f.put(*arrays([3, 5, 11], [1000, 1200, 1400], [T0, T0 + 1500, T0 + 4000]))
    f.put(*arrays([5], [1600], [T0 + 9999]))
    f.flush()
    begin_ts, end_ts, begin_phy, end_phy, slot_count, index_count = header(path)
    assert (begin_ts, end_ts) == (T0, T0 + 9999)
    assert (begin_phy, end_phy) == (1000, 1600)
    assert slot_count == 2
    assert index_count == 5
    assert (f.begin_timestamp, f.end_timestamp, f.hash_slot_count, f.index_count) == (
        T0,
        T0 + 9999,
        2,
        5,
    )
    # entries: keyHash, phyOffset, timeDiff (s), prevIndex
    assert entry(path, SLOTS, 1) == (3, 1000, 0, 0)
    assert entry(path, SLOTS, 2) == (5, 1200, 1, 0)
    assert entry(path, SLOTS, 3) == (11, 1400, 4, 1)
    assert entry(path, SLOTS, 4) == (5, 1600, 9, 2)
    assert entry(path, SLOTS, 0) == (0, 0, 0, 0)
    assert slot(path, 3) == 3
    assert slot(path, 5) == 4
    assert [slot(path, s) for s in (0, 1, 2, 4, 6, 7)] == [0] * 6
    f.close()


def test_reopen_reads_header(tmp_path: Path) -> None:
    path = tmp_path / "idx"
    f = new_file(path)
    f.put(*arrays([1, 2], [10, 20], [T0, T0 + 1000]))
    f.flush()
    f.close()
    g = IndexFile(path, SLOTS, ENTRIES, read_only=True)
    assert (g.index_count, g.hash_slot_count) == (3, 2)
    assert (g.begin_phy_offset, g.end_phy_offset) == (10, 20)
    assert list(g.candidates(2, 0, 2**62)) == [(20, T0 + 1000)]
    g.close()


def test_new_file_continues_previous_end(tmp_path: Path) -> None:
    path = tmp_path / "idx"
    f = new_file(path, prev_end_phy=5000, prev_end_ts=T0)
    assert (f.begin_phy_offset, f.end_phy_offset) == (5000, 5000)
    assert (f.begin_timestamp, f.end_timestamp) == (T0, T0)
    f.put(*arrays([1], [6000], [T0 + 3000]))
    # the first entry starts the file's own range
    assert (f.begin_phy_offset, f.end_phy_offset) == (6000, 6000)
    assert (f.begin_timestamp, f.end_timestamp) == (T0 + 3000, T0 + 3000)
    f.close()


def test_the_first_entry_of_a_file_after_a_gap_is_found_by_time(tmp_path: Path) -> None:
    # putKey measures a file's first entry against the header as it was, where the previous
    # file ended (here 1,200 s earlier), and only then starts the file at that entry: the
    # stored difference says 1,200 s, the entry's time is the file's begin timestamp.
    path = tmp_path / "idx"
    f = new_file(path, prev_end_phy=5000, prev_end_ts=T0)
    f.put(*arrays([7, 7], [6000, 6100], [T0 + 1_200_000, T0 + 1_200_500]))
    assert entry(path, SLOTS, 1)[2] == 1200  # byte for byte what RocketMQ 4.9.4 writes
    assert [p for p, _ in f.candidates(7, T0, T0 + 1_201_000)] == [6100, 6000]
    assert [p for p, _ in f.candidates(7, T0 + 1_200_000, T0 + 1_200_000)] == [6100, 6000]
    f.close()


def random_batch(seed: int, n: int, slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    hashes = rng.integers(0, 3 * slots, n).astype(np.int32)  # many collisions
    phys = np.cumsum(rng.integers(90, 300, n)).astype(np.int64)
    times = (T0 + np.cumsum(rng.integers(0, 1500, n))).astype(np.int64)
    return hashes, phys, times


@pytest.mark.parametrize("seed", range(6))
def test_batch_put_equals_one_at_a_time(tmp_path: Path, seed: int) -> None:
    slots, entries = 7, 40
    hashes, phys, times = random_batch(seed, 55, slots)  # more than fits
    one, batch = tmp_path / "one", tmp_path / "batch"
    f1, f2 = new_file(one, slots, entries), new_file(batch, slots, entries)
    added = 0
    for i in range(len(hashes)):
        added += f1.put(hashes[i : i + 1], phys[i : i + 1], times[i : i + 1])
    # the batch side in uneven chunks, to cover a batch following earlier entries too
    cut = seed * 3
    added2 = f2.put(hashes[:cut], phys[:cut], times[:cut])
    added2 += f2.put(hashes[cut:], phys[cut:], times[cut:])
    assert added == added2 == entries - 1
    f1.flush()
    f2.flush()
    assert one.read_bytes() == batch.read_bytes()
    f1.close()
    f2.close()


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    slots=st.integers(1, 5),
    entries=st.integers(2, 12),
    rows=st.lists(
        st.tuples(st.integers(0, 2**31 - 1), st.integers(-3000, 30_000)), min_size=1, max_size=15
    ),
    cut=st.integers(0, 15),
)
def test_batch_put_equals_one_at_a_time_any_input(
    tmp_path_factory: pytest.TempPathFactory,
    slots: int,
    entries: int,
    rows: list[tuple[int, int]],
    cut: int,
) -> None:
    d = tmp_path_factory.mktemp("idx")
    hashes = np.array([h % (3 * slots) if h % 2 else h for h, _ in rows], dtype=np.int32)
    phys = np.arange(1, len(rows) + 1, dtype=np.int64) * 100
    times = np.array([T0 * (t > 0) + t for _, t in rows], dtype=np.int64)
    f1, f2 = new_file(d / "one", slots, entries), new_file(d / "batch", slots, entries)
    for i in range(len(rows)):
        f1.put(hashes[i : i + 1], phys[i : i + 1], times[i : i + 1])
    f2.put(hashes[:cut], phys[:cut], times[:cut])
    f2.put(hashes[cut:], phys[cut:], times[cut:])
    f1.flush()
    f2.flush()
    assert (d / "one").read_bytes() == (d / "batch").read_bytes()
    f1.close()
    f2.close()


def test_batch_put_zero_begin_timestamp(tmp_path: Path) -> None:
    # A first store time <= 0 makes every timeDiff 0 (RocketMQ's rule), batch or not.
    one, batch = tmp_path / "one", tmp_path / "batch"
    data = arrays([1, 2, 3], [10, 20, 30], [0, 5000, 9000])
    f1, f2 = new_file(one), new_file(batch)
    for i in range(3):
        f1.put(*(a[i : i + 1] for a in data))
    f2.put(*data)
    assert one.read_bytes() == batch.read_bytes()
    assert entry(batch, SLOTS, 3)[2] == 0
    f1.close()
    f2.close()


def test_time_diff_clamped_at_zero(tmp_path: Path) -> None:
    path = tmp_path / "idx"
    f = new_file(path)
    f.put(*arrays([1, 2], [10, 20], [T0, T0 - 5000]))
    assert entry(path, SLOTS, 2)[2] == 0
    f.close()


def test_candidates_walk_chain_newest_first_across_collisions(tmp_path: Path) -> None:
    f = new_file(tmp_path / "idx")
    # 2, 10, 18 all land in slot 2
    hashes = [2, 10, 2, 18, 2, 10, 5]
    phys = [100, 200, 300, 400, 500, 600, 700]
    f.put(*arrays(hashes, phys, [T0 + 1000 * i for i in range(7)]))
    assert [p for p, _ in f.candidates(2, 0, 2**62)] == [500, 300, 100]
    assert [p for p, _ in f.candidates(10, 0, 2**62)] == [600, 200]
    assert [p for p, _ in f.candidates(18, 0, 2**62)] == [400]
    assert [p for p, _ in f.candidates(26, 0, 2**62)] == []
    assert [p for p, _ in f.candidates(5, 0, 2**62)] == [700]
    assert [t for _, t in f.candidates(2, 0, 2**62)] == [T0 + 4000, T0 + 2000, T0]
    f.close()


def test_candidates_time_range(tmp_path: Path) -> None:
    f = new_file(tmp_path / "idx")
    times = [T0, T0 + 10_000, T0 + 20_000, T0 + 30_000]
    f.put(*arrays([4, 4, 4, 4], [1, 2, 3, 4], times))

    def phys(begin: int, end: int) -> list[int]:
        return [p for p, _ in f.candidates(4, begin, end)]

    assert phys(T0 + 10_000, T0 + 20_000) == [3, 2]
    # stored times are whole seconds: a bound inside an entry's second keeps it as a candidate
    assert phys(T0 + 10_999, T0 + 29_999) == [3, 2]
    assert phys(T0 + 11_000, T0 + 29_999) == [3]
    assert phys(T0 + 30_000, T0 + 40_000) == [4]
    assert phys(T0 - 5000, T0 - 1) == []
    assert phys(T0 + 31_000, T0 + 90_000) == []
    assert phys(0, T0) == [1]
    assert f.is_time_matched(T0 + 5000, T0 + 6000)
    assert f.is_time_matched(T0 - 10, T0 + 40_000)
    assert not f.is_time_matched(T0 + 40_000, T0 + 50_000)
    assert not f.is_time_matched(0, T0 - 1)
    f.close()


def test_candidates_from_a_log_offset(tmp_path: Path) -> None:
    f = new_file(tmp_path / "idx")
    f.put(*arrays([2, 10, 2, 2, 18], [100, 200, 300, 400, 500], [T0] * 5))

    def phys(min_phys: int) -> list[int]:
        return [p for p, _ in f.candidates(2, 0, 2**62, min_phys)]

    assert phys(0) == [400, 300, 100]
    assert phys(300) == [400, 300]
    assert phys(301) == [400]
    assert phys(401) == []
    f.close()


def test_a_read_only_view_walks_past_entries_a_live_writer_added(tmp_path: Path) -> None:
    """A view counts the entries there were when it read the header; a writer in another
    process (a stock broker, say) then heads the slot's chain with newer entries. The view's
    look-ups still find the entries it counts, and offer none of the newer ones."""
    writer = new_file(tmp_path / "idx")
    writer.put(*arrays([2, 10], [100, 200], [T0, T0]))
    view = IndexFile(tmp_path / "idx", SLOTS, ENTRIES, read_only=True)
    writer.put(*arrays([2, 18, 10], [300, 400, 500], [T0 + 1000] * 3))
    assert slot(tmp_path / "idx", 2) == 5  # entry 5 (hash 10) heads slot 2's chain now
    assert [p for p, _ in view.candidates(2, 0, 2**62)] == [100]
    assert [p for p, _ in view.candidates(10, 0, 2**62)] == [200]
    assert [p for p, _ in view.candidates(18, 0, 2**62)] == []
    assert [p for p, _ in writer.candidates(2, 0, 2**62)] == [300, 100]
    view.close()
    writer.close()


def test_file_is_full_at_max_index_num(tmp_path: Path) -> None:
    path = tmp_path / "idx"
    f = new_file(path, entries=4)
    assert f.put(*arrays([1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [T0] * 5)) == 3
    assert f.is_full
    assert f.index_count == 4
    assert f.entry_count == 3
    assert f.put(*arrays([6], [6], [T0])) == 0
    assert f.end_phy_offset == 3
    f.flush()
    assert header(path)[5] == 4
    f.close()


# -- IndexService --------------------------------------------------------------------------


@pytest.fixture
def shanghai_tz(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "Asia/Shanghai")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_index_file_name_is_local_time(shanghai_tz: None) -> None:
    assert index_file_name(0) == "19700101080000000"
    ms = T0 + 123
    expected = datetime.fromtimestamp(ms / 1000).strftime("%Y%m%d%H%M%S") + "123"
    assert index_file_name(ms) == expected == "20231115061320123"
    assert len(index_file_name(ms)) == 17


def service(directory: Path, clock: list[int], *, entries: int = 3) -> IndexService:
    svc = IndexService(directory, SLOTS, entries, read_only=False, clock_ms=lambda: clock[0])
    svc.load()
    return svc


def test_service_rolls_files(tmp_path: Path, shanghai_tz: None) -> None:
    d = tmp_path / "index"
    clock = [T0]
    svc = service(d, clock)  # 2 entries per file
    assert svc.end_phy_offset == 0
    assert svc.put(*arrays([1, 2, 3], [100, 200, 300], [T0, T0 + 1000, T0 + 2000])) == 3
    clock[0] = T0 + 60_000
    assert svc.put(*arrays([4, 5], [400, 500], [T0 + 3000, T0 + 4000])) == 2
    names = [f.path.name for f in svc.files]
    assert names == sorted(names)
    assert len(names) == 3 == len(set(names))
    assert all(len(n) == 17 and n.isdigit() for n in names)
    assert names[0] == index_file_name(T0)
    assert names[2] == index_file_name(T0 + 60_000)
    assert sorted(p.name for p in d.iterdir()) == names
    assert all(p.stat().st_size == 40 + 4 * SLOTS + 20 * 3 for p in d.iterdir())
    f1, f2, f3 = svc.files
    assert (f1.begin_phy_offset, f1.end_phy_offset) == (100, 200)
    assert (f2.begin_phy_offset, f2.end_phy_offset) == (300, 400)
    assert (f3.begin_phy_offset, f3.end_phy_offset) == (500, 500)
    assert (f2.begin_timestamp, f2.end_timestamp) == (T0 + 2000, T0 + 3000)
    assert svc.end_phy_offset == 500
    assert svc.end_timestamp == T0 + 4000
    svc.close()


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    keys=st.lists(st.integers(0, 5), min_size=1, max_size=30),
    min_phys=st.integers(0, 3100),
)
def test_service_candidates_from_an_offset_skip_older_files(
    tmp_path: Path, keys: list[int], min_phys: int
) -> None:
    d = tmp_path / f"index-{len(list(tmp_path.iterdir()))}"
    svc = service(d, [T0])  # 2 entries per file: many files
    phys = [100 * (i + 1) for i in range(len(keys))]
    hashes = [index_key_hash("t", f"k{k}") for k in keys]
    svc.put(*arrays(hashes, phys, [T0] * len(keys)))
    consulted: list[str] = []
    real = IndexFile.candidates

    def spy(self: IndexFile, *args: int) -> Iterator[tuple[int, int]]:
        consulted.append(self.path.name)
        return real(self, *args)

    IndexFile.candidates = spy  # type: ignore[method-assign]
    try:
        for k in range(6):
            want = index_key_hash("t", f"k{k}")
            del consulted[:]
            got = list(svc.candidates("t", f"k{k}", 0, 2**62, min_phys))
            expected = [p for p, h in zip(phys, hashes, strict=True) if h == want and p >= min_phys]
            assert got == expected[::-1]
            reaching = {f.path.name for f in svc.files if f.end_phy_offset >= min_phys}
            assert set(consulted) <= reaching
    finally:
        IndexFile.candidates = real  # type: ignore[method-assign]
        svc.close()


def test_service_new_file_starts_at_previous_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rocketstore.pipeline.files import indexservice

    created: list[tuple[int, int]] = []

    class Recording(IndexFile):
        def __init__(self, *args: object, **kw: object) -> None:
            super().__init__(*args, **kw)  # type: ignore[arg-type]
            if kw.get("create"):
                created.append((self.begin_phy_offset, self.begin_timestamp))

    monkeypatch.setattr(indexservice, "IndexFile", Recording)
    svc = service(tmp_path / "index", [T0])
    svc.put(*arrays([1, 2, 3, 4, 5], [100, 200, 300, 400, 500], [T0 + 1000 * i for i in range(5)]))
    # each new file starts (before its first entry) where the previous one ended
    assert created == [(0, 0), (200, T0 + 1000), (400, T0 + 3000)]
    svc.close()


def test_service_same_millisecond_names(tmp_path: Path, shanghai_tz: None) -> None:
    clock = [T0 + 999]  # the +1 ms must carry into the seconds
    svc = service(tmp_path / "index", clock)
    svc.put(*arrays(list(range(1, 8)), [100 * i for i in range(1, 8)], [T0] * 7))
    names = [f.path.name for f in svc.files]
    assert names == [index_file_name(T0 + 999 + i) for i in range(4)]
    assert names[1].endswith("000")
    svc.close()


def test_service_name_taken_on_disk(tmp_path: Path, shanghai_tz: None) -> None:
    d = tmp_path / "index"
    d.mkdir()
    (d / "README").write_text("not an index file")
    clock = [T0]
    svc = service(d, clock)
    assert svc.files == []
    (d / index_file_name(T0)).write_bytes(b"")  # a stray file with the name it would pick
    svc.put(*arrays([1], [100], [T0]))
    assert svc.files[0].path.name == index_file_name(T0 + 1)
    svc.close()


def test_service_reput_of_indexed_messages_adds_nothing(tmp_path: Path) -> None:
    d = tmp_path / "index"
    svc = service(d, [T0], entries=10)
    svc.put(*arrays([1, 2, 3], [100, 200, 300], [T0, T0, T0]))
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    assert svc.put(*arrays([1, 2], [100, 200], [T0, T0])) == 0
    assert svc.put(*arrays([], [], [])) == 0
    svc.flush()
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    # only the part at or after the newest indexed message is taken
    assert svc.put(*arrays([1, 2, 4], [100, 200, 400], [T0, T0, T0])) == 1
    assert svc.files[-1].entry_count == 4
    svc.close()


def test_service_candidates_across_files(tmp_path: Path) -> None:
    d = tmp_path / "index"
    svc = service(d, [T0])
    h = index_key_hash("TopicTest", "k1")
    other = index_key_hash("TopicTest", "k2")
    svc.put(
        *arrays(
            [h, other, h, h, other, h],
            [100, 200, 300, 400, 500, 600],
            [T0 + 1000 * i for i in range(6)],
        )
    )
    assert len(svc.files) == 3
    assert list(svc.candidates("TopicTest", "k1", 0, 2**62)) == [600, 400, 300, 100]
    assert list(svc.candidates("TopicTest", "k2", 0, 2**62)) == [500, 200]
    assert list(svc.candidates("TopicTest", "k1", T0 + 2000, T0 + 3000)) == [400, 300]
    assert list(svc.candidates("Other", "k1", 0, 2**62)) == []
    svc.close()


def test_service_reload(tmp_path: Path) -> None:
    d = tmp_path / "index"
    svc = service(d, [T0])
    svc.put(*arrays([1, 2, 3], [100, 200, 300], [T0, T0 + 1000, T0 + 2000]))
    svc.flush()
    svc.close()
    ro = IndexService(d, SLOTS, 3, read_only=True, clock_ms=lambda: T0)
    ro.load()
    assert len(ro.files) == 2
    assert ro.end_phy_offset == 300
    assert ro.end_timestamp == T0 + 2000
    ro.close()


@pytest.mark.parametrize("read_only", [True, False])
def test_service_leaves_out_an_empty_newest_file(tmp_path: Path, read_only: bool) -> None:
    """A stock broker creates an IndexFile empty and then sizes it: a view can list it in
    between, and a broker that died there leaves it. It holds nothing: a view leaves it out and
    a writable open removes it, instead of refusing the store for its size."""
    d = tmp_path / "index"
    svc = service(d, [T0])
    svc.put(*arrays([1, 2], [100, 200], [T0, T0 + 1000]))
    svc.flush()
    names = [f.path.name for f in svc.files]
    svc.close()
    empty = d / "29991231235959999"
    empty.touch()
    loaded = IndexService(d, SLOTS, 3, read_only=read_only, clock_ms=lambda: T0)
    loaded.load()
    assert [f.path.name for f in loaded.files] == names
    assert loaded.end_phy_offset == 200
    assert empty.exists() == read_only
    loaded.close()
