"""How far a streaming query reading ``format("rocketstore")`` is behind, from Spark's own
progress (``StreamingQueryProgress``), in the Kafka source's terms.

The Kafka source puts ``avgOffsetsBehindLatest``, ``maxOffsetsBehindLatest`` and
``minOffsetsBehindLatest`` in its entry's ``metrics`` map. Spark (4.3) gives a Python data
source no way to fill that map: its stream wrappers implement ``SupportsAdmissionControl``
(``reportLatestOffset``) but not ``ReportsSourceMetrics`` (docs/monitoring.md). What it does
report is the source's ``latestOffset`` (:meth:`RocketStoreStreamReader.reportLatestOffset`:
the queues' max offsets when the batch was planned) beside the batch's ``endOffset``, and
:func:`offsets_behind_latest` computes the same three figures from them, in the driver (a
``StreamingQueryListener``, or from ``query.lastProgress``).

Pure functions; thread-safe.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rocketstore.pipeline.errors import StoreError
from rocketstore.source import offsets


def _offsets(value: Any, what: str) -> offsets.Offsets:
    """An offset of a progress entry: a dict (``lastProgress``) or its JSON text (a listener's
    ``SourceProgress``)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise StoreError(f"{what}: not JSON: {value[:80]!r}") from None
    return offsets.from_json(value, what)


def offsets_behind_latest(source: Mapping[str, Any]) -> dict[str, float] | None:
    """``avgOffsetsBehindLatest``, ``maxOffsetsBehindLatest`` and ``minOffsetsBehindLatest``
    of one entry of a progress' ``sources``: per queue the batch's end offset has, its
    ``latestOffset`` minus its ``endOffset`` (messages the query has still to read, as the
    batch was planned). A queue the end offset does not have yet (created since) is left out,
    as the Kafka source leaves out partitions it has not consumed.

    ``None`` when the entry has no ``latestOffset`` (no batch planned yet, or Spark before
    4.2); :class:`StoreError` when an offset is not a rocketstore source's."""
    latest, end = source.get("latestOffset"), source.get("endOffset")
    if latest is None or end is None:
        return None
    latest_at = _offsets(latest, "latestOffset")
    end_at = _offsets(end, "endOffset")
    behind = [latest_at[q] - at for q, at in end_at.items() if q in latest_at]
    if not behind:
        return None
    return {
        "avgOffsetsBehindLatest": sum(behind) / len(behind),
        "maxOffsetsBehindLatest": float(max(behind)),
        "minOffsetsBehindLatest": float(min(behind)),
    }
