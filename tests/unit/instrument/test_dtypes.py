"""Every dtype torch trains in gives the right numbers, and a probe that fails records
nothing, never a made-up 0 (issue 18, point 3)."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from torch import nn

from tests.helpers import make_monitor


def _model(dtype: torch.dtype | str) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    if dtype == "mixed":  # one model, three dtypes
        m[0].to(torch.float64)
        m[2].to(torch.bfloat16)
        return m
    if isinstance(dtype, torch.dtype) and dtype.is_complex:
        return nn.Sequential(nn.Linear(6, 8, dtype=dtype), nn.Linear(8, 2, dtype=dtype))
    return m.to(dtype)


def _forward(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    for layer in m:
        p = next(layer.parameters(), None)
        x = layer(x.to(p.dtype) if p is not None else x)
    return x.abs().pow(2).float().mean() if x.is_complex() else x.float().pow(2).mean()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16,
                                   torch.complex64, torch.complex128, "mixed"], ids=str)
def test_grad_norm_of_every_dtype_equals_the_reference(dtype: torch.dtype | str,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    m = _model(dtype)
    # pure fp16 AdamW divides by eps=1e-8, which is 0 in fp16: its own NaN, not ours
    opt = (torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9) if dtype == torch.float16
           else torch.optim.AdamW(m.parameters(), lr=1e-3))
    mon, sender = make_monitor(m, opt, update_every=1, health_every=1, state_every=1)
    want: list[float] = []
    with caplog.at_level(logging.WARNING, logger="sentinel"):
        for _ in range(3):
            opt.zero_grad()
            _forward(m, torch.randn(4, 6)).backward()
            want.append(math.sqrt(sum(float(p.grad.detach().abs().double().pow(2).sum()) for p in m.parameters())))
            opt.step()
        mon.close()
    assert mon.errors == 0 and not caplog.records, [r.getMessage() for r in caplog.records]
    steps = sender.steps()
    assert len(steps) == 3
    tol = 1e-2 if dtype in (torch.bfloat16, torch.float16, "mixed") else 1e-5
    for frame, ref in zip(steps, want):
        got = math.sqrt(sum(frame["grad_sumsq"]))
        assert got == pytest.approx(ref, rel=tol)
        assert all(v is None or math.isfinite(v) for v in frame.get("delta_sumsq", []))
        assert frame.get("delta_sumsq") and any(v for v in frame["delta_sumsq"])


def test_a_failing_gradient_probe_records_nothing_and_says_so_in_one_line(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from sentinel.instrument import stats

    def broken(*a: object, **k: object) -> None:
        raise RuntimeError("kernel refused the dtype")

    monkeypatch.setattr(stats.GroupedTensors, "grad_sums", broken)
    m = _model(torch.float32)
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    mon, sender = make_monitor(m, opt)
    with caplog.at_level(logging.WARNING, logger="sentinel"):
        for _ in range(5):
            opt.zero_grad()
            _forward(m, torch.randn(4, 6)).backward()
            opt.step()
        mon.close()
    steps = sender.steps()
    assert len(steps) == 5
    assert all("grad_sumsq" not in f for f in steps)  # absent, not 0.0
    assert steps[-1]["errors"] >= 1  # the counter (sentinel_instrument_errors_total)
    lines = [r for r in caplog.records if "grad" in r.getMessage()]
    assert lines and all(r.exc_info is None for r in caplog.records)  # a line, not a traceback
    assert "kernel refused the dtype" in lines[0].getMessage()
    labels = (("job", mon.options.job), ("rank", "0"), ("run", mon.options.run))
    assert sender.engine.store.last("sentinel_grad_norm", labels) is None
