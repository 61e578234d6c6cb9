"""``rocketstore verify`` of the tier: the store's objects in the bucket (docs/tiering.md), checked
as the local scan checks the local files, each problem naming the object and the byte.

What is checked, with the tier on (``tieredStorageLevel = "NOT_IN_DISK"``):

* the manifest (``B/manifest.json``) decodes, every field in range and the segments
  contiguous (:func:`rocketstore.pipeline.tier.manifest.decode`), and its ``segmentSize`` is the
  store's;
* every object the manifest names exists with the manifest's length and SHA-256;
* each segment's records walk cleanly to its END_OF_FILE blank (magic, sizes, physical offsets,
  body CRCs: the walk that builds a segment index, :func:`build_segment_index`), and the
  manifest's record count and store times are the walk's;
* each index object's head passes its own checks (magic, version, the head's CRC, the segment
  it names), the CRC of the rest of it holds, and it is byte for byte the index rebuilt from
  its segment's bytes;
* the tier and the local files leave no offsets between them (the tier's end reaches the
  local CommitLog's first segment);
* the store's own record of its tier (``config/rocketstore-tier.json``) names the manifest's
  ``storeId``, and its ``uploadedEnd`` (below which local retention deletes) is not past
  what the manifest holds.

Problems (stable kinds, beside :mod:`rocketstore.pipeline.tools.verify.check`'s): ``path`` is
the object's ``s3://bucket/key``; ``offset`` is the CommitLog (physical) offset for a segment
object, as for a local CommitLog segment, and the byte of the object for an index object or the
manifest.

=================================== ==========================================================
tier-manifest                       the manifest does not decode (the field at fault named),
                                    or says other than its segments (size, records, times)
tier-object-missing                 an object the manifest names is not in the bucket
tier-object-length                  an object of another length than the manifest says
tier-object-sha256                  a segment or index object whose SHA-256 is not the
                                    manifest's (at the first byte that differs from the local
                                    segment file, when there still is one)
tier-record                         a record of a segment object fails its checks
tier-index                          an index object fails its checks, or differs from the
                                    index rebuilt from its segment (the first byte that does)
tier-gap                            offsets between the tier's end and the local files' start
                                    are in neither
tier-local-state                    config/rocketstore-tier.json (``path``: the local file)
                                    cannot be read, names another store than the manifest, or
                                    says more is uploaded than the manifest holds
=================================== ==========================================================

How it reads: each object is streamed with ranged GETs of :data:`CHUNK` bytes through the
tier's read side (:meth:`RemoteSegments.fetch`, which names the object when it is missing or
short). A segment's bytes are held once, in one buffer, for the record walk; its index object
is never held whole: each chunk is hashed, CRC'd and compared with the rebuilt index as it
arrives. Memory: one segment and its rebuilt index (about 1.2 GiB for a 1 GiB segment of
small messages). Every byte of the tier is read once per run.

Owns: nothing. Thread-safety: none (one command's thread). Crash behaviour: reads only.
Requires: the 'tier' extra and the bucket's read credentials.
"""

from __future__ import annotations

import dataclasses
import hashlib
import zlib
from collections.abc import Callable
from pathlib import Path

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.errors import (
    CorruptRecordError,
    ManifestError,
    SegmentGoneError,
    StoreError,
    TierError,
)
from rocketstore.pipeline.files.mappedfile import segment_name
from rocketstore.pipeline.format.segmentindex import HEADER_SIZE, SegmentIndex, build_segment_index
from rocketstore.pipeline.tier import localstate
from rocketstore.pipeline.tier.manifest import Manifest, TierSegment, manifest_key
from rocketstore.pipeline.tier.remote import RemoteSegments, open_tier, read_manifest
from rocketstore.pipeline.tools.verify.report import Problem, VerifyReport

CHUNK = 8 << 20  # bytes of one ranged GET: the read side's read-ahead window
TierProgress = Callable[[int, int], None]  # (segments checked, segments in the tier)


