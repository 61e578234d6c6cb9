"""Offset planning and options of the Spark source, without Spark: the pure planning functions
against a plain model (hypothesis), the JSON forms, and every bad option's error."""

from __future__ import annotations

import itertools
import json
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import ConfigError, DataLossError, StoreError
from rocketstore.pipeline.files.topicconfig import ensure_topics
from rocketstore.pipeline.format.message import Message
from rocketstore.source import offsets, options
from rocketstore.source.brokerview import QueueBounds
from rocketstore.source.offsets import OffsetSpec, QueueKey
from rocketstore.source.planning import (
    Limit,
    Planner,
    QueueRange,
    apportion,
    next_offsets,
    pack_ranges,
    split_ranges,
)
from tests.kit.sourcekit import SMALL, make_root

# -- apportion and split ---------------------------------------------------------------------------


@given(
    weights=st.dictionaries(st.integers(0, 20), st.integers(0, 10_000), min_size=1, max_size=12),
    budget=st.integers(0, 50_000),
)
def test_apportion_is_proportional_and_exact(weights: dict[int, int], budget: int) -> None:
    shares = apportion(weights, budget, lambda k: k)
    total = sum(weights.values())
    assert set(shares) == set(weights)
    assert sum(shares.values()) == min(budget, total)
    for k, w in weights.items():
        assert 0 <= shares[k] <= w
        if budget < total:
            exact = Fraction(budget * w, total)
            assert abs(shares[k] - exact) < 1


def test_apportion_breaks_ties_by_order() -> None:
    assert apportion({"a": 1, "b": 1, "c": 1}, 2, lambda k: k) == {"a": 1, "b": 1, "c": 0}
    assert apportion({"a": 1, "b": 1, "c": 1}, 2, lambda k: -ord(k)) == {"a": 0, "b": 1, "c": 1}


def _range(qid: int, start: int, end: int) -> QueueRange:
    return QueueRange("t", "broker-0", "/x", qid, start, end)


@given(
    sizes=st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 500)), min_size=1, max_size=8),
    min_partitions=st.one_of(st.none(), st.integers(1, 40)),
)
def test_split_ranges_covers_each_range_in_order(
    sizes: list[tuple[int, int]], min_partitions: int | None
) -> None:
    ranges = [_range(q, start, start + n) for q, (start, n) in enumerate(sizes)]
    parts = split_ranges(ranges, min_partitions)
    total = sum(n for _, n in sizes)
    if min_partitions is None or len(ranges) >= min_partitions:
        assert parts == ranges
    else:
        assert len(parts) == min(min_partitions, total)
    for r in ranges:
        mine = [p for p in parts if p.queue_id == r.queue_id]
        assert all(p.count > 0 for p in mine)
        assert [p.start for p in mine] == sorted(p.start for p in mine)
        assert mine[0].start == r.start and mine[-1].end == r.end
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))
        assert max(p.count for p in mine) - min(p.count for p in mine) <= 1


@given(
    sizes=st.lists(st.integers(1, 400), max_size=20),
    target=st.integers(1, 600),
    min_partitions=st.one_of(st.none(), st.integers(1, 5)),
)
def test_pack_ranges_against_a_model(
    sizes: list[int], target: int, min_partitions: int | None
) -> None:
    ranges = [_range(q, 0, n) for q, n in enumerate(sizes)]
    groups = pack_ranges(ranges, min_partitions, target)
    if min_partitions:
        assert groups == [(r,) for r in ranges]
        return
    # Model: walk the ranges; a big one is alone, small ones gather until they reach target.
    expected: list[tuple[QueueRange, ...]] = []
    pending: list[QueueRange] = []
    for r in ranges:
        if r.count >= target:
            expected.append((r,))
        else:
            pending.append(r)
            if sum(p.count for p in pending) >= target:
                expected.append(tuple(pending))
                pending = []
    if pending:
        expected.append(tuple(pending))
    assert groups == expected
    assert sorted(r.queue_id for g in groups for r in g) == list(range(len(sizes)))
    assert all(sum(r.count for r in g) >= target for g in groups[:-1] if len(g) > 1)


def test_a_small_micro_batch_is_one_partition_a_backlog_one_per_queue() -> None:
    small = [_range(q, 0, 1_250) for q in range(8)]  # 10K messages over 8 queues
    assert pack_ranges(small, None) == [tuple(small)]
    big = [_range(q, 0, 300_000) for q in range(8)]
    assert pack_ranges(big, None) == [(r,) for r in big]


