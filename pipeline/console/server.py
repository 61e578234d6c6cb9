"""``rocketstore console ROOT``: serve the console with uvicorn until Ctrl-C.

Importable without the ``console`` extra: :func:`cmd_console` checks for starlette, jinja2,
uvicorn and matplotlib first and raises :class:`ConsoleDependencyError` naming the extra to
install, before importing any of them.

The socket is bound here, before uvicorn starts, so that ``--port 0`` (any free port) prints
the port it got, and a port in use fails at once with one line. Binding anything but loopback
requires a token (:mod:`.auth`): read from ``--token-file``, else generated and printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import ipaddress
import socket
import sys
from pathlib import Path

from rocketstore.pipeline.errors import ConfigError, StoreError

EXTRA = "the console needs the 'console' extra: pip install 'rocketstore[console]'"
NEEDED = ("starlette", "jinja2", "uvicorn", "matplotlib")


class ConsoleDependencyError(StoreError):
    """A package of the ``console`` extra is not installed."""


def check_dependencies() -> None:
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if missing:
        raise ConsoleDependencyError(f"{EXTRA} (missing: {', '.join(missing)})")


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def bind(address: str, port: int) -> socket.socket:
    """A listening TCP socket on ``address:port``; :class:`ConfigError` when it cannot be had."""
    host = address.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except (OSError, OverflowError) as exc:  # OverflowError: a port past 65535
        sock.close()
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError(f"cannot listen on {address}:{port}: {reason}") from None
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def cmd_console(args: argparse.Namespace) -> int:
    """Serve the console until interrupted; returns 0 after a clean stop."""
    check_dependencies()
    import uvicorn

    from rocketstore.pipeline.config import StoreConfig
    from rocketstore.pipeline.console import auth
    from rocketstore.pipeline.console.app import create_app
    from rocketstore.pipeline.console.views import Console
    from rocketstore.pipeline.root import StoreRoot

    root = Path(args.root)
    StoreRoot(root).check_readable("ROOT")
    for checkpoint in args.checkpoint or []:
        if not Path(checkpoint).is_dir():
            raise ConfigError(f"option --checkpoint={checkpoint}: no such directory")
    loopback = is_loopback(args.bind)
    token: str | None = None
    if args.token_file is not None:
        token = auth.read_token(args.token_file)
    elif not loopback:
        token = auth.new_token()
    console = Console(
        root.resolve(),
        StoreConfig.effective(args.config),
        tuple(Path(c).resolve() for c in args.checkpoint or []),
    )
    app = create_app(console, token)
    sock = bind(args.bind, args.port)
    url = url_of(sock)
    if token is not None and args.token_file is None:
        print(f"rocketstore console: token {token}", flush=True)
    where = f"{url}?token=…" if token is not None else url
    print(f"rocketstore console: serving {root} at {url} (Ctrl-C stops it)", flush=True)
    if token is not None:
        print(
            f"rocketstore console: every request needs the token: open {where} with the "
            "token, or send 'Authorization: Bearer TOKEN'",
            flush=True,
        )
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)
    try:
        # uvicorn handles SIGINT and SIGTERM itself: it stops accepting, finishes the
        # requests in flight (up to the timeout), then raises the signal again for the
        # default handler, which for Ctrl-C is this KeyboardInterrupt: a clean stop.
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    sys.stdout.write("rocketstore console: stopped\n")
    return 0
