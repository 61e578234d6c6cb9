"""Recovery of an IndexFile whose pages reached storage in any order.

When the host itself is lost (a power cut, or the FUSE client of a shared file system killed
with the writer), each page of a mapped file holds either what the last flush wrote or
something newer, chosen page by page by the kernel's writeback. The model: two states of one
store, S1 (flushed, and the progress file names it) and S2 (later puts, never flushed), and a
crash image that takes every 4 KiB page of the IndexFile from one or the other. After
recovery, every message the CommitLog holds must be found by its key exactly once, ``verify``
must be clean, and the store must go on indexing.
"""

from __future__ import annotations

import shutil
import struct
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files.progress import FILE_NAME
from rocketstore.pipeline.format import native
from rocketstore.pipeline.tools.verify.check import verify

PAGE = 4096
# Slots over two pages and entries over ten, so that pages disagree in many ways.
CONFIG = StoreConfig(
    mapped_file_size_commitlog=256 * 1024,
    mapped_file_size_consume_queue=20 * 1000,
    max_hash_slot_num=2000,
    max_index_num=2000,
)
FLUSHED, LATER, AFTER = 300, 200, 50


def batch(start: int, n: int) -> pa.Table:
    idx = range(start, start + n)
    return pa.table(
        {
            "topic": ["T"] * n,
            "body": [f"body-{i}".encode() for i in idx],
            "queueId": pa.array([i % 3 for i in idx], pa.int32()),
            # Few distinct keys, so that chains are long and slots shared.
            "keys": [f"k{i} g{i % 7}" for i in idx],
        }
    )


@pytest.fixture(scope="module")
def states() -> object:
    with tempfile.TemporaryDirectory() as tmp:
        s1, s2 = Path(tmp) / "s1", Path(tmp) / "s2"
        with MessageStore(s1, CONFIG) as store:
            for start in range(0, FLUSHED, 100):
                store.put_batch(batch(start, 100))
        shutil.copytree(s1, s2)
        with MessageStore(s2, CONFIG) as store:
            for start in range(FLUSHED, FLUSHED + LATER, 50):
                store.put_batch(batch(start, 50))
        yield s1, s2


def index_file(store: Path) -> Path:
    (path,) = sorted((store / "index").iterdir())
    return path


@settings(
    max_examples=40,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    pages=st.lists(st.booleans(), min_size=12, max_size=12),
    log_later=st.booleans(),
    queues_later=st.booleans(),
)
def test_any_mix_of_index_pages_recovers_exactly(
    states: tuple[Path, Path], pages: list[bool], log_later: bool, queues_later: bool
) -> None:
    s1, s2 = states
    old, new = index_file(s1).read_bytes(), index_file(s2).read_bytes()
    assert len(old) == len(new) and (len(old) + PAGE - 1) // PAGE == len(pages)
    mixed = b"".join(
        (new if later else old)[i * PAGE : (i + 1) * PAGE] for i, later in enumerate(pages)
    )
    with tempfile.TemporaryDirectory() as tmp:
        image = Path(tmp) / "image"
        shutil.copytree(s2 if log_later else s1, image)
        shutil.rmtree(image / "consumequeue")
        shutil.copytree((s2 if queues_later else s1) / "consumequeue", image / "consumequeue")
        index_file(image).write_bytes(mixed)
        # The last flush that reached storage is S1's; the writer died after S2's puts.
        shutil.copy(s1 / "config" / FILE_NAME, image / "config" / FILE_NAME)
        (image / "abort").touch()
        held = FLUSHED + (LATER if log_later else 0)
        with MessageStore(image, CONFIG) as store:
            report = verify(store, max_per_kind=None)
            assert report.ok, [str(p) for p in report.problems][:5]
            for i in range(held):
                found = [m.body for m in store.query_by_key("T", f"k{i}")]
                assert found == [f"body-{i}".encode()], (i, pages)
            assert store.query_by_key("T", f"k{held}") == []
            store.put_batch(batch(held, AFTER))
        with MessageStore(image, CONFIG, read_only=True) as store:
            report = verify(store, max_per_kind=None)
            assert report.ok, [str(p) for p in report.problems][:5]
            for i in range(held, held + AFTER):
                assert [m.body for m in store.query_by_key("T", f"k{i}")] == [f"body-{i}".encode()]


def replay(slots: bytearray, entries: bytes, count: int, limit: int) -> tuple[int, ...]:
    """The reference: RocketMQ's putKey replayed entry by entry, stopping at the first entry it
    would not have written."""
    slot_num = len(slots) // 4
    heads = [0] * slot_num
    keep, last = max(count, 1), None
    for j in range(1, count):
        h, phy, diff, prev = struct.unpack_from(">iqii", entries, 20 * j)
        good = h >= 0 and diff >= 0 and phy < limit and (last is None or phy >= last)
        if not good or prev != heads[h % slot_num]:
            keep = j
            break
        heads[h % slot_num], last = j, phy
    rewritten = 0
    for s, head in enumerate(heads):
        if struct.unpack_from(">i", slots, 4 * s)[0] != head:
            struct.pack_into(">i", slots, 4 * s, head)
            rewritten += 1
    nonzero = [j for j in range(keep, len(entries) // 20) if any(entries[20 * j : 20 * j + 20])]
    return keep, rewritten, sum(1 for h in heads if h), (nonzero[-1] if nonzero else None)


@st.composite
def index_images(draw: st.DrawFn) -> tuple[bytearray, bytearray, int, int]:
    """A valid index (entries put in order) with some of its slots and entries overwritten."""
    slot_num = draw(st.integers(1, 8))
    n = draw(st.integers(0, 30))
    slots, entries = bytearray(4 * slot_num), bytearray(20 * (n + 5))
    heads = [0] * slot_num
    phy = 0
    for j in range(1, n + 1):
        h = draw(st.integers(0, 40))
        phy += draw(st.integers(0, 3))
        struct.pack_into(
            ">iqii", entries, 20 * j, h, phy, draw(st.integers(0, 2)), heads[h % slot_num]
        )
        heads[h % slot_num] = j
    for s, head in enumerate(heads):
        struct.pack_into(">i", slots, 4 * s, head)
    for _ in range(draw(st.integers(0, 4))):
        target = draw(st.sampled_from(["slots", "entries"]))
        buf = slots if target == "slots" else entries
        at = draw(st.integers(0, len(buf) - 1))
        buf[at] = draw(st.integers(0, 255))
    count = draw(st.integers(0, n + 5))
    return slots, entries, count, draw(st.integers(0, phy + 2))


@settings(max_examples=500)
@given(index_images())
def test_native_mend_matches_the_replay(image: tuple[bytearray, bytearray, int, int]) -> None:
    slots, entries, count, limit = image
    want_slots = bytearray(slots)
    want = replay(want_slots, bytes(entries), count, limit)
    got = native.index_mend(slots, bytes(entries), count, limit)
    assert got == want
    assert slots == want_slots


def test_native_mend_refuses_a_count_past_the_file() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        native.index_mend(bytearray(8), bytes(40), 3, 0)
    with pytest.raises(ValueError, match="slots"):
        native.index_mend(b"\0" * 8, bytes(40), 1, 0)  # slots must be writable
