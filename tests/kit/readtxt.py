"""Render a store the way the fixtures' ``read.txt`` was rendered by RocketMQ 4.9.4, so the two
can be compared line for line. Java formatting quirks (``InetSocketAddress.toString``, IPv6
without zero compression, sorted property maps) are reproduced here, in the test code only."""

from __future__ import annotations

import ipaddress
import re
import zlib
from pathlib import Path

from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.format.record import MessageExt, parse_host


def java_ip(addr: bytes) -> str:
    ip = ipaddress.ip_address(addr)
    if ip.version == 4:
        return str(ip)
    groups = [int.from_bytes(addr[i : i + 2], "big") for i in range(0, 16, 2)]
    return ":".join(f"{g:x}" for g in groups)


def born_text(host: str) -> str:
    addr, port = parse_host(host)
    return f"{java_ip(addr)}:{port}"


def store_text(host: str) -> str:
    addr, port = parse_host(host)
    ip = java_ip(addr)
    return f"/[{ip}]:{port}" if len(addr) == 16 else f"/{ip}:{port}"


def msg_line(m: MessageExt) -> str:
    props = ",".join(f"{k}={v}" for k, v in sorted(m.properties.items()))
    return (
        f"MSG {m.topic},{m.queue_id},{m.queue_offset},{m.commit_log_offset},size={m.store_size},"
        f"storeTs={m.store_timestamp},bornTs={m.born_timestamp},sysFlag={m.sys_flag},"
        f"flag={m.flag},reconsume={m.reconsume_times},prepTxOff={m.prepared_transaction_offset},"
        f"born={born_text(m.born_host)},store={store_text(m.store_host)},msgId={m.msg_id},"
        f"keys={m.properties.get('KEYS')},tags={m.tags},uniq={m.uniq_key},"
        f"bodyLen={len(m.body)},bodyCRC={m.body_crc},"
        f"bodyCRCcalc={zlib.crc32(m.body) & 0x7FFFFFFF},props={{{props}}}"
    )


BYTIME = re.compile(r"^BYTIME (\S+) (\d+) ts=(-?\d+) -> (-?\d+)$")
QUERY = re.compile(r"^QUERY (\S+) key=(\S+) count=\d+ clOffs=\[.*\] hits=\[.*\]$")


def render(store: MessageStore, expected: list[str]) -> list[str]:
    """Our lines for every line of ``expected``; the look-up inputs (timestamps, keys) are taken
    from the expected lines, the answers from the store."""
    out: list[str] = []
    cp = store.checkpoint
    for line in expected:
        kind = line.split(" ", 1)[0]
        if kind == "OPEN":
            out.append(
                f"OPEN dir=STORE abortFileBeforeLoad={str(store.abort_file_found).lower()} "
                f"minPhy={store.min_phy_offset} maxPhy={store.max_phy_offset}"
            )
        elif kind == "CHECKPOINT":
            out.append(
                f"CHECKPOINT physic={cp.physic_msg_timestamp} logics={cp.logics_msg_timestamp} "
                f"index={cp.index_msg_timestamp}"
            )
        elif kind == "QUEUE":
            _, topic, qid = line.split(" ")[:3]
            info = next(q for q in store.queue_infos(topic) if q.queue_id == int(qid))
            out.append(
                f"QUEUE {topic} {qid} min={info.min_offset} max={info.max_offset} "
                f"maxPhysicOffset={info.max_physic_offset}"
            )
            units = store.read_units(topic, int(qid), info.min_offset, info.max_offset)
            for i, u in enumerate(units):
                out.append(
                    f"CQ {topic} {qid} {info.min_offset + i} clOff={int(u['offset'])} "
                    f"size={int(u['size'])} tagsCode={int(u['tags_code'])}"
                )
            result = store.get_messages(topic, int(qid), info.min_offset, info.max_offset)
            out.extend(msg_line(m) for m in result.messages)
        elif kind == "CQ" or kind == "MSG":
            continue  # rendered with their QUEUE line
        elif kind == "FILTER":
            _, topic, qid, rest = line.split(" ", 3)
            expr = rest[rest.index("'") + 1 : rest.rindex("'")]
            from rocketstore.pipeline.format.subscription import Subscription

            units = store.read_units(topic, int(qid), 0, store.max_offset(topic, int(qid)))
            matched = int(Subscription.parse(expr).hash_filter(units["tags_code"]).sum())
            out.append(f"FILTER {topic} {qid} '{expr}' matched={matched}")
        elif kind == "BYTIME":
            m = BYTIME.match(line)
            assert m, line
            topic, qid, ts = m.group(1), int(m.group(2)), int(m.group(3))
            out.append(f"BYTIME {topic} {qid} ts={ts} -> {store.offset_by_time(topic, qid, ts)}")
        elif kind == "QUERY":
            m = QUERY.match(line)
            assert m, line
            topic, key = m.group(1), m.group(2)
            found = store.query_by_key(topic, key, max_count=64)
            # read.txt lists hits in CommitLog order; the store returns newest first.
            found.sort(key=lambda x: x.commit_log_offset)
            offs = ", ".join(str(x.commit_log_offset) for x in found)
            hits = ", ".join(f"{x.topic}/{x.queue_id}/{x.queue_offset}" for x in found)
            out.append(f"QUERY {topic} key={key} count={len(found)} clOffs=[{offs}] hits=[{hits}]")
        elif kind == "TOTAL":
            total = sum(q.max_offset - q.min_offset for q in store.queue_infos())
            out.append(f"TOTAL messages={total}")
        else:
            raise AssertionError(f"unknown read.txt line: {line[:60]}")
    return out


def expected_lines(fixture: Path) -> list[str]:
    return (fixture / "read.txt").read_text(encoding="utf-8").splitlines()
