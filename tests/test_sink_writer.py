"""One task's appends to several brokers (sink/writer.py, no Spark)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import rocketstore.sink.writer as writer
from rocketstore.pipeline.engine.root import StoreRoot
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import StoreLockedError
from rocketstore.sink.append import AppendStats, sink_fingerprint
from rocketstore.sink.plan import prepare, route_batches
from rocketstore.sink.settings import SinkSettings
from tests.kit.sink import CONFIG, STORE_OPTIONS

ROOT = Path(__file__).resolve().parent.parent


def stats(broker: int) -> AppendStats:
    return AppendStats(f"broker-{broker}", 0, 1, 0, 1, 100, 0, 0)


class FakeBrokers:
    """``append_broker`` for :func:`rocketstore.sink.writer._append_free_first`: broker ``b`` refuses its
    first ``busy[b]`` tries as a held lock would."""

    def __init__(self, busy: dict[int, int]) -> None:
        self.busy = dict(busy)
        self.tries: list[int] = []
        self.appended: list[int] = []

    def __call__(self, broker: int, timeout_ms: int) -> AppendStats:
        assert timeout_ms == 0  # one try each: the waiting is the caller's
        self.tries.append(broker)
        if self.busy.get(broker, 0) > 0:
            self.busy[broker] -= 1
            raise StoreLockedError(f"broker-{broker} is locked")
        self.appended.append(broker)
        return stats(broker)


@pytest.mark.parametrize(
    ("slot", "order"), [(0, [0, 1, 2]), (1, [1, 2, 0]), (2, [2, 0, 1]), (4, [1, 2, 0])]
)
def test_each_slot_starts_at_its_own_broker(slot: int, order: list[int]) -> None:
    fake = FakeBrokers({})
    done = writer._append_free_first([0, 1, 2], slot, 1000, fake)
    assert fake.appended == order
    assert [s.broker for s in done] == [f"broker-{b}" for b in order]


def test_a_held_broker_is_passed_over_for_a_free_one() -> None:
    fake = FakeBrokers({0: 3})
    writer._append_free_first([0, 1, 2], 0, 60_000, fake)
    # 0 held: 1 and 2 go first; then 0 is retried until its holder lets go.
    assert fake.appended == [1, 2, 0]
    assert fake.tries == [0, 1, 2, 0, 0, 0]


def test_gives_up_after_the_lock_timeout_naming_the_brokers_still_held() -> None:
    fake = FakeBrokers({1: 10**9, 3: 10**9})
    with pytest.raises(StoreLockedError, match=r"broker-1, broker-3: still locked .*lockTimeoutMs"):
        writer._append_free_first([0, 1, 2, 3], 0, 50, fake)
    assert sorted(fake.appended) == [0, 2]


def test_a_store_error_other_than_the_lock_is_not_retried() -> None:
    def failing(broker: int, timeout_ms: int) -> AppendStats:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        writer._append_free_first([0, 1], 0, 60_000, failing)


HOLDER = textwrap.dedent(
    """
    import sys
    from rocketstore.pipeline.config import StoreConfig
    from rocketstore.pipeline.engine.store import MessageStore
    from tests.kit.sink import CONFIG
    with MessageStore(sys.argv[1], CONFIG, create=True):
        print("holding", flush=True)
        sys.stdin.readline()
    """
)


def test_a_task_appends_to_the_free_broker_while_another_process_holds_its_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real locks: broker-0 is held by another process, so a task of slot 0 appends its
    broker-1 rows first, and broker-0's once the holder lets go (which it does only when
    broker-1's append has returned, so the order is not a matter of timing)."""
    settings = SinkSettings.from_options(
        {
            "path": str(tmp_path),
            "topic": "orders",
            "brokers": 2,
            "queues": 2,
            "lockTimeoutMs": 20_000,
            **STORE_OPTIONS,
        }
    )
    n = 40
    table = pa.table(
        {
            "body": [b"row-%d" % i for i in range(n)],
            "queueId": pa.array([i % 4 for i in range(n)], pa.int32()),
        }
    )
    plan = prepare(settings, table.schema)
    root = StoreRoot(settings.root)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root.broker_path(0))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    real_append = writer.append

    def append_then_release(path: Path, *args: Any, **kw: Any) -> AppendStats:
        got = real_append(path, *args, **kw)
        if path.name == "broker-1" and holder.stdin is not None:
            holder.stdin.write("\n")
            holder.stdin.flush()
        return got

    monkeypatch.setattr(writer, "append", append_then_release)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        done = writer.append_routed(
            settings,
            plan.queues,
            route_batches(plan, table.to_batches(), 0),
            batch_id=3,
            sink_fp=sink_fingerprint("q"),
            slot=0,
            attempt=0,
        )
    finally:
        holder.communicate(timeout=30)
    assert [(s.broker, s.appended) for s in done] == [("broker-1", n // 2), ("broker-0", n // 2)]
    for b in (0, 1):
        with MessageStore(root.broker_path(b), CONFIG, read_only=True) as store:
            bodies = [
                m.body for q in (0, 1) for m in store.get_messages("orders", q, 0, 100).messages
            ]
        assert sorted(bodies) == sorted(b"row-%d" % i for i in range(n) if (i % 4) // 2 == b)
