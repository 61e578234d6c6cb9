"""The native core against the readable Python reference.

Batches put through the store (native encoder, native index chain) must leave exactly the
ConsumeQueue and IndexFile bytes that a plain, record-at-a-time reference builds from the
CommitLog with :mod:`rocketstore.pipeline.format.record` and Java's hash as :func:`rocketstore.pipeline.format.javahash.java_hash`
spells it; the native record walk must see exactly what :func:`rocketstore.pipeline.format.record.scan_record`
sees, and the one-pass re-dispatch walk must derive what the walk's columns say; the native
hashes and CRCs must equal the reference functions.
"""

from __future__ import annotations

import dataclasses
import shutil
import struct
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import InvalidMessageError
from rocketstore.pipeline.format import native, record
from rocketstore.pipeline.format.javahash import java_hash
from rocketstore.pipeline.format.message import Message
from tests.kit.nativecheck import UNIT, check_dispatch_walk
from tests.kit.strategies import messages

CONFIG = StoreConfig(
    mapped_file_size_commitlog=8192,
    mapped_file_size_consume_queue=200,
    max_hash_slot_num=7,
    max_index_num=9,
    max_message_size=4000,
)
HEADER = struct.Struct(">qqqqii")
ENTRY = struct.Struct(">iqii")


class RefIndexFile:
    """RocketMQ's ``IndexFile.putKey``, one entry at a time, in plain Python."""

    def __init__(self, slots: int, entries: int, begin_phy: int, begin_ts: int) -> None:
        self.slot_num, self.index_num = slots, entries
        self.slots = [0] * slots
        self.entries: dict[int, tuple[int, int, int, int]] = {}
        self.begin_ts = self.end_ts = begin_ts
        self.begin_phy = self.end_phy = begin_phy
        self.slot_count = 0
        self.count = 1

    def put(self, key_hash: int, phys: int, ts: int) -> None:
        slot = key_hash % self.slot_num
        prev = self.slots[slot]
        if prev <= 0 or prev > self.count:
            prev = 0
        diff = int((ts - self.begin_ts) / 1000)  # Java truncates toward zero
        diff = 0 if self.begin_ts <= 0 else min(max(diff, 0), 2**31 - 1)
        self.entries[self.count] = (key_hash, phys, diff, prev)
        self.slots[slot] = self.count
        if self.count <= 1:
            self.begin_phy, self.begin_ts = phys, ts
        if prev == 0:
            self.slot_count += 1
        self.count += 1
        self.end_phy, self.end_ts = phys, ts

    def to_bytes(self) -> bytes:
        out = bytearray(HEADER.size + 4 * self.slot_num + ENTRY.size * self.index_num)
        HEADER.pack_into(
            out,
            0,
            self.begin_ts,
            self.end_ts,
            self.begin_phy,
            self.end_phy,
            self.slot_count,
            self.count,
        )
        for i, v in enumerate(self.slots):
            struct.pack_into(">i", out, HEADER.size + 4 * i, v)
        base = HEADER.size + 4 * self.slot_num
        for n, e in self.entries.items():
            ENTRY.pack_into(out, base + ENTRY.size * n, *e)
        return bytes(out)


def key_hash(topic: str, key: str) -> int:
    h = java_hash(f"{topic}#{key}")
    return 0 if h == -(2**31) else abs(h)


