"""A metrics collector's samples as Prometheus reads them: through the text format.

:func:`scrape` gives sample name -> {sorted labels: value}; :func:`by` keys one family's
series by the values of some of their labels.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

Series = dict[tuple[tuple[str, str], ...], float]


def scrape(collector: Collector) -> dict[str, Series]:
    """Sample name -> {sorted labels: value}, through the text format Prometheus reads."""
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    out: dict[str, Series] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def by(series: Series, *names: str) -> dict[tuple[str, ...], float]:
    """``series`` keyed by the values of the labels ``names`` (each series must have them)."""
    return {tuple(dict(k)[n] for n in names): v for k, v in series.items()}
