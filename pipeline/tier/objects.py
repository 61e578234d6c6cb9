"""The tier's one face of S3: every request the tier makes to its bucket goes through here.

:class:`ObjectStore` is made from the store's settings (:mod:`rocketstore.pipeline.config`)
over boto3, with the standard AWS chain behind every setting left unset: credentials from
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE`` and ``~/.aws``, the endpoint
from ``AWS_ENDPOINT_URL``, the region from ``AWS_REGION``; a setting given wins. Addressing is
path-style (``endpoint/bucket/key``), which radosgw and MinIO serve without DNS per bucket.

Conventions, so that callers need know nothing of boto3:

* ETags are returned **unquoted**, and ``if_match`` takes one unquoted: radosgw compares
  ``If-Match`` against the bare ETag (a quoted one always loses), and AWS accepts both.
* Every body goes with its ``Content-MD5``, which the server verifies (a body changed on the
  way is refused, never stored). radosgw 16.2 ignores the newer ``x-amz-checksum-sha256``
  (a wrong one is accepted), so the SHA-256 the manifest records is computed here, from the
  bytes sent, and confirmation after an upload is by size and the ETag, the server's own MD5
  of what it stored (of the parts' MD5s for a multipart object: :func:`multipart_etag`).
* Errors are :class:`~rocketstore.pipeline.errors.TierError`\\ s naming the bucket and key:
  a 412 is :class:`PreconditionFailedError`, a missing key :class:`ObjectNotFoundError`, a
  server that does not answer (after boto3's retries) :class:`TierUnavailableError`, and
  wrong credentials, a missing bucket or an endpoint that does not answer at open
  :class:`TierConfigError` naming the setting to fix.

boto3 is imported when an :class:`ObjectStore` is made (only with the tier on), so a store
without the tier needs no boto3 (the ``tier`` extra).

Owns: one boto3 client (readers share one per settings and AWS environment:
:func:`shared_store`). Thread-safety: safe; boto3's clients are, and the one other thing
shared, the budget of part bodies in memory (:data:`PARTS_IN_MEMORY`), is a semaphore. Crash
behaviour: a PUT is atomic on the server (the object is the old one or the new one); a
multipart upload that dies leaves no object, only parts the bucket's lifecycle or
:meth:`ObjectStore.abort_uploads` removes. Requires: a bucket that exists.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from rocketstore.pipeline.config import StoreConfig
from rocketstore.pipeline.errors import (
    ObjectMismatchError,
    ObjectNotFoundError,
    PreconditionFailedError,
    TierConfigError,
    TierError,
    TierUnavailableError,
)
from rocketstore.pipeline.extras import check_dependencies

# Multipart from this size on, in parts of this size: radosgw's and AWS's minimum part is
# 5 MiB; 16 MiB parts were the fastest measured here (../shared/ceph/README.md: 140-200 MB/s).
PART_SIZE = 16 * 1024 * 1024
# Parts sent at once by one put_file.
PART_THREADS = 4
# Part bodies in memory at once for all the put_files of one ObjectStore together (several
# segments uploaded at once share them): 8 x 16 MiB, whatever tieredStoreUploadThreads says.
PARTS_IN_MEMORY = 8
# DeleteObjects takes at most this many keys a request.
_DELETE_BATCH = 1000
# What a server that does not answer costs before an error: each attempt waits this long to
# connect, and boto3's standard mode tries this many times with backoff.
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 60
MAX_ATTEMPTS = 3

T = TypeVar("T")


@dataclass(frozen=True)
class Target:
    """Where the tier's objects go, resolved from the settings (for messages and clients)."""

    bucket: str
    endpoint: str | None
    region: str | None

    def url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}"


def content_md5(data: bytes | memoryview, digest: bytes | None = None) -> str:
    """The ``Content-MD5`` header of a body: base64 of its MD5 (``digest``, when the caller
    has it already: every pass over the bytes is CPU the upload's throughput pays)."""
    return base64.b64encode(digest if digest is not None else hashlib.md5(data).digest()).decode()


