"""The tier's S3 face (pipeline/tier/objects.py) against a real radosgw (tests/kit/ceph.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.errors import (
    ObjectMismatchError,
    ObjectNotFoundError,
    PreconditionFailedError,
    TierConfigError,
    TierError,
    TierUnavailableError,
)
from rocketstore.pipeline.tier.objects import PART_SIZE, ObjectStore, content_md5, shared_store


def store_of(ceph: Any, bucket: str, *, check: bool = True, **more: Any) -> ObjectStore:
    return ObjectStore(StoreConfig().with_overrides(ceph.settings(bucket, **more)), check=check)


def test_put_get_head_list_delete(ceph: Any, bucket: str) -> None:
    s3 = store_of(ceph, bucket)
    etag = s3.put("b/x", b"hello")
    assert etag == hashlib.md5(b"hello").hexdigest()  # unquoted, the server's MD5
    assert s3.get("b/x") == (b"hello", etag)
    assert s3.head("b/x") == (5, etag)
    assert s3.head("b/none") is None
    assert s3.get_range("b/x", 1, 4) == b"ell"
    s3.put("b/y", b"12")
    s3.put("c/z", b"3")
    assert s3.list("b/") == [("b/x", 5), ("b/y", 2)]
    s3.delete(["b/x", "b/none"])
    assert s3.list("b/") == [("b/y", 2)]
    with pytest.raises(ObjectNotFoundError, match=f"s3://{bucket}/b/x"):
        s3.get("b/x")


def test_range_past_the_end_is_an_error_naming_the_object(ceph: Any, bucket: str) -> None:
    s3 = store_of(ceph, bucket)
    s3.put("k", b"0123456789")
    with pytest.raises(ObjectMismatchError, match=r"k: bytes \[8, 12\).*ends at 10"):
        s3.get_range("k", 8, 12)
    with pytest.raises(ObjectMismatchError, match=r"k: bytes \[20, 30\)"):
        s3.get_range("k", 20, 30)


def test_conditional_puts(ceph: Any, bucket: str) -> None:
    s3 = store_of(ceph, bucket)
    first = s3.put("m", b"v1", if_none_match=True)
    with pytest.raises(PreconditionFailedError, match="412"):
        s3.put("m", b"v1 again", if_none_match=True)
    second = s3.put("m", b"v2", if_match=first)
    with pytest.raises(PreconditionFailedError):
        s3.put("m", b"v3", if_match=first)  # stale
    assert s3.get("m") == (b"v2", second)
    # A quoted ETag, as some callers keep them, works too (radosgw wants it bare).
    s3.put("m", b"v4", if_match=f'"{second}"')
    assert s3.get("m")[0] == b"v4"


def test_put_file_single_and_multipart(ceph: Any, bucket: str, tmp_path: Path) -> None:
    s3 = store_of(ceph, bucket)
    path = tmp_path / "seg"
    data = os.urandom(PART_SIZE * 2 + 12345)
    path.write_bytes(data + b"\0" * 1000)  # what follows the length is not sent
    etag = s3.put_file("big", path, len(data))
    assert etag.endswith("-3")  # three parts
    assert s3.head("big") == (len(data), etag)
    got = ceph.client().get_object(Bucket=bucket, Key="big")["Body"].read()
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    small = s3.put_file("small", path, 100)
    assert small == hashlib.md5(data[:100]).hexdigest()
    with pytest.raises(ObjectMismatchError, match="the file has"):
        s3.put_file("toolong", path, len(data) + 2000)


def test_missing_bucket_is_a_clear_error_at_open(ceph: Any) -> None:
    with pytest.raises(TierConfigError, match="no such bucket") as caught:
        store_of(ceph, "no-such-bucket-here")
    assert caught.value.setting == "objectStoreBucket"
    assert "no-such-bucket-here" in str(caught.value)


def test_wrong_credentials_are_a_clear_error_at_open(ceph: Any, bucket: str) -> None:
    with pytest.raises(TierConfigError, match="access denied") as caught:
        store_of(ceph, bucket, objectStoreSecretKey="not-the-secret")
    assert caught.value.setting == "objectStoreAccessKey"
    assert bucket in str(caught.value)
    assert "not-the-secret" not in str(caught.value)


def test_credentials_from_the_environment(
    ceph: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = ceph.settings(bucket)
    for name in ("objectStoreAccessKey", "objectStoreSecretKey", "objectStoreEndpoint"):
        del settings[name]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ceph.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ceph.secret_key)
    monkeypatch.setenv("AWS_ENDPOINT_URL", ceph.endpoint)
    s3 = ObjectStore(StoreConfig().with_overrides(settings))
    assert s3.put("env", b"x") == hashlib.md5(b"x").hexdigest()


def test_shared_store_is_made_once_and_still_checks_at_open(
    ceph: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readers share one client per settings and AWS environment; an open asks the bucket
    every time, so a bucket gone since the client was made is still an error at open."""
    config = StoreConfig().with_overrides(ceph.settings(bucket))
    first = shared_store(config)
    assert shared_store(config) is first
    assert shared_store(config, check=False) is first
    assert first.put("shared", b"x") == hashlib.md5(b"x").hexdigest()
    # Another AWS environment (a profile, keys, an endpoint) is another client: here a
    # profile that does not exist, an error naming it rather than the first client.
    monkeypatch.setenv("AWS_PROFILE", "someone-else")
    with pytest.raises(TierConfigError, match="someone-else") as caught:
        shared_store(config, check=False)
    assert caught.value.setting == "AWS_PROFILE"
    monkeypatch.delenv("AWS_PROFILE")
    assert shared_store(config) is first
    # A client made without the check, for a bucket that does not exist: the check at open
    # fails as it does for a new client, naming the setting.
    missing = StoreConfig().with_overrides(ceph.settings("no-such-bucket-shared"))
    shared_store(missing, check=False)
    for _ in range(2):
        with pytest.raises(TierConfigError, match="no such bucket") as caught:
            shared_store(missing)
        assert caught.value.setting == "objectStoreBucket"