def reference_files(log: list[record.MessageExt], config: StoreConfig) -> tuple[dict, list]:
    """(ConsumeQueue file bytes by relative path, index files' bytes in order) for ``log``."""
    queues: dict[tuple[str, int], bytearray] = {}
    index: list[RefIndexFile] = []
    for m in log:
        tx = m.sys_flag & record.TRANSACTION_MASK
        if tx in (record.TRANSACTION_NOT_TYPE, record.TRANSACTION_COMMIT_TYPE):
            units = queues.setdefault((m.topic, m.queue_id), bytearray())
            assert len(units) == 20 * m.queue_offset
            units += UNIT.pack(m.commit_log_offset, m.store_size, java_hash(m.tags or ""))
        if tx == record.TRANSACTION_ROLLBACK_TYPE:
            continue
        keys = [m.uniq_key] if m.uniq_key is not None else []
        keys += [k for k in (m.properties.get(record.PROPERTY_KEYS) or "").split(" ") if k]
        for k in keys:
            if not index or index[-1].count >= config.max_index_num:
                prev = index[-1] if index else None
                index.append(
                    RefIndexFile(
                        config.max_hash_slot_num,
                        config.max_index_num,
                        prev.end_phy if prev else 0,
                        prev.end_ts if prev else 0,
                    )
                )
            index[-1].put(key_hash(m.topic, k), m.commit_log_offset, m.store_timestamp)
    size = config.mapped_file_size_consume_queue
    files = {}
    for (topic, qid), units in queues.items():
        for base in range(0, len(units), size):
            chunk = bytes(units[base : base + size])
            files[f"{topic}/{qid}/{base:020d}"] = chunk + bytes(size - len(chunk))
    return files, [f.to_bytes() for f in index]


def read_log(path: Path, config: StoreConfig) -> list[record.MessageExt]:
    """Every record of the CommitLog, decoded by the reference decoder (blanks skipped)."""
    out = []
    seg = config.mapped_file_size_commitlog
    for f in sorted((path / "commitlog").iterdir()):
        data = f.read_bytes()
        pos = 0
        while pos + 8 <= seg:
            size, magic = record.SIZE_MAGIC.unpack_from(data, pos)
            if magic != record.MAGIC:
                break
            out.append(record.decode_record(data, pos, phys=int(f.name) + pos))
            pos += size
    return out


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.lists(st.lists(messages(), min_size=1, max_size=20), min_size=1, max_size=4),
    big_props=st.booleans(),
    lose=st.sampled_from(["consumequeue", "index", "both"]),
)
def test_store_files_equal_the_reference(
    tmp_path: Path, batches: list[list[Message]], big_props: bool, lose: str
) -> None:
    """The files batch puts write, and the files an open rebuilds from the CommitLog after
    ``lose`` was deleted, equal the reference's."""
    if big_props:
        # One message with PROPERTIES at exactly the 32767-byte limit.
        fixed = len("UNIQ_KEY\x01") + 32 + len("\x02p\x01")
        batches[0][0] = Message(
            topic="TopicA",
            body=b"",
            uniq_key="A" * 32,
            properties={"p": "v" * (record.MAX_PROPERTIES_LENGTH - fixed)},
        )
    config = StoreConfig(**{**CONFIG.__dict__, "mapped_file_size_commitlog": 65536})
    clock = iter(range(10**12, 10**12 + 10**7, 700))
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "store"
    with MessageStore(path, config, clock_ms=lambda: next(clock)) as store:
        for batch in batches:
            store.put_batch(batch)
    log = read_log(path, config)
    assert len(log) == sum(map(len, batches))
    if big_props:
        raw = record.encode_properties(log[0].properties)
        assert len(raw) == record.MAX_PROPERTIES_LENGTH
    want_queues, want_index = reference_files(log, config)
    cq_root = path / "consumequeue"

    def check_files() -> None:
        got_queues = {
            str(f.relative_to(cq_root)): f.read_bytes() for f in cq_root.rglob("*") if f.is_file()
        }
        assert got_queues == want_queues
        got_index = [f.read_bytes() for f in sorted((path / "index").iterdir())]
        assert got_index == want_index

    check_files()
    for sub in ("consumequeue", "index") if lose == "both" else (lose,):
        shutil.rmtree(path / sub)
    # Prepared and rolled-back halves have no ConsumeQueue unit: when every message is one,
    # deleting consumequeue/ loses nothing, and nothing is re-dispatched, unless the index is
    # empty too (rolled-back halves are not indexed), which the open catches up from the start.
    index_entries = sum(struct.unpack_from(">i", f, 36)[0] - 1 for f in want_index)
    lost = lose != "consumequeue" or bool(want_queues) or index_entries == 0
    with MessageStore(path, config, clock_ms=lambda: next(clock)) as store:
        assert store.recovery.records_redispatched == (len(log) if lost else 0)
    check_files()


