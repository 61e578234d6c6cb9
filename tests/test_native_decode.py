"""The native record decoder against the pure-Python reference (rocketstore.pipeline.format.record).

Differential: batches of records encoded by :func:`record.encode_record` must decode natively
to exactly what :func:`record.decode_record` gives, column by column. Fuzz: random bytes and
mutated valid records never crash the decoder or the walk; the decoder either raises
:class:`CorruptRecordError` at the first record the reference refuses, or returns records the
reference accepts, equal to its decoding.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketstore.pipeline.errors import CorruptRecordError
from rocketstore.pipeline.format import native, record
from tests.kit.nativecheck import check_dispatch_walk

FUZZ = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Text without NUL and the property separators (encode_properties refuses them, and
# encode_record a NUL in the topic).
_CHARS = st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00\x01\x02")
_text = st.text(_CHARS, max_size=12)
_word = st.text(_CHARS.filter(lambda c: c != " "), min_size=1, max_size=8)


@st.composite
def hosts(draw: st.DrawFn) -> str:
    port = draw(st.integers(0, 2**31 - 1))
    if draw(st.booleans()):
        return f"[{draw(st.ip_addresses(v=6))}]:{port}"
    return f"{draw(st.ip_addresses(v=4))}:{port}"


@st.composite
def properties(draw: st.DrawFn) -> dict[str, str]:
    props: dict[str, str] = {}
    if draw(st.booleans()):
        # KEYS with runs of spaces: empty tokens are dropped by every reader.
        props[record.PROPERTY_KEYS] = " ".join(draw(st.lists(st.one_of(_word, st.just("")))))
    if draw(st.booleans()):
        props[record.PROPERTY_TAGS] = draw(_text)
    if draw(st.booleans()):
        props[record.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = draw(_text)
    props.update(draw(st.dictionaries(_text, _text, max_size=4)))
    if draw(st.integers(0, 9)) == 0:
        # Pad to exactly the 32767-byte limit of the PROPERTIES field.
        used = len(record.encode_properties(props))
        room = record.MAX_PROPERTIES_LENGTH - used - (1 if props else 0) - len("pad\x01")
        props["pad"] = "v" * room
        assert len(record.encode_properties(props)) == record.MAX_PROPERTIES_LENGTH
    return props


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "topic": draw(st.text(_CHARS, min_size=1, max_size=30)),
        "body": draw(st.one_of(st.just(b""), st.binary(max_size=300))),
        "properties": draw(properties()),
        "queue_id": draw(st.integers(-(2**31), 2**31 - 1)),
        "queue_offset": draw(st.integers(0, 2**62)),
        "born_timestamp": draw(st.integers(-(2**63), 2**63 - 1)),
        "store_timestamp": draw(st.integers(-(2**63), 2**63 - 1)),
        "born_host": draw(hosts()),
        "store_host": draw(hosts()),
        # Transaction types (prepared, commit, rollback) and the other low flag bits.
        "sys_flag": draw(st.sampled_from([0, 1, 2, 3, 4, 8, 0xC, 0xE])),
        "flag": draw(st.integers(-(2**31), 2**31 - 1)),
        "reconsume_times": draw(st.integers(-(2**31), 2**31 - 1)),
        "prepared_transaction_offset": draw(st.integers(-(2**63), 2**63 - 1)),
    }


def encode_segment(
    msgs: list[dict[str, Any]], base: int, gaps: list[int]
) -> tuple[bytearray, list[int]]:
    """The records back to back from relative offset 0 (with ``gaps[i]`` junk bytes before
    record i), each stamped with its physical offset."""
    buf = bytearray()
    rel: list[int] = []
    for i, m in enumerate(msgs):
        buf += bytes([0xA5]) * (gaps[i] if i < len(gaps) else 0)
        rel.append(len(buf))
        buf += record.encode_record(physical_offset=base + len(buf), **m)
    return buf, rel


def reference(buf: Any, rel: list[int], base: int) -> list[record.MessageExt]:
    return [record.decode_record(buf, r, phys=base + r, path="seg") for r in rel]


def assert_same(batch: pa.RecordBatch, want: list[record.MessageExt]) -> None:
    batch.validate(full=True)
    assert batch.num_rows == len(want)
    assert list(native.messages(batch)) == want
    # The derived columns, as MessageExt derives them from the properties.
    assert batch.column("keys").to_pylist() == [
        m.keys if record.PROPERTY_KEYS in m.properties else None for m in want
    ]
    assert batch.column("tags").to_pylist() == [m.tags for m in want]
    assert batch.column("uniqKey").to_pylist() == [m.uniq_key for m in want]


@given(
    msgs=st.lists(messages(), min_size=1, max_size=12),
    gaps=st.lists(st.integers(0, 40), max_size=12),
    base_units=st.integers(0, 2**20),
)
@settings(FUZZ, max_examples=300)
def test_decode_matches_reference(
    msgs: list[dict[str, Any]], gaps: list[int], base_units: int
) -> None:
    base = base_units * 4096
    buf, rel = encode_segment(msgs, base, gaps)
    sizes = np.array([len(record.encode_record(physical_offset=0, **m)) for m in msgs])
    batch = native.decode(bytes(buf), np.array(rel), base, path="seg", sizes=sizes)
    assert_same(batch, reference(buf, rel, base))
    check_decode_one(bytes(buf), rel, base)


@given(msgs=st.lists(messages(), min_size=1, max_size=6))
@settings(FUZZ, max_examples=60)
def test_column_groups_are_independent(msgs: list[dict[str, Any]]) -> None:
    buf, rel = encode_segment(msgs, 0, [])
    full = native.decode(buf, np.array(rel), 0, path="seg")
    for group in native.Columns:
        if group == native.Columns.ALL:
            continue
        part = native.decode(buf, np.array(rel), 0, path="seg", columns=group)
        part.validate(full=True)
        for name in part.schema.names:
            assert part.column(name).equals(full.column(name)), (group, name)
    bare = native.decode(buf, np.array(rel), 0, path="seg", columns=native.Columns(0))
    assert bare.schema.names == [
        "commitLogOffset",
        "storeSize",
        "queueId",
        "queueOffset",
        "sysFlag",
        "flag",
        "bornTimestamp",
        "storeTimestamp",
        "reconsumeTimes",
        "preparedTransactionOffset",
        "bodyCRC",
        "topic",
    ]


def test_properties_follow_rocketmq_rules() -> None:
    # Empty values, a second separator and items without one are dropped; the last duplicate
    # wins in the first one's place; KEYS without tokens is an empty list, not null.
    raw = b"a\x011\x02e\x01\x02KEYS\x01  \x02x\x01y\x01z\x02junk\x02a\x012\x02\x01anon"
    rec = _with_properties(raw)
    batch = native.decode(bytes(rec), np.array([0]), 0, path="seg")
    assert batch.column("properties").to_pylist() == [[("a", "2"), ("KEYS", "  "), ("", "anon")]]
    assert batch.column("keys").to_pylist() == [[]]
    assert list(native.messages(batch)) == reference(rec, [0], 0)


def test_named_columns_without_the_map_follow_the_same_rules() -> None:
    # Without the properties map the decoder picks KEYS, TAGS and UNIQ_KEY in one pass of its
    # own: the last of each name wins, malformed UTF-8 becomes U+FFFD, a dropped item counts
    # for nothing, as in the map.
    raw = (
        b"KEYS\x01k1 k2\x02TAGS\x01old\x02UNIQ_KEY\x01u\xff1\x02TAGS\x01new\x02"
        b"KEYS\x01\x02x\x01y\x02KEYS\x01 k3  k\xc3\xa9\x02TAGS\x01\x01z"
    )
    rec = _with_properties(raw)
    want = {"keys": [["k3", "k\u00e9"]], "tags": ["new"], "uniqKey": ["u\ufffd1"]}
    named = native.Columns.KEYS | native.Columns.TAGS | native.Columns.UNIQ_KEY
    for columns in (named, named | native.Columns.PROPERTIES):
        batch = native.decode(bytes(rec), np.array([0]), 0, path="seg", columns=columns)
        assert {name: batch.column(name).to_pylist() for name in want} == want, columns
    # None of the three: nulls (KEYS null, not an empty list).
    rec = _with_properties(b"A\x01b")
    batch = native.decode(bytes(rec), np.array([0]), 0, path="seg", columns=named)
    assert [batch.column(n).to_pylist() for n in ("keys", "tags", "uniqKey")] == [[None]] * 3


def _with_properties(raw: bytes) -> bytearray:
    """A valid record whose PROPERTIES field is ``raw`` (which encode_properties may refuse)."""
    head = record.encode_record(
        topic="T",
        body=b"b",
        properties={},
        queue_id=0,
        queue_offset=0,
        physical_offset=0,
        born_timestamp=0,
        store_timestamp=0,
        born_host="1.2.3.4:5",
        store_host="1.2.3.4:5",
    )
    rec = bytearray(head[:-2]) + len(raw).to_bytes(2, "big") + raw
    rec[0:4] = len(rec).to_bytes(4, "big")
    return rec


def small_message(i: int, body: bytes, properties: dict[str, str]) -> dict[str, Any]:
    """Message ``i`` of topic T, queue 0, with IPv4 hosts (its body starts at byte 88)."""
    return {
        "topic": "T",
        "body": body,
        "properties": properties,
        "queue_id": 0,
        "queue_offset": i,
        "born_timestamp": 1,
        "store_timestamp": 2,
        "born_host": "10.0.0.1:1",
        "store_host": "10.0.0.2:2",
    }


def test_failure_names_segment_and_offset() -> None:
    msgs = [small_message(i, bytes([i]) * 10, {"KEYS": f"k{i}"}) for i in range(3)]
    buf, rel = encode_segment(msgs, 1 << 30, [])
    second = rel[1]
    buf[second + 90] ^= 0xFF  # a body byte (the body starts at 88): CRC mismatch
    with pytest.raises(CorruptRecordError) as err:
        native.decode(bytes(buf), np.array(rel), 1 << 30, path="/x/00000000001073741824")
    assert err.value.path == "/x/00000000001073741824"
    assert err.value.offset == (1 << 30) + second
    assert "CRC" in err.value.reason
    # Without the CRC check the record decodes; a wrong unit size is refused.
    assert native.decode(bytes(buf), np.array(rel), 1 << 30, path="p", check_crc=False).num_rows
    with pytest.raises(CorruptRecordError, match="ConsumeQueue unit's size 99"):
        native.decode(buf, np.array(rel[:1]), 1 << 30, path="p", sizes=np.array([99]))
    for bad in (-1, len(buf) + 1, len(buf), 1):
        with pytest.raises(CorruptRecordError) as err:
            native.decode(buf, np.array([bad]), 1 << 30, path="p")
        assert err.value.offset == (1 << 30) + bad


def test_a_record_torn_after_its_body_is_refused() -> None:
    """Zeros from a point inside the properties on: the body CRC still matches, and the
    decoders, the walk and the reference all refuse the record, naming the NUL."""
    msgs = [small_message(i, b"body", {"UNIQ_KEY": "U" * 32, "seq": str(i)}) for i in range(2)]
    buf, rel = encode_segment(msgs, 4096, [])
    buf[-1] = 0  # the last record's "seq\x011" loses its value
    with pytest.raises(CorruptRecordError, match="NUL byte in the properties") as err:
        native.decode(bytes(buf), np.array(rel), 4096, path="seg")
    assert err.value.offset == 4096 + rel[1]
    with pytest.raises(CorruptRecordError, match="NUL byte in the properties"):
        native.decode_one(bytes(buf), rel[1], 4096, path="seg", limit=len(buf))
    with pytest.raises(CorruptRecordError, match="NUL byte in the properties"):
        record.decode_record(buf, rel[1], phys=4096 + rel[1], path="seg")
    walk = native.walk(bytes(buf), 0, len(buf), 4096, check_crc=True)
    assert (len(walk), walk.end, walk.stop) == (1, 4096 + rel[1], native.STOP_INVALID)
    assert walk.reason.startswith("NUL byte in the properties")
    check_against_reference(bytes(buf), rel, 4096)
    check_walk(bytes(buf), 0, 4096)


def test_bad_arguments_are_value_errors() -> None:
    with pytest.raises(ValueError, match="sizes"):
        native.decode(b"", np.array([0, 1]), 0, path="p", sizes=np.array([1]))


def test_result_outlives_the_mapping(tmp_path: Any) -> None:
    import mmap

    buf, rel = encode_segment(
        [
            {
                "topic": "T",
                "body": b"x" * 50,
                "properties": {"TAGS": "t"},
                "queue_id": 1,
                "queue_offset": 0,
                "born_timestamp": 1,
                "store_timestamp": 2,
                "born_host": "[::1]:1",
                "store_host": "[2001:db8::1]:2",
            }
        ],
        0,
        [],
    )
    path = tmp_path / "seg"
    path.write_bytes(bytes(buf))
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        batch = native.decode(mm, np.array(rel), 0, path=str(path))
    assert batch.column("body").to_pylist() == [b"x" * 50]
    assert batch.column("msgId").to_pylist() == [record.decode_record(buf, 0).msg_id]


# -- fuzz -------------------------------------------------------------------------------------


def check_against_reference(buf: bytes, rel: list[int], base: int) -> None:
    """Native decode succeeds exactly when the reference accepts every record, and then gives
    the reference's messages; otherwise it names the first record the reference refuses."""
    check_decode_one(buf, rel, base)
    first_bad: int | None = None
    want: list[record.MessageExt] = []
    for r in rel:
        try:
            want.append(record.decode_record(buf, r, phys=base + r, path="seg"))
        except CorruptRecordError:
            first_bad = base + r
            break
    try:
        batch = native.decode(buf, np.array(rel, dtype=np.int64), base, path="seg")
    except CorruptRecordError as exc:
        assert exc.path == "seg"
        assert exc.offset == first_bad, exc
        return
    assert first_bad is None
    assert_same(batch, want)


