"""pipeline/format/record.py: the CommitLog record codec, properties, msgId and corruption checks."""

from __future__ import annotations

import struct
import zlib

import pytest

from rocketstore.pipeline.errors import CorruptRecordError, InvalidMessageError
from rocketstore.pipeline.format import record

V4 = "192.168.1.7:45678"
V4_STORE = "10.0.0.5:10911"
V6 = "[2001:db8::7]:45678"
V6_STORE = "[fe80::1:2]:10911"


def encode(**kw: object) -> bytes:
    args: dict[str, object] = {
        "topic": "TopicTest",
        "body": b"hello body",
        "properties": {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "ABCDEF"},
        "queue_id": 3,
        "queue_offset": 17,
        "physical_offset": 0,
        "born_timestamp": 1_700_000_000_123,
        "store_timestamp": 1_700_000_000_456,
        "born_host": V4,
        "store_host": V4_STORE,
    }
    args.update(kw)
    return record.encode_record(**args)  # type: ignore[arg-type]


def props_len(props: dict[str, str]) -> int:
    return len(record.encode_properties(props))


# -- layout and round trip -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("born", "store", "flag_bits", "extra"),
    [
        (V4, V4_STORE, 0, 0),
        (V6, V4_STORE, 0x10, 12),
        (V4, V6_STORE, 0x20, 12),
        (V6, V6_STORE, 0x30, 24),
    ],
)
def test_round_trip_v4_v6(born: str, store: str, flag_bits: int, extra: int) -> None:
    props = {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "ABCDEF", "x": "y"}
    body = bytes(range(256)) * 3
    raw = encode(
        body=body,
        properties=props,
        born_host=born,
        store_host=store,
        physical_offset=4096,
        sys_flag=record.TRANSACTION_COMMIT_TYPE,
        flag=7,
        reconsume_times=2,
        prepared_transaction_offset=99,
    )
    size = 91 + len(body) + len("TopicTest") + props_len(props) + extra
    assert len(raw) == size
    assert struct.unpack_from(">i", raw, 0)[0] == size
    assert struct.unpack_from(">i", raw, 4)[0] == record.MAGIC
    assert struct.unpack_from(">I", raw, 4)[0] == 0xDAA320A7
    sys_flag = struct.unpack_from(">i", raw, 36)[0]
    assert sys_flag == record.TRANSACTION_COMMIT_TYPE | flag_bits

    # decode at position 4096 of a buffer, as inside a segment
    buf = bytes(4096) + raw + bytes(50)
    m = record.decode_record(buf, 4096)
    assert m.topic == "TopicTest"
    assert m.body == body
    assert m.properties == props
    assert list(m.properties) == list(props)
    assert m.queue_id == 3
    assert m.queue_offset == 17
    assert m.commit_log_offset == 4096
    assert m.store_size == size
    assert m.born_timestamp == 1_700_000_000_123
    assert m.store_timestamp == 1_700_000_000_456
    assert m.born_host == born
    assert m.store_host == store
    assert m.sys_flag == record.TRANSACTION_COMMIT_TYPE | flag_bits
    assert m.flag == 7
    assert m.reconsume_times == 2
    assert m.prepared_transaction_offset == 99
    assert m.body_crc == zlib.crc32(body) & 0x7FFFFFFF
    assert m.tags == "TagA"
    assert m.keys == ["k1", "k2"]
    assert m.uniq_key == "ABCDEF"
    assert record.store_timestamp_at(buf, 4096) == 1_700_000_000_456
    addr_len = 16 if flag_bits & 0x20 else 4
    assert len(m.msg_id) == 2 * (addr_len + 4 + 8)
    assert m.msg_id.endswith(f"{4096:016X}")


def test_exact_byte_layout_v4() -> None:
    body = b"B" * 5
    raw = encode(
        topic="T1",
        body=body,
        properties={"a": "1"},
        queue_id=0x01020304,
        queue_offset=0x0A0B,
        physical_offset=0x77,
        born_host="1.2.3.4:5",
        store_host="6.7.8.9:10",
        born_timestamp=0x1111,
        store_timestamp=0x2222,
        flag=0x33,
        reconsume_times=0x44,
        prepared_transaction_offset=0x55,
    )
    expected = b"".join(
        [
            struct.pack(">i", 91 + 5 + 2 + 3),
            bytes.fromhex("DAA320A7"),
            struct.pack(">i", zlib.crc32(body) & 0x7FFFFFFF),
            struct.pack(">iiqqiq", 0x01020304, 0x33, 0x0A0B, 0x77, 0, 0x1111),
            bytes([1, 2, 3, 4]),
            struct.pack(">i", 5),
            struct.pack(">q", 0x2222),
            bytes([6, 7, 8, 9]),
            struct.pack(">i", 10),
            struct.pack(">iqi", 0x44, 0x55, 5),
            body,
            b"\x02T1",
            b"\x00\x03a\x011",
        ]
    )
    assert raw == expected