def _scan_reference(buf: bytes, base: int) -> list[tuple]:
    """What the reference scan sees, record by record, with dispatch's derived values."""
    out = []
    pos = 0
    while pos + 8 <= len(buf):
        scanned = record.scan_record(buf, pos, len(buf), base + pos, check_crc=True)
        if scanned is None:
            break
        size, qid, qoff, sys_flag, store_ts, topic_b, props_b = scanned
        props = record.decode_properties(props_b)
        topic = topic_b.decode()
        tags = props.get(record.PROPERTY_TAGS)
        keys = []
        if sys_flag & record.TRANSACTION_MASK != record.TRANSACTION_ROLLBACK_TYPE:
            uniq = props.get(record.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
            keys = [uniq] if uniq else []
            keys += [k for k in (props.get(record.PROPERTY_KEYS) or "").split(" ") if k]
        out.append(
            (
                base + pos,
                size,
                qid,
                qoff,
                sys_flag,
                store_ts,
                java_hash(tags) if tags else 0,
                topic,
                [key_hash(topic, k) for k in keys],
            )
        )
        pos += size
    return out


@settings(max_examples=80)
@given(
    batch=st.lists(messages(), min_size=1, max_size=15),
    cut=st.integers(0, 10**6),
    torn=st.booleans(),
    check_crc=st.booleans(),
    stop_at=st.integers(0, 16),
)
def test_walk_sees_what_the_reference_scan_sees(
    batch: list[Message], cut: int, torn: bool, check_crc: bool, stop_at: int
) -> None:
    """The log ends at ``cut``, or (``torn``) what a write torn there leaves: zeros from ``cut``
    to the end of the last record. Either way the walk keeps only records whose every byte was
    written, the CRC checked or not."""
    buf = bytearray()
    base = 4096
    for i, m in enumerate(batch):
        props = {}
        if m.key_list():
            props["KEYS"] = " ".join(m.key_list() or [])
        if m.tags:
            props["TAGS"] = m.tags
        props["UNIQ_KEY"] = m.uniq_key or f"{i:032X}"
        props.update(m.properties or {})
        buf += record.encode_record(
            topic=m.topic,
            body=m.body,
            properties=props,
            queue_id=m.queue_id,
            queue_offset=i,
            physical_offset=base + len(buf),
            born_timestamp=m.born_timestamp or 1,
            store_timestamp=10**12 + i,
            born_host=m.born_host or "10.1.2.3:9",
            store_host="127.0.0.1:10911",
            sys_flag=m.sys_flag,
            flag=m.flag,
        )
    cut %= len(buf) + 1
    data = bytes(buf[:cut]) + (bytes(len(buf) - cut) if torn else b"")
    w = native.walk(data, 0, len(data), base, check_crc=check_crc)
    want = _scan_reference(data, base)
    got = []
    for i in range(len(w)):
        hashes = w.key_hashes[w.key_rows == i].tolist()
        got.append(
            (
                int(w.phys[i]),
                int(w.sizes[i]),
                int(w.queue_ids[i]),
                int(w.queue_offsets[i]),
                int(w.sys_flags[i]),
                int(w.store_ts[i]),
                int(w.tags_codes[i]),
                w.topics[int(w.topic_codes[i])],
                hashes,
            )
        )
    assert got == want
    ends_at = want[-1][0] + want[-1][1] if want else base
    assert w.end == ends_at
    assert ends_at - base <= cut
    assert w.stop == (native.STOP_END if len(data) - (ends_at - base) < 8 else native.STOP_INVALID)
    check_dispatch_walk(data, 0, base, check_crc=check_crc)
    if stop_at < len(want):
        check_dispatch_walk(data, 0, base, check_crc=check_crc, end=want[stop_at][0])


UNICODE = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)


@given(
    st.lists(st.none() | UNICODE, max_size=30),
    st.sampled_from([pa.string(), pa.large_string()]),
    st.integers(0, 5),
)
def test_java_hashes_equal_the_reference(
    values: list[str | None], type_: pa.DataType, skip: int
) -> None:
    """Offsets of either width, sliced arrays and columns with no value at all all cross to
    the crate as Arrow holds them."""
    arr = pa.array(values, type_).slice(min(skip, len(values)))
    got = native.java_hashes(arr).tolist()
    assert got == [java_hash(v) if v else 0 for v in values[min(skip, len(values)) :]]


