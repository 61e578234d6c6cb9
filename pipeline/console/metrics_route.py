"""``GET /metrics``: the store's metrics in Prometheus' text format (or OpenMetrics when the
scraper asks for it), served by the console and by ``rocketstore exporter``.

Parameters, each validated (a bad one answers 400 with a line saying which and why):

* ``name[]`` (repeatable, as Prometheus' own exporters take it): only these families, by the
  names :data:`rocketstore.pipeline.tools.metricfamilies.FAMILIES` lists (a counter's ``_total`` name is
  accepted too); an unknown name is an error, not an empty answer.
* ``per_queue``: ``auto`` (default: per-queue series when the root has at most the limit's
  queues), ``0`` (never) or ``1`` (always, whatever the count: for a one-off look).

The exposition is ``prometheus_client``'s. Thread-safety: the handler runs in Starlette's
thread pool; the collector serialises scrapes.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.exposition import choose_encoder
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from rocketstore.pipeline.console import params
from rocketstore.pipeline.errors import BadRequestError
from rocketstore.pipeline.tools.metricfamilies import FAMILIES
from rocketstore.pipeline.tools.metrics import Fixed, StoreCollector

MAX_NAMES = len(FAMILIES)
PER_QUEUE = {"auto": None, "0": False, "1": True}


def _names(values: list[str]) -> frozenset[str] | None:
    if not values:
        return None
    if len(values) > MAX_NAMES:
        raise BadRequestError(f"parameter name[]: at most {MAX_NAMES} names")
    out = set()
    for value in values:
        base = value.removesuffix("_total")
        kind = FAMILIES.get(base, ("",))[0]
        if value not in FAMILIES and not (kind == "counter" and base != value):
            raise BadRequestError(
                f"parameter name[]={params.short(value)}: no such metric (see /metrics for "
                "the names)"
            )
        out.add(base)
    return frozenset(out)


def metrics_handler(collector: StoreCollector) -> Callable[[Request], Response]:
    """The ``/metrics`` handler over ``collector``."""

    def metrics(request: Request) -> Response:
        q = request.query_params
        try:
            names = _names(q.getlist("name[]"))
            per_queue = PER_QUEUE[params.choice(q.get("per_queue"), "per_queue", list(PER_QUEUE))]
        except BadRequestError as exc:
            return PlainTextResponse(f"{exc}\n", status_code=400)
        families = collector.scrape(names, per_queue)
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(Fixed(families)), headers={"content-type": content_type})

    return metrics
