"""The source's planner keeping brokers' bounds between plans on GlusterFS (tests/kit/gluster.py;
rocketstore.source.brokercache): a writer through one mount of a replicated volume appends to
one broker of a root after another, flushing each batch; a planner through the other mount
plans again and again, and every range it plans is read there at once."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta
from rocketstore.source import options, schema
from rocketstore.source.planning import Planner, QueueRange
from rocketstore.source.read import ReadContext, read_queue_range
from tests.kit.glusterstore import QUEUES, body
from tests.kit.glusterstore import SMALL_FILES as CONFIG

pytestmark = [pytest.mark.gluster, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
BROKERS = 4
BATCHES = 40  # batch k goes to broker k % BROKERS
PER_BATCH = 200


WRITER = """
import sys, time
sys.path.insert(0, sys.argv[2])
from tests.kit.glusterstore import SMALL_FILES as CONFIG, table
from rocketstore.pipeline.engine.store import MessageStore
root, BATCHES, BROKERS, PER_BATCH = sys.argv[1], *map(int, sys.argv[3:6])
stores = [MessageStore(f"{root}/broker-{b}", CONFIG) for b in range(BROKERS)]
for k in range(BATCHES):
    store = stores[k % BROKERS]
    store.put_batch(table(k * PER_BATCH, PER_BATCH))
    store.flush()
    time.sleep(0.02)  # pacing only: the reader plans between batches and meanwhile
for store in stores:
    store.close()
"""


def test_kept_bounds_on_the_other_mount_offer_only_what_reads_there(gluster_volume: Any) -> None:
    a, b = gluster_volume.a, gluster_volume.b
    StoreRoot(a).ensure_topic("T", TopicMeta(BROKERS, QUEUES))
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(a), str(ROOT), *map(str, (BATCHES, BROKERS, PER_BATCH))],
        stderr=subprocess.PIPE,
    )
    opts = options.parse({"path": str(b), "topic": "T"}, streaming=True)
    planner = Planner(opts)
    ctx = ReadContext(schema=schema.arrow_schema(None), root=str(b), config=CONFIG)
    done: dict[tuple[str, str, int], int] = {}
    seen: list[int] = []
    plans = 0
    total = BATCHES * PER_BATCH
    try:
        deadline = time.monotonic() + 240
        while len(seen) < total:
            assert time.monotonic() < deadline, (len(seen), writer.poll())
            if writer.poll() not in (None, 0):
                break
            plans += 1
            for key, bounds in planner.bounds().items():
                start = done.get(key, bounds.min)
                if bounds.max <= start:
                    continue
                rng = QueueRange("T", key[1], str(b / key[1]), key[2], start, bounds.max)
                bodies = [
                    x
                    for batch in read_queue_range(rng, ctx)
                    for x in batch.column("body").to_pylist()
                ]
                assert len(bodies) == bounds.max - start, (key, start, bounds.max)
                for x in bodies:
                    i = int(x.split(b":")[0][1:])
                    assert x == body(i) and i % QUEUES == key[2], (key, x[:20])
                    seen.append(i)
                done[key] = bounds.max
    finally:
        if writer.poll() is None:
            writer.wait(timeout=120)
        _, err = writer.communicate()
    assert writer.returncode == 0, err.decode()[-2000:]
    assert sorted(seen) == list(range(total))
    # Caught up: a plan from scratch agrees, and another plan reads no broker again.
    assert planner.bounds() == Planner(opts).bounds()
    before = planner.work.read
    planner.bounds()
    assert planner.work.read == before
    # Each batch changed one broker: far fewer reads than brokers times plans.
    assert planner.work.read < plans * BROKERS, (planner.work, plans)
