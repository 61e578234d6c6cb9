"""The uploader: a store's sealed CommitLog segments to its bucket, each confirmed, in order.

**Sealed.** A CommitLog segment is sealed when a later segment exists and the store's
published flushed point (``config/rocketstore.json``,
:mod:`rocketstore.pipeline.files.progress`) has reached its end: the writer moved past it and
every byte of it is on disk, so it never changes again. The last segment never is.

**One segment, in this order** (:meth:`Uploader.send_segment`, then the commit):

1. its segment index is built from its records
   (:func:`~rocketstore.pipeline.format.segmentindex.build_segment_index`, the layout of
   docs/tiering.md), which also finds its data end: the END_OF_FILE blank's end. A record
   that fails its checks stops the upload, naming the segment and offset: damage is never
   uploaded;
2. ``B/commitlog/<base>``: bytes ``[0, data end)``, each part with its Content-MD5 (the
   server refuses a body changed on the way), the SHA-256 taken of the same bytes as they are
   sent; then a HEAD confirms size and ETag (the server's MD5 of what it holds);
3. ``B/index/<base>``: the index, the same way;
4. the manifest names the segment (a conditional commit: :mod:`.manifest`);
5. ``config/rocketstore-tier.json`` gets the new ``uploadedEnd`` (:mod:`.localstate`), and
   only from then on may local retention delete the segment.

**Several at once** (:meth:`Uploader.run_once`): up to ``tieredStoreUploadThreads`` segments
go through steps 1-3 at the same time, each streaming its file (the parts in memory are
bounded for all of them together: :class:`ObjectStore`); steps 4-5 stay strictly in order, from
the manifest's end: a segment is named only once every segment below it is, so the tier is
always one contiguous run. A segment that fails stops the run there: the ones above it that
were sent are objects no manifest names (rewritten by the next run), never a gap.

**The tier's retention** follows the uploads in every run (:mod:`.retention`): segments older
than ``tieredStoreFileReservedTime`` hours leave the manifest, then the bucket.

The same record keeps what monitoring reads without asking the bucket: the manifest's
segments and bytes and the time of the last commit (written with every ``uploadedEnd``, and
whenever a run finds the manifest other than recorded), and the runs that failed (a counter,
with the time of the last; a run that fails to count leaves it as it was and says so in
the log).

Owns: nothing of the store (it reads it read-only, through
:class:`~rocketstore.pipeline.files.localsegments.LocalSegments`, and never takes the writer's
lock); the tier's objects under its prefix; the local tier record. Thread-safety: an
:class:`Uploader` is used by one thread, which commits; its pool's threads only send objects
(and its :class:`ObjectStore` sends a segment's parts from a few more). Two uploaders of one
store (or two stores on one prefix) are kept apart by the manifest's conditional writes. Crash behaviour: killed at any point, what the manifest names
is whole and confirmed (it names a segment only after both its objects are); an object it does
not name is written again by the next run, and multipart uploads left open are aborted at the
first run (and after a run that failed). Requires: the tier's settings (``tieredStorageLevel`` on, a bucket).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.errors import (
    ManifestError,
    ObjectMismatchError,
    StoreError,
    TierError,
    TierUnavailableError,
)
from rocketstore.pipeline.files.localsegments import LocalSegments
from rocketstore.pipeline.files.mappedfile import segment_name
from rocketstore.pipeline.files.progress import FlushProgress
from rocketstore.pipeline.format.segmentindex import NeedMore, SegmentIndex, build_segment_index
from rocketstore.pipeline.tier import localstate
from rocketstore.pipeline.tier.catalog import CatalogPublisher
from rocketstore.pipeline.tier.localstate import TierState
from rocketstore.pipeline.tier.manifest import (
    IndexObject,
    Manifest,
    ManifestStore,
    TierSegment,
    broker_name,
    index_key,
    segment_key,
    tier_prefix,
)
from rocketstore.pipeline.tier.objects import ObjectStore
from rocketstore.pipeline.tier.retention import TierRetention

log = logging.getLogger(__name__)


def flushed_offset(store: Path) -> int:
    """The store's published flushed point; 0 when it published none."""
    progress = FlushProgress.read(store / "config")
    return progress.flushed_offset if progress is not None else 0


def sealed_bases(segments: LocalSegments, size: int, flushed: int) -> list[int]:
    """The bases of the sealed segments listed (see the module docstring)."""
    bases = segments.listed()
    return [b for b in bases[:-1] if flushed >= b + size]


