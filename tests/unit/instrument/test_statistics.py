"""The statistics equal references computed independently with torch."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tests.helpers import MLP, make_monitor, train_steps


def test_global_grad_norm_equals_torch(mlp: MLP) -> None:
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    expected: list[float] = []

    def capture(_: int) -> None:
        grads = [p.grad for p in mlp.parameters() if p.grad is not None]
        expected.append(float(torch.nn.utils.get_total_norm(grads)))

    mon, sender = make_monitor(mlp, opt)
    train_steps(mlp, opt, 5, mon, before_step=capture)
    mon.close()
    got = [math.sqrt(math.fsum(f["grad_sumsq"])) for f in sender.steps()]
    assert got == pytest.approx(expected, rel=1e-5)
    # and the engine exports the same number
    w = sender.engine.store.window("sentinel_grad_norm", (("job", "train"), ("rank", "0"), ("run", mon.options.run)))
    assert w is not None and list(w.values) == pytest.approx(expected, rel=1e-5)


def test_group_grad_and_param_norms(mlp: MLP) -> None:
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    ref: dict[str, float] = {}

    def capture(_: int) -> None:
        ref.clear()
        for name, p in mlp.named_parameters():
            g = name.rsplit(".", 2)[0] if name.startswith("layers") else "head"
            ref[g] = ref.get(g, 0.0) + float(p.grad.double().pow(2).sum())

    mon, sender = make_monitor(mlp, opt, update_every=1)
    train_steps(mlp, opt, 3, mon, before_step=capture)
    mon.close()
    frame = sender.steps()[-1]
    assert frame["groups"] == ["layers.0", "layers.1", "layers.2", "head"]
    assert dict(zip(frame["groups"], frame["grad_sumsq"])) == pytest.approx(ref, rel=1e-5)
    pref = {g: 0.0 for g in ref}
    for name, p in mlp.named_parameters():
        g = name.rsplit(".", 2)[0] if name.startswith("layers") else "head"
        pref[g] += float(p.detach().double().pow(2).sum())
    assert dict(zip(frame["groups"], frame["param_sumsq"])) == pytest.approx(pref, rel=1e-5)


@pytest.mark.parametrize("budget", [2**30, 1])  # everything at once; one group at a time (rotating)
def test_update_ratio_matches_manual_snapshot(mlp: MLP, budget: int) -> None:
    opt = torch.optim.Adam(mlp.parameters(), lr=1e-2)
    snap: dict[str, torch.Tensor] = {}
    manual: list[dict[str, tuple[float, float]]] = []

    def before(_: int) -> None:
        snap.clear()
        snap.update({n: p.detach().clone() for n, p in mlp.named_parameters()})

    class Recorder:
        def __call__(self, *_: object) -> None:
            by_group: dict[str, tuple[float, float]] = {}
            for n, p in mlp.named_parameters():
                g = n.rsplit(".", 2)[0] if n.startswith("layers") else "head"
                d, w = by_group.get(g, (0.0, 0.0))
                by_group[g] = (d + float((p.detach() - snap[n]).double().pow(2).sum()),
                               w + float(p.detach().double().pow(2).sum()))
            manual.append(by_group)

    opt.register_step_post_hook(Recorder())
    mon, sender = make_monitor(mlp, opt, update_every=1, update_snapshot_bytes=budget)
    train_steps(mlp, opt, 8, mon, before_step=before)
    mon.close()
    seen: set[str] = set()
    for frame, ref in zip(sender.steps(), manual):
        sampled = [(g, d, p) for g, d, p in zip(frame["groups"], frame["delta_sumsq"], frame["param_sumsq"])
                   if d is not None]
        assert sampled, "every update step samples at least one group"
        for g, d, p in sampled:
            seen.add(g)
            assert math.sqrt(d) / math.sqrt(p) == pytest.approx(math.sqrt(ref[g][0] / ref[g][1]), rel=1e-4)
    assert seen == {"layers.0", "layers.1", "layers.2", "head"}
    if budget == 1:  # rotation: one group per sampling step
        assert all(sum(d is not None for d in f["delta_sumsq"]) == 1 for f in sender.steps())
        assert mon.layout.snapshots[0].buffer_bytes <= max(mon.layout.snapshots[0].group_bytes)
    # the exported global ratio is sqrt(sum d)/sqrt(sum p) over the sampled groups
    labels = (("job", "train"), ("rank", "0"), ("run", mon.options.run))
    assert sender.engine.store.last("sentinel_update_ratio", labels) is not None


def test_update_ratio_guards_zero_weights() -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].bias.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # weights stay exactly 0
    mon, sender = make_monitor(model, opt, update_every=1)
    for _ in range(2):
        loss = model(torch.randn(2, 4)).pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    mon.close()
    store = sender.engine.store
    assert store.labelsets("sentinel_group_update_ratio") == []  # no ratio, and no ZeroDivisionError
    assert store.labelsets("sentinel_update_ratio") == []
    assert mon.errors == 0


def _state_reference(opt: torch.optim.Optimizer) -> dict[str, int]:
    ref: dict[str, int] = {}
    for st in opt.state.values():
        for k, v in st.items():
            if torch.is_tensor(v) and k != "step":  # the step counter is bookkeeping, not state (issue 13)
                ref[k] = ref.get(k, 0) + v.numel() * v.element_size()
    return ref


@pytest.mark.parametrize(("make", "keys"), [
    (lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9), {"momentum_buffer"}),
    (lambda ps: torch.optim.Adam(ps, lr=1e-3), {"exp_avg", "exp_avg_sq", "step"}),
    (lambda ps: torch.optim.AdamW(ps, lr=1e-3), {"exp_avg", "exp_avg_sq", "step"}),
    (lambda ps: torch.optim.Adafactor(ps, lr=1e-2), {"row_var", "col_var", "variance", "step"}),
])
def test_optimizer_state_bytes(mlp: MLP, make: object, keys: set[str]) -> None:
    opt = make(mlp.parameters())  # type: ignore[operator]
    mon, sender = make_monitor(mlp, opt, state_every=3)
    train_steps(mlp, opt, 4, mon)
    mon.close()
    with_state = [f for f in sender.steps() if "state_bytes" in f]
    assert [f["step"] for f in with_state] == [1, 3]  # the first step, then every state_every
    ref = _state_reference(opt)
    assert with_state[-1]["state_bytes"] == ref and "step" not in ref
    assert set(ref) <= keys and keys - {"step"} <= set(ref) | {"variance", "row_var", "col_var"}
    param_bytes = sum(p.numel() * p.element_size() for p in mlp.parameters())
    assert with_state[-1]["param_bytes"] == param_bytes
    labels = (("job", "train"), ("rank", "0"), ("run", mon.options.run))
    ratio = sender.engine.store.last("sentinel_optimizer_state_param_ratio", labels)
    assert ratio is not None and ratio[2] == pytest.approx(sum(ref.values()) / param_bytes)


def test_state_bytes_reported_after_load_state_dict(mlp: MLP) -> None:
    opt = torch.optim.Adam(mlp.parameters(), lr=1e-3)
    mon, sender = make_monitor(mlp, opt, state_every=1000)
    train_steps(mlp, opt, 3, mon)
    opt.load_state_dict(opt.state_dict())
    train_steps(mlp, opt, 1, mon)
    mon.close()
    assert [f["step"] for f in sender.steps() if "state_bytes" in f] == [1, 4]


def test_nan_in_one_layer_names_its_group(mlp: MLP) -> None:
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)

    def poison(i: int) -> None:
        if i == 2:
            mlp.layers[1][0].weight.grad[0, 0] = float("nan")

    mon, sender = make_monitor(mlp, opt)
    train_steps(mlp, opt, 3, mon, before_step=poison)
    frame = sender.steps()[2]
    bad = [g for g, v in zip(frame["groups"], frame["grad_sumsq"]) if not math.isfinite(v)]
    assert bad == ["layers.1"]
    ctx = sender.engine.ingest(frame)
    assert ctx.nonfinite_groups["grad"] == ["layers.1"]
    labels = (("job", "train"), ("rank", "0"), ("run", mon.options.run), ("source", "grad"))
    assert sender.engine.store.counter("sentinel_nonfinite_total", labels) >= 1
    mon.close()


def test_learning_rate_per_param_group_and_two_optimizers(mlp: MLP) -> None:
    opt_a = torch.optim.SGD([{"params": mlp.layers.parameters(), "lr": 0.1},
                             {"params": [], "lr": 0.2}], lr=0.1)
    opt_b = torch.optim.Adam(mlp.head.parameters(), lr=1e-3)
    mon, sender = make_monitor(mlp, [opt_a, opt_b])
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        x = torch.randn(4, 16, generator=gen)
        loss = mlp(x).pow(2).mean()
        opt_a.zero_grad()
        opt_b.zero_grad()
        loss.backward()
        opt_a.step()
        opt_b.step()
        mon.log(loss=loss)
    mon.close()
    steps = sender.steps()
    assert [f["step"] for f in steps] == [1, 2, 3]  # one report per training step, not per optimizer
    assert steps[-1]["lr"] == [0.1, 0.2, 1e-3]
    all_grads = [p.grad for p in mlp.parameters()]
    assert math.sqrt(math.fsum(steps[-1]["grad_sumsq"])) == pytest.approx(
        float(torch.nn.utils.get_total_norm(all_grads)), rel=1e-5)


def test_optimizers_given_together_that_step_in_phases_keep_each_steps_loss(mlp: MLP) -> None:
    """Optimizers given together that step in phases (the forward-forward example: each
    layer's Adam trains it in turn) or not every step (a critic stepped more often than its
    generator): a step closes when one of them steps again, after the next step's
    ``backward()``. The loss logged after each step was the next step's (averaged with it),
    and the step the script ends on, where not every optimizer stepped, was dropped at
    close(): the history and the step count ended one short."""
    opt_a = torch.optim.SGD(mlp.layers.parameters(), lr=0.1)
    opt_b = torch.optim.Adam(mlp.head.parameters(), lr=1e-3)
    mon, sender = make_monitor(mlp, [opt_a, opt_b])
    gen = torch.Generator().manual_seed(0)
    losses = []
    for opt in [opt_a] * 3 + [opt_b] * 3:  # phase A, then phase B
        opt.zero_grad()
        loss = mlp(torch.randn(4, 16, generator=gen)).pow(2).mean()
        loss.backward()
        opt.step()
        mon.log(loss=loss)
        losses.append(loss.item())
    mon.close()
    steps = sender.steps()
    # phase A's last step and phase B's first are one report (each optimizer stepped once)
    assert [f["step"] for f in steps] == [1, 2, 3, 4, 5]
    expected = losses[:2] + [(losses[2] + losses[3]) / 2] + losses[4:]
    assert [f["scalars"]["loss"] for f in steps] == pytest.approx(expected, rel=1e-6)
    assert [f["step"] for f in sender.frames if f["kind"] == "bye"] == [5]


def test_a_param_group_per_parameter_keeps_its_learning_rates() -> None:
    """Layer-wise lr decay with a param group per parameter (BEiT's and ConvNeXt's fine-tuning
    shape, here 302 groups under a warmup): the frames carry the first 256 groups' rates and
    peaks, which the wire's type allows, and the engine takes them whole. Every lr of the run
    was dropped before, with a line on stderr: the instrument sent all 302, which the engine
    refuses."""
    from sentinel import wire

    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(150) for m in (nn.Linear(4, 4), nn.Tanh())], nn.Linear(4, 1))
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p], "lr": 1e-3 * 0.98 ** (len(params) - i)} for i, p in enumerate(params)])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    mon, sender = make_monitor(model, opt)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for _ in range(3):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        sched.step()
    mon.close()
    assert len(opt.param_groups) == 302 > wire.MAX_PARAM_GROUPS == 256
    steps = sender.steps()
    assert [f["lr"] for f in steps] == [[g["initial_lr"] * k for g in opt.param_groups[:256]] for k in (0.25, 0.5, 0.75)]
    assert [f["lr_peak"] for f in steps] == [[g["initial_lr"] for g in opt.param_groups[:256]]] * 3
    engine = sender.engine
    assert engine.fields_dropped == {} and engine.frames_malformed == 0
    base = (("job", "train"), ("rank", "0"), ("run", mon.options.run))
    first = engine.store.last("sentinel_learning_rate", tuple(sorted(base + (("param_group", "0"),))))
    last = engine.store.last("sentinel_learning_rate", tuple(sorted(base + (("param_group", "255"),))))
    assert first is not None and first[2] == pytest.approx(0.75e-3 * 0.98 ** 302)
    assert last is not None and last[2] == pytest.approx(0.75e-3 * 0.98 ** 47)
    assert engine.store.last("sentinel_learning_rate_schedule_ratio", base)[2] == pytest.approx(0.75)


def test_snr_and_saturation_values(mlp: MLP) -> None:
    opt = torch.optim.Adam(mlp.parameters(), lr=1e-3)
    grads: list[torch.Tensor] = []

    def capture(_: int) -> None:
        grads[:] = [torch.cat([p.grad.reshape(-1) for p in mlp.parameters()]).double()]

    # health_every=4: the SNR is read half-way between update samples, at steps 2, 6, ...
    mon, sender = make_monitor(mlp, opt, health_every=4, state_every=2, saturation_threshold=1e-6)
    train_steps(mlp, opt, 2, mon, before_step=capture)
    mon.close()
    g = grads[0].abs()
    snr = float(g.mean() / g.std(unbiased=False))
    labels = (("job", "train"), ("rank", "0"), ("run", mon.options.run))
    got = sender.engine.store.last("sentinel_gradient_snr", labels)
    assert got is not None and got[2] == pytest.approx(snr, rel=1e-4)
    v = torch.cat([st["exp_avg_sq"].reshape(-1) for st in opt.state.values()])
    sat = sender.engine.store.last("sentinel_optimizer_state_saturation_ratio", labels)
    assert sat is not None and sat[2] == pytest.approx(float((v > 1e-6).double().mean()))


def test_store_block_and_single_series_of_one_metric_never_lose_samples() -> None:
    """A group row is one block; a later partial row (some groups unsampled) turns those
    series into plain ones, and a full row after that starts a new block: the latest value
    of every series is always the one written last."""
    from sentinel.store import Store, labels_of

    store = Store(capacity=8)
    labels = tuple(labels_of(job="j", run="r", rank=0, group=g) for g in "abc")
    store.add_row("m", labels, [1.0, 2.0, 3.0], 1, 1.0)
    store.add_many("m", [(labels[0], 10.0)], 2, 2.0)
    store.add_row("m", labels, [4.0, 5.0, 6.0], 3, 3.0)
    assert [store.last("m", ls) for ls in labels] == [(3, 3.0, 4.0), (3, 3.0, 5.0), (3, 3.0, 6.0)]
    w = store.window("m", labels[1])
    assert w is not None and w.values.tolist()[-1] == 5.0


def test_the_wall_clock_set_back_leaves_the_step_times_whole(mlp: MLP, monkeypatch: pytest.MonkeyPatch) -> None:
    """An NTP step (or a VM resumed from a snapshot) sets the wall clock back 30 s between
    two steps: the frames' time stamps follow the clock, and each step's duration is still
    its own, from the monotonic clock. It was the wall clock's difference, -30 s, which the
    engine drops with a line on the script's stderr."""
    import time

    real = time.time
    shift = [0.0]
    monkeypatch.setattr(time, "time", lambda: real() + shift[0])
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    mon, sender = make_monitor(mlp, opt)
    for i in range(4):
        if i == 2:
            shift[0] = -30.0
        opt.zero_grad()
        mlp(torch.randn(4, 16)).pow(2).mean().backward()
        opt.step()
    mon.close()
    steps = sender.steps()
    assert steps[2]["t"] < steps[1]["t"] - 25  # the time stamps are the wall clock's
    assert [0 <= f["step_seconds"] < 5 for f in steps[1:]] == [True, True, True]
    assert sender.engine.fields_dropped == {}