@given(prefix=st.binary(min_size=10, max_size=10), start=st.integers(0, 2**64 - 1))
def test_uniq_ids_equal_the_reference(prefix: bytes, start: int) -> None:
    out = np.zeros(5 * 32, np.uint8)
    native.uniq_ids(prefix, start, out)
    want = [f"{prefix.hex().upper()}{(start + i) % 2**64 & (2**48 - 1):012X}" for i in range(5)]
    assert out.tobytes().decode().split("\0") == ["".join(want)]


@given(st.lists(st.binary(max_size=300), max_size=30), st.integers(0, 5))
def test_body_crcs_equal_zlib(bodies: list[bytes], skip: int) -> None:
    arr = pa.array(bodies, pa.binary()).slice(min(skip, len(bodies)))
    got = native.body_crcs(arr).tolist()
    assert got == [zlib.crc32(b) & 0x7FFFFFFF for b in bodies[min(skip, len(bodies)) :]]


def test_java_hash_known_values() -> None:
    # Values Java itself gives: "Aa".hashCode() == "BB".hashCode() == 2112,
    # "hello".hashCode() == 99162322, and a surrogate pair hashes as two UTF-16 units.
    got = native.java_hashes(pa.array(["Aa", "BB", "hello", "\U0001f600", None])).tolist()
    assert got == [2112, 2112, 99162322, 31 * 0xD83D + 0xDE00, 0]


def test_index_keys_skip_rollback_and_empty_tokens() -> None:
    rows, hashes = native.index_keys(
        native.table_of([b"T"]),
        np.zeros(3, np.int32),
        native.strings(pa.array(["U0", "U1", None])),
        native.strings(pa.array([" a  b ", "c", "d"])),
        np.array([0, record.TRANSACTION_ROLLBACK_TYPE, 0], np.int32),
    )
    assert np.frombuffer(rows, np.int64).tolist() == [0, 0, 0, 2]
    assert np.frombuffer(hashes, np.int32).tolist() == [
        key_hash("T", k) for k in ("U0", "a", "b", "d")
    ]


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(messages(), min_size=1, max_size=30))
def test_single_puts_write_what_batches_of_one_write(tmp_path: Path, batch: list[Message]) -> None:
    """``put`` takes its own path for plain messages; the bytes must be the batch path's."""
    put_both_ways(tmp_path, batch, InvalidMessageError)


def put_both_ways(
    tmp_path: Path, batch: list[Message], errors: type[Exception], first: Message | None = None
) -> None:
    """Put ``batch`` into two stores, one ``put`` at a time and as batches of one (after
    ``first``, put the same way into both): the results, the ``errors`` raised (type and text)
    and the CommitLog, ConsumeQueue and index files must be equal."""
    batch = [
        dataclasses.replace(m, uniq_key=m.uniq_key or f"{i:032X}") for i, m in enumerate(batch)
    ]
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    outcomes: dict[str, list[object]] = {}
    for name, single in (("single", True), ("batch", False)):
        clock = iter(range(10**12, 10**12 + 10**7, 700))
        got = outcomes[name] = []
        with MessageStore(root / name, CONFIG, clock_ms=lambda c=clock: next(c)) as store:
            if first is not None:
                store.put(first)
            for m in batch:
                try:
                    r = store.put(m) if single else next(store.put_batch([m]).results())
                    got.append(tuple(r))
                except errors as exc:
                    got.append((type(exc).__name__, str(exc)))
    assert outcomes["single"] == outcomes["batch"]

    def files(path: Path) -> dict[str, bytes]:
        return {
            str(p.relative_to(path)): p.read_bytes()
            for sub in ("commitlog", "consumequeue", "index")
            for p in sorted((path / sub).rglob("*"))
            if p.is_file()
        }

    assert files(root / "single") == files(root / "batch")