def index_summary(index: bytes, base: int, where: str) -> SegmentIndex:
    """The segment index built for the segment at ``base``, read back (checked) for what the
    manifest records of the segment: data end, records, store times, queues."""
    parsed = SegmentIndex.parse_head(index, where=where, length=len(index))
    if isinstance(parsed, NeedMore) or parsed.base != base:
        raise TierError(f"{where}: the segment index built for base {base} does not read back")
    return parsed


def queue_ends(index: SegmentIndex) -> dict[str, dict[str, int]]:
    """Each queue's next offset after the segment: its first unit's offset plus its units."""
    out: dict[str, dict[str, int]] = {}
    for row in index.rows:
        out.setdefault(row.topic, {})[str(row.queue_id)] = row.first + row.units
    return out


def merged_queues(
    old: Mapping[str, Mapping[str, int]], new: Mapping[str, Mapping[str, int]]
) -> dict[str, dict[str, int]]:
    """Each queue's next offset after both (the larger; a queue in one only keeps its own)."""
    out = {t: dict(q) for t, q in old.items()}
    for topic, q in new.items():
        mine = out.setdefault(topic, {})
        for qid, nxt in q.items():
            mine[qid] = max(mine.get(qid, 0), nxt)
    return out


@dataclasses.dataclass(frozen=True)
class UploadReport:
    """What one :meth:`Uploader.run_once` did."""

    uploaded: list[int]  # bases, in order
    bytes: int
    uploaded_end: int
    pending: list[int]  # sealed segments still not in the bucket (after an error, or none)
    removed: list[int] = dataclasses.field(default_factory=list)  # by the tier's retention
    deleted_below: int = 0  # the manifest's deleted.below after the run


@dataclasses.dataclass(frozen=True)
class Sent:
    """A segment whose objects are in the bucket, confirmed, and not named yet: what the
    manifest will say of it."""

    path: Path
    entry: TierSegment
    queues: dict[str, dict[str, int]]


