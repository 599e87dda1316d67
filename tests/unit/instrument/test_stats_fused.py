"""The fused statistics' shortcuts give the plain definitions' values."""

from __future__ import annotations

import pytest
import torch

from sentinel.instrument import deltas as magnitude
from sentinel.instrument import stats


@pytest.mark.parametrize(("shape", "dtype", "scratch"), [
    ((3, 5), torch.float32, 64),            # fits the scratch
    ((1000,), torch.float32, 64),           # pieces of the scratch, a short last one
    ((0,), torch.float32, 8),               # empty
    ((40, 7), torch.bfloat16, 16),          # widened to float32
    ((9, 4), torch.float16, 1),             # one element at a time
])
def test_cpu_l1_equals_the_sum_of_absolute_values(shape: tuple[int, ...], dtype: torch.dtype, scratch: int) -> None:
    gen = torch.Generator().manual_seed(0)
    ts = [torch.randn(shape, generator=gen).to(dtype), torch.randn(7, generator=gen).to(dtype)]
    ts.append(torch.randn(6, 4, generator=gen).to(dtype).t())  # not contiguous
    before = [t.clone() for t in ts]
    got = stats._cpu_l1(ts, torch.empty(scratch))
    ref = [t.double().abs().sum() for t in ts]
    assert [float(g) for g in got] == pytest.approx([float(r) for r in ref], rel=1e-6)
    assert all(g.dtype == torch.float32 for g in got)
    assert all(torch.equal(t, b) for t, b in zip(ts, before))  # the gradients are never written


def _grouped() -> tuple[list[torch.nn.Parameter], stats.GroupedTensors, magnitude.UpdateSnapshot]:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n)) for n in (300_000, 5, 70_000, 3)]
    gt = stats.GroupedTensors(params, [0, 0, 1, 1], 2)
    return params, gt, magnitude.UpdateSnapshot(gt, 2**30)


def _reference(params: list[torch.nn.Parameter]) -> list[float]:
    return [float(sum(p.detach().double().pow(2).sum() for p in params[i: i + 2])) for i in (0, 2)]


@pytest.mark.parametrize("between", ["nothing", "in-place op", "grad_sums", "take"])
@torch.no_grad()  # as in the monitor's hooks
def test_param_sumsq_after_delta_is_the_current_weights(between: str) -> None:
    params, gt, snap = _grouped()
    snap.take()
    for p in params:
        p.mul_(0.9)  # the step
    delta = snap.measure()["delta_sumsq"][torch.device("cpu")]
    assert delta.tolist() == pytest.approx([0.01 / 0.81 * r for r in _reference(params)], rel=1e-4)
    if between == "in-place op":
        params[0].add_(1.0)
    elif between == "grad_sums":
        for p in params:
            p.grad = torch.ones_like(p)
        gt.grad_sums()
        params[2].data.add_(1.0)  # .data keeps the version: only the reset protects
    elif between == "take":
        snap.take()
        params[3].data.add_(1.0)
    got = gt.param_sumsq()[torch.device("cpu")]
    assert got.tolist() == pytest.approx(_reference(params), rel=1e-5)
    # read once: a later call reads the weights again
    params[1].data.add_(2.0)
    assert gt.param_sumsq()[torch.device("cpu")].tolist() == pytest.approx(_reference(params), rel=1e-5)


@torch.no_grad()
def test_snapshot_views_follow_the_sampled_groups() -> None:
    params, gt, _ = _grouped()
    snap = magnitude.UpdateSnapshot(gt, 1)  # one group per sample, rotating
    for _ in range(4):
        snap.take()
        old = {i: params[i].detach().clone() for i in range(4)}
        for p in params:
            p.add_(0.5)
        d = snap.measure()["delta_sumsq"][torch.device("cpu")]
        (g,) = snap.groups
        members = (0, 1) if g == 0 else (2, 3)
        assert float(d[g]) == pytest.approx(sum(float((old[i] - params[i].detach()).pow(2).sum()) for i in members),
                                            rel=1e-5)
        assert float(d[1 - g]) == 0.0


def _params(specs: list[tuple[tuple[int, ...], torch.dtype]], gen: torch.Generator) -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.randn(shape, generator=gen).to(dtype)) for shape, dtype in specs]


# weights larger than a piece (cut across pieces), groups that alternate in the
# optimizer's order, low precision, an empty tensor, and a transposed (not contiguous)
# weight, which takes the per-tensor path
_CASES = {
    "large and alternating": [((1_500_000,), torch.float32), ((5,), torch.float32), ((700, 300), torch.float32),
                              ((3,), torch.float32), ((2_100_000,), torch.float32), ((0,), torch.float32)],
    "bfloat16": [((1_200_000,), torch.bfloat16), ((40, 7), torch.bfloat16), ((9,), torch.bfloat16)],
}


