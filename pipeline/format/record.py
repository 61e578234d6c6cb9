"""The CommitLog message record of Apache RocketMQ 4.9.x: layout, encoding, decoding.

Every integer is big-endian; strings are UTF-8. One record (both hosts IPv4)::

     0       4       8       12      16      20              28              36
    +-------+-------+-------+-------+-------+---------------+---------------+-------+
    |TOTAL  |MAGIC  |BODY   |QUEUE  |FLAG   |QUEUEOFFSET    |PHYSICALOFFSET |SYSFLAG|
    |SIZE   |CODE   |CRC    |ID     |       |(long)         |(long)         |       |
    +-------+-------+-------+-------+-------+---------------+---------------+-------+
     40              48              56              64              72
    +---------------+-------+-------+---------------+-------+-------+-------+
    |BORNTIMESTAMP  |BORN IP|BORN   |STORETIMESTAMP |STORE  |STORE  |RECON- |
    |(long)         |(4|16) |PORT   |(long)         |IP     |PORT   |SUME   |
    +---------------+-------+-------+---------------+-------+-------+-------+
     76              84      88               88+B  89+B       89+B+T 91+B+T
    +---------------+-------+------ - - ------+-----+--- - - ---+------+--- - - ---+
    |PREPARED TX    |BODY   |BODY (B bytes)   |TOPIC|TOPIC      |PROPS |PROPERTIES |
    |OFFSET (long)  |LENGTH |                 |LEN  |(T bytes)  |LEN   |(P bytes)  |
    +---------------+-------+------ - - ------+-----+--- - - ---+------+--- - - ---+

TOTALSIZE = 91 + B + T + P with IPv4 hosts; an IPv6 born host (SYSFLAG 0x10) or store host
(SYSFLAG 0x20) takes 16 address bytes instead of 4, shifting everything after it by 12.
TOPICLEN is a signed byte (topics are at most 127 bytes), PROPSLEN a signed short (at most
32767 bytes). BODYCRC is ``zlib.crc32(body) & 0x7FFFFFFF``. Properties are
``name \\x01 value`` pairs joined by ``\\x02``, with no trailing separator.

The CRC covers the body only, so a write torn after the body (zeros from some point of the
topic or properties on, or a lost page among them) keeps a valid-looking record with its
properties cut short. A whole record has no NUL byte in its topic (RocketMQ's topic rule is
``[%|a-zA-Z0-9_-]``) or its properties (puts refuse U+0000 there, as they refuse the
separators), so a NUL there marks the record as damaged: see :func:`torn_tail`.

When a record does not fit in the rest of a segment file (RocketMQ requires ``size + 8 <=
remaining``), the writer puts an 8-byte END_OF_FILE blank ``[int remaining][int BLANK_MAGIC]``
and the record goes whole into the next file.

A message id ("offset msgId") is the uppercase hex of STOREHOST's address bytes, its port as an
int and the record's physical offset as a long: 32 characters for IPv4, 56 for IPv6.

The numbers of this layout are defined once, in the native core, which reads and writes every
record in production (rocketstore.pipeline.format.native: the batch and single puts, the record walk of recovery
and ``verify``, the decoder behind every read). :func:`encode_record` and
:func:`decode_record` here are the readable reference the tests check the native core
against, record for record; nothing in production parses a whole record with them.

Pure functions over bytes; thread-safe.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import struct
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline import _native
from rocketstore.pipeline.errors import CorruptRecordError, InvalidMessageError

# The layout's numbers are defined once, in the native core (native/src/layout.rs), which
# reads and writes every record in production.
MAGIC: int = _native.MAGIC  # 0xDAA320A7, MESSAGE_MAGIC_CODE of RocketMQ 4.x
BLANK_MAGIC: int = _native.BLANK_MAGIC  # 0xCBD43194, BLANK_MAGIC_CODE
BLANK_SIZE: int = _native.BLANK_SIZE  # END_OF_FILE_MIN_BLANK_LENGTH

FIXED_SIZE_V4: int = _native.FIXED_SIZE_V4
HOST_EXTRA_V6 = 12

# SYSFLAG bits (MessageSysFlag)
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE: int = _native.TRANSACTION_COMMIT_TYPE
TRANSACTION_ROLLBACK_TYPE: int = _native.TRANSACTION_ROLLBACK_TYPE
TRANSACTION_MASK: int = _native.TRANSACTION_MASK
BORNHOST_V6_FLAG: int = _native.BORNHOST_V6_FLAG
STOREHOSTADDRESS_V6_FLAG: int = _native.STOREHOSTADDRESS_V6_FLAG

MAX_TOPIC_LENGTH = 127
MAX_PROPERTIES_LENGTH = 32767

# Property names (MessageConst)
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
# What a torn write leaves in a record's topic and properties; no whole record has one there.
NUL = "\x00"
KEY_SEPARATOR = " "

# Layout pieces. HEAD covers offsets 0..48 (through BORNTIMESTAMP), identical for every record.
HEAD = struct.Struct(">iiiiiqqiq")
HEAD_SIZE = HEAD.size  # 48
# The same 48 bytes as a numpy record, for whole batches of headers at once.
HEAD_DTYPE = np.dtype(
    [
        ("size", ">i4"),
        ("magic", ">i4"),
        ("crc", ">i4"),
        ("queue_id", ">i4"),
        ("flag", ">i4"),
        ("queue_offset", ">i8"),
        ("phys", ">i8"),
        ("sys_flag", ">i4"),
        ("born_ts", ">i8"),
    ]
)
assert HEAD_DTYPE.itemsize == HEAD_SIZE
SIZE_MAGIC = struct.Struct(">ii")
INT = struct.Struct(">i")
LONG = struct.Struct(">q")
SHORT = struct.Struct(">h")
HOST_V4 = struct.Struct(">4si")
HOST_V6 = struct.Struct(">16si")
# After the store host: RECONSUMETIMES, PREPAREDTRANSACTIONOFFSET, BODYLENGTH.
TAIL = struct.Struct(">iqi")

OFF_TOTALSIZE: int = _native.OFF_TOTALSIZE
OFF_MAGIC: int = _native.OFF_MAGIC
OFF_BODYCRC: int = _native.OFF_BODYCRC
OFF_QUEUEID: int = _native.OFF_QUEUEID
OFF_FLAG: int = _native.OFF_FLAG
OFF_QUEUEOFFSET: int = _native.OFF_QUEUEOFFSET
OFF_PHYSICALOFFSET: int = _native.OFF_PHYSICALOFFSET
OFF_SYSFLAG: int = _native.OFF_SYSFLAG
OFF_BORNTIMESTAMP: int = _native.OFF_BORNTIMESTAMP
OFF_BORNHOST: int = _native.OFF_BORNHOST


def body_crc(body: bytes | bytearray | memoryview) -> int:
    """BODYCRC as RocketMQ stores it (``UtilAll.crc32``: the CRC-32 masked to 31 bits)."""
    return zlib.crc32(body) & 0x7FFFFFFF


def transaction_type(sys_flag: int) -> int:
    return sys_flag & TRANSACTION_MASK


def consume_queue_mask(sys_flags: npt.NDArray[np.int32]) -> npt.NDArray[np.bool_]:
    """Which records get a ConsumeQueue unit: RocketMQ gives none to PREPARED and ROLLBACK
    transaction records (the dispatch and the segment index both follow this rule)."""
    tx = sys_flags & TRANSACTION_MASK
    return np.asarray((tx == TRANSACTION_NOT_TYPE) | (tx == TRANSACTION_COMMIT_TYPE), dtype=bool)


# -- hosts ---------------------------------------------------------------------------------


def parse_host(text: str) -> tuple[bytes, int]:
    """``"ip:port"`` or ``"[v6]:port"`` -> (4 or 16 address bytes, port)."""
    try:
        if text.startswith("["):
            addr_text, _, port_text = text[1:].partition("]:")
        else:
            addr_text, _, port_text = text.rpartition(":")
        addr = ipaddress.ip_address(addr_text)
        port = int(port_text)
    except ValueError:
        raise InvalidMessageError(
            f"host {text!r} is not 'ip:port' (IPv6 as '[addr]:port')"
        ) from None
    if not 0 <= port <= 0x7FFFFFFF:
        raise InvalidMessageError(f"host {text!r}: port out of range")
    return addr.packed, port


def format_host_bytes(addr: bytes, port: int) -> str:
    ip = ipaddress.ip_address(addr)
    if ip.version == 6:
        return f"[{ip.compressed}]:{port}"
    return f"{ip}:{port}"


def encode_host(text: str) -> tuple[bytes, bool]:
    """Host field bytes (address then int port) and whether it is IPv6."""
    addr, port = parse_host(text)
    return addr + INT.pack(port), len(addr) == 16


# -- properties ----------------------------------------------------------------------------


def encode_properties(props: Mapping[str, str]) -> bytes:
    """``k\\x01v\\x02k\\x01v`` in the mapping's order (order is part of the bytes).

    Names and values must not hold the separators, which would split the field, nor NUL, which
    readers take for a torn write (:func:`torn_tail`)."""
    for name, value in props.items():
        for part, what in ((name, "name"), (value, "value")):
            if NAME_VALUE_SEPARATOR in part or PROPERTY_SEPARATOR in part:
                raise InvalidMessageError(
                    f"property {what} {part!r} contains a reserved separator (\\x01 or \\x02)"
                )
            if NUL in part:
                raise InvalidMessageError(f"property {what} {part!r} contains a NUL (\\x00)")
    return PROPERTY_SEPARATOR.join(
        f"{k}{NAME_VALUE_SEPARATOR}{v}" for k, v in props.items()
    ).encode("utf-8")


def decode_properties(raw: bytes | memoryview) -> dict[str, str]:
    """Inverse of :func:`encode_properties`, keeping the stored order; RocketMQ 4.9.x's
    ``MessageDecoder.string2messageProperties`` rule, the one every reader of this project
    follows (the native decoder too).

    Items split on ``\x02``; each item splits on ``\x01`` as Java's ``String.split`` does
    (trailing empty parts dropped) and is kept only when that gives exactly two parts. So an
    item without a separator, one with an empty value (``k\x01``) and one with a second
    separator (``k\x01a\x01b``) are skipped; an empty name (``\x01v``) is kept. A later item
    of the same name replaces the earlier one's value. Bytes that are not UTF-8 decode as
    U+FFFD, as Java's ``new String(bytes, UTF_8)`` does.
    """
    if not raw:
        return {}
    text = bytes(raw).decode("utf-8", errors="replace")
    props: dict[str, str] = {}
    for item in text.split(PROPERTY_SEPARATOR):
        parts = item.rstrip(NAME_VALUE_SEPARATOR).split(NAME_VALUE_SEPARATOR)
        if len(parts) == 2:
            props[parts[0]] = parts[1]
    return props


# -- msgId ---------------------------------------------------------------------------------


def make_msg_id(store_host: bytes, phys_offset: int) -> str:
    """Offset msgId from STOREHOST field bytes (address + int port) and the physical offset."""
    return (store_host + LONG.pack(phys_offset)).hex().upper()


def parse_msg_id(msg_id: str) -> tuple[str, int]:
    """(store host ``ip:port``, physical offset) of an offset msgId; raises on a malformed id."""
    text = msg_id.strip()
    if len(text) not in (32, 56):
        raise InvalidMessageError(
            f"msgId {msg_id!r}: expected 32 (IPv4) or 56 (IPv6) hex characters, got {len(text)}"
        )
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise InvalidMessageError(f"msgId {msg_id!r}: not hexadecimal") from None
    addr_len = len(raw) - 12
    port = INT.unpack_from(raw, addr_len)[0]
    return format_host_bytes(raw[:addr_len], port), LONG.unpack_from(raw, addr_len + 4)[0]


# -- the decoded record ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class MessageExt:
    """One stored message, with the fields RocketMQ's ``MessageExt`` exposes."""

    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    store_size: int
    store_timestamp: int
    born_timestamp: int
    born_host: str
    store_host: str
    sys_flag: int
    flag: int
    reconsume_times: int
    prepared_transaction_offset: int
    body_crc: int
    properties: dict[str, str]
    body: bytes
    msg_id: str

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(PROPERTY_KEYS)
        return [k for k in raw.split(KEY_SEPARATOR) if k] if raw else []

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)

    def to_json(self) -> dict[str, Any]:
        """Fields named as RocketMQ's ``MessageExt`` getters; body as base64."""
        import base64

        return {
            "topic": self.topic,
            "queueId": self.queue_id,
            "queueOffset": self.queue_offset,
            "commitLogOffset": self.commit_log_offset,
            "storeSize": self.store_size,
            "storeTimestamp": self.store_timestamp,
            "bornTimestamp": self.born_timestamp,
            "bornHost": self.born_host,
            "storeHost": self.store_host,
            "sysFlag": self.sys_flag,
            "flag": self.flag,
            "reconsumeTimes": self.reconsume_times,
            "preparedTransactionOffset": self.prepared_transaction_offset,
            "msgId": self.msg_id,
            "keys": self.properties.get(PROPERTY_KEYS),
            "tags": self.tags,
            "bodyCRC": self.body_crc,
            "properties": dict(self.properties),
            "body": base64.b64encode(self.body).decode("ascii"),
        }