class Uploader:
    """Uploads the sealed segments of the store at ``store`` (see the module docstring).
    Made with the tier's settings; opens the bucket (a :class:`TierConfigError` now for wrong
    credentials or a missing bucket) and takes or makes the store's identity."""

    def __init__(
        self,
        store: str | Path,
        config: StoreConfig,
        *,
        objects: ObjectStore | None = None,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        build_index: Callable[..., bytes] | None = None,
    ) -> None:
        if not config.tier_on:
            raise TierError(
                f"{store}: tieredStorageLevel={config.tiered_storage_level}: the tier is off; "
                "set it to NOT_IN_DISK (and objectStoreBucket) to upload"
            )
        self.store = Path(store)
        self.config = config
        self.size = config.mapped_file_size_commitlog
        self.clock_ms = clock_ms
        self.objects = objects if objects is not None else ObjectStore(config)
        self.prefix = tier_prefix(self.store, config)
        self.broker = broker_name(self.store, config)
        self._catalog = CatalogPublisher(self.objects, self.store, config.object_store_prefix)
        self._left_open = True
        self._build_index = build_index
        state = localstate.read(self.store)
        if state is None:
            # The identity is on disk before anything names it in the bucket.
            state = TierState.new()
            localstate.write(self.store, state)
        self.state = state
        self.manifests = ManifestStore(self.objects, self.prefix, state.store_id)
        self.segments = LocalSegments(self.store / "commitlog", segment_size=self.size)
        self.threads = config.tiered_store_upload_threads
        self.retention = TierRetention(
            self.objects, self.manifests, config.tiered_store_file_reserved_time, clock_ms
        )

    # -- what there is ----------------------------------------------------------------------
    def manifest(self) -> Manifest | None:
        loaded = self.manifests.load()
        return loaded[0] if loaded is not None else None

    def pending(self, manifest: Manifest | None) -> list[int]:
        """The sealed local segments the bucket does not hold yet, in upload order."""
        self.segments.relist()
        sealed = sealed_bases(self.segments, self.size, flushed_offset(self.store))
        if manifest is None or not manifest.holds_any():
            return sealed
        start = manifest.end
        todo = [b for b in sealed if b >= start]
        if todo and todo[0] != start:
            raise TierError(
                f"{self.segments.where(start)}: the tier ends at {start} but the store's "
                f"first sealed segment not uploaded is {todo[0]}: segments were deleted "
                "locally before they were uploaded (was retention run with the tier off?)",
                self.objects.bucket,
                segment_key(self.prefix, start),
            )
        return todo

    # -- uploading --------------------------------------------------------------------------
    def run_once(self, stop: threading.Event | None = None) -> UploadReport:
        """Upload every sealed segment not in the bucket yet (several at once, named in
        order), then apply the tier's retention; stops early when ``stop`` is set (no
        segment is started after it). Raises the first error (no segment above the failed
        one is named; what was named before it stays), counted in the local record first."""
        try:
            return self._run_once(stop)
        except BaseException as exc:
            self._left_open = True  # an upload of this run may have failed to abort itself
            if isinstance(exc, (StoreError, OSError)):
                self._count_error()
            raise

    def _run_once(self, stop: threading.Event | None) -> UploadReport:
        if self._left_open:
            # Multipart uploads a killed uploader left open: at the first run, and after a
            # run that failed (its own uploads abort themselves when they fail, which may
            # fail too); not at every run of an uploader that follows the store.
            self.objects.abort_uploads(self.prefix + "commitlog/")
            self._left_open = False
        # Before any segment: a segment never names a body schema the bucket lacks.
        self._catalog.publish()
        manifest = self.manifest()
        self._catch_up(manifest)
        todo = self.pending(manifest)
        done, sent = self._upload_in_order(todo, stop)
        kept = self.retention.apply()
        if kept.removed and kept.manifest is not None:
            self._record(kept.manifest)  # monitoring's bucket figures follow the removal
        return UploadReport(
            done,
            sent,
            self.state.uploaded_end,
            todo[len(done) :],
            kept.removed,
            kept.deleted_below,
        )

    def _upload_in_order(
        self, todo: list[int], stop: threading.Event | None
    ) -> tuple[list[int], int]:
        """Send up to :attr:`threads` of ``todo`` at once and name each as soon as it and all
        below it are sent; returns the bases named and their bytes. On an error the segments
        not started are dropped, those being sent finish (as leftovers), and it is raised."""
        done: list[int] = []
        sent = 0
        queue = iter(todo)
        running: deque[Future[Sent]] = deque()
        with ThreadPoolExecutor(self.threads, thread_name_prefix="tier-upload") as pool:
            try:
                while True:
                    while len(running) < self.threads and not (stop and stop.is_set()):
                        base = next(queue, None)
                        if base is None:
                            break
                        running.append(pool.submit(self.send_segment, base))
                    if not running:
                        break
                    # The oldest first: a segment is named only after every one below it.
                    got = running.popleft().result()
                    self._commit(got)
                    done.append(got.entry.base)
                    sent += got.entry.length
            finally:
                for future in running:
                    future.cancel()
        return done, sent

    def _catch_up(self, manifest: Manifest | None) -> None:
        """The local record follows the manifest (a run killed between the two, or a manifest
        another run changed)."""
        if manifest is not None and self._recorded(manifest) != self.state:
            self._record(manifest)

    def _recorded(self, manifest: Manifest, *, uploaded_at: int = 0) -> TierState:
        """The local record as ``manifest`` makes it: ``uploadedEnd`` only ever grows."""
        end = manifest.end if manifest.holds_any() else 0
        return dataclasses.replace(
            self.state,
            uploaded_end=max(self.state.uploaded_end, end),
            bucket_segments=len(manifest.segments),
            bucket_bytes=sum(s.length + s.index.length for s in manifest.segments),
            last_upload_ms=uploaded_at or self.state.last_upload_ms,
        )

    def _record(self, manifest: Manifest, *, uploaded_at: int = 0) -> None:
        self.state = self._recorded(manifest, uploaded_at=uploaded_at)
        localstate.write(self.store, self.state)

    def _count_error(self) -> None:
        """One more failed run in the local record (for monitoring); a record that cannot be
        written is logged, and the run's own error is the one raised."""
        counted = dataclasses.replace(
            self.state, upload_errors=self.state.upload_errors + 1, last_error_ms=self.clock_ms()
        )
        try:
            localstate.write(self.store, counted)
        except (StoreError, OSError) as exc:
            log.warning("%s: the failed upload could not be counted: %s", self.store, exc)
            return
        self.state = counted

    def send_segment(self, base: int) -> Sent:
        """Steps 1-3 of the module docstring for the sealed segment at ``base``: its objects
        in the bucket, confirmed; what the manifest will say of it. Names nothing."""
        path = Path(self.segments.where(base))
        # A listing of its own: LocalSegments is not shared between threads.
        seg = LocalSegments(path.parent, segment_size=self.size).open(base, whole=True)
        try:
            index = self._index(seg.buffer, base)
        finally:
            seg.close()
        summary = index_summary(index, base, str(path))
        key = segment_key(self.prefix, base)
        sha = hashlib.sha256()
        etag, _ = self.objects.put_file_hashed(key, path, summary.data_end, sha256=sha)
        self._confirm(key, summary.data_end, etag)
        ikey = index_key(self.prefix, base)
        imd5 = hashlib.md5(index).digest()
        ietag = self.objects.put(ikey, index, md5=imd5)
        self._confirm(ikey, len(index), imd5.hex())
        if ietag != imd5.hex():
            raise ObjectMismatchError(
                f"{self.objects.target.url(ikey)}: stored with ETag {ietag}, the index sent "
                f"has {imd5.hex()}",
                self.objects.bucket,
                ikey,
            )
        entry = TierSegment(
            base=base,
            length=summary.data_end,
            sha256=sha.hexdigest(),
            records=summary.records,
            min_store_timestamp=summary.min_store_timestamp,
            max_store_timestamp=summary.max_store_timestamp,
            index=IndexObject(len(index), hashlib.sha256(index).hexdigest()),
            uploaded_at=self.clock_ms(),
        )
        return Sent(path, entry, queue_ends(summary))

    def _commit(self, sent: Sent) -> Manifest:
        """Steps 4-5: the manifest names the sent segment (the next after its end), then the
        local record gets the new end."""
        entry = sent.entry
        base = entry.base

        def update(m: Manifest | None) -> Manifest | None:
            if m is None:
                m = Manifest(self.state.store_id, self.broker, self.size)
            if m.segment_size != self.size:
                raise ManifestError(
                    f"{self.manifests.where}: segmentSize {m.segment_size}, this store's "
                    f"mappedFileSizeCommitLog is {self.size}"
                )
            if m.holds_any() and m.end > base:
                return None  # another uploader of this store named it first
            return m.extended(entry, merged_queues(m.queues, sent.queues))

        done = self.manifests.commit(update)
        if done.manifest is None or done.manifest.end <= base:
            raise ManifestError(
                f"{self.manifests.where}: segment {segment_name(base)} was not committed"
            )
        self._record(done.manifest, uploaded_at=self.clock_ms())
        log.info(
            "uploaded %s (%d bytes, %d records) to %s",
            sent.path,
            entry.length,
            entry.records,
            self.objects.target.url(segment_key(self.prefix, base)),
        )
        return done.manifest

    def _index(self, buffer: memoryview, base: int) -> bytes:
        build = self._build_index
        if build is None:
            build = build_segment_index
        return build(buffer, base, len(buffer))

    def _confirm(self, key: str, length: int, etag: str) -> None:
        """HEAD: the object is there, ``length`` bytes, with the ETag of what was sent."""
        got = self.objects.head(key)
        if got != (length, etag):
            raise ObjectMismatchError(
                f"{self.objects.target.url(key)}: after the upload the bucket holds "
                f"{'nothing' if got is None else f'{got[0]} bytes with ETag {got[1]}'}, not "
                f"{length} bytes with ETag {etag}",
                self.objects.bucket,
                key,
            )

    # -- continuously -----------------------------------------------------------------------
    def follow(
        self,
        stop: threading.Event,
        *,
        interval_s: float = 1.0,
        on_error: Callable[[TierError], None] | None = None,
        on_report: Callable[[UploadReport], None] | None = None,
    ) -> None:
        """:meth:`run_once` every ``interval_s`` until ``stop`` is set. An unavailable object
        store is waited out (reported to ``on_error``, tried again with a growing pause up
        to a minute); any other error ends the loop (it needs an operator)."""
        pause = interval_s
        while not stop.is_set():
            try:
                report = self.run_once(stop)
                pause = interval_s
                if on_report is not None:
                    on_report(report)
            except TierUnavailableError as exc:
                if on_error is not None:
                    on_error(exc)
                pause = min(max(pause * 2, interval_s), 60.0)
            stop.wait(pause)


def upload_lag_s(store: Path, pending: list[int], segments: LocalSegments, now_ms: int) -> float:
    """Seconds since the oldest sealed segment not uploaded yet was sealed (its last write,
    the END_OF_FILE blank); 0 when nothing is pending."""
    for base in pending:
        try:
            mtime_ns = os.stat(segments.where(base)).st_mtime_ns
        except FileNotFoundError:
            continue
        return max(0.0, (now_ms - mtime_ns // 1_000_000) / 1000)
    return 0.0
