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

from pipeline.javahash import java_hash


@dataclasses.dataclass(frozen=True)
class Subscription:
    tags: frozenset[str] | None  # None: every message

    @classmethod
    def parse(cls, expression: str | None) -> Subscription:
        if expression is None or expression.strip() in ("", "*"):
            return cls(None)
        tags = frozenset(t.strip() for t in expression.split("||") if t.strip())
        if not tags:
            return cls(None)
        return cls(tags)

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
