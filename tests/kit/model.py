"""A plain in-memory model of a message store, for the property tests in test_store_model.py.

The model knows nothing about files, mmap, numpy or Arrow. It keeps every stored message as the
:class:`~rocketstore.pipeline.format.record.MessageExt` a reader should get back and answers every read the store
answers, from first principles:

* CommitLog placement: records are appended back to back; a record that does not leave at least
  8 bytes free in its segment (the END_OF_FILE blank) starts the next segment instead.
* Record size: 91 bytes of fixed fields, plus the body, the UTF-8 topic and the encoded
  properties, plus 12 bytes per IPv6 host.
* Queues: every NOT_TYPE or COMMIT message takes the next offset of its (topic, queueId);
  PREPARED and ROLLBACK messages take none and carry queue offset 0.
* Key index: a message is found by its UNIQ_KEY and by every space-separated token of its KEYS,
  unless it is a ROLLBACK; results are newest first (highest CommitLog offset first).
* ``offset_by_time``: see :meth:`StoreModel.offset_by_time`.

Hashes (the ConsumeQueue ``tagsCode``) are computed here with a straightforward Java
``String.hashCode``, independent of the engine's vectorised one.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import zlib
from collections.abc import Iterable, Sequence

from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.format.record import MessageExt

FIXED_SIZE = 91
V6_EXTRA = 12
BLANK_SIZE = 8
CQ_UNIT_SIZE = 20
PREPARED, COMMIT, ROLLBACK = 0x4, 0x8, 0xC
TX_MASK = 0xC
BORN_V6, STORE_V6 = 0x10, 0x20
GET_SCAN_MIN_UNITS = 800  # RocketMQ scans max(16000 bytes, 20 * maxMsgNums bytes) of units


def java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units) as a signed 32-bit int."""
    h = 0
    for ch in text:
        cp = ord(ch)
        if cp > 0xFFFF:
            cp -= 0x10000
            units: Iterable[int] = (0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF))
        else:
            units = (cp,)
        for u in units:
            h = (h * 31 + u) % (1 << 32)
    return h - (1 << 32) if h >= 1 << 31 else h


def java_trim(text: str) -> str:
    """Java's ``String.trim``: strips characters <= U+0020 at both ends."""
    start, end = 0, len(text)
    while start < end and text[start] <= " ":
        start += 1
    while end > start and text[end - 1] <= " ":
        end -= 1
    return text[start:end]


def parse_host(text: str) -> tuple[bytes, int, str]:
    """``ip:port`` / ``[v6]:port`` -> (address bytes, port, canonical text)."""
    if text.startswith("["):
        addr_text, port_text = text[1:].split("]:")
    else:
        addr_text, port_text = text.rsplit(":", 1)
    ip = ipaddress.ip_address(addr_text)
    port = int(port_text)
    canonical = f"[{ip.compressed}]:{port}" if ip.version == 6 else f"{ip}:{port}"
    return ip.packed, port, canonical


def keys_text(keys: Sequence[str] | str | None) -> str:
    """The KEYS property a message carries ("" for none), as a producer joins its keys."""
    if keys is None:
        return ""
    if isinstance(keys, str):
        return " ".join(k for k in keys.split(" ") if k)
    return " ".join(keys)


def properties_of(m: Message, uniq_key: str) -> dict[str, str]:
    """The stored properties, in stored order: KEYS, TAGS, UNIQ_KEY, then the user's."""
    props: dict[str, str] = {}
    keys = keys_text(m.keys)
    if keys:
        props["KEYS"] = keys
    if m.tags:
        props["TAGS"] = m.tags
    props["UNIQ_KEY"] = uniq_key
    props.update(m.properties or {})
    return props


def read_back(props: dict[str, str]) -> dict[str, str]:
    """The stored properties as a reader sees them: RocketMQ's ``string2messageProperties``
    keeps only items that split into exactly two non-empty-ended parts, so a property stored
    with an empty value does not come back."""
    return {name: value for name, value in props.items() if value}


def encode_properties(props: dict[str, str]) -> bytes:
    return "\x02".join(f"{k}\x01{v}" for k, v in props.items()).encode("utf-8")


def parse_subscription(expression: str | None) -> frozenset[str] | None:
    """Tags of ``TagA || TagB`` (None: every message), as the store documents it."""
    trim = "".join(chr(c) for c in range(0x21))  # Java's String.trim() strips only these
    # RocketMQ's FilterAPI: only null, "" and "*" mean everything; each "||" part is trimmed.
    if expression is None or expression in ("", "*"):
        return None
    tags = frozenset(t.strip(trim) for t in expression.split("||") if t.strip(trim))
    return tags  # may be empty: then nothing matches, as in RocketMQ


