"""A plain in-memory object store (the read side's ``ObjectStore``: get, ranged get, head,
list), and a tier put into one straight from a store's sealed segments, for the read side's
unit and property tests. The proof against a real S3 is the radosgw round trip; this model
only stands in where a test needs many stores quickly or must count and break requests.

``MemoryObjects`` answers as S3 does where the read side relies on it: a missing key is an
error naming it (a ``NotFoundError``), a range that starts past the object's end is refused
and one that ends past it is short, a listing is sorted by key. ``gets`` counts the requests, so that tests see what a read costs.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import NotFoundError, StoreError
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.format.segmentindex import SegmentIndex, build_segment_index
from rocketstore.pipeline.tier import manifest
from tests.kit.model import Stored, StoreModel, java_hash

TMP_BASE = "/dev/shm" if Path("/dev/shm").is_dir() else None
START = 1_700_000_000_000
ROLLBACK = 0xC


class MemoryObjects:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.gets = 0
        self.bytes_read = 0
        self.commitlog_bytes_read = 0  # of B/commitlog/ objects alone

    def put(self, key: str, data: bytes) -> str:
        self.objects[key] = bytes(data)
        return hashlib.md5(data).hexdigest()

    def _object(self, key: str) -> bytes:
        try:
            return self.objects[key]
        except KeyError:
            raise NotFoundError(f"memory://{key}: no such object") from None

    def get(self, key: str) -> tuple[bytes, str]:
        data = self._object(key)
        self.gets += 1
        self.bytes_read += len(data)
        return data, hashlib.md5(data).hexdigest()

    def get_range(self, key: str, start: int, end: int) -> bytes:
        data = self._object(key)
        if not 0 <= start < min(end, len(data)):
            raise StoreError(f"memory://{key}: range [{start}, {end}) of {len(data)} bytes")
        self.gets += 1
        self.bytes_read += min(end, len(data)) - start
        if "/commitlog/" in key:
            self.commitlog_bytes_read += min(end, len(data)) - start
        return data[start:end]  # past the end: short, as S3 answers a range it holds part of

    def head(self, key: str) -> tuple[int, str] | None:
        data = self.objects.get(key)
        return None if data is None else (len(data), hashlib.md5(data).hexdigest())

    def list(self, prefix: str) -> list[tuple[str, int]]:
        return sorted((k, len(v)) for k, v in self.objects.items() if k.startswith(prefix))


class Written:
    """A store written through the store's writer, and the model of what it holds."""

    def __init__(self, path: Path, segment: int) -> None:
        self.path = path
        self.segment = segment
        self.model = StoreModel(
            segment_size=segment,
            cq_file_size=140,
            store_ip="127.0.0.1",
            store_port=10911,
            max_msgs_num_batch=64,
        )

    def segments(self) -> list[tuple[int, bytes]]:
        return segment_files(self.path)

    def held(self, base: int) -> list[Stored]:
        return [
            s for s in self.model.messages if base <= s.ext.commit_log_offset < base + self.segment
        ]


@contextmanager
def written(batches: list[tuple[list[Message], int]], segment: int) -> Iterator[Written]:
    """A store of ``segment``-byte CommitLog segments written with ``batches`` (each put
    ``step`` ms after the one before, on the store's injected clock), closed, with its model."""
    with tempfile.TemporaryDirectory(prefix="tier-", dir=TMP_BASE) as tmp:
        w = Written(Path(tmp) / "store", segment)
        now = START
        config = StoreConfig(mapped_file_size_commitlog=segment, max_message_size=4096)  # type: ignore[call-arg]
        with MessageStore(w.path, config, clock_ms=lambda: now) as store:
            for batch, step in batches:
                now += step
                results = list(store.put_batch(batch).results())
                w.model.put_batch(batch, now, [r.uniq_key for r in results])
        yield w


def key_hash(topic: str, key: str) -> int:
    """The IndexFile hash of ``topic#key``, from the model's own Java hash."""
    h = java_hash(f"{topic}#{key}")
    return 0 if h == -(2**31) else abs(h)


def expected_rows(held: list[Stored]) -> dict[tuple[str, int], list[tuple[int, int, int, int]]]:
    """(offset, size, tags code, store time) of each queue's units among ``held``."""
    rows: dict[tuple[str, int], list[tuple[int, int, int, int]]] = {}
    for s in held:
        if s.consumable:
            e = s.ext
            unit = (
                e.commit_log_offset,
                e.store_size,
                java_hash(e.tags) if e.tags else 0,
                e.store_timestamp,
            )
            rows.setdefault((e.topic, e.queue_id), []).append(unit)
    return rows


def expected_keys(held: list[Stored]) -> set[tuple[int, int]]:
    """(key hash, CommitLog offset) of every key entry ``held`` should give."""
    keys = set()
    for s in held:
        if s.tx == ROLLBACK:
            continue
        names = set(s.tokens)
        if s.ext.uniq_key is not None:
            names.add(s.ext.uniq_key)
        keys |= {(key_hash(s.ext.topic, k), s.ext.commit_log_offset) for k in names}
    return keys


def segment_files(store: Path) -> list[tuple[int, bytes]]:
    """(base, bytes) of every CommitLog segment of the store directory, in order."""
    files = sorted((store / "commitlog").iterdir())
    return [(int(f.name), f.read_bytes()) for f in files if f.name.isdigit()]


def upload_sealed(
    objects: MemoryObjects, prefix: str, store: Path, segment_size: int, *, first: int = 0
) -> list[tuple[int, bytes]]:
    """Put every sealed segment of ``store`` (all but the last) from the ``first``-th on, its
    index and a manifest naming them, as docs/tiering.md lays them out; returns (base,
    object bytes) of what was put."""
    put: list[tuple[int, bytes]] = []
    entries = []
    for base, raw in segment_files(store)[first:-1]:
        index = build_segment_index(raw, base, len(raw))
        parsed = SegmentIndex.parse(index, where="upload")
        data = raw[: parsed.data_end]
        objects.put(manifest.segment_key(prefix, base), data)
        objects.put(manifest.index_key(prefix, base), index)
        entries.append(
            manifest.TierSegment(
                base=base,
                length=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
                records=parsed.records,
                min_store_timestamp=parsed.min_store_timestamp,
                max_store_timestamp=parsed.max_store_timestamp,
                index=manifest.IndexObject(len(index), hashlib.sha256(index).hexdigest()),
                uploaded_at=0,
            )
        )
        put.append((base, data))
    write_manifest(objects, prefix, segment_size, entries)
    return put


def write_manifest(
    objects: MemoryObjects,
    prefix: str,
    segment_size: int,
    entries: list[manifest.TierSegment],
    *,
    deleted_below: int = 0,
    generation: int = 1,
) -> None:
    """Put the manifest naming ``entries`` (the tier's own codec writes it)."""
    doc = manifest.Manifest(
        store_id="test",
        broker=prefix.rstrip("/") or "broker",
        segment_size=segment_size,
        generation=generation,
        segments=tuple(entries),
        deleted_below=deleted_below,
    )
    objects.put(manifest.manifest_key(prefix), manifest.encode(doc))
