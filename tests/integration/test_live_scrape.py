"""A live run's /metrics has every contracted metric with sane values, and promtool agrees."""

from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.request

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

import sentinel
from sentinel.demo.model import TinyGPT, loss_fn, synthetic_batch
from tests.helpers import wait_for

pytestmark = pytest.mark.integration

CONTRACT = [
    "sentinel_loss", "sentinel_grad_norm", "sentinel_group_grad_norm", "sentinel_param_norm",
    "sentinel_group_param_norm", "sentinel_update_ratio", "sentinel_group_update_ratio",
    "sentinel_optimizer_state_bytes", "sentinel_param_bytes", "sentinel_nonfinite_total", "sentinel_step",
    "sentinel_steps_total", "sentinel_step_duration_seconds", "sentinel_last_step_timestamp_seconds",
    "sentinel_learning_rate", "sentinel_gradient_variance_ratio", "sentinel_gradient_snr",
    "sentinel_optimizer_state_saturation_ratio", "sentinel_instrument_errors_total",
    "sentinel_frames_dropped_total",
]
CUDA_ONLY = [  # asserted by tests/gpu/test_no_sync.py where a GPU is lent
    "sentinel_cuda_memory_allocated_bytes", "sentinel_cuda_memory_reserved_bytes",
    "sentinel_cuda_memory_peak_bytes", "sentinel_cuda_memory_total_bytes",
    "sentinel_cuda_alloc_retries_total", "sentinel_cuda_ooms_total",
]


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return r.read().decode()


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


@pytest.fixture(scope="module")
def live_scrape() -> tuple[str, sentinel.Monitor]:
    torch.manual_seed(0)
    model = TinyGPT(dim=32, depth=2, seq=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    mon = sentinel.watch(model, opt, listen="127.0.0.1:0", run="scrape-test", job="ci",
                         health_every=5, state_every=20)
    assert mon.url is not None and mon.url.startswith("http://127.0.0.1:")
    for _ in range(60):
        x, y = synthetic_batch(gen, 4, 16, 256)
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mon.log(loss=loss)
    # the run is live: scrape while the server is up, after the engine caught up
    wait_for(lambda: "sentinel_steps_total{" in _scrape(mon.url) and
             'sentinel_step{job="ci",rank="0",run="scrape-test"} 60.0' in _scrape(mon.url),
             what="step 60 on /metrics")
    text = _scrape(mon.url)
    yield text, mon
    mon.close()


def test_every_contracted_metric_is_exported(live_scrape: tuple[str, sentinel.Monitor]) -> None:
    text, _ = live_scrape
    samples = _samples(text)
    missing = [m for m in CONTRACT if m not in samples]
    assert not missing, f"missing metrics: {missing}"
    for name in CONTRACT:
        for labels, _ in samples[name]:
            assert labels["job"] == "ci" and labels["run"] == "scrape-test" and labels["rank"] == "0"


def test_values_are_sane(live_scrape: tuple[str, sentinel.Monitor]) -> None:
    text, _ = live_scrape
    s = {k: v for k, v in _samples(text).items()}

    def one(name: str) -> float:
        return s[name][0][1]

    assert 0 < one("sentinel_loss") < 10
    assert 0 < one("sentinel_grad_norm") < 100
    assert one("sentinel_param_norm") > 1  # 6 blocks of initialised weights, far from zero
    assert 1e-6 < one("sentinel_update_ratio") < 0.1
    assert one("sentinel_step") == 60 and one("sentinel_steps_total") == 60
    assert 0 < one("sentinel_step_duration_seconds") < 10
    assert one("sentinel_learning_rate") == pytest.approx(1e-3)
    assert 0 <= one("sentinel_gradient_variance_ratio") < 1
    assert one("sentinel_gradient_snr") > 0
    assert 0 <= one("sentinel_optimizer_state_saturation_ratio") <= 1
    states = {lab["state"]: v for lab, v in s["sentinel_optimizer_state_bytes"]}
    assert states["exp_avg"] == states["exp_avg_sq"] == one("sentinel_param_bytes")
    assert {lab["source"] for lab, _ in s["sentinel_nonfinite_total"]} == {"loss", "grad", "param"}
    assert all(v == 0 for _, v in s["sentinel_nonfinite_total"])
    assert one("sentinel_instrument_errors_total") == 0 and one("sentinel_frames_dropped_total") == 0
    groups = {lab["group"] for lab, _ in s["sentinel_group_grad_norm"]}
    assert {"layers.0", "layers.1", "embed", "head", "ln_f", "pos"} == groups


def test_healthz(live_scrape: tuple[str, sentinel.Monitor]) -> None:
    _, mon = live_scrape
    with urllib.request.urlopen(mon.url + "/healthz", timeout=5) as r:
        assert r.status == 200 and r.read() == b"ok\n"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (make test installs it)")
def test_promtool_check_metrics_is_clean(live_scrape: tuple[str, sentinel.Monitor]) -> None:
    text, _ = live_scrape
    out = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "" and out.stderr.strip() == "", out.stdout + out.stderr


def test_demo_command_runs_and_serves(tmp_path: object) -> None:
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "demo", "--steps", "30", "--delay", "0",
                          "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "done: 30 steps" in out.stdout and "instrument errors: 0" in out.stdout
    assert "metrics: http://127.0.0.1:" in out.stdout
