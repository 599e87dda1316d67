"""Whether a step's gradients started from zero: the loop that never calls ``zero_grad()``.

Without a reset, ``backward()`` adds each step's gradients to the last ones, so step *k*
applies the sum of every gradient since the first step: the updates grow step after step,
and the alerts that follow (updates too large, the loss rising, diverging) all point at the
learning rate. This module sees the missing reset itself, from one parameter's gradient
(the probe: the first of the monitor's optimizers' parameters that had one at the last
step), at no cost a device would notice:

- at the end of a step (:meth:`Resets.stepped`), which gradient tensor the probe holds, and
  its version counter (``Tensor._version``: every in-place change bumps it);
- at each ``backward()`` until the next step (:meth:`Resets.before`), whether that is still
  the tensor, unchanged since the step or since the last ``backward()`` ended
  (:meth:`Resets.after`): ``zero_grad()`` sets it to None (``set_to_none``, the default) or
  zeroes it in place (a new version), and either is a reset;
- when the first ``backward()`` after a step finds it unchanged, the sum of the absolute
  values of its first :data:`PROBE` elements then is taken on its device (one small kernel,
  never read here): it travels with the step's report (segment ``carried``) and is
  non-zero when the step's gradients began from the last step's. A reset that the version
  counter cannot see (``p.grad.data.zero_()``: ``.data`` has a counter of its own) reads 0.

A step whose ``backward()`` calls saw a reset after the first one found the gradient
unchanged (an adversarial step's attack passes fill the gradients, which are zeroed before
the training pass; a GAN's generator pass fills the discriminator's), whose ``backward()``
calls never added to it (Reptile's meta-optimizer: only the task models' passes ran, and the
script set the meta-gradient through ``.data``), or that applies another gradient tensor
than the last ``backward()`` left (one the script set: gradients taken by
``torch.autograd.grad`` and assigned), carries nothing: the figure is dropped.
Nothing here raises into training.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch

PROBE = 4096
"""Elements of the probe's gradient whose absolute values are summed (a single exact zero,
a dead unit's, must not read as a reset)."""


class Resets:
    """One monitor's view of its probe parameter's gradient between two steps.

    Args:
        optimizers: the monitor's optimizers (the probe is the first parameter of theirs
            that has a gradient at a step's end).
    """

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        self._optimizers = optimizers
        self._probe: weakref.ref[torch.Tensor] | None = None
        self._grad: weakref.ref[torch.Tensor] | None = None  # the gradient tensor last seen (None: unset)
        self._version = 0
        self._armed = False  # a step ended and no backward() has come since
        self._reset = False  # a backward() since the step found the gradient reset
        self._wrote = False  # a backward() since the step added to the gradient
        self._carried: torch.Tensor | None = None  # the first backward()'s figure, while nothing reset it

    def stepped(self, add: Callable[[str, dict[torch.device, torch.Tensor]], None]) -> None:
        """A step's report closes: hand it the figure of the gradient its backward() calls
        began from (``add(segment, {device: tensor})``) unless they reset it, then remember
        the gradient this step leaves."""
        try:
            carried, self._carried = self._carried, None
            p = self._probe() if self._probe is not None else None
            # the step applies the tensor the backward() calls left (not one the script set: a
            # gradient taken by torch.autograd.grad and assigned, as WGAN-GP's and MAML's loops do)
            if (carried is not None and self._wrote and not self._reset and p is not None
                    and self._grad is not None and p.grad is self._grad()):
                add("carried", {carried.device: carried})
            self._reset = self._armed = self._wrote = False
            if p is None or p.grad is None:
                p = self._pick()
            g = p.grad if p is not None else None
            if g is None or g.layout != torch.strided:
                return
            self._grad, self._version, self._armed = weakref.ref(g), g._version, True
        except Exception:  # noqa: S110  (an odd tensor subclass: no verdict, never an error)
            self._armed = False

    def before(self) -> None:
        """A ``backward()`` begins: was the gradient reset since the step (or the last pass)?"""
        if self._grad is None:
            return
        try:
            p = self._probe() if self._probe is not None else None
            g = p.grad if p is not None else None
            if g is None or self._grad() is not g or g._version != self._version:
                self._reset, self._armed, self._grad = True, False, None
                return
            if self._armed:  # the step's first backward(): what the gradient holds now
                self._armed = False
                local = g.to_local() if hasattr(g, "to_local") else g  # a DTensor's shard: no collective
                self._carried = local.detach().reshape(-1)[:PROBE].abs().sum().to(torch.float32).reshape(1)
        except Exception:
            self._reset, self._armed, self._grad = True, False, None

    def after(self) -> None:
        """A ``backward()`` returned: the gradient it leaves, for the next one to compare
        (none once a reset was seen: the step's verdict is made)."""
        if self._grad is None:
            return
        try:
            p = self._probe() if self._probe is not None else None
            g = p.grad if p is not None else None
            if g is not None and g.layout == torch.strided:
                if self._grad() is not g or g._version != self._version:
                    self._wrote = True  # this backward() added to it (in place, or into a new tensor)
                self._grad, self._version = weakref.ref(g), g._version
        except Exception:
            self._grad = None

    def _pick(self) -> torch.Tensor | None:
        for opt in self._optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    if isinstance(p, torch.Tensor) and p.grad is not None:
                        self._probe = weakref.ref(p)
                        return p
        return None
