"""Shared fixtures: small real models, a frame-capturing sender, a wait helper."""

from __future__ import annotations

import functools
import subprocess
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from sentinel import wire
from sentinel.engine.engine import Engine
from sentinel.instrument.monitor import Monitor
from sentinel.instrument.options import from_kwargs

# torch's gloo backend can abort a rank as its Python exits, with no Sentinel in the process
# (the plain runs of the zoo's DDP program show it, about 1 in 8 on 2 busy cores): a gloo
# worker thread drops the last collective's work after the interpreter began to finalize,
# the work's saved thread-local state lets go of a Python object, the thread cannot take the
# GIL, and libstdc++ terminates (pytorch/pytorch#179291 describes it).
GLOO_EXIT_ABORT = "terminate called without an active exception"


def retry_gloo_exit_abort(test: Callable[..., None]) -> Callable[..., None]:
    """For a test of a torchrun job: when its failure message holds :data:`GLOO_EXIT_ABORT`
    (put the job's stderr in the assertion's message), run it again in a fresh
    ``tmp_path / "retryN"``, twice at most, with a warning that names the retry. Any other
    failure fails at once."""

    @functools.wraps(test)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        for attempt in range(1, 4):
            try:
                return test(*args, **kwargs)
            except AssertionError as e:
                if attempt == 3 or GLOO_EXIT_ABORT not in str(e):
                    raise
                warnings.warn(f"{test.__name__}: a rank hit torch's gloo exit abort; attempt {attempt + 1}",
                              stacklevel=1)
                if "tmp_path" in kwargs:
                    kwargs["tmp_path"] = kwargs["tmp_path"] / f"retry{attempt}"
                    kwargs["tmp_path"].mkdir()

    return wrapper


class CaptureSender:
    """Keeps every frame and feeds it to a real engine, in the training thread."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.engine = Engine()
        self.dropped = 0

    def send(self, data: bytes) -> bool:
        self.frames.append(wire.decode(data))
        self.engine.feed(data)
        return True

    def close(self) -> None:
        pass

    def steps(self) -> list[dict[str, Any]]:
        return [f for f in self.frames if f["kind"] == "step"]


class MLP(nn.Module):
    """Three blocks in a ModuleList plus a head: groups layers.0, layers.1, layers.2, head."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(3))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class ShardedAdamW(torch.optim.Optimizer):
    """``ZeroRedundancyOptimizer``'s shape as rank 0 of 2 sees it: the whole model's groups
    and no state of its own, and a local AdamW over this rank's half of the parameters,
    stepped inside its ``step()`` (the broadcast of the shards left out)."""

    def __init__(self, params: Any) -> None:
        params = list(params)
        super().__init__(params, {"lr": 1e-3})
        self.optim = torch.optim.AdamW(params[: len(params) // 2], lr=1e-3)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.optim.step()


def make_monitor(model: nn.Module | None, opts: list[torch.optim.Optimizer] | torch.optim.Optimizer,
                 sender: CaptureSender | None = None, **options: Any) -> tuple[Monitor, CaptureSender]:
    """A monitor (engine off) whose frames go to ``sender`` (a new one by default: pass one
    to have several monitors report to the same engine, as a GAN's two ``watch`` calls do)."""
    sender = CaptureSender() if sender is None else sender
    optimizers = opts if isinstance(opts, list) else [opts]
    options.setdefault("engine", "off")
    scaler = options.pop("scaler", None)
    return Monitor(model, optimizers, from_kwargs(options), sender=sender, scaler=scaler), sender


def write_config(tmp_path: Path, **doc: Any) -> str:
    """A sentinel config file with ``doc`` as its YAML (``notify=...``, ``actions=...``)."""
    import yaml

    path = tmp_path / "sentinel.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def wait_for(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``cond`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def train_steps(model: nn.Module, opt: torch.optim.Optimizer, steps: int, mon: Monitor | None = None,
                seed: int = 0, before_step: Callable[[int], None] | None = None) -> None:
    """A plain loop on a fixed regression task."""
    gen = torch.Generator().manual_seed(seed)
    for i in range(steps):
        x = torch.randn(8, 16, generator=gen)
        y = x.sum(dim=1, keepdim=True)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if before_step is not None:
            before_step(i)
        opt.step()
        if mon is not None:
            mon.log(loss=loss)


class Receiver:
    """A real HTTP server on loopback that records every POSTed JSON body (apprise json://).

    Args:
        port: 0 for a free one; a fixed port lets a test start it where a route already points.
        status: the HTTP status it answers; ``bodies`` keeps only bodies answered with 2xx,
            ``refused`` counts the others. Tests may change ``status`` while it runs.

    ``hold``: seconds it keeps a sender waiting for the answer, the body already kept (a slow
    chat service), for bodies whose text contains ``hold_on`` (every body while it is "").
    """

    def __init__(self, port: int = 0, status: int = 200) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.bodies: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []  # (path, Authorization header) of each body kept
        self.arrivals: list[float] = []  # time.monotonic() of each body kept
        self.wall: list[float] = []  # time.time() of each, to compare with other processes
        self.refused = 0
        self.status = status
        self.hold = 0.0
        self.hold_on = ""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length", "0"))
                doc = json.loads(self.rfile.read(n) or b"{}")
                status = outer.status  # read once: a test that flips it mid-request must get what it counted
                if 200 <= status < 300:
                    outer.bodies.append(doc)
                    outer.requests.append((self.path, self.headers.get("Authorization", "")))
                    outer.arrivals.append(time.monotonic())
                    outer.wall.append(time.time())
                else:
                    outer.refused += 1
                if outer.hold_on in str(doc):
                    time.sleep(outer.hold)
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            allow_reuse_address = True  # a test may restart it on the port a route points at

        self.server = Server(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"json://127.0.0.1:{self.port}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_prometheus(folder: Any, config: str, port: int) -> subprocess.Popen[bytes]:
    """A real Prometheus (Debian's) on ``127.0.0.1:port`` with ``config`` as its
    ``prometheus.yml``, its data in ``folder``. Stop it with :func:`end_process`."""
    (folder / "prometheus.yml").write_text(config)
    return subprocess.Popen(["prometheus", f"--config.file={folder / 'prometheus.yml'}",
                             f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def end_process(proc: subprocess.Popen[str]) -> None:
    """Stop a process a test started, if it still runs: SIGTERM (which `sentinel run`
    forwards to its command), then SIGKILL after 20 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
