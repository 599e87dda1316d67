"""Which steps carry the periodic samplers: the update's size and the gradient SNR.

- The update snapshot (‖Δw‖, the update ratios, the parameter norms) every
  ``update_every`` steps; at every one of the first ``early_steps``, which the
  early-training rules judge; and at every one of the :data:`LR_JUMP_STEPS` steps from a
  learning rate that moved by more than :data:`LR_JUMP` times since the previous step (a
  rate raised by hand, a restart, a scheduler's milestone), so ``UpdateRatioHigh`` judges
  the new rate's updates at once rather than at the next regular sample. A smooth schedule
  moves far less per step; a cosine to zero does so only in its last few steps.
- The SNR's L1 sums every ``health_every`` steps, half-way between two update samples, so
  no step carries both.

The decision for a step is taken once, at its first optimizer's pre-hook (:meth:`begin`),
and holds for every optimizer of the step. Reading the learning rates costs a few
attribute reads per step; nothing touches a device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sentinel.instrument import probes

LR_JUMP = 2.0
LR_JUMP_STEPS = 10


class Cadence:
    """The sampling schedule of one monitor.

    Args:
        update_every, early_steps, health_every: as in
            :class:`~sentinel.instrument.options.WatchOptions`.
    """

    def __init__(self, update_every: int, early_steps: int, health_every: int) -> None:
        self.update_every = update_every
        self.early_steps = early_steps
        self.health_every = health_every
        self._until = 0  # the update is sampled at every step up to this one (an lr jump)
        self.lrs: list[float] = []
        """Every param group's learning rate as this step began: the rate the step applies,
        which its report carries."""

    def begin(self, step: int, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """Called once per step, before its first optimizer steps."""
        lrs = probes.learning_rates(optimizers)
        if len(lrs) == len(self.lrs) and any(
                a > 0 and b > 0 and (b > LR_JUMP * a or a > LR_JUMP * b) for a, b in zip(self.lrs, lrs)):
            self._until = step + LR_JUMP_STEPS - 1
        self.lrs = lrs

    def update_due(self, step: int) -> bool:
        return step % self.update_every == 0 or step <= self.early_steps or step <= self._until

    def health_due(self, step: int) -> bool:
        return step % self.health_every == self.health_every // 2
