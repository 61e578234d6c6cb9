"""``config/rocketstore.json``: how far the CommitLog is known flushed and dispatched.

RocketMQ's ``checkpoint`` records timestamps only, so after a crash RocketMQ re-scans whole
CommitLog segments (up to a GiB each) from the one older than the checkpoint. rocketstore also
records, after every flush, the exact offset up to which the CommitLog, the ConsumeQueues and
the index are on disk, so recovery after a crash re-scans only what was written since::

    {"version": 1, "flushedOffset": N, "lastRecordOffset": M, "storeTimestamp": T,
     "queues": {"<topic>/<queueId>": maxOffset, ...},
     "notes": {"<name>": [int, ...], ...}, "checksum": C}

``flushedOffset`` is the end of the last flushed record (which starts at ``lastRecordOffset``);
every record before it has its ConsumeQueue units and index entries flushed too, and
``queues`` lists every ConsumeQueue with its length then, so a queue deleted or cut short
later is noticed and rebuilt. ``notes`` (absent when empty) are small facts a writer on top
of the store keeps with the data they describe, made durable by the same flush: the sink's
search bounds (:mod:`rocketstore.sink.append`). ``checksum`` is
the CRC-32 of the other fields, so a damaged file is ignored rather than trusted. The file is
written to a temporary name, fsynced and renamed over the old one: it is either the old or the
new version, never torn. RocketMQ ignores files it does not know in ``config/``, and if this
file is missing or does not match the log, recovery falls back to RocketMQ's own rule.

Not thread-safe; written by the store's flush under the store's lock.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from pathlib import Path

from rocketstore.pipeline.files import durability

FILE_NAME = "rocketstore.json"
VERSION = 1


@dataclasses.dataclass(frozen=True)
class FlushProgress:
    flushed_offset: int
    last_record_offset: int
    store_timestamp: int
    queues: dict[str, int] = dataclasses.field(default_factory=dict)
    notes: dict[str, list[int]] = dataclasses.field(default_factory=dict)

    def _fields(self) -> dict[str, object]:
        fields: dict[str, object] = {
            "version": VERSION,
            "flushedOffset": self.flushed_offset,
            "lastRecordOffset": self.last_record_offset,
            "storeTimestamp": self.store_timestamp,
            "queues": self.queues,
        }
        if self.notes:
            # Left out when empty, so files written before notes existed keep their checksum.
            fields["notes"] = self.notes
        return fields

    @staticmethod
    def _checksum(fields: dict[str, object]) -> int:
        return zlib.crc32(json.dumps(fields, sort_keys=True).encode()) & 0xFFFFFFFF

    @classmethod
    def read(cls, config_dir: Path) -> FlushProgress | None:
        """The recorded progress, or None if the file is missing, unreadable or damaged."""
        try:
            data = json.loads((config_dir / FILE_NAME).read_text(encoding="utf-8"))
            fields: dict[str, object] = {
                k: int(data[k])
                for k in ("version", "flushedOffset", "lastRecordOffset", "storeTimestamp")
            }
            queues = {str(k): int(v) for k, v in dict(data.get("queues", {})).items()}
            fields["queues"] = queues
            notes = {str(k): [int(x) for x in v] for k, v in dict(data.get("notes", {})).items()}
            if notes:
                fields["notes"] = notes
            if fields["version"] != VERSION or cls._checksum(fields) != int(data["checksum"]):
                return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        return cls(
            int(data["flushedOffset"]),
            int(data["lastRecordOffset"]),
            int(data["storeTimestamp"]),
            queues,
            notes,
        )

    def write(self, config_dir: Path) -> None:
        # One encoding, in the form the checksum is taken of, with the checksum spliced in
        # before the closing brace: a store of 40,000 queues writes this at every flush, and
        # json's C encoder only serves output without indentation.
        canonical = json.dumps(self._fields(), sort_keys=True)
        checksum = zlib.crc32(canonical.encode()) & 0xFFFFFFFF
        payload = f'{canonical[:-1]}, "checksum": {checksum}}}\n'
        durability.write_file(config_dir / FILE_NAME, payload.encode())