def test_an_endpoint_that_does_not_answer(bucket: str, ceph: Any) -> None:
    # A port nothing listens on: refused at once, an error naming the setting at open.
    with pytest.raises(TierConfigError, match="objectStoreEndpoint") as caught:
        store_of(ceph, bucket, objectStoreEndpoint="http://127.0.0.1:9")
    assert caught.value.setting == "objectStoreEndpoint"
    later = store_of(ceph, bucket, objectStoreEndpoint="http://127.0.0.1:9", check=False)
    with pytest.raises(TierUnavailableError, match="does not answer"):
        later.put("k", b"x")


@pytest.mark.parametrize("operation", ["PutObject", "UploadPart"])
def test_a_body_changed_on_the_way_is_refused(
    ceph: Any, bucket: str, tmp_path: Path, operation: str
) -> None:
    """Bodies go without a SHA-256 in the signature (UNSIGNED-PAYLOAD): their Content-MD5,
    which the signature covers, is what the server checks them against. A body changed after
    signing is refused; so is one whose Content-MD5 was changed to match it."""
    from botocore.exceptions import ClientError

    s3 = store_of(ceph, bucket)
    path = tmp_path / "seg"
    data = os.urandom(PART_SIZE + 1000 if operation == "UploadPart" else 5000)
    path.write_bytes(data)
    for also_md5 in (False, True):

        def tamper(request: Any, also_md5: bool = also_md5, **_: Any) -> None:
            assert request.headers["x-amz-content-sha256"] == b"UNSIGNED-PAYLOAD"
            body = request.body if isinstance(request.body, bytes) else request.body.read()
            changed = bytes([body[0] ^ 1]) + body[1:]
            request.body = changed
            if also_md5:
                request.headers["Content-MD5"] = content_md5(changed)

        s3.client.meta.events.register(f"before-send.s3.{operation}", tamper)
        with pytest.raises(TierError) as caught:
            s3.put_file(f"t{also_md5}", path, len(data))
        s3.client.meta.events.unregister(f"before-send.s3.{operation}", tamper)
        code = caught.value.__cause__
        assert isinstance(code, ClientError)
        want = "SignatureDoesNotMatch" if also_md5 else "BadDigest"
        assert code.response["Error"]["Code"] == want
        assert s3.head(f"t{also_md5}") is None
