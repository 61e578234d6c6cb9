"""The ``s3clients`` part: which S3 client the tiered store should use, measured against a real
S3 (Ceph radosgw 16.2, the throwaway one of ``../shared/ceph/ceph-up.sh``) on loopback.

Clients (``bench/s3clients_ops.py``): boto3, obstore (Rust object_store), pyarrow's own
``pyarrow.fs.S3FileSystem``, s3fs (when installed: it is not in the ``dev`` extra, it pins
botocore), and ``raw``, ``http.client`` with botocore's SigV4 signer, the floor of a Python
client. Every operation runs in a process of its own; within a run the clients take turns in an
order that rotates from run to run. Figures, each the median of ``--runs`` runs:

1. **Upload** of a 256 MiB and a 1 GiB file, multipart, 16 MiB parts and 4 in flight where the
   client has the knobs (pyarrow: its own part size, its IO pool): MB/s, client CPU seconds per
   GB, peak RSS of the process; and **single PUTs of 4 MiB** (median of 10 per run).
2. **Bulk GET**: a 256 MiB object as 8 MiB ranged GETs, 1 and 4 threads: MB/s, CPU s per GB.
3. **Small scattered GETs**: 2,000 GETs of 300 bytes at random offsets in that object, with 1,
   8 and 32 threads; the async APIs of obstore and s3fs at 8 and 32 in flight; the batch calls
   (obstore ``get_ranges``, whose default merges ranges less than 1 MiB apart, and with merging
   off; s3fs ``cat_ranges``). Requests/s, and bytes RGW sent per byte asked (its perf counters).
   First on RGW as ceph-up.sh configures it, then with ``tcp_nodelay=1`` on the beast frontend
   (radosgw restarted): without it, every response on a kept-alive connection waits ~40 ms
   (Nagle's algorithm against the client's delayed ACK), which hides every client difference.
4. **Conditional writes**: If-None-Match: * and If-Match on PutObject, with the ETag as the
   client returns it (quoted) and unquoted, a stale one; the exception a 412 raises; two
   threads racing to create one key, 20 rounds; a manifest update (GET, then PUT If-Match).
5. **Import time** of each client's modules, and making a client, in a fresh interpreter.
6. **Credentials and settings** from the AWS chain: keys and region from the variables, or a
   profile (``AWS_PROFILE``, ``~/.aws/credentials`` and ``config`` under a HOME made for it),
   and the endpoint from ``AWS_ENDPOINT_URL`` or the profile's ``endpoint_url``; and the
   **install footprint**: the distributions each client brings beyond rocketstore's own
   dependencies and their size on disk.

Every worker runs with ``AWS_EC2_METADATA_DISABLED=true``, ``AWS_METADATA_ENDPOINT`` and an
HTTP(S) proxy on a closed loopback port (only 127.0.0.1 bypasses it), so that a client missing a
setting fails here instead of asking an address off this machine. pyarrow's workers also get
``AWS_REQUEST_CHECKSUM_CALCULATION=WHEN_REQUIRED``: without it its writes fail against this RGW
(411 MissingContentLength; figure 4 records that).

Needs root and ``../shared/ceph`` beside the checkout (skipped, saying which, otherwise). The
cluster is made under /tmp and always taken down (``ceph-down.sh --purge``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import importlib.metadata as md
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from bench.common import (
    MB,
    PROJECT_DIR,
    Options,
    PartResult,
    Row,
    log,
    median,
    process_tree_cpu_s,
    scratch_dir,
)
from bench.s3clients_ops import MODULES, NAMES

T = TypeVar("T")
CEPH_DIR = PROJECT_DIR.parent / "shared" / "ceph"
BUCKET = "rocketstore-bench"
MiB = 1 << 20
GB = 1_000_000_000
DISTRIBUTIONS = {"boto3": "boto3", "obstore": "obstore", "pyarrow": "pyarrow", "s3fs": "s3fs"}
# Modules a client's import time is measured on ("pyarrow" alone for reference: rocketstore
# imports it anyway, so pyarrow.fs costs only the difference).
IMPORTS = {
    "boto3": ("boto3", ["boto3"]),
    "obstore": ("obstore", ["obstore", "obstore.store"]),
    "pyarrow.fs": ("pyarrow", ["pyarrow.fs"]),
    "s3fs": ("s3fs", ["s3fs"]),
    "pyarrow alone": ("pyarrow", ["pyarrow"]),
}


@dataclasses.dataclass(frozen=True)
class Sizes:
    uploads: tuple[int, ...]
    put_size: int
    put_count: int
    bulk_size: int
    bulk_range: int
    bulk_concurrency: tuple[int, ...]
    small_count: int
    small_length: int
    small_concurrency: tuple[int, ...]
    async_concurrency: tuple[int, ...]
    stock_count: int
    stock_concurrency: tuple[int, ...]


FULL = Sizes(
    uploads=(256 * MiB, 1024 * MiB),
    put_size=4 * MiB,
    put_count=10,
    bulk_size=256 * MiB,
    bulk_range=8 * MiB,
    bulk_concurrency=(1, 4),
    small_count=2000,
    small_length=300,
    small_concurrency=(1, 8, 32),
    async_concurrency=(8, 32),
    stock_count=200,
    stock_concurrency=(1, 8),
)
QUICK = Sizes(
    uploads=(16 * MiB, 40 * MiB),
    put_size=4 * MiB,
    put_count=3,
    bulk_size=32 * MiB,
    bulk_range=8 * MiB,
    bulk_concurrency=(1, 4),
    small_count=200,
    small_length=300,
    small_concurrency=(1, 8, 32),
    async_concurrency=(8, 32),
    stock_count=20,
    stock_concurrency=(1, 8),
)


def unavailable() -> str | None:
    """Why the part cannot run here, or None."""
    if not (CEPH_DIR / "ceph-up.sh").is_file():
        return f"no {CEPH_DIR}/ceph-up.sh: the part needs ../shared beside the checkout"
    if os.geteuid() != 0:
        return "needs root: ceph-up.sh starts Ceph's daemons (and installs them on first use)"
    return None


def installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(MODULES[name]) is not None
    except ModuleNotFoundError:
        return False


# -- the cluster ----------------------------------------------------------------------------------


class Cluster:
    """A throwaway Ceph with radosgw, made by ceph-up.sh under ``path`` and always purged."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.env: dict[str, str] = {}
        self.rgw: subprocess.Popen[bytes] | None = None  # radosgw when restarted here

    def up(self, env: dict[str, str] | None = None) -> None:
        done = subprocess.run(
            ["bash", str(CEPH_DIR / "ceph-up.sh"), str(self.path)],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
            env={**os.environ, **(env or {})},
        )
        if done.returncode != 0:
            raise RuntimeError(f"ceph-up.sh failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        text = (self.path / "env").read_text(encoding="utf-8")
        self.env = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    def down(self) -> None:
        subprocess.run(
            ["bash", str(CEPH_DIR / "ceph-down.sh"), str(self.path), "--purge"],
            capture_output=True,
            timeout=300,
            check=False,
        )
        if self.rgw is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.rgw.wait(timeout=10)  # reap it: ceph-down.sh stopped it

    def pid(self, name: str) -> int:
        for line in (self.path / "pids").read_text(encoding="utf-8").splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == name:
                return int(parts[1])
        raise RuntimeError(f"no {name} in {self.path}/pids")

    def pids(self) -> list[int]:
        """Every daemon of the cluster (monitor, manager, OSD, radosgw, ...)."""
        lines = (self.path / "pids").read_text(encoding="utf-8").splitlines()
        return [int(p[1]) for p in (line.split() for line in lines) if len(p) == 2]

    def server_cpu_s(self) -> float:
        """CPU seconds radosgw and the OSD used so far."""
        return sum(process_tree_cpu_s(self.pid(n)) for n in ("client.rgw.a", "osd.0"))

    def perf(self) -> dict[str, int]:
        """radosgw's request counters: requests, GETs and bytes sent for them, PUTs and bytes."""
        sockets = glob.glob(
            str(self.path / "run" / f"ceph-client.rgw.a.{self.pid('client.rgw.a')}.*.asok")
        )
        if not sockets:
            return {}
        done = subprocess.run(
            ["ceph", "--admin-daemon", sockets[0], "perf", "dump"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            return {}
        rgw = json.loads(done.stdout).get("rgw", {})
        return {k: int(rgw.get(k, 0)) for k in ("req", "get", "get_b", "put", "put_b")}

    def frontend(self) -> str:
        conf = (self.path / "ceph.conf").read_text(encoding="utf-8")
        m = re.search(r"^rgw_frontends = (.*)$", conf, re.M)
        return m.group(1) if m else "?"

    def restart_rgw(self, frontend_extra: str) -> None:
        """Stop radosgw, append ``frontend_extra`` to its frontend line, start it again the way
        ceph-up.sh does (and record it in DIR/pids, where ceph-down.sh finds it)."""
        old = self.pid("client.rgw.a")
        os.kill(old, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _alive(old) and time.monotonic() < deadline:
            time.sleep(0.1)
        conf_path = self.path / "ceph.conf"
        conf = conf_path.read_text(encoding="utf-8")
        conf = re.sub(r"^(rgw_frontends = .*)$", rf"\1 {frontend_extra}", conf, count=1, flags=re.M)
        conf_path.write_text(conf, encoding="utf-8")
        log_path = self.path / "log" / "client.rgw.a.out"
        with open(log_path, "ab") as out:
            self.rgw = subprocess.Popen(
                ["radosgw", "-c", str(conf_path), "-n", "client.rgw.a", "-f"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        pids = (self.path / "pids").read_text(encoding="utf-8")
        pids = re.sub(r"^client\.rgw\.a \d+$", f"client.rgw.a {self.rgw.pid}", pids, flags=re.M)
        (self.path / "pids").write_text(pids, encoding="utf-8")
        self.wait_s3()

    def wait_s3(self, timeout_s: float = 60) -> None:
        import http.client
        from urllib.parse import urlsplit

        u = urlsplit(self.env["S3_ENDPOINT"])
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=5)
                conn.request("GET", "/")
                conn.getresponse().read()
                conn.close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("radosgw did not answer after its restart") from None
                time.sleep(0.2)

    def gc(self) -> None:
        """Reclaim deleted objects now (RGW's collector waits 2 h): the uploads would fill the
        OSD otherwise."""
        subprocess.run(
            ["radosgw-admin", "-c", self.env["CEPH_CONF"], "gc", "process", "--include-all"],
            capture_output=True,
            timeout=300,
            check=False,
        )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except OSError:
        return False


@contextlib.contextmanager
def cluster(part: str = "s3clients", osd_gb: int | None = None) -> Iterator[Cluster]:
    """A cluster for the block; ``osd_gb``: the OSD's (sparse) size, ceph-up.sh's 16 GB when
    None."""
    # Short: the admin sockets' paths must stay under 108 characters.
    c = Cluster(Path(tempfile.mkdtemp(prefix="s3b-", dir="/tmp")))
    c.path.rmdir()  # ceph-up.sh wants a fresh directory
    try:
        log(f"{part}: starting Ceph under {c.path}")
        c.up({"CEPH_OSD_SIZE_GB": str(osd_gb)} if osd_gb is not None else None)
        yield c
    finally:
        log(f"{part}: stopping Ceph")
        c.down()


# -- workers ------------------------------------------------------------------------------------


def worker_env(client: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy"):
        env.pop(k, None)
    closed = "http://127.0.0.1:9"
    env.update(
        {
            "AWS_EC2_METADATA_DISABLED": "true",  # botocore, the AWS C++ SDK
            "AWS_METADATA_ENDPOINT": closed,  # object_store's instance metadata
            "HTTP_PROXY": closed,
            "HTTPS_PROXY": closed,
            "NO_PROXY": "127.0.0.1,localhost",
            "PYTHONPATH": str(PROJECT_DIR),
        }
    )
    if client == "pyarrow":
        env["AWS_REQUEST_CHECKSUM_CALCULATION"] = "WHEN_REQUIRED"
    env.update(extra or {})
    return env


def call(args: dict[str, Any], env: dict[str, str] | None = None, timeout: float = 900) -> Any:
    """Run one operation in a fresh interpreter; its JSON result, with the load average."""
    load = os.getloadavg()[0]
    done = subprocess.run(
        [sys.executable, "-m", "bench.s3clients_ops", json.dumps(args)],
        capture_output=True,
        text=True,
        cwd=PROJECT_DIR,
        env=env if env is not None else worker_env(str(args.get("client", ""))),
        timeout=timeout,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(
            f"s3clients worker {args.get('op')} {args.get('client')} failed "
            f"(exit {done.returncode}):\n{done.stderr[-3000:]}"
        )
    result = json.loads(lines[-1])
    if isinstance(result, dict):
        result["load1"] = load
    return result


def rotate(items: Sequence[T], i: int) -> list[T]:
    """``items`` starting at the ``i``-th: who goes first changes from run to run."""
    k = i % len(items)
    return [*items[k:], *items[:k]]


# -- the part -------------------------------------------------------------------------------------


class Bench:
    def __init__(self, c: Cluster, options: Options, sizes: Sizes, clients: list[str]) -> None:
        self.c = c
        self.options = options
        self.sizes = sizes
        self.clients = clients  # the ones installed, raw included
        self.endpoint = {
            "url": c.env["S3_ENDPOINT"],
            "region": c.env["S3_REGION"],
            "access_key": c.env["S3_ACCESS_KEY"],
            "secret_key": c.env["S3_SECRET_KEY"],
            "bucket": BUCKET,
        }
        self.data: dict[str, Any] = {}
        # This process's own client, for the set-up and the deletes (not measured).
        import boto3
        from botocore.config import Config

        self.s3: Any = boto3.client(
            "s3",
            endpoint_url=c.env["S3_ENDPOINT"],
            region_name=c.env["S3_REGION"],
            aws_access_key_id=c.env["S3_ACCESS_KEY"],
            aws_secret_access_key=c.env["S3_SECRET_KEY"],
            config=Config(s3={"addressing_style": "path"}),
        )

    @property
    def writers(self) -> list[str]:
        return [n for n in self.clients if n != "raw"]

    def op(self, op: str, client: str, **args: Any) -> dict[str, Any]:
        result: dict[str, Any] = call(
            {"op": op, "client": client, "endpoint": self.endpoint, **args}
        )
        return result

    def measured(self, op: str, client: str, **args: Any) -> dict[str, Any]:
        """An operation with RGW's counters and CPU read around it."""
        perf0, cpu0 = self.c.perf(), self.c.server_cpu_s()
        r = self.op(op, client, **args)
        perf1, cpu1 = self.c.perf(), self.c.server_cpu_s()
        r["server_cpu_s"] = cpu1 - cpu0
        r["rgw"] = {k: perf1[k] - perf0.get(k, 0) for k in perf1}
        return r

    def prepare(self, work: Path) -> tuple[Path, list[Path]]:
        """The bucket, the object the GETs read (from a local file kept to check them), and the
        files to upload."""
        s3 = self.s3
        s3.create_bucket(Bucket=BUCKET)
        files = []
        for size in sorted({self.sizes.bulk_size, *self.sizes.uploads}):
            path = work / f"data-{size // MiB}M"
            with open(path, "wb") as f:
                left = size
                while left:
                    n = min(left, 16 * MiB)
                    f.write(os.urandom(n))
                    left -= n
            files.append(path)
        source = work / f"data-{self.sizes.bulk_size // MiB}M"
        s3.upload_file(str(source), BUCKET, "read-object")
        return source, [work / f"data-{s // MiB}M" for s in self.sizes.uploads]

    def small_gets(
        self, label: str, source: Path, runs: int, count: int, conc: Sequence[int]
    ) -> None:
        s = self.sizes
        out: dict[str, list[dict[str, Any]]] = self.data.setdefault(label, {})
        variants: list[tuple[str, str, dict[str, Any]]] = []
        for c in conc:
            variants += [(f"{n}, {c} threads", n, {"concurrency": c}) for n in self.clients]
        if label == "small_gets":
            for c in s.async_concurrency:
                variants += [
                    (f"{n} async, {c} in flight", n, {"concurrency": c, "mode": "async"})
                    for n in ("obstore", "s3fs")
                    if n in self.clients
                ]
            if "obstore" in self.clients:
                variants += [
                    ("obstore get_ranges (merges < 1 MiB apart)", "obstore", {"concurrency": 1, "mode": "batch"}),
                    ("obstore get_ranges, coalesce=0", "obstore", {"concurrency": 1, "mode": "batch", "coalesce": 0}),
                ]  # fmt: skip
            if "s3fs" in self.clients:
                variants.append(
                    ("s3fs cat_ranges, batch_size=32", "s3fs", {"concurrency": 32, "mode": "batch"})
                )
        for i in range(runs):
            for name, client, args in rotate(variants, i):
                r = self.measured(
                    "get", client, key="read-object", size=s.bulk_size, count=count,
                    length=s.small_length, seed=self.options.seed + i, verify=str(source), **args,
                )  # fmt: skip
                if r.get("mismatched"):
                    raise RuntimeError(f"{name}: {r['mismatched']} ranges differ from the file")
                out.setdefault(name, []).append(r)
                log(
                    f"s3clients: {label} run {i + 1} {name}: {r['requests'] / r['seconds']:,.0f} "
                    f"req/s, RGW sent {r['rgw'].get('get_b', 0):,} B for {r['bytes']:,} B "
                    f"(load {r['load1']:.2f})"
                )

    def uploads(self, files: list[Path]) -> None:
        out: dict[str, list[dict[str, Any]]] = self.data.setdefault("uploads", {})
        for i in range(self.options.runs):
            for path, size in zip(files, self.sizes.uploads, strict=True):
                for n in rotate(self.writers, i):
                    key = f"up-{n}-{size}"
                    r = self.measured("upload", n, path=str(path), key=key)
                    out.setdefault(f"{size // MiB} MiB, {n}", []).append(r)
                    log(
                        f"s3clients: upload {size // MiB} MiB {n}: {size / MB / r['seconds']:.0f} "
                        f"MB/s, peak RSS {r['peak_rss_kib'] / 1024:.0f} MiB (load {r['load1']:.2f})"
                    )
                    self.delete(key)
                self.c.gc()
            puts: dict[str, list[dict[str, Any]]] = self.data.setdefault("puts", {})
            for n in rotate(self.writers, i):
                r = self.op(
                    "put", n, key=f"put-{n}", size=self.sizes.put_size, count=self.sizes.put_count
                )
                puts.setdefault(n, []).append(r)
                log(
                    f"s3clients: PUT 4 MiB {n}: {median(r['each_s']) * 1000:.1f} ms (load {r['load1']:.2f})"
                )

    def delete(self, key: str) -> None:
        self.s3.delete_object(Bucket=BUCKET, Key=key)

    def bulk_gets(self) -> None:
        s = self.sizes
        out: dict[str, list[dict[str, Any]]] = self.data.setdefault("bulk_gets", {})
        starts = list(range(0, s.bulk_size, s.bulk_range))
        variants = [(f"{n}, {c} threads", n, c) for c in s.bulk_concurrency for n in self.clients]
        for i in range(self.options.runs):
            for name, client, c in rotate(variants, i):
                r = self.measured(
                    "get",
                    client,
                    key="read-object",
                    starts=starts,
                    length=s.bulk_range,
                    concurrency=c,
                )
                if r["bytes"] != s.bulk_size:
                    raise RuntimeError(f"{name}: read {r['bytes']} bytes of {s.bulk_size}")
                out.setdefault(name, []).append(r)
                log(
                    f"s3clients: bulk GET {name}: {r['bytes'] / MB / r['seconds']:.0f} MB/s (load {r['load1']:.2f})"
                )

    def conditional(self) -> None:
        out: dict[str, list[dict[str, Any]]] = self.data.setdefault("conditional", {})
        for i in range(self.options.runs):
            for n in rotate(self.writers, i):
                r = self.op("cond", n, key=f"manifest-{n}-{i}")
                out.setdefault(n, []).append(r)
        # pyarrow as it comes: without the variable that lets its writes through this RGW.
        env = worker_env("pyarrow")
        env.pop("AWS_REQUEST_CHECKSUM_CALCULATION")
        if "pyarrow" in self.writers:
            try:
                call({"op": "put", "client": "pyarrow", "endpoint": self.endpoint, "key": "pa-default",
                      "size": 4 * MiB, "count": 1}, env=env)  # fmt: skip
                self.data["pyarrow_default_put"] = "ok"
            except RuntimeError as exc:
                self.data["pyarrow_default_put"] = str(exc).splitlines()[-1][:300]

    def imports(self) -> None:
        out: dict[str, list[dict[str, Any]]] = self.data.setdefault("imports", {})
        names = [n for n in IMPORTS if n.split()[0] in self.writers]
        for i in range(self.options.runs):
            for n in rotate(names, i):
                client = n.split()[0]
                args = {
                    "op": "import",
                    "client": client,
                    "modules": IMPORTS[n],
                    "endpoint": self.endpoint,
                }
                out.setdefault(n, []).append(call(args))

    def credentials(self, work: Path) -> None:
        """Which settings each client takes from the AWS chain (figure 6)."""
        ep = self.endpoint
        home = work / "home"
        (home / ".aws").mkdir(parents=True, exist_ok=True)
        (home / ".aws" / "credentials").write_text(
            f"[rsbench]\naws_access_key_id = {ep['access_key']}\n"
            f"aws_secret_access_key = {ep['secret_key']}\n",
            encoding="utf-8",
        )
        (home / ".aws" / "config").write_text(
            f"[profile rsbench]\nregion = {ep['region']}\nendpoint_url = {ep['url']}\n"
            "s3 =\n    addressing_style = path\n",
            encoding="utf-8",
        )
        variables = {
            "AWS_ACCESS_KEY_ID": ep["access_key"],
            "AWS_SECRET_ACCESS_KEY": ep["secret_key"],
            "AWS_REGION": ep["region"],
            "AWS_DEFAULT_REGION": ep["region"],
            "AWS_ALLOW_HTTP": "true",  # object_store refuses http:// endpoints without it
        }
        profile = {"HOME": str(home), "AWS_PROFILE": "rsbench", "AWS_ALLOW_HTTP": "true"}
        cases = {
            "keys from variables, endpoint given": (variables, False, True),
            "keys from profile, endpoint given": (profile, False, True),
            "endpoint from AWS_ENDPOINT_URL": ({**variables, "AWS_ENDPOINT_URL": ep["url"]}, False, False),
            "endpoint from profile": (profile, False, False),
        }  # fmt: skip
        who = [(n, False) for n in self.writers]
        if "obstore" in self.writers and "boto3" in self.writers:
            who.append(("obstore", True))
        self.c.perf()  # the read object exists; every case GETs 10 bytes of it
        out: dict[str, dict[str, Any]] = {}
        for case, (extra, keys, explicit) in cases.items():
            for n, provider in who:
                label = f"{n} + boto3 credential provider" if provider else n
                args = {"op": "creds", "client": n, "endpoint": ep, "key": "read-object",
                        "keys": keys, "explicit_endpoint": explicit, "boto3_provider": provider}  # fmt: skip
                try:
                    r = call(args, env=worker_env(n, extra), timeout=120)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    r = {"ok": False, "error": str(exc).splitlines()[-1][:200]}
                out.setdefault(label, {})[case] = r
                log(f"s3clients: credentials, {case}, {label}: {r}")
        self.data["credentials"] = out


def footprint(clients: Sequence[str]) -> dict[str, Any]:
    """Per client: the installed distributions it needs beyond rocketstore's own dependencies,
    and their size on disk (from the installed files' records)."""

    def closure(root: str) -> set[str]:
        seen: set[str] = set()
        todo = [root]
        while todo:
            name = _canon(todo.pop())
            if name in seen:
                continue
            try:
                dist = md.distribution(name)
            except md.PackageNotFoundError:
                continue
            seen.add(name)
            for req in dist.requires or []:
                if "extra ==" in req:
                    continue
                marker_ok = ";" not in req or _marker_ok(req.split(";", 1)[1])
                if marker_ok:
                    todo.append(re.split(r"[\s\[<>=!~;(]", req.strip(), maxsplit=1)[0])
        return seen

    def size(name: str) -> int:
        dist = md.distribution(name)
        total = 0
        for f in dist.files or []:
            with contextlib.suppress(OSError):
                total += Path(str(dist.locate_file(f))).stat().st_size
        return total

    core = closure("rocketstore")
    out: dict[str, Any] = {}
    for n in clients:
        if n not in DISTRIBUTIONS:
            continue
        mine = closure(DISTRIBUTIONS[n])
        new = sorted(mine - core)
        out[n] = {
            "distributions": {d: md.version(d) for d in sorted(mine)},
            "new_to_rocketstore": new,
            "new_installed_bytes": sum(size(d) for d in new),
            "all_installed_bytes": sum(size(d) for d in mine),
        }
    return out


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _marker_ok(marker: str) -> bool:
    try:
        from packaging.markers import Marker
    except ImportError:
        return True
    return bool(Marker(marker).evaluate())


# -- rows ---------------------------------------------------------------------------------------


def _row(name: str, unit: str, values: Sequence[float]) -> Row:
    return Row(name, unit, median(values), min(values), max(values))


def _load(rs: Sequence[dict[str, Any]]) -> str:
    loads = [r["load1"] for r in rs]
    return f"{min(loads):.1f}-{max(loads):.1f}"


def rows(data: dict[str, Any], sizes: Sizes) -> list[Row]:
    out: list[Row] = []
    for name, rs in data.get("uploads", {}).items():
        size = int(name.split()[0]) * MiB
        out.append(
            _row(
                f"upload {name} (load {_load(rs)})", "MB/s", [size / MB / r["seconds"] for r in rs]
            )
        )
        out.append(
            _row(f"upload {name}, client CPU", "s/GB", [r["cpu_s"] / (size / GB) for r in rs])
        )
        out.append(_row(f"upload {name}, peak RSS", "MiB", [r["peak_rss_kib"] / 1024 for r in rs]))
    for name, rs in data.get("puts", {}).items():
        out.append(
            _row(
                f"PUT 4 MiB, {name} (load {_load(rs)})",
                "ms",
                [median(r["each_s"]) * 1000 for r in rs],
            )
        )
    for name, rs in data.get("bulk_gets", {}).items():
        out.append(_row(f"GET 256 MiB as 8 MiB ranges, {name} (load {_load(rs)})", "MB/s",
                        [r["bytes"] / MB / r["seconds"] for r in rs]))  # fmt: skip
        out.append(_row(f"GET 256 MiB as 8 MiB ranges, {name}, client CPU", "s/GB",
                        [r["cpu_s"] / (r["bytes"] / GB) for r in rs]))  # fmt: skip
    for label, title in (("stock_gets", "stock RGW"), ("small_gets", "tcp_nodelay=1")):
        for name, rs in data.get(label, {}).items():
            out.append(_row(f"300 B GETs, {title}, {name} (load {_load(rs)})", "req/s",
                            [r["requests"] / r["seconds"] for r in rs]))  # fmt: skip
            sent = [r["rgw"].get("get_b", 0) / r["bytes"] for r in rs if r["bytes"]]
            if label == "small_gets" and sent:
                out.append(_row(f"300 B GETs, {name}: bytes sent / asked", "x", sent))
    for name, rs in data.get("conditional", {}).items():
        cas = [r["cas_ms"]["p50"] for r in rs if "cas_ms" in r]
        if cas:
            out.append(_row(f"manifest update (GET + PUT If-Match), {name}", "ms", cas))
    for name, rs in data.get("imports", {}).items():
        out.append(_row(f"import {name}", "ms", [r["import_s"] * 1000 for r in rs]))
    return out


def notes(data: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for name, rs in data.get("conditional", {}).items():
        r = rs[0]
        steps = ", ".join(
            f"{k}: {v['result']}" + (f" ({v['exception']})" if "exception" in v else "")
            for k, v in r.items()
            if isinstance(v, dict) and "result" in v
        )
        race = r.get("race")
        if race:
            steps += (
                f"; race: one winner in {race['exactly_one_winner']} of {race['rounds']} rounds"
            )
        out.append(f"conditional writes, {name}: {steps}")
    if "pyarrow_default_put" in data:
        out.append(
            f"pyarrow PUT without AWS_REQUEST_CHECKSUM_CALCULATION: {data['pyarrow_default_put']}"
        )
    for name, cases in data.get("credentials", {}).items():
        got = "; ".join(
            f"{case}: {'ok' if r.get('ok') else 'no (' + str(r.get('error', ''))[:90] + ')'}"
            for case, r in cases.items()
        )
        out.append(f"AWS chain, {name}: {got}")
    for name, f in data.get("footprint", {}).items():
        out.append(
            f"footprint, {name}: {len(f['new_to_rocketstore'])} distributions new to rocketstore "
            f"({', '.join(f['new_to_rocketstore']) or 'none'}), "
            f"{f['new_installed_bytes'] / MB:.1f} MB installed"
        )
    return out


def run(options: Options) -> PartResult:
    sizes = QUICK if options.quick else FULL
    why = unavailable()
    if why is not None:
        return PartResult("s3clients", [], {"skipped": why}, [f"skipped: {why}"])
    clients = [n for n in NAMES if installed(n)]
    missing = [n for n in NAMES if n not in clients]
    if "boto3" not in clients:
        why = "needs boto3 (the dev extra): it makes the bucket and the object to read"
        return PartResult("s3clients", [], {"skipped": why}, [f"skipped: {why}"])
    notes_: list[str] = [f"not installed, left out: {', '.join(missing)}"] if missing else []
    load_start = os.getloadavg()
    versions = {d: md.version(d) for d in ("boto3", "botocore", "obstore", "pyarrow", "s3fs", "aiobotocore")
                if importlib.util.find_spec(d) is not None}  # fmt: skip
    with scratch_dir(options.work_dir, "s3clients-") as work, cluster() as c:
        b = Bench(c, options, sizes, clients)
        source, files = b.prepare(work)
        b.data["frontend_stock"] = c.frontend()
        log(f"s3clients: small GETs on RGW as ceph-up.sh made it ({c.frontend()})")
        b.small_gets("stock_gets", source, options.runs, sizes.stock_count, sizes.stock_concurrency)
        c.restart_rgw("tcp_nodelay=1")
        b.data["frontend"] = c.frontend()
        log(f"s3clients: radosgw restarted: {c.frontend()}")
        b.small_gets("small_gets", source, options.runs, sizes.small_count, sizes.small_concurrency)
        b.bulk_gets()
        b.uploads(files)
        b.conditional()
        b.imports()
        b.credentials(work)
        data = b.data
    data["footprint"] = footprint(clients)
    data["versions"] = versions
    data["sizes"] = dataclasses.asdict(sizes)
    data["load_start"], data["load_end"] = load_start, os.getloadavg()
    notes_.append(f"load average before {load_start[0]:.2f}, after {data['load_end'][0]:.2f}")
    notes_ += notes(data)
    return PartResult("s3clients", rows(data, sizes), data, notes_)
