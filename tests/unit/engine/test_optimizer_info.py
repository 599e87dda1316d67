"""The optimizer is known: class and bounded hyperparameters, the info series, the advice."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest
import torch
from torch import nn

from sentinel import wire
from sentinel.engine.engine import Engine
from sentinel.instrument import optinfo
from tests.helpers import MLP, make_monitor, train_steps


def _params(dtype: torch.dtype = torch.float32) -> list[nn.Parameter]:
    return [nn.Parameter(torch.zeros(4, 4, dtype=dtype)), nn.Parameter(torch.zeros(4, dtype=dtype))]


def test_describe_reduces_groups_the_way_the_advice_reads_them() -> None:
    w, b = _params()
    opt = torch.optim.AdamW([{"params": [w], "weight_decay": 0.05, "betas": (0.8, 0.99)},
                             {"params": [b], "weight_decay": 0.0, "eps": 1e-6}], lr=1e-3)
    [d] = optinfo.describe([opt])
    assert d.cls == "AdamW" and d.dtype == "float32"
    assert d.hp == wire.Hyperparameters(lr=1e-3, beta1=0.8, beta2=0.999, eps=1e-8, weight_decay=0.05, decoupled=1.0)
    [s] = optinfo.describe([torch.optim.SGD(_params(torch.float16), lr=0.1, momentum=0.9)])
    assert s.dtype == "float16" and s.hp.momentum == 0.9 and s.hp.decoupled is wire.UNSET
    # on the wire: the names of the fields, and only the settings the optimizer has
    assert msgspec.to_builtins(s) == {"class": "SGD", "dtype": "float16",
                                      "hp": {"lr": 0.1, "weight_decay": 0.0, "momentum": 0.9}}


@pytest.mark.parametrize(("schedule", "lr"), [
    # Hugging Face's linear warmup from 0 and decay to 0: 0 at the first step and at the last
    (lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(s / 5, max(0.0, (30 - s) / 25))), 5e-4),
    (lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=3e-3, total_steps=30), 3e-3),  # its peak
    (lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=5, gamma=0.1), 5e-4),
    (None, 5e-4),
])
def test_the_recorded_lr_is_the_one_the_script_set_not_where_its_schedule_is(schedule: Any, lr: float) -> None:
    """A sweep's runs are compared by the lr they were given (``sentinel compare``), so the
    record keeps the configured lr at every point of the schedule; each step's own is
    ``sentinel_lr``."""
    opt = torch.optim.AdamW(_params(), lr=5e-4)
    sched = schedule(opt) if schedule else None
    seen = []
    for _ in range(30):
        seen.append(optinfo.describe([opt])[0].hp.lr)
        opt.step()
        if sched is not None:
            sched.step()
    assert seen == [pytest.approx(lr)] * 30


def _recorded_lrs(mlp: MLP, opt: torch.optim.Optimizer, steps: int, lr_at: Any, **options: Any) -> list[tuple[int, float]]:
    """``steps`` of a loop that sets every group's lr by hand before each step, as
    nanoGPT's ``get_lr`` and MAE's ``adjust_learning_rate`` do (scaled by a group's
    ``lr_scale``); the optimizer record's lr at each step that carried one."""
    mon, sender = make_monitor(mlp, opt, **options)

    def set_lr(i: int) -> None:
        for g in opt.param_groups:
            g["lr"] = lr_at(i) * g.get("lr_scale", 1.0)

    train_steps(mlp, opt, steps, mon, before_step=set_lr)
    mon.close()
    return [(f["step"], f["optim"][0]["hp"]["lr"]) for f in sender.steps() if "optim" in f]


