"""Alert latency: from the end of the training step in which a NaN appears to the arrival
of the chat message at a local receiver (apprise ``json://``, a real HTTP server).

Sentinel, with the durable outbox in place (a real SQLite file), over >= 20 trials each:
- the embedded engine (``sentinel.watch``, its default child process);
- ``sentinel run -- python …`` (zero-code instrumentation, a daemon for the job).

Then the same NaN through a real Prometheus scraping the exporter, evaluating the exported
rules (``alerts/sentinel.rules.yml``), and a real Alertmanager whose webhook is the same
receiver: once with their default settings (scrape and evaluation every 1 m, ``group_wait``
30 s; about two minutes; ``--no-default`` skips it) and tuned (1 s / 1 s / 0 s).

Each trial poisons one gradient, steps, and restores the weights, so the run goes on and
the alert resolves before the next trial. Prints a table; asserts nothing.

Usage::

    python benchmarks/alert_latency.py [--trials 20] [--no-default] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RULES = {"TrainingNonFinite": {"cooldown_seconds": 0, "resolve_after": 3}}  # fire again each trial


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def train(trials: int, spacing_steps: int, watch: bool, run: str = "latency") -> None:
    """The training loop: a NaN gradient every ``spacing_steps`` steps; prints ``T0 <time>``
    at the end of each poisoned step."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    mon = None
    if watch:
        import sentinel

        mon = sentinel.watch(model, opt, run=run, config=os.environ["LATENCY_CONFIG"], listen="127.0.0.1:0")
    x = torch.randn(32, 16)
    y = x.sum(1, keepdim=True)
    for i in range(spacing_steps * trials + 20):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        poisoned = i % spacing_steps == spacing_steps - 1
        if poisoned:
            saved = [p.detach().clone() for p in model.parameters()]
            model[0].weight.grad[0, 0] = float("nan")  # type: ignore[index]
        opt.step()
        if mon is not None:
            mon.log(loss=loss)
        if poisoned:
            print(f"T0 {time.time():.6f}", flush=True)  # the end of the step with the NaN
            with torch.no_grad():
                for p, s in zip(model.parameters(), saved):
                    p.copy_(s)
        time.sleep(0.01)
    if mon is not None:
        mon.close()


def _latencies(t0s: list[float], arrivals: list[float]) -> list[float]:
    """Each firing message matched to the latest NaN before it, in ms."""
    out = []
    for a in arrivals:
        before = [t for t in t0s if t <= a]
        if before:
            out.append((a - before[-1]) * 1000)
    return out


