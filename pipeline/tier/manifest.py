"""``<prefix><brokerName>/manifest.json``: which sealed segments the bucket holds for one store,
and whose they are (docs/tiering.md#the-manifest).

One JSON object::

    {"format": 1, "storeId": "...", "broker": "broker-a", "segmentSize": N, "generation": G,
     "segments": [{"base": B, "length": L, "sha256": "...", "records": R,
                   "minStoreTimestamp": T0, "maxStoreTimestamp": T1,
                   "index": {"length": IL, "sha256": "..."}, "uploadedAt": MS}, ...],
     "queues": {"<topic>": {"<queueId>": nextOffset, ...}, ...},
     "deleted": {"below": D}}

Segments ascend and are contiguous (each base is the previous base plus ``segmentSize``),
so the tier holds one run of the log, ``[first base, end)``; an object the manifest does not
name is not part of the tier. :func:`decode` checks all of it and names the object and the
field at fault (:class:`~rocketstore.pipeline.errors.ManifestError`).

**Changes** (:meth:`ManifestStore.commit`) read the manifest with its ETag, apply a function
to it, and write the result with ``If-Match: <etag>`` (the first one with
``If-None-Match: *``). A write that loses (412: another writer changed it since the read)
reads again and applies the function again, to what the winner wrote: two writers can never
both extend it from the same version, and neither overwrites the other. A manifest whose
``storeId`` is not the caller's is refused (:class:`ManifestOwnerError`): two stores never
share a prefix.

Owns: the manifest object. Thread-safety: :class:`Manifest` is immutable; a
:class:`ManifestStore` holds no state beyond its :class:`ObjectStore` (thread-safe), and
concurrent commits are what the conditional write serialises. Crash behaviour: a PUT is
atomic, so the manifest is always one whole version; a writer killed between uploading a
segment's objects and the commit leaves objects no manifest names (rewritten by the next
upload). Requires: a server that enforces ``If-None-Match: *`` and ``If-Match`` on PutObject
(AWS S3 since 2024, radosgw 16.2: ../shared/ceph/README.md).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.errors import (
    ManifestError,
    ManifestOwnerError,
    ObjectNotFoundError,
    PreconditionFailedError,
)
from rocketstore.pipeline.files.mappedfile import segment_name
from rocketstore.pipeline.tier.objects import ObjectStore

FORMAT = 1
MANIFEST_NAME = "manifest.json"
# How many times a commit reads again after losing a race before it gives up: a loser
# re-reads at once, so only a writer starved by many others reaches this.
MAX_ATTEMPTS = 50
_SHA256 = re.compile(r"[0-9a-f]{64}")


def broker_name(store: Path, config: StoreConfig) -> str:
    """``brokerName``, else the store directory's name."""
    return config.broker_name or store.resolve().name


def tier_prefix(store: Path, config: StoreConfig) -> str:
    """``<objectStorePrefix><brokerName>/``: where the store's objects are."""
    return f"{config.object_store_prefix}{broker_name(store, config)}/"


def segment_key(prefix: str, base: int) -> str:
    """The key of a sealed segment's bytes: ``B/commitlog/<20-digit base>``."""
    return f"{prefix}commitlog/{segment_name(base)}"


def index_key(prefix: str, base: int) -> str:
    """The key of a sealed segment's index: ``B/index/<20-digit base>``."""
    return f"{prefix}index/{segment_name(base)}"


def manifest_key(prefix: str) -> str:
    return prefix + MANIFEST_NAME


@dataclasses.dataclass(frozen=True)
class IndexObject:
    length: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class TierSegment:
    """One sealed segment in the bucket: its object holds bytes ``[0, length)`` of the
    segment (its records and the END_OF_FILE blank), ``base`` is its offset in the log."""

    base: int
    length: int
    sha256: str
    records: int
    min_store_timestamp: int
    max_store_timestamp: int
    index: IndexObject
    uploaded_at: int


