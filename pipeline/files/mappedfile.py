"""One fixed-size, memory-mapped segment file (RocketMQ's ``MappedFile``).

A segment is named by the 20-digit, zero-padded offset of its first byte in the whole log, so
that ``ls`` sorts segments in log order. Its length on disk is always exactly the configured
segment size: RocketMQ refuses to load a store whose files differ, so a new segment is created
full-size (sparse, by :mod:`rocketstore.pipeline.files.filecreation`) and never grown or shrunk.

What lies past :attr:`wrote_position` is unspecified (zeros in a file we created). The write
position is not stored in the file: the owner (CommitLog, ConsumeQueue) derives it when loading.

Blocks. A sparse file gets a block for a page only when the page is first written, and a write
through a mapping that needs a block on a full file system is a SIGBUS, which kills the process.
So no byte is written through the mapping past :attr:`allocated`: the prefix of the file whose
blocks are known to exist. :meth:`reserve` extends it with ``posix_fallocate`` (a file system
without fallocate gets zeros written by the C library instead), where a full disk is an
``OSError`` with nothing written. Writers reserve ahead of what they write, a window at a time
(:data:`RESERVE_AHEAD`), not the whole file: RocketMQ's defaults would otherwise take 1 GiB per
CommitLog segment, 5.7 MiB per ConsumeQueue file of every queue and 420 MB per IndexFile from
the disk for data never written. A file that was written before (by RocketMQ or before a
restart) counts as allocated up to the page holding its write position.

Descriptors. ``mmap.mmap`` keeps its own ``dup`` of the descriptor until the mapping is closed,
so every mapped segment holds one descriptor. With a :class:`~rocketstore.pipeline.files.mappings.MappingCache`
a segment is mapped lazily, on first use, and the cache unmaps the least recently used segments
when too many are mapped (its bound derives from ``RLIMIT_NOFILE``); a segment whose bytes are in
use (a zero-copy view is alive) is never unmapped. The descriptor used to map or reserve is
closed at once.

Thread-safety: none. A segment belongs to one writer; concurrent readers in other processes map
the file read-only and see bytes as the page cache has them, so they must only trust data that a
higher layer says is complete.

Crash behaviour: writes land in the page cache; :meth:`flush` (``msync``, or ``fsync`` when the
segment was unmapped since) makes them durable. After a crash, any suffix of unflushed writes may
be missing or torn. Creating a segment is durable when the constructor returns (the file is
sized, fsynced, renamed into place and its directory fsynced). Reserved blocks need no flush:
after a crash a reserved, unwritten range reads as zeros, as a hole does.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

from rocketstore.pipeline.errors import (
    FileReplacedError,
    NotAStoreError,
    SegmentCreateError,
    SegmentGoneError,
    StoreError,
)
from rocketstore.pipeline.files import durability, failpoints, filesystem
from rocketstore.pipeline.files.filecreation import create_deferred, create_full_size, limit_note
from rocketstore.pipeline.files.fileio import data_end, io_error
from rocketstore.pipeline.files.mappings import MappingCache

NAME_DIGITS = 20
PAGE = mmap.PAGESIZE
# Writes of at least this many bytes go through pwrite (see MappedFile._pwrite): faulting in
# fresh pages of a shared mapping cost ~25 us a page here, pwrite fills them 30 x faster.
PWRITE_MIN_BYTES = 16 * 1024
# How far past what a write needs :meth:`MappedFile.reserve` allocates, so that one
# ``posix_fallocate`` serves many puts (a call costs ~10-20 us here, whatever its length).
RESERVE_AHEAD = 4 << 20
# An ``ahead`` that asks for whole files: every block allocated when the file is created (on a
# file system where reading a hole allocates, see rocketstore.pipeline.files.filesystem).
WHOLE = 1 << 62


def segment_name(base_offset: int) -> str:
    return f"{base_offset:0{NAME_DIGITS}d}"


def parse_segment_name(path: str | Path) -> int | None:
    """Base offset encoded in a segment file's name (``path``: the name, or a path), or None if
    the name is not a segment name."""
    name = path if isinstance(path, str) else path.name
    if len(name) != NAME_DIGITS or not name.isdigit():
        return None
    return int(name)


def listed_size(path: Path) -> int:
    """The size of a file a directory listing named; -1 when it is gone since (retention on a
    live store): opening it then says so (:class:`SegmentGoneError` for a read-only view)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return -1


