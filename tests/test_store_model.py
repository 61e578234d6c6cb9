"""Property tests: the store against the in-memory model of ``model.py``.

* :class:`StoreMachine` drives one store through random puts (single and batched, as messages or
  Arrow tables, every transaction type, IPv4 and IPv6 hosts, UTF-8 keys, tags, properties and
  bodies), reads (pulls with tag filters, key queries with time ranges, look-ups by offset and
  msgId, offset by time), refused batches, read-only views and reopens, and checks every answer
  against the model. The geometry is tiny so that every file type rolls constantly: CommitLog
  segments of 8 KiB or 64 KiB, ConsumeQueue files of 7 units, index files of 8 entries over 7
  hash slots (so slot chains always mix keys, topics and files).
* The clock is injected and moves forward by a drawn step before every put, so store times are
  known exactly; ``offset_by_time`` is checked against the model's rule (see
  :meth:`model.StoreModel.offset_by_time`).
* Standalone tests cover refused input (nothing written, the right error, the right row), size
  boundaries (4 MiB bodies, 127-byte topics, 32767-byte properties) and key tokenisation.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from rocketstore.pipeline.config import ASYNC_FLUSH, SYNC_FLUSH, StoreConfig
from rocketstore.pipeline.engine.results import PutResult
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import (
    InvalidMessageError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
)
from rocketstore.pipeline.format.message import Message, messages_to_table
from tests.kit.files import snapshot
from tests.kit.model import StoreModel, java_hash, keys_text

MAX_TS = 2**63 - 1
INT32 = st.integers(-(2**31), 2**31 - 1)
MAX_BODY = 2048  # maxMessageSize of the state machine's stores
CQ_FILE_SIZE = 20 * 7
UNIQ_RE = re.compile(r"[0-9A-F]{32}")


def small_config(**overrides: object) -> StoreConfig:
    values: dict[str, object] = {
        "mapped_file_size_commitlog": 8192,
        "mapped_file_size_consume_queue": CQ_FILE_SIZE,
        "max_hash_slot_num": 7,
        "max_index_num": 9,
        "max_message_size": MAX_BODY,
    }
    values.update(overrides)
    return StoreConfig(**values)  # type: ignore[arg-type]


# Stores are created and synced thousands of times; on a RAM file system (when there is one)
# the syncs cost nothing and the suite stays fast.
TMP_BASE = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class Clock:
    """The store's clock: returns ``now``; the test moves it."""

    def __init__(self, start: int) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now


# -- strategies ---------------------------------------------------------------------------------

# What puts refuse inside keys, tags and properties: the two separators, and NUL, which
# readers take for a torn write's zeros.
RESERVED = "\x00\x01\x02"


def texts(min_size: int = 0, max_size: int = 10, exclude: str = "") -> st.SearchStrategy[str]:
    """Any UTF-8 encodable text without the characters properties reserve."""
    return st.text(
        st.characters(codec="utf-8", exclude_characters=RESERVED + exclude),
        min_size=min_size,
        max_size=max_size,
    )


TOPIC_CHARS = "%|abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
TOPIC_POOL = ["TopicA", "TopicB", "%RETRY%g|x_-1", "T" * 127]
# "Aa" and "BB" have the same Java hash: equal tag codes and equal index key hashes.
KEY_POOL = ["k1", "k2", "ключ", "鍵", "😀", "a#b", "UNIQ-1", "Aa", "BB"]
TAG_POOL = ["TagA", "TagB", "標籤", "😀x", "a b", "x||y", " padded ", "Aa", "BB"]
UNIQ_POOL = ["UNIQ-1", "UNIQ-2", "k1", "id with space"]

random_topics = st.text(st.sampled_from(TOPIC_CHARS), min_size=1, max_size=127)
topics = st.one_of(*[st.sampled_from(TOPIC_POOL)] * 4, random_topics)
key_tokens = st.one_of(st.sampled_from(KEY_POOL), texts(1, 8, exclude=" "))
key_lists = st.lists(
    st.one_of(key_tokens, st.tuples(key_tokens, key_tokens).map(" ".join), st.just("")),
    max_size=4,
)
keys = st.one_of(
    st.none(),
    key_lists,
    key_lists.map(lambda ks: "  ".join(ks) + " "),  # the space-separated string form
)
tags = st.one_of(st.none(), st.just(""), st.sampled_from(TAG_POOL), texts(1, 8))
reserved = {"KEYS", "TAGS", "UNIQ_KEY"}
user_properties = st.one_of(
    st.none(),
    st.dictionaries(texts(1, 8).filter(lambda n: n not in reserved), texts(0, 10), max_size=3),
)
uniq_keys = st.one_of(*[st.none()] * 3, st.just(""), st.sampled_from(UNIQ_POOL), texts(1, 12))


