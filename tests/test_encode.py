"""The native batch encoder must produce exactly the bytes of the readable one-record encoder."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.engine.store import MessageStore
from rocketstore.pipeline.engine.storehost import store_host
from rocketstore.pipeline.errors import InvalidMessageError
from rocketstore.pipeline.format import record
from rocketstore.pipeline.format.message import Message
from tests.kit.strategies import messages

CONFIG = StoreConfig(
    mapped_file_size_commitlog=16384,
    mapped_file_size_consume_queue=200,
    max_hash_slot_num=5,
    max_index_num=8,
    max_message_size=4000,
)


def expected_properties(m: Message, uniq: str) -> dict[str, str]:
    props: dict[str, str] = {}
    keys = " ".join(m.key_list() or [])
    if keys:
        props["KEYS"] = keys
    if m.tags:
        props["TAGS"] = m.tags
    props["UNIQ_KEY"] = uniq
    props.update(m.properties or {})
    return props


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batch=st.lists(messages(), min_size=1, max_size=25)
    | st.lists(messages(large=True), min_size=1, max_size=8),
    store_v6=st.booleans(),
)
def test_batch_bytes_equal_single_record_encoding(
    tmp_path: Path, batch: list[Message], store_v6: bool
) -> None:
    """Small and large bodies, IPv4 and IPv6 hosts, transactions, unicode keys and tags: each
    record the native encoder writes into the segment equals the reference encoding."""
    config = StoreConfig(
        **{
            **CONFIG.__dict__,
            "broker_ip1": "fe80::1" if store_v6 else "127.0.0.2",
            "ignored_keys": (),
        }
    )
    clock = iter(range(10**12, 10**12 + 10**6))
    path = tmp_path / f"s{next(clock)}"
    with MessageStore(path, config, clock_ms=lambda: next(clock)) as store:
        result = store.put_batch(batch)
        uniq = result.uniq_keys.to_pylist()
        for i, m in enumerate(batch):
            phys = int(result.commit_log_offsets[i])
            raw = bytes(store.commitlog.raw(phys, int(result.sizes[i])))
            want = record.encode_record(
                topic=m.topic,
                body=m.body,
                properties=expected_properties(m, uniq[i]),
                queue_id=m.queue_id,
                queue_offset=int(result.queue_offsets[i]),
                physical_offset=phys,
                born_timestamp=result.store_timestamp
                if m.born_timestamp is None
                else m.born_timestamp,
                store_timestamp=result.store_timestamp,
                born_host=m.born_host or store_host(config),
                store_host=store_host(config),
                sys_flag=m.sys_flag,
                flag=m.flag,
                reconsume_times=m.reconsume_times,
                prepared_transaction_offset=m.prepared_transaction_offset,
            )
            assert raw == want, f"message {i} of {len(batch)}"
            if m.uniq_key is not None:
                assert uniq[i] == m.uniq_key


def test_generated_uniq_keys_are_unique_and_rocketmq_shaped(tmp_path: Path) -> None:
    # One batch larger than the 65536 ids RocketMQ's 16-bit counter gives per millisecond.
    table = pa.table({"topic": ["T"] * 70000, "body": [b""] * 70000})
    big = StoreConfig(max_hash_slot_num=1000, max_index_num=200_000)
    with MessageStore(tmp_path / "big", big) as store:
        uniq = store.put_batch(table).uniq_keys.to_pylist()
        uniq += store.put_batch(table.slice(0, 10)).uniq_keys.to_pylist()
    assert len(set(uniq)) == len(uniq)
    assert all(len(u) == 32 and u == u.upper() and int(u, 16) >= 0 for u in uniq)


def test_a_table_without_born_timestamp_is_born_when_stored(tmp_path: Path) -> None:
    # The sink's tables never carry bornTimestamp; a column of nulls and no column at all must
    # both mean "the store time" (pipeline/format/message.py), not 0.
    with MessageStore(tmp_path / "s", CONFIG, clock_ms=lambda: 1_700_000_000_123) as store:
        bare = store.put_batch(pa.table({"topic": ["T", "T"], "body": [b"a", b"b"]}))
        nulls = store.put_batch(
            pa.table(
                {
                    "topic": ["T", "T"],
                    "body": [b"c", b"d"],
                    "bornTimestamp": pa.array([None, 5], pa.int64()),
                }
            )
        )
        got = [
            store.get_message(int(off)).born_timestamp
            for result in (bare, nulls)
            for off in result.commit_log_offsets
        ]
    assert got == [1_700_000_000_123, 1_700_000_000_123, 1_700_000_000_123, 5]


def test_reserved_names_given_as_properties_fill_their_fields(tmp_path: Path) -> None:
    """``dump`` prints KEYS, TAGS and UNIQ_KEY among the properties; a batch that gives them so
    stores them in their own fields (indexed, in their place), an empty one as no value, and a
    row that gives one twice with different values is refused whole."""
    batch = [
        Message(topic="T", body=b"a", properties={"KEYS": "k1 k2", "TAGS": "t", "p": "v"}),
        Message(topic="T", body=b"b", uniq_key="AB" * 16, properties={"UNIQ_KEY": ""}),
        Message(topic="T", body=b"c", properties={"UNIQ_KEY": "CD" * 16, "KEYS": ""}),
    ]
    with MessageStore(tmp_path / "s", CONFIG) as store:
        result = store.put_batch(batch)
        got = [store.get_message(int(p)) for p in result.commit_log_offsets]
        assert list(got[0].properties) == ["KEYS", "TAGS", "UNIQ_KEY", "p"]
        assert (got[0].keys, got[0].tags, got[0].properties["p"]) == (["k1", "k2"], "t", "v")
        assert got[1].properties["UNIQ_KEY"] == "AB" * 16
        assert got[2].properties == {"UNIQ_KEY": "CD" * 16}
        assert [m.body for m in store.query_by_key("T", "k2")] == [b"a"]
        assert [m.body for m in store.query_by_key("T", "CD" * 16)] == [b"c"]
        conflict = Message(topic="T", body=b"d", tags="x", properties={"TAGS": "y"})
        with pytest.raises(InvalidMessageError, match=r"row 1: property TAGS='y' contradicts"):
            store.put_batch([Message(topic="T", body=b"e"), conflict])
        assert store.max_offset("T", 0) == 3


def test_absent_columns_store_what_their_defaults_store(tmp_path: Path) -> None:
    """A batch that leaves out the optional columns (the encoder then borrows no array for
    them) writes the bytes of one that gives every default explicitly, and of one whose
    columns are wider or narrower integers holding the same values."""
    n = 6
    bare = pa.table({"topic": ["T"] * n, "body": [b"x%d" % i for i in range(n)]})
    full = bare.append_column("queueId", pa.array([0] * n, pa.int32()))
    for name, type_ in (
        ("flag", pa.int32()),
        ("sysFlag", pa.int32()),
        ("reconsumeTimes", pa.int32()),
        ("preparedTransactionOffset", pa.int64()),
    ):
        full = full.append_column(name, pa.array([0] * n, type_))
    full = full.append_column("bornTimestamp", pa.nulls(n, pa.int64()))
    full = full.append_column("bornHost", pa.nulls(n, pa.string()))
    other_widths = bare.append_column("queueId", pa.array([0] * n, pa.uint8())).append_column(
        "preparedTransactionOffset", pa.array([None] * n, pa.int16())
    )
    files = []
    for i, table in enumerate((bare, full, other_widths)):
        path = tmp_path / f"s{i}"
        uniq = table.append_column("uniqKey", pa.array([f"{k:032X}" for k in range(n)]))
        with MessageStore(path, CONFIG, clock_ms=lambda: 1_700_000_000_000) as store:
            store.put_batch(uniq)
        files.append((path / "commitlog" / "00000000000000000000").read_bytes())
    assert files[0][:4096] != bytes(4096)
    assert files[1] == files[0] and files[2] == files[0]


@pytest.mark.parametrize("topic", ["Orders\n", "Orders\r", "\nOrders", "Or ders", ""])
def test_a_topic_outside_rocketmqs_rule_is_refused_whole(tmp_path: Path, topic: str) -> None:
    """The rule holds for the whole name: a trailing newline is not a valid name either (a
    regex's ``$`` matches before one), by the single put and the batch path alike."""
    with MessageStore(tmp_path / "s", CONFIG) as store:
        for put in (store.put, lambda m: store.put_batch([m])):
            with pytest.raises(InvalidMessageError, match="topic"):
                put(Message(topic=topic, body=b"x"))
        assert store.topics() == []
