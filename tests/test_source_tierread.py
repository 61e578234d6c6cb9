"""The source's partition read from the tier (source/tierread.py): the same batches as the local
read of the same queue range, the messages the model holds, and one queue among many read for
little more than its own bytes. An in-memory object store stands in for the bucket (the
segments, indexes and manifest put as docs/tiering.md lays them out)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketstore.pipeline.errors import DataLossError, OffsetOutOfRangeError, StoreError
from rocketstore.pipeline.format.message import Message
from rocketstore.pipeline.tier.remote import RemoteQueue, RemoteSegments
from rocketstore.source import schema
from rocketstore.source.options import OPTIONAL_COLUMNS
from rocketstore.source.planning import QueueRange
from rocketstore.source.read import ReadContext, read_queue_range
from rocketstore.source.tierread import read_tier_range, read_tier_segment
from rocketstore.source.tiers import TierView
from tests.kit.strategies import messages
from tests.kit.tiermodel import MemoryObjects, upload_sealed, write_manifest, written

PREFIX = "b/broker-a/"
batches = st.lists(
    st.tuples(st.lists(messages(), min_size=1, max_size=12), st.integers(0, 5000)),
    min_size=2,
    max_size=14,
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=batches,
    chunk=st.sampled_from([1, 3, 1000]),
    sub=st.sampled_from(["*", "TagA || x", "*"]),
    data=st.data(),
)
def test_tier_read_is_the_local_read_and_the_model(
    batches: list[tuple[list[Message], int]], chunk: int, sub: str, data: st.DataObject
) -> None:
    with written(batches, 4096) as w:
        objects = MemoryObjects()
        put = upload_sealed(objects, PREFIX, w.path, 4096)
        tier = RemoteSegments(
            objects, PREFIX, read_ahead=data.draw(st.sampled_from([100, 1 << 20]))
        )
        ctx = ReadContext(
            schema=schema.arrow_schema(None, OPTIONAL_COLUMNS),
            root=str(w.path.parent),
            sub_expression=sub,
            chunk_units=chunk,
        )
        tier_end = put[-1][0] + len(put[-1][1]) if put else 0
        for (topic, queue_id), stored in sorted(w.model.queues.items()):
            q = RemoteQueue(tier, topic, queue_id)
            lo, hi = q.min_offset(), q.max_offset()
            mine = [s for s in stored if s.ext.commit_log_offset < tier_end]
            if lo is None or hi is None:
                assert not mine
                continue
            a = data.draw(st.integers(lo, hi))
            b = data.draw(st.integers(a, hi))
            rng = QueueRange(topic, "broker-a", str(w.path), queue_id, a, b)
            got = pa.Table.from_batches(list(read_tier_range(rng, ctx, tier)), ctx.schema)
            local = pa.Table.from_batches(list(read_queue_range(rng, ctx)), ctx.schema)
            assert got.equals(local)
            tags = None if sub == "*" else {"TagA", "x"}
            want = [
                s.ext
                for s in mine
                if a <= s.ext.queue_offset < b and (tags is None or s.ext.tags in tags)
            ]
            rows = got.to_pylist()
            assert [r["queueOffset"] for r in rows] == [e.queue_offset for e in want]
            assert [r["body"] for r in rows] == [e.body for e in want]
            assert [r["commitLogOffset"] for r in rows] == [e.commit_log_offset for e in want]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=batches, sub=st.sampled_from(["*", "TagA || x"]), data=st.data())
def test_a_segment_read_for_many_queues_is_each_queues_local_read(
    batches: list[tuple[list[Message], int]], sub: str, data: st.DataObject
) -> None:
    """Every queue's range cut at the tier's segments (as the planner cuts it), each
    segment's pieces read together: per queue, the batches the local read gives."""
    with written(batches, 4096) as w:
        objects = MemoryObjects()
        upload_sealed(objects, PREFIX, w.path, 4096)
        tier = RemoteSegments(objects, PREFIX, read_ahead=data.draw(st.sampled_from([100, 4096])))
        view = TierView("broker-a", tier, lambda: 0)
        ctx = ReadContext(
            schema=schema.arrow_schema(None, OPTIONAL_COLUMNS),
            root=str(w.path.parent),
            sub_expression=sub,
        )
        wanted: dict[tuple[str, int], QueueRange] = {}
        pieces: dict[int, list[QueueRange]] = {}
        for topic, queue_id in sorted(w.model.queues):
            q = RemoteQueue(tier, topic, queue_id)
            lo, hi = q.min_offset(), q.max_offset()
            if lo is None or hi is None:
                continue
            a = data.draw(st.integers(lo, hi))
            b = data.draw(st.integers(a, hi))
            wanted[(topic, queue_id)] = QueueRange(topic, "broker-a", str(w.path), queue_id, a, b)
            for base, x, y in view.pieces(topic, queue_id, a, b):
                piece = QueueRange(topic, "broker-a", str(w.path), queue_id, x, y, "t", True, base)
                pieces.setdefault(base, []).append(piece)
        got: dict[tuple[str, int], list[pa.RecordBatch]] = {}
        for base in sorted(pieces):
            for b in read_tier_segment(pieces[base], ctx, tier):
                key = (b.column("topic")[0].as_py(), b.column("queueId")[0].as_py())
                got.setdefault(key, []).append(b)
        for key, rng in wanted.items():
            local = pa.Table.from_batches(list(read_queue_range(rng, ctx)), ctx.schema)
            mine = pa.Table.from_batches(got.get(key, []), ctx.schema)
            assert mine.equals(local), key


