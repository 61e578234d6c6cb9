"""The writer of tests/test_live_model.py, run as a process of its own (so that it can be
killed with SIGKILL at any point)::

    python tests/procs/model_writer.py STORE INTENTS ACKS --cold N --seed S --first-seq K

It opens ``STORE`` (:data:`tests.kit.livemodel.CONFIG`, background flusher and cleaner on) and
puts until a line arrives on its standard input: batches of 1 to 300 messages (a list of
messages), single messages, and now and then a retention round (``clean``) that deletes every
CommitLog segment older than :data:`KEEP_MS` and what points into them. Messages are numbered
from ``--first-seq`` (:func:`tests.kit.livemodel.message`); each put is logged to ``INTENTS``
before and to ``ACKS`` after it returned (tests/kit/livemodel.py says how).

stdout: ``ready`` once the store is open (recovery done), then ``stopped <next seq>`` after the
line on stdin, once the store is closed. A put or a round that fails ends the process with
the error on stderr and status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))

from rocketstore.pipeline.engine.store import MessageStore
from tests.kit.livemodel import CONFIG, Shape, message

# Segments are kept this long; the store's clock runs fileReservedTime (1 h) less this ahead,
# so that a retention round finds every segment older than this expired.
KEEP_MS = 4000
CLEAN_EVERY_S = 0.5
MAX_BATCH = 300


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store", type=Path)
    p.add_argument("intents", type=Path)
    p.add_argument("acks", type=Path)
    p.add_argument("--cold", type=int, required=True, help="cold queues per cold topic")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--first-seq", type=int, default=1)
    args = p.parse_args(argv)
    shape = Shape(args.cold)
    rng = random.Random(args.seed)
    ahead = CONFIG.file_reserved_time * 3_600_000 - KEEP_MS

    def clock_ms() -> int:
        return time.time_ns() // 1_000_000 + ahead

    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    intents = os.open(args.intents, flags, 0o644)
    acks = os.open(args.acks, flags, 0o644)
    store = MessageStore(args.store, CONFIG, clock_ms=clock_ms)
    print("ready", flush=True)
    seq = args.first_seq
    cleaned = time.monotonic()
    while not select.select([sys.stdin], [], [], 0)[0]:
        n = 1 if rng.random() < 0.4 else rng.randint(1, MAX_BATCH)
        os.write(intents, f"{seq} {n}\n".encode())
        if n == 1:
            offsets = [store.put(message(seq, shape)).queue_offset]
        else:
            done = store.put_batch([message(s, shape) for s in range(seq, seq + n)])
            offsets = done.queue_offsets.tolist()
        line = json.dumps({"first": seq, "n": n, "qo": offsets}, separators=(",", ":"))
        os.write(acks, (line + "\n").encode())
        seq += n
        if time.monotonic() - cleaned >= CLEAN_EVERY_S:
            store.clean(force_expired=True)
            cleaned = time.monotonic()
    store.close()
    print(f"stopped {seq}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