def seeded_bytes(low: int, high: int) -> st.SearchStrategy[bytes]:
    """Random bytes of a drawn length, cheap for Hypothesis to generate (a seed, not bytes)."""
    return st.builds(
        lambda n, seed: random.Random(seed).randbytes(n), st.integers(low, high), st.integers()
    )


bodies = st.one_of(
    st.binary(max_size=40),
    texts(0, 20).map(str.encode),
    seeded_bytes(0, 700),
    seeded_bytes(MAX_BODY - 8, MAX_BODY),
)
ports = st.integers(0, 2**31 - 1)
born_hosts = st.one_of(
    st.none(),
    st.tuples(st.ip_addresses(v=4), ports).map(lambda h: f"{h[0]}:{h[1]}"),
    st.tuples(st.ip_addresses(v=6), ports, st.booleans()).map(
        lambda h: f"[{h[0].exploded if h[2] else h[0].compressed}]:{h[1]}"
    ),
)
messages = st.builds(
    Message,
    topic=topics,
    body=bodies,
    queue_id=st.sampled_from([0, 0, 1, 2, 2**31 - 1]),
    keys=keys,
    tags=tags,
    properties=user_properties,
    flag=INT32,
    sys_flag=st.sampled_from([0, 0, 0, 0x4, 0x8, 0xC]),
    born_timestamp=st.one_of(st.none(), st.integers(-(2**63), MAX_TS)),
    born_host=born_hosts,
    reconsume_times=INT32,
    prepared_transaction_offset=st.integers(-(2**63), 2**63 - 1),
    uniq_key=uniq_keys,
)
# Plain messages that cost Hypothesis few choices each, to grow stores past many file rolls.
plain_messages = st.builds(
    Message,
    topic=st.sampled_from(TOPIC_POOL[:3]),
    body=seeded_bytes(0, MAX_BODY),
    queue_id=st.sampled_from([0, 1]),
    keys=st.sampled_from([None, ["k1"], ["k2", "ключ"], "鍵 k1", ["Aa"], ["BB"]]),
    tags=st.sampled_from([None, "TagA", "TagB", "標籤", "Aa", "BB"]),
    sys_flag=st.sampled_from([0, 0, 0, 0x4, 0x8, 0xC]),
    uniq_key=st.sampled_from([None, None, None, "UNIQ-1"]),
)
clock_steps = st.one_of(st.integers(1, 3000), st.just(600_000))


def as_payload(batch: list[Message], form: str) -> list[Message] | pa.Table | pa.RecordBatch:
    """The same batch as a message list, an Arrow table (also sliced, or in two chunks) or a
    record batch (bodies as UTF-8 strings and keys as one space-separated string where that
    round-trips)."""
    if form == "list":
        return batch
    if form == "sliced":
        # Columns whose arrays start at a non-zero offset into their buffers.
        junk = Message("Junk", b"junk" * 300, keys=["junk"], tags="junk", properties={"j": "j"})
        return messages_to_table([junk, *batch, junk]).slice(1, len(batch))
    if form == "chunked":
        half = len(batch) // 2
        return pa.concat_tables([messages_to_table(batch[:half]), messages_to_table(batch[half:])])
    table = messages_to_table(batch)
    if form == "strings":
        idx = table.column_names.index("keys")
        joined = [None if m.keys is None else keys_text(m.keys) for m in batch]
        table = table.set_column(idx, "keys", pa.array(joined, pa.string()))
        try:
            text = [m.body.decode("utf-8") for m in batch]
        except UnicodeDecodeError:
            pass
        else:
            idx = table.column_names.index("body")
            table = table.set_column(idx, "body", pa.array(text, pa.string()))
    if form == "record_batch" and table.num_rows:
        return table.combine_chunks().to_batches()[0]
    return table


# -- checks shared by the machine and the standalone tests ----------------------------------------


def check_put(
    model: StoreModel, batch: list[Message], results: list[PutResult], now: int, generated: set[str]
) -> None:
    """Record a successful put in the model and compare the store's answer with it."""
    assert len(results) == len(batch)
    uniq = []
    for m, r in zip(batch, results, strict=True):
        if m.uniq_key:
            assert r.uniq_key == m.uniq_key
        else:
            assert UNIQ_RE.fullmatch(r.uniq_key), r.uniq_key
            assert r.uniq_key not in generated
            generated.add(r.uniq_key)
        uniq.append(r.uniq_key)
    stored = model.put_batch(batch, now, uniq)
    expected = [
        PutResult(
            "PUT_OK",
            s.ext.msg_id,
            s.ext.commit_log_offset,
            s.ext.queue_offset,
            s.ext.store_size,
            now,
            s.ext.uniq_key or "",
        )
        for s in stored
    ]
    assert results == expected