def multipart_etag(part_md5s: list[bytes]) -> str:
    """The ETag S3 gives an object completed from parts with these MD5 digests: the MD5 of
    their concatenation, ``-`` and the number of parts."""
    return f"{hashlib.md5(b''.join(part_md5s)).hexdigest()}-{len(part_md5s)}"


# The AWS chain's inputs that a boto3 client reads when it is made: a shared client made
# under other values of these is not the one the caller's environment asks for.
_CHAIN_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
)
_shared: dict[tuple[str | int | None, ...], ObjectStore] = {}
_shared_lock = threading.Lock()


def shared_store(config: StoreConfig, *, check: bool = True) -> ObjectStore:
    """This process's :class:`ObjectStore` for the bucket ``config`` names, made once per
    settings and AWS environment and shared by the readers (a boto3 client takes 0.1-0.4 s
    of CPU to make here: every batch read or query start paid it, and a cold read of a few
    seconds lost a tenth of its time to it). ``check`` asks the bucket again (one HEAD), so
    an open still fails at once, naming the setting, whatever was cached. Not for uploads:
    an :class:`Uploader` keeps its own, whose part budget it does not share with readers."""
    key = (
        config.object_store_bucket,
        config.object_store_endpoint,
        config.object_store_region,
        config.object_store_access_key,
        config.object_store_secret_key,
        config.tiered_store_upload_threads,
        *(os.environ.get(name) for name in _CHAIN_ENV),
    )
    with _shared_lock:
        got = _shared.get(key)
        if got is None:
            got = _shared[key] = ObjectStore(config, check=False)
    if check:
        got.check()
    return got


def _unquote(etag: str) -> str:
    return etag.strip('"')


