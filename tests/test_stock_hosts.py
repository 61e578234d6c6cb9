"""A store on a shared file system (``two_hosts``: GlusterFS, and CephFS through ceph-fuse;
issue 42) written by rocketstore on one host and served by RocketMQ 4.9.4's own broker on the
other (../shared/rocketmq-4.9.4 through tests/kit/stockrocketmq.py, in a network namespace).

Apart from tests/test_stock_rocketmq.py so that the suite's grouping puts each instance with
the other tests of its file system (tests/conftest.py) and in no second group."""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format.message import Message
from tests.kit import stockrocketmq
from tests.kit.fixtures import SMALL_CONFIG
from tests.kit.stockrocketmq import StockCluster, as_consumed, serve_and_consume

pytestmark = [pytest.mark.slow]

cluster = stockrocketmq.cluster  # the stock name server and brokers, one set for this module

HOSTS = "Hosts"


def _put_on(store_dir: Path, prefix: str, n: int, want: collections.Counter[Any]) -> None:
    with MessageStore(store_dir, SMALL_CONFIG) as store:
        for i in range(n):
            body = f"{prefix} {i}".encode()
            store.put(Message(HOSTS, body, queue_id=i % 4, keys=[f"{prefix}{i}"], tags="R"))
            want[(HOSTS, f"{prefix}{i}", "R", body)] += 1


def test_a_store_written_on_one_host_is_served_by_a_stock_broker_on_another(
    cluster: StockCluster, two_hosts: Any
) -> None:
    """A store on a shared file system (GlusterFS; CephFS through ceph-fuse), issue 42: written
    by rocketstore through host A's mount, then served by a stock broker through host B's,
    which appends. As docs/format.md says: a reader on B with ``sharedStorage=local`` reads
    every message the broker served, at its offsets; a reader on A (``auto``: shared) reads up
    to rocketstore's published point, which the broker does not move, so its own messages
    only; once rocketstore on A writes again (its recovery takes the broker's records in), A
    reads them all, and the broker on B then serves all of it, dense."""
    a_dir, b_dir = two_hosts.a / "broker-0", two_hosts.b / "broker-0"
    want: collections.Counter[tuple[str, str, str, bytes]] = collections.Counter()
    _put_on(a_dir, "a", 60, want)
    consumed = serve_and_consume(cluster, b_dir, HOSTS, 30, want)
    local = dataclasses.replace(SMALL_CONFIG, shared_storage="local")
    assert sorted(as_consumed(b_dir, HOSTS, local)) == sorted(consumed)
    ours = [c for c in consumed if c.tags == "R"]
    assert len(ours) == 60 and sorted(as_consumed(a_dir, HOSTS)) == sorted(ours)

    _put_on(a_dir, "again", 20, want)
    consumed = serve_and_consume(cluster, b_dir, HOSTS, 0, want)
    assert sorted(as_consumed(a_dir, HOSTS)) == sorted(consumed)