@pytest.mark.parametrize("case", [*_CASES, "not contiguous"])
@torch.no_grad()
def test_measure_equals_the_definitions(case: str) -> None:
    """One pass gives, per group, sum((w_old - w_new)**2), sum|w_old - w_new|, sum|w_old|,
    and the weights' norms that param_sumsq reuses."""
    gen = torch.Generator().manual_seed(1)
    if case == "not contiguous":
        params = _params(_CASES["large and alternating"][:4], gen)
        params[2] = torch.nn.Parameter(torch.randn(300, 700, generator=gen).t())
    else:
        params = _params(_CASES[case], gen)
    groups = [i % 2 for i in range(len(params))]
    gt = stats.GroupedTensors(params, groups, 2)
    snap = magnitude.UpdateSnapshot(gt, 2**34)
    for step in range(3):  # the buffers and pieces are reused from the second step on
        old = [p.detach().double().clone() for p in params]
        snap.take()
        for p in params:
            p.add_(torch.randn(p.shape, generator=gen).to(p.dtype) * 1e-2)
        got = {k: v[torch.device("cpu")].tolist() for k, v in snap.measure().items()}
        new = [p.detach().double() for p in params]
        want = {"delta_sumsq": [0.0, 0.0], "delta_l1": [0.0, 0.0], "param_l1": [0.0, 0.0]}
        for g, o, n in zip(groups, old, new):
            want["delta_sumsq"][g] += float((o - n).pow(2).sum())
            want["delta_l1"][g] += float((o - n).abs().sum())
            want["param_l1"][g] += float(o.abs().sum())
        rel = 1e-2 if case == "bfloat16" else 1e-4  # Δw is rounded to bfloat16 in the buffer
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=rel), (key, step)
        sumsq = [sum(float(n.pow(2).sum()) for g, n in zip(groups, new) if g == k) for k in (0, 1)]
        assert gt.param_sumsq()[torch.device("cpu")].tolist() == pytest.approx(sumsq, rel=1e-4)
        assert all(not isinstance(p.grad, torch.Tensor) for p in params)


@torch.no_grad()
def test_a_weight_given_new_storage_is_read_from_it() -> None:
    """``p.data = ...`` between samples: the cached slices of the old storage are not used."""
    gen = torch.Generator().manual_seed(2)
    params = _params([((1_100_000,), torch.float32), ((7,), torch.float32)], gen)
    gt = stats.GroupedTensors(params, [0, 0], 1)
    snap = magnitude.UpdateSnapshot(gt, 2**34)
    snap.take()
    snap.measure()
    params[0].data = torch.randn(1_100_000, generator=gen)
    old = [p.detach().clone() for p in params]
    snap.take()
    for p in params:
        p.mul_(0.5)
    got = snap.measure()["delta_l1"][torch.device("cpu")].tolist()
    assert got == pytest.approx([sum(float((0.5 * o).abs().sum()) for o in old)], rel=1e-4)


@pytest.mark.parametrize("l1", [False, True])
def test_grad_sums_read_both_norms_in_one_pass(l1: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    params = _params(_CASES["large and alternating"], gen) + [torch.nn.Parameter(torch.randn(5))]
    for p in params[:-1]:
        p.grad = torch.randn(p.shape, generator=gen)
    groups = [i % 2 for i in range(len(params))]
    sq, abs_sums, count = stats.GroupedTensors(params, groups, 2).grad_sums(l1=l1)
    grads = [(g, p.grad.double()) for g, p in zip(groups, params) if p.grad is not None]
    assert sq[torch.device("cpu")].tolist() == pytest.approx(
        [sum(float(t.pow(2).sum()) for g, t in grads if g == k) for k in (0, 1)], rel=1e-4)  # float32 kernels
    if l1:
        assert abs_sums[torch.device("cpu")].tolist() == pytest.approx(
            [sum(float(t.abs().sum()) for g, t in grads if g == k) for k in (0, 1)], rel=1e-4)
        assert count == sum(t.numel() for _, t in grads)
    else:
        assert abs_sums == {} and count == 0


def test_a_group_index_is_built_on_the_host_and_only_queued_to_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.tensor(..., device="cuda")`` makes the host wait for its copy (the sync that
    tests/gpu/test_no_sync.py caught on an H200); the index is built on the host and its copy
    to the device is queued with ``non_blocking=True``. Here the device is ``meta``, which
    takes the same path as ``cuda`` with no GPU."""
    calls: list[dict[str, object]] = []
    to = torch.Tensor.to

    def spy(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append({"from": self.device.type, **kwargs})
        return to(self, *args, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(torch.Tensor, "to", spy)
    on_cpu = stats.device_index((2, 0, 1), "cpu")
    assert on_cpu.tolist() == [2, 0, 1] and on_cpu.dtype == torch.long and not calls
    on_meta = stats.device_index([3, 3], torch.device("meta"))
    assert on_meta.device.type == "meta" and on_meta.dtype == torch.long and tuple(on_meta.shape) == (2,)
    assert calls == [{"from": "cpu", "non_blocking": True}]
