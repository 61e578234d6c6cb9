"""The segment files of a local directory (or one a shared file system mounts): the local
implementation of :class:`rocketstore.pipeline.files.segmentread.SegmentDir`.

A listing is what this host's ``scandir`` of the directory shows: files named by a 20-digit
base offset (:func:`list_segments`; anything else, a ``*.creating`` leftover included, is
not a segment). A segment is opened as a read-only
:class:`~rocketstore.pipeline.files.mappedfile.MappedFile`: checked (there, of the
directory's segment size) when opened, read with ``pread`` through a descriptor of its own, or
mapped read-only for zero-copy reads (``whole``, or its first use of ``buffer``); with the
store's :class:`~rocketstore.pipeline.files.mappings.MappingCache` its descriptor and mapping
count against the store's bounds. A file held open or mapped stays readable after retention
unlinks it.

The visibility rule for shared storage meets the listing here
(:mod:`rocketstore.pipeline.files.visibility`): a client of a shared file system may answer a
listing from its cache, so a segment another host created a moment ago can be missing from
this host's listing although the writer has published data in it. Segments are created in
offset order and deleted from the front, so one past the last listed was created since: with
``wait_ms`` the directory is listed again for it, pausing a little longer each time, for up to
that many ms (0: once more), then :class:`NotVisibleError`. Without it (the writer's own store,
or a store on one host) the listing is taken as the directory.

Owns: the listing, and nothing it opens (the caller closes a segment it opened). Thread-safety:
none; each reader keeps its own. Crash behaviour: lists and reads, never writes. Requires the
store's naming: segments of one size, each named by its base.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from rocketstore.pipeline.errors import NotVisibleError, SegmentGoneError
from rocketstore.pipeline.files import visibility
from rocketstore.pipeline.files.filecreation import TMP_SUFFIX
from rocketstore.pipeline.files.mappedfile import (
    MappedFile,
    listed_size,
    parse_segment_name,
    segment_name,
    size_check,
)
from rocketstore.pipeline.files.mappings import MappingCache

T = TypeVar("T")


def _open_fresh(path: str, directory: Path) -> int:
    """``os.open(path, O_RDONLY)``; on ``ESTALE`` (a shared file system's client still naming
    a file another host replaced: seen on GlusterFS after a take-over) the directory is listed
    again, which refreshes the client's entries, and the open tried once more."""
    try:
        return os.open(path, os.O_RDONLY)
    except OSError as exc:
        if exc.errno != errno.ESTALE:
            raise
    with contextlib.suppress(OSError):
        os.listdir(directory)
    return os.open(path, os.O_RDONLY)


def list_segments(directory: Path, leftovers: list[Path] | None = None) -> list[tuple[int, Path]]:
    """(base offset, path) of the segment files in ``directory`` as this host lists it now, in
    offset order; none when there is no such directory. Names that are not 20-digit offsets
    (a ``*.creating`` leftover, anything else) are left out; ``leftovers`` collects the
    ``*.creating`` ones. Every call reads the directory again, which is how a shared file
    system's client is made to ask its servers instead of answering from a listing it
    cached."""
    found: list[tuple[int, Path]] = []
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                base = parse_segment_name(entry.name)
                if base is not None:
                    if entry.is_file():
                        found.append((base, Path(entry.path)))
                elif leftovers is not None and entry.name.endswith(TMP_SUFFIX):
                    leftovers.append(Path(entry.path))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found.sort()
    return found


def _gone(where: str) -> SegmentGoneError:
    return SegmentGoneError(
        f"{where}: gone since this reader listed it (deleted by retention on a live store?)"
    )