def test_a_segment_of_interleaved_queues_is_fetched_once_not_once_per_queue() -> None:
    """8 queues written round-robin: reading all of them queue by queue fetches each segment
    about 8 times (a queue's records are a few hundred bytes apart, so its runs span the
    segment); reading each segment's pieces together fetches it about once."""
    batch = [Message("T", bytes(300), queue_id=i % 8) for i in range(800)]
    with written([(batch, 1)] * 4, 64 * 1024) as w:
        objects = MemoryObjects()
        put = upload_sealed(objects, PREFIX, w.path, 64 * 1024)
        total = sum(len(data) for _, data in put)
        tier = RemoteSegments(objects, PREFIX)
        view = TierView("broker-a", tier, lambda: 0)
        ctx = ReadContext(schema=schema.arrow_schema(None), root=str(w.path.parent))
        ranges = []
        for qid in range(8):
            q = RemoteQueue(tier, "T", qid)
            lo, hi = q.min_offset(), q.max_offset()
            assert lo == 0 and hi is not None
            ranges.append(QueueRange("T", "broker-a", str(w.path), qid, lo, hi))

        objects.commitlog_bytes_read = 0
        by_queue = sum(b.num_rows for r in ranges for b in read_tier_range(r, ctx, tier))
        per_queue_bytes = objects.commitlog_bytes_read

        objects.commitlog_bytes_read = 0
        by_segment: dict[int, list[QueueRange]] = {}
        for r in ranges:
            for base, a, b in view.pieces("T", r.queue_id, r.start, r.end):
                piece = QueueRange(
                    "T", "broker-a", r.broker_path, r.queue_id, a, b, "t", True, base
                )
                by_segment.setdefault(base, []).append(piece)
        together = sum(
            b.num_rows
            for base in by_segment
            for b in read_tier_segment(by_segment[base], ctx, tier)
        )
        assert together == by_queue == sum(r.count for r in ranges)
        assert per_queue_bytes > 6 * total  # what the segment read is for
        assert total * 0.9 <= objects.commitlog_bytes_read <= total * 1.05