# -- encoding ------------------------------------------------------------------------------


def record_size(
    body_len: int, topic_len: int, props_len: int, born_v6: bool, store_v6: bool
) -> int:
    return (
        FIXED_SIZE_V4
        + body_len
        + topic_len
        + props_len
        + (HOST_EXTRA_V6 if born_v6 else 0)
        + (HOST_EXTRA_V6 if store_v6 else 0)
    )


def encode_record(
    *,
    topic: str,
    body: bytes,
    properties: Mapping[str, str],
    queue_id: int,
    queue_offset: int,
    physical_offset: int,
    born_timestamp: int,
    store_timestamp: int,
    born_host: str,
    store_host: str,
    sys_flag: int = 0,
    flag: int = 0,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    body_crc_value: int | None = None,
) -> bytes:
    """Encode one record. The host v6 bits of ``sys_flag`` are derived from the hosts."""
    born, born_v6 = encode_host(born_host)
    store, store_v6 = encode_host(store_host)
    sys_flag &= ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
    sys_flag |= (BORNHOST_V6_FLAG if born_v6 else 0) | (STOREHOSTADDRESS_V6_FLAG if store_v6 else 0)
    topic_b = topic.encode("utf-8")
    props_b = encode_properties(properties)
    if not 0 < len(topic_b) <= MAX_TOPIC_LENGTH:
        raise InvalidMessageError(f"topic {topic!r}: must be 1-{MAX_TOPIC_LENGTH} bytes of UTF-8")
    if NUL in topic:
        raise InvalidMessageError(f"topic {topic!r}: contains a NUL (\\x00)")
    if len(props_b) > MAX_PROPERTIES_LENGTH:
        raise InvalidMessageError(
            f"properties are {len(props_b)} bytes encoded; at most {MAX_PROPERTIES_LENGTH} allowed"
        )
    size = record_size(len(body), len(topic_b), len(props_b), born_v6, store_v6)
    crc = body_crc(body) if body_crc_value is None else body_crc_value
    return b"".join(
        (
            HEAD.pack(
                size,
                MAGIC,
                crc,
                queue_id,
                flag,
                queue_offset,
                physical_offset,
                sys_flag,
                born_timestamp,
            ),
            born,
            LONG.pack(store_timestamp),
            store,
            TAIL.pack(reconsume_times, prepared_transaction_offset, len(body)),
            body,
            bytes((len(topic_b),)),
            topic_b,
            SHORT.pack(len(props_b)),
            props_b,
        )
    )


