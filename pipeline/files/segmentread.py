"""The read seam: how every reader reaches a store's segment files, wherever they are kept.

**Segment directory.** The files of one log cut into segments of one size, each named by the
offset of its first byte in the log, its *base* (20 digits, zero-padded): a broker's CommitLog
(``commitlog/``, records) and each ConsumeQueue (``consumequeue/<topic>/<queueId>/``, 20-byte
units). A writer creates the next segment when the last is full; retention deletes the oldest.
So what exists is a contiguous run of bases, and a segment's base says where its bytes are.

**Where an offset sits.** Byte ``offset`` of a log of ``size``-byte segments is at position
``offset % size`` of the segment whose base is ``offset - offset % size`` (:func:`locate`).
Unit ``k`` of a ConsumeQueue is byte ``20 k`` of the queue's log (:func:`unit_position`); the
inverse, the unit at a position of a file, is :func:`unit_index`. Every reader and the engine
compute positions with these three and nothing else.

**The protocols.** :class:`SegmentDir` is one directory as a reader sees it: the bases and
sizes listed (listed again on demand), a segment opened by base, exactly ``n`` bytes read at a
position. :class:`SegmentFile` is one segment opened for reading. The local directory is
:class:`rocketstore.pipeline.files.localsegments.LocalSegments`; a tier of sealed segments in
an object store is one more implementation, its callers unchanged. :class:`OpenSegments`
keeps the segments one reader opens, each once, and closes them together.

Rules every implementation keeps, which the callers rely on:

* *Gone is not damage.* A segment deleted since it was listed (retention on a live store)
  raises :class:`~rocketstore.pipeline.errors.SegmentGoneError` when it is opened or read;
  callers pass over what it held (a view's min offset moves past it, the source reports data
  loss), never report it as corruption.
* *Not listed yet is not gone.* Segments are created in offset order and deleted from the
  front, so a segment past the last one listed was created since the listing. With a
  visibility wait (shared storage: a client may answer a listing from its cache) it is looked
  for in listings taken again for up to ``visibilityWaitMs``, then
  :class:`~rocketstore.pipeline.errors.NotVisibleError`; without one it is not there.
* *Reads are exact.* ``read(position, n)`` returns ``n`` bytes, ``position + n`` within the
  segment; bytes past where the file's data ends (a file a writer is still sizing) read as
  zeros, as a hole does.

Owns: no file and no state (arithmetic and protocols; :class:`OpenSegments` owns the handles it
opened). Thread-safety: an implementation's objects serve one thread at a time. Crash
behaviour: nothing here writes. Requires: segments of one directory are of one size (RocketMQ
refuses a store whose files differ); ``size > 0`` for the arithmetic.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol, TypeVar, overload

import numpy as np
import numpy.typing as npt

from rocketstore.pipeline.layout import CQ_UNIT_SIZE

Offsets = npt.NDArray[np.int64]
_O = TypeVar("_O", int, Offsets)


@overload
def locate(offset: int, size: int) -> tuple[int, int]: ...
@overload
def locate(offset: Offsets, size: int) -> tuple[Offsets, Offsets]: ...
def locate(offset: _O, size: int) -> tuple[_O, _O]:
    """(base, position): the base of the ``size``-byte segment holding log byte ``offset``,
    and where in it the byte is. Offsets as an array give arrays (a partition's records)."""
    position = offset % size
    return offset - position, position


def unit_position(k: int, file_size: int) -> tuple[int, int]:
    """(base, position) of unit ``k`` of a ConsumeQueue whose files are ``file_size`` bytes:
    the file it is in and the byte of it where the unit starts."""
    return locate(k * CQ_UNIT_SIZE, file_size)


def unit_index(base: int, position: int) -> int:
    """The unit of a ConsumeQueue at byte ``position`` of its file at ``base`` (the inverse of
    :func:`unit_position`); ``unit_index(base, file_size)`` is one past the file's last."""
    return (base + position) // CQ_UNIT_SIZE


class SegmentFile(Protocol):
    """One segment opened for reading (see the module docstring for the rules). Closed by
    whoever opened it; a handle whose file retention deleted since it was opened may still
    read (a local file held open), or raise :class:`SegmentGoneError`."""

    base: int  # log offset of its first byte, its name
    size: int  # its length, the directory's segment size

    @property
    def where(self) -> str:
        """The file's name for messages (a path, a URL)."""
        ...

    def read(self, position: int, n: int) -> bytes:
        """Exactly ``n`` bytes at ``position`` (a copy; a local file is not mapped for it)."""
        ...

    def read_into(self, position: int, out: memoryview) -> None:
        """Fill ``out`` with the bytes at ``position``."""
        ...

    @property
    def buffer(self) -> memoryview:
        """The whole segment as one buffer, zero-copy where the implementation can (a local
        file is mapped read-only); valid until :meth:`close`."""
        ...

    def data_end(self) -> int:
        """Bytes from the start past which the file holds only zeros (its size when that is
        not known): a scan need not read further."""
        ...

    def pinned(self) -> AbstractContextManager[None]:
        """Keep the segment readable for the block, whether or not it is deleted meanwhile
        (a scan of a live store); raises :class:`SegmentGoneError` for one gone already."""
        ...

    def close(self) -> None: ...


class SegmentDir(Protocol):
    """The segment files of one directory as one reader sees them (see the module docstring).

    The listing is taken when first needed and kept until :meth:`relist`; opening and reading
    go by base and need no listing unless the segment is not there (then the listing says
    whether it is gone or not listed yet)."""

    @property
    def location(self) -> str:
        """The directory's name for messages."""
        ...

    def listed(self) -> list[int]:
        """The bases listed, ascending."""
        ...

    def relist(self) -> None:
        """List the directory again (a listing of a live store goes stale)."""
        ...

    def first(self) -> int | None:
        """The first base listed; with none listed and a visibility wait, the directory is
        listed again as for a segment past the listing. None: no segment."""
        ...

    def file_size(self) -> int:
        """The size of the directory's segments: that of the newest listed segment still there
        and sized (retention deletes the oldest, a writer may be sizing the newest); 0 when
        there is none."""
        ...

    def size_of(self, base: int) -> int:
        """The size of the segment at ``base`` now; -1 when it is not there."""
        ...

    def has(self, base: int) -> bool:
        """Whether the listing names the segment at ``base``: one past the listing is looked
        for in listings taken again (the visibility wait; :class:`NotVisibleError` when it
        ends); False when the listing goes past it without it (deleted by retention), or
        without a wait. A segment listed may be gone since (:meth:`open` says so)."""
        ...

    def where(self, base: int) -> str:
        """The name of the segment at ``base`` for messages, whether or not it exists."""
        ...

    def open(self, base: int, *, whole: bool = False) -> SegmentFile:
        """The segment at ``base``, opened; ``whole``: the reader will use much of it through
        :attr:`SegmentFile.buffer` (a local file is mapped now). Raises
        :class:`SegmentGoneError` or :class:`NotVisibleError` (see :meth:`has`)."""
        ...

    def read(self, base: int, position: int, n: int) -> bytes:
        """Exactly ``n`` bytes at ``position`` of the segment at ``base``, opened for this read
        alone; raises as :meth:`open`."""
        ...

    def forget_cached(self, base: int) -> None:
        """Drop what this host caches of the segment's bytes, so that the next read asks the
        storage again (shared storage: a page read before the writer's latest write)."""
        ...


class OpenSegments:
    """The segments of one directory that one reader opens, each once, closed together (a
    partition read, a planning call)."""

    def __init__(self, files: SegmentDir, *, whole: bool = False) -> None:
        self.files = files
        self.whole = whole
        self._open: dict[int, SegmentFile] = {}

    def get(self, base: int) -> SegmentFile:
        """The segment at ``base``, opened now if it is not yet; raises as
        :meth:`SegmentDir.open` (a segment found gone is not kept: asked again, it is looked
        for again)."""
        seg = self._open.get(base)
        if seg is None:
            seg = self._open[base] = self.files.open(base, whole=self.whole)
        return seg

    def bases(self) -> list[int]:
        """The bases of the segments open now."""
        return list(self._open)

    def close(self) -> None:
        for seg in self._open.values():
            seg.close()
        self._open.clear()
