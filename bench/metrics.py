"""The ``metrics`` part: how long a scrape of ``/metrics`` takes (rocketstore.pipeline.tools.metrics).

Two roots are written into the scratch directory:

* **big**: 4 brokers x 2.5 million messages (100-byte bodies, the default geometry), 400
  queues (2 topics of 50 queues a broker); ``--quick``: 25 thousand a broker;
* **many**: 40,000 queues (4 brokers x 100 topics x 100 queues, 5 messages each; ConsumeQueue
  files of 300 units, so that 40,000 queues do not reserve gigabytes); ``--quick``: 4,000.

Each has a consumer group (``config/consumerOffset.json`` of every broker) that committed every
queue half way, and a Spark checkpoint whose last committed batch names every queue of the
first topic, also half way. A scrape is what the exporter does per request: the collector reads
the root and ``prometheus_client`` encodes the text format (``generate_latest``), in process.
Timed per root: the first scrape of a new collector (**cold**: every queue's min offset and every
lagging queue's oldest message read), a scrape with nothing changed (**warm**), and a scrape
after every committed offset moved by one (**moved**: each lagging queue's oldest message read
again). Per-queue series follow the default limit (1000 queues): on for big, off for many.

Targets (issue 36): a scrape of big under 1 s, of many under 2 s.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench.common import Options, PartResult, Row, log, scratch_dir, spread, work_dir_notes

TARGETS_S = {"big": 1.0, "many": 2.0}
BROKERS = 4
BATCH = 100_000


def _write(root: Path, config: Any, topics: list[str], queues: int, per_broker: int) -> None:
    from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta
    from rocketstore.pipeline.engine.store import MessageStore

    meta = StoreRoot(root)
    for topic in topics:
        meta.ensure_topic(topic, TopicMeta(BROKERS, queues))
    per_topic = per_broker // len(topics)
    for b in range(BROKERS):
        with MessageStore(root / f"broker-{b}", config, background=False) as store:
            for topic in topics:
                written = 0
                while written < per_topic:
                    n = min(BATCH, per_topic - written)
                    qids = (np.arange(written, written + n, dtype=np.int32) % queues).astype(
                        np.int32
                    )
                    store.put_batch(
                        pa.table(
                            {
                                "topic": pa.array([topic] * n),
                                "body": pa.array([b"b" * 100] * n, pa.binary()),
                                "queueId": pa.array(qids),
                            }
                        )
                    )
                    written += n
        log(f"metrics: {root.name}/broker-{b}: {per_broker:,} messages in {len(topics)} topics")


def _consumers(root: Path, config: Any, shift: int) -> Path:
    """The group's offsets (every queue half way, plus ``shift``) and the checkpoint."""
    from rocketstore.pipeline.tools.storestats import StoreStats

    stats = StoreStats(config)
    first_topic: dict[str, dict[str, dict[str, int]]] = {}
    for b in range(BROKERS):
        name = f"broker-{b}"
        bounds = stats.broker(name, root / name).bounds
        table: dict[str, dict[str, int]] = {}
        for (topic, qid), (_, high) in bounds.items():
            at = min(high, high // 2 + shift)
            table.setdefault(f"{topic}@bench", {})[str(qid)] = at
            if topic == "t0":
                first_topic.setdefault("t0", {}).setdefault(name, {})[str(qid)] = at
        text = json.dumps({"offsetTable": table})
        (root / name / "config" / "consumerOffset.json").write_text(text)
    checkpoint = root.parent / f"{root.name}-checkpoint"
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "commits").mkdir(exist_ok=True)
    (checkpoint / "offsets" / "0").write_text(
        "v1\n"
        + json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}})
        + "\n"
        + json.dumps(first_topic)
    )
    (checkpoint / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    return checkpoint


def _time_root(name: str, root: Path, config: Any, runs: int) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry, generate_latest

    from rocketstore.pipeline.tools.metrics import StoreCollector, Target

    checkpoint = _consumers(root, config, 0)

    def collector() -> tuple[CollectorRegistry, StoreCollector]:
        registry = CollectorRegistry()
        c = StoreCollector(Target(root, config, (("bench", checkpoint),)))
        registry.register(c)
        return registry, c

    def timed(registry: CollectorRegistry) -> tuple[float, int]:
        t0 = time.perf_counter()
        text = generate_latest(registry)
        return time.perf_counter() - t0, text.count(b"\n")

    cold, warm, moved = [], [], []
    lines = 0
    for run in range(runs):
        _consumers(root, config, 0)
        registry, _ = collector()
        seconds, lines = timed(registry)
        cold.append(seconds)
        warm.append(timed(registry)[0])
        _consumers(root, config, run + 1)
        moved.append(timed(registry)[0])
    log(
        f"metrics: {name}: cold {min(cold):.3f} s, warm {min(warm):.3f} s, moved {min(moved):.3f} s"
    )
    return {"cold": spread(cold), "warm": spread(warm), "moved": spread(moved), "lines": lines}


def run(options: Options) -> PartResult:
    from rocketstore.pipeline.config import StoreConfig

    notes = work_dir_notes(options.work_dir, "metrics")
    big_per_broker = 25_000 if options.quick else 2_500_000
    many_topics = 10 if options.quick else 100
    data: dict[str, Any] = {}
    rows: list[Row] = []
    with scratch_dir(options.work_dir, "metrics-") as work:
        roots = {
            "big": (StoreConfig(), [f"t{i}" for i in range(2)], 50, big_per_broker),
            "many": (
                StoreConfig(mapped_file_size_consume_queue=6000),
                [f"t{i}" for i in range(many_topics)],
                100,
                many_topics * 100 * 5,
            ),
        }
        for name, (config, topics, queues, per_broker) in roots.items():
            root = work / name
            _write(root, config, topics, queues, per_broker)
            figures = _time_root(name, root, config, options.runs)
            figures["queues"] = BROKERS * len(topics) * queues
            figures["messages"] = BROKERS * per_broker
            data[name] = figures
            for kind in ("cold", "warm", "moved"):
                s = figures[kind]
                target = TARGETS_S[name]
                rows.append(
                    Row(
                        f"{name} ({figures['queues']:,} queues): {kind} scrape",
                        "ms",
                        s["median"] * 1000,
                        s["min"] * 1000,
                        s["max"] * 1000,
                        target=f"< {target * 1000:.0f} ms",
                        met=None if options.quick else s["max"] < target,
                    )
                )
    return PartResult("metrics", rows, data, notes)
