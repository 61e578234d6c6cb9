"""The tier's read side (pipeline/tier/remote.py) over an in-memory object store, against a
plain model.

* Property test: random messages are put by the store's writer into a store of small segments
  and into :class:`tests.kit.model.StoreModel`; the sealed segments, their indexes and a
  manifest are put into :class:`tests.kit.tiermodel.MemoryObjects` (from the ``first``-th
  segment on, so the tier may start past offset 0 as after the tier's retention). Then
  :class:`RemoteSegments` reads the same bytes as the local files (zeros past each object's
  end), and for every queue :class:`RemoteQueue` gives the model's first and next offset in
  the tier, its units over random ranges, and the model's answer to a time look-up; key
  look-ups give the model's messages, newest first.
* Read-ahead: a sequential decode of a segment costs a few GETs, not one per record.
* Errors: a segment the tier's retention removed is SegmentGoneError, one past the tier's end
  NotVisibleError, an object the manifest names but the bucket lacks (or shorter than it says)
  an error naming the key, a damaged index CorruptIndexError naming the key.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketstore.pipeline.errors import (
    CorruptIndexError,
    CorruptRecordError,
    NotVisibleError,
    SegmentGoneError,
)
from rocketstore.pipeline.files.segmentread import OpenSegments
from rocketstore.pipeline.format import native
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.format.segmentindex import SegmentIndex
from rocketstore.pipeline.tier import remote as remote_module
from rocketstore.pipeline.tier.remote import RemoteQueue, RemoteSegments
from tests.kit.model import Stored, java_hash
from tests.kit.strategies import messages
from tests.kit.tiermodel import MemoryObjects, Written, upload_sealed, write_manifest, written

PREFIX = "tier/broker-a/"


def in_tier(w: Written, tier_start: int, tier_end: int) -> list[Stored]:
    return [s for s in w.model.messages if tier_start <= s.ext.commit_log_offset < tier_end]


batches = st.lists(
    st.tuples(st.lists(messages(), min_size=1, max_size=12), st.integers(0, 5000)),
    min_size=1,
    max_size=16,
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=batches, segment=st.sampled_from([4096, 8192]), data=st.data())
def test_tier_reads_match_the_model(
    batches: list[tuple[list[Message], int]], segment: int, data: st.DataObject
) -> None:
    with written(batches, segment) as w:
        local = dict(w.segments())
        first = data.draw(st.integers(0, max(len(local) - 2, 0)))
        objects = MemoryObjects()
        put = upload_sealed(objects, PREFIX, w.path, segment, first=first)
        tier = RemoteSegments(objects, PREFIX, name="mem://", read_ahead=data.draw(
            st.sampled_from([64, 1000, 1 << 20])
        ))  # fmt: skip
        assert tier.listed() == [b for b, _ in put]
        assert tier.file_size() == segment
        if not put:
            assert tier.first() is None and tier.end() == 0
            return
        tier_start, tier_end = put[0][0], put[-1][0] + len(put[-1][1])
        assert tier.end() == tier_end

        # Bytes: as the local file has them, zeros past the object.
        for base, obj in put:
            seg = tier.open(base)
            assert seg.data_end() == len(obj) and seg.size == segment
            for _ in range(4):
                pos = data.draw(st.integers(0, segment - 1))
                n = data.draw(st.integers(0, segment - pos))
                want = local[base][pos : pos + n]
                if pos + n > len(obj):
                    want = obj[pos:] + bytes(pos + n - max(pos, len(obj)))
                assert seg.read(pos, n) == want
            assert bytes(seg.buffer) == obj
            seg.close()

        # Queues: the model's units of each queue whose records the tier holds.
        held = in_tier(w, tier_start, tier_end)
        for (topic, queue_id), stored in w.model.queues.items():
            mine = [s for s in stored if tier_start <= s.ext.commit_log_offset < tier_end]
            q = RemoteQueue(tier, topic, queue_id)
            if not mine:
                assert q.min_offset() is None and q.max_offset() is None
                assert q.offset_by_time(0) is None
                continue
            lo, hi = mine[0].ext.queue_offset, mine[-1].ext.queue_offset + 1
            assert (q.min_offset(), q.max_offset()) == (lo, hi)
            assert [s.ext.queue_offset for s in mine] == list(range(lo, hi))
            a = data.draw(st.integers(lo - 2, hi + 1))
            b = data.draw(st.integers(a, hi + 2))
            units = q.units(a, b)
            want = [
                (s.ext.commit_log_offset, s.ext.store_size, java_hash(s.ext.tags) if s.ext.tags
                 else 0, s.ext.store_timestamp)
                for s in mine
                if a <= s.ext.queue_offset < b
            ]  # fmt: skip
            assert [tuple(u) for u in units.tolist()] == want
            located = q.locate(data.draw(st.integers(lo, hi - 1)))
            assert located is not None
            times = [s.ext.store_timestamp for s in mine]
            t = data.draw(st.integers(times[0] - 1, times[-1] + 1))
            at = next((s.ext.queue_offset for s in mine if s.ext.store_timestamp >= t), hi)
            assert q.offset_by_time(t) == at

        # Keys: the model's messages, newest first (collisions checked away).
        keys = {(s.ext.topic, k) for s in held for k in (*s.tokens, s.ext.uniq_key) if k}
        probes = [*sorted(keys)[:6], ("TopicA", "no-such-key"), ("T-b", "Aa"), ("T-b", "BB")]
        for topic, key in probes:
            got = tier.query_key(topic, key, limit=1000)
            want_ext = [
                s.ext
                for s in reversed(held)
                if s.ext.topic == topic and s.tx != 0xC and key in (*s.tokens, s.ext.uniq_key)
            ]
            assert [m.commit_log_offset for m in got] == [m.commit_log_offset for m in want_ext]
            assert [m.body for m in got] == [m.body for m in want_ext]


Tier = tuple[Written, MemoryObjects, list[tuple[int, bytes]]]


@pytest.fixture
def tier() -> Iterator[Tier]:
    """A store of 4 KiB segments, 240 messages over 3 topics and 2 queues each, and its
    sealed segments put in an in-memory bucket: (store, bucket, (base, object) put)."""
    batch = [
        Message(f"T{i % 3}", bytes(60), queue_id=i % 2, keys=[f"k{i}", "shared"], tags="t")
        for i in range(40)
    ]
    with written([(batch, 1)] * 6, 4096) as w:
        objects = MemoryObjects()
        yield w, objects, upload_sealed(objects, PREFIX, w.path, 4096)


def test_sequential_decode_costs_a_few_gets(
    tier: Tier,
) -> None:
    """A partition read decoding a segment's records in order through ``read``: one GET per
    read-ahead window, not one per record; the records are the local file's."""
    _, objects, put = tier
    remote = RemoteSegments(objects, PREFIX, read_ahead=2048)
    base, obj = put[1]
    seg = remote.open(base)
    walked = native.walk(obj, 0, len(obj), base, check_crc=True)
    before = objects.gets
    for rel, size in zip((walked.phys - base).tolist(), walked.sizes.tolist(), strict=True):
        assert seg.read(rel, size) == obj[rel : rel + size]
    assert objects.gets - before <= len(obj) // 2048 + 2
    assert len(walked) > 3 * (objects.gets - before)
    opened = OpenSegments(remote, whole=True)
    got = native.decode(opened.get(base).buffer, walked.phys - base, base, path="x")
    assert got.column("commitLogOffset").to_pylist() == walked.phys.tolist()
    opened.close()


