"""What the ``shared`` benchmark part (bench/shared.py) does when a read on a mount never
comes back (seen on ceph-fuse: docs/cluster.md, "A read that never returns"): it aborts the
mount's FUSE connection, which fails the stuck read with ENOTCONN. Tested on a real FUSE mount
whose server holds a read unanswered (tests/procs/faultfuse.py ``hold``)."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest

from tests.kit import faultfuse
from tests.kit.faultfuse import mounted
from tests.kit.gluster import _poll


def test_aborting_the_mount_frees_a_read_its_server_never_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    why = faultfuse.unavailable()
    if why is not None:
        pytest.skip(why)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent))
    from bench.shared import abort_mount

    with mounted(tmp_path) as fs:
        (fs.backing / "segment").write_bytes(b"x" * 8192)
        fs.hold("segment")
        got: list[BaseException | bytes] = []

        def read() -> None:
            try:
                got.append((fs.mount / "segment").read_bytes())
            except OSError as exc:
                got.append(exc)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        _poll("the read to reach the server and wait", lambda: fs.held() == 1, 30)
        assert reader.is_alive() and got == []
        abort_mount(fs.mount)
        reader.join(30)
        assert not reader.is_alive(), "the read still waits after the abort"
        [failed] = got
        assert isinstance(failed, OSError) and failed.errno == errno.ENOTCONN, failed
        fs.release()  # the server's handler returns, and the server can end