# -- decoding ------------------------------------------------------------------------------


def torn_tail(topic: bytes, props: bytes) -> str | None:
    """Why a record's topic and properties cannot be a whole record's (the first NUL byte in
    them), or None.

    RocketMQ's CRC covers only the body; a write torn after it leaves zeros in the topic or
    properties while every length still adds up. A whole record has no NUL there: topics follow
    RocketMQ's topic rule ``[%|a-zA-Z0-9_-]`` (the 4.9 client and broker enforce it, and so do
    puts here), and puts here refuse U+0000 in property names and values. RocketMQ's own client
    does not (``putUserProperty`` refuses only blank values), so a record in which a RocketMQ
    application stored a NUL property reads as damaged: a tear leaves exactly those bytes, and
    nothing else could tell the two apart. Only NUL is looked for, as a tear writes nothing
    else; a stricter rule would catch no more tears and could refuse other writers' records.
    """
    for what, field in (("topic", topic), ("properties", props)):
        at = field.find(0)
        if at >= 0:
            return f"NUL byte in the {what} at byte {at} of {len(field)}: a torn write's zeros"
    return None


def check_size_magic(buf: Any, pos: int, limit: int, path: str, phys: int) -> tuple[int, int]:
    """(TOTALSIZE, MAGIC) at ``pos``; raises when the header cannot be a record or blank."""
    if pos + 8 > limit:
        raise CorruptRecordError(path, phys, f"truncated header: {limit - pos} bytes left")
    size, magic = SIZE_MAGIC.unpack_from(buf, pos)
    if magic == BLANK_MAGIC:
        return size, magic
    if magic != MAGIC:
        raise CorruptRecordError(path, phys, f"bad magic code 0x{magic & 0xFFFFFFFF:08X}")
    if size < FIXED_SIZE_V4 or pos + size > limit:
        raise CorruptRecordError(path, phys, f"bad total size {size} ({limit - pos} bytes left)")
    return size, magic


