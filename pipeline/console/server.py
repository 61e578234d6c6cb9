"""``rocketstore console ROOT`` and ``rocketstore exporter ROOT``: serve the console, or its
``/metrics`` alone, with uvicorn until Ctrl-C.

Importable without the ``console`` extra: :func:`cmd_console` and :func:`cmd_exporter` check
for the packages they need first (starlette, uvicorn, prometheus_client; the console also
jinja2 and matplotlib) and raise :class:`rocketstore.pipeline.extras.ConsoleDependencyError`
naming the extra to install, before importing any of them.

The socket is bound here, before uvicorn starts, so that ``--port 0`` (any free port) prints
the port it got, and a port in use fails at once with one line. Binding anything but loopback
requires a token (:mod:`.auth`): read from ``--token-file``, else generated and printed.
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rocketstore.pipeline import extras
from rocketstore.pipeline.errors import ConfigError

if TYPE_CHECKING:
    from starlette.types import ASGIApp

EXTRA = "the console needs the 'console' extra: pip install 'rocketstore[console]'"
NEEDED = ("starlette", "jinja2", "uvicorn", "matplotlib", "prometheus_client")
EXPORTER_EXTRA = "the exporter needs the 'console' extra: pip install 'rocketstore[console]'"
EXPORTER_NEEDED = ("starlette", "uvicorn", "prometheus_client")


def check_dependencies(needed: tuple[str, ...] = NEEDED, extra: str = EXTRA) -> None:
    extras.check_dependencies(needed, extra)


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


def _checkpoints(args: argparse.Namespace, named: bool) -> list[tuple[str, Path]]:
    """The ``--checkpoint`` arguments as ``(query label, directory)``, each checked to be a
    directory; ``named``: ``NAME=DIR`` names the query (the exporter), else each is a path."""
    from rocketstore.pipeline.tools.metrics import query_names

    given = list(args.checkpoint or [])
    found = list(query_names(given)) if named else [(c, Path(c)) for c in given]
    for (_, path), text in zip(found, given, strict=True):
        if not path.is_dir():
            raise ConfigError(f"option --checkpoint={text}: no such directory")
    return found


def serve(
    args: argparse.Namespace,
    what: str,
    build: Callable[[str | None], ASGIApp],
    *,
    browser_login: bool,
) -> int:
    """Serve ``build(token)`` on ``--bind``/``--port`` until interrupted (see the module
    docstring for the token rule); ``what`` names the command in what it prints;
    ``browser_login``: whether the app's pages take ``?token=`` (:class:`.auth.Guard`), which
    the printed hint then offers."""
    import uvicorn

    from rocketstore.pipeline.console import auth

    loopback = is_loopback(args.bind)
    token: str | None = None
    if args.token_file is not None:
        token = auth.read_token(args.token_file)
    elif not loopback:
        token = auth.new_token()
    app = build(token)
    sock = bind(args.bind, args.port)
    url = url_of(sock)
    prog = f"rocketstore {what}"
    if token is not None and args.token_file is None:
        print(f"{prog}: token {token}", flush=True)
    print(f"{prog}: serving {args.root} at {url} (Ctrl-C stops it)", flush=True)
    if token is not None:
        header = "'Authorization: Bearer TOKEN' (Prometheus: authorization: credentials_file:)"
        if browser_login:
            hint = (
                f"open {url}?token=… once in a browser, or send {header}; /metrics: the header only"
            )
        else:
            hint = f"send {header}; a token in the URL is refused"
        print(f"{prog}: every request needs the token: {hint}", flush=True)
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
    sys.stdout.write(f"{prog}: stopped\n")
    return 0


def cmd_console(args: argparse.Namespace) -> int:
    """Serve the console until interrupted; returns 0 after a clean stop."""
    check_dependencies()
    from rocketstore.pipeline.config import StoreConfig
    from rocketstore.pipeline.console.app import create_app
    from rocketstore.pipeline.console.views import Console
    from rocketstore.pipeline.engine.root import StoreRoot

    root = Path(args.root)
    StoreRoot(root).check_readable("ROOT")
    console = Console(
        root.resolve(),
        StoreConfig.effective(args.config),
        tuple(path.resolve() for _, path in _checkpoints(args, named=False)),
        args.per_queue_limit,
    )
    return serve(args, "console", lambda token: create_app(console, token), browser_login=True)


def cmd_exporter(args: argparse.Namespace) -> int:
    """Serve ``/metrics`` alone until interrupted; returns 0 after a clean stop."""
    check_dependencies(EXPORTER_NEEDED, EXPORTER_EXTRA)
    from rocketstore.pipeline.config import StoreConfig
    from rocketstore.pipeline.console.exporter import create_exporter_app
    from rocketstore.pipeline.engine.root import StoreRoot
    from rocketstore.pipeline.tools.metrics import StoreCollector, Target

    root = Path(args.root)
    StoreRoot(root).check_readable("ROOT")
    checkpoints = _checkpoints(args, named=True)
    collector = StoreCollector(
        Target(
            root.resolve(),
            StoreConfig.effective(args.config),
            tuple((name, path.resolve()) for name, path in checkpoints),
            args.per_queue_limit,
        )
    )
    return serve(
        args,
        "exporter",
        lambda token: create_exporter_app(collector, root, token),
        browser_login=False,
    )