@dataclasses.dataclass(frozen=True)
class Manifest:
    store_id: str
    broker: str
    segment_size: int
    generation: int = 0
    segments: tuple[TierSegment, ...] = ()
    queues: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)
    deleted_below: int = 0

    @property
    def start(self) -> int:
        """The first offset the tier holds (its first segment's base)."""
        return self.segments[0].base if self.segments else self.deleted_below

    @property
    def end(self) -> int:
        """The offset below which every segment is in the tier, up from :attr:`start`: the
        next segment to upload starts here."""
        if not self.segments:
            return self.deleted_below
        return self.segments[-1].base + self.segment_size

    def bases(self) -> list[int]:
        return [s.base for s in self.segments]

    def extended(self, segment: TierSegment, queues: Mapping[str, Mapping[str, int]]) -> Manifest:
        """This manifest with ``segment`` appended (it must start at :attr:`end`, or be the
        first) and the queues' next offsets now ``queues``."""
        if self.holds_any() and segment.base != self.end:
            raise ManifestError(
                f"segment {segment_name(segment.base)} does not follow the tier's last segment "
                f"(the next is {segment_name(self.end)})"
            )
        return dataclasses.replace(
            self, segments=(*self.segments, segment), queues=_copy_queues(queues)
        )

    def holds_any(self) -> bool:
        """Whether the tier ever held a segment: it has segments, or its retention removed
        some (then :attr:`end` is where the next one must start, even with none left)."""
        return bool(self.segments) or self.deleted_below > 0

    def trimmed(self, below: int) -> Manifest:
        """This manifest without its segments below ``below`` (the tier's retention), and
        ``deleted.below`` raised to ``below``; the queues' next offsets stay (they are the
        tier's end's, which does not move)."""
        if below > self.end or below % self.segment_size:
            raise ManifestError(
                f"cannot remove the segments below {below}: not a segment boundary in "
                f"[{self.start}, {self.end}]"
            )
        return dataclasses.replace(
            self,
            segments=tuple(s for s in self.segments if s.base >= below),
            deleted_below=max(self.deleted_below, below),
        )