def decode_record(
    buf: Any,
    pos: int,
    *,
    path: str = "<buffer>",
    phys: int | None = None,
    limit: int | None = None,
    check_crc: bool = True,
    with_body: bool = True,
) -> MessageExt:
    """Decode the record at ``buf[pos:]``.

    ``phys`` is its physical offset (used in errors and checked against PHYSICALOFFSET; defaults
    to ``pos``). Raises :class:`CorruptRecordError` naming ``path`` and the offset if the magic,
    sizes, physical offset or body CRC are wrong, or the topic or properties hold a NUL
    (:func:`torn_tail`): a damaged record is never returned.
    """
    phys = pos if phys is None else phys
    limit = len(buf) if limit is None else limit
    size, magic = check_size_magic(buf, pos, limit, path, phys)
    if magic != MAGIC:
        raise CorruptRecordError(path, phys, "END_OF_FILE blank where a message was expected")
    (
        _,
        _,
        crc,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sys_flag,
        born_ts,
    ) = HEAD.unpack_from(buf, pos)
    p = pos + HEAD_SIZE
    try:
        born_fmt = HOST_V6 if sys_flag & BORNHOST_V6_FLAG else HOST_V4
        born_addr, born_port = born_fmt.unpack_from(buf, p)
        p += born_fmt.size
        store_ts = LONG.unpack_from(buf, p)[0]
        p += 8
        store_fmt = HOST_V6 if sys_flag & STOREHOSTADDRESS_V6_FLAG else HOST_V4
        store_start = p
        store_addr, store_port = store_fmt.unpack_from(buf, p)
        p += store_fmt.size
        store_raw = bytes(buf[store_start:p])
        reconsume, prep_tx, body_len = TAIL.unpack_from(buf, p)
        p += TAIL.size
        body, topic_raw, props_raw = _variable_fields(buf, p, body_len, pos, size, path, phys)
    except struct.error:
        raise CorruptRecordError(path, phys, f"record runs past its total size {size}") from None
    if physical_offset != phys:
        raise CorruptRecordError(
            path, phys, f"PHYSICALOFFSET field says {physical_offset}, record is at {phys}"
        )
    if check_crc and body_crc(body) != crc:
        raise CorruptRecordError(
            path, phys, f"body CRC mismatch: stored {crc}, computed {body_crc(body)}"
        )
    topic = _whole_topic(topic_raw, props_raw, path, phys)
    return MessageExt(
        topic=topic,
        queue_id=queue_id,
        queue_offset=queue_offset,
        commit_log_offset=phys,
        store_size=size,
        store_timestamp=store_ts,
        born_timestamp=born_ts,
        born_host=format_host_bytes(born_addr, born_port),
        store_host=format_host_bytes(store_addr, store_port),
        sys_flag=sys_flag,
        flag=flag,
        reconsume_times=reconsume,
        prepared_transaction_offset=prep_tx,
        body_crc=crc,
        properties=decode_properties(props_raw),
        body=body if with_body else b"",
        msg_id=make_msg_id(store_raw, phys),
    )


