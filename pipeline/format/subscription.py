"""RocketMQ tag subscription expressions: ``*`` (everything) or ``TagA || TagB``.

Matching is two-step, as in RocketMQ: a ConsumeQueue unit passes when its tagsCode is the hash
of a subscribed tag (cheap, no CommitLog read), then the message's real TAGS is compared,
because different tags can share a hash.

Immutable; thread-safe.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline.format.javahash import java_hash

_JAVA_BLANKS = "".join(chr(c) for c in range(0x21))


def _java_trim(text: str) -> str:
    """Java's ``String.trim()``: strips characters up to U+0020 only (not U+00A0 and friends)."""
    return text.strip(_JAVA_BLANKS)


@dataclasses.dataclass(frozen=True)
class Subscription:
    tags: frozenset[str] | None  # None: every message

    @classmethod
    def parse(cls, expression: str | None) -> Subscription:
        # As RocketMQ's FilterAPI: only null, "" and "*" mean everything; otherwise each
        # "||"-separated part is trimmed and kept if not empty (so "  " subscribes to nothing).
        if expression is None or expression in ("", "*"):
            return cls(None)
        return cls(frozenset(t for t in (_java_trim(t) for t in expression.split("||")) if t))

    @property
    def matches_all(self) -> bool:
        return self.tags is None

    def hash_filter(self, tags_codes: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Units whose ``(int) tagsCode`` is a subscribed tag's hash."""
        if self.tags is None:
            return np.ones(len(tags_codes), dtype=bool)
        codes = tags_codes.astype(np.int64).astype(np.int32)
        return np.isin(codes, np.array([java_hash(t) for t in self.tags], dtype=np.int32))

    def matches_tag(self, tag: str | None) -> bool:
        return self.tags is None or (tag is not None and tag in self.tags)