def test_a_schedule_written_by_hand_is_recorded_at_its_peak(mlp: MLP) -> None:
    """nanoGPT's warmup from 0 to 6e-4 in 20 steps and cosine decay to a tenth, the groups
    of a layer-wise decay below the head's rate: the run is recorded at 6e-4, not at its
    rate when a record is due (the first step's 3e-5, the last's 6e-5), so ``sentinel
    compare`` names the lr the sweep gave each run."""
    import math

    def get_lr(it: int) -> float:
        if it < 20:
            return 6e-4 * (it + 1) / 20
        return 6e-5 + 0.5 * (1 + math.cos(math.pi * (it - 20) / 130)) * (6e-4 - 6e-5)

    groups = [{"params": list(layer.parameters()), "lr_scale": 0.75 ** (3 - i)} for i, layer in enumerate(mlp.layers)]
    opt = torch.optim.AdamW([*groups, {"params": list(mlp.head.parameters()), "lr_scale": 1.0}], lr=6e-4)
    recorded = _recorded_lrs(mlp, opt, 150, get_lr, state_every=50)
    assert [s for s, _ in recorded] == [1, 50, 100, 150]
    assert recorded[0][1] == pytest.approx(3e-5)  # all it had been at: the warmup's first rate
    assert [lr for _, lr in recorded[1:]] == [pytest.approx(6e-4)] * 3


def test_an_lr_range_test_undone_by_load_state_dict_is_not_the_runs_lr(mlp: MLP) -> None:
    """torch-lr-finder's ``range_test`` raises the optimizer's lr to 10, then ``reset()``
    loads its saved state: the fit after it is recorded at its own 1e-3."""
    opt = torch.optim.SGD(mlp.parameters(), lr=1e-3)
    mon, sender = make_monitor(mlp, opt, state_every=1000)
    saved = opt.state_dict()

    def ramp(i: int) -> None:
        opt.param_groups[0]["lr"] = 1e-3 * 10 ** (4 * i / 9)  # 1e-3 → 10 in 10 steps

    train_steps(mlp, opt, 10, mon, before_step=ramp)
    opt.load_state_dict(saved)
    train_steps(mlp, opt, 5, mon)
    mon.close()
    recorded = [(f["step"], f["optim"][0]["hp"]["lr"]) for f in sender.steps() if "optim" in f]
    assert recorded == [(1, pytest.approx(1e-3)), (11, pytest.approx(1e-3))]


def _fired(opt: torch.optim.Optimizer, total_steps: int | None = None) -> set[str]:
    frame: dict[str, Any] = {"kind": "step", "job": "j", "run": "r", "rank": 0, "step": 1, "t": 1.0,
                             "groups": ["w"], "grad_sumsq": [1.0], "optim": optinfo.describe([opt])}
    if total_steps:
        frame["total_steps"] = total_steps
    eng = Engine()
    assert eng.feed(wire.encode(frame))
    return {t.alertname for t in eng.transitions if t.state_to == "firing" and t.severity == "info"}


ADVICE = {"OptimizerEpsTooSmallFp16", "OptimizerBeta2TooLong", "OptimizerBeta1Low", "AdamWWithoutWeightDecay"}


@pytest.mark.parametrize(
    ("make", "total_steps", "advice"),
    [
        (lambda: torch.optim.AdamW(_params(), lr=1e-3), None, set()),  # the defaults: no advice
        (lambda: torch.optim.AdamW(_params(), lr=1e-3, weight_decay=0.0), None, {"AdamWWithoutWeightDecay"}),
        (lambda: torch.optim.Adam(_params(), lr=1e-3), None, set()),  # plain Adam: no decoupled decay expected
        (lambda: torch.optim.Adam(_params(), betas=(0.3, 0.999)), None, {"OptimizerBeta1Low"}),
        (lambda: torch.optim.Adam(_params(), lr=1e-3), 500, {"OptimizerBeta2TooLong"}),  # 1000 steps of memory
        (lambda: torch.optim.Adam(_params(), betas=(0.9, 0.98)), 500, set()),  # the seed's 1 - 10/500
        (lambda: torch.optim.Adam(_params(torch.float16), lr=1e-3), None, {"OptimizerEpsTooSmallFp16"}),
        (lambda: torch.optim.Adam(_params(torch.float16), eps=1e-6), None, set()),
        (lambda: torch.optim.Adam(_params(torch.bfloat16), lr=1e-3), None, set()),  # bf16 has fp32's range
    ],
)
def test_advice(make: Any, total_steps: int | None, advice: set[str]) -> None:
    assert _fired(make(), total_steps) & ADVICE == advice


