"""The step guard's behaviour around the exact skip: max_consecutive, GradScaler, closures,
the off switch, and the trail (counter, StepSkipped/StepsSkippedRepeatedly/GuardExhausted
alerts from a real engine)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import sentinel
from sentinel.instrument.monitor import TrainingHalted
from sentinel.rules.alert import Transition
from sentinel.store import labels_of
from tests.helpers import MLP, make_monitor


def _loop(mon: Any, model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, bad: set[int],
          scaler: Any = None) -> list[float]:
    """Steps 1..steps; the gradients of the steps in ``bad`` get a NaN. Returns the first
    weight after each step."""
    gen = torch.Generator().manual_seed(0)
    seen = []
    for step in range(1, steps + 1):
        x = torch.randn(8, 16, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if step in bad:
            model.layers[1][0].weight.grad[0, 0] = float("nan")
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        mon.log(loss=loss)
        seen.append(float(model.head.weight[0, 0].detach()))
    return seen


def _transitions(sender: Any) -> list[Transition]:
    out: list[Transition] = []
    sender.engine.listeners.append(out.append)
    return out


def test_skips_are_counted_alerted_and_listed() -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon, sender = make_monitor(model, opt, guard={"warmup": 3}, job="j", run="r")
    fired = _transitions(sender)
    _loop(mon, model, opt, 12, bad={5, 8, 9, 10})
    mon.close()
    assert mon.guard.steps == [5, 8, 9, 10]
    notes = [f for f in sender.frames if "guard" in f]
    assert [(f["step"], f["guard"]["skipped"]) for f in notes] == [
        (1, False), (5, True), (6, False), (8, True), (9, True), (10, True), (11, False)]
    assert notes[1]["guard"]["groups"] == ["layers.1"] and notes[1]["guard"]["reason"] == "nonfinite"
    store = sender.engine.store
    assert store.counter("sentinel_guard_skipped_total", labels_of(job="j", run="r", rank=0, reason="nonfinite")) == 4
    assert store.counter("sentinel_guard_skipped_total", labels_of(job="j", run="r", rank=0, reason="spike")) == 0
    firing = [(t.alertname, t.severity, t.step) for t in fired if t.state_to == "firing"
              and t.alertname in ("StepSkipped", "StepsSkippedRepeatedly", "GuardExhausted")]
    assert firing == [("StepSkipped", "info", 5), ("StepSkipped", "info", 8),
                      ("StepsSkippedRepeatedly", "warning", 10)]
    first = next(t for t in fired if t.alertname == "StepSkipped")
    assert "step 5 skipped (nonfinite)" in first.summary and first.groups == ("layers.1",)
    assert "batch index not exposed" in first.summary


def test_spike_alert_says_the_norm_and_its_bound() -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon, sender = make_monitor(model, opt, guard={"warmup": 3})
    fired = _transitions(sender)

    def spike(i: int) -> None:
        if i == 7:
            for p in model.parameters():
                p.grad.mul_(1e3)
    from tests.helpers import train_steps

    train_steps(model, opt, 10, mon, before_step=spike)
    mon.close()
    assert mon.guard.steps == [8] and mon.guard.skipped["spike"] == 1
    alert = next(t for t in fired if t.alertname == "StepSkipped")
    assert "step 8 skipped (spike): gradient norm" in alert.summary and "> bound" in alert.summary


def test_max_consecutive_halt_raises_with_the_skipped_steps_kept_out() -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon, sender = make_monitor(model, opt, guard={"max_consecutive": 3, "warmup": 3})
    fired = _transitions(sender)
    with pytest.raises(TrainingHalted, match="3 steps skipped in a row"):
        _loop(mon, model, opt, 12, bad=set(range(4, 13)))
    mon.close()
    assert mon.guard.steps == [4, 5, 6]
    assert torch.isfinite(torch.cat([p.detach().reshape(-1) for p in model.parameters()])).all()
    assert [(t.alertname, t.step) for t in fired if t.state_to == "firing" and t.severity == "critical"
            and t.alertname == "GuardExhausted"] == [("GuardExhausted", 6)]


def test_max_consecutive_through_lets_the_steps_through() -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon, sender = make_monitor(model, opt, guard={"max_consecutive": 2, "on_exhausted": "through", "warmup": 3})
    _loop(mon, model, opt, 8, bad={4, 5, 6})
    mon.close()
    assert mon.guard.steps == [4, 5]
    assert not torch.isfinite(model.layers[1][0].weight).all()  # step 6's NaN went in, as asked
    # ... and the NaN weights make every later gradient NaN: let through as well
    assert mon.guard.through == 3
    assert [(f["step"], f["guard"]["outcome"]) for f in sender.frames if "guard" in f and f["guard"]["outcome"]] == [
        (6, "through"), (7, "through"), (8, "through")]


def test_an_amp_overflow_is_never_a_guard_skip() -> None:
    """A GradScaler (fused Adam takes its found_inf; CPU scaler, fp32 here) finds the inf
    itself: its skip, its scale backoff, and no guard skip."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    mon, sender = make_monitor(model, opt, guard={"warmup": 3}, scaler=scaler)
    gen = torch.Generator().manual_seed(0)
    for step in range(1, 8):
        x = torch.randn(8, 16, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        scaler.scale(loss).backward()
        if step == 5:
            model.head.weight.grad[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
        mon.log(loss=loss)
    mon.close()
    assert mon.guard.steps == [] and mon.guard.skipped == {"nonfinite": 0, "spike": 0}
    assert scaler.get_scale() == 2.0**9  # the scaler's own backoff happened
    assert not any(f["guard"]["skipped"] or f["guard"]["outcome"] for f in sender.frames if "guard" in f)


@pytest.mark.parametrize("fused", [False, True])
def test_a_guard_skip_leaves_the_grad_scaler_scale_and_growth_as_they_were(fused: bool) -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=fused)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    mon, _ = make_monitor(model, opt, guard={"warmup": 3}, scaler=scaler)
    scales = []
    gen = torch.Generator().manual_seed(0)
    for step in range(1, 9):
        x = torch.randn(8, 16, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        scaler.scale(loss).backward()
        if step == 6:  # a spike the scaler does not see: finite, far above the median
            for p in model.parameters():
                p.grad.mul_(1e4)
        scaler.step(opt)
        scaler.update()
        scales.append((scaler.get_scale(), int(scaler._growth_tracker)))
    mon.close()
    assert mon.guard.steps == [6]
    assert scales[5] == scales[4]  # step 6 skipped: neither the scale nor its growth counter moved
    assert "update" not in vars(scaler)  # nothing of the guard left on the scaler


def test_closure_optimizers_are_judged_after_the_closure() -> None:
    """LBFGS calls the closure inside step(): the guard decides on the gradients it made."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    mon, _ = make_monitor(model, opt, guard={"warmup": 3})
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 16, generator=gen)
    for step in range(1, 7):
        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            loss.backward()
            if step == 4:
                model.head.bias.grad.fill_(float("nan"))
            return loss
        before = [p.detach().clone() for p in model.parameters()]
        opt.step(closure)
        if step == 4:
            assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    mon.close()
    assert mon.guard.steps == [4] and mon.guard.methods[0] == "sync"
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_with_the_guard_off_nothing_new_is_hooked() -> None:
    model = MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    mon, _ = make_monitor(model, opt)
    assert mon.guard is None
    with_guard, _ = make_monitor(MLP(), torch.optim.SGD(MLP().parameters(), lr=0.1), guard=True)
    assert with_guard.guard is not None
    hooks = (len(opt._optimizer_step_pre_hooks), len(opt._optimizer_step_post_hooks))
    mon.close()
    with_guard.close()
    model2 = MLP()
    opt2 = torch.optim.Adam(model2.parameters(), lr=1e-3, fused=True)
    m2 = sentinel.watch(model2, opt2, engine="off", guard=True)
    assert (len(opt2._optimizer_step_pre_hooks), len(opt2._optimizer_step_post_hooks)) == hooks
    m2.close()
    assert not hasattr(opt2, "found_inf")


@pytest.mark.parametrize(("value", "on"), [("1", True), ('{"factor": 5}', True), ("0", False), ("", False)])
def test_sentinel_guard_environment(monkeypatch: pytest.MonkeyPatch, value: str, on: bool) -> None:
    from sentinel.instrument.options import from_kwargs

    monkeypatch.setenv("SENTINEL_GUARD", value)
    g = from_kwargs({}).guard
    assert (g is not None) == on
    if value.startswith("{"):
        assert g.factor == 5


def test_bad_guard_options_are_loud() -> None:
    from sentinel.instrument.options import from_kwargs

    with pytest.raises(ValueError, match="guard.factor"):
        from_kwargs({"guard": {"factor": 0.5}})
    with pytest.raises(ValueError, match="unknown option"):
        from_kwargs({"guard": {"facter": 5}})


def test_the_readme_call_forms_and_config(tmp_path: Any) -> None:
    """docs/guard.md's call forms and config, as written there."""
    import yaml

    from sentinel.config import load_config

    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = sentinel.watch(model, opt, guard={"factor": 20, "max_consecutive": 4, "on_exhausted": "through"},
                         engine="off")
    assert (mon.guard.options.factor, mon.guard.options.max_consecutive, mon.guard.options.on_exhausted) == (
        20, 4, "through")
    mon.close()
    doc = yaml.safe_load("""
actions:
  guard: {enabled: true, nonfinite: true, spike: true, factor: 10, window: 50, warmup: 20,
          max_consecutive: 8, on_exhausted: halt}    # halt | through
  capture_on: [StepSkipped]                          # also save the skipped step's batch
""")
    cfg, _ = load_config(doc)
    assert cfg.actions.guard.to_options() == {"nonfinite": True, "spike": True, "factor": 10.0, "window": 50,
                                              "warmup": 20, "max_consecutive": 8, "on_exhausted": "halt",
                                              "method": "auto", "snapshot_bytes": 2 * 2**30}
    with pytest.raises(Exception, match="actions.guard.on_exhausted"):
        load_config({"actions": {"guard": {"enabled": True, "on_exhausted": "maybe"}}})


# -- a NaN the guard kept out does not page (TrainingNonFinite); one it let through does ------

def _nan_run(guard: Any, bad: set[int], steps: int = 10, nan_input: bool = False) -> tuple[Any, list[Transition]]:
    """A guarded (or not) run whose steps in ``bad`` get a NaN gradient (``nan_input``: a NaN
    in the batch, so the loss is NaN too). Returns the sender and the firing transitions."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon, sender = make_monitor(model, opt, guard=guard)
    fired = _transitions(sender)
    gen = torch.Generator().manual_seed(0)
    try:
        for step in range(1, steps + 1):
            x = torch.randn(8, 16, generator=gen)
            if nan_input and step in bad:
                x[2, 3] = float("nan")
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True).nan_to_num())
            opt.zero_grad()
            loss.backward()
            if step in bad and not nan_input:
                model.layers[1][0].weight.grad[0, 0] = float("nan")
            opt.step()
            mon.log(loss=loss)
    except TrainingHalted:
        pass
    mon.close()
    return sender, [t for t in fired if t.state_to == "firing"]


def _firing(fired: list[Transition], name: str) -> list[tuple[str, int]]:
    return [(t.severity, t.step) for t in fired if t.alertname == name]


@pytest.mark.parametrize("nan_input", [False, True])
def test_a_nan_the_guard_kept_out_is_info_not_a_page(nan_input: bool) -> None:
    """The skipped step's NaN (in the gradients; with a NaN in the batch, in the loss too)
    raises StepSkipped (info) and not TrainingNonFinite (critical): it never reached the
    weights. The counter of non-finite values still counts it."""
    sender, fired = _nan_run({"warmup": 3}, bad={5}, nan_input=nan_input)
    assert _firing(fired, "StepSkipped") == [("info", 5)]
    assert _firing(fired, "TrainingNonFinite") == []
    step5 = next(f for f in sender.frames if f["kind"] == "step" and f["step"] == 5)
    assert (step5["scalars"]["loss"] != step5["scalars"]["loss"]) == nan_input  # the loss was NaN
    store = sender.engine.store
    assert store.counter("sentinel_nonfinite_total", labels_of(job=sender.frames[0]["job"], run=sender.frames[0]["run"],
                                                               rank=0, source="grad")) == 1


def test_repeated_skips_escalate_without_paging_for_the_nan() -> None:
    """Skips in a row: StepsSkippedRepeatedly (warning) at 3, GuardExhausted (critical) at
    max_consecutive (halt); no TrainingNonFinite for any of the skipped steps."""
    _, fired = _nan_run({"warmup": 3, "max_consecutive": 4}, bad=set(range(4, 11)))
    assert _firing(fired, "StepSkipped") == [("info", 4)]
    assert _firing(fired, "StepsSkippedRepeatedly") == [("warning", 6)]
    assert _firing(fired, "GuardExhausted") == [("critical", 7)]
    assert _firing(fired, "TrainingNonFinite") == []


@pytest.mark.parametrize(("guard", "bad", "step"), [
    (None, {5}, 5),                                                    # the guard off
    ({"warmup": 3, "nonfinite": False}, {5}, 5),                       # on, but not for NaNs
    ({"warmup": 3, "max_consecutive": 2, "on_exhausted": "through"}, {4, 5, 6}, 6),  # let through
])
def test_a_nan_the_guard_let_through_still_pages(guard: Any, bad: set[int], step: int) -> None:
    _, fired = _nan_run(guard, bad=bad)
    assert _firing(fired, "TrainingNonFinite")[:1] == [("critical", step)]


def test_a_note_read_back_late_still_goes_before_its_steps_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an accelerator a verdict is read back asynchronously, like the report: when the
    report of a step leaves, the guard's notes up to that step leave first (no wait: they
    were queued before it). Here a verdict never says it is ready by itself."""
    from sentinel.instrument import guard as guard_mod

    monkeypatch.setattr(guard_mod._Verdict, "ready", lambda self: False)
    sender, fired = _nan_run({"warmup": 3}, bad={5})
    order = [(f["kind"], f["step"]) for f in sender.frames if f["kind"] != "step" or f["step"] in (5, 6)]
    assert order.index(("log", 5)) < order.index(("step", 5))
    assert _firing(fired, "StepSkipped") == [("info", 5)] and _firing(fired, "TrainingNonFinite") == []


@pytest.mark.parametrize(("note_step", "where", "pages"), [
    (5, "before", False),   # the note in its own frame, before the step's report
    (5, "on", False),       # the note on the step's own frame
    (4, "before", True),    # a note of another step says nothing of this one
    (None, "", True),       # no guard
])
def test_the_engine_judges_a_nan_by_the_guards_note_of_that_step(note_step: int | None, where: str,
                                                                  pages: bool) -> None:
    from sentinel import wire
    from sentinel.engine.engine import Engine
    from sentinel.wire import GuardNote

    eng = Engine()
    fired: list[Transition] = []
    eng.listeners.append(fired.append)
    ident = {"job": "j", "run": "r", "rank": 0, "world": 1}
    note = GuardNote(True, "nonfinite", float("nan"), float("nan"), ("layers.1",), 1).to_wire()
    for step in range(1, 7):
        frame = {"kind": "step", "step": step, "t": float(step), "groups": ["a", "b"],
                 "grad_sumsq": [1.0, float("nan") if step == 5 else 1.0], **ident}
        if note_step == step and where == "before":
            eng.feed(wire.encode({"kind": "log", "step": step, "t": float(step), "guard": note, **ident}))
        if note_step == step and where == "on":
            frame["guard"] = note
        if step == 4 and note_step == 4:
            eng.feed(wire.encode({"kind": "log", "step": step, "t": float(step), "guard": note, **ident}))
        eng.feed(wire.encode(frame))
    nonfinite = [t.step for t in fired if t.alertname == "TrainingNonFinite" and t.state_to == "firing"]
    assert nonfinite == ([5] if pages else [])


class _Counted(torch.optim.Optimizer):
    """A hand-written optimizer (as public code writes them) whose step counter is a Python
    int in its state: the select path puts it back on the host once the flag is read."""

    def __init__(self, params: Any, lr: float = 0.01) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                st["step"] = st.get("step", 0) + 1
                p.add_(p.grad, alpha=-g["lr"])


def test_a_state_dict_between_a_skipped_step_and_the_next_has_the_applied_steps_counters(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On an accelerator the select path's flag reaches the host up to a step late; a
    ``state_dict()`` taken before then waits for it (a pre-hook, only on that path) and
    shows the counters of the applied steps, not one ahead. Here the flag never says it is
    ready by itself, as on a busy device."""
    from sentinel.instrument import guard as guard_mod

    monkeypatch.setattr(guard_mod._Verdict, "ready", lambda self: False)
    torch.manual_seed(0)
    model = MLP()
    opt = _Counted(model.parameters())
    mon, _ = make_monitor(model, opt, guard={"warmup": 3, "method": "select"})
    gen = torch.Generator().manual_seed(0)
    taken = []
    for step in range(1, 6):
        x = torch.randn(8, 16, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        if step == 3:
            model.head.weight.grad[0, 0] = float("nan")
        opt.step()
        taken.append(opt.state_dict()["state"][0]["step"])  # a checkpoint right after the step
        mon.log(loss=loss)
    assert mon.guard.methods[0] == "select" and mon.guard.steps == [3]
    assert taken == [1, 2, 2, 3, 4]
    mon.close()
    assert not opt._optimizer_state_dict_pre_hooks  # nothing of the guard left on the optimizer


@pytest.mark.parametrize("bad_g", [set(), {5}])
def test_two_guarded_optimizers_keep_their_own_nan_out_without_a_page(bad_g: set[int]) -> None:
    """A GAN's two guarded optimizers in one process (two monitors, two streams): a NaN
    in the discriminator's gradients at step 5 is skipped by its guard alone (the generator
    steps), raises StepSkipped for that stream, and pages for neither; with a NaN in both at
    the same step, both skip and still nothing pages."""
    torch.manual_seed(0)
    disc, gen_net = MLP(), MLP()
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
    opt_g = torch.optim.Adam(gen_net.parameters(), lr=1e-3)
    mon_d, sender = make_monitor(disc, opt_d, guard={"warmup": 3}, job="gan", run="r")
    mon_g, _ = make_monitor(gen_net, opt_g, sender, guard={"warmup": 3}, job="gan", run="r")
    fired = _transitions(sender)
    data = torch.Generator().manual_seed(0)
    g_moved = []
    for step in range(1, 9):
        x = torch.randn(8, 16, generator=data)
        opt_d.zero_grad()
        loss_d = disc(x * gen_net(x).detach()).pow(2).mean()  # MLP gives one value a row
        loss_d.backward()
        if step == 5:
            disc.layers[1][0].weight.grad[0, 0] = float("nan")
        opt_d.step()
        mon_d.log(loss=loss_d)
        opt_g.zero_grad()
        loss_g = (disc(x * gen_net(x)) - 1).pow(2).mean()
        loss_g.backward()
        if step in bad_g:
            gen_net.layers[1][0].weight.grad[0, 0] = float("nan")
        before = gen_net.head.weight.detach().clone()
        opt_g.step()
        mon_g.log(loss=loss_g)
        g_moved.append(not torch.equal(before, gen_net.head.weight))
    mon_d.close()
    mon_g.close()
    assert mon_d.guard.steps == [5] and mon_g.guard.steps == sorted(bad_g)
    assert g_moved[4] is (not bad_g)  # the discriminator's skip is its own
    skipped = [t for t in fired if t.alertname == "StepSkipped"]
    assert [(t.step, t.optimizers) for t in skipped if t.state_to == "firing"] == [(5, ("0",))]
    # the second stream's skip at the same step joins the alert already firing
    assert {o for t in skipped for o in t.optimizers} == ({"0", "1"} if bad_g else {"0"})
    assert [t for t in fired if t.state_to == "firing" and t.alertname == "TrainingNonFinite"] == []
