"""``sentinel run`` on a script that updates its parameters by hand, with no optimizer (issue
18, point 4): one line says what cannot be watched; the loss, gradient norms and NaN/Inf are
still reported, one step per backward(), and the NaN rule fires."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).parent / "scripts" / "hand_sgd_train.py"


def test_a_loop_without_an_optimizer_is_watched_and_said_so(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    plain = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--",
                          sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == plain.returncode == 0, out.stderr
    assert out.stdout == plain.stdout  # the script's own numbers are untouched
    said = [ln for ln in out.stderr.splitlines() if "no optimizer" in ln]
    assert len(said) == 1 and "updated by hand" in said[0] and "not reported" in said[0], out.stderr
    assert "Traceback" not in out.stderr
    rows = [ln.split() for ln in plain.stdout.splitlines()]
    db = sqlite3.connect(tmp_path / "sentinel" / "history.sqlite")
    [(run_id, steps)] = db.execute("SELECT id, steps FROM runs").fetchall()
    assert steps == len(rows)  # a step per backward()
    samples = dict((s, (loss, g)) for s, loss, g in db.execute(
        "SELECT step, loss, grad_norm FROM samples WHERE run_id = ?", (run_id,)))
    for i, loss, gnorm in rows[:7]:  # the first too: its norms were kept until the second showed no optimizer
        got_loss, got_norm = samples[int(i) + 1]
        assert got_loss == pytest.approx(float(loss), rel=1e-5)
        assert got_norm == pytest.approx(float(gnorm), rel=1e-5)
    alerts = db.execute("SELECT alertname, severity, step FROM alerts ORDER BY id").fetchall()
    assert alerts[0] == ("TrainingNonFinite", "critical", 8), alerts
    assert json.dumps(alerts)  # plain values


def test_an_optimizer_that_is_no_torch_optimizer_is_named(tmp_path: Path) -> None:
    """fastai's own ``Optimizer`` (scripts/foreign_optimizer.py has its shape) steps the
    parameters without torch's step hooks, and zeroes the gradients in place: the line said
    the parameters were updated by hand, which sent the user looking for a loop that does
    not exist. It names the class that steps them, and what is watched from when."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    script = SCRIPT.with_name("foreign_optimizer.py")
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--",
                          sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == plain.returncode == 0, out.stderr
    assert out.stdout == plain.stdout
    [said] = [ln for ln in out.stderr.splitlines() if "torch.optim.Optimizer" in ln]
    assert said.startswith("sentinel: the parameters are stepped by __main__.Optimizer, which is no "
                           "torch.optim.Optimizer and has no step hooks."), said
    assert "from backward() 64 on" in said and "not reported" in said and "by hand" not in said, said
    db = sqlite3.connect(tmp_path / "sentinel" / "history.sqlite")
    [(run_id, steps)] = db.execute("SELECT id, steps FROM runs").fetchall()
    assert steps == 100
    losses = dict(db.execute("SELECT step, loss FROM samples WHERE run_id = ?", (run_id,)).fetchall())
    rows = [ln.split() for ln in plain.stdout.splitlines()]
    for i, loss in rows[63:]:  # watched from the 64th backward()
        assert losses[int(i) + 1] == pytest.approx(float(loss), abs=1e-6)


_WITH_OPTIMIZER = r"""
import torch
from sentinel.instrument import auto, losses
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
print(auto._hand_watch in losses.backward_listeners, auto._hand_watch.done)
"""


def test_a_loop_with_an_optimizer_takes_the_look_for_one_off_the_backward_path(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--",
                          sys.executable, "-c", _WITH_OPTIMIZER], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "False True"  # decided at the second backward(), then gone
    assert "no optimizer" not in out.stderr


_FUNCTIONAL = r"""
import torch
from torch.func import functional_call, grad
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
params = {k: v.detach() for k, v in model.named_parameters()}
loss_fn = lambda p, x, y: ((functional_call(model, p, (x,)) - y) ** 2).mean()
for _ in range(10):
    x = torch.randn(8, 4)
    g = grad(loss_fn)(params, x, x.sum(1, keepdim=True))
    params = {k: params[k] - 0.1 * g[k] for k in params}
print("trained")
"""


def test_a_loop_sentinel_cannot_see_gets_a_word_at_its_end(tmp_path: Path) -> None:
    """JAX-style training with torch.func.grad: no optimizer, no backward(). Nothing can be
    watched, and sentinel run says so once the command ends, instead of nothing at all."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--",
                          sys.executable, "-c", _FUNCTIONAL], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and out.stdout == "trained\n", out.stderr
    said = [ln for ln in out.stderr.splitlines() if "sent no report" in ln]
    assert len(said) == 1 and "no torch optimizer" in said[0] and "torch.func.grad" in said[0], out.stderr
    assert said[0].startswith("sentinel: ")


_ATTACK = r"""
import torch
import torch.nn.functional as F
from torch import nn
from sentinel.instrument import auto
torch.manual_seed(0)
net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 10 * 10, 10), nn.LogSoftmax(dim=1))
net.eval()  # a trained model, explained and attacked: never trained here
gen = torch.Generator().manual_seed(1)
saliency = torch.zeros(12, 12)
for _ in range(70):  # saliency maps: the input's gradient, the model's left to accumulate
    data = torch.rand(1, 1, 12, 12, generator=gen, requires_grad=True)
    net(data).max().backward()
    saliency += data.grad.abs()[0, 0]
