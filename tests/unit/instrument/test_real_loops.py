"""Right numbers where real training code differs from the plain loop (docs/frameworks.md).

Closures, gradient accumulation, wrapped optimizers, extra scalars in ``log()``, and
parameters and optimizers that change mid-run. Each case trains a real model on the CPU
and compares the frames (fed to a real engine) with a reference taken where torch says
the value is final.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
from torch import nn

import sentinel
from sentinel.instrument import watching
from tests.helpers import MLP, CaptureSender, ShardedAdamW, make_monitor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _norm(model: nn.Module) -> float:
    return float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None]))


def _frame_norms(sender: CaptureSender) -> list[float]:
    return [math.sqrt(math.fsum(f["grad_sumsq"])) for f in sender.steps()]


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(i)
    x = torch.randn(8, 16, generator=gen)
    return x, x.sum(dim=1, keepdim=True)


def _labels(mon: Any, **extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"job": "train", "rank": "0", "run": mon.options.run, **extra}.items()))


def _watched(model: nn.Module, opt: Any, **options: Any) -> tuple[Any, CaptureSender]:
    """``sentinel.watch`` (engine off), its frames captured: watch() takes no sender."""
    mon = sentinel.watch(model, opt, engine="off", **options)
    sender = CaptureSender()
    mon.reporter.sender = sender
    return mon, sender


def _plain_steps(model: nn.Module, opt: Any, steps: int, first: int = 0, mon: Any = None) -> list[float]:
    """The plain loop over batches ``first..first+steps-1`` (logging each loss to ``mon``); the losses."""
    losses = []
    for i in range(first, first + steps):
        x, y = _batch(i)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if mon is not None:
            mon.log(loss=loss)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("how", ["positional", "keyword"])
def test_a_closure_step_reports_the_gradients_it_applies(mlp: MLP, how: str) -> None:
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01, momentum=0.9)
    mon, sender = make_monitor(mlp, opt)
    expected, losses = [], []
    for i in range(4):
        x, y = _batch(i)

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = nn.functional.mse_loss(mlp(x), y)
            loss.backward()
            expected.append(_norm(mlp))  # the gradients step() is about to apply
            return loss

        loss = opt.step(closure) if how == "positional" else opt.step(closure=closure)
        losses.append(float(loss))
        mon.log(loss=loss)
    mon.close()
    assert _frame_norms(sender) == pytest.approx(expected, rel=1e-5)
    assert [f["scalars"]["loss"] for f in sender.steps()] == pytest.approx(losses, rel=1e-6)


def test_lbfgs_reports_the_first_evaluation_of_each_step(mlp: MLP) -> None:
    opt = torch.optim.LBFGS(mlp.parameters(), lr=0.5, max_iter=4)
    mon, sender = make_monitor(mlp, opt, capture_loss=True)
    first_norms, first_losses = [], []
    for i in range(3):
        x, y = _batch(i)
        calls = []

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = nn.functional.mse_loss(mlp(x), y)
            loss.backward()
            if not calls:
                first_norms.append(_norm(mlp))
                first_losses.append(float(loss))
            calls.append(1)
            return loss

        returned = opt.step(closure)
        assert len(calls) > 1  # LBFGS evaluated several times: only the first counts
        assert float(returned) == pytest.approx(first_losses[-1])
    mon.close()
    assert _frame_norms(sender) == pytest.approx(first_norms, rel=1e-5)
    assert [f["scalars"]["loss"] for f in sender.steps()] == pytest.approx(first_losses, rel=1e-6)


def test_a_nan_only_in_the_gradients_of_a_closure_step_fires_at_that_step(mlp: MLP) -> None:
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    mon, sender = make_monitor(mlp, opt)
    for i in range(4):
        x, y = _batch(i)

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = nn.functional.mse_loss(mlp(x), y)
            loss.backward()
            if i == 3:  # the 4th and last step: a NaN in one gradient, the loss is fine
                mlp.head.weight.grad[0, 0] = float("nan")
            return loss

        mon.log(loss=opt.step(closure))
    mon.close()
    steps = [f for f in sender.steps() if not math.isfinite(math.fsum(f["grad_sumsq"]))]
    assert [f["step"] for f in steps][:1] == [4]
    fired = [a for a in sender.engine.alerts_json() if a["alertname"] == "TrainingNonFinite"]
    assert fired and fired[0]["step"] == 4


def test_logged_micro_batch_losses_average_into_the_step(mlp: MLP) -> None:
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    mon, sender = make_monitor(mlp, opt)
    expected = []
    for step in range(3):
        losses = []
        opt.zero_grad()
        for micro in range(4):
            x, y = _batch(10 * step + micro)
            loss = nn.functional.mse_loss(mlp(x), y)
            (loss / 4).backward()
            losses.append(float(loss))
            if micro < 3:
                mon.log(loss=loss, acc=float(micro))  # before the step: the coming step's
        opt.step()
        mon.log(loss=loss, acc=3.0)
        expected.append(sum(losses) / 4)
    mon.close()
    frames = sender.steps()
    assert [f["step"] for f in frames] == [1, 2, 3]
    assert [f["scalars"]["loss"] for f in frames] == pytest.approx(expected, rel=1e-6)
    assert {f["scalars"]["acc"] for f in frames} == {1.5}
    assert not [f for f in sender.frames if f["kind"] == "log"]  # no stray frames at the previous step


def test_captured_loss_is_the_sum_passed_to_backward(mlp: MLP) -> None:
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    mon, sender = make_monitor(mlp, opt, capture_loss=True)
    expected = []
    for step in range(3):
        opt.zero_grad()
        total = 0.0
        for micro in range(4):
            x, y = _batch(10 * step + micro)
            scaled = nn.functional.mse_loss(mlp(x), y) / 4
            scaled.backward()
            total += float(scaled)
        opt.step()
        expected.append(total)  # the mean of the micro-batch losses, as frameworks log it
    mon.close()
    assert [f["scalars"]["loss"] for f in sender.steps()] == pytest.approx(expected, rel=1e-6)
    w = sender.engine.store.window("sentinel_loss", _labels(mon))
    assert w is not None and list(w.values) == pytest.approx(expected, rel=1e-6)


def _objective(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
               how: str) -> torch.Tensor:
    out = torch.func.functional_call(model, params, (x,))
    a, b = nn.functional.mse_loss(out, y), out.abs().mean()
    return a if how == "one" else a - 0.5 * b if how in ("given_gradient", "wgan") else a + b


@pytest.mark.parametrize("how", ["list", "one", "generator", "given_gradient", "wgan"])
def test_captured_loss_of_torch_autograd_backward(mlp: MLP, how: str) -> None:
    """A multi-task script's ``torch.autograd.backward([loss_a, loss_b])`` applies the
    gradients of their sum: the step's loss. ``torch.autograd.backward(loss)`` is
    ``loss.backward()``, counted once (``Tensor.backward`` calls it). A single element given
    its gradient counts times it (WGAN's ``err_fake.backward(mone)`` applies ``-err_fake``)."""
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    mon, sender = make_monitor(mlp, opt, capture_loss=True)
    expected = []
    for step in range(3):
        x, y = _batch(step)
        out = mlp(x)
        a, b = nn.functional.mse_loss(out, y), out.abs().mean()
        opt.zero_grad()
        if how == "list":
            torch.autograd.backward([a, b])
            expected.append(float(a) + float(b))
        elif how == "one":
            torch.autograd.backward(a)
            expected.append(float(a))
        elif how == "generator":
            torch.autograd.backward(t for t in (a, b))
            expected.append(float(a) + float(b))
        elif how == "given_gradient":  # single elements: each times its gradient
            torch.autograd.backward([a, b], grad_tensors=[torch.tensor(1.0), torch.tensor(-0.5)])
            expected.append(float(a) - 0.5 * float(b))
        else:  # the WGAN scripts' err_real.backward(one); err_fake.backward(mone), mone = -1 (here -0.5)
            a.backward(torch.tensor(1.0), retain_graph=True)
            b.backward(torch.tensor(-0.5))
            expected.append(float(a) - 0.5 * float(b))
        # the same gradients as plain autograd gives (a generator read once), by torch.func, which
        # Sentinel does not see
        want = torch.func.grad(lambda params: _objective(mlp, params, x, y, how))(
            {k: v.detach() for k, v in mlp.named_parameters()})
        assert all(torch.allclose(p.grad, want[k], atol=1e-6) for k, p in mlp.named_parameters())
        opt.step()
    mon.close()
    assert [f["scalars"]["loss"] for f in sender.steps()] == pytest.approx(expected, rel=1e-6)


def test_a_vector_given_its_gradient_is_no_loss_and_leaves_the_next_steps_loss_alone(mlp: MLP) -> None:
    """``out.backward(grad)`` of a non-scalar (a split backward) is not a loss: the step
    reports the scalar loss of its other ``backward()`` only, and a step with no loss at all
    reports none (not the last step's)."""
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    mon, sender = make_monitor(mlp, opt, capture_loss=True)
    x, y = _batch(0)
    opt.zero_grad()
    loss = nn.functional.mse_loss(mlp(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    out = mlp(x)
    out.backward(torch.ones_like(out))
    opt.step()
    mon.close()
    assert [f.get("scalars", {}).get("loss") for f in sender.steps()] == [pytest.approx(float(loss)), None]


def test_log_takes_any_scalars_and_drops_bad_values_not_the_frame(mlp: MLP) -> None:
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    mon, sender = make_monitor(mlp, opt)
    for i in range(3):
        x, y = _batch(i)
        opt.zero_grad()
        loss = nn.functional.mse_loss(mlp(x), y)
        loss.backward()
        opt.step()
        mon.log(loss=loss, acc=torch.tensor(0.25), lr_scale=2, grad_norm=123.0,  # grad_norm: the user's own
                bad_str="x", bad_vec=torch.ones(3), bad_none=None, bad_bool=True, **{"n" * 65: 1.0})
    mon.close()
    store = sender.engine.store
    assert store.last("sentinel_scalar", _labels(mon, name="acc"))[2] == pytest.approx(0.25)
    assert store.last("sentinel_scalar", _labels(mon, name="lr_scale"))[2] == 2.0
    assert store.last("sentinel_scalar", _labels(mon, name="grad_norm"))[2] == 123.0
    assert store.last("sentinel_grad_norm", _labels(mon))[2] != 123.0  # never collides with sentinel's own
    assert store.last("sentinel_loss", _labels(mon)) is not None
    assert store.counter("sentinel_scalars_dropped_total", _labels(mon)) == 15.0  # 5 bad values x 3 steps
    assert len(sender.steps()) == 3  # and the engine took every frame (the values above)
    assert all(set(f["scalars"]) == {"loss", "acc", "lr_scale", "grad_norm"} for f in sender.steps())


def test_log_bounds_the_number_of_names(mlp: MLP) -> None:
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    mon, sender = make_monitor(mlp, opt)
    x, y = _batch(0)
    nn.functional.mse_loss(mlp(x), y).backward()
    opt.step()
    mon.log(**{f"m{i}": float(i) for i in range(40)})
    mon.close()
    [frame] = sender.steps()
    assert len(frame["scalars"]) == 32 and frame["scalars_dropped"] == 8


def test_log_drops_and_counts_a_name_the_engine_would_refuse_and_bad_values_take_no_name_slot(mlp: MLP) -> None:
    """A valid Python keyword (`précision=`) or a `**{"val acc": ...}` name is outside the frame's
    `ScalarName`: dropped and counted in the training process, where the user's counter is,
    rather than by the engine; bad values do not use up the 32 names."""
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    mon, sender = make_monitor(mlp, opt)
    x, y = _batch(0)
    nn.functional.mse_loss(mlp(x), y).backward()
    opt.step()
    mon.log(**{"précision": 0.9, "val acc": 0.5, "val[0]": 0.1, "top1_acc": 0.5, "b0": None, "b1": "x", "b2": True},
            **{f"m{i}": float(i) for i in range(31)})  # 31 more: with top1_acc, the 32 slots
    mon.close()
    [frame] = sender.steps()
    assert set(frame["scalars"]) == {"top1_acc", *(f"m{i}" for i in range(31))}
    assert frame["scalars_dropped"] == 6
    assert sender.engine.fields_dropped == {}  # the engine had nothing to drop
    assert sender.engine.store.counter("sentinel_scalars_dropped_total", _labels(mon)) == 6.0


def test_log_says_once_per_name_what_it_dropped(mlp: MLP, caplog: pytest.LogCaptureFixture) -> None:
    """A per-sample loss (``reduction="none"``), ``scheduler.get_last_lr()``'s list, a name with a
    space: each dropped value was counted and nothing more, so the script's author believed
    the loss watched. One line each, once, on the script's own log."""
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    mon, sender = make_monitor(mlp, opt)
    with caplog.at_level(logging.WARNING, logger="sentinel"):
        for i in range(3):
            x, y = _batch(i)
            opt.zero_grad()
            per_sample = nn.functional.mse_loss(mlp(x), y, reduction="none")
            per_sample.mean().backward()
            opt.step()
            mon.log(loss=per_sample, lr=[0.01], **{"val acc": 0.5, "acc": 0.5})
    mon.close()
    lines = sorted(r.getMessage() for r in caplog.records)
    assert len(lines) == 3, lines
    assert lines[0].startswith("sentinel: log('val acc'=...) dropped: a name is 1 to 64 characters")
    assert lines[1].startswith(f"sentinel: log(loss=...) got a tensor of {per_sample.numel()} elements, not a real number")
    assert lines[2].startswith("sentinel: log(lr=...) got a list of 1, not a real number")
    assert [set(f.get("scalars", ())) for f in sender.steps()] == [{"acc"}] * 3


def test_log_with_a_step_reaches_that_step_also_after_its_report_left(mlp: MLP) -> None:
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    mon, sender = make_monitor(mlp, opt, capture_loss=True)
    for i in range(3):
        x, y = _batch(i)
        opt.zero_grad()
        nn.functional.mse_loss(mlp(x), y).backward()
        opt.step()
        if i == 1:  # HF's on_log comes after the step: it names the step
            mon.log(step=2, logged=0.5)
        if i == 2:  # and for a step whose report has left already: a frame of its own
            mon.log(step=1, late=7.0)
    mon.close()
    by_step = {f["step"]: f.get("scalars", {}) for f in sender.steps()}
    assert all("logged" not in s for s in by_step.values())
    # with the loss captured, a step's report leaves at the end of its step (issue 18,
    # point 6): what is logged for it later comes in a frame of its own, named for it
    late = [f for f in sender.frames if f["kind"] == "log"]
    assert [(f["step"], f["scalars"]) for f in late] == [(2, {"logged": 0.5}), (1, {"late": 7.0})]
    assert sender.engine.store.last("sentinel_scalar", _labels(mon, name="late"))[0] == 1


@pytest.mark.parametrize(("own_step", "at"), [
    (lambda i: i + 1, [1, 2, 3, 4]),  # Sentinel's own count: each value at its step
    (lambda i: 8 * i, [1, 2, 3, 4]),  # samples seen (wandb's `step=`): no step of ours, routed as without one
    (lambda i: i, [1, 1, 2, 3]),  # enumerate()'s 0-based index: one step behind, but nothing lost
], ids=["optimizer-steps", "samples", "zero-based"])
def test_log_with_the_scripts_own_step_counter_loses_no_value(
        mlp: MLP, own_step: Any, at: list[int], caplog: pytest.LogCaptureFixture) -> None:
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    mon, sender = make_monitor(mlp, opt)
    sent = []
    for i in range(4):
        x, y = _batch(i)
        opt.zero_grad()
        loss = nn.functional.mse_loss(mlp(x), y)
        loss.backward()
        opt.step()
        with caplog.at_level(logging.WARNING, logger="sentinel"):
            mon.log(loss=loss, step=own_step(i), epoch=1.0)
        sent.append(loss.item())
    mon.close()
    got = [(f["step"], f["scalars"]["loss"]) for f in sender.frames if "loss" in f.get("scalars", {})]
    assert [s for s, _ in got] == at
    assert [v for _, v in got] == pytest.approx(sent)
    assert sum("epoch" in f.get("scalars", {}) for f in sender.frames) == 4
    assert not any(f.get("scalars_dropped") for f in sender.frames)
    warned = [r.getMessage() for r in caplog.records if "log(step=" in r.getMessage()]
    assert len(warned) == (1 if own_step(0) != 1 else 0), warned  # once, when a step names none of ours


class _Wrapper:
    """A DeepSpeed-style wrapper: the real optimizer is ``.optimizer``, ``step`` delegates."""

    def __init__(self, opt: torch.optim.Optimizer) -> None:
        self.optimizer = opt

    def step(self) -> None:
        self.optimizer.step()


def test_watch_hooks_the_optimizer_inside_a_wrapper(mlp: MLP) -> None:
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    wrapped = _Wrapper(opt)
    mon = sentinel.watch(mlp, wrapped, engine="off")
    x, y = _batch(0)
    nn.functional.mse_loss(mlp(x), y).backward()
    wrapped.step()
    assert mon.active and mon.optimizers == [opt] and mon.steps == 1
    mon.close()


def test_an_optimizer_given_twice_is_watched_once(mlp: MLP) -> None:
    """``watch(model, [opt, opt])``, or an optimizer beside its own wrapper: one optimizer, whose
    steps close a report each. Listed twice, it was two optimizers of the stream, whose
    second never stepped apart from the first."""
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    mon = sentinel.watch(mlp, [opt, _Wrapper(opt), opt], engine="off")
    assert mon.optimizers == [opt]
    mon.close()


def test_a_model_and_an_optimizer_given_the_wrong_way_round_are_told_so(mlp: MLP,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    for args in ((opt, mlp), (opt,)):
        with caplog.at_level(logging.WARNING, logger="sentinel"):
            mon = sentinel.watch(*args)
        assert not mon.active
        assert mon.reason == "the model is a SGD, not a torch.nn.Module; the model comes first: watch(model, optimizer)"


@pytest.mark.parametrize(("model", "optimizer"), [
    ("mlp", "not an optimizer"),
    ("mlp", object()),
    ("mlp", []),
    ("mlp", 42),
    ("a string", "sgd"),
])
def test_watch_never_raises_for_what_it_cannot_watch(mlp: MLP, model: Any, optimizer: Any,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    if optimizer == "sgd":
        optimizer = torch.optim.SGD(mlp.parameters(), lr=0.01)
    before = watching.unsupported_total
    with caplog.at_level(logging.WARNING, logger="sentinel"):
        mon = sentinel.watch(mlp if model == "mlp" else model, optimizer)  # the default engine="process"
    assert not mon.active and mon.engine is None and mon.reason
    assert watching.unsupported_total == before + 1
    assert [r for r in caplog.records if "cannot watch" in r.getMessage()]
    mon.log(loss=1.0)  # an inert monitor takes calls and does nothing
    mon.close()
    from sentinel.instrument import preclip as clip
    assert mon.note_clip not in clip._listeners  # nothing stays attached
    children = subprocess.run(["ps", "-o", "args=", "--ppid", str(os.getpid())], capture_output=True, text=True)
    assert "sentinel.daemon.child" not in children.stdout  # no engine process left behind


def test_a_layer_unfrozen_later_is_counted_from_then_on(mlp: MLP) -> None:
    for p in mlp.layers[0].parameters():
        p.requires_grad_(False)
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    mon, sender = make_monitor(mlp, opt)
    expected = []
    for i in range(5):
        if i == 2:
            for p in mlp.layers[0].parameters():
                p.requires_grad_(True)
        x, y = _batch(i)
        opt.zero_grad()
        nn.functional.mse_loss(mlp(x), y).backward()
        expected.append(_norm(mlp))
        opt.step()
    mon.close()
    frames = sender.steps()
    assert "layers.0" not in frames[0]["groups"] and "layers.0" in frames[2]["groups"]
    assert _frame_norms(sender) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("toggle", ["lightning", "pix2pix"])
def test_optimizers_that_freeze_each_other_for_their_steps_are_each_read(toggle: str) -> None:
    """One monitor over a GAN's two optimizers, each stepped while the other's parameters
    have ``requires_grad`` off: Lightning's ``toggle_optimizer`` in manual optimization
    (the generator first; each player frozen for the other's step), pix2pix's
    ``set_requires_grad(netD, False)`` for the generator's step (the discriminator first).
    The layout took the discriminator for frozen at the generator's step: its gradients
    were never read, and ``GradientsMissing`` (critical) paged at step 20."""
    torch.manual_seed(0)
    gen, disc = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 8)), nn.Sequential(nn.Linear(8, 1))
    model = nn.ModuleDict({"generator": gen, "discriminator": disc})
    opt_g, opt_d = torch.optim.Adam(gen.parameters(), lr=1e-3), torch.optim.Adam(disc.parameters(), lr=1e-3)
    mon, sender = make_monitor(model, [opt_g, opt_d])
    expected = []

    def step(opt: torch.optim.Optimizer, player: nn.Module, loss: torch.Tensor, other: nn.Module) -> float:
        if toggle == "lightning":
            other.requires_grad_(False)
        loss.backward()
        sumsq = sum(float(p.grad.pow(2).sum()) for p in player.parameters())
        opt.step()
        opt.zero_grad()
        other.requires_grad_(True)
        return sumsq

    for i in range(24):
        z, real = torch.randn(16, 4), torch.randn(16, 8) + 1
        if toggle == "lightning":
            g = step(opt_g, gen, -disc(gen(z)).mean(), disc)
            d = step(opt_d, disc, disc(gen(z).detach()).mean() - disc(real).mean(), gen)
        else:
            d = step(opt_d, disc, disc(gen(z).detach()).mean() - disc(real).mean(), gen)
            disc.requires_grad_(False)
            g = step(opt_g, gen, -disc(gen(z)).mean(), disc)
        expected.append(math.sqrt(g + d))
    mon.close()
    frames = sender.steps()
    assert frames[-1]["groups"] == ["generator.0", "generator.2", "discriminator.0"], frames[-1]["groups"]
    assert _frame_norms(sender) == pytest.approx(expected, rel=1e-5)
    assert not [f for f in frames if f.get("no_gradient")]


def test_a_param_group_added_later_is_counted(mlp: MLP) -> None:
    opt = torch.optim.SGD(mlp.layers.parameters(), lr=0.01)
    mon, sender = make_monitor(mlp, opt)
    expected = []
    for i in range(4):
        if i == 2:
            opt.add_param_group({"params": list(mlp.head.parameters()), "lr": 0.001})
        x, y = _batch(i)
        opt.zero_grad()
        nn.functional.mse_loss(mlp(x), y).backward()
        expected.append(float(torch.nn.utils.get_total_norm(
            [p.grad for g in opt.param_groups for p in g["params"]])))
        opt.step()
    mon.close()
    assert [f["groups"][-1] for f in sender.steps()] == ["layers.2", "layers.2", "head", "head"]
    assert _frame_norms(sender) == pytest.approx(expected, rel=1e-5)
    assert len(sender.steps()[-1]["lr"]) == 2


def test_a_re_created_optimizer_is_followed_and_steps_continue(mlp: MLP, caplog: pytest.LogCaptureFixture) -> None:
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    mon, sender = _watched(mlp, opt)
    with caplog.at_level(logging.WARNING, logger="sentinel"):
        for i in range(6):
            if i == 3:  # an LR finder's restart: a new optimizer over the same parameters
                opt = torch.optim.AdamW(mlp.parameters(), lr=1e-3)
            x, y = _batch(i)
            opt.zero_grad()
            loss = nn.functional.mse_loss(mlp(x), y)
            loss.backward()
            opt.step()
            mon.log(loss=loss)
    mon.close()
    assert [f["step"] for f in sender.steps()] == [1, 2, 3, 4, 5, 6]
    assert mon.optimizers == [opt]
    assert [r for r in caplog.records if "new AdamW steps the watched parameters" in r.getMessage()]
    assert "exp_avg" in sender.steps()[3]["state_bytes"]


def test_watch_twice_returns_the_same_monitor(mlp: MLP, caplog: pytest.LogCaptureFixture) -> None:
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    first = sentinel.watch(mlp, opt, engine="off")
    with caplog.at_level(logging.WARNING, logger="sentinel"):
        second = sentinel.watch(mlp, opt, engine="off", run="other")
    assert second is first
    assert [r for r in caplog.records if "already watched" in r.getMessage()]
    x, y = _batch(0)
    nn.functional.mse_loss(mlp(x), y).backward()
    opt.step()
    assert first.steps == 1  # hooked once: one report per step
    first.close()


_SCRIPT = """
import os, torch, sentinel
from torch import nn
from sentinel.instrument import auto
assert auto.install()
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
def step():
    opt.zero_grad(); model(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()
if os.environ["WHEN"] == "after":
    for _ in range(3):
        step()
    assert len(auto.monitors()) == 1 and auto.monitors()[0].steps == 3
mon = sentinel.watch(model, opt, run="mine", engine="off")
for _ in range(2):
    step()
live = [m for m in auto.monitors() if not m.closed]
print("live-auto", len(live), "steps", mon.steps, "run", mon.options.run)
mon.close()
"""


@pytest.mark.parametrize(("when", "steps"), [("before", 2), ("after", 5)])
def test_watch_inside_a_zero_code_script_is_the_one_monitor(when: str, steps: int) -> None:
    env = {**os.environ, "SENTINEL_AUTO": "1", "SENTINEL_SOCKET": "/nonexistent/sentinel.sock", "WHEN": when,
           "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(_SCRIPT)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"live-auto 0 steps {steps} run mine" in out.stdout


@pytest.mark.parametrize(("shape", "want"), [
    # one backward() fills both optimizers' gradients (a sparse table's SparseAdam and a
    # dense head's Adam, Muon + AdamW): both steps apply that loss
    ("shared", [("a", "ab"), ("b", "ab")]),
    # a GAN: each optimizer's own backward() calls, never the other's
    ("gan", [("a", "a"), ("b", "b")]),
])
def test_captured_loss_of_two_optimizers_is_the_backward_that_filled_each(shape: str,
                                                                         want: list[tuple[str, str]]) -> None:
    torch.manual_seed(0)
    a, b = MLP(), MLP()
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.01), torch.optim.Adam(b.parameters(), lr=0.01)
    sender = CaptureSender()
    mon_a, _ = make_monitor(a, opt_a, sender=sender, capture_loss=True)
    mon_b, _ = make_monitor(b, opt_b, sender=sender, capture_loss=True)
    expected: dict[str, list[float]] = {"a": [], "b": []}
    for i in range(3):
        x, y = _batch(i)
        la, lb = nn.functional.mse_loss(a(x), y), nn.functional.mse_loss(b(x), y)
        opt_a.zero_grad()
        opt_b.zero_grad()
        if shape == "shared":
            (la + lb).backward()
            opt_a.step()
            opt_b.step()
        else:
            la.backward()
            opt_a.step()
            lb.backward()
            opt_b.step()
        values = {"a": la.item(), "b": lb.item(), "ab": (la + lb).item()}
        for name, which in want:
            expected[name].append(values[which])
    mon_a.close()
    mon_b.close()
    got = {name: [f.get("scalars", {}).get("loss") for f in sender.steps() if f.get("opt") == label]
           for name, label in (("a", "0"), ("b", "1"))}
    assert got == {k: pytest.approx(v, rel=1e-6) for k, v in expected.items()}


class _SAM(torch.optim.Optimizer):
    """The shapes of the widely copied SAM optimizer: ``shares="list"`` builds its base
    optimizer over its own groups and takes the base's list (davda54/sam);
    ``shares="dicts"`` wraps a base optimizer made by the script, its own list holding the
    base's group dicts; ``shares="uninit"`` never runs ``Optimizer.__init__``."""

    def __init__(self, params: Any, shares: str, rho: float = 0.05, **kw: Any) -> None:
        if shares == "list":
            super().__init__(params, dict(rho=rho, **kw))
            self.base_optimizer = torch.optim.SGD(self.param_groups, **kw)
            self.param_groups = self.base_optimizer.param_groups
        elif shares == "dicts":
            self.base_optimizer = torch.optim.SGD(params, **kw)
            super().__init__(self.base_optimizer.param_groups, dict(rho=rho, **kw))
        else:
            self.base_optimizer = torch.optim.SGD(params, **kw)
            self.param_groups = self.base_optimizer.param_groups
        self.rho = rho
        self.old: dict[int, torch.Tensor] = {}

    @torch.no_grad()
    def first_step(self, zero_grad: bool = False) -> None:
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        scale = self.rho / (torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in grads])) + 1e-12)
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    self.old[id(p)] = p.detach().clone()
                    p.add_(p.grad * scale)
        if zero_grad:
            self.base_optimizer.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad: bool = False) -> None:
        for g in self.param_groups:
            for p in g["params"]:
                if id(p) in self.old:
                    p.copy_(self.old[id(p)])
        self.base_optimizer.step()
        if zero_grad:
            self.base_optimizer.zero_grad()

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # the closure form: both passes in one call
        self.both_passes(closure)

    def both_passes(self, closure: Any) -> None:
        self.first_step(zero_grad=True)
        with torch.enable_grad():
            closure()
        self.second_step()