def check_decode_one(buf: bytes, rel: list[int], base: int) -> None:
    """The single-record decoder accepts each record exactly when the reference does, and then
    gives the reference's message; otherwise it names the same file and offset."""
    for r in rel:
        try:
            want = record.decode_record(buf, r, phys=base + r, path="seg")
        except CorruptRecordError as exc:
            with pytest.raises(CorruptRecordError) as got:
                native.decode_one(buf, r, base, path="seg", limit=len(buf))
            assert (got.value.path, got.value.offset) == ("seg", exc.offset)
        else:
            assert native.decode_one(buf, r, base, path="seg", limit=len(buf)) == want


def check_walk(buf: bytes, start: int, base: int) -> None:
    """The walk stops cleanly, and every record it yields is one the reference accepts."""
    got = native.walk(buf, start, len(buf), base, check_crc=True)
    pos = start
    for i in range(len(got)):
        scanned = record.scan_record(buf, pos, len(buf), base + pos, check_crc=True)
        assert scanned is not None
        assert (scanned[0], scanned[1], scanned[2]) == (
            got.sizes[i],
            got.queue_ids[i],
            got.queue_offsets[i],
        )
        pos += scanned[0]
    assert got.end == base + pos
    if got.stop == native.STOP_INVALID:
        assert record.scan_record(buf, pos, len(buf), base + pos, check_crc=True) is None
    check_dispatch_walk(buf, start, base)