# Field values at and past the edges of what a single put takes itself: separators inside
# values, empty strings, reserved property names, lone surrogates, types other than the declared
# ones, out-of-range integers, a bad topic.
ODD_TEXT = st.sampled_from(["t", "", " a  b ", "a\x01b", "a\x02", "\ud800", "ü ✓", "x" * 40])
ODD_KEYS = (
    st.none()
    | ODD_TEXT
    | st.lists(ODD_TEXT, max_size=3)
    | st.tuples(ODD_TEXT, ODD_TEXT)
    | st.sampled_from([[1], ("a", None), b"k"])
)
ODD_PROPS = st.none() | st.dictionaries(
    st.sampled_from(["k", "", "KEYS", "TAGS", "UNIQ_KEY", "k\x01", "p q"]), ODD_TEXT, max_size=3
)


ODD_FIELDS = {
    "topic": st.sampled_from(["bad topic", "T\n", "", "x" * 128]),
    "body": st.sampled_from([b"", bytes(range(256)), bytearray(b"ba"), "text"]),
    "queue_id": st.sampled_from([-1, 2**31, True]),
    "keys": ODD_KEYS,
    "tags": ODD_TEXT | st.just(5),
    "properties": ODD_PROPS,
    "flag": st.sampled_from([-1, 2**31 - 1, 2**31, False]),
    "sys_flag": st.sampled_from([4, 8, None]),
    "born_timestamp": st.sampled_from([0, -5, 2**63]),
    "born_host": st.sampled_from(["", "10.0.0.7:4000"]),
    "reconsume_times": st.just(1),
    "prepared_transaction_offset": st.just(7),
    "uniq_key": st.sampled_from(["a\x01b", "\ud800", "ü"]),
}


@st.composite
def odd_messages(draw: st.DrawFn) -> Message:
    """A plain message with up to two fields replaced by odd values."""
    plain = Message(
        topic="TopicA",
        body=draw(st.binary(max_size=40)),
        queue_id=draw(st.integers(0, 2)),
        keys=draw(st.none() | st.lists(st.sampled_from(["k1", "k 2", ""]), max_size=2)),
        tags=draw(st.none() | st.sampled_from(["t", ""])),
        properties=draw(st.none() | st.just({"p": "v"})),
    )
    odd = draw(st.lists(st.sampled_from(sorted(ODD_FIELDS)), max_size=2, unique=True))
    return dataclasses.replace(plain, **{f: draw(ODD_FIELDS[f]) for f in odd})


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(odd_messages(), min_size=1, max_size=12))
def test_odd_single_puts_match_batches_of_one(tmp_path: Path, batch: list[Message]) -> None:
    """Whatever a single put takes itself, it stores as a batch of one would; whatever it
    refuses, it refuses with the batch path's error. A first put creates the queue's files, so
    the later ones can take the single path."""
    first = Message("TopicA", b"first", queue_id=0, uniq_key="F" * 32)
    put_both_ways(tmp_path, batch, Exception, first)


def test_plain_single_puts_take_the_single_put_path(tmp_path: Path, monkeypatch) -> None:
    calls = []

    class Counting:
        """The native single put, counting the puts it took."""

        def __init__(self, *args: object) -> None:
            self.real = native_single_put(*args)

        def put(self, *args: object) -> object:
            done = self.real.put(*args)
            if done is not None:
                calls.append(done)
            return done

    native_single_put = native.SinglePut
    monkeypatch.setattr(native, "SinglePut", Counting)
    plain = [
        Message("TopicA", f"body {i}".encode(), queue_id=i % 3, keys=[f"k{i}", "x y"], tags="T")
        for i in range(200)
    ]
    roomy = StoreConfig(
        mapped_file_size_commitlog=1 << 20,
        mapped_file_size_consume_queue=20 * 1000,
        max_hash_slot_num=101,
        max_index_num=1000,
    )
    with MessageStore(tmp_path / "s", roomy) as store:
        results = [store.put(m) for m in plain]
        found = store.query_by_key("TopicA", "k150")
    assert len(calls) == 197  # all but the first put of each queue, which creates its file
    assert [m.commit_log_offset for m in found] == [results[150].commit_log_offset]
    assert found[0].body == b"body 150"