# -- next_offsets against a model ---------------------------------------------------------------


@st.composite
def queue_states(draw: st.DrawFn) -> tuple[dict[QueueKey, QueueBounds], dict[QueueKey, int]]:
    n = draw(st.integers(1, 6))
    bounds: dict[QueueKey, QueueBounds] = {}
    start: dict[QueueKey, int] = {}
    for i in range(n):
        key = ("t", f"broker-{i % 3}", i)
        lo = draw(st.integers(0, 50))
        hi = lo + draw(st.integers(0, 300))
        bounds[key] = QueueBounds(lo, hi)
        choice = draw(st.sampled_from(["absent", "behind", "inside", "ahead"]))
        if choice == "behind" and lo > 0:
            start[key] = draw(st.integers(0, lo - 1))
        elif choice == "inside":
            start[key] = draw(st.integers(lo, hi))
        elif choice == "ahead":
            start[key] = hi + draw(st.integers(1, 20))
    # A queue the query knew that no longer exists keeps its offset.
    if draw(st.booleans()):
        start[("t", "broker-9", 0)] = 7
    return bounds, start


@settings(max_examples=300)
@given(
    state=queue_states(),
    max_rows=st.one_of(st.none(), st.integers(1, 400)),
    all_available=st.booleans(),
    with_target=st.booleans(),
)
def test_next_offsets_matches_the_model(
    state: tuple[dict[QueueKey, QueueBounds], dict[QueueKey, int]],
    max_rows: int | None,
    all_available: bool,
    with_target: bool,
) -> None:
    bounds, start = state
    target = (
        {q: (b.min + b.max) // 2 for q, b in list(bounds.items())[:-1]} if with_target else None
    )
    step = next_offsets(
        start, bounds, Limit(max_rows=max_rows, all_available=all_available), target=target
    )
    # The model: where each queue goes on from, and how much it may read.
    begin = {q: max(start.get(q, b.min), b.min) for q, b in bounds.items()}
    cap = {
        q: b.max if target is None else min(b.max, target.get(q, begin[q]))
        for q, b in bounds.items()
    }
    avail = {q: max(0, cap[q] - begin[q]) for q in bounds}
    total = sum(avail.values())
    read = {q: step.end.get(q, begin[q]) - begin[q] for q in bounds}
    assert sorted(x.key for x in step.losses) == sorted(
        q for q, s in start.items() if q in bounds and s < bounds[q].min
    )
    assert all(x.start == start[x.key] and x.now_min == bounds[x.key].min for x in step.losses)
    limited = max_rows is not None and not all_available and total > max_rows
    assert sum(read.values()) == (max_rows if limited else total)
    for q in bounds:
        assert 0 <= read[q] <= avail[q]
        if limited:
            assert max_rows is not None
            assert abs(read[q] - Fraction(max_rows * avail[q], total)) < 1
    # Every known queue keeps an entry; new ones appear once they are read; none go backwards.
    assert set(start) <= set(step.end)
    assert set(step.end) - set(start) == {q for q in bounds if q not in start and read[q] > 0}
    for q, s in start.items():
        assert step.end[q] >= s


def test_min_rows_waits_until_enough_or_the_delay_passed() -> None:
    q = ("t", "broker-0", 0)
    bounds = {q: QueueBounds(0, 5)}
    start = {q: 0}
    waiting = next_offsets(start, bounds, Limit(min_rows=10), may_wait=True)
    assert waiting.end == start
    assert next_offsets(start, bounds, Limit(min_rows=10), may_wait=False).end == {q: 5}
    assert next_offsets(start, bounds, Limit(min_rows=5), may_wait=True).end == {q: 5}
    # availableNow never waits: the query must reach its target and stop.
    assert next_offsets(start, bounds, Limit(min_rows=10), may_wait=True, target={q: 5}).end == {
        q: 5
    }
    assert next_offsets(
        start, bounds, Limit(all_available=True), default_min=10, may_wait=True
    ).end == {q: 5}


def test_planner_min_messages_with_trigger_delay(tmp_path: Path) -> None:
    make_root(tmp_path, "orders", brokers=1, queues=1, count=3)
    now = [0]
    opts = options.parse(
        {
            "path": str(tmp_path),
            "topic": "orders",
            "minMessagesPerTrigger": "5",
            "maxTriggerDelay": "2s",
            "startingOffsets": "earliest",
        },
        streaming=True,
    )
    planner = Planner(opts, clock_ms=lambda: now[0])
    start = planner.initial_offsets()
    q = ("orders", "broker-0", 0)
    assert start == {q: 0}
    now[0] = 1999
    assert planner.next_end(start, Limit(min_rows=5)) == start
    now[0] = 2000
    assert planner.next_end(start, Limit(min_rows=5)) == {q: 3}
    # The delay counts from the last batch that read something.
    now[0] = 2500
    assert planner.next_end({q: 3}, Limit(min_rows=5)) == {q: 3}


def test_planner_reports_data_loss_by_queue(tmp_path: Path) -> None:
    make_root(tmp_path, "orders", brokers=1, queues=2, count=10)
    planner = Planner(options.parse({"path": str(tmp_path), "topic": "orders"}, streaming=True))
    bounds = {
        ("orders", "broker-0", 0): QueueBounds(4, 5),
        ("orders", "broker-0", 1): QueueBounds(0, 5),
    }
    step = next_offsets({("orders", "broker-0", 0): 1}, bounds, Limit())
    with pytest.raises(DataLossError) as err:
        planner._report(step.losses)
    text = str(err.value)
    assert "orders/broker-0/0: offsets [1, 4), 3 messages" in text
    assert "failOnDataLoss=false" in text


# -- offsets JSON ---------------------------------------------------------------------------------


def test_offsets_json_round_trip_in_a_fixed_order() -> None:
    given_ = {("b", "broker-10", 2): 5, ("a", "broker-2", 10): 1, ("a", "broker-2", 3): 0}
    data = offsets.to_json(given_)
    assert list(data) == ["a", "b"]
    assert list(data["a"]["broker-2"]) == ["3", "10"]
    assert offsets.from_json(json.loads(json.dumps(data))) == given_
    assert offsets.dumps(given_) == offsets.dumps(dict(reversed(list(given_.items()))))


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("{not json", "not valid JSON"),
        ('["orders"]', "expected a JSON object of topics"),
        ('{"orders": 3}', "must map to an object of brokers"),
        ('{"orders": {"broker-0": {"x": 1}}}', "is not a number"),
        ('{"orders": {"broker-0": {"0": "1"}}}', "must be an integer"),
        ('{"orders": {"broker-0": {"0": -3}}}', "out of range"),
        ('{"other": {"broker-0": {"0": 1}}}', "topic 'other' is not one the query reads"),
    ],
)
def test_bad_offsets_json(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        offsets.parse_option("startingOffsets", text, ["orders"])
    assert "startingOffsets" in str(err.value)
    assert fragment in str(err.value)
    accepted = (
        "earliest, latest or a JSON object" if "other" not in text else "option topic: orders"
    )
    assert accepted in str(err.value)


def test_checkpointed_offsets_that_are_not_offsets_fail() -> None:
    with pytest.raises(StoreError, match="start offset: expected a JSON object"):
        offsets.from_json([1, 2], "start offset")


# -- options --------------------------------------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path) -> Path:
    make_root(tmp_path, "orders", brokers=1, queues=1, count=2)
    return tmp_path


@pytest.mark.parametrize(
    "extra, streaming, fragment",
    [
        ({"topic": "nope"}, True, "option topic: 'nope' not found"),
        ({"topic": ""}, True, "option topic is required"),
        ({"topic": "bad topic!"}, True, "is not a topic name"),
        ({"startingOffsets": "first"}, True, "option startingOffsets='first': not valid JSON"),
        (
            {"maxMessagesPerTrigger": "-5"},
            True,
            "option maxMessagesPerTrigger='-5': expected a positive",
        ),
        ({"maxMessagesPerTrigger": "ten"}, True, "option maxMessagesPerTrigger='ten'"),
        ({"minMessagesPerTrigger": "0"}, True, "option minMessagesPerTrigger='0'"),
        (
            {"minMessagesPerTrigger": "9", "maxMessagesPerTrigger": "3"},
            True,
            "option minMessagesPerTrigger=9 is above maxMessagesPerTrigger=3",
        ),
        ({"maxTriggerDelay": "soon"}, True, "option maxTriggerDelay='soon': expected a duration"),
        ({"minPartitions": "0"}, False, "option minPartitions='0'"),
        (
            {"failOnDataLoss": "maybe"},
            True,
            "option failOnDataLoss='maybe': expected true or false",
        ),
        (
            {"bodyFormat": "xml"},
            True,
            "option bodyFormat='xml': expected one of binary, avro, json",
        ),
        ({"startingTimestamp": "-1"}, True, "option startingTimestamp='-1'"),
        ({"startingOffsetsByTimestamp": "{}x"}, True, "option startingOffsetsByTimestamp"),
        ({"endingOffsets": "latest"}, True, "option endingOffsets is only for batch reads"),
        ({"key": "k1"}, True, "option key is only for batch reads"),
        (
            {"maxMessagesPerTrigger": "5"},
            False,
            "option maxMessagesPerTrigger is only for streaming",
        ),
        ({"endingOffsets": "earliest"}, False, "option endingOffsets=earliest: not allowed"),
        (
            {"endingOffsets": '{"orders": {"broker-0": {"0": -2}}}'},
            False,
            "-2 (earliest) is not allowed",
        ),
        ({"startTimestamp": "5"}, False, "need option key"),
        ({"key": "k", "startingOffsets": "earliest"}, False, "option key cannot be combined"),
        (
            {"key": "k", "startTimestamp": "9", "endTimestamp": "3"},
            False,
            "startTimestamp=9 is after",
        ),
        ({"config": "/no/such.toml"}, False, "option config='/no/such.toml': no such file"),
    ],
)
def test_bad_options_name_the_option(
    root: Path, extra: dict[str, str], streaming: bool, fragment: str
) -> None:
    opts = {"path": str(root), "topic": "orders", **extra}
    with pytest.raises(ConfigError) as err:
        options.parse(opts, streaming=streaming)
    assert fragment in str(err.value)


def test_a_path_that_is_not_a_store(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"option path=.*no such directory"):
        options.parse({"path": str(tmp_path / "nothing"), "topic": "t"}, streaming=True)
    (tmp_path / "junk").mkdir()
    with pytest.raises(ConfigError, match=r"option path=.*not a store root.*expected a store root"):
        options.parse({"path": str(tmp_path / "junk"), "topic": "t"}, streaming=True)
    with pytest.raises(ConfigError, match="option path is required"):
        options.parse({"topic": "t"}, streaming=True)


def test_a_topic_a_broker_serves_is_known_before_its_first_message(tmp_path: Path) -> None:
    """A topic created on a stock broker is in the directory's config/topics.json before any
    message of it is: a stream may start on it. A damaged topics.json only hides its topics."""
    store = tmp_path / "broker-a"
    with MessageStore(store, SMALL) as writer:
        writer.put(Message("orders", b"x"))
    opts = {"path": str(store), "topic": "created"}
    with pytest.raises(ConfigError, match="option topic: 'created' not found"):
        options.parse(opts, streaming=True)
    ensure_topics(store / "config", {"created": 4})
    assert options.parse(opts, streaming=True).topics == ("created",)
    (store / "config" / "topics.json").write_text("{")
    with pytest.raises(ConfigError, match="option topic: 'created' not found"):
        options.parse(opts, streaming=True)


def test_options_are_case_insensitive_and_defaults_follow_kafka(root: Path) -> None:
    opts = options.parse(
        {"PATH": str(root), "Topic": " orders , orders", "MAXMESSAGESPERTRIGGER": "7"},
        streaming=True,
    )
    assert opts.topics == ("orders",)
    assert opts.max_per_trigger == 7
    assert opts.starting == OffsetSpec("latest")
    assert opts.fail_on_data_loss is True
    assert opts.max_trigger_delay_ms == 15 * 60 * 1000
    batch = options.parse({"path": str(root), "topic": "orders"}, streaming=False)
    assert batch.starting == OffsetSpec("earliest") and batch.ending == OffsetSpec("latest")
    assert options.parse_duration_ms("d", "250ms") == 250
    assert options.parse_duration_ms("d", "3m") == 180_000
    # Kafka's precedence: by-timestamp, then timestamp, then offsets.
    both = options.parse(
        {
            "path": str(root),
            "topic": "orders",
            "startingOffsets": "earliest",
            "startingTimestamp": "5",
        },
        streaming=True,
    )
    assert both.starting == OffsetSpec("timestamp", timestamp=5)
