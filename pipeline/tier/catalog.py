"""The store root's topic catalog in the bucket: ``<objectStorePrefix>topics.json`` and
``<objectStorePrefix>schemas/<fingerprint>.json``, copies of the root's ``topics.json`` and
``schemas/`` (:mod:`rocketstore.pipeline.engine.root`), so that a reader with only the bucket
knows each topic's body format and decodes avro and json bodies as a reader of the root does
(docs/tiering.md#objects).

* :class:`CatalogPublisher` runs in the uploader of each broker of a root, before it uploads
  segments: ``topics.json`` is put when its bytes differ from the object's (a single PUT's ETag
  is the MD5 of its bytes), each schema the bucket lacks is put (a schema file never changes:
  its name is its fingerprint). A schema is registered in the root before any message that
  names it is written, so a segment uploaded after the catalog never names a schema the bucket
  lacks. A store directory outside a root (no ``topics.json`` beside it) has no catalog. It
  remembers what the bucket holds after its first run, so that the runs of an uploader that
  follows the store (one every few seconds) ask the bucket nothing while the root's catalog
  stays as it was: a LIST and a HEAD a run saved.
* :class:`BucketCatalog` reads it: :meth:`~BucketCatalog.topic` and
  :meth:`~BucketCatalog.load_schema`, as :class:`StoreRoot` answers them.

Owns: the catalog objects. Thread-safety: a :class:`BucketCatalog` reads the topics once and
keeps them; use one per thread or per query. Crash behaviour: each object is one PUT (whole or
absent); a run killed half-way puts the rest next time. Requires: the uploaders of one root
share ``objectStorePrefix`` (they put the same bytes).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Protocol

from rocketstore.pipeline.errors import NotAStoreError, NotFoundError
from rocketstore.pipeline.files.topicmeta import (
    SCHEMAS_DIR,
    TOPICS_FILE,
    TopicMeta,
    parse_topics_file,
)
from rocketstore.pipeline.tier.objects import ObjectStore


class CatalogReads(Protocol):
    def get(self, key: str) -> tuple[bytes, str]: ...


def root_of(store: Path) -> Path | None:
    """The store root a broker directory belongs to (its parent, with ``topics.json``)."""
    parent = store.resolve().parent
    return parent if (parent / TOPICS_FILE).is_file() else None


def topics_key(prefix: str) -> str:
    return f"{prefix}{TOPICS_FILE}"


def schema_key(prefix: str, fingerprint: str) -> str:
    return f"{prefix}{SCHEMAS_DIR}/{fingerprint}.json"


class CatalogPublisher:
    """Puts the root's catalog of ``store`` under ``prefix`` (``objectStorePrefix``) where the
    bucket's differs (see the module docstring). The first :meth:`publish` looks at the bucket;
    later ones only at what changed in the root since (new schema files, other bytes of
    ``topics.json``). Someone deleting the catalog's objects behind its back is seen by the
    next uploader process, not by this one."""

    def __init__(self, objects: ObjectStore, store: Path, prefix: str) -> None:
        self.objects = objects
        self.root = root_of(store)
        self.prefix = prefix
        self._schemas: set[str] | None = None  # keys the bucket holds, once listed
        self._topics_md5: str | None = None  # of the topics.json the bucket holds

    def publish(self) -> int:
        """Put what the bucket lacks or holds otherwise; returns the objects put."""
        root = self.root
        if root is None:
            return 0
        put = 0
        schemas = root / SCHEMAS_DIR
        if schemas.is_dir():
            if self._schemas is None:
                self._schemas = {k for k, _ in self.objects.list(f"{self.prefix}{SCHEMAS_DIR}/")}
            for path in sorted(schemas.glob("*.json")):
                key = schema_key(self.prefix, path.stem)
                if key not in self._schemas:
                    self.objects.put(key, path.read_bytes())
                    self._schemas.add(key)
                    put += 1
        raw = (root / TOPICS_FILE).read_bytes()
        md5 = hashlib.md5(raw).hexdigest()
        if md5 == self._topics_md5:
            return put
        # Never publish a file readers would refuse.
        parse_topics_file(raw, str(root / TOPICS_FILE))
        key = topics_key(self.prefix)
        got = self.objects.head(key) if self._topics_md5 is None else None
        if got is None or got[1] != md5:
            self.objects.put(key, raw)
            put += 1
        self._topics_md5 = md5
        return put


class BucketCatalog:
    """The catalog under ``prefix`` of a bucket (see the module docstring); empty when the
    bucket holds none (a store directory outside a root: its bodies read as binary)."""

    def __init__(self, objects: CatalogReads, prefix: str, where: str) -> None:
        self.objects = objects
        self.prefix = prefix
        self.where = where
        self._topics: dict[str, TopicMeta] | None = None

    def topics(self) -> dict[str, TopicMeta]:
        if self._topics is None:
            key = topics_key(self.prefix)
            try:
                raw, _ = self.objects.get(key)
            except NotFoundError:
                self._topics = {}
            else:
                self._topics = parse_topics_file(raw, f"{self.where}{key}")
        return self._topics

    def topic(self, name: str) -> TopicMeta | None:
        return self.topics().get(name)

    def load_schema(self, fingerprint: str) -> dict[str, Any]:
        key = schema_key(self.prefix, fingerprint)
        try:
            raw, _ = self.objects.get(key)
        except NotFoundError:
            raise NotAStoreError(
                f"{self.where}{key}: body schema {fingerprint} is referenced by messages but "
                "not in the bucket's catalog"
            ) from None
        found: dict[str, Any] = json.loads(raw)
        return found