@dataclasses.dataclass
class TierCounts:
    """How much of the tier a run checked (``verify --json``'s ``tier`` field)."""

    bucket: str
    segments: int = 0
    bytes: int = 0  # segment bytes read
    records: int = 0
    index_objects: int = 0
    index_bytes: int = 0
    retired: int = 0  # segments the tier's retention removed while the run checked them

    def to_json(self) -> dict[str, object]:
        return {
            "bucket": self.bucket,
            "segments": self.segments,
            "bytes": self.bytes,
            "records": self.records,
            "indexObjects": self.index_objects,
            "indexBytes": self.index_bytes,
            "retired": self.retired,
        }


def verify_tier(
    store: str | Path,
    config: StoreConfig,
    report: VerifyReport,
    *,
    progress: TierProgress | None = None,
) -> TierCounts:
    """Check the tier of the store directory ``store`` (see the module docstring), adding
    each problem to ``report``. Raises what the bucket raises when it cannot be read at all
    (wrong credentials, no such bucket: :class:`~rocketstore.pipeline.errors.TierError`)."""
    tier = open_tier(Path(store), config)
    if tier is None:
        raise ValueError("verify_tier needs the tier on (tieredStorageLevel = NOT_IN_DISK)")
    return _TierScan(Path(store), config, tier, report).run(progress)


