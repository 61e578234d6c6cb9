"""The tier's manifest (pipeline/tier/manifest.py): the codec's checks, and conditional
commits on a real radosgw (two writers racing: exactly one wins each round)."""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.errors import ManifestError, ManifestOwnerError
from rocketstore.pipeline.tier.manifest import (
    IndexObject,
    Manifest,
    ManifestStore,
    TierSegment,
    decode,
    encode,
    index_key,
    segment_key,
)
from rocketstore.pipeline.tier.objects import ObjectStore

SIZE = 4096
WHERE = "s3://b/p/manifest.json"
SHA = "ab" * 32


def seg(base: int, length: int = 100) -> TierSegment:
    return TierSegment(base, length, SHA, 3, 10, 20, IndexObject(64, "cd" * 32), 1234)


def manifest(n: int, first: int = 0) -> Manifest:
    return Manifest(
        store_id="s1",
        broker="broker-a",
        segment_size=SIZE,
        generation=n + 1,
        segments=tuple(seg(first + k * SIZE) for k in range(n)),
        queues={"T": {"0": 7, "1": 2}},
        deleted_below=first,
    )


def test_keys_are_the_20_digit_names() -> None:
    assert segment_key("p/b/", 4096) == "p/b/commitlog/00000000000000004096"
    assert index_key("b/", 0) == "b/index/00000000000000000000"


def test_the_documented_example_decodes() -> None:
    doc = {
        "format": 1,
        "storeId": "3c0e",
        "broker": "broker-a",
        "segmentSize": 1073741824,
        "generation": 17,
        "segments": [
            {
                "base": 0,
                "length": 1048576,
                "sha256": SHA,
                "records": 9120,
                "minStoreTimestamp": 1733480000000,
                "maxStoreTimestamp": 1733480060000,
                "index": {"length": 183402, "sha256": SHA},
                "uploadedAt": 1733480071000,
            }
        ],
        "queues": {"TopicA": {"0": 9120, "1": 9011}},
        "deleted": {"below": 0},
    }
    m = decode(json.dumps(doc).encode(), WHERE)
    assert m.end == 1073741824 and m.start == 0
    assert m.segments[0].records == 9120 and m.segments[0].index.length == 183402
    assert m.queues == {"TopicA": {"0": 9120, "1": 9011}}


@given(st.integers(0, 6), st.integers(0, 50))
def test_round_trip(n: int, first: int) -> None:
    m = manifest(n, first * SIZE)
    assert decode(encode(m), WHERE) == m
    assert m.end == (first + n) * SIZE


def test_extend_must_follow() -> None:
    m = manifest(2)
    assert m.extended(seg(2 * SIZE), {"T": {"0": 9}}).end == 3 * SIZE
    with pytest.raises(ManifestError, match="does not follow"):
        m.extended(seg(3 * SIZE), {})


def _doc(m: Manifest) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(encode(m))
    return doc


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d.pop("storeId"), "storeId: missing"),
        (lambda d: d.update(format=2), "format: 2 is not a format"),
        (lambda d: d.update(segmentSize=0), "segmentSize: must be >= 1"),
        (lambda d: d.update(generation="3"), "generation: must be an integer"),
        (lambda d: d["segments"][1].update(base=3 * SIZE), r"segments\[1\]\.base: .* contiguous"),
        (lambda d: d["segments"][0].update(base=10), r"segments\[0\]\.base: .* multiple"),
        (lambda d: d["segments"][0].update(length=SIZE + 1), r"segments\[0\]\.length"),
        (lambda d: d["segments"][0].update(sha256="xyz"), r"segments\[0\]\.sha256"),
        (lambda d: d["segments"][1]["index"].pop("length"), r"segments\[1\]\.index\.length"),
        (lambda d: d["segments"][0].update(records=-1), r"segments\[0\]\.records: must be >= 0"),
        (lambda d: d["queues"]["T"].update({"x": 1}), "queues.T: queue ids"),
        (lambda d: d["deleted"].update(below=SIZE * 5), "deleted.below"),
        (lambda d: d.update(segments={}), "segments: must be a JSON array"),
    ],
)
def test_a_bad_field_is_named(change: Any, field: str) -> None:
    doc = _doc(manifest(2))
    change(doc)
    with pytest.raises(ManifestError, match=field) as caught:
        decode(json.dumps(doc).encode(), WHERE)
    assert str(caught.value).startswith(WHERE)


@given(st.binary(max_size=64))
def test_garbage_is_a_manifest_error(data: bytes) -> None:
    try:
        decode(data, WHERE)
    except ManifestError as exc:
        assert WHERE in str(exc)


# -- on radosgw ------------------------------------------------------------------------------


def objects(ceph: Any, bucket: str) -> ObjectStore:
    return ObjectStore(StoreConfig().with_overrides(ceph.settings(bucket)))


