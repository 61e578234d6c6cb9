"""The S3 clients under test, one class each over a common face, and the worker that runs one
operation of the ``s3clients`` part in a process of its own (``python -m bench.s3clients_ops
JSON``), printing what it measured as one JSON line on stdout.

A process per operation keeps the figures apart: the peak resident memory of an upload is that
upload's (plus the interpreter and the client's imports, reported beside it), CPU time is the
process's own, and no client's threads, pools or event loop linger into another's figure.

Clients (``NAMES``): ``boto3`` (botocore and s3transfer), ``obstore`` (Rust ``object_store``),
``pyarrow`` (``pyarrow.fs.S3FileSystem``, the AWS C++ SDK), ``s3fs`` (fsspec over aiobotocore,
optional: it pins botocore) and ``raw``: ``http.client`` with botocore's SigV4 signer and one
keep-alive connection per thread, the floor a Python client can reach (GETs only).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import http.client
import importlib
import json
import mmap
import os
import random
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

NAMES = ("boto3", "obstore", "pyarrow", "s3fs", "raw")
# What each client needs importable (the module a missing install shows up as).
MODULES = {
    "boto3": "boto3",
    "obstore": "obstore",
    "pyarrow": "pyarrow.fs",
    "s3fs": "s3fs",
    "raw": "botocore.auth",
}
MiB = 1 << 20
# One setting for every client that has the knob: parts of 16 MiB, 4 in flight.
PART = 16 * MiB
PART_CONCURRENCY = 4
# Connections a client may keep open: above the highest concurrency measured (32).
POOL = 64


@dataclasses.dataclass(frozen=True)
class Endpoint:
    url: str
    region: str
    access_key: str
    secret_key: str
    bucket: str


class Client:
    """The common face. ``get_range`` returns the bytes (any buffer) of ``[start, start+n)``."""

    name = "?"

    def upload_file(self, path: str, key: str) -> None:
        raise NotImplementedError(f"{self.name}: no upload")

    def put_bytes(self, key: str, data: bytes) -> None:
        raise NotImplementedError(f"{self.name}: no put")

    def get_range(self, key: str, start: int, n: int) -> Any:
        raise NotImplementedError

    # Conditional writes: the ETag as the client returns it (quotes and all).
    def put_create(self, key: str, data: bytes) -> str:
        raise NotImplementedError(f"{self.name}: no If-None-Match on PutObject")

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        raise NotImplementedError(f"{self.name}: no If-Match on PutObject")

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        raise NotImplementedError

    def is_precondition_failed(self, exc: BaseException) -> bool:
        return False

    def close(self) -> None:
        pass


class Boto3Client(Client):
    name = "boto3"

    def __init__(self, ep: Endpoint, keys: bool = True, endpoint: bool = True) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        # Path-style addressing: an IP endpoint gets it anyway, a named one needs it said.
        config = Config(s3={"addressing_style": "path"}, max_pool_connections=POOL)
        kwargs: dict[str, Any] = {"endpoint_url": ep.url} if endpoint else {}
        if keys:
            kwargs.update(
                region_name=ep.region,
                aws_access_key_id=ep.access_key,
                aws_secret_access_key=ep.secret_key,
            )
        self.s3 = boto3.client("s3", config=config, **kwargs)
        self.bucket = ep.bucket
        self.endpoint_url = str(self.s3.meta.endpoint_url)
        self.transfer = TransferConfig(
            multipart_threshold=PART, multipart_chunksize=PART, max_concurrency=PART_CONCURRENCY
        )

    def upload_file(self, path: str, key: str) -> None:
        self.s3.upload_file(path, self.bucket, key, Config=self.transfer)

    def put_bytes(self, key: str, data: bytes) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=data)

    def get_range(self, key: str, start: int, n: int) -> Any:
        r = self.s3.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{start + n - 1}")
        return r["Body"].read()

    def put_create(self, key: str, data: bytes) -> str:
        r = self.s3.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
        return str(r["ETag"])

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        r = self.s3.put_object(Bucket=self.bucket, Key=key, Body=data, IfMatch=etag)
        return str(r["ETag"])

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        r = self.s3.get_object(Bucket=self.bucket, Key=key)
        return r["Body"].read(), str(r["ETag"])

    def is_precondition_failed(self, exc: BaseException) -> bool:
        from botocore.exceptions import ClientError

        return (
            isinstance(exc, ClientError) and exc.response["Error"]["Code"] == "PreconditionFailed"
        )


class ObstoreClient(Client):
    name = "obstore"

    def __init__(
        self, ep: Endpoint, keys: bool = True, endpoint: bool = True, provider: Any = None
    ) -> None:
        from obstore.store import S3Store

        # What is not given comes from object_store's reading of the AWS_* variables (no
        # profiles), or from ``provider`` (obstore.auth.boto3: boto3's whole chain).
        kwargs: dict[str, Any] = {}
        if endpoint:
            kwargs.update(endpoint=ep.url, virtual_hosted_style_request=False)
        if keys:
            kwargs.update(
                region=ep.region, access_key_id=ep.access_key, secret_access_key=ep.secret_key
            )
        self.store = S3Store(
            ep.bucket,
            credential_provider=provider,
            client_options={"allow_http": True, "pool_max_idle_per_host": str(POOL)},
            **kwargs,
        )
        self.endpoint_url = ep.url if endpoint else ""  # unknown until a request

    def upload_file(self, path: str, key: str) -> None:
        import obstore

        obstore.put(self.store, key, Path(path), chunk_size=PART, max_concurrency=PART_CONCURRENCY)

    def put_bytes(self, key: str, data: bytes) -> None:
        import obstore

        obstore.put(self.store, key, data, use_multipart=False)

    def get_range(self, key: str, start: int, n: int) -> Any:
        import obstore

        return obstore.get_range(self.store, key, start=start, length=n)

    def put_create(self, key: str, data: bytes) -> str:
        import obstore

        return str(obstore.put(self.store, key, data, mode="create")["e_tag"])

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        import obstore

        return str(obstore.put(self.store, key, data, mode={"e_tag": etag})["e_tag"])

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        import obstore

        r = obstore.get(self.store, key)
        return bytes(r.bytes()), str(r.meta["e_tag"])

    def is_precondition_failed(self, exc: BaseException) -> bool:
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        return isinstance(exc, AlreadyExistsError | PreconditionError)


class PyarrowClient(Client):
    name = "pyarrow"

    def __init__(self, ep: Endpoint, keys: bool = True, endpoint: bool = True) -> None:
        import pyarrow.fs as pafs

        # allow_delayed_open: a small file is one PutObject at close; without it every output
        # stream is a multipart upload (create, part, complete), 4 MiB included.
        kwargs: dict[str, Any] = {"endpoint_override": ep.url} if endpoint else {}
        if keys:
            kwargs.update(access_key=ep.access_key, secret_key=ep.secret_key, region=ep.region)
        self.fs = pafs.S3FileSystem(allow_delayed_open=True, **kwargs)
        self.bucket = ep.bucket
        # The options it will use (it reads no endpoint from the environment or a profile).
        self.endpoint_url = str(self.fs.__reduce__()[1][0]["endpoint_override"])
        self.files: dict[str, Any] = {}
        self.lock = threading.Lock()

    def upload_file(self, path: str, key: str) -> None:
        buf = bytearray(PART)
        view = memoryview(buf)
        with open(path, "rb") as src, self.fs.open_output_stream(f"{self.bucket}/{key}") as out:
            while n := src.readinto(buf):
                out.write(view[:n])

    def put_bytes(self, key: str, data: bytes) -> None:
        with self.fs.open_output_stream(f"{self.bucket}/{key}") as out:
            out.write(data)

    def get_range(self, key: str, start: int, n: int) -> Any:
        f = self.files.get(key)
        if f is None:
            with self.lock:  # one input file per object (its open is a HEAD); read_at is safe
                f = self.files.get(key) or self.fs.open_input_file(f"{self.bucket}/{key}")
                self.files[key] = f
        return f.read_at(n, start)

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        raise NotImplementedError("pyarrow: no ETag in its API")


class S3fsClient(Client):
    name = "s3fs"

    def __init__(
        self, ep: Endpoint, keys: bool = True, endpoint: bool = True, asynchronous: bool = False
    ) -> None:
        import s3fs

        kwargs: dict[str, Any] = {"endpoint_url": ep.url} if endpoint else {}
        if keys:
            kwargs.update(
                key=ep.access_key, secret=ep.secret_key, client_kwargs={"region_name": ep.region}
            )
        self.fs = s3fs.S3FileSystem(
            skip_instance_cache=True,
            config_kwargs={"max_pool_connections": POOL},
            max_concurrency=PART_CONCURRENCY,
            asynchronous=asynchronous,
            **kwargs,
        )
        self.bucket = ep.bucket
        self.endpoint_url = "" if asynchronous else str(self.fs.s3.meta.endpoint_url)

    def upload_file(self, path: str, key: str) -> None:
        self.fs.put_file(path, f"{self.bucket}/{key}", chunksize=PART)

    def put_bytes(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(f"{self.bucket}/{key}", data)

    def get_range(self, key: str, start: int, n: int) -> Any:
        return self.fs.cat_file(f"{self.bucket}/{key}", start=start, end=start + n)

    def put_create(self, key: str, data: bytes) -> str:
        r = self.fs.pipe_file(f"{self.bucket}/{key}", data, mode="create")
        return str(r["ETag"])

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        # No parameter of its own: the keyword goes through to botocore's put_object.
        r = self.fs.pipe_file(f"{self.bucket}/{key}", data, IfMatch=etag)
        return str(r["ETag"])

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        path = f"{self.bucket}/{key}"
        etag = str(self.fs.info(path, refresh=True)["ETag"])  # a HEAD: cat gives no ETag
        return bytes(self.fs.cat_file(path)), etag

    def is_precondition_failed(self, exc: BaseException) -> bool:
        # s3fs turns the 412 into OSError(EINVAL, None); only the cause says what it was.
        cause = exc.__cause__
        return (
            isinstance(exc, OSError)
            and cause is not None
            and "PreconditionFailed" in str(getattr(cause, "response", {}).get("Error", {}))
        )


class RawClient(Client):
    """``http.client`` + botocore's SigV4 signer: one keep-alive connection per thread."""

    name = "raw"

    def __init__(self, ep: Endpoint, keys: bool = True, endpoint: bool = True) -> None:
        from botocore.auth import S3SigV4Auth
        from botocore.credentials import Credentials

        if not (keys and endpoint):
            raise NotImplementedError("raw: explicit settings only")
        self.ep = ep
        self.bucket = ep.bucket
        self.endpoint_url = ep.url
        self.signer = S3SigV4Auth(Credentials(ep.access_key, ep.secret_key), "s3", ep.region)
        u = urlsplit(ep.url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.local = threading.local()

    def _conn(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self.local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            self.local.conn = conn
        return conn

    def get_range(self, key: str, start: int, n: int) -> Any:
        from botocore.awsrequest import AWSRequest

        path = f"/{self.bucket}/{quote(key)}"
        req = AWSRequest(
            "GET", self.ep.url + path, headers={"Range": f"bytes={start}-{start + n - 1}"}
        )
        self.signer.add_auth(req)
        conn = self._conn()
        conn.request("GET", path, headers=dict(req.headers.items()))
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 206:
            raise RuntimeError(f"raw GET {path}: HTTP {resp.status} {body[:200]!r}")
        return body


def make(name: str, ep: Endpoint, **kwargs: Any) -> Client:
    classes: dict[str, Callable[..., Client]] = {
        "boto3": Boto3Client,
        "obstore": ObstoreClient,
        "pyarrow": PyarrowClient,
        "s3fs": S3fsClient,
        "raw": RawClient,
    }
    return classes[name](ep, **kwargs)


# -- measuring ----------------------------------------------------------------------------------


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def status_kib(field: str) -> int:
    """``VmRSS`` / ``VmHWM`` (peak) of this process, KiB."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


@contextlib.contextmanager
def timed(out: dict[str, Any]) -> Iterator[None]:
    c0, t0 = cpu_s(), time.perf_counter()
    yield
    out["seconds"] = time.perf_counter() - t0
    out["cpu_s"] = cpu_s() - c0


def offsets(size: int, count: int, length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(0, size - length) for _ in range(count)]


def run_threads(fn: Callable[[int], Any], starts: Sequence[int], concurrency: int) -> list[Any]:
    if concurrency == 1:
        return [fn(s) for s in starts]
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(fn, starts))


def op_upload(a: dict[str, Any], client: Client) -> dict[str, Any]:
    out: dict[str, Any] = {"rss_before_kib": status_kib("VmRSS")}
    with timed(out):
        client.upload_file(a["path"], a["key"])
    out["peak_rss_kib"] = status_kib("VmHWM")
    return out


def op_put(a: dict[str, Any], client: Client) -> dict[str, Any]:
    data = os.urandom(a["size"])
    client.put_bytes(a["key"], data)  # warm: connection, credentials
    seconds: list[float] = []
    out: dict[str, Any] = {}
    with timed(out):
        for _ in range(a["count"]):
            t0 = time.perf_counter()
            client.put_bytes(a["key"], data)
            seconds.append(time.perf_counter() - t0)
    out["each_s"] = seconds
    return out


def _verify(path: str, starts: Sequence[int], n: int, got: Sequence[Any]) -> int:
    """How many of the fetched ranges differ from the local file's bytes."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        return sum(1 for s, g in zip(starts, got, strict=True) if bytes(g) != mm[s : s + n])


def op_get(a: dict[str, Any], client: Client) -> dict[str, Any]:
    """Ranged GETs of ``n`` bytes at ``starts`` (given, or ``count`` random ones), with
    ``concurrency`` threads, or, with ``mode`` async / batch, the client's own way."""
    key, n, conc = a["key"], a["length"], a["concurrency"]
    starts = a["starts"] if "starts" in a else offsets(a["size"], a["count"], n, a["seed"])
    mode = a.get("mode", "threads")
    client.get_range(key, 0, 1)  # warm: connection, credentials, pyarrow's HEAD
    out: dict[str, Any] = {"requests": len(starts)}
    if mode == "threads":
        with timed(out):
            got = run_threads(lambda s: client.get_range(key, s, n), starts, conc)
    elif mode == "async":
        with timed(out):
            got = asyncio.run(_get_async(client.name, a, key, starts, n, conc))
    elif mode == "batch":
        with timed(out):
            got = _get_batch(client, key, starts, n, a)
    else:
        raise ValueError(f"unknown mode {mode}")
    out["bytes"] = sum(len(g) for g in got)
    if a.get("verify"):
        out["mismatched"] = _verify(a["verify"], starts, n, got)
    return out


async def _get_async(
    name: str, a: dict[str, Any], key: str, starts: Sequence[int], n: int, conc: int
) -> list[Any]:
    sem = asyncio.Semaphore(conc)
    ep = Endpoint(**a["endpoint"])
    if name == "obstore":
        import obstore

        store = ObstoreClient(ep).store

        async def one(s: int) -> Any:
            async with sem:
                return await obstore.get_range_async(store, key, start=s, length=n)

        return list(await asyncio.gather(*(one(s) for s in starts)))
    if name == "s3fs":
        c = S3fsClient(ep, asynchronous=True)
        session = await c.fs.set_session()
        path = f"{ep.bucket}/{key}"

        async def one_s3fs(s: int) -> Any:
            async with sem:
                return await c.fs._cat_file(path, start=s, end=s + n)

        try:
            return list(await asyncio.gather(*(one_s3fs(s) for s in starts)))
        finally:
            await session.close()
    raise ValueError(f"{name}: no async API measured")


def _get_batch(client: Client, key: str, starts: Sequence[int], n: int, a: dict[str, Any]) -> Any:
    """The client's call for many ranges at once: obstore's get_ranges (which merges ranges
    less than ``coalesce`` bytes apart), s3fs's cat_ranges."""
    if isinstance(client, ObstoreClient):
        import obstore

        return obstore.get_ranges(
            client.store, key, starts=list(starts), lengths=[n] * len(starts),
            coalesce=a.get("coalesce", 1 << 20),
        )  # fmt: skip
    if isinstance(client, S3fsClient):
        path = f"{client.bucket}/{key}"
        return client.fs.cat_ranges(
            [path] * len(starts), list(starts), [s + n for s in starts], batch_size=a["concurrency"]
        )
    raise ValueError(f"{client.name}: no batch call")


def _error_name(exc: BaseException) -> str:
    t = type(exc)
    return f"{t.__module__}.{t.__qualname__}"


def _try(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except NotImplementedError as exc:
        return "not exposed", str(exc)
    except Exception as exc:
        return "error", exc


def op_cond(a: dict[str, Any], client: Client) -> dict[str, Any]:
    """What the client does with S3's conditional PutObject against this RGW."""
    key = a["key"]
    out: dict[str, Any] = {}

    def report(step: str, outcome: tuple[str, Any]) -> Any:
        """Record a step's outcome ("ok", "412", "error" or "not exposed"); the ETag if ok."""
        status, value = outcome
        if status == "error":
            out[step] = {
                "result": "412" if client.is_precondition_failed(value) else "error",
                "exception": _error_name(value),
                "message": str(value)[:160],
            }
            return None
        out[step] = {"result": status}
        if status == "not exposed":
            out[step]["why"] = value
            return None
        return value

    etag = report("create (If-None-Match: *)", _try(lambda: client.put_create(key, b"v1")))
    report("create again", _try(lambda: client.put_create(key, b"v2")))
    if etag is None:  # no create: an ordinary put to have an object for If-Match
        report("plain put", _try(lambda: client.put_bytes(key, b"v1")))
        got = _try(lambda: client.get_with_etag(key))
        etag = got[1][1] if got[0] == "ok" else None
    if etag is not None:
        out["etag_as_returned"] = etag
        report(
            "If-Match, ETag as returned (quoted)",
            _try(lambda: client.put_if_match(key, b"q", etag)),
        )
        report(
            "If-Match, ETag unquoted", _try(lambda: client.put_if_match(key, b"u", etag.strip('"')))
        )
        report(
            "If-Match, stale ETag", _try(lambda: client.put_if_match(key, b"s", etag.strip('"')))
        )
    else:
        out["If-Match"] = {"result": "not exposed", "why": "no ETag to match"}
    if out["create (If-None-Match: *)"]["result"] == "ok":
        out["race"] = _race(client, key, a.get("rounds", 20))
    if out.get("If-Match, ETag unquoted", {}).get("result") == "ok":
        out["cas_ms"] = _cas_latency(client, key + "-cas", a.get("cas_rounds", 30))
    return out


def _race(client: Client, key: str, rounds: int) -> dict[str, Any]:
    """Two threads create the same new key at once, ``rounds`` times: how many won each round."""
    winners: list[int] = []
    for r in range(rounds):
        k = f"{key}-race-{r}"
        barrier = threading.Barrier(2)
        won = [0, 0]

        def writer(
            i: int, k: str = k, barrier: threading.Barrier = barrier, won: list[int] = won
        ) -> None:
            barrier.wait()
            with contextlib.suppress(Exception):
                client.put_create(k, b"writer %d" % i)
                won[i] = 1

        threads = [threading.Thread(target=writer, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners.append(sum(won))
    return {"rounds": rounds, "exactly_one_winner": sum(1 for w in winners if w == 1)}


def _cas_latency(client: Client, key: str, rounds: int) -> dict[str, float]:
    """One manifest update: read the object and its ETag, write it back with If-Match."""
    client.put_bytes(key, b"0" * 4096)
    times: list[float] = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        body, etag = client.get_with_etag(key)
        client.put_if_match(key, body, etag.strip('"'))
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return {"p50": times[len(times) // 2], "min": times[0], "max": times[-1]}


def op_import(a: dict[str, Any]) -> dict[str, Any]:
    """Seconds to import the client's modules, then to make a client (no request)."""
    t0 = time.perf_counter()
    for m in a["modules"]:
        importlib.import_module(m)
    t1 = time.perf_counter()
    make(a["client"], Endpoint(**a["endpoint"]))
    t2 = time.perf_counter()
    return {"import_s": t1 - t0, "client_s": t2 - t1}


def op_creds(a: dict[str, Any]) -> dict[str, Any]:
    """One GET of a known object by a client that is given only part of the settings: the rest
    must come from the AWS chain, which the parent laid out (variables, or a profile under a
    HOME of its own). ``keys``: explicit keys and region; ``endpoint``: explicit endpoint;
    ``boto3_provider``: obstore gets boto3's credentials (obstore.auth.boto3).

    Where a client shows the endpoint it resolved and that is not the test's, no request is
    sent (it would go to AWS): the outcome says which endpoint it took instead.
    """
    ep = Endpoint(**a["endpoint"])
    kwargs: dict[str, Any] = {"keys": a["keys"], "endpoint": a["explicit_endpoint"]}
    if a.get("boto3_provider"):
        from obstore.auth.boto3 import Boto3CredentialProvider

        kwargs["provider"] = Boto3CredentialProvider()
    try:
        client = make(a["client"], ep, **kwargs)
        resolved = str(getattr(client, "endpoint_url", ""))
        if a["client"] != "obstore" and resolved.rstrip("/") != ep.url:
            return {"ok": False, "error": f"endpoint not picked up (resolved to {resolved!r})"}
        got = client.get_range(a["key"], 0, 10)
        return {"ok": len(got) == 10}
    except Exception as exc:
        return {"ok": False, "error": f"{_error_name(exc)}: {str(exc)[:200]}"}


def main(argv: Sequence[str]) -> int:
    a = json.loads(argv[0])
    op = a["op"]
    if op == "import":
        result = op_import(a)
    elif op == "creds":
        result = op_creds(a)
    else:
        ep = Endpoint(**a["endpoint"])
        client = make(a["client"], ep)
        ops: dict[str, Callable[[dict[str, Any], Client], dict[str, Any]]] = {
            "upload": op_upload,
            "put": op_put,
            "get": op_get,
            "cond": op_cond,
        }
        result = ops[op](a, client)
        client.close()
    print(json.dumps(result, default=str))
    sys.stdout.flush()
    # Leave without waiting for the clients' pools and loops to wind down (s3fs's thread,
    # the AWS SDK's shutdown): the figures are taken.
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