def test_v6_flag_bits_derived_from_hosts_not_caller() -> None:
    # Caller claims both hosts are IPv6, but they are IPv4: the bits are cleared.
    raw = encode(sys_flag=0x30 | record.MULTI_TAGS_FLAG)
    assert struct.unpack_from(">i", raw, 36)[0] == record.MULTI_TAGS_FLAG
    assert record.decode_record(raw, 0).born_host == V4


def test_empty_body_and_no_properties() -> None:
    raw = encode(body=b"", properties={})
    assert len(raw) == 91 + len("TopicTest")
    m = record.decode_record(raw, 0)
    assert m.body == b""
    assert m.properties == {}
    assert m.tags is None
    assert m.keys == []


def test_with_body_false_skips_body_only() -> None:
    raw = encode()
    m = record.decode_record(raw, 0, with_body=False)
    assert m.body == b""
    assert m.topic == "TopicTest"
    assert m.properties["TAGS"] == "TagA"


def test_explicit_crc_value_is_stored() -> None:
    raw = encode(body_crc_value=12345)
    assert struct.unpack_from(">i", raw, 8)[0] == 12345
    assert record.decode_record(raw, 0, check_crc=False).body_crc == 12345
    with pytest.raises(CorruptRecordError):
        record.decode_record(raw, 0)


# -- properties --------------------------------------------------------------------------


def test_property_encoding_keeps_order_without_trailing_separator() -> None:
    raw = record.encode_properties({"zeta": "1", "alpha": "two", "mid": ""})
    assert raw == b"zeta\x011\x02alpha\x01two\x02mid\x01"
    assert not raw.endswith(b"\x02")
    assert record.encode_properties({}) == b""
    assert record.encode_properties({"k": "v"}) == b"k\x01v"


def test_property_encoding_utf8() -> None:
    assert record.encode_properties({"k": "é"}) == b"k\x01\xc3\xa9"


@pytest.mark.parametrize("bad", [{"a\x01": "v"}, {"a": "v\x02"}, {"a\x02": "v"}, {"a": "\x01"}])
def test_property_with_separator_refused(bad: dict[str, str]) -> None:
    with pytest.raises(InvalidMessageError):
        record.encode_properties(bad)


@pytest.mark.parametrize("bad", [{"a\x00": "v"}, {"a": "v\x00"}, {"a": "\x00"}, {"\x00": "v"}])
def test_property_with_nul_refused(bad: dict[str, str]) -> None:
    # A NUL is what a torn write leaves in the properties: no record may hold one.
    with pytest.raises(InvalidMessageError, match="NUL"):
        record.encode_properties(bad)
    with pytest.raises(InvalidMessageError, match="NUL"):
        encode(properties=bad)


def test_decode_properties_skips_items_without_name_value_separator() -> None:
    raw = b"junk\x02a\x011\x02\x02alone\x02b\x012"
    assert record.decode_properties(raw) == {"a": "1", "b": "2"}
    assert list(record.decode_properties(b"z\x01last\x02a\x01first")) == ["z", "a"]
    assert record.decode_properties(b"") == {}
    assert record.decode_properties(memoryview(b"k\x01v")) == {"k": "v"}


def test_decode_properties_follows_rocketmq_split() -> None:
    # Java's split drops trailing empty parts, and only items of exactly two parts count:
    # a second separator or an empty value drops the item; an empty name does not.
    assert record.decode_properties(b"k\x01a\x01b\x02j\x01ok") == {"j": "ok"}
    assert record.decode_properties(b"e\x01\x02f\x01\x01\x02g\x01v\x01") == {"g": "v"}
    assert record.decode_properties(b"\x01v\x02\x01\x02\x01\x01") == {"": "v"}


# -- msgId -------------------------------------------------------------------------------


def test_msg_id_ipv4() -> None:
    field, v6 = record.encode_host("10.0.0.5:10911")
    assert not v6
    msg_id = record.make_msg_id(field, 0x1234)
    assert msg_id == "0A00000500002A9F0000000000001234"
    assert len(msg_id) == 32
    assert record.parse_msg_id(msg_id) == ("10.0.0.5:10911", 0x1234)
    assert record.parse_msg_id(msg_id.lower()) == ("10.0.0.5:10911", 0x1234)


def test_msg_id_ipv6() -> None:
    field, v6 = record.encode_host("[::1]:8080")
    assert v6
    msg_id = record.make_msg_id(field, 2**40 + 5)
    assert len(msg_id) == 56
    assert msg_id == "0" * 31 + "1" + "00001F90" + f"{2**40 + 5:016X}"
    assert record.parse_msg_id(msg_id) == ("[::1]:8080", 2**40 + 5)