class LocalSegments:
    """The segment files of ``directory`` (see the module docstring).

    ``wait_ms``: None, the listing is the directory; a number, the visibility wait for a
    segment past the listing. ``segment_size``: the size every segment must have (the store's
    setting); None, the directory's own (:meth:`file_size`). ``cache``: the store's mapping
    cache, for the segments opened here. The directory is listed when first needed."""

    def __init__(
        self,
        directory: str | Path,
        wait_ms: int | None = None,
        *,
        segment_size: int | None = None,
        cache: MappingCache | None = None,
    ) -> None:
        # Names are kept as strings until a path is needed: a tool that reads one unit of
        # each of 40,000 queues would spend more on building paths than on reading.
        self.location = os.fspath(directory)
        self._directory = directory if isinstance(directory, Path) else None
        self._prefix = self.location + "/"
        self.wait_ms = wait_ms
        self.segment_size = segment_size
        self.cache = cache
        self._entries: list[tuple[int, Path]] | None = None
        self._paths: dict[int, Path] = {}
        self._size: int | None = None

    # -- the listing ------------------------------------------------------------------------
    @property
    def directory(self) -> Path:
        d = self._directory
        if d is None:
            d = self._directory = Path(self.location)
        return d

    @property
    def entries(self) -> list[tuple[int, Path]]:
        """(base, path) of each segment listed (listed now if it was not yet)."""
        if self._entries is None:
            self.relist()
        assert self._entries is not None
        return self._entries

    def relist(self, leftovers: list[Path] | None = None) -> None:
        """Read the directory again (``leftovers``: see :func:`list_segments`)."""
        self._entries = list_segments(self.directory, leftovers)
        self._paths = dict(self._entries)
        self._size = None

    def listed(self) -> list[int]:
        return [base for base, _ in self.entries]

    def first(self) -> int | None:
        entries = self.entries
        if entries or self.wait_ms is None:
            return entries[0][0] if entries else None
        return self._relisted(
            lambda: self.entries[0][0] if self.entries else None, lambda: False, "any segment"
        )

    def file_size(self) -> int:
        if self._size is None:
            entries = self.entries  # listed first: a listing forgets the size
            self._size = next(
                (s for s in map(listed_size, reversed([p for _, p in entries])) if s > 0), 0
            )
        return self._size

    def size_of(self, base: int) -> int:
        return listed_size(Path(self.where(base)))

    def is_listed(self, base: int) -> bool:
        """Whether this listing names the segment at ``base`` (no listing again, no wait)."""
        if self._entries is None:
            self.relist()
        return base in self._paths

    def has(self, base: int) -> bool:
        entries = self.entries
        if base in self._paths or self.wait_ms is None:
            return base in self._paths
        if entries and entries[-1][0] > base:
            return False  # the listing goes past it: deleted
        found = self._relisted(
            lambda: base if base in self._paths else None,
            lambda: bool(self.entries) and self.entries[-1][0] > base,
            f"segment {segment_name(base)}",
        )
        return found is not None

    def _relisted(
        self, found: Callable[[], T | None], gone: Callable[[], bool], what: str
    ) -> T | None:
        """``found()`` after listing the directory again, until it is not None or ``gone()``
        (the listing went past what is looked for: deleted meanwhile, None); raises
        :class:`NotVisibleError` when neither happens within ``wait_ms``."""
        assert self.wait_ms is not None
        wait_ms = self.wait_ms

        def look() -> T | None:
            self.relist()
            got = found()
            if got is not None or gone():
                return got
            last = self.entries[-1][1].name if self.entries else "none"
            raise NotVisibleError(
                f"{self.directory}: {what} is not in this host's listing of the directory "
                f"after {wait_ms} ms of listing it again (the last segment listed is {last}): "
                "published by a writer on another host and not visible here yet; this is not "
                "damage (sharedStorage, visibilityWaitMs)"
            )

        return visibility.wait_until_valid(
            look, lambda exc: isinstance(exc, NotVisibleError), lambda: None, wait_ms
        )

    # -- the segments -----------------------------------------------------------------------
    def where(self, base: int) -> str:
        return self._prefix + segment_name(base)

    def open(
        self, base: int, *, whole: bool = False, stat: os.stat_result | None = None
    ) -> MappedFile:
        """:meth:`SegmentDir.open`, opened by its name first: the listing is looked at only
        when that fails. ``stat``: the file's status as the caller just read it."""
        try:
            return self._open(base, whole, stat)
        except SegmentGoneError:
            if not self.has(base):
                raise
        return self._open(base, whole, None)

    def _open(self, base: int, whole: bool, stat: os.stat_result | None) -> MappedFile:
        size = self.segment_size or self.file_size()
        if size <= 0:
            # No sized segment listed (a listing older than the file): the file's own size.
            size = stat.st_size if stat is not None else self.size_of(base)
            if size <= 0:
                raise _gone(self.where(base))  # not there, or nothing in it yet
        return MappedFile(
            Path(self.where(base)),
            base,
            size,
            read_only=True,
            cache=self.cache,
            stat=stat,
            map_now=whole,
        )

    def read(self, base: int, position: int, n: int, *, direct: bool = False) -> bytes:
        """:meth:`SegmentDir.read`: the file opened by its name, checked against
        ``segment_size`` when one was given (:class:`NotAStoreError` for another size, as
        :meth:`open` checks), read once, closed. An empty file is not checked: it reads as
        zeros, as a file not sized yet does (another host's client of a shared file system can
        show a new file's name before its size). ``direct``: read past this host's page cache
        where the file system allows it (:func:`visibility.read_direct`)."""
        path = self.where(base)
        try:
            fd = _open_fresh(path, self.directory)
        except FileNotFoundError:
            if not self.has(base):
                raise _gone(path) from None
            try:
                fd = _open_fresh(path, self.directory)
            except FileNotFoundError:
                raise _gone(path) from None
        try:
            size = os.fstat(fd).st_size
            if self.segment_size is not None and size:
                size_check(path, size, self.segment_size)
            raw = visibility.read_direct(fd, position, n) if direct else None
            if raw is None:
                raw = os.pread(fd, n, position)
        finally:
            os.close(fd)
        return raw if len(raw) == n else raw + bytes(n - len(raw))

    def forget_cached(self, base: int) -> None:
        visibility.drop_cached(Path(self.where(base)))