class _UninitSAM(_SAM):
    """Its own ``step``: torch wraps a class's ``step`` in ``Optimizer.__init__``, which
    this one never runs (an instance of ``_SAM`` would have wrapped the inherited one)."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        self.both_passes(closure)


def _sam_steps(mlp: MLP, sam: _SAM, steps: int, closure: bool) -> tuple[list[float], list[float]]:
    """SAM's loop; the losses and norms of its second passes, whose gradients its steps apply."""
    losses, norms = [], []

    def second(x: torch.Tensor, y: torch.Tensor) -> None:
        perturbed = nn.functional.mse_loss(mlp(x), y)
        perturbed.backward()
        losses.append(perturbed.item())
        norms.append(_norm(mlp))

    for i in range(steps):
        x, y = _batch(i)
        nn.functional.mse_loss(mlp(x), y).backward()  # the first pass: the loss SAM scripts print
        if closure:
            sam.step(lambda x=x, y=y: second(x, y))
        else:
            sam.first_step(zero_grad=True)
            second(x, y)
            sam.second_step()
        sam.base_optimizer.zero_grad()
    return losses, norms


@pytest.mark.parametrize("shares", ["list", "dicts", "uninit"])
@pytest.mark.parametrize("closure", [False, True], ids=["two-calls", "closure"])
def test_sam_is_watched_through_its_base_optimizer_one_step_each(mlp: MLP, shares: str, closure: bool,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    sam = (_UninitSAM if shares == "uninit" else _SAM)(mlp.parameters(), shares, lr=0.05, momentum=0.9)
    mon, sender = _watched(mlp, sam, capture_loss=True)
    try:
        with caplog.at_level(logging.INFO, logger="sentinel"):
            losses, norms = _sam_steps(mlp, sam, 4, closure)
    finally:
        mon.close()
    assert mon.optimizers == [sam.base_optimizer]  # the optimizer whose step applies the update
    assert not [r for r in caplog.records if "steps the watched parameters" in r.getMessage()]
    steps = sender.steps()
    assert [f["step"] for f in steps] == [1, 2, 3, 4]
    # the loss of the pass whose gradients the step applies, not the sum with the first's
    assert [f["scalars"]["loss"] for f in steps] == pytest.approx(losses, rel=1e-6)
    assert _frame_norms(sender) == pytest.approx(norms, rel=1e-5)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_adversarial_training_reports_the_loss_of_the_pass_it_applies(mlp: MLP, set_to_none: bool) -> None:
    """PGD-style adversarial training: attack passes whose backward() also fills the
    model's gradients (summed over the attack), then zero_grad() and the training pass on
    the perturbed batch, whose gradients the step applies: its loss is the step's. Zeroed in
    place (``set_to_none=False``, the gradient's version counter moves) as set to None: the
    step's loss was the attack's three losses and the pass's, summed."""
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    mon, sender = make_monitor(mlp, opt, capture_loss=True)
    expected = []
    try:
        for step in range(3):
            x, y = _batch(step)
            delta = torch.zeros_like(x, requires_grad=True)
            for _ in range(3):  # the attack
                nn.functional.mse_loss(mlp(x + delta), y).backward()
                delta.data = (delta + 0.05 * delta.grad.sign()).clamp(-0.1, 0.1)
                delta.grad.zero_()
            opt.zero_grad(set_to_none=set_to_none)
            loss = nn.functional.mse_loss(mlp(x + delta.detach()), y)
            loss.backward()
            opt.step()
            expected.append(loss.item())
    finally:
        mon.close()
    assert [f["scalars"]["loss"] for f in sender.steps()] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_gradient_surgery_reports_the_losses_of_every_task_it_combines(reduction: str) -> None:
    """PCGrad (pytorch-optimizer's, the shape of Pytorch-PCGrad): each task's loss gets a
    backward() of its own after a reset, its gradients kept aside; the projected
    combination is set as the gradients and the base optimizer steps. The step applies
    every task's gradients, so its loss is the sum of the tasks' (it was the last task's
    alone, taken for the one pass not thrown away)."""
    from pytorch_optimizer import PCGrad

    torch.manual_seed(0)
    trunk, heads = nn.Sequential(nn.Linear(8, 16), nn.Tanh()), nn.ModuleList(nn.Linear(16, 1) for _ in range(2))
    model = nn.ModuleDict({"trunk": trunk, "heads": heads})
    base = torch.optim.Adam(model.parameters(), lr=1e-2)
    surgery = PCGrad(base, reduction=reduction)
    mon, sender = make_monitor(model, base, capture_loss=True)
    expected, applied = [], []
    try:
        for step in range(4):
            x = torch.randn(32, 8, generator=torch.Generator().manual_seed(step))
            z = trunk(x)
            tasks = [nn.functional.mse_loss(heads[0](z), x[:, :1]), nn.functional.mse_loss(heads[1](z), -x[:, 1:2])]
            surgery.pc_backward(tasks)
            applied.append(_norm(model))
            surgery.step()
            expected.append(sum(t.item() for t in tasks))
    finally:
        mon.close()
    frames = sender.steps()
    assert [f["scalars"]["loss"] for f in frames] == pytest.approx(expected, rel=1e-6)
    assert _frame_norms(sender) == pytest.approx(applied, rel=1e-5)  # the combination's


def test_a_reset_between_backward_calls_is_not_accumulation_but_a_reset_after_a_step_is(mlp: MLP) -> None:
    """Accumulated micro-batches sum; a zero_grad() at each step starts the next sum."""
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    mon, sender = make_monitor(mlp, opt, capture_loss=True)
    expected = []
    for step in range(3):
        total = 0.0
        for micro in range(2):
            x, y = _batch(10 * step + micro)
            loss = nn.functional.mse_loss(mlp(x), y) / 2
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad()
        expected.append(total)
    mon.close()
    assert [f["scalars"]["loss"] for f in sender.steps()] == pytest.approx(expected, rel=1e-6)


def test_pytorch_optimizers_sam_and_lookahead_report_one_step_per_update(mlp: MLP,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """The maintained package's own wrappers (pytorch-optimizer, the test extra): its SAM
    (the davda54 shape) and a Lookahead around AdamW, whose step() runs its base's inside."""
    from pytorch_optimizer import SAM, Lookahead

    sam = SAM(mlp.parameters(), torch.optim.SGD, rho=0.05, lr=0.05, momentum=0.9)
    mon, sender = _watched(mlp, sam, capture_loss=True)
    try:
        with caplog.at_level(logging.INFO, logger="sentinel"):
            losses = []
            for i in range(3):
                x, y = _batch(i)
                nn.functional.mse_loss(mlp(x), y).backward()
                sam.first_step(zero_grad=True)
                perturbed = nn.functional.mse_loss(mlp(x), y)
                perturbed.backward()
                losses.append(perturbed.item())
                sam.second_step(zero_grad=True)
    finally:
        mon.close()
    assert mon.optimizers == [sam.base_optimizer]
    assert [f["step"] for f in sender.steps()] == [1, 2, 3]
    assert [f["scalars"]["loss"] for f in sender.steps()] == pytest.approx(losses, rel=1e-6)

    ahead = Lookahead(torch.optim.AdamW(mlp.parameters(), lr=1e-3), k=2)
    mon, sender = _watched(mlp, ahead)
    try:
        with caplog.at_level(logging.INFO, logger="sentinel"):
            _plain_steps(mlp, ahead, 4)
    finally:
        mon.close()
    assert mon.optimizers == [ahead.optimizer]
    assert [f["step"] for f in sender.steps()] == [1, 2, 3, 4]
    assert not [r for r in caplog.records if "steps the watched parameters" in r.getMessage()]


def test_an_optimizer_stepped_inside_a_watched_ones_step_is_part_of_its_step(mlp: MLP) -> None:
    """The local optimizer is not followed as the watched one (its parameters are watched)
    nor seen as a second stream: the frames' norms are the whole model's, once, one frame a
    step, and the state is what the local optimizer holds (the outer keeps none)."""
    sharded = ShardedAdamW(mlp.parameters())
    mon, sender = _watched(mlp, sharded)
    norms = []
    try:
        for i in range(4):
            x, y = _batch(i)
            nn.functional.mse_loss(mlp(x), y).backward()
            norms.append(_norm(mlp))
            sharded.step()
            sharded.zero_grad()
    finally:
        mon.close()
    assert mon.optimizers == [sharded]
    steps = sender.steps()
    assert [f["step"] for f in steps] == [1, 2, 3, 4] and not [f for f in steps if f.get("opt")]
    assert _frame_norms(sender) == pytest.approx(norms, rel=1e-5)
    half = sum(p.numel() * p.element_size() for p in sharded.optim.param_groups[0]["params"])
    recorded = [f["state_bytes"] for f in steps if "state_bytes" in f]
    assert recorded and recorded[-1] == {"exp_avg": half, "exp_avg_sq": half}, recorded


def test_a_step_that_raised_does_not_swallow_the_next_optimizers_steps(mlp: MLP) -> None:
    """A watched step that raised never ran its post-hook: another watched optimizer that
    steps after it (the script caught the error) is its own step, not one inside it."""
    other = MLP()
    opt_a = torch.optim.SGD(mlp.parameters(), lr=0.01)
    opt_b = torch.optim.SGD(other.parameters(), lr=0.01)
    sender = CaptureSender()
    mon_a, _ = make_monitor(mlp, opt_a, sender=sender)
    mon_b, _ = make_monitor(other, opt_b, sender=sender)

    def fails() -> float:
        raise RuntimeError("closure failed")

    try:
        for i in range(3):
            x, y = _batch(i)
            nn.functional.mse_loss(mlp(x), y).backward()
            nn.functional.mse_loss(other(x), y).backward()
            if i == 1:
                with pytest.raises(RuntimeError, match="closure failed"):
                    opt_a.step(fails)
            else:
                opt_a.step()
            opt_b.step()
    finally:
        mon_a.close()
        mon_b.close()
    assert [f["step"] for f in sender.steps() if f.get("opt") == "1"] == [1, 2, 3]


def _trained_state(opt_cls: Any, steps: int, **kw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A checkpoint of an MLP and its optimizer after ``steps`` steps, as a script saves one."""
    torch.manual_seed(0)
    model = MLP()
    opt = opt_cls(model.parameters(), **kw)
    _plain_steps(model, opt, steps, first=100)
    return model.state_dict(), opt.state_dict()


@pytest.mark.parametrize(("opt_cls", "kw", "first"), [
    (torch.optim.AdamW, {"lr": 1e-3}, 8),  # Adam's state counts its steps: they go on
    (torch.optim.RMSprop, {"lr": 1e-3}, 8),
    (torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9}, 1),  # momentum buffers only: no count to go on from
])
def test_an_optimizer_resumed_from_a_checkpoint_goes_on_counting_its_steps(opt_cls: Any, kw: dict[str, Any],
                                                                          first: int) -> None:
    """A script resumed from its checkpoint (nanoGPT's ``init_from="resume"``): the model and
    the optimizer are made afresh and load their states, before or after ``watch()``."""
    model_state, opt_state = _trained_state(opt_cls, 7, **kw)
    for load_after_watch in (False, True):
        torch.manual_seed(1)
        model = MLP()
        opt = opt_cls(model.parameters(), **kw)
        if not load_after_watch:  # (a copy, as from a file: Adam counts on in the loaded step tensors)
            model.load_state_dict(model_state)
            opt.load_state_dict(copy.deepcopy(opt_state))
        mon, sender = make_monitor(model, opt)
        if load_after_watch:
            model.load_state_dict(model_state)
            opt.load_state_dict(copy.deepcopy(opt_state))
        try:
            _plain_steps(model, opt, 3, mon=mon)
        finally:
            mon.close()
        assert [f["step"] for f in sender.steps()] == [first, first + 1, first + 2], load_after_watch


def test_a_fresh_optimizer_counts_from_one(mlp: MLP) -> None:
    opt = torch.optim.AdamW(mlp.parameters(), lr=1e-3)
    mon, sender = make_monitor(mlp, opt)
    try:
        _plain_steps(mlp, opt, 2)
    finally:
        mon.close()
    assert [f["step"] for f in sender.steps()] == [1, 2]


def test_which_new_optimizer_takes_a_watched_ones_place() -> None:
    """The monitor follows a new optimizer that replaces its own (the same parameters, or
    all of them and more: a fine-tuning script's once it unfreezes the backbone, which it
    lists first); one that only shares a trunk with it (an actor-critic's critic) is not
    taken for a replacement, which would move the monitor back and forth every step."""
    from sentinel.instrument.registry import _owner_of

    trunk, actor, critic = nn.Linear(4, 8), nn.Linear(8, 2), nn.Linear(8, 1)
    model = nn.ModuleDict({"trunk": trunk, "actor": actor, "critic": critic})
    opt = torch.optim.Adam([*actor.parameters(), *trunk.parameters()], lr=1e-3)
    mon, _ = make_monitor(model, opt)
    try:
        assert _owner_of(torch.optim.Adam([*actor.parameters(), *trunk.parameters()])) is mon  # made anew
        assert _owner_of(torch.optim.Adam([*critic.parameters(), *actor.parameters(), *trunk.parameters()])) is mon
        assert _owner_of(torch.optim.Adam([*critic.parameters(), *trunk.parameters()])) is None  # beside it
        assert _owner_of(torch.optim.Adam(nn.Linear(4, 8).parameters())) is None  # another model
    finally:
        mon.close()


def test_more_optimizers_side_by_side_than_a_report_can_name(caplog: pytest.LogCaptureFixture) -> None:
    """Greedy layer-wise training with an optimizer per block, 102 blocks, all made before
    any step: the first 100 are streams ``"0"`` to ``"99"``; the 101st and 102nd send
    nothing, and one line says so. Their frames carried ``"100"`` and ``"101"``, which the
    engine refuses whole (a stream label has at most 2 digits), with a line about a refused
    frame that named no optimizer."""
    from sentinel.instrument import reporter

    reporter._streams_said = False
    torch.manual_seed(0)
    blocks = [nn.Linear(4, 4) for _ in range(102)]
    opts = [torch.optim.SGD(b.parameters(), lr=0.01) for b in blocks]
    sender = CaptureSender()
    mons = [make_monitor(b, o, sender=sender)[0] for b, o in zip(blocks, opts)]
    x = torch.randn(8, 4)
    with caplog.at_level(logging.WARNING, logger="sentinel"):
        for _ in range(2):
            for b, o in zip(blocks, opts):
                o.zero_grad()
                b(x).pow(2).mean().backward()
                o.step()
        for m in mons:
            m.close()
    labels = sorted({f.get("opt") for f in sender.steps()}, key=lambda s: int(s or -1))
    assert labels == [str(i) for i in range(100)]
    assert sender.engine.refused == {} and sender.engine.frames_malformed == 0
    lines = [r.getMessage() for r in caplog.records if "optimizers of this process" in r.getMessage()]
    assert lines == ["sentinel: more than 100 optimizers of this process step side by side; the 101st and any "
                     "further one are not reported (a report names at most 100 streams of a process)"]
    assert [m.frames_dropped for m in mons[100:]] == [3, 3]  # two steps and the goodbye, each


def test_log_after_close_sends_nothing(mlp: MLP) -> None:
    """A final metric logged after ``close()`` (a test accuracy computed at the end) went out
    as a frame after the stream's goodbye."""
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    mon, sender = make_monitor(mlp, opt)
    x, y = _batch(0)
    nn.functional.mse_loss(mlp(x), y).backward()
    opt.step()
    mon.log(loss=1.0)
    mon.close()
    mon.log(loss=0.5, test_acc=0.9)
    mon.heartbeat()
    assert [f["kind"] for f in sender.frames] == ["step", "bye"]


def test_an_optimizer_watched_again_after_its_monitor_closed_is_told_once(mlp: MLP,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """``with sentinel.watch(...)`` inside the epoch loop: each epoch a new training to the
    engine and the history (a run row per epoch: ``ep@1``, ``ep@2``, ...), said once."""
    from sentinel.instrument import watching

    watching._rewatch_said = False
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    with caplog.at_level(logging.WARNING, logger="sentinel"):
        for _ in range(3):
            with sentinel.watch(mlp, opt, run="ep", engine="off"):
                x, y = _batch(0)
                opt.zero_grad()
                nn.functional.mse_loss(mlp(x), y).backward()
                opt.step()
    said = [r.getMessage() for r in caplog.records if "watched before" in r.getMessage()]
    assert len(said) == 1 and "closed at step 1 (run 'ep')" in said[0], said
    caplog.clear()
    other = torch.optim.SGD(mlp.parameters(), lr=0.01)  # a new optimizer (the next fold's): nothing to say
    sentinel.watch(mlp, other, run="ep", engine="off").close()
    assert not [r for r in caplog.records if "watched before" in r.getMessage()]