def size_check(path: str | Path, actual: int, expected: int) -> None:
    """Raise :class:`NotAStoreError` unless a segment file is of its store's segment size."""
    if actual != expected:
        raise NotAStoreError(
            f"{path}: segment is {actual} bytes, expected exactly {expected} "
            "(check the mappedFileSize* settings match the store)"
        )


class MappedFile:
    """A segment of ``size`` bytes whose first byte is log offset ``base``.

    Without ``cache`` the file is mapped at once and stays mapped until :meth:`close`; with it,
    the file is only checked here, and mapped, or opened, when its bytes are first used.
    ``map_now`` says which, whatever ``cache`` is (a reader that only reads a few units through
    the file's descriptor maps nothing; one that decodes many records maps the file now, so
    that it stays readable if retention unlinks it).

    Identity. A writable segment remembers the file it first opened (``st_dev``, ``st_ino``).
    Its descriptor, once open, is where every write, read and sync of the unmapped file goes;
    when the cache has closed it (or to map the file again) the name is opened again and must
    lead to that same file, or :class:`FileReplacedError` says that another writer replaced or
    removed it: a writer that took the store over gives the derived files new inodes
    (rocketstore.pipeline.engine.renewal), and this writer must not write into them. A read-only
    view takes whatever file the name leads to.

    ``stat``: the file's status as the caller just read it (no second ``stat``).

    ``deferred``: a file created here is not synced when created; its first :meth:`flush` (or a
    file system sync, :func:`rocketstore.pipeline.files.durability.syncfs`) makes it durable, and its
    owner makes its directory entry durable (:attr:`fresh` says that is still to do).
    """

    __slots__ = (
        "_allocated",
        "_borrowed",
        "_cache",
        "_fd",
        "_identity",
        "_mm",
        "_view",
        "ahead",
        "base",
        "flushed_position",
        "fresh",
        "path",
        "read_only",
        "size",
        "wrote_position",
    )

    def __init__(
        self,
        path: Path,
        base: int,
        size: int,
        *,
        read_only: bool,
        create: bool = False,
        cache: MappingCache | None = None,
        ahead: int = RESERVE_AHEAD,
        deferred: bool = False,
        stat: os.stat_result | None = None,
        map_now: bool | None = None,
    ):
        self.path = path
        self.base = base
        self.size = size
        self.read_only = read_only
        self.wrote_position = 0
        self.flushed_position = 0
        self.ahead = ahead
        # -1: not known yet; taken from the write position when first needed (see reserve).
        self._allocated = 0 if create else -1
        self._cache = cache
        self._mm: mmap.mmap | None = None
        self._view: memoryview | None = None
        self._fd = -1
        self._borrowed = False  # _fd is borrowed() for a block, not kept
        self._identity: tuple[int, int, int] | None = None
        # Created by this writer and its directory entry not made durable yet (``deferred``).
        self.fresh = False
        if create:
            if read_only:
                raise StoreError(f"cannot create segment {path} in a read-only store")
            whole = ahead >= size
            if deferred:
                fd, self._identity = create_deferred(path, size, allocate_all=whole)
                self.fresh = True
                self._hold(fd)
            else:
                self._identity = create_full_size(path, size, allocate_all=whole)
            if whole:
                self._allocated = size
            if cache is not None:
                cache.work.created += 1
        if map_now is None:
            map_now = cache is None
        if map_now:
            self._map()
        elif not create:
            st = stat
            if st is None:
                try:
                    st = os.stat(path)
                except OSError as exc:
                    raise self._open_error(exc) from exc
            self._check_size(st.st_size)
            # The file a writer writes is the one it found now, whenever it first opens it
            # (the generation is taken then: a stat does not tell it).
            self._identity = (st.st_dev, st.st_ino, 0)

    def _open_error(self, exc: OSError) -> StoreError:
        if exc.errno == errno.ENOENT:
            if self.read_only:
                # A view's file deleted after it listed it: retention on a live store, not
                # damage.
                return SegmentGoneError(
                    f"{self.path}: gone since this read-only view listed it (deleted by "
                    "retention on a live store?); open the store again"
                )
            if self._identity is not None:
                return FileReplacedError(
                    f"{self.path}: the file this writer opened was removed under it (by "
                    "another writer that took the store over?); this writer writes no more"
                )
        return StoreError(f"cannot open segment {self.path}: {exc.strerror}")

    def _check_size(self, actual: int) -> None:
        size_check(self.path, actual, self.size)

    def _open_checked(self) -> int:
        """Open the file by its name, check its size and, for a writer, that it is the file
        first opened (see the class's docstring)."""
        try:
            fd = os.open(self.path, os.O_RDONLY if self.read_only else os.O_RDWR)
        except OSError as exc:
            raise self._open_error(exc) from exc
        try:
            st = os.fstat(fd)
            self._check_size(st.st_size)
            if self.read_only:
                # A view reads whatever file the name leads to: no identity to check.
                return fd
            identity = filesystem.file_identity(fd, st)
            known = self._identity
            if known is not None and not filesystem.same_file(known, identity):
                raise FileReplacedError(
                    f"{self.path}: the name now leads to another file (inode {st.st_ino} "
                    f"generation {identity[2]}; this writer opened inode {known[1]} generation "
                    f"{known[2]}): another writer took the store over and replaced it; this "
                    "writer writes no more"
                )
            self._identity = identity
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _hold(self, fd: int) -> None:
        self._fd = fd
        if self._cache is not None:
            self._cache.took(self, mapping=False)

    def _descriptor(self) -> int:
        """The file's own descriptor, opened (and checked) now and kept if it is not held."""
        if self._fd >= 0:
            if self._cache is not None and not self._borrowed:
                self._cache.touch(self)
            return self._fd
        fd = self._open_checked()
        self._hold(fd)
        return fd

    @contextlib.contextmanager
    def borrowed(self) -> Iterator[None]:
        """Keep one descriptor for the reads and writes of the block (loading a queue reads a
        few units), also when the process has no room to keep one (see
        :meth:`_io_descriptor`): then it is opened once and closed at the end."""
        if self._fd >= 0 or self._view is not None:
            yield
            return
        fd, once = self._io_descriptor()
        if not once:
            yield  # kept for good
            return
        self._fd, self._borrowed = fd, True
        try:
            yield
        finally:
            if self._borrowed:
                self._fd, self._borrowed = -1, False
                os.close(fd)

    @contextlib.contextmanager
    def pinned(self) -> Iterator[None]:
        """Keep the file readable for the block, whether or not its name is deleted meanwhile
        (a read-only scan of a live store, whose retention deletes the oldest files): a
        descriptor of its own, which the cache does not release, serves every read, mapping
        and look at its data in the block. Raises :class:`SegmentGoneError` for a file
        already gone. Not counted in the process's descriptor budget: the caller bounds how
        many it pins."""
        if self._fd >= 0 and self._borrowed:
            yield  # pinned (or borrowed) already: that descriptor holds for the block
            return
        fd = self._open_checked()
        if self._cache is not None:
            self._cache.work.opened += 1
        if self._fd >= 0:  # the cache's: this one replaces it
            old, self._fd = self._fd, -1
            os.close(old)
            if self._cache is not None:
                self._cache.gave_back(self, mapping=False, holds_more=self._mm is not None)
        self._fd, self._borrowed = fd, True
        try:
            yield
        finally:
            if self._borrowed and self._fd == fd:  # not closed meanwhile (close() does)
                self._fd, self._borrowed = -1, False
                os.close(fd)

    def _io_descriptor(self) -> tuple[int, bool]:
        """A descriptor for one read or write, and whether the caller must close it after
        that call: the file's own when it holds one or the process has room for one more (see
        :meth:`MappingCache.has_room`), else one opened (and checked) for this call."""
        if self._fd >= 0 or self._cache is None or self._cache.has_room():
            return self._descriptor(), False
        self._cache.work.opened += 1
        return self._open_checked(), True

    def _map(self) -> memoryview:
        held = self._fd >= 0
        fd = self._fd if held else self._open_checked()
        try:
            access = mmap.ACCESS_READ if self.read_only else mmap.ACCESS_WRITE
            self._mm = mmap.mmap(fd, self.size, access=access)
        finally:
            # mmap keeps a dup of its own, counted by the MappingCache; a descriptor opened
            # only to map the file is not needed.
            if not held:
                os.close(fd)
        self._view = memoryview(self._mm)
        if self._cache is not None:
            self._cache.took(self, mapping=True)
        return self._view

    # -- access -----------------------------------------------------------------------------
    @property
    def buffer(self) -> memoryview:
        """A zero-copy view of the whole mapping (mapped now if it is not); do not keep it past
        :meth:`close`. While it (or a slice of it) is alive the segment stays mapped: a caller
        that holds the views of several files at once (a single put hands the native code a
        CommitLog segment, a ConsumeQueue file and an IndexFile) keeps each of them usable when
        mapping the next makes the cache release the least recently used. It is a view of its
        own, never the segment's, which a release would invalidate under the caller."""
        view = self._view
        if view is None:
            view = self._map()
        elif self._cache is not None:
            self._cache.touch(self)
        return view[:]

    @property
    def mapped(self) -> bool:
        return self._view is not None

    @property
    def where(self) -> str:
        """The file's path, for messages."""
        return str(self.path)

    def read(self, position: int, n: int) -> bytes:
        """A copy of exactly ``n`` bytes at ``position`` (``position + n`` within the file;
        zeros where the file's bytes end early), read without mapping an unmapped file."""
        if self._view is not None:
            return bytes(self._view[position : position + n])
        fd, once = self._io_descriptor()
        try:
            raw = os.pread(fd, n, position)
        finally:
            if once:
                os.close(fd)
        return raw if len(raw) == n else raw + bytes(n - len(raw))

    def read_into(self, position: int, out: memoryview) -> None:
        """Fill ``out`` with the bytes at ``position`` (zeros past the end of the file), read
        without mapping an unmapped file."""
        n = out.nbytes
        if self._view is not None:
            out[:] = self._view[position : position + n]
            return
        fd, once = self._io_descriptor()
        try:
            done = 0
            while done < n:
                got = os.preadv(fd, [out[done:]], position + done)
                if got <= 0:
                    out[done:] = bytes(n - done)
                    return
                done += got
        finally:
            if once:
                os.close(fd)

    def data_end(self) -> int:
        """Bytes from the start of the file past which it holds only holes, so reads as zeros
        (:func:`rocketstore.pipeline.files.fileio.data_end`; the file's size where the file system
        cannot tell): a scan of a sparse file need not read further."""
        fd, once = self._io_descriptor()
        try:
            return data_end(fd, self.size)
        finally:
            if once:
                os.close(fd)

    @property
    def end(self) -> int:
        """Log offset one past the last written byte."""
        return self.base + self.wrote_position

    @property
    def remaining(self) -> int:
        return self.size - self.wrote_position

    @property
    def is_full(self) -> bool:
        return self.wrote_position >= self.size

    # -- blocks -----------------------------------------------------------------------------
    @property
    def allocated(self) -> int:
        """Bytes from the start of the file known to have their blocks (see the module doc)."""
        if self._allocated < 0:
            self._allocated = min(self.size, (self.wrote_position // PAGE) * PAGE)
        return self._allocated

    def forget_allocation(self, keep: int = 0) -> None:
        """Trust only the first ``keep`` bytes to have blocks (a file written out of order, such
        as an IndexFile's slots, is not allocated up to its write position)."""
        self._allocated = min(keep, self.size)

    def reserve(self, end: int, ahead: int | None = None) -> None:
        """Make sure ``[0, end)`` has its blocks, allocating up to ``ahead`` (default
        :attr:`ahead`) bytes more than asked (less when that does not fit). Raises
        :class:`SegmentCreateError`, naming the file and the free space, when the file system
        has no room: nothing is written."""
        if end <= self._allocated:
            return  # the common case, on every put: kept to one comparison
        have = self.allocated
        end = min(self.size, end)
        if end <= have:
            return
        if self.read_only:
            raise StoreError(f"cannot reserve blocks of {self.path} in a read-only store")
        # By default the window grows with what the file holds (a page, then doubling, up to
        # ``ahead``): ten thousand queues of a few units each reserve a page each, not a
        # window each.
        window = min(self.ahead, max(PAGE, have)) if ahead is None else ahead
        want = min(self.size, -(-max(end, have + window) // PAGE) * PAGE)
        failpoints.hit("reserve")
        try:
            fd = self._descriptor()
            try:
                os.posix_fallocate(fd, have, want - have)
            except OSError as exc:
                if exc.errno != errno.ENOSPC or want <= end:
                    raise
                # The window does not fit, what the write needs may still.
                want = min(self.size, -(-end // PAGE) * PAGE)
                os.posix_fallocate(fd, have, want - have)
        except OSError as exc:
            raise SegmentCreateError(
                f"{self.path}: cannot reserve blocks for bytes [{have}, {end}) of the file: "
                f"{exc.strerror or exc} ({limit_note(exc, self.path.parent)})"
            ) from exc
        self._allocated = want

    def write_at(self, position: int, data: bytes | bytearray | memoryview) -> None:
        """Copy ``data`` to ``position`` (relative to the segment) and advance the write position.

        A small write into a mapped file goes through the mapping, after its blocks are
        reserved (see :meth:`reserve`); anything else goes through the file's descriptor
        (:meth:`_pwrite`), which fills a page without faulting it into a mapping: a file
        written a few units at a time, as each of thousands of ConsumeQueues is, is never
        mapped for it."""
        if isinstance(data, memoryview) and (data.format != "B" or data.ndim != 1):
            data = data.cast("B")
        n = len(data)
        if position < 0 or position + n > self.size:
            raise StoreError(f"{self.path}: write of {n} bytes at {position} exceeds {self.size}")
        if self.read_only:
            raise StoreError(f"cannot write to {self.path} in a read-only store")
        if self._cache is not None and self._view is not None and n < PWRITE_MIN_BYTES:
            self._cache.touch(self)  # the write goes through the mapping: keep it mapped
        self.append_at(position, data)

    def append_at(self, position: int, data: bytes | bytearray | memoryview) -> None:
        """:meth:`write_at` of bytes (format ``B``) the caller knows to fit at ``position``,
        without its checks and without touching the mapping cache: the path of a
        ConsumeQueue's units, and the write itself of :meth:`write_at`."""
        n = len(data)
        if self._view is not None and n < PWRITE_MIN_BYTES:
            self.reserve(position + n)
            self._view[position : position + n] = data
        else:
            self._pwrite(position, data)
            if position <= self.allocated < position + n:
                self._allocated = position + n
        if position + n > self.wrote_position:
            self.wrote_position = position + n

    def has_blocks(self, end: int) -> bool:
        """Whether ``[0, end)`` is known to have its blocks (a :meth:`reserve` would do
        nothing)."""
        return end <= self._allocated or end <= self.allocated

    def overwrite(self, position: int, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at ``position`` through the file (see :meth:`_pwrite`), leaving the
        write position alone: for bytes behind it (recovery zeroing a torn tail), whose pages
        may have no blocks in a file another writer left sparse."""
        if position < 0 or position + len(data) > self.size:
            raise StoreError(
                f"{self.path}: write of {len(data)} bytes at {position} exceeds {self.size}"
            )
        self._pwrite(position, data)

    def _pwrite(self, position: int, data: bytes | bytearray | memoryview) -> None:
        """Write through the file's own descriptor instead of the mapping: the same page cache
        pages, so the mapping sees the bytes and ``msync`` of the range makes them durable, but
        a page that was never touched is filled without a page fault. A full disk raises
        ``OSError`` here, where a write into the mapping would die of SIGBUS."""
        view = memoryview(data)
        start, end = position, position + view.nbytes
        fd, once = self._io_descriptor()
        try:
            while len(view):
                done = os.pwrite(fd, view, position)
                view, position = view[done:], position + done
        except OSError as exc:
            raise io_error(exc, f"write of bytes [{start}, {end}) of {self.path}") from exc
        finally:
            if once:
                os.close(fd)

    def flush(self) -> None:
        """Make everything written so far durable (``msync`` of the unflushed, page-aligned range
        of a mapped file; ``fsync`` of its own descriptor otherwise)."""
        if self.read_only or self.flushed_position >= self.wrote_position:
            return
        self.sync_range(self.flushed_position, self.wrote_position)
        self.flushed_position = self.wrote_position

    def mark_flushed(self) -> None:
        """Everything written so far was made durable by other means (a sync of the whole file
        system, see :func:`rocketstore.pipeline.files.durability.syncfs`)."""
        self.flushed_position = self.wrote_position
        self.fresh = False

    def sync_range(self, start: int, end: int) -> None:
        """Make ``[start, end)`` durable, whatever the write position says (recovery uses it for
        bytes it zeroed behind the write position)."""
        if self.read_only or end <= start:
            return
        mm = self._mm
        if mm is not None:
            start = (start // PAGE) * PAGE
        if self._cache is not None:
            self._cache.work.synced += 1
        try:
            if mm is None:
                fd, once = self._io_descriptor()
                try:
                    durability.fsync(fd, self.path)
                finally:
                    if once:
                        os.close(fd)
            else:
                durability.msync(mm, start, end - start, self.path)
        except OSError as exc:
            call = "fsync" if mm is None else "msync"
            raise io_error(exc, f"{call} of bytes [{start}, {end}) of {self.path}") from exc

    def release(self) -> bool:
        """Close the file's own descriptor and drop the mapping (the file stays; it is opened
        or mapped again when next used), unless a zero-copy view is still alive: then the
        mapping stays and this returns False. Written but unflushed bytes stay in the page
        cache, and :meth:`flush` fsyncs the file for them."""
        if self._fd >= 0 and not self._borrowed:
            fd, self._fd = self._fd, -1
            os.close(fd)
            if self._cache is not None:
                self._cache.gave_back(self, mapping=False, holds_more=self._mm is not None)
        if self._mm is None or self._view is None:
            return True
        try:
            self._view.release()
        except BufferError:
            return False
        try:
            self._mm.close()
        except BufferError:
            self._view = memoryview(self._mm)
            return False
        self._mm = None
        self._view = None
        if self._cache is not None:
            self._cache.gave_back(self, mapping=True, holds_more=False)
        return True

    def close(self) -> None:
        """Drop the mapping and the descriptor for good. Never fails for a zero-copy view still
        alive: the segment forgets the mapping at once, and the mapping itself stays valid for
        the view and is unmapped when the last view is collected."""
        mm, view = self._mm, self._view
        self._mm = self._view = None
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)
            if self._borrowed:
                self._borrowed = False  # borrowed() finds it closed
            elif self._cache is not None:
                self._cache.gave_back(self, mapping=False, holds_more=mm is not None)
        if mm is not None and self._cache is not None:
            self._cache.gave_back(self, mapping=True, holds_more=False)
        try:
            if view is not None:
                view.release()
            if mm is not None:
                mm.close()
        except BufferError:
            pass  # a view exports the mapping; dropping our references leaves it to the view

    def __repr__(self) -> str:
        return f"MappedFile({self.path.name}, wrote={self.wrote_position}/{self.size})"
