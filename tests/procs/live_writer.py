"""A writer for tests/test_verify_live.py: appends batches until a line arrives on stdin.

Usage: python tests/procs/live_writer.py STORE. Prints ``ready`` once its first flush is on
disk, then keeps putting batches (flushing every 20 ms) until stdin has a line or is closed,
then prints how many messages it wrote and closes the store.
"""

from __future__ import annotations

import select
import sys

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format.message import Message

CONFIG = StoreConfig(
    mapped_file_size_commitlog=256 * 1024,
    mapped_file_size_consume_queue=20 * 200,
    max_hash_slot_num=101,
    max_index_num=2000,
    flush_interval_commitlog=20,
)


def main() -> None:
    n = 0
    with MessageStore(sys.argv[1], CONFIG) as store:
        while True:
            store.put_batch(
                [
                    Message(f"T{k % 3}", b"x" * (k % 200), queue_id=k % 4, keys=[f"k{n + k}"])
                    for k in range(50)
                ]
            )
            n += 50
            if n == 50:
                store.flush()
                print("ready", flush=True)
            if select.select([sys.stdin], [], [], 0)[0]:
                break
    print(n, flush=True)


if __name__ == "__main__":
    main()
