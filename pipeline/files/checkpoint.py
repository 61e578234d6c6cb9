"""The ``checkpoint`` file: how far each structure was known durable (RocketMQ's StoreCheckpoint).

A 4096-byte file; the first 24 bytes are three longs, the rest zero::

     0                       8                       16                      24
    +-----------------------+-----------------------+-----------------------+----- - -
    | physicMsgTimestamp    | logicsMsgTimestamp    | indexMsgTimestamp     | 0 …
    +-----------------------+-----------------------+-----------------------+----- - -

Each is the store timestamp of the newest message whose CommitLog bytes, ConsumeQueue unit or
index entries respectively were flushed. Abnormal recovery starts re-dispatching from the
CommitLog file whose first message is older than the smallest of them.

RocketMQ rewrites the file in place through a mapping. We do the same (the layout is RocketMQ's
and RocketMQ must read it), but only ever after the data it describes is flushed, so a torn
write can only make the recorded times older, which makes recovery do more, never less.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from pathlib import Path

from rocketstore.pipeline.errors import NotAStoreError
from rocketstore.pipeline.files import durability
from rocketstore.pipeline.files.fileio import io_error, pwrite_all

LAYOUT = struct.Struct(">qqq")
FILE_SIZE = 4096


@dataclasses.dataclass
class StoreCheckpoint:
    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0

    @property
    def min_timestamp(self) -> int:
        """RocketMQ's ``getMinTimestamp`` (physic and logics, less 3 s of slack)."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - 3000)

    @classmethod
    def read(cls, path: Path) -> StoreCheckpoint:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls()
        if len(raw) < LAYOUT.size:
            raise NotAStoreError(f"{path}: checkpoint is {len(raw)} bytes, expected {FILE_SIZE}")
        return cls(*LAYOUT.unpack_from(raw, 0))

    def write(self, path: Path, *, sync: bool) -> None:
        """Write the timestamps in place. A missing checkpoint (or one of a foreign size) is
        made whole under a temporary name and renamed into place, so that no reader, on this
        host or another, ever sees one shorter than its layout."""
        payload = LAYOUT.pack(
            self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp
        )
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            fd = -1
        if fd >= 0 and os.fstat(fd).st_size == FILE_SIZE:
            step = f"write of bytes [0, {len(payload)}) of {path}"
            try:
                pwrite_all(fd, payload, 0)
                if sync:
                    step = f"fsync of {path}"
                    durability.fsync(fd, path)
            except OSError as exc:
                raise io_error(exc, step) from exc
            finally:
                os.close(fd)
            return
        if fd >= 0:
            os.close(fd)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, FILE_SIZE)
            pwrite_all(fd, payload, 0)
            durability.fsync(fd, tmp)
        finally:
            os.close(fd)
        durability.replace(tmp, path)