@dataclasses.dataclass(frozen=True)
class Stored:
    ext: MessageExt
    tokens: frozenset[str]  # KEYS tokens

    @property
    def tx(self) -> int:
        return self.ext.sys_flag & TX_MASK

    @property
    def consumable(self) -> bool:
        return self.tx not in (PREPARED, ROLLBACK)


@dataclasses.dataclass(frozen=True)
class Unit:
    offset: int
    size: int
    tags_code: int


class StoreModel:
    def __init__(
        self,
        *,
        segment_size: int,
        cq_file_size: int,
        store_ip: str,
        store_port: int,
        max_msgs_num_batch: int,
        index_enabled: bool = True,
    ) -> None:
        self.segment_size = segment_size
        self.units_per_cq_file = cq_file_size // CQ_UNIT_SIZE
        ip = ipaddress.ip_address(store_ip)
        self.store_v6 = ip.version == 6
        self.store_field = ip.packed + store_port.to_bytes(4, "big")
        self.store_host = (
            f"[{ip.compressed}]:{store_port}" if self.store_v6 else f"{ip}:{store_port}"
        )
        self.max_msgs_num_batch = max_msgs_num_batch
        self.index_enabled = index_enabled
        self.end = 0  # max physical offset
        self.messages: list[Stored] = []  # CommitLog order
        self.by_phys: dict[int, Stored] = {}
        self.queues: dict[tuple[str, int], list[Stored]] = {}

    # -- derived values ---------------------------------------------------------------------
    def msg_id(self, phys: int) -> str:
        return (self.store_field + phys.to_bytes(8, "big")).hex().upper()

    def record_size(self, m: Message, uniq_key: str) -> int:
        born_v6 = self.store_v6 if m.born_host is None else len(parse_host(m.born_host)[0]) == 16
        return (
            FIXED_SIZE
            + len(m.body)
            + len(m.topic.encode("utf-8"))
            + len(encode_properties(properties_of(m, uniq_key)))
            + (V6_EXTRA if born_v6 else 0)
            + (V6_EXTRA if self.store_v6 else 0)
        )

    def _place(self, size: int) -> int:
        seg = self.segment_size
        file_end = (self.end // seg + 1) * seg
        if self.end + size + BLANK_SIZE > file_end:
            self.end = file_end
        phys = self.end
        self.end += size
        return phys

    # -- writing ----------------------------------------------------------------------------
    def put_batch(
        self, batch: Sequence[Message], store_ts: int, uniq_keys: Sequence[str]
    ) -> list[Stored]:
        """Store a batch; ``uniq_keys`` are the keys the store reported (generated ones included)."""
        out = []
        for m, uniq in zip(batch, uniq_keys, strict=True):
            # Without a born host, the message was born on the store host.
            born_addr, _, born_text = parse_host(m.born_host or self.store_host)
            sys_flag = m.sys_flag
            if len(born_addr) == 16:
                sys_flag |= BORN_V6
            if self.store_v6:
                sys_flag |= STORE_V6
            size = self.record_size(m, uniq)
            phys = self._place(size)
            qkey = (m.topic, m.queue_id)
            queue = self.queues.get(qkey, [])
            consumable = sys_flag & TX_MASK not in (PREPARED, ROLLBACK)
            ext = MessageExt(
                topic=m.topic,
                queue_id=m.queue_id,
                queue_offset=len(queue) if consumable else 0,
                commit_log_offset=phys,
                store_size=size,
                store_timestamp=store_ts,
                born_timestamp=store_ts if m.born_timestamp is None else m.born_timestamp,
                born_host=born_text,
                store_host=self.store_host,
                sys_flag=sys_flag,
                flag=m.flag,
                reconsume_times=m.reconsume_times,
                prepared_transaction_offset=m.prepared_transaction_offset,
                body_crc=zlib.crc32(m.body) & 0x7FFFFFFF,
                properties=read_back(properties_of(m, uniq)),
                body=bytes(m.body),
                msg_id=self.msg_id(phys),
            )
            stored = Stored(ext, frozenset(t for t in keys_text(m.keys).split(" ") if t))
            if consumable:
                self.queues[qkey] = [*queue, stored]
            self.messages.append(stored)
            self.by_phys[phys] = stored
            out.append(stored)
        return out

    # -- reading ----------------------------------------------------------------------------
    def units(self, topic: str, queue_id: int) -> list[Unit]:
        return [
            Unit(
                s.ext.commit_log_offset,
                s.ext.store_size,
                java_hash(s.ext.tags) if s.ext.tags else 0,
            )
            for s in self.queues.get((topic, queue_id), [])
        ]

    def queue_infos(self) -> list[tuple[str, int, int, int, int]]:
        """(topic, queueId, minOffset, maxOffset, maxPhysicOffset), sorted."""
        return [
            (t, q, 0, len(msgs), msgs[-1].ext.commit_log_offset + msgs[-1].ext.store_size)
            for (t, q), msgs in sorted(self.queues.items())
        ]

    def get(
        self, topic: str, queue_id: int, offset: int, max_count: int, expression: str | None
    ) -> tuple[str, list[MessageExt], int, int, int]:
        """(status, messages, nextBeginOffset, minOffset, maxOffset) of a pull.

        Statuses and next offsets are RocketMQ's (DefaultMessageStore.getMessage on a master):
        no queue, offset below the minimum, offset at the end, offset past the end; otherwise
        units from ``offset`` on are filtered by tag, scanning at most max(800, max_count) units
        (RocketMQ's 16000-byte budget), and the next offset is just after the last unit looked
        at. Past the end, the next offset is the minimum when the queue starts at 0.
        """
        queue = self.queues.get((topic, queue_id))
        if not queue:
            return ("NO_MATCHED_LOGIC_QUEUE", [], 0, 0, 0)
        hi = len(queue)
        if offset < 0:
            return ("OFFSET_TOO_SMALL", [], 0, 0, hi)
        if offset == hi:
            return ("OFFSET_OVERFLOW_ONE", [], offset, 0, hi)
        if offset > hi:
            return ("OFFSET_OVERFLOW_BADLY", [], 0, 0, hi)
        tags = parse_subscription(expression)
        stop = min(hi, offset + max(GET_SCAN_MIN_UNITS, max_count))
        found: list[MessageExt] = []
        pos = offset
        while pos < stop and len(found) < max_count:
            s = queue[pos]
            pos += 1
            if tags is None or s.ext.tags in tags:
                found.append(s.ext)
        return ("FOUND" if found else "NO_MATCHED_MESSAGE", found, pos, 0, hi)

    def query_by_key(
        self, topic: str, key: str, begin: int, end: int, max_count: int | None
    ) -> list[MessageExt]:
        """Every non-ROLLBACK message of ``topic`` whose UNIQ_KEY is ``key`` or whose KEYS hold
        the token ``key``, stored in ``[begin, end]``, newest first, capped at
        min(max_count or maxMsgsNumBatch, maxMsgsNumBatch)."""
        limit = min(max_count or self.max_msgs_num_batch, self.max_msgs_num_batch)
        hits = [
            s.ext
            for s in reversed(self.messages)
            if s.ext.topic == topic
            and s.tx != ROLLBACK
            and begin <= s.ext.store_timestamp <= end
            and (key == s.ext.uniq_key or key in s.tokens)
        ]
        return hits[:limit]

    def offset_by_time(self, topic: str, queue_id: int, ts: int) -> set[int]:
        """The queue offsets ``offset_by_time(topic, queue_id, ts)`` may answer.

        RocketMQ's ``getOffsetInQueueByTime`` first picks one ConsumeQueue file (the first one
        written at or after ``ts``, else the last; the store judges "written" by the store time
        of the file's last unit) and searches only inside it: the unit whose store time equals
        ``ts``, else the nearer of its neighbours (the left one on a tie), clamped to the file's
        first and last units. The model groups a queue's units into files of
        ``mappedFileSizeConsumeQueue / 20`` units, as the store lays them out, and applies that
        rule to the chosen file. Store times within a queue never decrease (the test clock only
        moves forward), so the neighbours are unique and the answer is a single offset; the one
        exception is several units of one batch sharing exactly the time ``ts``, where the
        binary search may land on any of them, and the model returns them all.
        """
        queue = self.queues.get((topic, queue_id))
        if not queue:
            return {0}
        times = [s.ext.store_timestamp for s in queue]
        per = self.units_per_cq_file
        files = [range(i, min(i + per, len(times))) for i in range(0, len(times), per)]
        chosen = next((f for f in files if times[f[-1]] >= ts), files[-1])
        equal = {i for i in chosen if times[i] == ts}
        if equal:
            return equal
        left = [i for i in chosen if times[i] < ts]
        right = [i for i in chosen if times[i] > ts]
        if not left:
            return {right[0]}
        if not right:
            return {left[-1]}
        lo, hi = left[-1], right[0]
        return {hi} if abs(ts - times[lo]) > abs(ts - times[hi]) else {lo}

    # -- helpers for the tests --------------------------------------------------------------
    def topics(self) -> list[str]:
        return sorted({s.ext.topic for s in self.messages})

    def all_keys(self) -> set[tuple[str, str]]:
        """(topic, key) of every key any message was stored with (ROLLBACK ones included)."""
        out = set()
        for s in self.messages:
            out.add((s.ext.topic, s.ext.uniq_key or ""))
            out.update((s.ext.topic, t) for t in s.tokens)
        return out

    def store_times(self) -> list[int]:
        return sorted({s.ext.store_timestamp for s in self.messages})