class ObjectStore:
    """The bucket named by ``config`` (see the module docstring). Made with ``check`` (the
    default), the bucket is asked for once (a HEAD) so that wrong credentials, a missing
    bucket or an endpoint that does not answer are a :class:`TierConfigError` now, naming
    the setting, rather than at the first upload."""

    def __init__(self, config: StoreConfig, *, check: bool = True) -> None:
        if not config.object_store_bucket:
            raise TierConfigError(
                "objectStoreBucket is not set: the tier needs a bucket",
                "",
                "objectStoreBucket",
            )
        check_dependencies(
            ("boto3",),
            "tieredStorageLevel needs the 'tier' extra: pip install 'rocketstore[tier]'",
        )
        import boto3
        from botocore.config import Config
        from botocore.exceptions import ProfileNotFound

        try:
            session = boto3.session.Session(
                aws_access_key_id=config.object_store_access_key,
                aws_secret_access_key=config.object_store_secret_key,
                region_name=config.object_store_region,
            )
        except ProfileNotFound as exc:
            raise TierConfigError(
                f"{exc}: set AWS_PROFILE to a profile of ~/.aws/config (or AWS_CONFIG_FILE), "
                "or unset it and give objectStoreAccessKey/objectStoreSecretKey",
                config.object_store_bucket,
                "AWS_PROFILE",
            ) from exc
        self.client: Any = session.client(
            "s3",
            endpoint_url=config.object_store_endpoint,
            config=Config(
                # No SHA-256 of each body for the signature, and no CRC32 of it either: the
                # Content-MD5 every body carries is a signed header the server checks the
                # body against, so these passes (botocore makes them over http) add CPU
                # per byte and no check.
                s3={"addressing_style": "path", "payload_signing_enabled": False},
                request_checksum_calculation="when_required",
                connect_timeout=CONNECT_TIMEOUT_S,
                read_timeout=READ_TIMEOUT_S,
                retries={"mode": "standard", "max_attempts": MAX_ATTEMPTS},
                # Every part in flight and each segment upload's own requests (HEADs, the
                # index) have a connection: none is opened and dropped for want of one.
                max_pool_connections=PARTS_IN_MEMORY + config.tiered_store_upload_threads + 2,
            ),
        )
        self._parts = threading.BoundedSemaphore(PARTS_IN_MEMORY)
        self.target = Target(
            config.object_store_bucket, self.client.meta.endpoint_url, session.region_name
        )
        self.bucket = config.object_store_bucket
        if check:
            self.check()

    # -- open -------------------------------------------------------------------------------
    def check(self) -> None:
        """HEAD the bucket: :class:`TierConfigError` naming the setting when it cannot be used."""
        from botocore.exceptions import ClientError

        where = f"bucket {self.bucket!r} at {self.target.endpoint}"
        try:
            self._call("", lambda: self.client.head_bucket(Bucket=self.bucket), at_open=True)
        except TierConfigError:
            raise
        except TierError as exc:
            cause = exc.__cause__
            status = _status(cause) if isinstance(cause, ClientError) else None
            if status == 404:
                raise TierConfigError(
                    f"{where}: no such bucket; create it, or set objectStoreBucket to one "
                    "that exists",
                    self.bucket,
                    "objectStoreBucket",
                ) from exc
            if status in (401, 403):
                raise TierConfigError(
                    f"{where}: access denied (HTTP {status}): wrong credentials, or none for "
                    "this bucket; check objectStoreAccessKey/objectStoreSecretKey, or "
                    "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE",
                    self.bucket,
                    "objectStoreAccessKey",
                ) from exc
            raise

    # -- reads ------------------------------------------------------------------------------
    def get(self, key: str) -> tuple[bytes, str]:
        """The object's body and its ETag (unquoted)."""

        def call() -> tuple[bytes, str]:
            r = self.client.get_object(Bucket=self.bucket, Key=key)
            return r["Body"].read(), _unquote(r["ETag"])

        return self._call(key, call)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object: exactly ``end - start`` of them, or
        :class:`ObjectMismatchError` (the object is shorter)."""
        if end <= start:
            return b""

        def call() -> bytes:
            r = self.client.get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end - 1}"
            )
            body: bytes = r["Body"].read()
            return body

        try:
            body = self._call(key, call)
        except TierError as exc:
            if _status(exc.__cause__) == 416:
                raise ObjectMismatchError(
                    f"{self.target.url(key)}: bytes [{start}, {end}) asked for, the object ends "
                    "before them",
                    self.bucket,
                    key,
                ) from exc
            raise
        if len(body) != end - start:
            raise ObjectMismatchError(
                f"{self.target.url(key)}: bytes [{start}, {end}) asked for, "
                f"{len(body)} returned (the object ends at {start + len(body)})",
                self.bucket,
                key,
            )
        return body

    def head(self, key: str) -> tuple[int, str] | None:
        """(size, ETag unquoted) of the object, or None when there is none."""

        def call() -> tuple[int, str] | None:
            r = self.client.head_object(Bucket=self.bucket, Key=key)
            return int(r["ContentLength"]), _unquote(r["ETag"])

        try:
            return self._call(key, call)
        except ObjectNotFoundError:
            return None

    def list_dirs(self, prefix: str) -> list[str]:
        """The "folders" right under ``prefix``: each distinct key part up to the next ``/``
        (ending with it), in key order; one request per 1,000 of them, however many objects
        each holds."""

        def call() -> list[str]:
            out: list[str] = []
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix, Delimiter="/"
            )
            for page in pages:
                out.extend(p["Prefix"] for p in page.get("CommonPrefixes", ()))
            return out

        return self._call(prefix, call)

    def list(self, prefix: str, *, until: str | None = None) -> list[tuple[str, int]]:
        """(key, size) of every object whose key starts with ``prefix``, in key order;
        with ``until``, only the keys before it (the listing stops there: S3 lists in key
        order, so the keys of old segments cost no page of the newer ones)."""

        def call() -> list[tuple[str, int]]:
            out: list[tuple[str, int]] = []
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix
            )
            for page in pages:
                for o in page.get("Contents", ()):
                    if until is not None and o["Key"] >= until:
                        return out
                    out.append((o["Key"], int(o["Size"])))
            return out

        return self._call(prefix, call)

    # -- writes -----------------------------------------------------------------------------
    def put(
        self,
        key: str,
        body: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
        md5: bytes | None = None,
    ) -> str:
        """Write the object whole; returns its ETag (unquoted). ``if_none_match``: only if no
        object has the key; ``if_match``: only if the object's ETag is this one. Losing
        either is :class:`PreconditionFailedError`. ``md5``: the body's MD5, when known."""
        extra: dict[str, str] = {}
        if if_none_match:
            extra["IfNoneMatch"] = "*"
        if if_match is not None:
            extra["IfMatch"] = _unquote(if_match)

        def call() -> str:
            r = self.client.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=body,
                ContentMD5=content_md5(body, md5),
                **extra,
            )
            return _unquote(r["ETag"])

        return self._call(key, call)

    def put_file(self, key: str, path: str | Path, length: int) -> str:
        """Upload bytes ``[0, length)`` of the file at ``path`` as the object; returns its
        ETag (unquoted). From :data:`PART_SIZE` on it is a multipart upload of parts that
        size, :data:`PART_THREADS` at a time; a failure aborts it (no object, no parts left
        behind). The ETag returned is the one the server gave, checked against the one the
        bytes sent must have (:class:`ObjectMismatchError` otherwise)."""
        return self.put_file_hashed(key, path, length)[0]

    def put_file_hashed(
        self, key: str, path: str | Path, length: int, *, sha256: Any = None
    ) -> tuple[str, str]:
        """:meth:`put_file`, feeding the bytes sent to ``sha256`` (a ``hashlib`` object) in
        order as well; returns (ETag, the ETag those bytes must have)."""
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size < length:
                raise ObjectMismatchError(
                    f"{path}: {length} bytes to upload to {self.target.url(key)}, the file "
                    f"has {size}",
                    self.bucket,
                    key,
                )
            if length < PART_SIZE:
                with self._parts:
                    body = _pread_exact(fd, 0, length, path)
                    if sha256 is not None:
                        sha256.update(body)
                    digest = hashlib.md5(body).digest()
                    expected = digest.hex()
                    etag = self.put(key, body, md5=digest)
                    del body
            else:
                etag, expected = self._multipart(key, fd, path, length, sha256)
        finally:
            os.close(fd)
        if etag != expected:
            raise ObjectMismatchError(
                f"{self.target.url(key)}: stored with ETag {etag}, the bytes of {path} sent "
                f"have {expected}",
                self.bucket,
                key,
            )
        return etag, expected

    def _multipart(
        self, key: str, fd: int, path: str | Path, length: int, sha256: Any
    ) -> tuple[str, str]:
        from concurrent.futures import ThreadPoolExecutor

        upload_id: str = self._call(
            key,
            lambda: self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"],
        )
        starts = range(0, length, PART_SIZE)

        def send(number: int, body: bytes, md5: bytes) -> str:
            def call() -> str:
                r = self.client.upload_part(
                    Bucket=self.bucket,
                    Key=key,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=body,
                    ContentMD5=content_md5(body, md5),
                )
                return _unquote(r["ETag"])

            try:
                return self._call(key, call)
            finally:
                self._parts.release()  # taken when the body was read

        try:
            md5s: list[bytes] = []
            with ThreadPoolExecutor(PART_THREADS) as pool:
                futures = []
                for number, start in enumerate(starts, 1):
                    # Read in order (the SHA-256 is of the whole) and bound what is in flight:
                    # at most PART_THREADS parts beyond those sent, and PARTS_IN_MEMORY
                    # bodies for every upload of this client together (released by send).
                    self._parts.acquire()
                    try:
                        body = _pread_exact(fd, start, min(PART_SIZE, length - start), path)
                        if sha256 is not None:
                            sha256.update(body)
                        md5s.append(hashlib.md5(body).digest())
                        futures.append(pool.submit(send, number, body, md5s[-1]))
                    except BaseException:
                        self._parts.release()
                        raise
                    del body
                    if len(futures) > PART_THREADS:
                        futures[-PART_THREADS - 1].result()
                etags = [f.result() for f in futures]
            for number, (etag, md5) in enumerate(zip(etags, md5s, strict=True), 1):
                if etag != md5.hex():
                    raise ObjectMismatchError(
                        f"{self.target.url(key)}: part {number} stored with ETag {etag}, the "
                        f"bytes sent have {md5.hex()}",
                        self.bucket,
                        key,
                    )
            parts = [{"ETag": e, "PartNumber": n} for n, e in enumerate(etags, 1)]
            done = self._call(
                key,
                lambda: self.client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                ),
            )
        except BaseException:
            # The first error is the one to report; an abort that fails too leaves parts the
            # next upload's abort_uploads removes.
            with contextlib.suppress(Exception):
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            raise
        etag = _unquote(done.get("ETag") or "")
        if not etag:
            # radosgw 16.2 answers CompleteMultipartUpload with an empty ETag: ask for it.
            got = self.head(key)
            etag = got[1] if got is not None else ""
        return etag, multipart_etag(md5s)

    def delete(self, keys: Iterable[str]) -> None:
        """Delete the objects (a key with no object is not an error)."""
        todo = list(keys)
        for at in range(0, len(todo), _DELETE_BATCH):
            batch = todo[at : at + _DELETE_BATCH]

            def call(batch: list[str] = batch) -> Any:
                return self.client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                )

            r = self._call(batch[0], call)
            errors = r.get("Errors") or []
            if errors:
                first = errors[0]
                raise TierError(
                    f"{self.target.url(first.get('Key', ''))}: delete failed: "
                    f"{first.get('Code')} {first.get('Message')} ({len(errors)} keys failed)",
                    self.bucket,
                    str(first.get("Key", "")),
                )

    def abort_uploads(self, prefix: str) -> int:
        """Abort the multipart uploads under ``prefix`` that never completed (an uploader
        killed in the middle of one); returns how many."""

        def call() -> int:
            r = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=prefix)
            uploads = r.get("Uploads", [])
            for u in uploads:
                self.client.abort_multipart_upload(
                    Bucket=self.bucket, Key=u["Key"], UploadId=u["UploadId"]
                )
            return len(uploads)

        return self._call(prefix, call)

    # -- errors -----------------------------------------------------------------------------
    def _call(self, key: str, call: Callable[[], T], *, at_open: bool = False) -> T:
        """``call()``, its boto3 errors turned into :class:`TierError`\\ s naming the key."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionError,
            NoCredentialsError,
            ParamValidationError,
        )

        try:
            return call()
        except ClientError as exc:
            self._client_error(key, exc)
        except NoCredentialsError as exc:
            raise TierConfigError(
                f"{self.target.url(key)}: no credentials found: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE (~/.aws/credentials), or "
                "objectStoreAccessKey/objectStoreSecretKey",
                self.bucket,
                "objectStoreAccessKey",
            ) from exc
        except ConnectionError as exc:
            message = (
                f"{self.target.url(key)}: the object store at {self.target.endpoint} does not "
                f"answer ({exc})"
            )
            if at_open:
                raise TierConfigError(
                    message + "; check objectStoreEndpoint (or AWS_ENDPOINT_URL)",
                    self.bucket,
                    "objectStoreEndpoint",
                ) from exc
            raise TierUnavailableError(message, self.bucket, key) from exc
        except (BotoCoreError, ParamValidationError) as exc:
            raise TierError(f"{self.target.url(key)}: {exc}", self.bucket, key) from exc

    def _client_error(self, key: str, exc: Any) -> NoReturn:
        status = _status(exc)
        code = str(exc.response.get("Error", {}).get("Code", status))
        url = self.target.url(key)
        if status == 412 or code == "PreconditionFailed":
            raise PreconditionFailedError(
                f"{url}: a conditional write lost (HTTP 412): the object changed since it "
                "was read, or exists already",
                self.bucket,
                key,
            ) from exc
        if code in ("NoSuchKey", "404") and key:
            raise ObjectNotFoundError(f"{url}: no such object", self.bucket, key) from exc
        if code == "NoSuchBucket":
            raise TierConfigError(
                f"{url}: no such bucket; set objectStoreBucket to one that exists",
                self.bucket,
                "objectStoreBucket",
            ) from exc
        if status is not None and status >= 500:
            raise TierUnavailableError(
                f"{url}: the object store failed (HTTP {status} {code})", self.bucket, key
            ) from exc
        raise TierError(f"{url}: HTTP {status} {code}", self.bucket, key) from exc


def _status(exc: object) -> int | None:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status is not None else None


def _pread_exact(fd: int, start: int, n: int, path: str | Path) -> bytes:
    data = os.pread(fd, n, start)
    if len(data) != n:
        raise TierError(f"{path}: {n} bytes at {start} asked for, {len(data)} read")
    return data