def test_msg_id_matches_decoded_record() -> None:
    raw = encode(store_host=V6_STORE, physical_offset=777)
    m = record.decode_record(bytes(777) + raw, 777)
    assert record.parse_msg_id(m.msg_id) == (V6_STORE, 777)
    raw4 = encode(physical_offset=0)
    m4 = record.decode_record(raw4, 0)
    assert m4.msg_id == "0A00000500002A9F" + "0" * 16


@pytest.mark.parametrize("bad", ["", "ABC", "0" * 31, "0" * 33, "G" * 32, "0" * 55])
def test_parse_msg_id_refuses_malformed(bad: str) -> None:
    with pytest.raises(InvalidMessageError):
        record.parse_msg_id(bad)


@pytest.mark.parametrize("bad", ["1.2.3.4", "host:80", "1.2.3.4:x", "[::1]80", "1.2.3.4:-1"])
def test_parse_host_refuses_malformed(bad: str) -> None:
    with pytest.raises(InvalidMessageError):
        record.parse_host(bad)


# -- corruption --------------------------------------------------------------------------


PATH = "/store/commitlog/00000000000000000000"


def corrupt(raw: bytes, offset: int, fmt: str, value: int) -> bytes:
    buf = bytearray(raw)
    struct.pack_into(fmt, buf, offset, value)
    return bytes(buf)


def assert_corrupt(buf: bytes, pos: int = 0, *, phys: int = 5000, match: str | None = None) -> None:
    with pytest.raises(CorruptRecordError, match=match) as info:
        record.decode_record(buf, pos, path=PATH, phys=phys)
    err = info.value
    assert err.path == PATH
    assert err.offset == phys
    assert PATH in str(err)
    assert str(phys) in str(err)


def test_bad_magic() -> None:
    raw = encode(physical_offset=5000)
    assert_corrupt(corrupt(raw, 4, ">i", 0x12345678), match="magic")


def test_blank_where_message_expected() -> None:
    blank = record.SIZE_MAGIC.pack(100, record.BLANK_MAGIC) + bytes(92)
    assert_corrupt(blank, match="END_OF_FILE")


@pytest.mark.parametrize("size", [0, 90, -1])
def test_total_size_too_small(size: int) -> None:
    raw = encode(physical_offset=5000)
    assert_corrupt(corrupt(raw, 0, ">i", size), match="size")


def test_total_size_past_limit() -> None:
    raw = encode(physical_offset=5000)
    assert_corrupt(corrupt(raw, 0, ">i", len(raw) + 1), match="size")
    # a limit shorter than the record also counts
    with pytest.raises(CorruptRecordError):
        record.decode_record(raw, 0, path=PATH, phys=5000, limit=len(raw) - 1)


def test_truncated_header() -> None:
    raw = encode(physical_offset=5000)
    assert_corrupt(raw[:6], match="truncated")


def test_flipped_body_byte_fails_crc() -> None:
    raw = bytearray(encode(physical_offset=5000, body=b"0123456789"))
    raw[88 + 4] ^= 0x01  # a body byte (IPv4 hosts: body starts at 88)
    assert_corrupt(bytes(raw), match="CRC")
    m = record.decode_record(bytes(raw), 0, phys=5000, check_crc=False)
    assert m.body == b"0123556789"


def test_physical_offset_mismatch() -> None:
    raw = encode(physical_offset=4999)
    assert_corrupt(raw, match="PHYSICALOFFSET")
    # default phys is the position in the buffer
    with pytest.raises(CorruptRecordError, match="PHYSICALOFFSET"):
        record.decode_record(bytes(1) + encode(physical_offset=0), 1)


def test_body_length_larger_than_record() -> None:
    raw = encode(physical_offset=5000, body=b"abc")
    assert_corrupt(corrupt(raw, 84, ">i", 10_000), match="body length")
    assert_corrupt(corrupt(raw, 84, ">i", -1), match="body length")


