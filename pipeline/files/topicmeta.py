"""A store root's topic metadata (``topics.json``): what is fixed when a topic is first
written, its parsing, and the names of the root's metadata files. The root itself (its
brokers, the locking of changes, the schema registry) is
:mod:`rocketstore.pipeline.engine.root`; the copy a reader with only the bucket reads is
:mod:`rocketstore.pipeline.tier.catalog`. Pure values."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from rocketstore.pipeline.errors import NotAStoreError

TOPICS_FILE = "topics.json"
SCHEMAS_DIR = "schemas"


@dataclasses.dataclass(frozen=True)
class TopicMeta:
    """What is fixed when a topic is first written to a root."""

    brokers: int
    queues: int
    body_format: str = "binary"
    schemas: tuple[str, ...] = ()

    @property
    def total_queues(self) -> int:
        return self.brokers * self.queues

    def to_json(self) -> dict[str, Any]:
        return {
            "brokers": self.brokers,
            "queues": self.queues,
            "bodyFormat": self.body_format,
            "schemas": list(self.schemas),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TopicMeta:
        return cls(
            brokers=int(data["brokers"]),
            queues=int(data["queues"]),
            body_format=str(data.get("bodyFormat", "binary")),
            schemas=tuple(data.get("schemas", ())),
        )


def parse_topics_file(raw: str | bytes, where: str) -> dict[str, TopicMeta]:
    """The topics of a ``topics.json`` (read from ``where``, named in the error)."""
    try:
        data = json.loads(raw)
        return {t: TopicMeta.from_json(v) for t, v in data["topics"].items()}
    except (ValueError, KeyError, TypeError) as exc:
        raise NotAStoreError(f"{where}: unreadable ({exc})") from None