def _variable_fields(
    buf: Any, p: int, body_len: int, pos: int, size: int, path: str, phys: int
) -> tuple[bytes, bytes, bytes]:
    """(body, topic, properties) of the record of ``size`` bytes at ``pos``, whose body of
    ``body_len`` bytes starts at ``p``; raises when the lengths do not add up to ``size``."""
    end = pos + size
    if body_len < 0 or p + body_len + 3 > end:
        raise CorruptRecordError(path, phys, f"body length {body_len} exceeds record size {size}")
    body = bytes(buf[p : p + body_len])
    p += body_len
    topic_len = buf[p]
    p += 1
    topic_raw = bytes(buf[p : p + topic_len])
    p += topic_len
    props_len = SHORT.unpack_from(buf, p)[0]
    p += 2
    if props_len < 0 or p + props_len != end:
        raise CorruptRecordError(path, phys, f"field lengths do not add up to total size {size}")
    return body, topic_raw, bytes(buf[p : p + props_len])


def _whole_topic(topic_raw: bytes, props_raw: bytes, path: str, phys: int) -> str:
    """The topic of a record whose topic and properties hold no NUL (:func:`torn_tail`)."""
    torn = torn_tail(topic_raw, props_raw)
    if torn is not None:
        raise CorruptRecordError(path, phys, torn)
    try:
        return topic_raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptRecordError(path, phys, "topic is not valid UTF-8") from None