def test_field_lengths_do_not_add_up() -> None:
    raw = encode(physical_offset=5000)
    # total size one larger than the fields (with a spare byte so the limit allows it)
    bigger = corrupt(raw, 0, ">i", len(raw) + 1) + b"\x00"
    assert_corrupt(bigger, match="add up")
    # properties length one short / one long
    plen_at = len(raw) - props_len({"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "ABCDEF"}) - 2
    plen = struct.unpack_from(">h", raw, plen_at)[0]
    assert_corrupt(corrupt(raw, plen_at, ">h", plen - 1), match="add up")
    assert_corrupt(corrupt(raw, plen_at, ">h", plen + 1) + bytes(8), match="add up")
    assert_corrupt(corrupt(raw, plen_at, ">h", -5), match="add up")
    # topic length larger than what is left
    tlen_at = 88 + len(b"hello body")
    assert raw[tlen_at] == len("TopicTest")
    assert_corrupt(corrupt(raw, tlen_at, ">B", 120))


def test_v6_flag_on_v4_record_is_corrupt() -> None:
    raw = encode(physical_offset=5000)
    flipped = corrupt(raw, 36, ">i", record.BORNHOST_V6_FLAG)
    assert_corrupt(flipped)


def torn(raw: bytes, cut: int) -> bytes:
    """What the disk holds of ``raw`` when a write kept only its first ``cut`` bytes."""
    return raw[:cut] + bytes(len(raw) - cut)


def test_a_write_torn_after_the_body_is_corrupt() -> None:
    props = {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "ABCDEF", "seq": "42"}
    raw = encode(physical_offset=5000, properties=props)
    props_at = len(raw) - props_len(props)
    topic_at = 88 + len(b"hello body") + 1
    # The body CRC still matches at every cut from the topic on. Before the properties the
    # zeroed PROPERTIESLENGTH no longer adds up; inside them only the zeros tell.
    for cut in range(topic_at, len(raw)):
        damaged = torn(raw, cut)
        want = "add up" if cut < props_at else "NUL byte in the properties"
        assert_corrupt(damaged, match=want)
        assert record.scan_record(damaged, 0, len(damaged), 5000, check_crc=True) is None
        assert record.scan_record(damaged, 0, len(damaged), 5000, check_crc=False) is None
    # Only the last byte lost: the UNIQ_KEY is whole, the user property "seq" is cut short.
    n = props_len(props)
    assert_corrupt(
        torn(raw, len(raw) - 1), match=f"NUL byte in the properties at byte {n - 1} of {n}:"
    )
    # Without properties a record ends with its topic and a zero PROPERTIESLENGTH.
    bare = encode(physical_offset=5000, properties={})
    assert_corrupt(torn(bare, len(bare) - 4), match="NUL byte in the topic at byte 7 of 9")
    assert record.decode_record(torn(bare, len(bare) - 2), 0, phys=5000).topic == "TopicTest"


def test_zeros_inside_the_properties_are_corrupt() -> None:
    # A lost page among large properties: the record's end is intact.
    props = {"UNIQ_KEY": "ABCDEF", "pad": "p" * 9000}
    raw = bytearray(encode(physical_offset=5000, properties=props))
    raw[len(raw) - 6000 : len(raw) - 6000 + 4096] = bytes(4096)
    assert_corrupt(bytes(raw), match="NUL byte in the properties")
    assert record.scan_record(raw, 0, len(raw), 5000, check_crc=True) is None


def test_a_whole_record_has_no_nul_where_a_tear_leaves_one() -> None:
    # What the rule rests on: a whole record's topic and properties hold no NUL, whatever else
    # they hold (non-ASCII text, other control characters); its body may be all zeros.
    props = {"KEYS": "a b", "p_utf8": "värde-ü-中", "x": "\x03\x7f"}
    raw = encode(physical_offset=5000, topic="%RETRY%grp|a_b-1", properties=props, body=bytes(9))
    m = record.decode_record(raw, 0, phys=5000)
    assert (m.topic, m.properties, m.body) == ("%RETRY%grp|a_b-1", props, bytes(9))
    assert record.torn_tail(b"T", b"k\x01v\x02k2\x01v2") is None
    assert (
        record.torn_tail(b"T\x00", b"")
        == "NUL byte in the topic at byte 1 of 2: a torn write's zeros"
    )


# -- refusals on encode ------------------------------------------------------------------


def test_topic_limits() -> None:
    encode(topic="t" * 127)
    with pytest.raises(InvalidMessageError, match="topic"):
        encode(topic="t" * 128)
    with pytest.raises(InvalidMessageError, match="topic"):
        encode(topic="")
    # the limit is in UTF-8 bytes, not characters
    with pytest.raises(InvalidMessageError, match="topic"):
        encode(topic="é" * 64)
    with pytest.raises(InvalidMessageError, match="NUL"):
        encode(topic="Topic\x00")


def test_properties_limit() -> None:
    fits = {"k": "v" * (32767 - 2)}
    assert props_len(fits) == 32767
    raw = encode(properties=fits)
    assert record.decode_record(raw, 0).properties == fits
    with pytest.raises(InvalidMessageError, match="32767"):
        encode(properties={"k": "v" * (32767 - 1)})


def test_bad_host_refused() -> None:
    with pytest.raises(InvalidMessageError):
        encode(born_host="not-a-host")
