"""The Spark source's look at the tier (docs/tiering.md#reading-the-tier): each broker's sealed
segments in the bucket as the planner needs them, a store root that is only a bucket, and the
executors' clients.

* :class:`TierView` is one broker's tier on the driver: its manifest, read again when the
  planner asks after more than :data:`MANIFEST_MAX_AGE_MS` (a streaming query asks for its
  latest offsets every few milliseconds while idle, and the manifest changes once a segment:
  one GET a second bounds both the cost and the delay it adds); each queue's offsets in the
  tier, worked out once per manifest generation; the offset of a store time.
* :class:`BucketRoot` is ``path=s3://bucket/prefix/``: a root whose brokers are the folders
  under the prefix (``<objectStorePrefix><brokerName>/``, as the uploader writes them), or one
  broker when the prefix itself holds a ``manifest.json``. Its topics are those the manifests
  name; their body formats and schemas are in the root's catalog beside the brokers
  (:func:`bucket_catalog`).
* :func:`tier_segments` gives an executor the :class:`RemoteSegments` of a partition's broker,
  over one client per process and settings (a client costs ~0.4 s to make; Spark reuses its
  Python workers from task to task).

Owns: the manifests and index heads it read (memory only). Thread-safety: a view or root is
used from one thread (the planner's); the clients :func:`tier_segments` shares are boto3's,
which are thread-safe. Crash behaviour: reads only. Requires: the tier's settings in the
reader's :class:`StoreConfig` (the bucket, the endpoint; credentials from the AWS chain).
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from rocketstore.pipeline.config import TIER_NOT_IN_DISK, StoreConfig
from rocketstore.pipeline.errors import ConfigError
from rocketstore.pipeline.files.topicmeta import SCHEMAS_DIR
from rocketstore.pipeline.tier.catalog import BucketCatalog
from rocketstore.pipeline.tier.manifest import manifest_key
from rocketstore.pipeline.tier.objects import ObjectStore, shared_store
from rocketstore.pipeline.tier.remote import RemoteQueue, RemoteSegments
from rocketstore.source.brokerview import QueueBounds

MANIFEST_MAX_AGE_MS = 1000
BUCKET_SCHEMES = ("s3", "s3a")


def parse_bucket_path(path: str) -> tuple[str, str] | None:
    """``(bucket, prefix)`` of ``s3://bucket/prefix/`` (or ``s3a://``), the prefix empty or
    ending with ``/``; None for a path that is not a bucket's."""
    parts = urlsplit(path)
    if parts.scheme.lower() not in BUCKET_SCHEMES:
        return None
    if not parts.netloc:
        raise ConfigError(
            f"option path={path!r}: no bucket; expected s3://BUCKET/ or s3://BUCKET/PREFIX/"
        )
    prefix = parts.path.lstrip("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return parts.netloc, prefix


def bucket_config(config: StoreConfig, bucket: str) -> StoreConfig:
    """``config`` reading the tier in ``bucket`` (whatever its own tier settings say)."""
    return config.with_overrides(
        {"tieredStorageLevel": TIER_NOT_IN_DISK, "objectStoreBucket": bucket}
    )


class TierView:
    """One broker's tier, for the planner (see the module docstring)."""

    def __init__(
        self,
        name: str,
        segments: RemoteSegments,
        clock_ms: Callable[[], int],
        max_age_ms: int = MANIFEST_MAX_AGE_MS,
    ) -> None:
        self.name = name
        self.segments = segments
        self.clock_ms = clock_ms
        self.max_age_ms = max_age_ms
        self._read_at: int | None = None
        self._bounds: dict[str, tuple[int, dict[int, QueueBounds]]] = {}

    @property
    def prefix(self) -> str:
        return self.segments.prefix

    @property
    def location(self) -> str:
        """Where the broker's objects are (``s3://bucket/<prefix>``), for a broker with no
        directory here."""
        return self.segments.location.removesuffix("commitlog")

    def refresh(self) -> None:
        """Read the manifest again if the one held is older than ``max_age_ms``."""
        now = self.clock_ms()
        if self._read_at is None or now - self._read_at >= self.max_age_ms:
            self.segments.relist()
            self._read_at = now

    def topics(self) -> set[str]:
        return set(self.segments.manifest.queues)

    def bounds(self, topic: str) -> dict[int, QueueBounds]:
        """``[first, next)`` of each queue of ``topic`` the tier holds: the next offset is the
        manifest's, the first is found through the index heads (fetched once each)."""
        manifest = self.segments.manifest
        kept = self._bounds.get(topic)
        if kept is not None and kept[0] == manifest.generation:
            return kept[1]
        out: dict[int, QueueBounds] = {}
        for qid_text, end in manifest.queues.get(topic, {}).items():
            first = RemoteQueue(self.segments, topic, int(qid_text)).min_offset()
            if first is not None:  # else the tier's retention removed all of it
                out[int(qid_text)] = QueueBounds(first, end)
        self._bounds[topic] = (manifest.generation, out)
        return out

    def pieces(self, topic: str, queue_id: int, a: int, b: int) -> list[tuple[int, int, int]]:
        """``[a, b)`` of the queue cut at the tier's segments: ``(segment base, from, to)``
        each, from the segments' rows (their index heads, fetched once each)."""
        out: list[tuple[int, int, int]] = []
        for entry in self.segments.entries:
            row = self.segments.index(entry.base).row(topic, queue_id)
            if row is None or row.end <= a:
                continue
            if row.first >= b:
                break
            out.append((entry.base, max(a, row.first), min(b, row.end)))
        return out

    def offset_for_time(self, topic: str, queue_id: int, timestamp: int) -> int | None:
        """The first offset of the queue in the tier stored at or after ``timestamp``, one
        past the tier's last when none is; None when the tier holds none of the queue."""
        return RemoteQueue(self.segments, topic, queue_id).offset_by_time(timestamp)


class BucketRoot:
    """A store root that is only a bucket (see the module docstring). Made on the driver: the
    bucket is asked for once, so that wrong credentials or a missing bucket fail at once,
    naming the setting."""

    def __init__(self, path: str, config: StoreConfig) -> None:
        parsed = parse_bucket_path(path)
        if parsed is None:
            raise ConfigError(f"option path={path!r}: not an s3:// path")
        bucket, self.prefix = parsed
        self.path = path
        self.config = bucket_config(config, bucket)
        self.objects = shared_store(self.config)
        self.single = self.objects.head(manifest_key(self.prefix)) is not None

    @property
    def catalog_prefix(self) -> str:
        """Where the root's topic catalog is (:mod:`rocketstore.pipeline.tier.catalog`): the
        prefix, or for one broker's prefix the one above it."""
        if not self.single:
            return self.prefix
        parent = self.prefix.rstrip("/").rpartition("/")[0]
        return f"{parent}/" if parent else ""

    @property
    def catalog_url(self) -> str:
        return self.objects.target.url(self.catalog_prefix)

    def brokers(self) -> list[tuple[str, str]]:
        """``(brokerName, its prefix)`` of every broker under the prefix, in name order."""
        if self.single:
            name = self.prefix.rstrip("/").rsplit("/", 1)[-1] or self.objects.bucket
            return [(name, self.prefix)]
        schemas = f"{self.prefix}{SCHEMAS_DIR}/"  # the catalog's, not a broker's
        return [
            (d[len(self.prefix) : -1], d)
            for d in self.objects.list_dirs(self.prefix)
            if d != schemas
        ]

    def segments(self, prefix: str) -> RemoteSegments:
        return RemoteSegments(self.objects, prefix, name=self.objects.target.url())

    def topics(self) -> set[str]:
        found: set[str] = set()
        for _, prefix in self.brokers():
            found.update(self.segments(prefix).manifest.queues)
        return found


def objects_for(config: StoreConfig) -> ObjectStore:
    """This process's client for the bucket ``config`` names (without the open check: the
    driver made it when the query started)."""
    return shared_store(config, check=False)


def bucket_catalog(url: str, config: StoreConfig) -> BucketCatalog:
    """The topic catalog at ``url`` (``s3://bucket/prefix/``), read through this process's
    client."""
    parsed = parse_bucket_path(url)
    assert parsed is not None, url
    objects = objects_for(config)
    return BucketCatalog(objects, parsed[1], objects.target.url())


def tier_segments(config: StoreConfig, prefix: str) -> RemoteSegments:
    """The tier of the broker whose objects are under ``prefix``, for one partition's read."""
    objects = objects_for(config)
    return RemoteSegments(objects, prefix, name=objects.target.url())