def test_sent_at_the_first_step_and_after_load_state_dict(mlp: MLP) -> None:
    opt = torch.optim.AdamW(mlp.parameters(), lr=1e-3)
    mon, sender = make_monitor(mlp, opt, state_every=1000)
    train_steps(mlp, opt, 3, mon)
    opt.load_state_dict(opt.state_dict())
    train_steps(mlp, opt, 2, mon)
    mon.close()
    assert [f["step"] for f in sender.steps() if "optim" in f] == [1, 4]
    store = sender.engine.store
    [info] = store.labelsets("sentinel_optimizer_info")
    assert dict(info)["class"] == "AdamW"
    hps = {dict(ls)["name"] for ls in store.labelsets("sentinel_optimizer_hyperparameter")}
    assert hps == {"lr", "beta1", "beta2", "eps", "weight_decay"}


def _clip_advice(mlp: MLP, opt: torch.optim.Optimizer, clip: float | None) -> list[tuple[int, str]]:
    """A real 120-step loop, optionally clipping every step; the clipping advice's firings."""
    mon, sender = make_monitor(mlp, opt)

    def clip_grads(_: int) -> None:
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(mlp.parameters(), clip)

    train_steps(mlp, opt, 120, mon, before_step=clip_grads)
    mon.close()
    return [(t.step, t.severity) for t in sender.engine.transitions
            if t.alertname == "SGDWithoutClipping" and t.state_to == "firing"]


@pytest.mark.parametrize(("make", "clip", "fired"), [
    (lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9), None, [(100, "info")]),  # seed 004 §3.2
    (lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9), 1.0, []),
    (lambda ps: torch.optim.SGD(ps, lr=0.01), None, [(100, "info")]),  # without momentum too
    (lambda ps: torch.optim.AdamW(ps, lr=1e-3), None, []),  # Adam-style: no advice either way
    (lambda ps: torch.optim.AdamW(ps, lr=1e-3), 1.0, []),
])
def test_clipping_advice_per_optimizer(mlp: MLP, make: Any, clip: float | None, fired: list[tuple[int, str]]) -> None:
    """From the optimizer's record at step 100 (state_every), after a run has shown whether it clips."""
    assert _clip_advice(mlp, make(mlp.parameters()), clip) == fired


def _private(mlp: MLP, max_grad_norm: Any) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """Opacus's ``make_private`` over ``mlp`` and a plain SGD (the MNIST example's shape): the
    model in a ``GradSampleModule``, the optimizer in a ``DPOptimizer``."""
    from opacus import PrivacyEngine

    data = torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    sgd = torch.optim.SGD(mlp.parameters(), lr=0.01)
    clipping = "flat" if isinstance(max_grad_norm, float) else "per_layer"
    return PrivacyEngine().make_private(module=mlp, optimizer=sgd, data_loader=loader, noise_multiplier=1.0,
                                        max_grad_norm=max_grad_norm, clipping=clipping)


@pytest.mark.filterwarnings("ignore")  # Opacus's own warnings (secure RNG off)
# flat, and per parameter (a sample's whole gradient is bounded by the norm of the bounds: 2.5)
@pytest.mark.parametrize("bound", [1.0, [0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 1.5, 1.5]])
def test_sgd_clipped_per_sample_by_opacus_gets_no_clipping_advice(mlp: MLP, bound: Any) -> None:
    """DP-SGD clips every sample's gradient inside its ``DPOptimizer.step()``, which then
    steps the plain SGD: the SGD is watched (as zero-code mode finds it), found stepped by
    the wrapper at its first step, and its records carry the bound (steps 1 and 100)."""
    model, dp, _ = _private(mlp, bound)
    mon, sender = make_monitor(model, dp.original_optimizer)
    train_steps(model, dp, 120, mon)
    mon.close()
    fired = [t.alertname for t in sender.engine.transitions if t.state_to == "firing"]
    assert "SGDWithoutClipping" not in fired
    largest = math.sqrt(sum(b * b for b in bound)) if isinstance(bound, list) else bound
    recorded = [f["optim"][0]["hp"].get("sample_clip") for f in sender.steps() if "optim" in f]
    assert recorded == [pytest.approx(largest)] * 2
    [series] = sender.engine.store.labelsets("sentinel_optimizer_sgd_clip_max_norm")
    assert sender.engine.store.last("sentinel_optimizer_sgd_clip_max_norm", series)[2] == pytest.approx(largest)