@given(
    data=st.binary(min_size=0, max_size=600),
    rel=st.lists(st.integers(0, 700), max_size=5),
    base=st.integers(0, 2**40),
)
@settings(FUZZ, max_examples=500)
def test_random_bytes(data: bytes, rel: list[int], base: int) -> None:
    rel = sorted(r for r in rel if r <= len(data))
    check_against_reference(data, rel, base)
    check_walk(data, min(rel, default=0), base)


# Damage done to a valid segment: (position fraction, kind, value).
_mutation = st.tuples(
    st.floats(0, 1, exclude_max=True),
    st.sampled_from(["flip", "byte", "zero4", "int", "truncate", "tear"]),
    st.integers(0, 2**32 - 1),
)


def mutate(buf: bytearray, mutations: list[tuple[float, str, int]]) -> bytes:
    for frac, kind, value in mutations:
        if not buf:
            break
        at = int(frac * len(buf))
        if kind == "flip":
            buf[at] ^= 1 << (value % 8)
        elif kind == "byte":
            buf[at] = value & 0xFF
        elif kind == "zero4":
            buf[at : at + 4] = bytes(len(buf[at : at + 4]))
        elif kind == "int":
            # A plausible-looking integer over a field: sizes and lengths are the targets.
            buf[at : at + 4] = (value % 512).to_bytes(4, "big")[: len(buf[at : at + 4])]
        elif kind == "tear":
            # A write the disk kept only up to here: zeros to the end.
            buf[at:] = bytes(len(buf) - at)
        else:
            del buf[at:]
    return bytes(buf)


def _corpus_message(rng: random.Random, i: int) -> dict[str, Any]:
    def host() -> str:
        port = rng.randrange(2**31)
        if rng.random() < 0.5:
            return f"[{':'.join(rng.choice(['0', 'fe80', '1', 'db8']) for _ in range(8))}]:{port}"
        return ".".join(str(rng.randrange(256)) for _ in range(4)) + f":{port}"

    props = {"KEYS": f"k{i} ключ{i}  x", "TAGS": rng.choice(["t", "标签", ""]), "UNIQ_KEY": "u"}
    if rng.random() < 0.2:
        props["pad"] = "p" * rng.randrange(2000)
    return {
        "topic": rng.choice(["T", "Topic-é", "主题"]),
        "body": rng.randbytes(rng.randrange(0, 80)),
        "properties": props,
        "queue_id": rng.randrange(8),
        "queue_offset": rng.randrange(2**40),
        "born_timestamp": rng.randrange(2**41),
        "store_timestamp": rng.randrange(2**41),
        "born_host": host(),
        "store_host": host(),
        "sys_flag": rng.choice([0, 4, 8, 0xC]),
    }


# Valid segments to damage: generated once, so the examples below spend their time on the
# damage and the checks, not on generating records.
_rng = random.Random(20240611)
CORPUS = [[_corpus_message(_rng, i) for i in range(_rng.randrange(1, 5))] for _ in range(40)]


