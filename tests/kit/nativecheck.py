"""Checks of the native core's one-pass re-dispatch walk against its record walk, shared by
the differential tests and the decoder's tests."""

from __future__ import annotations

import struct

from rocketstore.pipeline.format import native, record

UNIT = struct.Struct(">qiq")  # a ConsumeQueue unit: CommitLog offset, size, tags code


def check_dispatch_walk(
    data: bytes, start: int, base: int, *, check_crc: bool = True, end: int = 1 << 62
) -> None:
    """The one-pass dispatch walk stops where the walk stops (or at ``end``) and derives the
    units and index entries the walk's columns say dispatch writes, queue by queue in order of
    each queue's first record."""
    w = native.walk(data, start, len(data), base, check_crc=check_crc)
    n = int((w.phys < end).sum())
    d = native.dispatch_walk(data, start, len(data), base, end, check_crc=check_crc, index=True)
    assert d.count == n
    if n < len(w):
        assert (d.end, d.stop) == (int(w.phys[n]), native.STOP_END)
    else:
        assert (d.end, d.stop, d.reason) == (w.end, w.stop, w.reason)
    runs: dict[tuple[str, int], tuple[int, list[bytes]]] = {}
    last_unit_ts = -1
    for i in range(n):
        tx = int(w.sys_flags[i]) & record.TRANSACTION_MASK
        if tx in (record.TRANSACTION_NOT_TYPE, record.TRANSACTION_COMMIT_TYPE):
            key = (w.topics[int(w.topic_codes[i])], int(w.queue_ids[i]))
            units = runs.setdefault(key, (int(w.queue_offsets[i]), []))[1]
            units.append(UNIT.pack(int(w.phys[i]), int(w.sizes[i]), int(w.tags_codes[i])))
            last_unit_ts = int(w.store_ts[i])
    assert [(t, q, first, units.tobytes()) for t, q, first, units in d.runs] == [
        (t, q, first, b"".join(units)) for (t, q), (first, units) in runs.items()
    ]
    assert d.last_unit_ts == last_unit_ts
    entries = w.key_rows < n
    assert d.key_hashes.tolist() == w.key_hashes[entries].tolist()
    assert d.phys.tolist() == w.phys[w.key_rows[entries]].tolist()
    assert d.store_ts.tolist() == w.store_ts[w.key_rows[entries]].tolist()
