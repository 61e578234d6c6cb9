"""verify of a store with thousands of small queues: its work follows the units, not the
number of queues nor the ConsumeQueue files' capacity.

Counted, not timed: the ConsumeQueue files mapped and read (a 6,000,000-byte file holding three
units is read up to its data, once, and never mapped), the queues the store loads (none: the
scan lists them for itself and leaves the store as it found it), and the memory a scan needs
per queue (tracemalloc's peak, two stores of different sizes compared, so that what does not
depend on the number of queues cancels out).
"""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files import fileio
from rocketstore.pipeline.layout import PRE_BLANK_SIZE, UNIT_DTYPE
from rocketstore.pipeline.tools.verify import check as verify_module
from rocketstore.pipeline.tools.verify.check import verify
from rocketstore.pipeline.tools.verify.units import first_look
from tests.kit.manyqueues import QUICK, FileReads, build

CONFIG = QUICK
PER_QUEUE = 3
PAGE = 4096


def reports_holes(directory: Path) -> bool:
    """Whether the file system under ``directory`` tells holes apart (SEEK_DATA)."""
    path = directory / "sparse-probe"
    with path.open("wb") as f:
        f.truncate(1 << 20)
        f.write(b"x")
    fd = os.open(path, os.O_RDONLY)
    try:
        return fileio.data_end(fd, 1 << 20) < 1 << 20
    finally:
        os.close(fd)
        path.unlink()


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Stores of 1,000 and 3,000 queues (250 and 750 topics) of three units each."""
    root = tmp_path_factory.mktemp("many")
    if not reports_holes(root):
        pytest.skip(f"{root}: the file system does not report holes (SEEK_DATA)")
    return {q: build(root / f"q{q}", q // 4, PER_QUEUE, CONFIG) for q in (1000, 3000)}


@pytest.mark.parametrize("chunk", [None, 50], ids=["chunk-default", "chunk-50"])
def test_each_queue_file_is_read_once_up_to_its_data_and_never_mapped(
    stores: dict[int, Path], chunk: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan reads each small queue's file once, a page or so of it, however many stretches
    the log is checked in (50 records a stretch: 180 stretches), maps none of them, and
    leaves the store's queues unloaded."""
    if chunk is not None:
        monkeypatch.setattr(verify_module, "CHUNK_RECORDS", chunk)
    queues = 3000
    reads = FileReads()
    with MessageStore(stores[queues], CONFIG, read_only=True) as store:
        store.work.reset()
        reads.install(monkeypatch.setattr)
        report = verify(store)
        assert report.ok, [str(p) for p in report.problems[:5]]
        assert (report.queues, report.units) == (queues, queues * PER_QUEUE)
        assert store.index is not None
        # Only CommitLog segments and IndexFiles are mapped.
        assert store.work.mapped <= len(store.commitlog.segments.files) + len(store.index.files)
        assert store.work.queues_loaded == 0 and store.work.queues_listed == queues
        assert not any(cq.loaded for cq in store.queues.values())
    assert reads.calls == queues
    assert reads.bytes <= queues * 2 * PAGE  # not 6,000,000 bytes a file


def test_memory_per_queue_is_a_small_record(stores: dict[int, Path]) -> None:
    """2,000 queues more cost a scan a few KiB each at most (their listing and record), not a
    per-unit array the size of their files' capacity (300,000 bytes a queue)."""
    peaks = {}
    for queues, path in stores.items():
        with MessageStore(path, CONFIG, read_only=True) as store:
            tracemalloc.start()
            try:
                base = tracemalloc.get_traced_memory()[0]
                assert verify(store).ok
                peaks[queues] = tracemalloc.get_traced_memory()[1] - base
            finally:
                tracemalloc.stop()
    per_queue = (peaks[3000] - peaks[1000]) / 2000
    assert per_queue < 6 * 1024, peaks


def model(units: np.ndarray, length: int, per_file: int) -> tuple[int, int, bool]:
    """The first look at one queue of one file, unit by unit: (first real unit, last valid
    unit, whether anything is to be reported), as the rules say. ``units`` are those the file
    holds; past them, up to ``min(per_file, length)``, it holds zeros."""
    n = min(per_file, length)
    full = [tuple(int(x) for x in u) for u in units.tolist()] + [(0, 0, 0)] * (n - len(units))
    real = [i for i, (_, size, _) in enumerate(full) if size != PRE_BLANK_SIZE]
    lead = real[0] if real else length
    valid = [i for i, (offset, size, _) in enumerate(full) if offset >= 0 and size > 0]
    last = max(valid[-1] if valid else -1, lead - 1)
    holes = any(not (o >= 0 and s > 0) for o, s, _ in full[max(lead, 0) : last + 1])
    garbage = any(u != (0, 0, 0) for u in full[max(lead, last + 1, 0) :])
    return lead, last, holes or garbage


unit = st.tuples(
    st.sampled_from([0, -1, 5, 100, 200, 300, 1 << 40]),
    st.sampled_from([0, -3, 20, PRE_BLANK_SIZE]),
    st.sampled_from([0, 7]),
)


@settings(max_examples=300, deadline=None)
@given(
    queues=st.lists(
        st.tuples(st.lists(unit, max_size=12), st.integers(0, 16), st.integers(1, 16)),
        min_size=1,
        max_size=6,
    )
)
def test_first_look_at_a_batch_is_the_first_look_at_each_queue(
    queues: list[tuple[list[tuple[int, int, int]], int, int]],
) -> None:
    """All at once, queue by queue the same: the first real unit, the last valid one, and
    whether the queue has a hole or garbage after its end (it is then looked at again, one by
    one, to report it)."""
    arrays = []
    for units, length, per_file in queues:
        held = units[: min(per_file, length)]
        a = np.zeros(len(held), dtype=UNIT_DTYPE)
        if held:
            a["offset"], a["size"], a["tags_code"] = zip(*held, strict=True)
        arrays.append(a)
    looked = first_look(
        np.concatenate(arrays) if arrays else np.zeros(0, dtype=UNIT_DTYPE),
        np.array([len(a) for a in arrays], dtype=np.int64),
        np.array([length for _, length, _ in queues], dtype=np.int64),
        np.array([per_file for _, _, per_file in queues], dtype=np.int64),
        base0=0,
        log_end=1 << 50,
    )
    for i, (a, (_, length, per_file)) in enumerate(zip(arrays, queues, strict=True)):
        lead, last, trouble = model(a, length, per_file)
        if trouble:
            assert not looked.clean[i]
            continue
        assert looked.clean[i]
        assert (int(looked.lead[i]), int(looked.last[i])) == (lead, last)
        checked = [
            int(o)
            for o, s in list(zip(a["offset"].tolist(), a["size"].tolist(), strict=True))[
                max(lead, 0) : last + 1
            ]
            if o >= 0 and s > 0
        ]
        assert int(looked.min_off[i]) == (min(checked) if checked else 1)
        assert int(looked.max_off[i]) == (max(checked) if checked else 0)
        assert bool(looked.ascending[i]) == (checked == sorted(checked))