def check_bounds(
    store: MessageStore, model: StoreModel, checked: dict[tuple[str, int], int] | None = None
) -> None:
    """Queue bounds and units equal the model's, and every unit points at a record of its own
    topic and queue at its own queue offset. ``checked`` remembers how many units of each queue
    were already followed to their record, so a step only follows the new ones."""
    assert store.min_phy_offset == 0
    assert store.max_phy_offset == model.end
    infos = [
        (i.topic, i.queue_id, i.min_offset, i.max_offset, i.max_physic_offset)
        for i in store.queue_infos()
    ]
    assert infos == model.queue_infos()
    checked = {} if checked is None else checked
    for topic, queue_id, lo, hi, _ in infos:
        assert store.min_offset(topic, queue_id) == lo
        assert store.max_offset(topic, queue_id) == hi
        units = store.read_units(topic, queue_id, 0, hi + 5)
        got = [(int(u["offset"]), int(u["size"]), int(u["tags_code"])) for u in units]
        want = [(u.offset, u.size, u.tags_code) for u in model.units(topic, queue_id)]
        assert got == want, (topic, queue_id)
        start = checked.get((topic, queue_id), 0)
        for qoff, (phys, size, _) in enumerate(got[start:], start):
            m = store.get_message(phys)
            assert (m.topic, m.queue_id, m.queue_offset, m.store_size) == (
                topic,
                queue_id,
                qoff,
                size,
            )
        checked[(topic, queue_id)] = len(got)


def check_message(store: MessageStore, model: StoreModel, phys: int) -> None:
    want = model.by_phys[phys].ext
    got = store.get_message(phys)
    assert got == want
    assert list(got.properties.items()) == list(want.properties.items())
    assert store.get_by_msg_id(want.msg_id) == want
    assert store.get_by_msg_id(want.msg_id.lower()) == want


def check_query(
    store: MessageStore,
    model: StoreModel,
    topic: str,
    key: str,
    begin: int = 0,
    end: int = MAX_TS,
    max_count: int | None = None,
) -> None:
    if not model.index_enabled:
        with pytest.raises(InvalidMessageError):
            store.query_by_key(topic, key, begin=begin, end=end, max_count=max_count)
        return
    got = store.query_by_key(topic, key, begin=begin, end=end, max_count=max_count)
    want = model.query_by_key(topic, key, begin, end, max_count)
    assert [m.commit_log_offset for m in got] == [m.commit_log_offset for m in want], (
        topic,
        key,
        begin,
        end,
        max_count,
    )
    assert got == want


def check_time(store: MessageStore, model: StoreModel, topic: str, queue_id: int, ts: int) -> None:
    got = store.offset_by_time(topic, queue_id, ts)
    allowed = model.offset_by_time(topic, queue_id, ts)
    assert got in allowed, (topic, queue_id, ts, got, allowed)


def audit(store: MessageStore, model: StoreModel) -> None:
    """Compare everything the store can answer with the model."""
    check_bounds(store, model)
    for s in model.messages:
        check_message(store, model, s.ext.commit_log_offset)
    for (topic, queue_id), queue in model.queues.items():
        got = store.get_messages(topic, queue_id, 0, len(queue) + 1, "*")
        assert got.status == "FOUND"
        assert got.messages == [s.ext for s in queue]
        assert got.next_begin_offset == len(queue)
        times = sorted({s.ext.store_timestamp for s in queue})
        for ts in {0, times[0] - 1, times[-1] + 1, MAX_TS}:
            check_time(store, model, topic, queue_id, ts)
        for t in times:
            for ts in (t - 1, t, t + 1):
                check_time(store, model, topic, queue_id, ts)
    for topic, key in sorted(model.all_keys()):
        check_query(store, model, topic, key)
    with pytest.raises(OffsetOutOfRangeError):
        store.get_message(model.end)
    with pytest.raises(OffsetOutOfRangeError):
        store.get_message(-1)


# -- the state machine ---------------------------------------------------------------------------

INVALID_KINDS = [
    "body_too_large",
    "empty_topic",
    "topic_128",
    "topic_bad_char",
    "properties_too_long",
    "property_name_separator",
    "property_value_separator",
    "property_name_empty",
    "key_separator",
    "tag_separator",
    "uniq_key_separator",
    "negative_queue",
    "bad_sys_flag",
    "bad_born_host",
]


