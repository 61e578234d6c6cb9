"""The tier's settings (docs/tiering.md#settings): defaults, files, and errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.errors import ConfigError


def test_defaults_leave_the_tier_off() -> None:
    c = StoreConfig()
    assert c.tiered_storage_level == "DISABLE"
    assert not c.tier_on
    assert c.tiered_store_group_commit_timeout == 60000
    assert c.tiered_store_file_reserved_time == 72
    assert c.tiered_store_upload_threads == 4
    assert c.object_store_prefix == ""
    assert c.object_store_bucket is None and c.broker_name is None


def test_toml_and_properties_set_the_tier(tmp_path: Path) -> None:
    toml = tmp_path / "s.toml"
    toml.write_text(
        'tieredStorageLevel = "NOT_IN_DISK"\nobjectStoreBucket = "b1"\n'
        'objectStoreEndpoint = "http://127.0.0.1:7480"\nobjectStorePrefix = "p/"\n'
        'brokerName = "broker-a"\ntieredStoreGroupCommitTimeout = 5000\n'
    )
    c = StoreConfig.load(toml)
    assert c.tier_on
    assert (c.object_store_bucket, c.object_store_prefix, c.broker_name) == ("b1", "p/", "broker-a")
    assert c.object_store_endpoint == "http://127.0.0.1:7480"
    assert c.tiered_store_group_commit_timeout == 5000
    props = tmp_path / "broker.conf"
    props.write_text("tieredStorageLevel=NOT_IN_DISK\nobjectStoreBucket=b2\nbrokerName=x\n")
    p = StoreConfig.load(props)
    assert p.tier_on and p.object_store_bucket == "b2" and p.broker_name == "x"


@pytest.mark.parametrize(
    ("values", "setting", "what"),
    [
        ({"tieredStorageLevel": "ALWAYS"}, "tieredStorageLevel", "DISABLE, NOT_IN_DISK"),
        ({"tieredStorageLevel": "NOT_IN_DISK"}, "objectStoreBucket", "required"),
        ({"tieredStoreGroupCommitTimeout": 0}, "tieredStoreGroupCommitTimeout", ">= 1 ms"),
        ({"tieredStoreFileReservedTime": -1}, "tieredStoreFileReservedTime", ">= 0"),
        ({"tieredStoreUploadThreads": 0}, "tieredStoreUploadThreads", "from 1 to 16"),
        ({"tieredStoreUploadThreads": 17}, "tieredStoreUploadThreads", "from 1 to 16"),
        ({"brokerName": "a/b"}, "brokerName", "without '/'"),
        ({"brokerName": ""}, "brokerName", "non-empty"),
        ({"objectStorePrefix": "/abs"}, "objectStorePrefix", "must not start"),
        ({"objectStoreEndpoint": "127.0.0.1:7480"}, "objectStoreEndpoint", "http"),
        ({"objectStoreAccessKey": "AK"}, "objectStoreAccessKey", "together"),
        ({"tieredStoreGroupCommitTimeout": "soon"}, "tieredStoreGroupCommitTimeout", "integer"),
    ],
)
def test_bad_tier_values_name_the_setting(
    values: dict[str, object], setting: str, what: str
) -> None:
    with pytest.raises(ConfigError, match=setting) as caught:
        StoreConfig().with_overrides(values)
    assert what in str(caught.value)


def test_a_secret_is_never_in_an_error() -> None:
    with pytest.raises(ConfigError) as caught:
        StoreConfig().with_overrides({"objectStoreSecretKey": "s3cr3t-value"})
    assert "s3cr3t-value" not in str(caught.value)


def test_config_command_masks_the_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rocketstore.pipeline import cli

    conf = tmp_path / "s.toml"
    conf.write_text('objectStoreAccessKey = "AKID"\nobjectStoreSecretKey = "s3cr3t-value"\n')
    for extra in ([], ["--json"]):
        assert cli.main(["config", "--config", str(conf), *extra]) == 0
        out = capsys.readouterr().out
        assert "s3cr3t-value" not in out and "AKID" in out and "***" in out
