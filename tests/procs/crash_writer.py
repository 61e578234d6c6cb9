"""A store writer for the kill -9 test (``tests/test_crash.py``), run as a subprocess.

::

    python tests/procs/crash_writer.py STORE ACKS INTENTS --flush ASYNC_FLUSH --seed 7 --first-seq 1

It opens ``STORE`` (small geometry, :data:`tests.kit.crashdata.GEOMETRY`) and puts forever (at
most ``--max-puts``): batches of 1..500 messages, as an Arrow table or a list of
:class:`~rocketstore.pipeline.format.message.Message`, and single messages. Message ``seq`` is numbered
from ``--first-seq`` on, one number per message in put order, and everything about it is
derived from that number (:func:`tests.kit.crashdata.expected`), so a checker can tell a real
message from anything else.

For every put it writes two lines, each with one ``write`` to a file opened with ``O_APPEND``:

* before the put, to ``INTENTS``: ``<first seq> <count>``;
* after the put **returned**, to ``ACKS``, then ``fsync``: a JSON object ``{"first", "n",
  "single", "offsets", "queue_offsets"}`` (the CommitLog and queue offsets the put returned).

Only then does it print ``ack <count>`` on stdout. So a complete line in ``ACKS`` is a put that
returned; the last line of ``INTENTS`` without a matching ack is the put that was in flight when
the process died. A kill can tear the last ``ACKS`` line (a write stops between pages on a
fatal signal); a line without its newline is not an acknowledgement.

stdout: ``opening``, ``ready`` (the store is open, recovery done), then ``ack <k>`` per put.
The writer stops on its own after ``--max-puts`` puts or when its parent process is gone.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

# ``python tests/procs/crash_writer.py`` puts tests/procs/ on sys.path, not the checkout: add
# it for ``tests.kit`` (PYTHONPATH, when set, still comes first: the code under test).
sys.path.append(str(Path(__file__).resolve().parents[2]))

from rocketstore.pipeline.engine.store import MessageStore
from tests.kit.crashdata import batch_table, expected, store_config

MAX_BATCH = 500


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store", type=Path)
    p.add_argument("acks", type=Path)
    p.add_argument("intents", type=Path)
    p.add_argument("--flush", default="ASYNC_FLUSH", choices=("ASYNC_FLUSH", "SYNC_FLUSH"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--first-seq", type=int, default=1)
    p.add_argument("--max-puts", type=int, default=20_000)
    args = p.parse_args(argv)

    parent = os.getppid()
    rng = random.Random(args.seed)
    _say("opening")
    store = MessageStore(args.store, store_config(args.flush))
    _say("ready")
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    ack_fd = os.open(args.acks, flags, 0o644)
    intent_fd = os.open(args.intents, flags, 0o644)
    seq = args.first_seq
    for count in range(args.max_puts):
        if os.getppid() != parent:
            break  # the test is gone: do not fill the disk
        roll = rng.random()
        n = 1 if roll < 0.3 else rng.randint(1, MAX_BATCH)
        os.write(intent_fd, f"{seq} {n}\n".encode())
        if roll < 0.3:
            single = store.put(expected(seq).message())
            offsets, queue_offsets = [single.commit_log_offset], [single.queue_offset]
        else:
            if roll < 0.65:
                result = store.put_batch(batch_table(seq, n))
            else:
                result = store.put_batch([expected(s).message() for s in range(seq, seq + n)])
            offsets = result.commit_log_offsets.tolist()
            queue_offsets = result.queue_offsets.tolist()
        # The put returned: only now is it acknowledged.
        line = {
            "first": seq,
            "n": n,
            "single": roll < 0.3,
            "offsets": offsets,
            "queue_offsets": queue_offsets,
        }
        os.write(ack_fd, (json.dumps(line, separators=(",", ":")) + "\n").encode())
        os.fsync(ack_fd)
        _say(f"ack {count + 1}")
        seq += n
    store.close()
    os.close(ack_fd)
    os.close(intent_fd)
    _say("closed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