@st.composite
def invalid_messages(draw: st.DrawFn, kind: str, max_body: int) -> Message:
    base = draw(messages)
    cut = draw(st.integers(0, 3))
    # A text with a reserved character somewhere in it.
    sep = draw(st.builds("{}{}{}".format, texts(0, 3), st.sampled_from(RESERVED), texts(0, 3)))
    match kind:
        case "body_too_large":
            n = draw(st.integers(max_body + 1, max_body + 64))
            return Message(base.topic, b"b" * n, base.queue_id)
        case "empty_topic":
            return Message("", base.body)
        case "topic_128":
            return Message(draw(st.text(st.sampled_from(TOPIC_CHARS), min_size=128)), base.body)
        case "topic_bad_char":
            bad = draw(st.characters(codec="utf-8").filter(lambda c: c not in TOPIC_CHARS))
            return Message(base.topic[:cut] + bad + base.topic[cut:126], base.body)
        case "properties_too_long":
            value = draw(st.sampled_from(["v", "é", "😀"])) * 33000
            return Message(base.topic, base.body, properties={"p": value[:32768]})
        case "property_name_separator":
            return Message(base.topic, base.body, properties={"ok": "v", sep: "v"})
        case "property_value_separator":
            return Message(base.topic, base.body, properties={"ok": "v", "n": sep})
        case "property_name_empty":
            return Message(base.topic, base.body, properties={"ok": "v", "": "v"})
        case "key_separator":
            return Message(base.topic, base.body, keys=["k", sep])
        case "tag_separator":
            return Message(base.topic, base.body, tags=sep)
        case "uniq_key_separator":
            return Message(base.topic, base.body, uniq_key=sep)
        case "negative_queue":
            return Message(base.topic, base.body, queue_id=draw(st.integers(-(2**31), -1)))
        case "bad_sys_flag":
            bit = draw(st.sampled_from([0x1, 0x2, 0x10, 0x20, 0x100, 1 << 30]))
            return Message(base.topic, base.body, sys_flag=bit | base.sys_flag)
        case "bad_born_host":
            host = draw(
                st.sampled_from(
                    [
                        "nohost",
                        "1.2.3.4",
                        "[::1]5",
                        "1.2.3.4:-1",
                        "256.1.1.1:80",
                        "[::1]:x",
                        "1.2.3.4:2147483648",
                        "",
                        "[1::2::3]:80",
                    ]
                )
            )
            return Message(base.topic, base.body, born_host=host)
    raise AssertionError(kind)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory(prefix="store-model-", dir=TMP_BASE)
        self.path = Path(self._tmp.name) / "store"
        self.store: MessageStore | None = None
        self.generated: set[str] = set()
        self.checked: dict[tuple[str, int], int] = {}

    @initialize(
        segment=st.sampled_from([8192, 64 * 1024]),
        host=st.sampled_from(["127.0.0.1", "10.0.0.7", "fe80::1", "2001:db8::42"]),
        port=st.sampled_from([10911, 1, 65535]),
        cap=st.sampled_from([3, 64]),
        flush=st.sampled_from([ASYNC_FLUSH, SYNC_FLUSH]),
        index=st.sampled_from([True, True, True, False]),
        start=st.sampled_from([1_700_000_000_000, 946_684_800_000, 1_706_745_599_000]),
    )
    def open_store(
        self, segment: int, host: str, port: int, cap: int, flush: str, index: bool, start: int
    ) -> None:
        self.config = small_config(
            mapped_file_size_commitlog=segment,
            broker_ip1=host,
            listen_port=port,
            max_msgs_num_batch=cap,
            flush_disk_type=flush,
            message_index_enable=index,
        )
        self.clock = Clock(start)
        self.model = StoreModel(
            segment_size=segment,
            cq_file_size=CQ_FILE_SIZE,
            store_ip=host,
            store_port=port,
            max_msgs_num_batch=cap,
            index_enabled=index,
        )
        self.store = MessageStore(self.path, self.config, clock_ms=self.clock)

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()
        self._tmp.cleanup()

    @property
    def s(self) -> MessageStore:
        assert self.store is not None
        return self.store

    # -- writes ---------------------------------------------------------------------------------
    @rule(message=messages, step=clock_steps)
    def put(self, message: Message, step: int) -> None:
        self.clock.now += step
        result = self.s.put(message)
        check_put(self.model, [message], [result], self.clock.now, self.generated)

    @rule(
        batch=st.lists(messages, max_size=12),
        form=st.sampled_from(["list", "table", "strings", "record_batch", "sliced", "chunked"]),
        step=clock_steps,
    )
    def put_batch(self, batch: list[Message], form: str, step: int) -> None:
        self.clock.now += step
        result = self.s.put_batch(as_payload(batch, form))
        assert len(result) == len(batch)
        assert result.store_timestamp == self.clock.now
        results = list(result.results())
        assert result.msg_ids() == [r.msg_id for r in results]
        assert result.uniq_keys.to_pylist() == [r.uniq_key for r in results]
        check_put(self.model, batch, results, self.clock.now, self.generated)

    @rule(
        batch=st.lists(plain_messages, min_size=10, max_size=40),
        form=st.sampled_from(["list", "sliced"]),
        step=clock_steps,
    )
    def put_bulk(self, batch: list[Message], form: str, step: int) -> None:
        self.clock.now += step
        result = self.s.put_batch(as_payload(batch, form))
        check_put(self.model, batch, list(result.results()), self.clock.now, self.generated)

    @rule(
        data=st.data(),
        kind=st.sampled_from(INVALID_KINDS),
        batch=st.lists(messages, max_size=4),
        step=clock_steps,
    )
    def put_invalid(self, data: st.DataObject, kind: str, batch: list[Message], step: int) -> None:
        self.clock.now += step
        bad = data.draw(invalid_messages(kind, MAX_BODY))
        at = data.draw(st.integers(0, len(batch)))
        batch.insert(at, bad)
        self.s.flush()  # leave the background flusher nothing to write during the refused put
        before = snapshot(self.path, skip={"lock"})
        error = MessageTooLargeError if kind == "body_too_large" else InvalidMessageError
        with pytest.raises(error):
            self.s.put_batch(
                as_payload(batch, data.draw(st.sampled_from(["list", "table", "sliced"])))
            )
        assert snapshot(self.path, skip={"lock"}) == before

    # -- reads ----------------------------------------------------------------------------------
    @rule(data=st.data())
    def get(self, data: st.DataObject) -> None:
        queues = [*sorted(self.model.queues), ("TopicA", 5), ("NoSuchTopic", 0)]
        topic, queue_id = data.draw(st.sampled_from(queues))
        size = len(self.model.queues.get((topic, queue_id), []))
        offset = data.draw(st.integers(-2, size + 2))
        max_count = data.draw(st.integers(1, 10))
        used = sorted({s.ext.tags for s in self.model.messages if s.ext.tags})
        tag = st.sampled_from(used + TAG_POOL)
        expression = data.draw(
            st.one_of(
                st.sampled_from(["*", "", " * ", None]),
                tag,
                st.lists(tag, min_size=1, max_size=3).map(" || ".join),
                st.lists(tag, min_size=1, max_size=3).map("||".join),
            )
        )
        got = self.s.get_messages(topic, queue_id, offset, max_count, expression)
        status, msgs, nxt, lo, hi = self.model.get(topic, queue_id, offset, max_count, expression)
        assert (got.status, got.next_begin_offset, got.min_offset, got.max_offset) == (
            status,
            nxt,
            lo,
            hi,
        )
        assert got.messages == msgs

    @rule(data=st.data())
    def query_key(self, data: st.DataObject) -> None:
        topic = data.draw(st.sampled_from([*self.model.topics(), *TOPIC_POOL, "NoSuchTopic"]))
        used = sorted(k for _, k in self.model.all_keys())
        key = data.draw(st.one_of(st.sampled_from(used + KEY_POOL + UNIQ_POOL), key_tokens))
        times = self.model.store_times() or [self.clock.now]
        moment = st.builds(
            lambda t, d: t + d,
            st.sampled_from(times),
            st.sampled_from([0, 0, -1, 1, -999, 999, -1000, 1000, -2500]),
        )
        begin, end = data.draw(
            st.one_of(
                st.just((0, MAX_TS)),
                st.tuples(moment, st.just(MAX_TS)),
                st.tuples(st.just(0), moment),
                st.tuples(moment, moment),
            )
        )
        max_count = data.draw(
            st.one_of(st.none(), st.integers(0, self.model.max_msgs_num_batch + 2))
        )
        check_query(self.s, self.model, topic, key, begin, end, max_count)

    @precondition(lambda self: self.model.messages)
    @rule(data=st.data())
    def look_up(self, data: st.DataObject) -> None:
        stored = data.draw(st.sampled_from(self.model.messages))
        check_message(self.s, self.model, stored.ext.commit_log_offset)
        # An id naming another store host is refused even though the offset exists.
        other = ("0A000001" if len(stored.ext.msg_id) == 32 else "00" * 16) + "00002A9F"
        forged = other + stored.ext.msg_id[-16:]
        if forged != stored.ext.msg_id:
            with pytest.raises(OffsetOutOfRangeError):
                self.s.get_by_msg_id(forged)

    @rule(data=st.data())
    def time_lookup(self, data: st.DataObject) -> None:
        queues = [*sorted(self.model.queues), ("NoSuchTopic", 0)]
        topic, queue_id = data.draw(st.sampled_from(queues))
        times = [s.ext.store_timestamp for s in self.model.queues.get((topic, queue_id), [])]
        ts = data.draw(
            st.one_of(
                st.integers(0, MAX_TS),
                st.builds(
                    lambda t, d: t + d,
                    st.sampled_from(times or [self.clock.now]),
                    st.integers(-3000, 3000),
                ),
            )
        )
        check_time(self.s, self.model, topic, queue_id, ts)

    # -- lifecycle ------------------------------------------------------------------------------
    @rule()
    def read_only_view(self) -> None:
        """A read-only open beside the writer sees exactly what the writer wrote, and writes
        nothing."""
        # The writer's background flusher rewrites the checkpoint and progress file when
        # there is something new to flush; flushing now leaves it nothing to do meanwhile.
        self.s.flush()
        before = snapshot(self.path, skip={"lock"})
        with MessageStore(self.path, self.config, read_only=True, clock_ms=self.clock) as view:
            audit(view, self.model)
        assert snapshot(self.path, skip={"lock"}) == before

    @rule()
    def reopen(self) -> None:
        self.s.close()
        self.store = None
        # A clean close followed by an open and a close changes no byte.
        closed = snapshot(self.path, skip={"lock"})
        MessageStore(self.path, self.config, clock_ms=self.clock).close()
        assert snapshot(self.path, skip={"lock"}) == closed
        self.store = MessageStore(self.path, self.config, clock_ms=self.clock)
        report = self.store.recovery
        assert not report.abort_file_found
        assert report.bytes_truncated == 0
        assert report.units_dropped == 0
        audit(self.s, self.model)

    @invariant()
    def bounds_match(self) -> None:
        if self.store is not None:
            check_bounds(self.store, self.model, self.checked)


