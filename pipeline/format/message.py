"""The message a producer hands to the store, and the columnar batch form the store writes.

:class:`Message` is for single puts and tests. Batches travel as Arrow tables (Spark hands the
sink Arrow already) with these columns; only ``topic`` and ``body`` are required:

========================== =============================== ======================================
column                     Arrow type                      meaning
========================== =============================== ======================================
topic                      string                          topic (1-127 chars of ``[%|a-zA-Z0-9_-]``)
body                       binary (or string, UTF-8)       message body, at most maxMessageSize
queueId                    int32                           queue in the topic (default 0)
keys                       list<string> or string          KEYS; a string is space-separated
tags                       string                          TAGS (one tag)
properties                 map<string,string>              user properties, in order
flag                       int32                           application flag
sysFlag                    int32                           transaction type bits (0x4 PREPARED,
                                                           0x8 COMMIT, 0xC ROLLBACK); others 0
bornTimestamp              int64 (ms)                      default: the store time
bornHost                   string ``ip:port``              default: the store host
reconsumeTimes             int32
preparedTransactionOffset  int64
uniqKey                    string                          UNIQ_KEY; generated when null
========================== =============================== ======================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import pyarrow as pa

from rocketstore.pipeline.errors import InvalidMessageError

SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("body", pa.binary()),
        ("queueId", pa.int32()),
        ("keys", pa.list_(pa.string())),
        ("tags", pa.string()),
        ("properties", pa.map_(pa.string(), pa.string())),
        ("flag", pa.int32()),
        ("sysFlag", pa.int32()),
        ("bornTimestamp", pa.int64()),
        ("bornHost", pa.string()),
        ("reconsumeTimes", pa.int32()),
        ("preparedTransactionOffset", pa.int64()),
        ("uniqKey", pa.string()),
    ]
)
COLUMNS = tuple(SCHEMA.names)


# Not frozen: a frozen dataclass sets each of its 13 fields through object.__setattr__, 3.5 us
# a message here against 0.8 us with slots, more than a single put's own native call costs.
@dataclasses.dataclass(slots=True)
class Message:
    """One message to put. ``keys`` may be a list or a space-separated string. The store reads
    it during the put and keeps no reference to it."""

    topic: str
    body: bytes
    queue_id: int = 0
    keys: Sequence[str] | str | None = None
    tags: str | None = None
    properties: Mapping[str, str] | None = None
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int | None = None
    born_host: str | None = None
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    uniq_key: str | None = None

    def key_list(self) -> list[str] | None:
        if self.keys is None:
            return None
        if isinstance(self.keys, str):
            return [k for k in self.keys.split(" ") if k]
        return list(self.keys)


_INT_RANGES = {
    "queueId": (0, 2**31 - 1),
    "flag": (-(2**31), 2**31 - 1),
    "sysFlag": (-(2**31), 2**31 - 1),
    "bornTimestamp": (-(2**63), 2**63 - 1),
    "reconsumeTimes": (-(2**31), 2**31 - 1),
    "preparedTransactionOffset": (-(2**63), 2**63 - 1),
}


def messages_to_table(messages: Sequence[Message]) -> pa.Table:
    """The Arrow form of a list of :class:`Message`.

    Raises :class:`InvalidMessageError` (with the message's index) for an integer field outside
    its Java type's range, which Arrow could not hold.
    """
    cols: dict[str, list[object]] = {name: [] for name in COLUMNS}
    for index, m in enumerate(messages):
        cols["topic"].append(m.topic)
        cols["body"].append(m.body)
        cols["queueId"].append(m.queue_id)
        cols["keys"].append(m.key_list())
        cols["tags"].append(m.tags)
        cols["properties"].append(list(m.properties.items()) if m.properties else None)
        cols["flag"].append(m.flag)
        cols["sysFlag"].append(m.sys_flag)
        cols["bornTimestamp"].append(m.born_timestamp)
        cols["bornHost"].append(m.born_host)
        cols["reconsumeTimes"].append(m.reconsume_times)
        cols["preparedTransactionOffset"].append(m.prepared_transaction_offset)
        cols["uniqKey"].append(m.uniq_key)
        for name, (low, high) in _INT_RANGES.items():
            value = cols[name][-1]
            if value is not None and not (isinstance(value, int) and low <= value <= high):
                raise InvalidMessageError(
                    f"message {index}: {name}={value!r} is outside [{low}, {high}]", index
                )
    return pa.table({name: pa.array(cols[name], SCHEMA.field(name).type) for name in COLUMNS})
