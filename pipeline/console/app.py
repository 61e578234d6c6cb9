"""The console's Starlette application: routes, templates and error pages.

Routes (every one read-only but ``POST /health/verify``, which starts a read-only verify)::

    GET  /?page=N               overview: brokers, topics (500 a page), disk, the last hour's
                                write rate
    GET  /topic/{topic}         a topic's queues and messages per minute
    GET  /messages?topic=...    browse a queue (broker, queue, offset or time), or look up
                                by key, msgid, or CommitLog offset (broker, phys)
    GET  /message?broker=&offset=   one message: fields, properties, decoded body
    GET  /consumers             Spark queries (--checkpoint) and consumer groups with their lag
    GET  /health                verify runs and their problems
    GET  /metrics               the store's metrics for Prometheus (:mod:`.metrics_route`)
    POST /health/verify         start a verify run
    GET  /static/...            the stylesheet and the refresh script

Every parameter goes through :mod:`.params`; a bad one answers 400, something the store does
not have 404, each with a page saying which and why. Responses are bounded: at most
:data:`~.params.MAX_PAGE` messages a page, :data:`~.views.BODY_CAP` bytes of a body.

Handlers are plain functions that Starlette runs in its thread pool; each opens the stores it
reads and closes them (see :mod:`.views`), so requests run in parallel safely.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from rocketstore.pipeline.console import charts, params, views
from rocketstore.pipeline.console.auth import Guard
from rocketstore.pipeline.console.headers import SecurityHeaders
from rocketstore.pipeline.console.health import Health
from rocketstore.pipeline.console.metrics_route import metrics_handler
from rocketstore.pipeline.console.overview import overview as gather_overview
from rocketstore.pipeline.errors import InvalidMessageError, NotFoundError, StoreError
from rocketstore.pipeline.metrics import StoreCollector, Target

# The real folder: an editable install links each file, and StaticFiles refuses links.
HERE = Path(__file__).resolve().parent
MAX_CHART_BARS = 48
TOPICS_PAGE = 500  # topics a page of the overview lists
_FORM = ("broker", "queue", "offset", "time", "key", "msgid", "phys")  # echoed back into the form


def _number(value: float | None) -> str:
    return "—" if value is None else f"{round(value):,}"


def _bytes(value: float | None) -> str:
    if value is None:
        return "—"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _ago(ms: int | None, now: int) -> str:
    if ms is None:
        return ""
    seconds = max(0, (now - ms) // 1000)
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    if seconds < 172800:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} d ago"


def environment() -> jinja2.Environment:
    """The templates, autoescaped: every value from the store or a request is shown escaped."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(
        number=_number,
        bytes=_bytes,
        time=views.fmt_time,
        ago=_ago,
        pct=lambda v: "—" if v is None or v < 0 else f"{100 * v:.1f} %",
        preview=views.preview,
    )
    return env


def create_app(console: views.Console, token: str | None = None) -> Starlette:
    """The console's ASGI application over ``console``; ``token``: see :mod:`.auth`."""
    env = environment()
    health = Health(console)
    collector = StoreCollector(
        Target(
            console.root,
            console.config,
            tuple((str(c), c) for c in console.checkpoints),
            console.per_queue_limit,
        ),
        verify=health.last_result,
    )

    def render(name: str, part: str, **context: Any) -> str:
        return env.get_template(name).render(
            root=console.root, nav=name.removesuffix(".html"), part=part, **context
        )

    def page(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        return HTMLResponse(render(name, "all", **context), status_code=status)

    def streamed(name: str, gather: Callable[[], dict[str, Any]], **head: Any) -> Response:
        """A page whose head (up to ``<main>``) is sent at once and the rest once ``gather``
        has read the store: the browser fetches the stylesheet and draws the header meanwhile.
        Its status is 200 by then, so ``gather`` must not fail on the request's input
        (check that first); a store that cannot be read ends the page with the error."""

        def chunks() -> Iterator[str]:
            yield render(name, "head", **head)
            try:
                context = gather()
            except (StoreError, OSError) as exc:
                message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                yield render(
                    "error.html", "rest", title="The store could not be read", message=message
                )
                return
            yield render(name, "rest", **head, **context)

        return StreamingResponse(chunks(), media_type="text/html; charset=utf-8")

    def error_page(request: Request, status: int, message: str) -> HTMLResponse:
        titles = {400: "Bad request", 404: "Not found", 405: "Method not allowed"}
        return page(
            request, "error.html", status, title=titles.get(status, "Error"), message=message
        )

    def overview(request: Request) -> Response:
        number = params.integer(request.query_params.get("page"), "page", low=1, default=1)

        def gather() -> dict[str, Any]:
            data = gather_overview(console)
            chart = charts.rate_chart(
                "messages written per minute, last hour", data.edges, data.rate
            )
            # A root of 10,000 topics is shown TOPICS_PAGE topics a page (past the last: it).
            pages = max(1, -(-len(data.topics) // TOPICS_PAGE))
            page_at = min(number, pages)
            return {
                "data": data,
                "chart": Markup(chart),
                "hour_sample": data.hour_sample,
                "size_sample": data.size_sample,
                "shown": data.topics[(page_at - 1) * TOPICS_PAGE : page_at * TOPICS_PAGE],
                "page": page_at,
                "pages": pages,
                "first_shown": (page_at - 1) * TOPICS_PAGE + 1,
            }

        return streamed("overview.html", gather)

    def topic(request: Request) -> Response:
        name = params.topic(request.path_params["topic"])
        if name not in views.topic_names(console):  # before the page's head is sent
            raise NotFoundError(f"no topic {name!r} in this root")

        def gather() -> dict[str, Any]:
            data = views.topic(console, name)
            unit = (
                "messages / minute"
                if data.width_ms == 60_000
                else f"messages / {data.width_ms // 60_000} min"
            )
            chart = charts.rate_chart(
                f"messages of {name} per bucket", data.edges, data.series, unit
            )
            return {
                "data": data,
                "chart": Markup(chart),
                "unit": unit,
                "topic_sample": views.TOPIC_SAMPLE,
            }

        return streamed("topic.html", gather, topic_name=name)

    def messages(request: Request) -> Response:
        q = request.query_params
        topics = views.topic_names(console)
        if not q.get("topic"):
            # The form alone, to pick a topic.
            return page(
                request,
                "messages.html",
                topic=None,
                topics=topics,
                by="queue",
                brokers=[b for b, _ in console.brokers()],
                form=dict.fromkeys(_FORM, ""),
                count=20,
                browse=None,
                found=None,
                body_format="binary",
            )
        name = params.topic(q.get("topic"))
        by = params.choice(q.get("by"), "by", ("queue", "key", "msgid", "offset"))
        count = params.integer(q.get("count"), "count", low=1, high=params.MAX_PAGE, default=20)
        brokers = console.brokers()
        meta, _ = console.topic_meta()
        context: dict[str, Any] = {
            "topic": name,
            "topics": topics,
            "by": by,
            "brokers": [b for b, _ in brokers],
            "form": {k: q.get(k, "")[:200] for k in _FORM},
            "count": count,
            "browse": None,
            "found": None,
        }
        if by == "queue":
            if q.get("broker") or len(brokers) == 1:
                broker = params.broker(q.get("broker") or brokers[0][0], brokers)
            elif brokers:
                broker = brokers[0]
            else:
                raise NotFoundError("this root has no broker with a store yet")
            queue = params.integer(q.get("queue"), "queue", high=2**31 - 1, default=0)
            offset = params.integer(q.get("offset"), "offset", default=-1)
            when = params.timestamp(q.get("time"))
            context["browse"] = views.browse(
                console,
                broker,
                name,
                queue,
                offset=None if offset < 0 else offset,
                when=when,
                count=count,
            )
            context["form"]["broker"] = broker[0]
        elif by == "key":
            key = params.key(q.get("key"))
            try:
                context["found"] = views.by_key(console, name, key, count)
            except InvalidMessageError as exc:  # messageIndexEnable=false: no index to ask
                raise NotFoundError(str(exc)) from None
        elif by == "msgid":
            found = views.by_msg_id(console, params.msg_id(q.get("msgid")))
            context["found"] = [found]
        else:
            broker = params.broker(q.get("broker"), brokers)
            offset = params.integer(q.get("phys"), "phys")
            context["found"] = [views.by_offset(console, broker, offset)]
        body_format = meta[name].body_format if name in meta else "binary"
        return page(request, "messages.html", body_format=body_format, **context)

    def message(request: Request) -> Response:
        q = request.query_params
        broker = params.broker(q.get("broker"), console.brokers())
        offset = params.integer(q.get("offset"), "offset")
        found = views.by_offset(console, broker, offset)
        meta, _ = console.topic_meta()
        fmt = meta[found.message.topic].body_format if found.message.topic in meta else "binary"
        body = views.decode_body(console, found.message, fmt)
        return page(request, "message.html", found=found, m=found.message, body=body, fmt=fmt)

    def consumers(request: Request) -> Response:
        found, note = views.consumers(console)
        chart_of: dict[int, Markup] = {}
        for i, c in enumerate(found):
            rows = [r for r in c.rows if r.lag is not None][:MAX_CHART_BARS]
            if rows:
                chart_of[i] = Markup(
                    charts.bar_chart(
                        f"lag of {c.name}",
                        views.lag_labels(rows),
                        [int(r.lag or 0) for r in rows],
                        "messages behind",
                    )
                )
        return page(
            request,
            "consumers.html",
            consumers=found,
            charts=chart_of,
            note=note,
            now=views.now_ms(),
            max_bars=MAX_CHART_BARS,
        )

    def health_page(request: Request) -> Response:
        state = health.snapshot()
        return page(
            request,
            "health.html",
            state=state,
            brokers=[b for b, _ in console.brokers()],
            started=None if state is None else dt.datetime.fromtimestamp(state.started, dt.UTC),
        )

    def verify_now(request: Request) -> Response:
        health.start()
        return RedirectResponse("/health", status_code=303)

    def handler(fn: Callable[[Request], Response]) -> Callable[[Request], Response]:
        def run(request: Request) -> Response:
            try:
                return fn(request)
            except params.BadRequestError as exc:
                return error_page(request, 400, str(exc))
            except InvalidMessageError as exc:  # a malformed msgId the store refused
                return error_page(request, 400, str(exc))
            except NotFoundError as exc:
                return error_page(request, 404, str(exc))

        return run

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = "no such page" if exc.status_code == 404 else str(exc.detail)
        return error_page(request, exc.status_code, message)

    async def store_error(request: Request, exc: Exception) -> Response:
        # Not the request's fault: the store could not be read (damage, a vanished file).
        return page(
            request,
            "error.html",
            500,
            title="The store could not be read",
            message=str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
        )

    routes = [
        Route("/", handler(overview)),
        Route("/topic/{topic}", handler(topic)),
        Route("/messages", handler(messages)),
        Route("/message", handler(message)),
        Route("/consumers", handler(consumers)),
        Route("/health", handler(health_page)),
        Route("/health/verify", handler(verify_now), methods=["POST"]),
        Route("/metrics", metrics_handler(collector)),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(SecurityHeaders), Middleware(Guard, token=token)],
        exception_handlers={
            HTTPException: http_error,
            StoreError: store_error,
            OSError: store_error,
        },
    )
    app.state.health = health
    return app