@given(
    msgs=st.sampled_from(CORPUS),
    mutations=st.lists(_mutation, min_size=1, max_size=3),
    base_units=st.integers(0, 1000),
)
@settings(FUZZ, max_examples=2000)
def test_mutated_records(
    msgs: list[dict[str, Any]], mutations: list[tuple[float, str, int]], base_units: int
) -> None:
    base = base_units * 1024
    buf, rel = encode_segment(msgs, base, [])
    damaged = mutate(buf, mutations)
    rel = [r for r in rel if r <= len(damaged)]
    check_against_reference(damaged, rel, base)
    check_walk(damaged, 0, base)


def test_mutation_sweep_hits_every_field() -> None:
    # Every single-byte change of one record, each with its own outcome: covers every field
    # deterministically, beside the random mutations above.
    buf, rel = encode_segment(
        [
            {
                "topic": "Topic",
                "body": b"body bytes",
                "properties": {"KEYS": "a b", "TAGS": "t", "UNIQ_KEY": "u"},
                "queue_id": 3,
                "queue_offset": 7,
                "born_timestamp": 1,
                "store_timestamp": 2,
                "born_host": "[fe80::1]:10911",
                "store_host": "10.1.2.3:10911",
                "sys_flag": 8,
            }
        ],
        4096,
        [],
    )
    rng = random.Random(7)
    for at in range(len(buf)):
        damaged = bytearray(buf)
        damaged[at] ^= 1 << rng.randrange(8)
        check_against_reference(bytes(damaged), rel, 4096)
        check_walk(bytes(damaged), 0, 4096)
