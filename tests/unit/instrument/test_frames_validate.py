"""The instrument never sends what its own engine refuses or trims (issue 18, point 5):
frames built by real monitors under random settings all pass the engine's checks whole."""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from tests.helpers import make_monitor

_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.complex64]


class _Net(nn.Module):
    def __init__(self, width: int, blocks: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(width, width, dtype=dtype) for _ in range(blocks))
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.dtype)
        for b in self.blocks:
            x = b(x)
        return x.abs().float().pow(2).mean()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dtype=st.sampled_from(_DTYPES), blocks=st.integers(0, 4), clip=st.sampled_from([None, 0.0, 1.0, math.inf]),
       amp=st.booleans(), closure=st.booleans(), accumulate=st.integers(1, 3), opt_kind=st.sampled_from(["sgd", "adamw"]),
       log_loss=st.booleans(), steps=st.integers(1, 4), depth=st.integers(0, 2))
def test_every_frame_the_instrument_builds_passes_whole(dtype: torch.dtype, blocks: int, clip: float | None, amp: bool,
                                                         closure: bool, accumulate: int, opt_kind: str,
                                                         log_loss: bool, steps: int, depth: int) -> None:
    torch.manual_seed(0)
    model = _Net(4, blocks, dtype)
    params = list(model.parameters())
    if not params:  # 0 groups: a bare parameter outside any module still trains
        extra = nn.Parameter(torch.ones(3, dtype=dtype))
        model.register_parameter("scale", extra)
        params = [extra]
    opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9) if opt_kind == "sgd" or dtype == torch.float16 \
        else torch.optim.AdamW(params, lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=amp and dtype == torch.float32)
    mon, sender = make_monitor(model, opt, group_depth=depth, update_every=1, health_every=1,
                               state_every=1)

    def loss_of() -> torch.Tensor:
        out = model(torch.randn(2, 4)) if blocks else params[0].abs().float().pow(2).sum()
        return out / accumulate

    for _ in range(steps):
        opt.zero_grad()
        if closure:
            def run() -> torch.Tensor:
                opt.zero_grad()
                loss = loss_of()
                loss.backward()
                return loss
            opt.step(run)
        else:
            for _ in range(accumulate):
                scaler.scale(loss_of()).backward()
            scaler.unscale_(opt)
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(params, clip)
            scaler.step(opt)
            scaler.update()
        if log_loss:
            mon.log(loss=1.5, lr_seen=opt.param_groups[0]["lr"])
    mon.close()
    engine = sender.engine
    assert sender.frames, "no frame at all"
    assert engine.refused == {}, engine.refused
    assert engine.fields_dropped == {}, engine.fields_dropped
    assert len(sender.steps()) == steps
    # the fast path (the strict decode into wire.Frame) takes every frame but those with a NaN sum
    assert engine.frames_by_field == sum(any(_has_nan(f.get(k)) for k in _NO_NAN) for f in sender.frames)


_NO_NAN = ("grad_sumsq", "param_sumsq", "delta_sumsq", "clip_norm", "grad_l1", "amp")
"""The fields where wire.Frame refuses a NaN that the field-by-field check takes."""


def _has_nan(value: object) -> bool:
    if isinstance(value, float):
        return value != value
    if isinstance(value, dict):
        return any(_has_nan(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_nan(v) for v in value)
    return False