def sentinel_trials(mode: str, trials: int, tmp: Path) -> list[float]:
    from tests.helpers import Receiver

    receiver = Receiver()
    cfg = tmp / f"{mode}.yaml"
    cfg.write_text(yaml.safe_dump({"notify": {"urls": [receiver.url], "resolved": False},
                                   "outbox": {"path": str(tmp / f"{mode}-outbox.sqlite")}, "rules": RULES}))
    env = dict(os.environ, LATENCY_CONFIG=str(cfg), PYTHONPATH=str(ROOT))
    worker = [sys.executable, __file__, "--worker", str(trials), "--mode"]
    if mode == "embedded":
        cmd = worker + ["watch"]
    else:
        cmd = [sys.executable, "-m", "sentinel.cli", "run", "--config", str(cfg), "--listen", "127.0.0.1:0", "--"]
        cmd += worker + ["plain"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    t0s = [float(line.split()[1]) for line in out.stdout.splitlines() if line.startswith("T0 ")]
    deadline = time.monotonic() + 10
    while len(receiver.bodies) < len(t0s) and time.monotonic() < deadline:
        time.sleep(0.05)
    firing = [t for b, t in zip(receiver.bodies, receiver.wall)
              if "FIRING" in b.get("title", "") and "TrainingNonFinite" in b.get("title", "")]
    others = [b["title"] for b in receiver.bodies if "TrainingNonFinite" not in b.get("title", "")]
    if others:
        print(f"{mode}: other alerts: {others}")
    receiver.close()
    if len(firing) != len(t0s):
        print(f"{mode}: {len(t0s)} NaNs, {len(firing)} messages (stderr tail: {out.stderr[-300:]!r})")
    return _latencies(t0s, firing)


def prometheus_trial(tuned: bool, tmp: Path) -> float | None:
    """One NaN through exporter → Prometheus → Alertmanager → webhook; seconds, or None."""
    import torch
    from torch import nn

    import sentinel
    from tests.helpers import Receiver

    hook = Receiver()
    name = "tuned" if tuned else "default"
    d = tmp / name
    d.mkdir()
    mon_port, prom_port, am_port = _port(), _port(), _port()
    cfg = d / "sentinel.yaml"
    cfg.write_text(yaml.safe_dump({"outbox": {"path": str(d / "outbox.sqlite")}}))
    (d / "am.yml").write_text(yaml.safe_dump({
        "route": {"receiver": "hook", **({"group_wait": "0s", "group_interval": "1s"} if tuned else {})},
        "receivers": [{"name": "hook", "webhook_configs": [{"url": f"http://127.0.0.1:{hook.port}/"}]}]}))
    glob = {"scrape_interval": "1s", "evaluation_interval": "1s"} if tuned else {}
    (d / "prom.yml").write_text(yaml.safe_dump({
        "global": glob, "rule_files": [str(ROOT / "alerts" / "sentinel.rules.yml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [{"job_name": "sentinel", "honor_labels": True,
                            "static_configs": [{"targets": [f"127.0.0.1:{mon_port}"]}]}]}))
    procs = [subprocess.Popen(["prometheus-alertmanager", f"--config.file={d / 'am.yml'}",
                               f"--storage.path={d / 'am'}", f"--web.listen-address=127.0.0.1:{am_port}",
                               "--cluster.listen-address="], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
             subprocess.Popen(["prometheus", f"--config.file={d / 'prom.yml'}", f"--storage.tsdb.path={d / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{prom_port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    mon = sentinel.watch(model, opt, run=f"prom-{name}", config=str(cfg), listen=f"127.0.0.1:{mon_port}")
    x = torch.randn(32, 16)
    y = x.sum(1, keepdim=True)

    def step(poison: bool = False) -> None:
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if poison:
            model[0].weight.grad[0, 0] = float("nan")  # type: ignore[index]
        opt.step()
        mon.log(loss=loss)

    def scraped_twice() -> bool:
        q = f"http://127.0.0.1:{prom_port}/api/v1/query?query=count_over_time(sentinel_nonfinite_total%5B10m%5D)"
        try:
            with urllib.request.urlopen(q, timeout=2) as r:
                import json

                res = json.load(r)["data"]["result"]
                return bool(res) and min(float(v["value"][1]) for v in res) >= 2
        except OSError:
            return False

    t0 = None
    try:
        deadline = time.monotonic() + 300
        while not scraped_twice() and time.monotonic() < deadline:  # the counter is seen at 0 first
            step()
            time.sleep(0.05)
        step(poison=True)
        t0 = time.time()
        deadline = time.monotonic() + 300
        while not hook.bodies and time.monotonic() < deadline:
            time.sleep(0.05)  # the model is NaN now; stepping on changes nothing that matters
    finally:
        mon.close()
        for p in procs:
            p.terminate()
            p.wait(20)
        hook.close()
    return hook.wall[0] - t0 if hook.bodies and t0 is not None else None


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--no-default", action="store_true", help="skip the ~2 min default Prometheus pipeline")
    ap.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="watch", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        train(args.worker, 150, watch=args.mode == "watch")
        return
    tmp = Path(tempfile.mkdtemp(prefix="alert-latency-"))
    rows = []
    for mode in ("embedded", "sentinel run"):
        lat = sentinel_trials(mode.replace(" ", "-"), args.trials, tmp)
        if lat:
            rows.append((f"Sentinel, {mode} (durable outbox)", len(lat), f"{statistics.median(lat):.1f} ms",
                         f"{_pct(lat, 0.99):.1f} ms", f"{min(lat):.1f}–{max(lat):.1f} ms"))
    if shutil.which("prometheus") and shutil.which("prometheus-alertmanager"):
        for tuned in ([True] if args.no_default else [True, False]):
            s = prometheus_trial(tuned, tmp)
            label = "Prometheus + Alertmanager, " + ("tuned 1 s / 1 s / group_wait 0" if tuned else "defaults")
            rows.append((label, 1 if s is not None else 0, "-" if s is None else f"{s:.2f} s", "-", "-"))
    print("| pipeline | trials | p50 | p99 | range |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
