"""Writer fencing: a writer that has lost the store's lock never writes another byte.

On a shared file system the servers drop a lost client's lock, and the client, healed, reopens
the writer's files without it; nothing tells the writer, whose next put would land on the
records of the writer that took the store over. After Kafka's leader epochs, every writer of a
*fenced store* (:func:`applies`: ``sharedStorage`` resolves to ``shared``, or the store already
has an epochs file, whatever the setting) takes four measures. docs/cluster.md ("Network
partitions and fencing") gives the reasons, each kind of taker, what is read how and why, the
measurements, and the volume options that close what the store alone cannot:

* **Epochs.** A taker appends its slot to ``config/rocketstore-epochs``, durable before its
  first put. :meth:`Fence.check`, before every put and retention round and before a flush
  publishes, takes the lock again on the writer's own descriptor, reads the file from the
  servers (a slot after its own: fenced) and lists the store directory for ``abort`` (gone, or
  another inode than this writer's open left: fenced), raising
  :class:`~rocketstore.pipeline.errors.FencedError` for good.
* **A dead region** ``[X, S)`` after an unclean take-over: an END_OF_FILE blank at the end
  ``X`` recovery found, and the next writes in the first segment ``S`` that has no file, where
  the old holder's mappings cannot reach (segment creation is exclusive).
* **New inodes for the derived files** (:mod:`rocketstore.pipeline.engine.renewal`).
* **Recovery and verify know dead regions** (:func:`rocketstore.pipeline.engine.recovery.recover`).

The file, ``config/rocketstore-epochs``: a run of 48-byte slots, slot ``n`` for epoch ``n``
(big-endian; RocketMQ ignores files it does not know in ``config/``), then zeros up to at least
:data:`MIN_SIZE` bytes (a hole, so that no FUSE client's small-file cache holds it; a file
written before that rule has none, and its first taker pads it)::

    0  magic "RSEP"       4  CRC-32 of bytes 8..47   8  epoch (long)
    16 fenced end X (long)  24 start S (long)        32 taken at, ms since epoch (long)
    40 pid (int)            44 reserved (int, 0)

A slot that is not whole (a torn append) ends the run; the next writer writes its slot there and
zeros whatever follows it.

Owns: the epochs file, and a writer's slot and descriptors (the lock's, the store directory's).
Thread-safety: a :class:`Fence` is used under the store's lock. Crash behaviour: a taker that
dies before its slot is durable wrote nothing else; one that dies after it leaves an epoch whose
dead region recovery honours whether or not a record ever followed; one that dies while it
creates the file leaves at most ``rocketstore-epochs.<pid>.creating``, which the next taker
removes. Requires of the file system: reads that reach the servers (on FUSE, ``O_DIRECT`` reads
in whole 4 KiB blocks starting below the size the host has seen, and listings, which
GlusterFS's and ceph-fuse's defaults pass on).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rocketstore.pipeline.errors import FencedError, SegmentCreateError, StoreLockedError
from rocketstore.pipeline.files import durability, filesystem, visibility
from rocketstore.pipeline.files.filecreation import TMP_SUFFIX, limit_note
from rocketstore.pipeline.files.fileio import io_error, pwrite_all
from rocketstore.pipeline.files.lock import DirectoryLock
from rocketstore.pipeline.format import record

if TYPE_CHECKING:
    from rocketstore.pipeline.files.commitlog import CommitLog
    from rocketstore.pipeline.files.mappedfile import MappedFile

FILE_NAME = "rocketstore-epochs"
MAGIC = b"RSEP"
SLOT = struct.Struct(">4sIqqqqii")
_BODY = struct.Struct(">qqqqii")
# The file's least size: more than the largest file GlusterFS's quick-read caches (its
# max-file-size: 64 KiB by default, 1000 KB at most), so that no client answers a read of it
# from a copy (see the module).
MIN_SIZE = 1 << 20
# Reads start and end on multiples of it: a brick that opened the file O_DIRECT refuses others.
_BLOCK = 4096
_ZEROS = bytes(_BLOCK)
# The first read of the whole file: 1,365 slots, and no more bytes of padding to move.
_FIRST_READ = 64 << 10


@dataclasses.dataclass(frozen=True)
class Epoch:
    """One writer's tenure: ``[fenced_end, start)`` of the CommitLog is dead (empty when the
    take-over was clean)."""

    epoch: int
    fenced_end: int
    start: int
    taken_at_ms: int
    pid: int

    @property
    def dead(self) -> tuple[int, int] | None:
        return (self.fenced_end, self.start) if self.start > self.fenced_end else None

    def pack(self) -> bytes:
        body = _BODY.pack(self.epoch, self.fenced_end, self.start, self.taken_at_ms, self.pid, 0)
        return MAGIC + struct.pack(">I", zlib.crc32(body)) + body


def path_of(store_dir: Path) -> Path:
    return store_dir / "config" / FILE_NAME


def read_epochs(store_dir: Path) -> list[Epoch]:
    """The recorded epochs, oldest first, up to the first slot that is not whole; read from the
    file system itself, never from what this host cached (see the module)."""
    read = _read_fresh(store_dir)
    return parse(read[0]) if read is not None else []


def _read_fresh(store_dir: Path) -> tuple[bytes, bool] | None:
    """The epochs file as the file system holds it (:func:`_read_all`), or None when there is
    none."""
    path = path_of(store_dir)
    # A file an older version wrote can be small enough for a client to cache its content:
    # listing the directory makes a FUSE client ask the servers for each name's attributes,
    # and GlusterFS drops the content it cached of a file whose time changed (see the module).
    with contextlib.suppress(OSError):
        os.listdir(path.parent)
    try:
        fd = os.open(path, os.O_RDONLY | _direct_flag(store_dir))
    except FileNotFoundError:
        return None
    try:
        return _read_all(fd, path)
    finally:
        os.close(fd)


def parse(data: bytes) -> list[Epoch]:
    """The whole slots at the start of ``data`` (the file's bytes)."""
    epochs: list[Epoch] = []
    for at in range(0, len(data) - SLOT.size + 1, SLOT.size):
        magic, crc, *fields = SLOT.unpack_from(data, at)
        if magic != MAGIC or crc != zlib.crc32(data[at + 8 : at + SLOT.size]):
            break
        e = Epoch(*fields[:5])
        if e.epoch != len(epochs):
            break
        epochs.append(e)
    return epochs


def _read_all(fd: int, path: Path) -> tuple[bytes, bool]:
    """The epochs file behind ``fd``, asked of the file system, from offset 0: all of it
    (``True``), or up to a block of zeros, past which it holds zeros only (``False``: its slots
    are one run from offset 0, and a torn append touches the slot after the run only).

    Where ``fd`` has ``O_DIRECT``, every read starts at offset 0 (a FUSE kernel passes a direct
    read that starts below the size it cached on to the server whole: it cuts none short at
    that size) and is of whole blocks, a longer one from offset 0 again where the first did not
    reach the end of the run. Where the file system refuses a direct read (``EINVAL``), the
    file is read whole, this host's cached pages of it dropped first."""
    size = _FIRST_READ
    try:
        while True:
            data = os.pread(fd, size, 0)
            if len(data) < size:
                return data, True
            if data.endswith(_ZEROS):
                return data, False
            size *= 4
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    visibility.drop_cached(path)
    with open(path, "rb", buffering=0) as f:
        return f.read(), True


def _blocks(n: int) -> int:
    """``n`` rounded up to whole blocks."""
    return -(-n // _BLOCK) * _BLOCK


def _create(path: Path) -> None:
    """Create the epochs file whole: :data:`MIN_SIZE` zeros, synced, under a temporary name,
    then linked to its name, so that no host ever sees it shorter (one that cached it empty
    could not read it directly). A file another writer created meanwhile is kept, and so are
    its bytes."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}{TMP_SUFFIX}")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, MIN_SIZE)
        durability.fsync(fd, tmp)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    try:
        durability.place_new(tmp, path)
    except FileExistsError:
        durability.remove(tmp)


def applies(store_dir: Path, shared: bool) -> bool:
    """Whether a writable open of the store fences those before it and checks its own fence:
    on shared storage, and on any store that already has an epochs file, whatever
    ``sharedStorage`` says (see the module)."""
    return shared or path_of(store_dir).exists()


def no_space_hint(store_dir: Path) -> str:
    """What to do when a writer cannot take an unclean store over for lack of space."""
    return (
        f"; free space first: `rocketstore clean {store_dir}` deletes what retention allows "
        "without opening the store for writing, then open it again (`rocketstore recover`)"
    )


def take_over(
    log: CommitLog, store_dir: Path, lock: DirectoryLock, abort_found: bool, now_ms: int
) -> Fence:
    """Record this writer's epoch; after an unclean end (``abort`` found: the last holder never
    closed, and may be alive) the log goes on in a fresh segment first, so that anything the
    old holder still writes lands in the dead region before it (see the module)."""
    end = log.max_offset
    try:
        start = log.fence_off() if abort_found else end
    except SegmentCreateError as exc:
        raise SegmentCreateError(
            f"{store_dir}: the store was not closed cleanly, and the fresh segment a writer "
            f"taking it over starts cannot be made ({exc}){no_space_hint(store_dir)}"
        ) from exc
    return Fence.take(store_dir, lock, end, start, now_ms)


def abort_identity(store_dir: Path) -> int | None:
    """``abort``'s inode number, None when it is missing, as a listing of the store directory
    gives them (see the module). Not its times: a replicated file system may answer them from
    any replica, each with its own."""
    try:
        with os.scandir(store_dir) as entries:
            return _abort_in(entries)
    except FileNotFoundError:
        return None


def _abort_in(entries: Iterator[os.DirEntry[str]]) -> int | None:
    for entry in entries:
        if entry.name == "abort":
            return entry.inode()
    return None


def dead_regions(epochs: list[Epoch]) -> list[tuple[int, int]]:
    """The CommitLog ranges no writer owns, in order."""
    return sorted(d for e in epochs if (d := e.dead) is not None)


class Fence:
    """The epoch this writer holds and the check that it still holds it (see the module)."""

    def __init__(self, store_dir: Path, lock: DirectoryLock, epoch: Epoch) -> None:
        self.store_dir = store_dir
        self.lock = lock
        self.epoch = epoch
        self._next_slot = (epoch.epoch + 1) * SLOT.size
        self.fenced: FencedError | None = None
        self._fd: int | None = os.open(path_of(store_dir), os.O_RDONLY | _direct_flag(store_dir))
        # The store directory, listed through this descriptor at each check: on GlusterFS a
        # third of the cost of a listing by name (0.4 ms, not 1.1: no open and release).
        self._dir: int | None = None
        try:
            # ``abort`` as this writer's open left it; a taker that records no epoch changes it.
            self._abort = self._abort_now()
        except BaseException:
            self.close()
            raise

    @classmethod
    def take(
        cls, store_dir: Path, lock: DirectoryLock, fenced_end: int, start: int, now_ms: int
    ) -> Fence:
        """Record the next epoch (durable on return) and hold it. The caller holds ``lock``."""
        path = path_of(store_dir)
        try:
            for leftover in path.parent.glob(f"{FILE_NAME}.*{TMP_SUFFIX}"):
                durability.remove(leftover)  # of a taker that died creating the file
            # Read from the file system (see the module): a slot this host cached before
            # another host's writer appended would put this epoch over that one's.
            read = _read_fresh(store_dir)
            if read is None:
                _create(path)
                read = _read_fresh(store_dir) or (b"", True)
            data, whole = read
            e = Epoch(len(parse(data)), fenced_end, start, now_ms, os.getpid())
            at = e.epoch * SLOT.size
            fd = os.open(path, os.O_RDWR)
            try:
                if whole and len(data) < MIN_SIZE:
                    # An older version's file, whose true size was just read: padded.
                    os.ftruncate(fd, MIN_SIZE)
                # Anything after the slot (a torn later append) would read as a newer epoch.
                junk = len(data[at + SLOT.size :].rstrip(b"\0"))
                if junk:
                    pwrite_all(fd, bytes(junk), at + SLOT.size)
                pwrite_all(fd, e.pack(), at)
                durability.fsync(fd, path)
            finally:
                os.close(fd)
            durability.fsync_dir(path.parent)
        except OSError as exc:
            # The file is MIN_SIZE long: a file size limit or a full disk may refuse it.
            note = (
                f" ({limit_note(exc, path.parent)})"
                if exc.errno in (errno.EFBIG, errno.ENOSPC, errno.EDQUOT)
                else ""
            )
            raise io_error(exc, f"recording the next epoch in {path}{note}") from exc
        return cls(store_dir, lock, e)

    def check(self, what: str) -> None:
        """Raise :class:`FencedError` unless this writer still holds the lock and its epoch is
        the newest. Once fenced, always fenced."""
        if self.fenced is not None:
            raise FencedError(str(self.fenced))
        reason = self._lost()
        if reason is not None:
            self.fenced = FencedError(
                f"{self.store_dir}: {what} refused: this writer (epoch {self.epoch.epoch}) "
                f"no longer owns the store: {reason}. Nothing was written; close this store and "
                "open it again to take the store back once the other writer is gone"
            )
            raise FencedError(str(self.fenced))

    def _lost(self) -> str | None:
        """Why this writer no longer owns the store, or None while it does."""
        try:
            self.lock.verify()
        except StoreLockedError:
            return "another writer holds its lock"
        except OSError as exc:
            return f"its lock could not be confirmed ({errno.errorcode.get(exc.errno or 0, exc)})"
        try:
            newer = self._read_next()
        except OSError as exc:
            return f"{path_of(self.store_dir)} cannot be read ({exc.strerror or exc})"
        if newer:
            # The check above may have taken the lock back (nobody held it): a writer that
            # does not own the store must not keep others out of it either.
            self.lock.release()
            later = read_epochs(self.store_dir)
            if len(later) > self.epoch.epoch + 1:
                taker = later[-1]
                when = datetime.datetime.fromtimestamp(taker.taken_at_ms / 1000, datetime.UTC)
                return (
                    f"epoch {taker.epoch} was taken by process {taker.pid} at "
                    f"{when:%Y-%m-%d %H:%M:%S.%f}"[:-3]
                    + f" UTC (in {path_of(self.store_dir)})"
                )
            return f"a newer epoch is being written to {path_of(self.store_dir)}"
        try:
            abort = self._abort_now()
        except OSError as exc:
            return f"{self.store_dir} cannot be listed ({exc.strerror or exc})"
        if abort != self._abort:
            self.lock.release()
            return (
                f"{self.store_dir / 'abort'} was removed or replaced since this writer opened "
                "the store (another writer, a RocketMQ broker perhaps, had it and closed it)"
            )
        return None

    def _read_next(self) -> bool:
        """Whether the slot after this writer's holds anything, read from the file system."""
        fd = self._fd
        if fd is None:
            raise OSError(errno.EBADF, "fence closed")
        # From the block of this writer's own slot, which is below the size this host has seen
        # of the file: a FUSE kernel passes the read on, whatever size it cached (see the module).
        start = self.epoch.epoch * SLOT.size // _BLOCK * _BLOCK
        length = _blocks(self._next_slot + SLOT.size - start)
        try:
            data = os.pread(fd, length, start)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            # O_DIRECT refused: this host's cached pages dropped, then a fresh open.
            path = path_of(self.store_dir)
            visibility.drop_cached(path)
            with open(path, "rb", buffering=0) as f:
                data = os.pread(f.fileno(), length, start)
        return any(data[self._next_slot - start : self._next_slot - start + SLOT.size])

    def _abort_now(self) -> int | None:
        """``abort``'s identity now (:func:`abort_identity`), listed through the descriptor of
        the store directory; through a new one where that one fails (a client that lost its
        servers for a while may refuse the descriptors it had)."""
        if self._dir is not None:
            try:
                os.lseek(self._dir, 0, os.SEEK_SET)
                with os.scandir(self._dir) as entries:
                    return _abort_in(entries)
            except OSError:
                os.close(self._dir)
                self._dir = None
        self._dir = os.open(self.store_dir, os.O_RDONLY | os.O_DIRECTORY)
        with os.scandir(self._dir) as entries:
            return _abort_in(entries)

    def close(self) -> None:
        for fd in (self._fd, self._dir):
            if fd is not None:
                os.close(fd)
        self._fd = self._dir = None


def _dead_parts(log: CommitLog, x: int, s: int) -> Iterator[tuple[MappedFile, int, bytes]]:
    """Each segment's part of the dead region ``[x, s)``: (segment, start in it, the blank that
    :meth:`~rocketstore.pipeline.files.commitlog.CommitLog.fence_off` wrote there)."""
    for mf in log.segments.files:
        if mf.base + mf.size <= x or mf.base >= s:
            continue
        rel = max(0, x - mf.base)
        yield mf, rel, record.SIZE_MAGIC.pack(mf.size - rel, record.BLANK_MAGIC)


_STEP = 1 << 20


def _nonzero_span(mf: MappedFile, start: int) -> int:
    """Bytes from ``start`` to the segment's last non-zero byte (0 when all are zeros)."""
    last = start
    for at in range(start, mf.size, _STEP):
        n = min(_STEP, mf.size - at)
        chunk = np.frombuffer(mf.buffer, dtype=np.uint8, count=n, offset=at)
        nz = np.flatnonzero(chunk)
        if len(nz):
            last = at + int(nz[-1]) + 1
        del chunk
    return last - start


def junk_bytes(log: CommitLog, x: int, s: int) -> int:
    """How many bytes of the dead region ``[x, s)`` a fenced writer left: the span of bytes
    that are neither the blanks the region began with nor zeros."""
    junk = 0
    for mf, rel, blank in _dead_parts(log, x, s):
        span = _nonzero_span(mf, rel + len(blank))
        if span or bytes(mf.buffer[rel : rel + len(blank)]) != blank:
            junk += len(blank) + span
    return junk


def restore(log: CommitLog, x: int, s: int) -> None:
    """Put the dead region ``[x, s)`` back as it was made: the blanks, zeros after them; synced."""
    for mf, rel, blank in _dead_parts(log, x, s):
        span = _nonzero_span(mf, rel + len(blank))
        for at in range(rel + len(blank), rel + len(blank) + span, _STEP):
            mf.overwrite(at, bytes(min(_STEP, rel + len(blank) + span - at)))
        mf.overwrite(rel, blank)
        mf.sync_range(rel, rel + len(blank) + span)


def _direct_flag(store_dir: Path) -> int:
    """``O_DIRECT`` where reads through it skip this host's cache of the file: FUSE file
    systems pass it on to their servers and accept any length. Local disks need neither (one
    page cache) nor could take a 1-byte direct read."""
    kind = filesystem.fs_type(store_dir) or ""
    return getattr(os, "O_DIRECT", 0) if kind.startswith("fuse") else 0
