"""A real S3 for the tier's tests and a CephFS for the tests across hosts: a throwaway
single-node Ceph with radosgw and an MDS (``../shared/ceph/ceph-up.sh --fs``), one per test
session, a fresh bucket per test (here) and fresh ceph-fuse mounts per test
(tests/kit/cephfs.py).

:func:`unavailable` says why there can be none here (no ../shared, not root); :func:`cluster`
starts one under a short folder of /tmp (the daemons' admin sockets need paths under 108
bytes) and stops and purges it however the session ends. ceph-up.sh installs Debian's Ceph
packages on first use (root and apt), so a fresh CI machine needs nothing else.

:class:`Ceph` is the running cluster: its endpoint and keys, a boto3 client of its own to
look at buckets behind the tier's back, fresh buckets, and radosgw stopped and started again
(the fault tests: a server that does not answer, then answers again).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.kit import ROOT

SHARED_CEPH = ROOT.parent / "shared" / "ceph"
UP = SHARED_CEPH / "ceph-up.sh"
DOWN = SHARED_CEPH / "ceph-down.sh"
SKIP = "[Ceph]"


def unavailable() -> str | None:
    """Why no Ceph can be started here, or None."""
    if not UP.is_file() or not DOWN.is_file():
        return f"needs ../shared/ceph/ceph-up.sh beside the clone ({UP} is missing)"
    if os.geteuid() != 0:
        return "ceph-up.sh runs as root (it installs Debian's Ceph packages on first use)"
    return None


@dataclasses.dataclass
class Ceph:
    """A running cluster (see the module docstring)."""

    directory: Path
    env: dict[str, str]

    @property
    def endpoint(self) -> str:
        return self.env["S3_ENDPOINT"]

    @property
    def access_key(self) -> str:
        return self.env["S3_ACCESS_KEY"]

    @property
    def secret_key(self) -> str:
        return self.env["S3_SECRET_KEY"]

    def settings(self, bucket: str, **more: Any) -> dict[str, Any]:
        """Store settings (RocketMQ names) with the tier on, in this cluster's ``bucket``."""
        return {
            "tieredStorageLevel": "NOT_IN_DISK",
            "objectStoreEndpoint": self.endpoint,
            "objectStoreBucket": bucket,
            "objectStoreRegion": self.env.get("S3_REGION", "us-east-1"),
            "objectStoreAccessKey": self.access_key,
            "objectStoreSecretKey": self.secret_key,
            **more,
        }

    def client(self) -> Any:
        """A boto3 client of the cluster's user, independent of the code under test."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.env.get("S3_REGION", "us-east-1"),
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )

    def new_bucket(self) -> str:
        name = f"t-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object of ``bucket`` under ``prefix``, key -> body."""
        s3 = self.client()
        out: dict[str, bytes] = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for o in page.get("Contents", ()):
                out[o["Key"]] = s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
        return out

    # -- radosgw down and up again -------------------------------------------------------
    def _rgw_pids(self) -> list[int]:
        conf = str(self.directory / "ceph.conf")
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0")
                state = (entry / "stat").read_text().split()[2]
            except OSError:
                continue
            if args and args[0].endswith(b"radosgw") and conf.encode() in args and state != "Z":
                pids.append(int(entry.name))
        return pids

    def stop_rgw(self, sig: str = "SIGTERM") -> None:
        """Stop radosgw (``sig``: SIGTERM, or SIGKILL for a server gone without a word) and
        wait until it is gone. After a SIGKILL the restarted radosgw takes about 30 s to
        create its first bucket (measured here; the dead one's hold must time out first),
        after a SIGTERM it does not; to clients both are an endpoint that refuses."""
        for pid in self._rgw_pids():
            os.kill(pid, getattr(signal, sig))
        _poll(lambda: not self._rgw_pids(), 30, "radosgw to exit")

    def start_rgw(self) -> None:
        """Start radosgw again as ceph-up.sh did (ceph-down.sh finds it by its arguments) and
        wait until it answers."""
        log = open(self.directory / "log" / "client.rgw.a.out", "ab")  # noqa: SIM115
        with log:
            subprocess.Popen(
                ["radosgw", "-c", str(self.directory / "ceph.conf"), "-n", "client.rgw.a", "-f"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )

        def answers() -> bool:
            # A bucket made and removed: a listing answers before writes do.
            try:
                self.client().delete_bucket(Bucket=self.new_bucket())
            except Exception:
                return False
            return True

        _poll(answers, 120, "radosgw to take writes again")


def _poll(cond: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    pause = 0.05
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {seconds} s for {what}")
        time.sleep(pause)
        pause = min(pause * 2, 1.0)


@contextmanager
def cluster(mds_tick_s: float | None = None) -> Iterator[Ceph]:
    """A Ceph with radosgw and, where the kernel has FUSE, a CephFS for the block, stopped and
    purged after it (the MDS and the file system add 1-2 s to the start and 30 MB).
    ``mds_tick_s``: the MDS's ``mds_tick_interval`` instead of Ceph's 5 s (docs/cluster.md,
    "The published point on CephFS")."""
    directory = Path(tempfile.mkdtemp(prefix="rsceph-", dir="/tmp"))
    os.rmdir(directory)  # ceph-up.sh wants a folder of its own making (no ceph.conf in it)
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    try:
        up = subprocess.run(
            ["bash", str(UP), str(directory), *(["--fs"] if Path("/dev/fuse").exists() else [])],
            capture_output=True,
            text=True,
            timeout=900,
            env=env,
        )
        if up.returncode != 0:
            raise RuntimeError(
                f"ceph-up.sh {directory} failed ({up.returncode}):\n{up.stdout[-3000:]}"
                f"\n{up.stderr[-3000:]}"
            )
        values = dict(
            line.split("=", 1) for line in (directory / "env").read_text().splitlines() if line
        )
        if mds_tick_s is not None and values.get("CEPHFS_MOUNT"):
            subprocess.run(
                ["ceph", "-c", str(directory / "ceph.conf"), "config", "set", "mds",
                 "mds_tick_interval", str(mds_tick_s)],
                check=True, capture_output=True, timeout=120, env=env,
            )  # fmt: skip
        yield Ceph(directory, values)
    finally:
        subprocess.run(["bash", str(DOWN), str(directory), "--purge"], timeout=300, check=False)
