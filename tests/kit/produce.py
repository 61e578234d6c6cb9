"""Lines for ``rocketstore produce``, the small-file settings written beside them, and what a
store holds afterwards: shared by the tests of a full disk and of a file size limit."""

from __future__ import annotations

import json
from pathlib import Path

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore

# Small files, so that a few MiB hold several of each; the CommitLog's 1 MiB segments are the
# issue's broker.conf.
SMALL = """\
mappedFileSizeCommitLog = 1048576
mappedFileSizeConsumeQueue = 60000
maxHashSlotNum = 5000
maxIndexNum = 20000
"""


def write_input(path: Path, first: int, count: int) -> list[dict[str, object]]:
    rows = [
        {"topic": f"T{n % 3}", "queueId": n % 4, "body": f"{n:08d}-" + "x" * 190, "keys": f"k{n}"}
        for n in range(first, first + count)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def stored_bodies(store: Path, config: StoreConfig) -> dict[int, bytes]:
    """Every message of the store by commitLogOffset, read through the ConsumeQueues."""
    found: dict[int, bytes] = {}
    with MessageStore(store, config, read_only=True) as s:
        for info in s.queue_infos():
            offset = info.min_offset
            while offset < info.max_offset:
                got = s.get_messages(info.topic, info.queue_id, offset, 512)
                for m in got.messages:
                    found[m.commit_log_offset] = m.body
                offset = got.next_begin_offset
    return found