def test_gone_not_visible_missing_and_short_objects_say_so(
    tier: Tier,
) -> None:
    w, objects, put = tier
    segment = w.segment
    remote = RemoteSegments(objects, PREFIX, name="mem://")
    last = put[-1][0]
    with pytest.raises(NotVisibleError, match="not uploaded yet"):
        remote.open(last + segment)
    # The tier's retention removes the first segment: the manifest no longer names it.
    entries = list(remote.manifest.segments)
    seg0 = remote.open(put[0][0])
    write_manifest(objects, PREFIX, segment, entries[1:], deleted_below=put[1][0], generation=2)
    del objects.objects[f"{PREFIX}commitlog/{put[0][0]:020d}"]
    with pytest.raises(SegmentGoneError, match="removed by the tier's retention"):
        seg0.read(0, 100)
    with pytest.raises(SegmentGoneError, match="not in the tier"):
        remote.open(put[0][0])
    # An object the manifest names but the bucket lacks: damage, naming the key.
    key = f"{PREFIX}commitlog/{put[1][0]:020d}"
    saved = objects.objects.pop(key)
    with pytest.raises(CorruptRecordError, match=f"mem://{key} @ offset 0: named by the manifest"):
        remote.read(put[1][0], 0, 64)
    # One shorter than the manifest says.
    objects.objects[key] = saved[:-100]
    with pytest.raises(CorruptRecordError, match="shorter than its manifest says") as e:
        remote.open(put[1][0], whole=True)
    assert e.value.path == f"mem://{key}"


def test_damaged_index_names_the_object(
    tier: Tier,
) -> None:
    _, objects, put = tier
    key = f"{PREFIX}index/{put[0][0]:020d}"
    raw = bytearray(objects.objects[key])
    raw[70] ^= 1  # in the queue table: the head's CRC
    objects.objects[key] = bytes(raw)
    remote = RemoteSegments(objects, PREFIX, name="mem://")
    with pytest.raises(CorruptIndexError, match=f"^mem://{key} @ offset 60: head CRC") as e:
        RemoteQueue(remote, "T0", 0).min_offset()
    assert e.value.path == f"mem://{key}"


