"""Write a sample store through the ``rocketstore`` command line and show what it holds.

This is what ``make demo`` runs until the Spark pipeline jobs exist: it generates a stream of
realistic orders (customer keys, order-type tags, JSON bodies), pipes them into
``rocketstore produce``, then uses the read commands an operator would use. Everything goes
through the CLI, so the demo exercises exactly what users run.

Usage: ``python -m jobs.sample_store [--store DIR] [--messages N]``
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ORDER_TYPES = ("NEW", "PAID", "SHIPPED", "CANCELLED")


def orders(count: int, seed: int = 7) -> Iterator[dict[str, object]]:
    rng = random.Random(seed)
    for i in range(count):
        customer = f"customer-{rng.randrange(500):03d}"
        kind = ORDER_TYPES[rng.randrange(len(ORDER_TYPES))]
        body = {
            "orderId": f"order-{i:07d}",
            "customer": customer,
            "amount": round(rng.uniform(5, 500), 2),
            "currency": "EUR",
            "items": rng.randrange(1, 6),
        }
        yield {
            "topic": "orders",
            "queueId": int(customer[-3:]) % 4,
            "keys": [f"order-{i:07d}", customer],
            "tags": kind,
            "properties": {"source": "sample", "schema": "order-v1"},
            "body": json.dumps(body, separators=(",", ":")),
        }


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    print(f"\n$ {shlex.join(cmd)}", flush=True)
    result: subprocess.CompletedProcess[str] = subprocess.run(cmd, check=True, text=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="data/demo-store", help="store directory (recreated)")
    parser.add_argument("--messages", type=int, default=20000, help="orders to produce")
    args = parser.parse_args(argv)
    exe = shutil.which("rocketstore") or str(Path(sys.executable).with_name("rocketstore"))
    store = Path(args.store)
    if store.exists():
        shutil.rmtree(store)
    lines = "".join(json.dumps(o) + "\n" for o in orders(args.messages))
    print(f"producing {args.messages} orders into {store} ...", flush=True)
    start = time.perf_counter()
    produced = subprocess.run(
        [exe, "produce", str(store)], input=lines, capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - start
    results = [json.loads(x) for x in produced.stdout.splitlines()]
    ok = sum(r["status"] == "PUT_OK" for r in results)
    print(f"stored {ok}/{len(results)} in {elapsed:.2f}s (including process start-up)")
    if produced.returncode != 0:
        sys.stderr.write(produced.stderr)
        return produced.returncode
    run([exe, "queues", str(store)])
    run(
        [
            exe,
            "get",
            str(store),
            "--topic",
            "orders",
            "--queue",
            "0",
            "--offset",
            "0",
            "--max",
            "3",
            "--tags",
            "PAID || SHIPPED",
        ]
    )
    run([exe, "query-key", str(store), "--topic", "orders", "--key", "customer-042", "--max", "5"])
    first = results[0]
    run([exe, "query-msgid", str(store), first["msgId"]])
    print(f"\nThe store is a RocketMQ 4.9.x store directory: {store.resolve()}")
    run(["ls", "-l", str(store), str(store / "commitlog")])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
