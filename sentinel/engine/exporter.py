"""Prometheus exporter: a custom Collector that builds metric families at each scrape."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sentinel.engine.catalog import spec
from sentinel.engine.store import Labels, Store

Row = tuple[str, str, Labels, float]


class StoreCollector(Collector):
    """Exports the latest value of every series in a store, plus extra rows.

    Args:
        store: the series store.
        extra: called at each scrape for more ``(name, kind, labels, value)`` rows, e.g.
            the engine's own health and the firing alerts.
    """

    def __init__(self, store: Store, extra: Callable[[], Iterable[Row]] | None = None) -> None:
        self.store = store
        self.extra = extra

    def collect(self) -> Iterator[Metric]:
        rows: dict[str, list[tuple[Labels, float]]] = {}
        kinds: dict[str, str] = {}
        for name, kind, labels, value in self._rows():
            rows.setdefault(name, []).append((labels, value))
            kinds[name] = kind
        for name in sorted(rows):
            series = rows[name]
            label_names = [k for k, _ in series[0][0]]
            help_text = spec(name).help
            family: GaugeMetricFamily | CounterMetricFamily
            if kinds[name] == "counter":
                family = CounterMetricFamily(name.removesuffix("_total"), help_text, labels=label_names)
            else:
                family = GaugeMetricFamily(name, help_text, labels=label_names)
            for labels, value in series:
                if [k for k, _ in labels] == label_names:
                    family.add_metric([v for _, v in labels], value)
            yield family

    def _rows(self) -> Iterator[Row]:
        yield from self.store.snapshot()
        if self.extra is not None:
            yield from self.extra()


def make_registry(collector: Collector) -> CollectorRegistry:
    """A registry of our own (never the global one) holding only ``collector``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry
