"""The store host a directory's records carry, and with it every offset msgId.

An offset msgId is the record's STOREHOST (address and port) followed by its CommitLog offset.
``rocketstore query-msgid`` needs only the directory: it reads the record at the offset and
checks that the id is that record's. RocketMQ's own tools do not look in a directory: ``mqadmin
queryMsgById`` and the Dashboard's look-up by message id send the offset to the address in the
id, so a msgId is usable there only when a broker serving that directory listens at its store
host.

Which broker serves a directory is a property of the directory, not of the process writing it:
Spark executors on different hosts append to one broker directory in turn, and a stock broker
may take turns with them. So a writer does not stamp its own host, but the directory's, chosen
when a store is opened for writing (:func:`for_directory`), setting by setting:

1. ``brokerIP1`` / ``listenPort`` when the configuration sets them: the operator knows the
   serving broker's address;
2. else what the directory's newest record carries (:func:`newest_record_host`), whoever wrote
   it: an earlier rocketstore writer, or a stock broker, which stamps its own
   ``brokerIP1:listenPort``. The records are the per-directory memory: every later writer of
   the directory, on any host, stamps the same address, and after a broker's turn rocketstore
   goes on with the broker's;
3. else, for a directory with no record yet, what a stock broker started with default settings
   on this host would stamp: RocketMQ's default ``brokerIP1`` (:func:`host_address`) and
   ``listenPort`` 10911.

A root's brokers (the sink's ``broker-N`` directories) differ in port: broker ``b`` adds
``StoreConfig.listen_port_offset`` (``10 * b``) to a port chosen by rule 1 or 3, never to one
taken from the directory. Ten apart, because a stock broker listening on ``P`` also takes
``P - 2`` (its VIP channel) and ``P + 1`` (HA): brokers on one host must be at least four
apart.

Thread-safety: :func:`host_address` is computed once per process; the rest are pure.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import ipaddress
import socket
import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING

from rocketstore.pipeline.config import StoreConfig, format_host
from rocketstore.pipeline.format import record

if TYPE_CHECKING:
    from rocketstore.pipeline.files.commitlog import CommitLog
    from rocketstore.pipeline.files.consumequeue.queue import ConsumeQueue

DEFAULT_LISTEN_PORT = 10911  # RocketMQ's BrokerConfig/NettyServerConfig default
# A root's broker b stamps listenPort + PORT_STEP * b (see the module).
PORT_STEP = 10
LOOPBACK = "127.0.0.1"
_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address
_PRIVATE_HOME = ipaddress.ip_network("192.168.0.0/16")


def pick_address(addresses: Iterable[str]) -> str:
    """RocketMQ's preference among a host's IPv4 addresses (its ``getLocalAddress``, the
    default ``brokerIP1``): the first that is neither loopback (127/8) nor 192.168/16, else the
    first in 192.168/16, else ``127.0.0.1``."""
    fallback: str | None = None
    for text in addresses:
        addr = ipaddress.IPv4Address(text)
        if addr.is_loopback:
            continue
        if addr in _PRIVATE_HOME:
            fallback = fallback or text
            continue
        return text
    return fallback or LOOPBACK


def interface_addresses() -> list[str]:
    """The IPv4 address of each network interface, in interface index order (Linux; an
    interface without one, or a system without ``SIOCGIFADDR``, contributes nothing)."""
    found: list[str] = []
    try:
        names = socket.if_nameindex()
    except OSError:
        return found
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in sorted(names):
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
            except OSError:
                continue  # no IPv4 address on it
            # struct ifreq: 16 bytes of name, then a sockaddr_in (family, port, address).
            found.append(socket.inet_ntoa(reply[20:24]))
    return found


@functools.cache
def host_address() -> str:
    """This host's address as a stock broker started here would take it by default
    (:func:`pick_address` over :func:`interface_addresses`); computed once per process, as a
    broker does at start-up."""
    return pick_address(interface_addresses())


def default_store_host(config: StoreConfig) -> tuple[str, int]:
    """(address, port) a writer stamps into a directory with no record yet (rules 1 and 3 of
    the module)."""
    ip = config.broker_ip1 if config.broker_ip1 is not None else host_address()
    port = config.listen_port if config.listen_port is not None else DEFAULT_LISTEN_PORT
    return ip, port + config.listen_port_offset


def store_host(config: StoreConfig) -> str:
    """``ip:port`` written into every record's STOREHOST (and so into msgIds) by a writer of a
    directory with no record yet: brokerIP1 (unset: this host's address as a stock broker takes
    it) and listenPort (unset: 10911) plus ``listen_port_offset``. A store opened for writing
    first fixes both for its directory, which may carry another (:func:`for_directory`)."""
    return format_host(*default_store_host(config))


def for_directory(config: StoreConfig, newest: str | None) -> StoreConfig:
    """``config`` with ``brokerIP1`` and ``listenPort`` fixed for a directory whose newest
    record carries the store host ``newest`` (``ip:port``, ``[ip6]:port``; None for a
    directory with no record), by the rules of the module. The result names both settings and
    no offset, so its :func:`store_host` is what is stamped."""
    ip, port = default_store_host(config)
    if newest is not None:
        addr, newest_port = record.parse_host(newest)
        if config.broker_ip1 is None:
            ip = str(ipaddress.ip_address(addr))
        if config.listen_port is None:
            port = newest_port
    return dataclasses.replace(config, broker_ip1=ip, listen_port=port, listen_port_offset=0)


def newest_record_host(
    log: CommitLog, queues: Iterable[ConsumeQueue], last_record: int = -1
) -> str | None:
    """The store host of the newest record of a recovered log: the record at ``last_record``
    when recovery knows it (>= 0), else the newest one a ConsumeQueue points at (recovery has
    dispatched every record; only transaction halves are in no queue). None for a log with no
    record."""
    if last_record < 0:
        for cq in queues:
            if cq.max_offset > cq.min_offset:
                units = cq.read(cq.max_offset - 1, 1)
                if len(units):
                    last_record = max(last_record, int(units[0]["offset"]))
    if last_record < 0 or last_record < log.min_offset:
        return None
    return log.read(last_record, check_crc=False).store_host