StoreMachine.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=50,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestStoreMachine = StoreMachine.TestCase


# -- refused input -------------------------------------------------------------------------------


@contextlib.contextmanager
def opened(config: StoreConfig, clock: Clock | None = None) -> Iterator[MessageStore]:
    with tempfile.TemporaryDirectory(prefix="store-model-", dir=TMP_BASE) as tmp:
        store = MessageStore(
            Path(tmp) / "store", config, clock_ms=clock or Clock(1_700_000_000_000)
        )
        try:
            yield store
        finally:
            store.close()


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    kind=st.sampled_from([*INVALID_KINDS, "record_too_large"]),
    before=st.lists(messages, max_size=4),
    batch=st.lists(messages, max_size=4),
)
def test_invalid_batch_is_refused_whole(
    data: st.DataObject, kind: str, before: list[Message], batch: list[Message]
) -> None:
    """One bad message refuses its whole batch: the right error, and not one byte written."""
    config = small_config(max_message_size=8192)
    model = StoreModel(
        segment_size=8192,
        cq_file_size=CQ_FILE_SIZE,
        store_ip="127.0.0.1",
        store_port=10911,
        max_msgs_num_batch=64,
    )
    clock = Clock(1_700_000_000_000)
    with opened(config, clock) as store:
        check_put(model, before, list(store.put_batch(before).results()), clock.now, set())
        if kind == "record_too_large":
            # A body within maxMessageSize whose record still exceeds a CommitLog segment.
            bad = Message("T", b"x" * data.draw(st.integers(8060, 8192)))
        else:
            bad = data.draw(invalid_messages(kind, config.max_message_size))
        at = data.draw(st.integers(0, len(batch)))
        batch.insert(at, bad)
        path = store.path
        # The background flusher would otherwise write the progress file and checkpoint for
        # `before` at some moment during the refused put, a change this test did not cause.
        store.flush()
        files = snapshot(path, skip={"lock"})
        clock.now += 1000
        form = data.draw(st.sampled_from(["list", "table", "record_batch", "sliced", "chunked"]))
        error = MessageTooLargeError if kind.endswith("too_large") else InvalidMessageError
        with pytest.raises(error):
            store.put_batch(as_payload(batch, form))
        assert snapshot(path, skip={"lock"}) == files
        check_bounds(store, model)
        # The store still takes the valid part of the batch afterwards.
        del batch[at]
        check_put(model, batch, list(store.put_batch(batch).results()), clock.now, set())
        check_bounds(store, model)


