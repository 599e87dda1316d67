"""Prometheus exporter: a custom Collector that builds metric families at each scrape."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client import exposition as _text
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics import exposition as _om
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString, parse_version

from sentinel.catalog import spec
from sentinel.store import Labels, Row, Store

_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")  # every escaping scheme leaves such names alone
_MAX_CACHED_LABELS = 200_000


class StoreCollector(Collector):
    """Exports the latest value of every series in a store, plus extra rows.

    Args:
        store: the series store.
        extra: called at each scrape for more ``(name, kind, labels, value)`` rows, e.g.
            the engine's own health and the firing alerts.
        select: filters the store's rows at each scrape (an export profile).
    """

    def __init__(self, store: Store, extra: Callable[[], Iterable[Row]] | None = None,
                 select: Callable[[Iterable[Row]], Iterable[Row]] | None = None) -> None:
        self.store = store
        self.extra = extra
        self.select = select
        """Filters the store's rows (``serve/profile.py``: the ``fleet`` profile); None keeps all."""
        # rendered label sets and family headers, reused across scrapes: at 64 ranks x 64
        # groups, building them per sample is most of a scrape's time
        self._label_text: dict[Labels, tuple[tuple[str, ...], str] | None] = {}
        self._headers: dict[tuple[str, str, bool], tuple[str, str] | None] = {}

    def collect(self) -> Iterator[Metric]:
        for name, kind, series in self._families():
            label_names = [k for k, _ in series[0][0]]
            help_text = spec(name).help
            family: GaugeMetricFamily | CounterMetricFamily
            if kind == "counter":
                family = CounterMetricFamily(name.removesuffix("_total"), help_text, labels=label_names)
            else:
                family = GaugeMetricFamily(name, help_text, labels=label_names)
            for labels, value in series:
                if [k for k, _ in labels] == label_names:
                    family.add_metric([v for _, v in labels], value)
            yield family

    def exposition(self, accept: str) -> tuple[bytes, str]:
        """The body and content type of ``GET /metrics`` for an ``Accept`` header.

        The content is negotiated exactly as prometheus_client's ``choose_encoder`` does,
        and the bytes are identical to its encoders' output; the Prometheus text format and
        OpenMetrics 1.x are rendered here from cached label strings, anything else (e.g. the
        ``dots`` escaping) by prometheus_client itself.
        """
        encoder, ctype = _text.choose_encoder(accept)
        openmetrics = _fast_format(encoder)
        if openmetrics is not None:
            body = self._render(openmetrics)
            if body is not None:
                return body, ctype
        return encoder(self), ctype

    def _families(self) -> list[tuple[str, str, list[tuple[Labels, float]]]]:
        """``(name, kind, [(labels, value)])`` per metric, sorted by name."""
        rows: dict[str, list[tuple[Labels, float]]] = {}
        kinds: dict[str, str] = {}
        for name, kind, labels, value in self._rows():
            series = rows.get(name)
            if series is None:
                series = rows[name] = []
            series.append((labels, value))
            kinds[name] = kind
        return [(name, kinds[name], rows[name]) for name in sorted(rows)]

    def _render(self, openmetrics: bool) -> bytes | None:
        """What prometheus_client would encode from :meth:`collect`; None if a name needs escaping."""
        out: list[str] = []
        add = out.append
        go = floatToGoString
        label_text = self._label_text
        if len(label_text) > _MAX_CACHED_LABELS:  # series come and go with runs: stay bounded
            label_text.clear()
        for name, kind, series in self._families():
            header = self._header(name, kind, openmetrics)
            if header is None:
                return None
            head, sample = header
            add(head)
            first = label_text.get(series[0][0]) or self._label(series[0][0])
            if first is None:
                return None
            keys = first[0]
            for labels, value in series:
                entry = label_text.get(labels) or self._label(labels)
                if entry is None:
                    return None
                if entry[0] == keys:  # as collect(): a series with other label names is left out
                    add(f"{sample}{entry[1]} {go(value)}\n")
        if openmetrics:
            add("# EOF\n")
        return "".join(out).encode("utf-8")

    def _label(self, labels: Labels) -> tuple[tuple[str, ...], str] | None:
        keys = tuple(k for k, _ in labels)
        if not all(_NAME.fullmatch(k) for k in keys):
            return None
        text = ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(labels))
        entry = self._label_text[labels] = (keys, "{" + text + "}" if text else "")
        return entry

    def _header(self, name: str, kind: str, openmetrics: bool) -> tuple[str, str] | None:
        key = (name, kind, openmetrics)
        if key in self._headers:
            return self._headers[key]
        help_text = spec(name).help
        family = name.removesuffix("_total") if kind == "counter" else name
        sample = family + "_total" if kind == "counter" else family
        mtype = "counter" if kind == "counter" else "gauge"  # as collect(): anything else is a gauge
        out: tuple[str, str] | None
        if not _NAME.fullmatch(family):
            out = None
        elif openmetrics:
            doc = help_text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
            out = (f"# HELP {family} {doc}\n# TYPE {family} {mtype}\n", sample)
        else:
            doc = help_text.replace("\\", r"\\").replace("\n", r"\n")
            out = (f"# HELP {sample} {doc}\n# TYPE {sample} {mtype}\n", sample)
        self._headers[key] = out
        return out

    def _rows(self) -> Iterator[Row]:
        yield from (self.store.snapshot() if self.select is None else self.select(self.store.snapshot()))
        if self.extra is not None:
            yield from self.extra()


def _escape_value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _fast_format(encoder: Callable[..., bytes]) -> bool | None:
    """True for OpenMetrics 1.x, False for the Prometheus text format, None for others."""
    func, kw = encoder, {}
    if isinstance(encoder, functools.partial):
        func, kw = encoder.func, encoder.keywords
    if kw.get("escaping", _om.UNDERSCORES) not in (_om.UNDERSCORES, _om.ALLOWUTF8):
        return None
    if func is _text.generate_latest:
        return False
    if func is _om.generate_latest and parse_version(kw.get("version", "1.0.0"))[:1] == (1,):
        return True
    return None


def make_registry(collector: Collector) -> CollectorRegistry:
    """A registry of our own (never the global one) holding only ``collector``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry
