"""The scale benchmark's pieces (bench/scale.py, bench/scale_steps.py, bench/chart_scale.py):
its steps on tiny sizes, in-process; its targets on hand-made figures; its chart's points.
They check what is measured and drawn, not how fast."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # bench/ is a folder of the checkout, not installed

from bench import chart_scale, scale, scale_steps  # noqa: E402
from rocketstore.pipeline.engine.store import MessageStore  # noqa: E402


def test_a_batch_spreads_messages_over_topics_of_four_queues() -> None:
    t = scale_steps.make_batch(0, 80, 40)
    topics = t.column("topic").to_pylist()
    queues = t.column("queueId").to_pylist()
    assert len(set(topics)) == 10
    assert set(zip(topics, queues, strict=True)) == {
        (f"T{i:05d}", q) for i in range(10) for q in range(4)
    }
    assert t.column("body").to_pylist()[0] != t.column("body").to_pylist()[1]
    assert len(t.column("body").to_pylist()[0]) == 100
    assert t.column("keys").to_pylist()[:2] == ["key-0", "key-1"]


def test_the_steps_build_open_and_measure_a_store(tmp_path: Path) -> None:
    store = tmp_path / "store"
    put = scale_steps.put(store, 40, 400, 100, None)
    assert put["put_close_s"] > 0 and put["work"]["created"] >= 40
    with MessageStore(store, read_only=True) as s:
        infos = list(s.queue_infos())
    assert len(infos) == 40 and sum(i.max_offset for i in infos) == 400
    opened = scale_steps.open_store(store, read_only=False)
    # A clean open loads no queue: their lengths come from what the last flush recorded.
    assert opened["work"]["queues_loaded"] == 0 and opened["records_redispatched"] == 0
    listed = scale_steps.floor_list(store)
    assert listed["files"] == 40
    floor = scale_steps.floor_create(tmp_path / "floor", 40)
    made = sorted((tmp_path / "floor").glob("*/*/00000000000000000000"))
    assert floor["files"] == len(made) == 40
    assert {p.stat().st_size for p in made} == {scale_steps.CQ_FILE}


def _figures(put: float, disk: int, **over: float) -> dict[str, Any]:
    one = {"median": 1.0, "min": 1.0, "max": 1.0}
    d: dict[str, Any] = {
        key: dict(one)
        for key in (
            "floor_create_s",
            "floor_list_s",
            "open_s",
            "open_ro_s",
            "crash_open_s",
            "verify_s",
            "queues_s",
            "topics_s",
            "lag_s",
            "overview_s",
        )
    }
    d["put_close_s"] = {"median": put, "min": put, "max": put}
    for key, value in over.items():
        d[key] = {"median": value, "min": value, "max": value}
    d["disk_bytes"] = disk
    return d


def test_targets_compare_the_largest_count_with_the_smallest() -> None:
    lo = _figures(1.0, 100_000_000, floor_list_s=0.01)
    hi = _figures(4.5, 250_000_000, floor_create_s=1.0, floor_list_s=0.5, verify_s=4.0,
                  crash_open_s=11.0)  # fmt: skip
    rows = {r.name.split(",")[0]: r for r in scale._targets({40: lo, 40_000: hi})}
    assert rows["put + close"].met is False  # 4.5 > 2 x (1.0 + 1.0)
    assert rows["clean open"].met is True  # 1.0 <= max(1 s, 3 x 0.5)
    assert rows["verify"].met is True  # 4.0 <= 3 x 1.0 + 3 x 0.5
    assert rows["open after kill -9"].met is False
    assert rows["disk"].met is False and rows["disk"].ratio == pytest.approx(2.5)


def test_the_chart_draws_each_median_at_its_queue_count(tmp_path: Path) -> None:
    by_q = {
        "40": _figures(0.5, 1, rocketmq_load_s=0.7),
        "40000": _figures(5.0, 1, verify_s=9.0, rocketmq_load_s=70.0),
    }
    for d in by_q.values():
        d.update(queues=0, messages=400_000)
    out = tmp_path / "out"
    out.mkdir()
    payload = {
        "part": "scale",
        "started_utc": "2026-11-29T00:00:00Z",
        "machine": {"nproc": 2},
        "part_load_avg": {"start": [1, 1, 1], "end": [1, 1, 1]},
        "options": {"runs": 1, "quick": False},
        "by_queues": by_q,
    }
    (out / "scale-20261129T000000Z.json").write_text(json.dumps(payload))
    fig = chart_scale.draw_scale(out)
    lines = {line.get_gid(): line for ax in fig.axes for line in ax.lines if line.get_gid()}
    put = lines["scale.writer.put_close_s"]
    assert list(put.get_xdata()) == [40, 40000] and list(put.get_ydata()) == [0.5, 5.0]
    assert list(lines["scale.tools.verify_s"].get_ydata()) == [1.0, 9.0]
    assert list(lines["scale.writer.rocketmq_load_s"].get_ydata()) == [0.7, 70.0]
    assert list(lines["scale.tools.floor_list_s"].get_ydata()) == [1.0, 1.0]