def add(base: int) -> Any:
    """An update that appends the segment at ``base`` unless the manifest has it."""

    def update(m: Manifest | None) -> Manifest | None:
        m = m or Manifest("s1", "broker-a", SIZE)
        if base in m.bases():
            return None
        return m.extended(seg(base), {"T": {"0": base // SIZE + 1}})

    return update


def test_commit_creates_then_extends(ceph: Any, bucket: str) -> None:
    ms = ManifestStore(objects(ceph, bucket), "p/broker-a/", "s1")
    assert ms.load() is None
    first = ms.commit(add(0))
    assert first.wrote and first.manifest is not None and first.manifest.generation == 1
    again = ms.commit(add(0))  # nothing to do
    assert not again.wrote and again.etag == first.etag
    second = ms.commit(add(SIZE))
    assert second.manifest is not None and second.manifest.generation == 2
    loaded = ms.load()
    assert loaded is not None and loaded[0] == second.manifest and loaded[1] == second.etag
    # What the bucket holds is the JSON the codec wrote, read by another client.
    raw = ceph.objects(bucket, "p/broker-a/manifest.json")["p/broker-a/manifest.json"]
    assert json.loads(raw)["segments"][1]["base"] == SIZE


def test_another_stores_manifest_is_refused(ceph: Any, bucket: str) -> None:
    s3 = objects(ceph, bucket)
    ManifestStore(s3, "broker-a/", "store-one").commit(
        lambda m: dataclasses.replace(Manifest("store-one", "broker-a", SIZE), segments=(seg(0),))
    )
    other = ManifestStore(s3, "broker-a/", "store-two")
    with pytest.raises(ManifestOwnerError, match="store-one") as caught:
        other.load()
    assert "store-two" in str(caught.value) and bucket in str(caught.value)
    with pytest.raises(ManifestOwnerError):
        other.commit(add(SIZE))


def test_two_writers_race_and_exactly_one_wins_each_round(ceph: Any, bucket: str) -> None:
    """Each round both writers read the same version (a barrier inside the update, on the
    first read only) and try to append the same segment: one write wins, the other loses
    its conditional write, reads again, finds the segment there and writes nothing."""
    rounds = 12
    stores = [ManifestStore(objects(ceph, bucket), "r/", "s1") for _ in range(2)]
    barrier = threading.Barrier(2, timeout=60)
    wins: list[list[bool]] = [[], []]
    reads: list[list[int]] = [[], []]
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            for r in range(rounds):
                base = r * SIZE
                first_read = [True]

                def update(m: Manifest | None, base: int = base, once: list[bool] = first_read):
                    if once[0]:
                        once[0] = False
                        barrier.wait()  # both have read the same version
                    return add(base)(m)

                done = stores[w].commit(update)
                wins[w].append(done.wrote)
                reads[w].append(done.attempts)
                barrier.wait()  # the round is over for both
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    for r in range(rounds):
        assert wins[0][r] != wins[1][r], f"round {r}: wins {wins[0][r]}, {wins[1][r]}"
        loser = 0 if not wins[0][r] else 1
        assert reads[loser][r] == 2  # it read again once, then had nothing to do
    final = stores[0].load()
    assert final is not None
    assert final[0].bases() == [r * SIZE for r in range(rounds)]
    assert final[0].generation == rounds


def test_trimmed_drops_the_front_and_the_next_segment_follows_the_old_end() -> None:
    m = manifest(4, first=2 * SIZE)  # segments at 2, 3, 4, 5 x SIZE
    t = m.trimmed(4 * SIZE)
    assert t.bases() == [4 * SIZE, 5 * SIZE] and t.deleted_below == 4 * SIZE
    assert (t.start, t.end) == (4 * SIZE, m.end) and t.queues == m.queues
    assert decode(encode(t), WHERE) == t
    empty = m.trimmed(m.end)
    assert empty.segments == () and empty.deleted_below == m.end == empty.end
    assert empty.holds_any() and not manifest(0).holds_any()
    # With every segment removed, the tier still ends where it did: the next must start there.
    assert empty.extended(seg(m.end), m.queues).bases() == [m.end]
    with pytest.raises(ManifestError, match="does not follow"):
        empty.extended(seg(m.end + SIZE), m.queues)
    for bad in (m.end + SIZE, 4 * SIZE + 1):
        with pytest.raises(ManifestError, match="not a segment boundary"):
            m.trimmed(bad)


def test_expired_is_the_leading_run_older_than_the_reserved_hours() -> None:
    from rocketstore.pipeline.tier.retention import HOUR_MS, expired, key_base

    stamps = [100, 300, 200, 900]  # newest record of each segment, ms
    m = dataclasses.replace(
        manifest(4),
        segments=tuple(
            dataclasses.replace(seg(k * SIZE), min_store_timestamp=0, max_store_timestamp=t)
            for k, t in enumerate(stamps)
        ),
    )
    now = HOUR_MS + 301
    assert [s.base for s in expired(m, 1, now)] == [0, SIZE, 2 * SIZE]  # 900 is not
    assert [s.base for s in expired(m, 1, HOUR_MS + 250)] == [0]  # 300 stops the run
    assert expired(m, 1, HOUR_MS + 100) == []  # exactly the reserved time: kept
    assert expired(m, 0, 10**15) == []  # 0 hours: for ever
    assert key_base("b/commitlog/00000000000000004096", "b/commitlog/") == 4096
    assert key_base("b/commitlog/99", "b/commitlog/") is None
    assert key_base("b/index/00000000000000004096", "b/commitlog/") is None
