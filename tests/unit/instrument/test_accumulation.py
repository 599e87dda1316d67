"""The loss of a step of several ``backward()`` calls (gradient accumulation), captured at
``backward()``: their sum, in the first step's units when their number changes
(``sentinel.instrument.losses``). Real monitors, frames to a real engine."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import MLP, make_monitor


def _train(counts: list[int], divide: str) -> tuple[list[float], list[float]]:
    """Steps of ``counts[i]`` micro-batches each, each loss divided by the script's nominal
    count (``divide="nominal"``: the first, as nanoGPT, Accelerate and Lightning do), by the
    step's own count (``"own"``: the HF Trainer's last, shorter accumulation of an epoch),
    or not at all (``"no"``: summed undivided, as YOLOv5's trainer does). Returns Sentinel's
    step losses and the script's per-step sums of what it passed to backward()."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    mon, sender = make_monitor(model, opt, capture_loss=True)
    gen = torch.Generator().manual_seed(0)
    sums = []
    try:
        for count in counts:
            total = 0.0
            for _ in range(count):
                x = torch.randn(8, 16, generator=gen)
                loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
                if divide != "no":
                    loss = loss / (counts[0] if divide == "nominal" else count)
                loss.backward()
                total += float(loss.detach())
            sums.append(total)
            opt.step()
            opt.zero_grad()
    finally:
        mon.close()
    return [f["scalars"]["loss"] for f in sender.steps()], sums


def test_a_constant_count_records_the_sum() -> None:
    got, sums = _train([4, 4, 4], divide="nominal")
    assert got == pytest.approx(sums, rel=1e-6)  # divided by 4: the sum is the step's mean
    got, sums = _train([3, 3, 3], divide="no")
    assert got == pytest.approx(sums, rel=1e-6)  # not divided: the sum, as ever


def test_an_accumulation_that_grows_undivided_stays_in_the_first_steps_units() -> None:
    """YOLOv5's warmup: 1, 2, ... micro-batches a step, losses not divided: each step's loss
    is the mean of its micro-batches' (the first step's units), not a rise with the count."""
    counts = [1, 2, 3, 5, 8, 8, 2]
    got, sums = _train(counts, divide="no")
    assert got == pytest.approx([s / c for s, c in zip(sums, counts)], rel=1e-6)


def test_a_shorter_last_accumulation_keeps_its_sum() -> None:
    """The epoch's last step of 2 micro-batches where the others have 4: the HF Trainer
    divides its losses by 2, so their sum is that step's mean, as recorded; a script that
    divides by 4 shows half its mean there (a dip, as before)."""
    for divide in ("own", "nominal"):
        got, sums = _train([4, 4, 2], divide=divide)
        assert got == pytest.approx(sums, rel=1e-6), divide