kept = {}
def keep(module, inputs, out):
    kept["act"] = out
    out.register_hook(lambda grad: kept.update(grad=grad))
net[1].register_forward_hook(keep)
cam = torch.zeros(10, 10)
for _ in range(6):  # Grad-CAM: a class score's gradient at the last convolution's activations
    score = net(torch.rand(1, 1, 12, 12, generator=gen))[0, 3]
    net.zero_grad()
    score.backward()
    cam += F.relu((kept["grad"].mean((2, 3), keepdim=True) * kept["act"]).sum(1))[0].detach()
hits = 0
for eps in (0.05, 0.2):  # the FGSM tutorial: model.zero_grad() before each sample's backward()
    for _ in range(12):
        data, target = torch.rand(1, 1, 12, 12, generator=gen), torch.randint(0, 10, (1,), generator=gen)
        data.requires_grad = True
        loss = F.nll_loss(net(data), target)
        net.zero_grad()
        loss.backward()
        adv = torch.clamp(data + eps * data.grad.sign(), 0, 1)
        hits += int(net(adv).argmax(1).item() == target.item())
print(f"{float(saliency.sum()):.6f}", f"{float(cam.sum()):.6f}", hits, len(auto.monitors()))
"""


def test_backward_calls_that_train_nothing_get_no_monitor_and_no_claim(tmp_path: Path) -> None:
    """Saliency maps, Grad-CAM and the FGSM tutorial's attack call backward() on a trained
    model in eval mode, letting its gradients accumulate or zeroing them between samples,
    and change no parameter: no monitor attaches and no line says the parameters are
    updated by hand (the saliency maps' 64th backward() claimed it before)."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    plain = subprocess.run([sys.executable, "-c", _ATTACK], capture_output=True, text=True, timeout=120)
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--",
                          sys.executable, "-c", _ATTACK], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == plain.returncode == 0, out.stderr
    assert out.stdout == plain.stdout and out.stdout.split()[-1] == "0", out.stdout  # no monitor
    assert "updated by hand" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    said = [ln for ln in out.stderr.splitlines() if "sent no report" in ln]
    assert len(said) == 1 and "changed no parameter between backward() calls" in said[0], out.stderr


_WARMUP_FROM_ZERO = r"""
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
for i in range(8):
    lr = 0.05 * min(1.0, i / 2)  # a warm-up from 0: the first update changes nothing
    model.zero_grad()
    x = torch.randn(16, 4)
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    print(i, f"{loss.item():.6f}")
"""


def test_a_loop_by_hand_whose_first_update_is_zero_is_watched_from_its_first_change(tmp_path: Path) -> None:
    """A warm-up from lr 0 leaves the parameters as they were after the first backward():
    the look waits for the next one, and the loop is watched from then on."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--",
                          sys.executable, "-c", _WARMUP_FROM_ZERO], capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stderr
    said = [ln for ln in out.stderr.splitlines() if "no optimizer" in ln]
    assert len(said) == 1 and "after 3 backward() calls" in said[0], out.stderr
    losses = {int(i) + 1: float(v) for i, v in (ln.split() for ln in out.stdout.splitlines())}
    db = sqlite3.connect(tmp_path / "sentinel" / "history.sqlite")
    samples = dict(db.execute("SELECT step, loss FROM samples"))
    assert sorted(samples) == list(range(3, 9))  # from the third backward(), the first the look could tell
    for step, loss in samples.items():
        assert loss == pytest.approx(losses[step], rel=1e-5)


@pytest.mark.parametrize("flag", ["-I", "-E"])
def test_a_python_that_ignores_pythonpath_is_said_to_be_unwatched(tmp_path: Path, flag: str) -> None:
    """``python -I`` (isolated) and ``python -E`` ignore ``PYTHONPATH``, through which
    Sentinel loads into the script: its training went unwatched, and the only line said it
    had "stepped no torch optimizer and changed no parameter", which it had."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    script = str(Path(__file__).parent / "scripts" / "plain_train.py")
    release = tmp_path / "release"
    release.touch()
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--",
                          sys.executable, flag, script, "20", str(release)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and out.stdout.split() == ["trained", "exiting"], (out.stdout, out.stderr)
    said = [ln for ln in out.stderr.splitlines() if ln.startswith("sentinel:") and "metrics at" not in ln]
    assert said == [f"sentinel: python {flag} " + ("runs isolated (it ignores PYTHONPATH)" if flag == "-I" else
                                                   "ignores the PYTHON* variables (PYTHONPATH among them)")
                    + f", so Sentinel cannot load into it and nothing it trains is watched: drop {flag}"], out.stderr
    db = sqlite3.connect(tmp_path / "sentinel" / "history.sqlite")
    assert db.execute("SELECT count(*) FROM samples").fetchone() == (0,)  # what the line says: nothing watched