# (TOTALSIZE, QUEUEID, QUEUEOFFSET, SYSFLAG, STORETIMESTAMP, topic bytes, properties bytes)
ScannedRecord = tuple[int, int, int, int, int, bytes, bytes]


def scan_record(
    buf: Any, pos: int, limit: int, phys: int, *, check_crc: bool
) -> ScannedRecord | None:
    """The fields dispatch needs from the record at ``pos``, or None if it is not a whole,
    valid record (magic, sizes, PHYSICALOFFSET == ``phys``, the body CRC if asked, and no NUL
    in the topic or properties).

    The lean twin of :func:`decode_record` for scans over many records (recovery, dispatch):
    no message object, no host or msgId formatting.
    """
    if pos + HEAD_SIZE > limit:
        return None
    size, magic, crc, queue_id, _, queue_offset, physical, sys_flag, _ = HEAD.unpack_from(buf, pos)
    end = pos + size
    if magic != MAGIC or size < FIXED_SIZE_V4 or end > limit or physical != phys:
        return None
    p = pos + HEAD_SIZE + (20 if sys_flag & BORNHOST_V6_FLAG else 8)
    store_ts = LONG.unpack_from(buf, p)[0]
    p += 8 + (20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8) + 12
    body_len = INT.unpack_from(buf, p)[0]
    p += 4
    body_start = p
    p += body_len
    if body_len < 0 or p + 3 > end:
        return None
    topic_len = buf[p]
    topic = bytes(buf[p + 1 : p + 1 + topic_len])
    p += 1 + topic_len
    if p + 2 > end:
        return None
    props_len = SHORT.unpack_from(buf, p)[0]
    p += 2
    if props_len < 0 or p + props_len != end:
        return None
    if check_crc and zlib.crc32(buf[body_start : body_start + body_len]) & 0x7FFFFFFF != crc:
        return None
    props = bytes(buf[p:end])
    if torn_tail(topic, props) is not None:
        return None
    return size, queue_id, queue_offset, sys_flag, store_ts, topic, props


def store_timestamp_at(buf: Any, pos: int) -> int:
    """STORETIMESTAMP of the record at ``pos`` (RocketMQ's ``pickupStoreTimestamp``)."""
    sys_flag = INT.unpack_from(buf, pos + OFF_SYSFLAG)[0]
    born_len = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    return int(LONG.unpack_from(buf, pos + OFF_BORNHOST + born_len)[0])
