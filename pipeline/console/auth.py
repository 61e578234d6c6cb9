"""Who may use the console and the exporter: the token, and the host names a loopback server
answers to.

* With a token (required when the server binds an address other than loopback), every
  request carries it in ``Authorization: Bearer TOKEN``. Anything else gets 401. Tokens are
  compared in constant time.
* The console's pages (``browser_login``) also take it as ``?token=TOKEN`` once, for a person
  opening the console in a browser: that sets an HttpOnly, SameSite=Strict cookie and
  redirects to the same address without it (so the token does not stay in the address bar or
  the history); the cookie then opens every page, ``/metrics`` included.
* A token in the URL is refused (400 saying to send the header; no redirect, no cookie) on
  ``/metrics``, and on every path of an app without ``browser_login`` (the exporter, which
  takes the header only and ignores cookies). A scraper's URL is kept in its configuration and
  logged by every proxy and server on the way; a page's ``?token=`` is a one-off in a browser.
  Refused whatever its value (never compared: no oracle), with or without a token set.
* Without a token (loopback only), requests must name a loopback host (``Host: 127.0.0.1``,
  ``localhost`` or ``[::1]``): a web page elsewhere cannot reach the server through a DNS
  name it points at 127.0.0.1 (DNS rebinding).
* A POST (the health page's "verify now") must come from the console's own pages: its
  ``Origin``, when the browser sends one, names the same host.

A pure ASGI middleware; holds no state but its settings, so thread-safe.
"""

from __future__ import annotations

import hmac
import secrets
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import URL, Headers
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from rocketstore.pipeline.errors import ConfigError

COOKIE = "rocketstore_console"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]", "::1"})
MIN_TOKEN_LENGTH = 16
METRICS_PATH = "/metrics"  # for scrapers: the token in the header only


def new_token() -> str:
    return secrets.token_urlsafe(32)


def read_token(path: str | Path) -> str:
    """The token in a file (its first line, stripped); :class:`ConfigError` when the file is
    empty or the token shorter than :data:`MIN_TOKEN_LENGTH`."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"option --token-file={path}: {exc}") from None
    token = lines[0].strip() if lines else ""
    if len(token) < MIN_TOKEN_LENGTH or not token.isprintable() or " " in token:
        raise ConfigError(
            f"option --token-file={path}: the first line must be a token of at least "
            f"{MIN_TOKEN_LENGTH} printable characters without spaces"
        )
    return token


def _host_name(host_header: str) -> str:
    """The host of a ``Host`` header without its port (IPv6 literals keep their brackets)."""
    if host_header.startswith("["):
        return host_header[: host_header.find("]") + 1] if "]" in host_header else host_header
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


class Guard:
    """The middleware: see the module docstring. ``token`` ``None``: loopback, no token.
    ``browser_login``: the app has pages a person opens in a browser, which may trade
    ``?token=`` for a cookie; false: the header only, on every path."""

    def __init__(self, app: ASGIApp, token: str | None, *, browser_login: bool = True) -> None:
        self.app = app
        self.token = token
        self.browser_login = browser_login

    def _valid(self, candidate: str | None) -> bool:
        if self.token is None or not candidate:
            return False
        return hmac.compare_digest(candidate.encode(), self.token.encode())

    def _header_only(self, path: str) -> bool:
        # "/metrics/" too: the router redirects it to /metrics, after the exchange would have run.
        return not self.browser_login or path.rstrip("/") == METRICS_PATH

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        response = self._check(scope)
        if response is not None:
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _check(self, scope: Scope) -> Response | None:
        headers = Headers(scope=scope)
        host = _host_name(headers.get("host", ""))
        if scope["method"] not in ("GET", "HEAD"):
            origin = headers.get("origin")
            if origin is not None and _host_name(URL(origin).netloc) != host:
                return PlainTextResponse("cross-origin request refused\n", status_code=403)
        if self.token is None and host.lower() not in LOOPBACK_HOSTS:
            return PlainTextResponse(
                "this console answers on the loopback address only; reach it through "
                "127.0.0.1 (an SSH tunnel from another host)\n",
                status_code=403,
            )
        query = scope.get("query_string", b"").decode("latin-1")
        pairs = parse_qsl(query, keep_blank_values=True)
        given = [v for k, v in pairs if k == "token"]
        header_only = self._header_only(scope["path"])
        if given and header_only:
            return _url_token_refused()
        if self.token is None:
            return None
        if given:
            if not self._valid(given[-1]):
                return _unauthorized(header_only)
            # Trade the token in the address for a cookie, and drop it from the address.
            rest = urlencode([(k, v) for k, v in pairs if k != "token"])
            target = scope.get("root_path", "") + scope["path"] + (f"?{rest}" if rest else "")
            redirect = RedirectResponse(target, status_code=303)
            redirect.set_cookie(COOKIE, self.token, httponly=True, samesite="strict", path="/")
            return redirect
        auth = headers.get("authorization", "")
        scheme, _, credential = auth.partition(" ")
        if scheme.lower() == "bearer" and self._valid(credential.strip()):
            return None
        # The login cookie opens /metrics too, for a person looking by hand: a read that changes
        # nothing, SameSite=Strict, and the same cookie opens pages that show far more (see
        # docs/monitoring.md). The exporter never sets it, and does not take the console's.
        if self.browser_login and self._valid(_cookies(headers.get("cookie", "")).get(COOKIE)):
            return None
        return _unauthorized(header_only)


def _cookies(header: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        if name:
            out[name] = value
    return out


HEADER_HINT = (
    "send it in the header 'Authorization: Bearer TOKEN' "
    "(Prometheus: authorization: credentials_file: FILE)"
)


def _url_token_refused() -> Response:
    return PlainTextResponse(
        "a token in the URL is refused here (URLs are kept in scrape configurations and logged "
        f"by proxies and servers): {HEADER_HINT}\n",
        status_code=400,
    )


def _unauthorized(header_only: bool) -> Response:
    text = (
        f"this needs the token: {HEADER_HINT}\n"
        if header_only
        else "this console needs its token: open the address `rocketstore console` printed "
        "(…/?token=…), or send 'Authorization: Bearer TOKEN'\n"
    )
    return PlainTextResponse(text, status_code=401, headers={"WWW-Authenticate": "Bearer"})
