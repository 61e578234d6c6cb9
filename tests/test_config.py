"""pipeline/config.py: defaults, TOML and broker.conf loading, validation, overrides."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest

from rocketstore.pipeline.config import ASYNC_FLUSH, SYNC_FLUSH, StoreConfig, parse_properties
from rocketstore.pipeline.engine.storehost import store_host
from rocketstore.pipeline.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- defaults ----------------------------------------------------------------------------


def test_defaults_are_rocketmq_49x() -> None:
    c = StoreConfig()
    assert c.mapped_file_size_commitlog == 1024**3 == 1_073_741_824
    assert c.mapped_file_size_consume_queue == 6_000_000 == 300_000 * 20
    assert c.max_hash_slot_num == 5_000_000
    assert c.max_index_num == 20_000_000
    assert c.flush_disk_type == ASYNC_FLUSH == "ASYNC_FLUSH"
    assert c.max_message_size == 4 * 1024 * 1024
    assert c.file_reserved_time == 72
    assert c.delete_when == "04"
    assert c.disk_max_used_space_ratio == 75
    assert c.message_index_enable is True
    assert c.flush_interval_commitlog == 500
    assert c.max_msgs_num_batch == 64
    assert c.check_crc_on_recover is True
    # Unset: a directory's records decide (rocketstore.pipeline.engine.storehost); a new one gets this host's
    # address (127.0.0.1 under the suite's pin, conftest._steady_host) and port 10911.
    assert c.broker_ip1 is None and c.listen_port is None
    assert store_host(c) == "127.0.0.1:10911"
    assert store_host(StoreConfig(listen_port=20911, listen_port_offset=20)) == "127.0.0.1:20931"
    assert c.index_file_size == 40 + 4 * 5_000_000 + 20 * 20_000_000
    assert not c.sync_flush
    assert c.ignored_keys == ()


def test_to_rocketmq_names() -> None:
    values = StoreConfig().to_rocketmq()
    assert list(values) == StoreConfig.names()
    assert values["mappedFileSizeCommitLog"] == 1073741824
    assert values["mappedFileSizeConsumeQueue"] == 6000000
    assert values["flushDiskType"] == "ASYNC_FLUSH"
    assert values["deleteWhen"] == "04"


@pytest.mark.parametrize("name", ["store.toml", "broker.conf"])
def test_repo_config_files_load_to_defaults(name: str) -> None:
    loaded = StoreConfig.load(ROOT / "conf" / name)
    assert loaded == StoreConfig()
    assert loaded.to_rocketmq() == StoreConfig().to_rocketmq()


def test_repo_toml_sets_every_setting() -> None:
    # The documented default file names every setting, so it is a full reference; a setting
    # whose default is to be unset is there commented out.
    text = (ROOT / "conf" / "store.toml").read_text()
    unset = {name for name, value in StoreConfig().to_rocketmq().items() if value is None}
    assert unset == {
        "brokerIP1",
        "listenPort",
        "objectStoreEndpoint",
        "objectStoreBucket",
        "objectStoreRegion",
        "objectStoreAccessKey",
        "objectStoreSecretKey",
        "brokerName",
    }
    for name in StoreConfig.names():
        assert f"\n{'# ' if name in unset else ''}{name} = " in text, name


def test_broker_conf_unknown_keys_are_listed() -> None:
    loaded = StoreConfig.load(ROOT / "conf" / "broker.conf")
    assert set(loaded.ignored_keys) == {"brokerClusterName", "brokerId"}


def test_load_none_and_overrides() -> None:
    assert StoreConfig.load() == StoreConfig()
    c = StoreConfig.load(None, maxIndexNum="400", flushDiskType=SYNC_FLUSH)
    assert c.max_index_num == 400
    assert c.sync_flush


def test_picklable_and_frozen() -> None:
    c = StoreConfig(max_index_num=123)
    assert pickle.loads(pickle.dumps(c)) == c
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.max_index_num = 5  # type: ignore[misc]


# -- TOML --------------------------------------------------------------------------------


def test_toml_values(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "s.toml",
        'mappedFileSizeCommitLog = 8192\nflushDiskType = "SYNC_FLUSH"\n'
        'messageIndexEnable = false\ndeleteWhen = "04;16"\nbrokerIP1 = "::1"\n',
    )
    c = StoreConfig.load(path)
    assert c.mapped_file_size_commitlog == 8192
    assert c.sync_flush
    assert c.message_index_enable is False
    assert c.delete_when == "04;16"
    assert store_host(c) == "[::1]:10911"


def test_toml_store_table(tmp_path: Path) -> None:
    path = write(tmp_path, "s.toml", "[store]\nmaxIndexNum = 400\nmaxHashSlotNum = 100\n")
    c = StoreConfig.load(path)
    assert (c.max_index_num, c.max_hash_slot_num) == (400, 100)


def test_toml_unknown_key_names_it(tmp_path: Path) -> None:
    path = write(tmp_path, "s.toml", "maxIndexNum = 400\nmappedFileSizeComitLog = 8192\n")
    with pytest.raises(ConfigError, match="mappedFileSizeComitLog"):
        StoreConfig.load(path)


def test_toml_unknown_key_in_store_table_names_it(tmp_path: Path) -> None:
    path = write(tmp_path, "s.toml", "[store]\nmaxIndexNumber = 400\n")
    with pytest.raises(ConfigError, match="maxIndexNumber"):
        StoreConfig.load(path)


def test_toml_key_beside_store_table_is_not_dropped(tmp_path: Path) -> None:
    # A top-level key next to a [store] table is either applied or refused; silently dropping
    # it would hide a typo or a setting the operator believes is in force.
    path = write(tmp_path, "s.toml", "maxIndexNum = 400\n[store]\nmaxHashSlotNum = 100\n")
    try:
        c = StoreConfig.load(path)
    except ConfigError as exc:
        assert "maxIndexNum" in str(exc)
    else:
        assert c.max_index_num == 400


def test_toml_syntax_error(tmp_path: Path) -> None:
    path = write(tmp_path, "s.toml", "maxIndexNum = = 4\n")
    with pytest.raises(ConfigError, match=r"s\.toml"):
        StoreConfig.load(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml"):
        StoreConfig.load(tmp_path / "nope.toml")


# -- validation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "setting"),
    [
        ('flushDiskType = "FAST"', "flushDiskType"),
        ("mappedFileSizeConsumeQueue = 6010", "mappedFileSizeConsumeQueue"),
        ("mappedFileSizeConsumeQueue = 10", "mappedFileSizeConsumeQueue"),
        ('maxIndexNum = "many"', "maxIndexNum"),
        ("maxIndexNum = 1.5", "maxIndexNum"),
        ("maxIndexNum = true", "maxIndexNum"),
        ("maxIndexNum = 1", "maxIndexNum"),
        ("mappedFileSizeCommitLog = 4095", "mappedFileSizeCommitLog"),
        ("mappedFileSizeCommitLog = 2147483648", "mappedFileSizeCommitLog"),
        ('messageIndexEnable = "maybe"', "messageIndexEnable"),
        ('deleteWhen = "25"', "deleteWhen"),
        ("diskMaxUsedSpaceRatio = 96", "diskMaxUsedSpaceRatio"),
        ("listenPort = 0", "listenPort"),
        ('brokerIP1 = "localhost"', "brokerIP1"),
    ],
)
def test_bad_toml_values_name_the_setting(tmp_path: Path, text: str, setting: str) -> None:
    path = write(tmp_path, "s.toml", text + "\n")
    with pytest.raises(ConfigError, match=setting):
        StoreConfig.load(path)


@pytest.mark.parametrize(
    ("line", "setting"),
    [
        ("flushDiskType=FAST", "flushDiskType"),
        ("mappedFileSizeConsumeQueue=6000001", "mappedFileSizeConsumeQueue"),
        ("maxHashSlotNum=12abc", "maxHashSlotNum"),
        ("maxMessageSize=4.5", "maxMessageSize"),
    ],
)
def test_bad_properties_values_name_the_setting(tmp_path: Path, line: str, setting: str) -> None:
    path = write(tmp_path, "broker.conf", f"brokerName=a\n{line}\n")
    with pytest.raises(ConfigError, match=setting):
        StoreConfig.load(path)


def test_constructor_validates() -> None:
    with pytest.raises(ConfigError, match="mappedFileSizeConsumeQueue"):
        StoreConfig(mapped_file_size_consume_queue=30)
    with pytest.raises(ConfigError, match="flushDiskType"):
        StoreConfig(flush_disk_type="FAST")


# -- broker.conf / properties --------------------------------------------------------------


def test_broker_conf_with_unknown_keys(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "broker.conf",
        "brokerClusterName=DefaultCluster\nnamesrvAddr=127.0.0.1:9876\n"
        "maxIndexNum=400\nautoCreateTopicEnable=true\n",
    )
    c = StoreConfig.load(path)
    assert c.max_index_num == 400
    assert c.ignored_keys == ("brokerClusterName", "namesrvAddr", "autoCreateTopicEnable")


def test_properties_syntax() -> None:
    text = "\n".join(
        [
            "# a comment",
            "! another comment",
            "   # indented comment",
            "",
            "a=1",
            "b = 2 ",
            "c: 3",
            "d 4",
            "e\t5",
            "f:",
            "g",
            "h=x=y",
            "  i = spaced  ",
            "long = one, \\",
            "    two, \\",
            "    three",
            "after = 9",
            "notcomment = a#b",
        ]
    )
    assert parse_properties(text) == {
        "a": "1",
        "b": "2",
        "c": "3",
        "d": "4",
        "e": "5",
        "f": "",
        "g": "",
        "h": "x=y",
        "i": "spaced",
        "long": "one, two, three",
        "after": "9",
        "notcomment": "a#b",
    }


def test_properties_comment_inside_continuation_is_data() -> None:
    assert parse_properties("k = a\\\n  #b\n") == {"k": "a#b"}


def test_properties_escaped_backslash_is_not_a_continuation() -> None:
    assert parse_properties("k = a\\\\\nj = 2\n") == {"k": "a\\\\", "j": "2"}


def test_properties_unterminated_continuation() -> None:
    with pytest.raises(ConfigError, match=r"origin\.conf"):
        parse_properties("k = a\\", "origin.conf")


def test_properties_space_separated_value_with_colon() -> None:
    # Java's Properties: the key ends at the first '=', ':' or blank; the rest is the value.
    assert parse_properties("namesrvAddr 127.0.0.1:9876\n") == {"namesrvAddr": "127.0.0.1:9876"}
    assert parse_properties("brokerIP1 fe80::1\n") == {"brokerIP1": "fe80::1"}


def test_broker_conf_space_separated_ipv6_broker_ip(tmp_path: Path) -> None:
    path = write(tmp_path, "broker.conf", "brokerIP1 fe80::1\nlistenPort 10911\n")
    c = StoreConfig.load(path)
    assert c.broker_ip1 == "fe80::1"
    assert c.ignored_keys == ()


def test_broker_conf_separators(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "broker.conf",
        "maxIndexNum 400\nmaxHashSlotNum: 100\n# maxMessageSize=1\nfileReservedTime = \\\n  48\n",
    )
    c = StoreConfig.load(path)
    assert c.max_index_num == 400
    assert c.max_hash_slot_num == 100
    assert c.max_message_size == 4 * 1024 * 1024
    assert c.file_reserved_time == 48


# -- overrides ---------------------------------------------------------------------------


def test_with_overrides_accepts_lower_cased_names() -> None:
    c = StoreConfig().with_overrides(
        {
            "mappedfilesizecommitlog": "8192",
            "MAXINDEXNUM": 400,
            "flushdisktype": "SYNC_FLUSH",
            "messageindexenable": "false",
            "brokerip1": "10.0.0.1",
        }
    )
    assert c.mapped_file_size_commitlog == 8192
    assert c.max_index_num == 400
    assert c.sync_flush
    assert c.message_index_enable is False
    assert c.broker_ip1 == "10.0.0.1"


def test_with_overrides_strict_and_lenient() -> None:
    with pytest.raises(ConfigError, match="noSuchSetting"):
        StoreConfig().with_overrides({"noSuchSetting": "1"})
    c = StoreConfig().with_overrides({"noSuchSetting": "1", "maxindexnum": "9"}, strict=False)
    assert c.ignored_keys == ("noSuchSetting",)
    assert c.max_index_num == 9
    # ignored keys do not take part in equality
    assert c == StoreConfig(max_index_num=9)


def test_with_overrides_does_not_change_original() -> None:
    base = StoreConfig()
    base.with_overrides({"maxIndexNum": "9"})
    assert base.max_index_num == 20_000_000


@pytest.mark.parametrize("text", ["true", "TRUE", "1", "yes", " True "])
def test_bool_strings_true(text: str) -> None:
    assert StoreConfig().with_overrides({"checkCRCOnRecover": text}).check_crc_on_recover is True


@pytest.mark.parametrize("text", ["false", "False", "0", "no"])
def test_bool_strings_false(text: str) -> None:
    c = StoreConfig().with_overrides({"checkCRCOnRecover": text})
    assert c.check_crc_on_recover is False