def _copy_queues(queues: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    return {t: dict(q) for t, q in queues.items()}


# -- the codec ------------------------------------------------------------------------------
def encode(m: Manifest) -> bytes:
    """The manifest's JSON (sorted keys, so equal manifests are equal bytes)."""
    doc = {
        "format": FORMAT,
        "storeId": m.store_id,
        "broker": m.broker,
        "segmentSize": m.segment_size,
        "generation": m.generation,
        "segments": [
            {
                "base": s.base,
                "length": s.length,
                "sha256": s.sha256,
                "records": s.records,
                "minStoreTimestamp": s.min_store_timestamp,
                "maxStoreTimestamp": s.max_store_timestamp,
                "index": {"length": s.index.length, "sha256": s.index.sha256},
                "uploadedAt": s.uploaded_at,
            }
            for s in m.segments
        ],
        "queues": _copy_queues(m.queues),
        "deleted": {"below": m.deleted_below},
    }
    return (json.dumps(doc, sort_keys=True, indent=1) + "\n").encode()


class _Reader:
    """Typed access to a decoded document, every error naming the object and the field."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, field: str, what: str) -> ManifestError:
        return ManifestError(f"{self.where}: {field}: {what}")

    def obj(self, value: Any, field: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(field, "must be a JSON object")
        return value

    def get(self, doc: dict[str, Any], name: str, field: str) -> Any:
        if name not in doc:
            raise self.fail(f"{field}{name}", "missing")
        return doc[name]

    def integer(self, doc: dict[str, Any], name: str, field: str = "", *, low: int = 0) -> int:
        value = self.get(doc, name, field)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(f"{field}{name}", f"must be an integer, not {value!r}")
        if value < low:
            raise self.fail(f"{field}{name}", f"must be >= {low}, not {value}")
        return value

    def text(self, doc: dict[str, Any], name: str, field: str = "") -> str:
        value = self.get(doc, name, field)
        if not isinstance(value, str) or not value:
            raise self.fail(f"{field}{name}", f"must be a non-empty string, not {value!r}")
        return value

    def sha(self, doc: dict[str, Any], name: str, field: str) -> str:
        value = self.text(doc, name, field)
        if not _SHA256.fullmatch(value):
            raise self.fail(f"{field}{name}", "must be 64 lower-case hex digits (a SHA-256)")
        return value


def decode(data: bytes, where: str) -> Manifest:
    """The manifest in ``data``; ``where`` (the object's URL) names it in errors."""
    r = _Reader(where)
    try:
        doc = r.obj(json.loads(data.decode("utf-8")), "the manifest")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{where}: not JSON: {exc}") from exc
    fmt = r.integer(doc, "format")
    if fmt != FORMAT:
        raise r.fail("format", f"{fmt} is not a format this version reads ({FORMAT})")
    size = r.integer(doc, "segmentSize", low=1)
    segments: list[TierSegment] = []
    raw_segments = r.get(doc, "segments", "")
    if not isinstance(raw_segments, list):
        raise r.fail("segments", "must be a JSON array")
    for k, raw in enumerate(raw_segments):
        at = f"segments[{k}]."
        s = r.obj(raw, at[:-1])
        index = r.obj(r.get(s, "index", at), f"{at}index")
        seg = TierSegment(
            base=r.integer(s, "base", at),
            length=r.integer(s, "length", at, low=1),
            sha256=r.sha(s, "sha256", at),
            records=r.integer(s, "records", at),
            min_store_timestamp=r.integer(s, "minStoreTimestamp", at),
            max_store_timestamp=r.integer(s, "maxStoreTimestamp", at),
            index=IndexObject(
                r.integer(index, "length", f"{at}index.", low=1),
                r.sha(index, "sha256", f"{at}index."),
            ),
            uploaded_at=r.integer(s, "uploadedAt", at),
        )
        if seg.base % size:
            raise r.fail(f"{at}base", f"{seg.base} is not a multiple of segmentSize {size}")
        if seg.length > size:
            raise r.fail(f"{at}length", f"{seg.length} is more than segmentSize {size}")
        if segments and seg.base != segments[-1].base + size:
            raise r.fail(
                f"{at}base",
                f"{seg.base} does not follow segment {segments[-1].base} (segments must be "
                "contiguous)",
            )
        if seg.min_store_timestamp > seg.max_store_timestamp:
            raise r.fail(f"{at}minStoreTimestamp", "is after maxStoreTimestamp")
        segments.append(seg)
    queues: dict[str, dict[str, int]] = {}
    for topic, raw_q in r.obj(r.get(doc, "queues", ""), "queues").items():
        q = r.obj(raw_q, f"queues.{topic}")
        queues[topic] = {qid: r.integer(q, qid, f"queues.{topic}.") for qid in q}
        if not all(qid.isdigit() for qid in q):
            raise r.fail(f"queues.{topic}", "queue ids must be decimal digits")
    deleted = r.obj(r.get(doc, "deleted", ""), "deleted")
    below = r.integer(deleted, "below", "deleted.")
    if segments and below > segments[0].base:
        raise r.fail("deleted.below", f"{below} is past the first segment {segments[0].base}")
    return Manifest(
        store_id=r.text(doc, "storeId"),
        broker=r.text(doc, "broker"),
        segment_size=size,
        generation=r.integer(doc, "generation", low=1),
        segments=tuple(segments),
        queues=queues,
        deleted_below=below,
    )


# -- the object in the bucket ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Commit:
    """What :meth:`ManifestStore.commit` did: the manifest now (None: there is none and the
    update made none), its ETag, whether this call wrote it, and how many reads it took."""

    manifest: Manifest | None
    etag: str
    wrote: bool
    attempts: int


def read_manifest(objects: ObjectStore, prefix: str) -> tuple[Manifest, str] | None:
    """The manifest under ``prefix`` and its ETag, whoever owns it (one GET); None when there
    is none yet."""
    key = manifest_key(prefix)
    try:
        body, etag = objects.get(key)
    except ObjectNotFoundError:
        return None
    return decode(body, objects.target.url(key)), etag


class ManifestStore:
    """The manifest of the store ``store_id`` under ``prefix`` (``<objectStorePrefix>
    <brokerName>/``) in ``objects``' bucket."""

    def __init__(self, objects: ObjectStore, prefix: str, store_id: str) -> None:
        self.objects = objects
        self.prefix = prefix
        self.store_id = store_id
        self.key = manifest_key(prefix)

    @property
    def where(self) -> str:
        return self.objects.target.url(self.key)

    def load(self) -> tuple[Manifest, str] | None:
        """The manifest and its ETag; None when there is none yet. Another store's is
        :class:`ManifestOwnerError`."""
        loaded = read_manifest(self.objects, self.prefix)
        if loaded is not None:
            self._own(loaded[0])
        return loaded

    def _own(self, m: Manifest) -> None:
        if m.store_id != self.store_id:
            raise ManifestOwnerError(
                f"{self.where}: the prefix {self.prefix!r} of bucket {self.objects.bucket!r} "
                f"belongs to store {m.store_id} (broker {m.broker}), not to this store "
                f"{self.store_id}: two stores never share a prefix; give this one another "
                "brokerName or objectStorePrefix",
                self.objects.bucket,
                self.key,
            )

    def commit(self, update: Callable[[Manifest | None], Manifest | None]) -> Commit:
        """Apply ``update`` to the manifest (None when there is none) and write what it
        returns (None: nothing to change) as the next generation, conditionally; after a lost
        race, read again and apply it again (see the module docstring)."""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            current = self.load()
            before, etag = current if current is not None else (None, "")
            after = update(before)
            if after is None or after == before:
                return Commit(before, etag, False, attempt)
            self._own(after)
            after = dataclasses.replace(
                after, generation=(before.generation if before is not None else 0) + 1
            )
            body = encode(after)
            try:
                if before is None:
                    etag = self.objects.put(self.key, body, if_none_match=True)
                else:
                    etag = self.objects.put(self.key, body, if_match=etag)
            except PreconditionFailedError:
                continue  # another writer changed it since the read: read again
            return Commit(after, etag, True, attempt)
        raise ManifestError(
            f"{self.where}: lost the conditional write {MAX_ATTEMPTS} times in a row (other "
            "writers change the manifest without pause?)"
        )
