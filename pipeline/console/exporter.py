"""``rocketstore exporter ROOT``'s application: ``/metrics`` (:mod:`.metrics_route`) and a
plain-text index at ``/``, behind the console's guard (:mod:`.auth`: loopback only without a
token, the token in the ``Authorization`` header of every request with one, never in the URL:
no route here is a page a person logs in on) and security headers.

Light on purpose: no templates and no charts are imported (starlette, uvicorn and
prometheus_client only), for hosts that scrape a store but should not serve its messages.
"""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from rocketstore.pipeline.console.auth import Guard
from rocketstore.pipeline.console.headers import SecurityHeaders
from rocketstore.pipeline.console.metrics_route import metrics_handler
from rocketstore.pipeline.tools.metrics import StoreCollector


def create_exporter_app(collector: StoreCollector, root: Path, token: str | None) -> Starlette:
    """The exporter's ASGI application over ``collector`` (which reads ``root``)."""

    def index(request: Request) -> Response:
        return PlainTextResponse(
            f"rocketstore exporter of {root}\nmetrics: /metrics (Prometheus text format)\n"
        )

    async def not_found(request: Request, exc: Exception) -> Response:
        return PlainTextResponse("no such page: the metrics are at /metrics\n", status_code=404)

    return Starlette(
        routes=[Route("/", index), Route("/metrics", metrics_handler(collector))],
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(Guard, token=token, browser_login=False),
        ],
        exception_handlers={404: not_found},
    )
