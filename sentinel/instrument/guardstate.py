"""How the step guard undoes a step exactly: the snapshots and their restores.

- :class:`HostCopy`: everything one optimizer step can change (parameters, every state
  entry, the param groups' values), copied before the step and put back after it. Used by
  the ``sync`` method on a step known (on the host) to be skipped, and for the state a
  device-side select cannot reach (Python numbers, tensors on another device, state
  created by the step) once the skip is known.
- :class:`DeviceSelect`: the ``select`` method. Before every step the parameters and the
  state tensors on the parameters' device are copied into buffers kept between steps;
  after it, ``torch.where(skip, saved, current, out=current)`` puts the saved values back
  where the device-side flag says so. No host sync, bounded memory (the buffers).

Both restore bit for bit: copies, never arithmetic.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch

from sentinel.instrument.registry import stepper

Tensor = torch.Tensor


def _params(opt: torch.optim.Optimizer) -> list[Tensor]:
    return [p for g in opt.param_groups for p in g["params"]]


def _copy(v: Any) -> Any:
    if isinstance(v, Tensor):
        return v.detach().clone()
    return copy.deepcopy(v)


def _put(holder: dict[Any, Any], key: Any, saved: Any) -> None:
    """``holder[key] = saved``, in place into the existing tensor where shapes agree (code
    holding a reference to the state tensor keeps seeing the right values)."""
    cur = holder.get(key)
    if (isinstance(cur, Tensor) and isinstance(saved, Tensor) and cur.shape == saved.shape
            and cur.dtype == saved.dtype and cur.device == saved.device):
        cur.copy_(saved)
    else:
        holder[key] = saved


class HostCopy:
    """The host-side part of an optimizer's state (or all of it), to put back after a
    skipped step.

    Args:
        opt: the optimizer, before its step.
        device: with a device, only what a :class:`DeviceSelect` on it does not cover: the
            parameters and state tensors on ``device`` are left out (but which state keys
            exist is recorded, so state the step creates is removed again). None: all.
    """

    def __init__(self, opt: torch.optim.Optimizer, device: torch.device | None = None) -> None:
        self.opt = opt
        self.holder = stepper(opt).state  # a ZeroRedundancyOptimizer's: its local optimizer's
        self.device = device
        self.params = _params(opt)
        self.data = [p.detach().clone() for p in self.params] if device is None else []
        self.state: dict[int, dict[str, Any]] = {}
        self.keys: dict[int, frozenset[str]] = {}
        for p in self.params:
            st = self.holder.get(p)
            if st is None:
                continue
            self.keys[id(p)] = frozenset(st)
            self.state[id(p)] = {k: _copy(v) for k, v in st.items() if not self._on_device(v)}
        self.groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in opt.param_groups]

    def _on_device(self, v: Any) -> bool:
        return self.device is not None and isinstance(v, Tensor) and v.device == self.device

    def restore(self) -> None:
        """Put back what was copied; state the step created is removed."""
        opt = self.opt
        for p, d in zip(self.params, self.data):
            p.detach().copy_(d)
        for p in self.params:
            if id(p) not in self.keys:
                self.holder.pop(p, None)  # created by the skipped step (a lazy first-step init)
                continue
            st = self.holder[p]
            for k in [k for k in st if k not in self.keys[id(p)]]:
                del st[k]
            for k, v in self.state[id(p)].items():
                _put(st, k, v)
        for g, saved in zip(opt.param_groups, self.groups):
            for k in [k for k in g if k != "params" and k not in saved]:
                del g[k]
            for k, v in saved.items():
                g[k] = v


def device_tensors(opt: torch.optim.Optimizer, device: torch.device) -> Iterator[tuple[Any, Any, Tensor]]:
    """``(holder, key, tensor)`` of the parameters (holder None), then of the state tensors
    (holder: the parameter's state dict), on ``device``, in a stable order."""
    params = _params(opt)
    for p in params:
        if p.device == device:
            yield None, None, p.detach()
    state = stepper(opt).state
    for p in params:
        st = state.get(p)
        if st:
            for k, v in st.items():
                if isinstance(v, Tensor) and v.device == device:
                    yield st, k, v


def select_fits(opt: torch.optim.Optimizer) -> bool:
    """Whether a device-side select covers the optimizer's state: tensors and Python
    numbers only (LBFGS keeps lists of tensors; those take the ``sync`` method)."""
    for st in stepper(opt).state.values():
        for v in st.values():
            if not isinstance(v, (Tensor, int, float, bool)):
                return False
    return True


class DeviceSelect:
    """The ``select`` method's snapshot for one optimizer on one device.

    Args:
        device: the parameters' device.
        budget: the buffers may hold at most this many bytes; :meth:`take` returns False
            (and keeps nothing) past it.
    """

    def __init__(self, device: torch.device, budget: int) -> None:
        self.device = device
        self.budget = budget
        self.current: list[Tensor] = []
        self.saved: list[Tensor] = []
        self.where: list[tuple[Any, Any]] = []
        self._key: tuple[tuple[int, tuple[int, ...], torch.dtype], ...] = ()

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.saved)

    def take(self, opt: torch.optim.Optimizer) -> bool:
        """Copy the parameters and device state into the buffers (device-side copies).

        Returns:
            False when they would exceed the budget (nothing is held then).
        """
        found = list(device_tensors(opt, self.device))
        cur = [t for _, _, t in found]
        self.where = [(h, k) for h, k, _ in found]
        key = tuple((id(t), tuple(t.shape), t.dtype) for t in cur)
        if key != self._key:  # the first step created state, or the layout changed
            need = sum(t.numel() * t.element_size() for t in cur)
            self.current, self.saved, self._key = [], [], ()
            if need > self.budget:
                return False
            self.saved = [torch.empty_like(t) for t in cur]
            self._key = key
        self.current = cur
        if cur:
            torch._foreach_copy_(self.saved, cur)
        return True

    def select(self, skip: Tensor) -> None:
        """Where ``skip`` (a 0-d bool tensor on the device) holds, put the saved values back.

        A state tensor the step replaced by a new one (rather than updating it in place) is
        replaced again, by the selected values."""
        for (holder, key), c, s in zip(self.where, self.current, self.saved):
            now = c if holder is None else holder.get(key)
            if now is c:
                torch.where(skip, s, c, out=c)
            elif isinstance(now, Tensor) and now.shape == s.shape and now.dtype == s.dtype:
                holder[key] = torch.where(skip, s, now)