def test_index_head_fetched_once_and_units_by_range(
    tier: Tier,
) -> None:
    """Reading one queue fetches each segment's head once, then only that queue's units."""
    _, objects, put = tier
    remote = RemoteSegments(objects, PREFIX)
    q = RemoteQueue(remote, "T1", 1)
    hi = q.max_offset()
    assert hi is not None
    gets = objects.gets
    units = q.units(0, hi)
    assert len(units) == hi and np.all(np.diff(units["offset"].astype(np.int64)) > 0)
    # At most a head and a range of units per segment; a second read finds the heads kept.
    assert objects.gets - gets <= 2 * len(put)
    gets = objects.gets
    assert q.units(0, hi).tobytes() == units.tobytes()
    assert objects.gets - gets == len(put)


def test_a_missing_object_is_retention_only_below_deleted_below(
    tier: Tier,
) -> None:
    """An object gone from the bucket is the tier's retention's doing only when the manifest,
    read again, puts its segment below ``deleted.below``; a manifest that simply no longer
    names it (replaced by one that starts later, without saying anything was removed) leaves
    it damage."""
    w, objects, put = tier
    remote = RemoteSegments(objects, PREFIX, name="mem://")
    entries = list(remote.manifest.segments)
    seg0 = remote.open(put[0][0], read_ahead=64)
    assert seg0.read(0, 16) and seg0.length > 200  # reads past 64 are GETs of the object
    write_manifest(objects, PREFIX, w.segment, entries[1:], deleted_below=0, generation=2)
    key = f"{PREFIX}commitlog/{put[0][0]:020d}"
    del objects.objects[key]
    with pytest.raises(CorruptRecordError, match="neither named by the manifest") as caught:
        seg0.read(100, 16)
    assert not isinstance(caught.value, SegmentGoneError) and caught.value.path == f"mem://{key}"
    write_manifest(objects, PREFIX, w.segment, entries[1:], deleted_below=put[1][0], generation=3)
    with pytest.raises(SegmentGoneError, match=f"deleted.below is now {put[1][0]}"):
        seg0.read(150, 16)


@pytest.mark.parametrize("guess", [16, 64, "names", "sample"])
def test_a_head_longer_than_the_first_get_is_fetched_in_steps(
    tier: Tier, monkeypatch: pytest.MonkeyPatch, guess: int | str
) -> None:
    """The first GET of an index takes HEAD_GUESS bytes; a head longer than that (many queues,
    a long key sample) is fetched again as the parser asks: up to the key sample's stride,
    then the whole head (three GETs at most past a guess that holds the header, as the
    real one, 64 KiB, does). Guesses: shorter than the header, the header alone, ending
    inside the names, ending inside the key sample."""
    _, objects, put = tier
    base = put[0][0]
    whole = SegmentIndex.parse(objects.objects[f"{PREFIX}index/{base:020d}"], where="i")
    names_end = whole.head_length - len(whole.key_sample) - 4
    at = {"names": names_end - 3, "sample": whole.head_length - 2}
    monkeypatch.setattr(remote_module, "HEAD_GUESS", at.get(str(guess), guess))
    remote = RemoteSegments(objects, PREFIX)
    assert remote.manifest.segments  # read first: the GETs counted are the head's
    gets = objects.gets
    head = remote.index(base)
    assert objects.gets - gets <= (4 if guess == 16 else 3)
    assert (head.rows, head.key_sample, head.key_stride) == (
        whole.rows,
        whole.key_sample,
        whole.key_stride,
    )
    found = remote.query_key("T0", "k0")
    stored = []
    for b, obj in put:
        rel = native.walk(obj, 0, len(obj), b, check_crc=True).phys - b
        for m in native.messages(native.decode(obj, rel, b, path="o")):
            if m.topic == "T0" and "k0" in m.keys:
                stored.append(m.commit_log_offset)
    assert len(stored) > 1 and sorted(m.commit_log_offset for m in found) == sorted(stored)


def test_units_of_several_rows_share_a_get(
    tier: Tier,
) -> None:
    """All the rows of a segment asked together: one GET of units (they sit side by side),
    each row's units what it alone reads, in the order asked; rows that may not share a GET
    (the read-ahead smaller than a row) are each read on their own, same units."""
    _, objects, put = tier
    base = put[1][0]
    remote = RemoteSegments(objects, PREFIX)
    index = remote.index(base)
    rows = list(index.rows)[::-1]  # not in the object's order
    assert len(rows) == 6
    asks = [(row, row.first + 1, row.end) for row in rows]
    alone = [remote.units(base, row, lo, hi) for row, lo, hi in asks]
    gets = objects.gets
    together = remote.units_of(base, asks)
    assert objects.gets - gets == 1
    assert [u.tobytes() for u in together] == [u.tobytes() for u in alone]
    assert all(len(u) == row.units - 1 for u, row in zip(together, rows, strict=True))
    apart = RemoteSegments(objects, PREFIX, read_ahead=1).units_of(base, asks)
    assert [u.tobytes() for u in apart] == [u.tobytes() for u in alone]
