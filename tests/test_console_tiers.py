"""The console's pages of messages across both tiers, against a real radosgw: a store whose
oldest segments are only in the bucket (tests/kit/tierstore.py). The topic page counts each
queue from the tier's first offset, a queue browsed from its first offset shows the messages
only the bucket holds, a key and a CommitLog offset found there too. What each page must show
comes from the messages as they were put."""

from __future__ import annotations

import html
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.console.app import create_app
from rocketstore.pipeline.console.views import Console
from tests.kit import tierstore
from tests.kit.consolekit import cells
from tests.kit.tierstore import TieredStore

pytest.importorskip("starlette", reason="the console needs the 'console' extra")
with warnings.catch_warnings():
    # Starlette 1.x suggests httpx2 for its TestClient; httpx is what it still runs on.
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

LOCAL = "http://127.0.0.1"


@pytest.fixture
def tiered(ceph: Any, bucket: str, tmp_path: Path) -> TieredStore:
    return tierstore.make(ceph, bucket, tmp_path)


@pytest.fixture
def client(tiered: TieredStore) -> Iterator[TestClient]:
    app = create_app(Console(tiered.path, StoreConfig.load(tiered.conf)))
    with TestClient(app, base_url=LOCAL) as c:
        yield c


def test_the_topic_page_counts_the_queues_from_the_bucket(
    client: TestClient, tiered: TieredStore
) -> None:
    r = client.get("/topic/T0")
    assert r.status_code == 200
    rows = {int(row[1]): row for row in cells(r.text, "queues")}
    for topic, queue_id in tiered.queues():
        if topic != "T0":
            continue
        written = tiered.queue(topic, queue_id)
        cold = sum(tiered.tier_only(w) for w in written)
        assert cold > 0
        row = rows[queue_id]
        got = [int(c.replace(",", "")) for c in row[2:6]]
        assert got == [0, len(written), len(written), cold]  # min, max, depth, in the bucket


def test_a_queue_browsed_from_its_first_offset_reads_the_bucket(
    client: TestClient, tiered: TieredStore
) -> None:
    written = tiered.queue("T1", 1)
    r = client.get(
        "/messages",
        params={"topic": "T1", "broker": tiered.path.name, "queue": "1", "count": "5"},
    )
    assert r.status_code == 200
    rows = cells(r.text, "messages")
    assert [int(row[2]) for row in rows] == [0, 1, 2, 3, 4]
    assert all(tiered.tier_only(w) for w in written[:5])
    for w in written[:5]:
        assert w.msg_id in r.text


def test_a_key_and_an_offset_only_the_bucket_holds_are_found(
    client: TestClient, tiered: TieredStore
) -> None:
    cold = next(w for w in tiered.written if tiered.tier_only(w))
    r = client.get("/messages", params={"topic": cold.topic, "by": "key", "key": cold.key})
    assert r.status_code == 200
    rows = cells(r.text, "messages")
    assert len(rows) == 1 and int(rows[0][2]) == cold.queue_offset
    page = client.get(
        "/message", params={"broker": tiered.path.name, "offset": str(cold.commit_log_offset)}
    )
    assert page.status_code == 200 and cold.msg_id in page.text
    text = html.unescape(re.sub(r"<[^>]+>", "", page.text))
    assert cold.body.decode()[:40] in text
    inside = client.get(
        "/message", params={"broker": tiered.path.name, "offset": str(cold.commit_log_offset + 1)}
    )
    assert inside.status_code == 404 and "no record starts" in inside.text
    by_id = client.get(
        "/messages", params={"topic": cold.topic, "by": "msgid", "msgid": cold.msg_id}
    )
    assert (
        by_id.status_code == 200 and int(cells(by_id.text, "messages")[0][2]) == cold.queue_offset
    )


def test_verify_from_the_health_page_checks_the_bucket(
    ceph: Any, client: TestClient, tiered: TieredStore
) -> None:
    """A segment object deleted behind the tier's back: the console's verify run names it, as
    ``rocketstore verify`` does."""
    base = tiered.tier_bases[0]
    ceph.client().delete_object(Bucket=tiered.bucket, Key=tiered.key("commitlog", base))
    assert client.post("/health/verify", follow_redirects=False).status_code == 303
    health = client.app.state.health  # type: ignore[attr-defined]
    assert health.wait(120), "verify did not finish in 120 s"
    page = html.unescape(client.get("/health").text)
    assert "problem(s)" in page
    assert f"s3://{tiered.bucket}/{tiered.key('commitlog', base)}" in page
