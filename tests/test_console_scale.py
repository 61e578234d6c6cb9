"""The console's overview of a broker of thousands of queues: bounded work, counted.

A broker of more than :data:`overview.WIDE_QUEUES` queues is drawn from each queue's first and
last units, which its bounds are read with: no queue is loaded, no other unit read, and the
store times of those units are read all at once. The counts stay exact, the time spans too (a
queue's first and last messages are its oldest and newest), and the last hour's rate adds up
to the messages written in it; the topics are listed 500 a page.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kit.manyqueues import QUICK, build

pytest.importorskip("starlette", reason="the console needs the 'console' extra")
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

from rocketstore.pipeline.console import overview, rates, views
from rocketstore.pipeline.console.app import TOPICS_PAGE, create_app
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.files.consumequeue.queue import ConsumeQueue

CONFIG = QUICK
TOPICS = 600  # 2,400 queues
PER_QUEUE = 3


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("console") / "store", TOPICS, PER_QUEUE, CONFIG)


def store_times(path: Path) -> list[int]:
    """The store time of every message (the reference)."""
    with MessageStore(path, CONFIG, read_only=True) as s:
        log = s.commitlog
        return [
            log.store_timestamp(phys, size)
            for w in log.walks(log.min_offset, check_crc=False)
            for phys, size in zip(w.phys.tolist(), w.sizes.tolist(), strict=True)
        ]


def test_overview_of_many_queues_reads_their_ends_only(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked = {"load": 0, "read": 0}
    load, read = ConsumeQueue._load, ConsumeQueue.read

    def counted_load(cq: ConsumeQueue, length: int | None) -> object:
        looked["load"] += 1
        return load(cq, length)

    def counted_read(cq: ConsumeQueue, start: int, count: int) -> object:
        looked["read"] += 1
        return read(cq, start, count)

    monkeypatch.setattr(ConsumeQueue, "_load", counted_load)
    monkeypatch.setattr(ConsumeQueue, "read", counted_read)
    data = overview.overview(views.Console(store, CONFIG))
    assert looked == {"load": 0, "read": 0}
    (broker,) = data.brokers
    times = store_times(store)
    assert (broker.queues, broker.messages) == (TOPICS * 4, len(times))
    assert (broker.oldest, broker.newest) == (min(times), max(times))
    assert len(data.topics) == TOPICS and {t.messages for t in data.topics} == {4 * PER_QUEUE}
    assert all(t.oldest is not None and t.sampled for t in data.topics)
    # Every message was written a moment ago: the hour holds them all.
    assert data.rate_sampled and data.rate[0][1].sum() == pytest.approx(len(times))
    assert (data.size_sample, data.hour_sample) == (overview.WIDE_SAMPLE, overview.WIDE_SAMPLE)


def test_overview_lists_the_topics_a_page_at_a_time(store: Path) -> None:
    client = TestClient(create_app(views.Console(store, CONFIG)), base_url="http://127.0.0.1")
    first = client.get("/")
    assert first.status_code == 200
    rows = re.findall(r'<tr data-topic="([^"]+)">', first.text)
    assert rows == [f"T{i:05d}" for i in range(TOPICS_PAGE)]
    assert "Topics 1–500 of 600" in first.text and 'href="/?page=2"' in first.text
    rest = client.get("/?page=2")
    assert re.findall(r'<tr data-topic="([^"]+)">', rest.text) == [
        f"T{i:05d}" for i in range(TOPICS_PAGE, TOPICS)
    ]
    assert 'href="/?page=1"' in rest.text and "page=3" not in rest.text
    # Past the last page: the last one; not a page number: refused.
    assert re.findall(r'<tr data-topic="([^"]+)">', client.get("/?page=9").text) == re.findall(
        r'<tr data-topic="([^"]+)">', rest.text
    )
    assert client.get("/?page=0").status_code == 400
    assert client.get("/?page=x").status_code == 400


@settings(max_examples=300, deadline=None)
@given(
    queues=st.lists(
        st.tuples(
            st.integers(0, 5),  # min offset
            st.integers(1, 40),  # units
            st.integers(-1, 400),  # store time of the first unit (-1: record deleted)
            st.integers(-1, 400),  # ... of the last
        ),
        min_size=1,
        max_size=8,
    ),
    start=st.integers(0, 300),
)
def test_rate_from_first_and_last_units_is_counts_of_that_sample(
    queues: list[tuple[int, int, int, int]], start: int
) -> None:
    """All queues at once, the same as :func:`rates.counts` of each queue's two-unit sample
    (its first and last units, those whose record is there), added up."""
    edges = np.arange(start, start + 200, 20, dtype=np.int64)
    expected = np.zeros(len(edges) - 1)
    for low, units, t_first, t_last in queues:
        offsets = [low] if units == 1 else [low, low + units - 1]
        stamps = [t_first] if units == 1 else [t_first, t_last]
        kept = [(o, t) for o, t in zip(offsets, stamps, strict=True) if t >= 0]
        sample = rates.QueueSample(
            np.array([o for o, _ in kept], dtype=np.int64),
            np.array([t for _, t in kept], dtype=np.int64),
            np.ones(len(kept), dtype=np.int64),
            units,
        )
        expected += rates.counts(sample, low, edges)
    low = np.array([q[0] for q in queues], dtype=np.int64)
    units = np.array([q[1] for q in queues], dtype=np.int64)
    got = rates.ends_counts(
        low,
        (low, low + units - 1),
        (
            np.array([q[2] for q in queues], dtype=np.int64),
            np.array([q[3] if q[1] > 1 else q[2] for q in queues], dtype=np.int64),
        ),
        units,
        edges,
    )
    assert got == pytest.approx(expected)
