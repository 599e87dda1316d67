"""The exporter's own rendering of /metrics is byte for byte what prometheus_client encodes."""

from __future__ import annotations

import math

import pytest
from prometheus_client.exposition import choose_encoder

from sentinel.serve.exporter import Row, StoreCollector, _fast_format, make_registry
from sentinel.store import Store, labels_of

ACCEPTS = [
    "",
    "*/*",
    "text/plain",
    "text/plain; version=0.0.4",
    "text/plain; version=1.0.0; escaping=underscores",
    "text/plain; version=1.0.0; escaping=allow-utf-8",
    "application/openmetrics-text",
    "application/openmetrics-text; version=1.0.0; charset=utf-8",
    "application/openmetrics-text; version=1.0.0; escaping=allow-utf-8",
    "application/openmetrics-text; version=0.0.1,text/plain;version=0.0.4;q=0.5",
    "application/openmetrics-text; version=1.0.0; escaping=dots",  # rendered by prometheus_client
    "application/openmetrics-text; version=1.0.0; escaping=values",  # rendered by prometheus_client
    "application/openmetrics-text; version=2.0.0",  # rendered by prometheus_client
]

VALUES = [0.0, -0.0, 1.0, -2.5, 1e-9, 12345678.0, 1e22, 3.0e-310, math.nan, math.inf, -math.inf, 0.1 + 0.2]


def _store() -> Store:
    store = Store(capacity=4)
    for rank in range(3):
        base = {"job": "j", "run": 'we"ird\\run\nname', "rank": rank}
        for i, v in enumerate(VALUES):
            store.add("sentinel_group_grad_norm", labels_of(**base, group=f"layers.{i}"), 1, 1.0, v)
        store.add("sentinel_loss", labels_of(**base), 1, 1.0, 0.5 + rank)
        store.add("sentinel_loss", labels_of(**base), 2, 2.0, 0.25 + rank)  # the latest value is exported
        store.set_counter("sentinel_steps_total", labels_of(**base), 7.0 + rank)
        store.inc("sentinel_nonfinite_total", labels_of(**base, source="grad"), float(rank == 1))
        store.add("sentinel_scalar", labels_of(**base, name="ünïcode ✓"), 1, 1.0, 1.0)
    # a series with other label names than the first of its metric is left out by both
    store.add("sentinel_step", labels_of(job="j", run="r", rank=0), 1, 1.0, 1.0)
    store.add("sentinel_step", labels_of(job="j", run="r", rank=0, extra="x"), 1, 1.0, 2.0)
    store.add("sentinel_not_in_the_catalog", labels_of(job="j", run="r", rank=0), 1, 1.0, 3.0)
    return store


def _extra() -> list[Row]:
    return [
        ("sentinel_daemon_up", "gauge", (), 1.0),
        ("sentinel_daemon_frames_received_total", "counter", (), 12.0),
        ("sentinel_daemon_queue_depth", "gauge", (), 0.0),
        # labels not in sorted order: both render them sorted
        ("sentinel_alert_firing", "gauge", (("severity", "critical"), ("alertname", "LossSpike")), 1.0),
        ("sentinel_alert_firing", "gauge", (("severity", "warning"), ("alertname", "OOMRisk")), 1.0),
        ("sentinel_notifications_total", "counter", (("result", "sent"),), 3.0),
        ("sentinel_custom_kind", "untyped", (), 4.0),
    ]


def _reference(collector: StoreCollector, accept: str) -> tuple[bytes, str]:
    encoder, ctype = choose_encoder(accept)
    return encoder(make_registry(collector)), ctype


@pytest.mark.parametrize("accept", ACCEPTS)
def test_exposition_is_identical_to_prometheus_client(accept: str) -> None:
    collector = StoreCollector(_store(), extra=_extra)
    expected = _reference(collector, accept)
    fast = "dots" not in accept and "values" not in accept and "2.0.0" not in accept
    assert (_fast_format(choose_encoder(accept)[0]) is not None) == fast
    assert collector.exposition(accept) == expected
    assert collector.exposition(accept) == expected  # again, from the cached label strings


@pytest.mark.parametrize("accept", ["", "application/openmetrics-text; version=1.0.0"])
@pytest.mark.parametrize("label", ["bad-name", "ok", "__reserved"])
def test_names_that_need_escaping_are_left_to_prometheus_client(accept: str, label: str) -> None:
    store = Store()
    store.add("sentinel_loss", ((label, "v"), ("rank", "0")), 1, 1.0, 1.0)
    collector = StoreCollector(store)
    assert collector.exposition(accept) == _reference(collector, accept)


def test_empty_store() -> None:
    collector = StoreCollector(Store())
    for accept in ("", "application/openmetrics-text"):
        assert collector.exposition(accept) == _reference(collector, accept)