def bad_message(kind: str) -> Message:
    """One deterministic example of every kind of refused message."""
    return {
        "body_too_large": Message("T", b"x" * (MAX_BODY + 1)),
        "empty_topic": Message("", b"x"),
        "topic_128": Message("T" * 128, b"x"),
        "topic_bad_char": Message("a/b", b"x"),
        "properties_too_long": Message("T", b"x", properties={"p": "v" * 32768}),
        "property_name_separator": Message("T", b"x", properties={"a\x01": "v"}),
        "property_value_separator": Message("T", b"x", properties={"a": "v\x02"}),
        "property_name_empty": Message("T", b"x", properties={"a": "v", "": "v"}),
        "key_separator": Message("T", b"x", keys=["k\x01"]),
        "tag_separator": Message("T", b"x", tags="t\x02"),
        "uniq_key_separator": Message("T", b"x", uniq_key="u\x01"),
        "negative_queue": Message("T", b"x", queue_id=-1),
        "bad_sys_flag": Message("T", b"x", sys_flag=0x1),
        "bad_born_host": Message("T", b"x", born_host="nohost"),
    }[kind]


@pytest.mark.parametrize("kind", INVALID_KINDS)
def test_invalid_message_error_names_the_row(kind: str) -> None:
    """``InvalidMessageError.index`` is the position of the bad message in its batch."""
    fine = Message("T", b"ok", properties={"a": "b", "c": "d"})
    with opened(small_config()) as store:
        with pytest.raises(InvalidMessageError) as info:
            store.put_batch([fine, fine, bad_message(kind), fine])
        assert info.value.index == 2, info.value
        assert store.max_phy_offset == 0


