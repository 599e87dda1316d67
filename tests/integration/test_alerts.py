"""Alerts reach people and programs: apprise chat, the HTTP API, /metrics, callbacks, stop."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

import sentinel
from sentinel import wire
from tests.helpers import MLP, Receiver, train_steps, wait_for, write_config

pytestmark = pytest.mark.integration


def _poison_at(model: MLP, step: int) -> Any:
    def before(i: int) -> None:
        if i >= step:
            model.layers[1][0].weight.grad[0, 0] = float("nan")
    return before


@pytest.mark.parametrize("engine", ["process", "thread"])
def test_nan_alert_reaches_chat_api_and_metrics(tmp_path: Path, receiver: Receiver, engine: str,
                                                capfd: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cfg = write_config(tmp_path, notify={"urls": [receiver.url], "min_severity": "warning"})
    mon = sentinel.watch(model, opt, listen="127.0.0.1:0", run="nan-run", job="ci", config=cfg, engine=engine)
    try:
        train_steps(model, opt, 12, mon, before_step=_poison_at(model, 8))
        body = wait_for(lambda: next((b for b in receiver.bodies if "TrainingNonFinite" in b.get("title", "")), None),
                        what="the chat message")
        text = body["title"] + "\n" + body["message"]
        for needle in ("FIRING", "TrainingNonFinite", "critical", "run nan-run", "rank 0", "layers.1",
                       "since step 9", "started at step: 9", "against threshold", "first checks:", "1. "):
            assert needle in text, f"{needle!r} missing from:\n{text}"
        with urllib.request.urlopen(mon.url + "/api/v1/alerts", timeout=5) as r:
            alerts = json.load(r)["data"]["alerts"]
        [a] = [a for a in alerts if a["alertname"] == "TrainingNonFinite"]
        assert a["state"] == "firing" and a["severity"] == "critical" and a["run"] == "nan-run"
        assert a["ranks"] == [0] and "layers.1" in a["groups"] and a["step"] >= 9
        assert a["started_step"] == 9 and a["last_step"] == a["step"]
        for field in ("value", "threshold", "summary", "started_at", "resolved_at", "last_value"):
            assert field in a
        with urllib.request.urlopen(mon.url + "/metrics", timeout=5) as r:
            metrics = r.read().decode()
        assert 'sentinel_alert_firing{alertname="TrainingNonFinite"' in metrics
        # Prometheus asks for OpenMetrics first: that rendering must parse too (one family per name)
        req = urllib.request.Request(mon.url + "/metrics",
                                     headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        with urllib.request.urlopen(req, timeout=5) as r:
            families = {f.name for f in openmetrics_families(r.read().decode())}
        assert {"sentinel_alert_firing", "sentinel_nonfinite", "sentinel_grad_norm"} <= families
    finally:
        mon.close()
    # closing the run while the NaN still fires closes the alert, delivered as ended, not as a recovery
    closed = wait_for(lambda: next((b for b in receiver.bodies if "TrainingNonFinite" in b.get("title", "")
                                    and "FIRING" not in b["title"]), None), what="the closing message")
    assert closed["title"].startswith("[ENDED] critical TrainingNonFinite"), closed["title"]
    assert "nothing recovered" in closed["message"]
    # and the console (this process's stderr, the child's too): one line each, written before the chat's
    err = capfd.readouterr().err
    assert [line.split(" — ")[0] for line in err.splitlines() if "TrainingNonFinite" in line] == [
        "sentinel: [FIRING] critical TrainingNonFinite", "sentinel: [ENDED] critical TrainingNonFinite"], err


def test_unreachable_webhook_is_counted_and_training_goes_on(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cfg = write_config(tmp_path, notify={"urls": ["json://127.0.0.1:9/"]})  # discard port: refused
    mon = sentinel.watch(model, opt, listen="127.0.0.1:0", config=cfg, engine="thread")
    train_steps(model, opt, 10, mon, before_step=_poison_at(model, 5))
    service = mon.engine.service  # type: ignore[union-attr]
    wait_for(lambda: service.courier.counts[("0", "failed")] >= 1, what="a failed delivery")
    with urllib.request.urlopen(mon.url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    assert 'sentinel_notifications_total{outcome="failed",route="0"} 1.0' in text
    assert "sentinel_outbox_depth 1.0" in text
    oldest = re.search(r"^sentinel_outbox_oldest_age_seconds (\S+)$", text, flags=re.M)
    assert oldest is not None and float(oldest.group(1)) > 0  # the undelivered message's age, for an alert on it
    mon.close()
    assert mon.steps == 10


def test_on_alert_callback_and_stop_action(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen: list[dict[str, Any]] = []
    cfg = write_config(tmp_path, actions={"stop_on": ["critical"]})
    mon = sentinel.watch(model, opt, listen="127.0.0.1:0", config=cfg, on_alert=seen.append)
    gen = torch.Generator().manual_seed(0)
    halted_at = None
    snapshot: list[torch.Tensor] = []
    try:
        for i in range(2000):  # the engine process answers within a few steps
            x = torch.randn(8, 16, generator=gen)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            if i == 3:
                model.head.weight.grad.fill_(float("inf"))
            snapshot = [p.detach().clone() for p in model.parameters()]
            try:
                opt.step()
            except sentinel.TrainingHalted as exc:
                halted_at = i
                message = str(exc)
                break
            mon.log(loss=loss)
    finally:
        mon.close()
    assert halted_at is not None and halted_at > 3, "the stop action must raise at a later step"
    assert "TrainingNonFinite" in message and "checkpoint" in message
    # raised before the optimizer touched the weights
    assert all(torch.allclose(a, b, rtol=0, atol=0, equal_nan=True) for a, b in zip(snapshot, model.parameters()))
    assert any(a["alertname"] == "TrainingNonFinite" and a["state_to"] == "firing" for a in seen)
    # docs/alerting.md: a callback gets a change of state, wire.Alert's fields (evidence: with a capture)
    documented = {"alertname", "severity", "state_from", "state_to", "job", "run", "ranks", "groups", "optimizers",
                  "step", "time", "value", "threshold", "summary", "causes", "checks", "runbook", "notify",
                  "started_step", "started_at", "ended"}
    assert documented == set(wire.Alert.__struct_fields__) - {"evidence"}
    assert all(set(a) - {"evidence"} == documented for a in seen), [sorted(a) for a in seen]


@pytest.mark.parametrize("engine", ["process", "thread"])
def test_on_alert_runs_in_the_training_thread_at_a_later_step(tmp_path: Path, engine: str) -> None:
    """docs/alerting.md: ``fn(alert_dict)`` is called in the training thread at the next
    step, with either engine: a callback may touch the model, the optimizer or the loop's
    state without a lock, and never runs on the engine's thread."""
    import threading

    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    calls: list[tuple[int, int, str]] = []
    mon = sentinel.watch(model, opt, listen="127.0.0.1:0", config=write_config(tmp_path), engine=engine,
                         on_alert=lambda a: calls.append((threading.get_ident(), step, a["state_to"])))
    gen = torch.Generator().manual_seed(0)
    try:
        for step in range(1, 400):
            x = torch.randn(8, 16, generator=gen)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            if step == 3:
                model.head.weight.grad.fill_(float("nan"))
            opt.step()
            mon.log(loss=loss)
            if any(c[2] == "firing" for c in calls):
                break
            time.sleep(0.005)
    finally:
        mon.close()
    firing = [c for c in calls if c[2] == "firing"]
    assert firing, calls
    assert {c[0] for c in calls} == {threading.main_thread().ident}
    assert firing[0][1] > 3  # delivered at a step after the one that fired it


def test_bad_config_fails_loudly_at_construction(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, rules={"GradientSpike": {"params": {"factor": "big"}}, "NoSuchRule": {}})
    from sentinel.rules.config import ConfigError

    with pytest.raises(ConfigError) as err:
        sentinel.watch(MLP(), torch.optim.SGD(MLP().parameters(), lr=0.1), config=cfg, listen="127.0.0.1:0")
    lines = str(err.value).splitlines()
    assert any(line.startswith("rules.GradientSpike.params.factor: ") for line in lines)
    assert any(line.startswith("rules.NoSuchRule: unknown rule") for line in lines)


def test_cli_bad_config_exits_2_without_traceback(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, notify={"urls": "not-a-list"}, rules={"LossSpike": {"for_steps": -1}})
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "check-config", cfg],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "notify.urls: " in out.stderr and "rules.LossSpike.for_steps: " in out.stderr
    ok = write_config(tmp_path, rules={"LossSpike": {"enabled": False}})
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "check-config", ok],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("ok: ") and "LossSpike" not in out.stdout
