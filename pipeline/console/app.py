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

Each page is a method of :class:`Pages`, a plain function of the request that Starlette runs
in its thread pool; each opens the stores it reads and closes them (see :mod:`.views`), so
requests run in parallel safely. What a page shows is gathered by :mod:`.views` and
:mod:`.overview`; :func:`create_app` only wires the routes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from rocketstore.pipeline.console import charts, overview, params, views
from rocketstore.pipeline.console.auth import Guard
from rocketstore.pipeline.console.headers import SecurityHeaders
from rocketstore.pipeline.console.health import Health
from rocketstore.pipeline.console.metrics_route import metrics_handler
from rocketstore.pipeline.errors import (
    BadRequestError,
    InvalidMessageError,
    NotFoundError,
    StoreError,
)
from rocketstore.pipeline.tools.metrics import StoreCollector, Target

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


class Pages:
    """The console's pages over one :class:`~.views.Console`: each public method answers one
    route, a plain function of the request that Starlette runs in its thread pool. A bad
    parameter raises :class:`~rocketstore.pipeline.errors.BadRequestError`, something the store lacks
    :class:`NotFoundError` (:func:`_answered` turns them into 400 and 404 pages); a store that
    cannot be read is the application's 500 page (:meth:`store_error`).

    Thread-safety: the methods run in parallel; they share the templates (read-only once
    built) and :class:`Health` (which locks its own state); each opens the stores it reads."""

    def __init__(self, console: views.Console, env: jinja2.Environment, health: Health) -> None:
        self.console, self.env, self.health = console, env, health

    # -- rendering

    def render(self, name: str, part: str, **context: Any) -> str:
        return self.env.get_template(name).render(
            root=self.console.root, nav=name.removesuffix(".html"), part=part, **context
        )

    def page(self, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        return HTMLResponse(self.render(name, "all", **context), status_code=status)

    def streamed(self, name: str, gather: Callable[[], dict[str, Any]], **head: Any) -> Response:
        """A page whose head (up to ``<main>``) is sent at once and the rest once ``gather``
        has read the store: the browser fetches the stylesheet and draws the header meanwhile.
        Its status is 200 by then, so ``gather`` must not fail on the request's input
        (check that first); a store that cannot be read ends the page with the error."""

        def chunks() -> Iterator[str]:
            yield self.render(name, "head", **head)
            try:
                context = gather()
            except (StoreError, OSError) as exc:
                yield self.render(
                    "error.html", "rest", title="The store could not be read", message=_first(exc)
                )
                return
            yield self.render(name, "rest", **head, **context)

        return StreamingResponse(chunks(), media_type="text/html; charset=utf-8")

    def error_page(self, status: int, message: str) -> HTMLResponse:
        titles = {400: "Bad request", 404: "Not found", 405: "Method not allowed"}
        return self.page("error.html", status, title=titles.get(status, "Error"), message=message)

    # -- the routes

    def overview(self, request: Request) -> Response:
        number = params.integer(request.query_params.get("page"), "page", low=1, default=1)
        return self.streamed("overview.html", lambda: _overview_context(self.console, number))

    def topic(self, request: Request) -> Response:
        name = params.topic(request.path_params["topic"])
        if name not in views.topic_names(self.console):  # before the page's head is sent
            raise NotFoundError(f"no topic {name!r} in this root")
        return self.streamed(
            "topic.html", lambda: _topic_context(self.console, name), topic_name=name
        )

    def messages(self, request: Request) -> Response:
        q = request.query_params
        topics = views.topic_names(self.console)
        if not q.get("topic"):
            # The form alone, to pick a topic.
            return self.page(
                "messages.html",
                topic=None,
                topics=topics,
                by="queue",
                brokers=[b for b, _ in self.console.brokers()],
                form=dict.fromkeys(_FORM, ""),
                count=20,
                browse=None,
                found=None,
                body_format="binary",
            )
        name = params.topic(q.get("topic"))
        by = params.choice(q.get("by"), "by", ("queue", "key", "msgid", "offset"))
        count = params.integer(q.get("count"), "count", low=1, high=params.MAX_PAGE, default=20)
        brokers = self.console.brokers()
        meta, _ = self.console.topic_meta()
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
            broker = _browsed_broker(q.get("broker"), brokers)
            context["browse"] = _browse(self.console, q, broker, name, count)
            context["form"]["broker"] = broker[0]
        else:
            context["found"] = _look_up(self.console, q, by, brokers, name, count)
        body_format = meta[name].body_format if name in meta else "binary"
        return self.page("messages.html", body_format=body_format, **context)

    def message(self, request: Request) -> Response:
        q = request.query_params
        broker = params.broker(q.get("broker"), self.console.brokers())
        offset = params.integer(q.get("offset"), "offset")
        found = views.by_offset(self.console, broker, offset)
        meta, _ = self.console.topic_meta()
        fmt = meta[found.message.topic].body_format if found.message.topic in meta else "binary"
        body = views.decode_body(self.console, found.message, fmt)
        return self.page("message.html", found=found, m=found.message, body=body, fmt=fmt)

    def consumers(self, request: Request) -> Response:
        found, note = views.consumers(self.console)
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
        return self.page(
            "consumers.html",
            consumers=found,
            charts=chart_of,
            note=note,
            now=views.now_ms(),
            max_bars=MAX_CHART_BARS,
        )

    def health_page(self, request: Request) -> Response:
        state = self.health.snapshot()
        return self.page(
            "health.html",
            state=state,
            brokers=[b for b, _ in self.console.brokers()],
            started=None if state is None else dt.datetime.fromtimestamp(state.started, dt.UTC),
        )

    def verify_now(self, request: Request) -> Response:
        self.health.start()
        return RedirectResponse("/health", status_code=303)

    # -- the application's error pages

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = "no such page" if exc.status_code == 404 else str(exc.detail)
        return self.error_page(exc.status_code, message)

    async def store_error(self, request: Request, exc: Exception) -> Response:
        # Not the request's fault: the store could not be read (damage, a vanished file).
        return self.page(
            "error.html", 500, title="The store could not be read", message=_first(exc)
        )


def _first(exc: BaseException) -> str:
    """An error's first line (its type's name when it has no message)."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _overview_context(console: views.Console, number: int) -> dict[str, Any]:
    """The overview page's context, its topics at page ``number`` (past the last: the last)."""
    data = overview.overview(console)
    chart = charts.rate_chart("messages written per minute, last hour", data.edges, data.rate)
    # A root of 10,000 topics is shown TOPICS_PAGE topics a page.
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


def _topic_context(console: views.Console, name: str) -> dict[str, Any]:
    """A topic page's context: its queues and its messages per bucket."""
    data = views.topic(console, name)
    unit = (
        "messages / minute"
        if data.width_ms == 60_000
        else f"messages / {data.width_ms // 60_000} min"
    )
    chart = charts.rate_chart(f"messages of {name} per bucket", data.edges, data.series, unit)
    return {
        "data": data,
        "chart": Markup(chart),
        "unit": unit,
        "topic_sample": views.TOPIC_SAMPLE,
    }


def _browsed_broker(named: str | None, brokers: list[tuple[str, Path]]) -> tuple[str, Path]:
    """The broker a queue is browsed on: the one named, else the first."""
    if named or len(brokers) == 1:
        return params.broker(named or brokers[0][0], brokers)
    if brokers:
        return brokers[0]
    raise NotFoundError("this root has no broker with a store yet")


def _browse(
    console: views.Console,
    q: QueryParams,
    broker: tuple[str, Path],
    name: str,
    count: int,
) -> views.Browse:
    """A page of the queue the form names, from its offset or time (default: its first)."""
    queue = params.integer(q.get("queue"), "queue", high=2**31 - 1, default=0)
    offset = params.integer(q.get("offset"), "offset", default=-1)
    when = params.timestamp(q.get("time"))
    return views.browse(
        console,
        broker,
        name,
        queue,
        offset=None if offset < 0 else offset,
        when=when,
        count=count,
    )


def _look_up(
    console: views.Console,
    q: QueryParams,
    by: str,
    brokers: list[tuple[str, Path]],
    name: str,
    count: int,
) -> list[views.Found]:
    """The messages the form looks up ``by`` key, msgId or CommitLog offset."""
    if by == "key":
        key = params.key(q.get("key"))
        try:
            return views.by_key(console, name, key, count)
        except InvalidMessageError as exc:  # messageIndexEnable=false: no index to ask
            raise NotFoundError(str(exc)) from None
    if by == "msgid":
        return [views.by_msg_id(console, params.msg_id(q.get("msgid")))]
    broker = params.broker(q.get("broker"), brokers)
    offset = params.integer(q.get("phys"), "phys")
    return [views.by_offset(console, broker, offset)]


def _answered(pages: Pages, route: Callable[[Request], Response]) -> Callable[[Request], Response]:
    """``route`` with a bad request answered 400 and something the store lacks 404, each with
    a page saying why."""

    def run(request: Request) -> Response:
        try:
            return route(request)
        except BadRequestError as exc:
            return pages.error_page(400, str(exc))
        except InvalidMessageError as exc:  # a malformed msgId the store refused
            return pages.error_page(400, str(exc))
        except NotFoundError as exc:
            return pages.error_page(404, str(exc))

    return run


def create_app(console: views.Console, token: str | None = None) -> Starlette:
    """The console's ASGI application over ``console``; ``token``: see :mod:`.auth`."""
    health = Health(console)
    pages = Pages(console, environment(), health)
    collector = StoreCollector(
        Target(
            console.root,
            console.config,
            tuple((str(c), c) for c in console.checkpoints),
            console.per_queue_limit,
        ),
        verify=health.last_result,
    )
    routes = [
        Route("/", _answered(pages, pages.overview)),
        Route("/topic/{topic}", _answered(pages, pages.topic)),
        Route("/messages", _answered(pages, pages.messages)),
        Route("/message", _answered(pages, pages.message)),
        Route("/consumers", _answered(pages, pages.consumers)),
        Route("/health", _answered(pages, pages.health_page)),
        Route("/health/verify", _answered(pages, pages.verify_now), methods=["POST"]),
        Route("/metrics", metrics_handler(collector)),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(SecurityHeaders), Middleware(Guard, token=token)],
        exception_handlers={
            HTTPException: pages.http_error,
            StoreError: pages.store_error,
            OSError: pages.store_error,
        },
    )
    app.state.health = health
    return app
