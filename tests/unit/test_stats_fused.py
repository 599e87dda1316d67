"""The fused statistics' shortcuts give the plain definitions' values."""

from __future__ import annotations

import pytest
import torch

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


def _grouped() -> tuple[list[torch.nn.Parameter], stats.GroupedTensors, stats.UpdateSnapshot]:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n)) for n in (300_000, 5, 70_000, 3)]
    gt = stats.GroupedTensors(params, [0, 0, 1, 1], 2)
    return params, gt, stats.UpdateSnapshot(gt, 2**30)


def _reference(params: list[torch.nn.Parameter]) -> list[float]:
    return [float(sum(p.detach().double().pow(2).sum() for p in params[i: i + 2])) for i in (0, 2)]


@pytest.mark.parametrize("between", ["nothing", "in-place op", "grad_sums", "take"])
@torch.no_grad()  # as in the monitor's hooks
def test_param_sumsq_after_delta_is_the_current_weights(between: str) -> None:
    params, gt, snap = _grouped()
    snap.take()
    for p in params:
        p.mul_(0.9)  # the step
    delta = snap.delta_sumsq()[torch.device("cpu")]
    assert delta.tolist() == pytest.approx([0.01 / 0.81 * r for r in _reference(params)], rel=1e-4)
    if between == "in-place op":
        params[0].add_(1.0)
    elif between == "grad_sums":
        for p in params:
            p.grad = torch.ones_like(p)
        gt.grad_sums(2.0)
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
    snap = stats.UpdateSnapshot(gt, 1)  # one group per sample, rotating
    for _ in range(4):
        snap.take()
        old = {i: params[i].detach().clone() for i in range(4)}
        for p in params:
            p.add_(0.5)
        d = snap.delta_sumsq()[torch.device("cpu")]
        (g,) = snap.groups
        members = (0, 1) if g == 0 else (2, 3)
        assert float(d[g]) == pytest.approx(sum(float((old[i] - params[i].detach()).pow(2).sum()) for i in members),
                                            rel=1e-5)
        assert float(d[1 - g]) == 0.0
