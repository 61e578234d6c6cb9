"""What :class:`~rocketstore.pipeline.engine.store.MessageStore`'s puts and pulls return.

Plain values, safe to share between threads; none holds a reference into a store's files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from rocketstore.pipeline.format import record


class PutResult(NamedTuple):
    """Outcome of one message of a put (``status`` named as RocketMQ's PutMessageStatus).

    A named tuple rather than a frozen dataclass: a single put makes one per call, and a
    tuple is built several times faster."""

    status: str
    msg_id: str
    commit_log_offset: int
    queue_offset: int
    store_size: int
    store_timestamp: int
    uniq_key: str


@dataclasses.dataclass(frozen=True)
class BatchPutResult:
    """Outcome of a batch put, column by column (index ``i`` is the batch's message ``i``)."""

    commit_log_offsets: npt.NDArray[np.int64]
    queue_offsets: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    store_timestamp: int
    uniq_keys: pa.StringArray
    store_host: bytes
    flushed: bool

    def __len__(self) -> int:
        return len(self.commit_log_offsets)

    @property
    def total_bytes(self) -> int:
        return int(self.sizes.sum())

    def msg_ids(self) -> list[str]:
        prefix = self.store_host.hex().upper()
        return [f"{prefix}{off:016X}" for off in self.commit_log_offsets.tolist()]

    def results(self) -> Iterator[PutResult]:
        uniq = self.uniq_keys.to_pylist()
        for i, msg_id in enumerate(self.msg_ids()):
            yield PutResult(
                "PUT_OK",
                msg_id,
                int(self.commit_log_offsets[i]),
                int(self.queue_offsets[i]),
                int(self.sizes[i]),
                self.store_timestamp,
                uniq[i],
            )


@dataclasses.dataclass(frozen=True)
class QueueInfo:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    max_physic_offset: int


@dataclasses.dataclass(frozen=True)
class QueueEnds:
    """A queue's bounds and its first and last units, ``(commitLogOffset, size)`` each (None
    for an empty queue): the first unit is the one at the min offset; ``files``: how many
    ConsumeQueue files it has."""

    info: QueueInfo
    first: tuple[int, int] | None
    last: tuple[int, int] | None
    files: int


@dataclasses.dataclass(frozen=True)
class GetResult:
    """Outcome of :meth:`MessageStore.get_messages` (``status`` as RocketMQ's GetMessageStatus)."""

    status: str
    messages: list[record.MessageExt]
    next_begin_offset: int
    min_offset: int
    max_offset: int
