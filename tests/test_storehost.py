"""pipeline/engine/storehost.py: the store host a directory's records (and msgIds) carry: set, taken
from the directory's newest record, or RocketMQ's broker defaults for a new directory."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
from pathlib import Path

import pytest

from rocketstore.pipeline import cli
from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine import storehost
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.errors import ConfigError
from rocketstore.pipeline.format import record
from rocketstore.pipeline.format.message import Message
from rocketstore.sink.writer import broker_config
from tests.kit.fixtures import FIXTURE_CONFIG, SMALL_CONFIG

# Taken before the suite's autouse pin (conftest._steady_host) replaces the module's function.
REAL_HOST_ADDRESS = storehost.host_address


def stamped(path: Path, config: StoreConfig, topic: str = "T") -> str:
    """Put one message and return the store host its record carries, checked against the
    msgId the put returned."""
    with MessageStore(path, config) as store:
        result = store.put(Message(topic, b"x"))
        host = store.get_message(result.commit_log_offset).store_host
    assert record.parse_msg_id(result.msg_id) == (host, result.commit_log_offset)
    return host


@pytest.mark.parametrize(
    ("addresses", "chosen"),
    [
        (["127.0.0.1", "10.1.2.3", "172.17.0.2"], "10.1.2.3"),
        (["127.0.0.1", "192.168.1.5", "10.1.2.3"], "10.1.2.3"),
        (["127.0.0.1", "192.168.1.5", "192.168.9.9"], "192.168.1.5"),
        (["127.0.0.1", "127.0.1.1"], "127.0.0.1"),
        ([], "127.0.0.1"),
    ],
)
def test_the_default_address_is_the_one_a_stock_broker_takes(
    addresses: list[str], chosen: str
) -> None:
    assert storehost.pick_address(addresses) == chosen


def test_this_hosts_address_comes_from_its_interfaces() -> None:
    found = storehost.interface_addresses()
    assert all(ipaddress.ip_address(a).version == 4 for a in found)
    assert "127.0.0.1" in found  # the loopback interface, which every Linux host has
    assert REAL_HOST_ADDRESS() == storehost.pick_address(found)


@pytest.mark.parametrize(
    ("settings", "newest", "expected"),
    [
        ({}, None, "127.0.0.1:10911"),
        ({"listen_port_offset": 20}, None, "127.0.0.1:10931"),
        ({"broker_ip1": "10.0.0.5", "listen_port": 20911}, None, "10.0.0.5:20911"),
        ({}, "10.9.8.7:30911", "10.9.8.7:30911"),
        # A directory's port is its own: a root's offset applies only to a chosen port.
        ({"listen_port_offset": 20}, "10.9.8.7:30911", "10.9.8.7:30911"),
        ({"broker_ip1": "10.0.0.5"}, "10.9.8.7:30911", "10.0.0.5:30911"),
        ({"listen_port": 20911, "listen_port_offset": 10}, "10.9.8.7:30911", "10.9.8.7:20921"),
        ({}, "[fe80::1]:10911", "[fe80::1]:10911"),
        ({"broker_ip1": "::1"}, None, "[::1]:10911"),
    ],
)
def test_set_then_the_directorys_then_the_default(
    settings: dict[str, object], newest: str | None, expected: str
) -> None:
    fixed = storehost.for_directory(StoreConfig(**settings), newest)  # type: ignore[arg-type]
    assert storehost.store_host(fixed) == expected
    assert fixed.listen_port_offset == 0
    # Fixed once: fixing it again for the same directory changes nothing.
    assert storehost.for_directory(fixed, expected) == fixed


def test_a_port_past_65535_is_refused_with_the_offset_named() -> None:
    with pytest.raises(
        ConfigError, match=r"listenPort=65530: must be a TCP port \(1-65535\) after adding 10"
    ):
        StoreConfig(listen_port=65530, listen_port_offset=10)


def test_every_writer_of_a_directory_stamps_its_store_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first writer fixes the store host; later writers with default settings stamp the
    same, whatever their own host; a set brokerIP1/listenPort wins, and then is the
    directory's for the next writer."""
    path = tmp_path / "broker-0"
    first = dataclasses.replace(SMALL_CONFIG, broker_ip1="10.1.1.1", listen_port=20911)
    assert stamped(path, first) == "10.1.1.1:20911"
    assert stamped(path, SMALL_CONFIG) == "10.1.1.1:20911"
    assert stamped(path, broker_config(SMALL_CONFIG, 3)) == "10.1.1.1:20911"
    # A writer elsewhere, whose own address is another: still the directory's.
    monkeypatch.setattr(storehost, "host_address", lambda: "10.2.2.2")
    assert stamped(path, SMALL_CONFIG, "Other") == "10.1.1.1:20911"
    moved = dataclasses.replace(SMALL_CONFIG, listen_port=30911)
    assert stamped(path, moved) == "10.1.1.1:30911"
    assert stamped(path, SMALL_CONFIG) == "10.1.1.1:30911"
    # A new directory gets this host's address, and a root's broker b a port 10 b above.
    assert stamped(tmp_path / "broker-2", broker_config(SMALL_CONFIG, 2)) == "10.2.2.2:10931"


def test_a_store_with_no_progress_file_stamps_its_newest_records_host(tmp_path: Path) -> None:
    """A directory a stock broker wrote and closed has no rocketstore progress file, so
    recovery walks nothing and names no last record: the host comes from the newest record a
    ConsumeQueue points at, across topics and queues."""
    path = tmp_path / "broker-a"
    old = dataclasses.replace(SMALL_CONFIG, broker_ip1="10.3.3.3")
    new = dataclasses.replace(SMALL_CONFIG, broker_ip1="10.4.4.4", listen_port=20911)
    with MessageStore(path, old) as store:
        store.put(Message("A", b"old", queue_id=3))
    with MessageStore(path, new) as store:
        store.put(Message("B", b"new", queue_id=0))
    (path / "config" / "rocketstore.json").unlink()
    assert stamped(path, SMALL_CONFIG, "C") == "10.4.4.4:20911"


@pytest.mark.fixtures
def test_appending_to_a_rocketmq_store_stamps_the_brokers_host(
    fixture_copy: object,
) -> None:
    """rocketstore appends to a store RocketMQ 4.9.4 wrote with the store host the broker
    stamped (127.0.0.2:10911 there), so msgIds of both writers name one broker."""
    path = fixture_copy("basic")  # type: ignore[operator]
    with MessageStore(path, FIXTURE_CONFIG, read_only=True) as store:
        theirs = store.get_message(store.commitlog.min_offset).store_host
    assert theirs == "127.0.0.2:10911"
    assert stamped(path, FIXTURE_CONFIG, "TopicA") == theirs


def test_cli_config_shows_the_store_host_unset(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["settings"]
    assert (shown["brokerIP1"], shown["listenPort"]) == (None, None)