@pytest.mark.parametrize(
    "field, value",
    [
        ("queue_id", 2**31),
        ("flag", 2**31),
        ("flag", -(2**31) - 1),
        ("reconsume_times", 2**31),
        ("prepared_transaction_offset", 2**63),
        ("born_timestamp", 2**63),
    ],
)
def test_out_of_range_field_is_invalid_message(field: str, value: int) -> None:
    """A Message field that does not fit its record field is refused as invalid input."""
    with opened(small_config()) as store:
        store.put(Message("T", b"before"))
        end = store.max_phy_offset
        with pytest.raises(InvalidMessageError):
            store.put_batch([Message("T", b"ok"), Message("T", b"x", **{field: value})])
        assert store.max_phy_offset == end


@pytest.mark.parametrize("born", [-1, -5, -(2**63)])
def test_negative_born_timestamp_is_not_replaced(born: int) -> None:
    """BORNTIMESTAMP is a Java long: a negative one is either stored as given or refused, never
    silently swapped for the store time (only ``born_timestamp=None`` means "now")."""
    clock = Clock(1_700_000_000_000)
    with opened(small_config(), clock) as store:
        try:
            r = store.put(Message("T", b"x", born_timestamp=born))
        except InvalidMessageError:
            assert store.max_phy_offset == 0
        else:
            assert store.get_message(r.commit_log_offset).born_timestamp == born


# -- boundaries ----------------------------------------------------------------------------------


def test_size_boundaries() -> None:
    """127-byte topics and 32767-byte properties are stored; one byte more is refused."""
    config = small_config(mapped_file_size_commitlog=128 * 1024)
    model = StoreModel(
        segment_size=128 * 1024,
        cq_file_size=CQ_FILE_SIZE,
        store_ip="127.0.0.1",
        store_port=10911,
        max_msgs_num_batch=64,
    )
    clock = Clock(1_700_000_000_000)
    # UNIQ_KEY\x01U \x02 p\x01 <value>: 13 bytes of framing.
    longest = Message("T", b"x", uniq_key="U", properties={"p": "é" * ((32767 - 13) // 2)})
    assert len(("UNIQ_KEY\x01U\x02p\x01" + longest.properties["p"]).encode()) == 32767  # type: ignore[index]
    accepted = [
        longest,
        Message("T" * 127, b"x" * MAX_BODY),
        Message("T", b"y", uniq_key="U", properties={"p": "v" * (32767 - 13)}),
    ]
    refused = [
        Message("T", b"x", uniq_key="U", properties={"p": "é" * ((32767 - 13) // 2) + "v"}),
        Message("T" * 128, b"x"),
        Message("T", b"x" * (MAX_BODY + 1)),
    ]
    with opened(config, clock) as store:
        for m in accepted:
            clock.now += 1
            check_put(model, [m], [store.put(m)], clock.now, set())
        for m in refused:
            with pytest.raises(InvalidMessageError):
                store.put(m)
        audit(store, model)


@pytest.mark.parametrize("host", ["127.0.0.1", "fe80::1"])
def test_four_mib_bodies(host: str) -> None:
    """Bodies of exactly maxMessageSize (4 MiB) are stored whole, one per 5 MiB segment, and
    survive a reopen; one byte more is refused without writing."""
    mib = 1024 * 1024
    config = StoreConfig(
        mapped_file_size_commitlog=5 * mib,
        mapped_file_size_consume_queue=CQ_FILE_SIZE,
        max_hash_slot_num=7,
        max_index_num=9,
        broker_ip1=host,
        listen_port=10911,
    )
    assert config.max_message_size == 4 * mib
    model = StoreModel(
        segment_size=5 * mib,
        cq_file_size=CQ_FILE_SIZE,
        store_ip=host,
        store_port=config.listen_port,
        max_msgs_num_batch=64,
    )
    rng = random.Random(host)
    big = [
        Message("Big", rng.randbytes(4 * mib), keys="k1 k2", tags="😀", born_host="[::1]:9"),
        Message("Big", rng.randbytes(4 * mib), keys=["k2"], properties={"ключ": "значение"}),
    ]
    clock = Clock(1_700_000_000_000)
    with tempfile.TemporaryDirectory(prefix="store-model-", dir=TMP_BASE) as tmp:
        path = Path(tmp) / "store"
        with MessageStore(path, config, clock_ms=clock) as store:
            result = store.put_batch(big)
            check_put(model, big, list(result.results()), clock.now, set())
            assert [s.ext.commit_log_offset for s in model.messages] == [0, 5 * mib]
            clock.now += 1
            with pytest.raises(MessageTooLargeError):
                store.put(Message("Big", bytes(4 * mib + 1)))
            audit(store, model)
        with MessageStore(path, config, clock_ms=clock) as store:
            audit(store, model)


# -- UTF-8 and key tokens -------------------------------------------------------------------------


@settings(max_examples=40)
@given(
    key=texts(1, 12, exclude=" "),
    tag=texts(1, 12).filter(lambda t: t == t.strip() and "||" not in t),
    props=st.dictionaries(texts(1, 8).filter(lambda n: n not in reserved), texts(0, 12)),
    body=texts(0, 50),
    topic=random_topics,
    born=born_hosts,
)
def test_utf8_round_trip(
    key: str, tag: str, props: dict[str, str], body: str, topic: str, born: str | None
) -> None:
    """Keys, tags, properties and bodies in any UTF-8 text come back as put and are found by
    key and by tag (the tag hash is Java's, over UTF-16 code units)."""
    m = Message(topic, body.encode(), keys=[key], tags=tag, properties=props, born_host=born)
    other = Message(topic, b"other", keys=["unrelated"], tags="unrelated")
    with opened(small_config()) as store:
        r = store.put_batch([other, m, other])
        phys = int(r.commit_log_offsets[1])
        got = store.get_message(phys)
        assert got.body == body.encode()
        assert got.keys == [key]
        assert got.tags == tag
        # A property with an empty value is stored but not read back (RocketMQ's rule).
        user = {k: v for k, v in got.properties.items() if k not in reserved}
        assert user == {k: v for k, v in props.items() if v}
        assert [x.commit_log_offset for x in store.query_by_key(topic, key)] == [phys]
        pulled = store.get_messages(topic, 0, 0, 10, tag)
        # A subscription's tags are trimmed as Java's String.trim() does (characters up to
        # U+0020); a tag made of nothing else can be stored but not subscribed to.
        subscribable = tag.strip("".join(chr(c) for c in range(0x21))) == tag
        assert [x.commit_log_offset for x in pulled.messages] == ([phys] if subscribable else [])
        unit = store.read_units(topic, 0, 1, 1)[0]
        assert int(unit["tags_code"]) == java_hash(tag)


@pytest.mark.parametrize(
    "keys", [["alpha beta"], "alpha beta", "  alpha   beta  ", ["alpha", "beta"]]
)
def test_key_with_space_is_two_tokens(keys: list[str] | str) -> None:
    """KEYS is split on spaces: each token is a key, the whole string is not."""
    with opened(small_config()) as store:
        r = store.put(Message("T", b"x", keys=keys, uniq_key="uniq with space"))
        store.put(Message("T", b"y", keys=["alphabeta"]))
        for key in ("alpha", "beta", "uniq with space"):
            assert [m.commit_log_offset for m in store.query_by_key("T", key)] == [
                r.commit_log_offset
            ]
        assert store.query_by_key("T", "alpha beta") == []
        assert store.query_by_key("T", "uniq") == []
        assert store.get_message(r.commit_log_offset).keys == ["alpha", "beta"]
