"""A failing probe never changes or stops training; failures are counted and switch it off."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from sentinel import wire
from sentinel.instrument import deltas as magnitude
from sentinel.instrument import probes, staterecord, stats
from sentinel.instrument import reporter as reporter_mod
from sentinel.instrument.layout import Layout
from sentinel.instrument.readback import Readback
from tests.helpers import MLP, make_monitor, train_steps


def _boom(*_: object, **__: object) -> None:
    raise RuntimeError("injected probe failure")


# every probe, by the function it calls
PROBES = [
    (stats.GroupedTensors, "grad_sums"),
    (stats.GroupedTensors, "param_sumsq"),
    (magnitude.UpdateSnapshot, "take"),
    (magnitude.UpdateSnapshot, "measure"),
    (staterecord, "adam_saturation"),
    (probes, "state_bytes"),
    (probes, "learning_rates"),
    (probes, "host_memory"),
    (Readback, "submit"),
    (Readback, "poll"),
    (wire, "encode"),
    (Layout, "changed_at"),
    (reporter_mod, "to_value"),
    (reporter_mod.Reporter, "log"),
]


def _trained(monitored: bool, monkeypatch: pytest.MonkeyPatch | None = None,
             target: tuple[object, str] | None = None) -> tuple[list[torch.Tensor], object]:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mon = None
    if monitored:
        if target is not None and monkeypatch is not None:
            monkeypatch.setattr(target[0], target[1], _boom)
        mon, _ = make_monitor(model, opt, update_every=2, state_every=3, health_every=2, memory_every=2)
    train_steps(model, opt, 12, mon)
    if mon is not None:
        mon.close()
    return [p.detach().clone() for p in model.parameters()], mon


@pytest.mark.parametrize("target", PROBES, ids=[f"{getattr(o, '__name__', o)}.{a}" for o, a in PROBES])
def test_failing_probe_leaves_training_bit_identical(monkeypatch: pytest.MonkeyPatch,
                                                     target: tuple[object, str]) -> None:
    reference, _ = _trained(False)
    weights, mon = _trained(True, monkeypatch, target)
    assert all(torch.equal(a, b) for a, b in zip(reference, weights))
    assert mon.errors >= 1  # type: ignore[attr-defined]
    assert mon.boundary.disabled  # type: ignore[attr-defined]  # switched off after repeated failures


def test_monitored_run_is_bit_identical_without_failures() -> None:
    reference, _ = _trained(False)
    weights, mon = _trained(True)
    assert all(torch.equal(a, b) for a, b in zip(reference, weights))
    assert mon.errors == 0  # type: ignore[attr-defined]


def test_a_model_compiled_with_fullgraph_trains_under_the_monitor() -> None:
    """The monitor's forward hooks (busy time) stay out of torch.compile's graph: a
    fullgraph compile, which fails on any graph break, still works, and trains the same."""
    def run(monitored: bool) -> list[torch.Tensor]:
        torch._dynamo.reset()  # no compiled code shared between the two runs
        torch.manual_seed(0)
        # a built-in container: torch.compile traces its __call__, hooks included
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        mon = make_monitor(model, opt)[0] if monitored else None
        compiled = torch.compile(model, backend="eager", fullgraph=True)
        train_steps(compiled, opt, 6, mon)  # type: ignore[arg-type]
        if mon is not None:
            assert mon.errors == 0
            mon.close()
        return [p.detach().clone() for p in model.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(run(False), run(True)))


def test_errors_reach_the_exported_counter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probes, "host_memory", _boom)
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon, sender = make_monitor(model, opt, memory_every=1, max_errors=3)
    train_steps(model, opt, 6, mon)
    mon.close()
    labels = (("job", "train"), ("rank", "0"), ("run", mon.options.run))
    assert sender.engine.store.counter("sentinel_instrument_errors_total", labels) == 3
    assert "memory" in mon.boundary.disabled


def test_dead_engine_costs_only_counted_drops(tmp_path: object) -> None:
    import os

    from sentinel.instrument.monitor import Monitor
    from sentinel.instrument.options import from_kwargs
    from sentinel.instrument.sender import DatagramSender

    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sender = DatagramSender(os.path.join(str(tmp_path), "gone.sock"))  # no engine listens there
    mon = Monitor(model, [opt], from_kwargs({"engine": "off"}), sender=sender)
    train_steps(model, opt, 10, mon)
    mon.close()
    assert sender.sent == 0
    assert mon.frames_dropped == 10 + 1  # 10 step frames (each carrying its loss) + bye
    assert mon.errors == 0


def test_instrument_imports_no_daemon_side_modules() -> None:
    code = ("import sys, sentinel, sentinel.instrument.monitor; "
            "bad = [m for m in ('prometheus_client', 'apprise', 'sqlite3', 'http.server', 'pydantic') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_shim_does_not_import_torch_in_pythons_that_never_train() -> None:
    import os

    hooks = os.path.join(os.path.dirname(__file__), "..", "..", "..", "hooks")
    env = {**os.environ, "SENTINEL_AUTO": "1", "PYTHONPATH": hooks}
    code = ("import sys; assert 'sitecustomize' in sys.modules; print('torch' in sys.modules); "
            "import torch, sentinel.instrument.auto as a; print(a._installed)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.split() == ["False", "True"], out.stdout + out.stderr


def test_an_error_raised_inside_backward_reaches_the_script_as_torch_raised_it(mlp: MLP) -> None:
    """The script's own error out of ``backward()`` (a failing custom backward, a collective
    whose peer died) reaches it unchanged, with one frame of Sentinel's in its traceback
    (the ``Tensor.backward`` wrapper; not a second one for ``torch.autograd.backward``), and
    the next ``backward()`` works."""
    import traceback

    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
            return x * 1

        @staticmethod
        def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom in backward")

    opt = torch.optim.SGD(mlp.parameters(), lr=0.1)
    mon, _ = make_monitor(mlp, opt, capture_loss=True)
    x = torch.randn(4, 16)
    for call in (lambda t: t.backward(), lambda t: torch.autograd.backward([t])):
        with pytest.raises(ValueError, match="boom in backward") as err:
            call(Boom.apply(mlp(x)).sum())
        frames = [f for f in traceback.extract_tb(err.value.__traceback__) if "sentinel/instrument" in f.filename]
        assert len(frames) == 1, frames
    mlp(x).sum().backward()
    assert all(p.grad is not None for p in mlp.parameters())
    assert torch.autograd.backward.__name__ == "autograd_backward"  # Sentinel's, back in place
    mon.close()


def test_a_process_started_with_a_bad_sentinel_variable_says_so_once_and_trains_unwatched() -> None:
    """A trainer started beside a daemon without ``sentinel run`` (a pod's container next to
    its sidecar, with ``SENTINEL_AUTO=1`` in its manifest) and a ``SENTINEL_MAX_GROUPS`` the
    frames cannot carry: one line names the variable, the script trains as it would
    unwatched, and nothing attaches. It failed at the first optimizer step with a traceback
    on the script's stderr ("could not attach"), the variable named nowhere."""
    import os

    hooks = os.path.join(os.path.dirname(__file__), "..", "..", "..", "hooks")
    env = {**os.environ, "SENTINEL_AUTO": "1", "PYTHONPATH": hooks, "SENTINEL_MAX_GROUPS": "400"}
    env.pop("SENTINEL_SOCKET", None)
    code = ("import torch, sentinel.instrument.auto as a\n"
            "torch.manual_seed(0)\n"
            "m = torch.nn.Linear(4, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
            "for _ in range(3):\n"
            "    o.zero_grad(); m(torch.ones(2, 4)).sum().backward(); o.step()\n"
            "print(round(float(m.weight.detach().sum()), 6), len(a.monitors()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    plain = subprocess.run([sys.executable, "-c", code.replace("import torch, sentinel.instrument.auto as a",
                                                               "import torch\nclass a:\n    monitors = list")],
                           capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == plain.stdout and out.stdout.split()[1] == "0"
    assert out.stderr.strip().splitlines() == [
        "sentinel: SENTINEL_MAX_GROUPS: max_groups: must be 1..256 (the groups a report carries), got 400; "
        "this process is not watched"]
