"""Java's ``String.hashCode``, for tests: values Java itself printed, and a plain loop over UTF-16
code units written from the JDK's documented formula (``s[0]*31^(n-1) + ... + s[n-1]`` in int
arithmetic), independent of :mod:`rocketstore.pipeline.format.javahash`, the code under test."""

from __future__ import annotations

INT_MIN = -(2**31)

# Values printed by Java's "...".hashCode(). TagA/TagB/TagC are also the tagsCodes Apache
# RocketMQ 4.9.4 wrote into the ConsumeQueues of ../shared/fixtures/rocketmq-4.9.4/basic (its
# read.txt, e.g. "CQ TopicA 0 0 clOff=0 size=203 tagsCode=2598919" for message 0, tag TagA;
# tests/test_layout.py checks the fixture against these).
KNOWN = {
    "": 0,
    "a": 97,
    "Aa": 2112,
    "BB": 2112,
    "TagA": 2598919,
    "TagB": 2598920,
    "TagC": 2598921,
    "hello": 99162322,
    "Hello World": -862545276,
    "polygenelubricants": INT_MIN,
}


def reference_hash(text: str) -> int:
    """Java's loop over UTF-16 code units, written out independently."""
    units: list[int] = []
    for ch in text:
        cp = ord(ch)
        if cp >= 0x10000:
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    h = 0
    for u in units:
        h = (31 * h + u) % 2**32
    return h - 2**32 if h >= 2**31 else h


def index_key_hash(topic: str, key: str) -> int:
    """The keyHash RocketMQ's IndexFile stores for ``topic#key``: ``Math.abs`` of the hash, and
    0 for ``Integer.MIN_VALUE`` (whose abs is itself)."""
    h = reference_hash(f"{topic}#{key}")
    return 0 if h == INT_MIN else abs(h)