class _TierScan:
    def __init__(
        self, store: Path, config: StoreConfig, tier: RemoteSegments, report: VerifyReport
    ) -> None:
        self.store = store
        self.config = config
        self.tier = tier
        self.report = report
        self.name = tier.location[: -len(f"{tier.prefix}commitlog")]  # s3://bucket/
        self.counts = TierCounts(self.name)

    def problem(self, kind: str, key: str, offset: int, detail: str) -> None:
        self.report.problems.append(Problem(kind, f"{self.name}{key}", offset, detail))

    def run(self, progress: TierProgress | None) -> TierCounts:
        key = manifest_key(self.tier.prefix)
        try:
            manifest = read_manifest(self.tier.objects, self.tier.prefix)
        except ManifestError as exc:
            self.problem("tier-manifest", key, 0, str(exc))
            return self.counts
        if manifest is None:
            return self.counts  # nothing uploaded yet
        self.tier = RemoteSegments(
            self.tier.objects, self.tier.prefix, name=self.name, manifest=manifest
        )
        if manifest.segment_size != self.config.mapped_file_size_commitlog:
            self.problem(
                "tier-manifest",
                key,
                0,
                f"segmentSize {manifest.segment_size}; the store's mappedFileSizeCommitLog is "
                f"{self.config.mapped_file_size_commitlog}",
            )
            return self.counts  # offsets would be read against the wrong segment size
        self.local_state(manifest)
        for done, entry in enumerate(manifest.segments):
            before = len(self.report.problems)
            try:
                self.segment(entry)
            except SegmentGoneError:
                # The tier's retention removed it since the run read the manifest: not damage,
                # and nothing more to check of it (what it found of it so far goes too).
                del self.report.problems[before:]
                self.counts.retired += 1
            if progress is not None:
                progress(done + 1, len(manifest.segments))
        self.gap(manifest)
        return self.counts

    def local_state(self, manifest: Manifest) -> None:
        """The store's record of its tier against the manifest: the same store, and nothing
        claimed uploaded that the manifest does not hold (local retention trusts it)."""
        path = localstate.path_of(self.store)
        try:
            state = localstate.read(self.store)
        except TierError as exc:
            self.report.problems.append(Problem("tier-local-state", str(path), 0, str(exc)))
            return
        if state is None:
            return  # never uploaded from here (or a copy of the store without its record)
        holds = manifest.segments[-1].base + manifest.segment_size if manifest.segments else 0
        if state.store_id != manifest.store_id:
            detail = (
                f"storeId {state.store_id}; the bucket's manifest is store "
                f"{manifest.store_id}'s ({self.name}{manifest_key(self.tier.prefix)})"
            )
            self.report.problems.append(Problem("tier-local-state", str(path), 0, detail))
        elif state.uploaded_end > holds and state.uploaded_end > manifest.deleted_below:
            detail = (
                f"uploadedEnd {state.uploaded_end}, but the manifest holds segments up to "
                f"{holds} only: local retention may delete segments that are not in the bucket"
            )
            self.report.problems.append(Problem("tier-local-state", str(path), 0, detail))

    # -- one segment ------------------------------------------------------------------------
    def segment(self, entry: TierSegment) -> None:
        # The index head, read once: its form shapes the rebuild, its damage is reported by
        # check_index once the object is known to be there.
        head: SegmentIndex | StoreError
        try:
            head = self.tier.index(entry.base)
        except StoreError as exc:
            head = exc
        data = self.stream_segment(entry)
        rebuilt: bytes | None = None
        if data is not None:
            try:
                rebuilt = build_segment_index(
                    data,
                    entry.base,
                    entry.length,
                    where=self.tier.where(entry.base),
                    **index_form(head),
                )
            except CorruptRecordError as exc:
                self.problem(
                    "tier-record", self.tier.commitlog_key(entry.base), exc.offset, exc.reason
                )
            del data  # the segment's bytes go before its index is read
        if rebuilt is not None:
            self.check_entry(entry, rebuilt)
        self.check_index(entry, rebuilt, head)

    def present(self, key: str, length: int, offset_of: Callable[[int], int], base: int) -> bool:
        """Whether ``key`` (of the segment at ``base``) is in the bucket with ``length``
        bytes; a problem if not, unless the tier's retention removed the segment since the
        run read the manifest (:class:`SegmentGoneError`)."""
        got = self.tier.objects.head(key)
        if got is None:
            now = read_manifest(self.tier.objects, self.tier.prefix)
            if now is not None and base < now.deleted_below:
                raise SegmentGoneError(f"{self.name}{key}: removed by the tier's retention")
            self.problem(
                "tier-object-missing",
                key,
                offset_of(0),
                f"named by the manifest (generation {self.tier.manifest.generation}) but not "
                "in the bucket: deleted or lost there",
            )
            return False
        if got[0] != length:
            self.problem(
                "tier-object-length",
                key,
                offset_of(min(got[0], length)),
                f"{got[0]} bytes; the manifest says {length}",
            )
            return False
        return True

    def stream_segment(self, entry: TierSegment) -> bytearray | None:
        """The segment object's bytes, checked against the manifest's length and SHA-256;
        None when it is missing or of another length (a problem says so)."""
        key = self.tier.commitlog_key(entry.base)
        if not self.present(key, entry.length, lambda at: entry.base + at, entry.base):
            return None
        data = bytearray(entry.length)
        sha = hashlib.sha256()
        for start in range(0, entry.length, CHUNK):
            end = min(entry.length, start + CHUNK)
            try:
                chunk = self.tier.fetch(key, start, end, entry.base)
            except CorruptRecordError as exc:  # gone or cut short since the HEAD
                self.problem("tier-object-length", key, exc.offset, exc.reason)
                return None
            data[start:end] = chunk
            sha.update(chunk)
        self.counts.segments += 1
        self.counts.bytes += entry.length
        if sha.hexdigest() != entry.sha256:
            path = self.store / "commitlog" / segment_name(entry.base)
            at, where = 0, " (no local copy of the segment is left to say where it differs)"
            if path.is_file():
                at = first_difference(path, data)
                where = f"; it first differs from the local segment file at byte {at}"
            self.problem(
                "tier-object-sha256",
                key,
                entry.base + at,
                f"SHA-256 {sha.hexdigest()}; the manifest says {entry.sha256}{where}",
            )
        return data

    def check_entry(self, entry: TierSegment, rebuilt: bytes) -> None:
        """The manifest's record count and store times against the segment's own."""
        records = int.from_bytes(rebuilt[24:28], "big")
        low = int.from_bytes(rebuilt[40:48], "big")
        high = int.from_bytes(rebuilt[48:56], "big")
        self.counts.records += records
        said = (entry.records, entry.min_store_timestamp, entry.max_store_timestamp)
        if said != (records, low, high):
            self.problem(
                "tier-manifest",
                manifest_key(self.tier.prefix),
                0,
                f"segment {segment_name(entry.base)}: records, minStoreTimestamp, "
                f"maxStoreTimestamp {said}; its records say {(records, low, high)}",
            )

    def check_index(
        self, entry: TierSegment, rebuilt: bytes | None, head: SegmentIndex | StoreError
    ) -> None:
        """The index object: its head's checks (``head``: what the read side, as readers fetch
        it, made of it), then streamed: its SHA-256, the CRC of bytes 64.. against the
        header's, and every byte against ``rebuilt`` (None: the segment could not be
        indexed)."""
        key = self.tier.index_key(entry.base)
        length = entry.index.length
        if not self.present(key, length, lambda at: at, entry.base):
            return
        if isinstance(head, CorruptRecordError):
            self.problem("tier-index", key, head.offset, head.reason)
        elif isinstance(head, StoreError):
            raise head
        sha = hashlib.sha256()
        crc = 0
        header = b""
        differs: int | None = None
        for start in range(0, length, CHUNK):
            end = min(length, start + CHUNK)
            try:
                chunk = self.tier.fetch(key, start, end, entry.base)
            except CorruptRecordError as exc:
                self.problem("tier-object-length", key, exc.offset, exc.reason)
                return
            sha.update(chunk)
            if start == 0:
                header = chunk[:HEADER_SIZE]
                crc = zlib.crc32(chunk[HEADER_SIZE:])
            else:
                crc = zlib.crc32(chunk, crc)
            if rebuilt is not None and differs is None and chunk != rebuilt[start:end]:
                differs = start + mismatch(chunk, rebuilt[start:end])
        self.counts.index_objects += 1
        self.counts.index_bytes += length
        if sha.hexdigest() != entry.index.sha256:
            self.problem(
                "tier-object-sha256",
                key,
                differs or 0,
                f"SHA-256 {sha.hexdigest()}; the manifest says {entry.index.sha256}",
            )
        stored = int.from_bytes(header[56:60], "big") if len(header) >= 60 else None
        if stored != crc:
            self.problem(
                "tier-index",
                key,
                56,
                f"CRC of bytes {HEADER_SIZE}.. mismatch: stored {stored}, computed {crc}",
            )
        if rebuilt is not None and (differs is not None or len(rebuilt) != length):
            at = differs if differs is not None else min(len(rebuilt), length)
            self.problem(
                "tier-index",
                key,
                at,
                f"differs from the index rebuilt from its segment's records at byte {at} "
                f"(rebuilt: {len(rebuilt)} bytes, object: {length})",
            )

    # -- between the tiers ------------------------------------------------------------------
    def gap(self, manifest: Manifest) -> None:
        """A problem when offsets between the tier's last segment and the local files' first
        are in neither tier."""
        directory = self.store / "commitlog"
        local = sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())
        if local and manifest.segments and local[0] > manifest.end:
            self.problem(
                "tier-gap",
                manifest_key(self.tier.prefix),
                manifest.end,
                f"CommitLog offsets [{manifest.end}, {local[0]}) are in neither the tier "
                f"(it ends with segment {segment_name(manifest.segments[-1].base)}) nor the "
                f"local files (they start with {segment_name(local[0])})",
            )


def mismatch(a: bytes | bytearray, b: bytes | bytearray) -> int:
    """The first index where ``a`` and ``b`` differ (the shorter one's length if one is the
    other's start)."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def first_difference(path: Path, data: bytearray) -> int:
    """The first byte where the file at ``path`` differs from ``data`` (its length when they
    agree as far as ``data`` goes), read a chunk at a time."""
    with path.open("rb") as f:
        for start in range(0, len(data), CHUNK):
            mine = f.read(min(CHUNK, len(data) - start))
            theirs = data[start : start + CHUNK]
            if mine != theirs:
                return start + mismatch(mine, theirs)
    return len(data)


def index_form(head: SegmentIndex | StoreError) -> dict[str, int]:
    """The version and key stride a segment's index object was written with (the rebuild must
    match it byte for byte; objects uploaded before the key sample are version 1). A head that
    could not be read: the current form (check_index reports the head)."""
    if isinstance(head, StoreError):
        return {}
    return {"version": 1} if not head.key_stride else {"stride": head.key_stride}
