"""``config/rocketstore-tier.json``: the store's own record of its tier.

::

    {"version": 1, "storeId": "<32 hex digits>", "uploadedEnd": N,
     "bucketSegments": S, "bucketBytes": B, "lastUploadMs": T,
     "uploadErrors": E, "lastErrorMs": T2}

``storeId`` is the store's identity in its bucket, made at the first upload and fixed from
then on: the manifest names it, and a manifest naming another is refused (two stores never
share a prefix). ``uploadedEnd`` is the CommitLog offset below which every segment is in the
bucket and named by the manifest; local retention deletes a CommitLog segment only below it
(:func:`uploaded_end`, read again at every retention round). It only ever grows, and it is
written after the manifest commit that makes it true, so it never claims more than the bucket
holds; a crash between the two leaves it behind the manifest, which the next upload reads and
catches up with.

The other fields are for monitoring (the metrics and the console read them instead of asking
the bucket at every scrape): ``bucketSegments`` and ``bucketBytes`` are what the manifest the
uploader last read or committed names (segments; their objects' and indexes' bytes),
``lastUploadMs`` when it last committed a segment, ``uploadErrors`` how many of its runs have
failed, ever (a counter: it only grows), and ``lastErrorMs`` when the last one did. A record
written before they existed has none of them: each reads as 0.

Written whole: to a temporary name, fsynced, renamed over the old file, the directory fsynced
(:func:`rocketstore.pipeline.files.durability.write_file`), so a crash leaves the old or the
new version. RocketMQ ignores files it does not know in ``config/``.

Owns: that file. Thread-safety: one uploader writes it (the manifest's conditional writes keep
two uploaders from both advancing the tier; each writes the end the manifest says); any
thread may read it. Crash behaviour: above. Requires: the store's ``config/`` directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from pathlib import Path

from rocketstore.pipeline.errors import TierError
from rocketstore.pipeline.files import durability

FILE_NAME = "rocketstore-tier.json"
VERSION = 1


# The monitoring fields: JSON name -> TierState attribute (each an integer >= 0, 0 when absent).
COUNTERS = {
    "bucketSegments": "bucket_segments",
    "bucketBytes": "bucket_bytes",
    "lastUploadMs": "last_upload_ms",
    "uploadErrors": "upload_errors",
    "lastErrorMs": "last_error_ms",
}


@dataclasses.dataclass(frozen=True)
class TierState:
    store_id: str
    uploaded_end: int = 0
    bucket_segments: int = 0
    bucket_bytes: int = 0
    last_upload_ms: int = 0
    upload_errors: int = 0
    last_error_ms: int = 0

    @staticmethod
    def new() -> TierState:
        return TierState(uuid.uuid4().hex, 0)


def path_of(store: Path) -> Path:
    return store / "config" / FILE_NAME


def read(store: Path) -> TierState | None:
    """The store's tier record, None when it has none (never uploaded). A file that is not
    one is a :class:`TierError` naming it: its ``storeId`` is the store's identity in the
    bucket and must not silently be replaced by a new one."""
    path = path_of(store)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TierError(f"{path}: cannot read the store's tier record: {exc.strerror}") from exc
    try:
        doc = json.loads(raw)
        if doc["version"] != VERSION:
            raise ValueError(f"version {doc['version']} is not {VERSION}")
        store_id = doc["storeId"]
        if not isinstance(store_id, str) or not store_id:
            raise ValueError("storeId must be a non-empty string")
        end = _count(doc, "uploadedEnd", required=True)
        counters = {attr: _count(doc, name) for name, attr in COUNTERS.items()}
    except (ValueError, KeyError, TypeError) as exc:
        raise TierError(
            f"{path}: not a tier record ({exc}); restore it from a backup (its storeId is "
            "the one the bucket's manifest names)"
        ) from exc
    return TierState(store_id, end, **counters)


def _count(doc: dict[str, object], name: str, *, required: bool = False) -> int:
    """The integer field ``name`` (>= 0); absent: a KeyError when ``required``, else 0."""
    if name not in doc and not required:
        return 0
    value = doc[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, not {value!r}")
    return value


def write(store: Path, state: TierState) -> None:
    """Replace the record with ``state``, whole (see the module docstring)."""
    path = path_of(store)
    doc: dict[str, object] = {
        "version": VERSION,
        "storeId": state.store_id,
        "uploadedEnd": state.uploaded_end,
    }
    doc.update({name: getattr(state, attr) for name, attr in COUNTERS.items()})
    body = json.dumps(doc)
    durability.make_dirs(path.parent)
    # A name of this process's own: a second uploader (refused later by the manifest) must
    # not tear this one's temporary file.
    durability.write_file(
        path, (body + "\n").encode(), path.with_name(f".{FILE_NAME}.{os.getpid()}")
    )


def uploaded_end(store: Path) -> int:
    """``uploadedEnd``, 0 when the store never uploaded or its record cannot be read (so
    local retention deletes nothing that is not known to be uploaded)."""
    try:
        state = read(store)
    except TierError:
        return 0
    return state.uploaded_end if state is not None else 0