@pytest.mark.filterwarnings("ignore")
def test_a_dp_optimizer_given_to_watch_is_known_as_the_sgds_clipper(mlp: MLP) -> None:
    """``sentinel.watch(model, optimizer)`` with what ``make_private`` returned: the SGD inside
    is watched, and its per-sample bound known before its first step."""
    import sentinel
    from sentinel.instrument import outerstep

    model, dp, _ = _private(mlp, 1.0)
    mon = sentinel.watch(model, dp, engine="off")
    try:
        assert [type(o).__name__ for o in mon.optimizers] == ["SGD"]
        assert outerstep.sample_clip(dp.original_optimizer) == 1.0
        assert optinfo.describe(mon.optimizers)[0].hp.sample_clip == 1.0
        dp.max_grad_norm = 0.5  # Opacus's adaptive clipping moves it: the record reads it anew
        assert optinfo.describe(mon.optimizers)[0].hp.sample_clip == 0.5
    finally:
        mon.close()


@pytest.mark.filterwarnings("ignore")
def test_dp_sgds_physical_batches_make_one_step_whose_loss_is_their_mean(mlp: MLP) -> None:
    """Opacus's ``BatchMemoryManager`` splits each batch into physical ones, each with its
    ``backward()`` and ``step()``; the ``DPOptimizer`` steps the SGD at the last one only,
    with the mean of their (clipped, noised) gradients: the step's loss is their losses'
    mean, not their sum."""
    from opacus.utils.batch_memory_manager import BatchMemoryManager

    model, dp, loader = _private(mlp, 1.0)  # Poisson batches of 8 samples expected
    mon, sender = make_monitor(model, dp.original_optimizer, capture_loss=True)
    means, passes = [], []
    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=3, optimizer=dp) as physical:
        for x, y in physical:
            dp.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            dp.step()
            passes.append(loss.item())
            if not dp._is_last_step_skipped:
                means.append(sum(passes) / len(passes))
                passes = []
    mon.close()
    got = [f["scalars"]["loss"] for f in sender.steps() if "loss" in f.get("scalars", {})]
    assert len(means) > 20 and got == pytest.approx(means, rel=1e-5)


@pytest.mark.filterwarnings("ignore")
def test_every_key_of_the_optimizer_record_is_one_the_engine_reads(mlp: MLP) -> None:
    """The record's ``hp`` keys are ``wire.OPTIMIZER_HP``, the one definition both sides use:
    each key the training side writes comes out of the engine as a series (a key spelt two
    ways once kept every run's optimizer out of the history)."""
    from sentinel.instrument import outerstep

    _, dp, _ = _private(mlp, 1.0)
    outerstep.note_clipper(dp.original_optimizer, dp)
    records = optinfo.describe([dp.original_optimizer, torch.optim.AdamW(_params(), lr=1e-3),
                                torch.optim.SGD(_params(), lr=0.1, momentum=0.9)])
    assert {k for r in records for k in msgspec.to_builtins(r)["hp"]} == set(wire.OPTIMIZER_HP)
    assert wire.OPTIMIZER_HP[:len(wire.HYPERPARAMETERS)] == wire.HYPERPARAMETERS
    eng = Engine()
    assert eng.feed(wire.encode({"kind": "step", "job": "j", "run": "r", "rank": 0, "step": 1, "t": 1.0,
                                 "groups": ["w"], "grad_sumsq": [1.0], "optim": records}))
    store = eng.store
    assert {dict(ls)["name"] for ls in store.labelsets("sentinel_optimizer_hyperparameter")} == set(
        wire.HYPERPARAMETERS)
    [decoupled] = store.labelsets("sentinel_optimizer_decoupled_weight_decay")  # AdamW's
    assert dict(decoupled)["index"] == "1"
    clips = {dict(ls)["index"]: store.last("sentinel_optimizer_sgd_clip_max_norm", ls)[2]  # type: ignore[index]
             for ls in store.labelsets("sentinel_optimizer_sgd_clip_max_norm")}
    assert clips == {"0": 1.0, "2": 0.0}  # the DP-SGD's per-sample bound; the plain SGD never clipped