def test_one_queue_among_many_costs_little_more_than_its_bytes() -> None:
    """200 queues written round-robin: reading one fetches under 2x its records' bytes from the
    CommitLog objects (records far apart each get their own small GET)."""
    batch = [Message("T", bytes(200), queue_id=i % 200, keys=[f"k{i}"]) for i in range(2000)]
    with written([(batch, 1)] * 3, 64 * 1024) as w:
        objects = MemoryObjects()
        upload_sealed(objects, PREFIX, w.path, 64 * 1024)
        tier = RemoteSegments(objects, PREFIX)
        ctx = ReadContext(schema=schema.arrow_schema(None), root=str(w.path.parent))
        q = RemoteQueue(tier, "T", 7)
        lo, hi = q.min_offset(), q.max_offset()
        assert lo == 0 and hi is not None and hi > 20
        objects.commitlog_bytes_read = 0
        rng = QueueRange("T", "broker-a", str(w.path), 7, lo, hi)
        rows = pa.Table.from_batches(list(read_tier_range(rng, ctx, tier))).to_pylist()
        own = sum(s.ext.store_size for s in w.model.queues[("T", 7)][:hi])
        assert [r["queueOffset"] for r in rows] == list(range(hi))
        assert own <= objects.commitlog_bytes_read < 2 * own


def test_offsets_below_the_tier_are_data_loss() -> None:
    batch = [Message("T", bytes(100), queue_id=0) for _ in range(60)]
    with written([(batch, 1)] * 3, 4096) as w:
        objects = MemoryObjects()
        put = upload_sealed(objects, PREFIX, w.path, 4096, first=2)
        tier = RemoteSegments(objects, PREFIX)
        lo = RemoteQueue(tier, "T", 0).min_offset()
        assert lo is not None and lo > 0 and put
        rng = QueueRange("T", "broker-a", str(w.path), 0, 0, lo + 3)
        strict = ReadContext(schema=schema.arrow_schema(None), root=str(w.path.parent))
        with pytest.raises(DataLossError, match=f"offsets \\[0, {lo}\\).*tier's retention"):
            list(read_tier_range(rng, strict, tier))
        lax = ReadContext(
            schema=schema.arrow_schema(None), root=str(w.path.parent), fail_on_data_loss=False
        )
        rows = pa.Table.from_batches(list(read_tier_range(rng, lax, tier))).to_pylist()
        assert [r["queueOffset"] for r in rows] == [lo, lo + 1, lo + 2]
        # A manifest without any segment: everything planned is lost.
        write_manifest(objects, PREFIX, 4096, [], deleted_below=put[-1][0] + 4096, generation=2)
        tier.relist()
        assert list(read_tier_range(rng, lax, tier)) == []


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_damaged_index_object_fails_the_read_or_changes_nothing(data: st.DataObject) -> None:
    """A byte of an index object changed in the bucket: the read raises a StoreError naming an
    object, or (a tags code or a store time, which the records themselves hold) returns the
    model's messages all the same. Never another exception, never other messages."""
    batch = [Message(f"T{i % 2}", bytes(50), queue_id=i % 3, tags="t") for i in range(60)]
    with written([(batch, 1)] * 3, 4096) as w:
        objects = MemoryObjects()
        put = upload_sealed(objects, PREFIX, w.path, 4096)
        base = data.draw(st.sampled_from([b for b, _ in put]))
        key = f"{PREFIX}index/{base:020d}"
        raw = bytearray(objects.objects[key])
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] ^= data.draw(st.integers(1, 255))
        objects.objects[key] = bytes(raw)
        tier = RemoteSegments(objects, PREFIX, name="mem://")
        ctx = ReadContext(schema=schema.arrow_schema(None), root=str(w.path.parent))
        tier_end = put[-1][0] + len(put[-1][1])
        for (topic, queue_id), stored in sorted(w.model.queues.items()):
            want = [s.ext.queue_offset for s in stored if s.ext.commit_log_offset < tier_end]
            rng = QueueRange(topic, "broker-a", str(w.path), queue_id, 0, len(want))
            try:
                rows = pa.Table.from_batches(list(read_tier_range(rng, ctx, tier)), ctx.schema)
            except StoreError as exc:
                assert "mem://" in str(exc) or isinstance(exc, OffsetOutOfRangeError), exc
                continue
            assert rows.column("queueOffset").to_pylist() == want
