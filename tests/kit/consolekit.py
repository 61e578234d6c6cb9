"""Store roots for the console's tests, written by the project's own writer.

:func:`make_root` builds a root of two brokers (``broker-0``, ``broker-1``) in the small
geometry of :data:`SMALL_TOML`:

* ``orders``: a ``json`` body-format topic (schema registered in the root as the sink does),
  2 queues on each broker, keys ``order-<n>``, tags ``paid``/``new``;
* ``logs``: binary bodies, 1 queue on broker-0, one body that is HTML (``HOSTILE_BODY``) and one
  that is not UTF-8;
* a consumer group ``billing`` with offsets in broker-0's ``config/consumerOffset.json``;
* a Spark checkpoint (``offsets/1`` and ``commits/1``) reading ``orders``.

:func:`append` adds messages to a topic of a broker while the console serves it.
"""

from __future__ import annotations

import html
import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.root import StoreRoot, TopicMeta
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format import bodyformat
from rocketstore.pipeline.format.message import Message

SMALL_TOML = """\
mappedFileSizeCommitLog = 1048576
mappedFileSizeConsumeQueue = 6000
maxHashSlotNum = 1000
maxIndexNum = 4000
"""
SMALL = StoreConfig(
    mapped_file_size_commitlog=1_048_576,
    mapped_file_size_consume_queue=6000,
    max_hash_slot_num=1000,
    max_index_num=4000,
)
HOSTILE_BODY = b"<script>alert('body')</script><img src=x onerror=alert(1)>"
ORDERS_PER_QUEUE = {
    ("broker-0", 0): 30,
    ("broker-0", 1): 20,
    ("broker-1", 0): 25,
    ("broker-1", 1): 15,
}
ORDER_SCHEMA = pa.schema([("id", pa.int64()), ("customer", pa.string()), ("amount", pa.float64())])
CHECKPOINT_OFFSETS = {"orders": {"broker-0": {"0": 10, "1": 20}, "broker-1": {"0": 5}}}
GROUP_OFFSETS = {"orders@billing": {"0": 12, "1": 3}}
START_TIMEOUT = 60.0


def order_schema() -> bodyformat.BodySchema:
    return bodyformat.BodySchema.from_arrow(ORDER_SCHEMA, "orders")


def order_messages(
    schema: bodyformat.BodySchema, first: int, n: int, queue_id: int
) -> list[Message]:
    ids = list(range(first, first + n))
    table = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "customer": [f"customer-{i % 7}" for i in ids],
            "amount": [i * 1.5 for i in ids],
        }
    )
    bodies = bodyformat.encode_bodies(table, schema, "json").to_pylist()
    return [
        Message(
            "orders",
            body,
            queue_id=queue_id,
            keys=[f"order-{i}"],
            tags="paid" if i % 2 else "new",
            properties={bodyformat.SCHEMA_PROPERTY: schema.fingerprint},
        )
        for i, body in zip(ids, bodies, strict=True)
    ]


def make_root(base: Path) -> tuple[Path, Path]:
    """The root described in the module docstring, and its Spark checkpoint."""
    root = base / "root"
    root.mkdir(parents=True)
    meta = StoreRoot(root)
    schema = order_schema()
    meta.register_schema(schema.fingerprint, schema.document())
    meta.ensure_topic("orders", TopicMeta(2, 2, "json", (schema.fingerprint,)))
    meta.ensure_topic("logs", TopicMeta(1, 1, "binary"))
    first = 0
    for broker in ("broker-0", "broker-1"):
        with MessageStore(root / broker, SMALL) as store:
            for (b, qid), n in ORDERS_PER_QUEUE.items():
                if b == broker:
                    store.put_batch(order_messages(schema, first, n, qid))
                    first += n
            if broker == "broker-0":
                store.put_batch(
                    [
                        Message("logs", b"plain text line", keys=["log-1"]),
                        Message("logs", HOSTILE_BODY, keys=["hostile"]),
                        Message("logs", bytes(range(256)), keys=["binary"]),
                    ]
                )
    config = root / "broker-0" / "config"
    config.mkdir(exist_ok=True)
    (config / "consumerOffset.json").write_text(json.dumps({"offsetTable": GROUP_OFFSETS}))
    checkpoint = base / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    metadata = {"batchWatermarkMs": 0, "batchTimestampMs": 1700000000000, "conf": {}}
    (checkpoint / "offsets" / "1").write_text(
        "\n".join(["v1", json.dumps(metadata), json.dumps(CHECKPOINT_OFFSETS)])
    )
    (checkpoint / "commits" / "1").write_text('v1\n{"nextBatchWatermarkMs":0}')
    (base / "small.toml").write_text(SMALL_TOML)
    return root, checkpoint


def append_orders(root: Path, broker: str, queue_id: int, first: int, n: int) -> None:
    """``n`` more orders (ids from ``first``) in a queue of ``broker``."""
    with MessageStore(root / broker, SMALL) as store:
        store.put_batch(order_messages(order_schema(), first, n, queue_id))


class ConsoleProcess:
    """``rocketstore console ARGV`` in a subprocess; its output lines arrive on a queue, and
    :attr:`url` is the address it printed (waited for up to :data:`START_TIMEOUT` s)."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rocketstore.pipeline.cli", "console", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.url = self._wait_for_address()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def _wait_for_address(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            self.output.append(line)
            m = re.search(r"serving .* at (http://\S+/) ", line)
            if m:
                return m.group(1)
            if self.proc.poll() is not None and self.lines.empty():
                break
        self.proc.kill()
        raise AssertionError(f"the console did not start: {''.join(self.output)}")

    def interrupt(self) -> int:
        """Ctrl-C, as a person stops it; the exit status."""
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def cells(page: str, table_id: str) -> list[list[str]]:
    """The text of each body row's cells of the table with ``id`` (or ``class``) ``table_id``."""
    m = re.search(rf'<table (?:id|class)="{table_id}">(.*?)</table>', page, re.S)
    assert m, f"no table {table_id}"
    body = m.group(1).split("</thead>")[-1]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)
    return [
        [
            html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
            for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)
        ]
        for r in rows
    ]


def lag_rows(section: str) -> list[dict[str, Any]]:
    """The lag table of one consumer's section of the consumers page, as the JSON objects
    ``rocketstore lag --json`` prints for it (without the query's batchId or the group)."""
    return [
        {
            "topic": row[0],
            "brokerName": row[1],
            "queueId": int(row[2]),
            "committedOffset": None if row[3] == "—" else int(row[3]),
            "maxOffset": int(row[4]),
            "lag": int(row[5]),
        }
        for row in cells(section, "lag")
    ]
