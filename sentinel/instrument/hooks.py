"""What a monitor hooks: each optimizer's step (handed over by the registry's global step
hooks, :mod:`sentinel.instrument.registry`), the model's and ``clip_grad_norm_``'s hooks,
when ``step()`` is given a closure, the closure; and the interpreter's exit."""

from __future__ import annotations

import atexit
import multiprocessing
import os
import time
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import torch

from sentinel.instrument import leaving, outerstep
from sentinel.instrument.boundary import Boundary
from sentinel.instrument.losses import LossSum
from sentinel.instrument.measure import GradRead, Measure
from sentinel.instrument.staterecord import StateRecord

StepHook = Callable[[torch.optim.Optimizer, Any, Any], Any]


class _Closable(Protocol):
    auto: bool

    def close(self, error: BaseException | None = None) -> None: ...


_live: weakref.WeakSet[Any] = weakref.WeakSet()
_exit_hooked = False
_worker_pid = 0  # the multiprocessing worker whose exit closes the monitors in _worker_live
_worker_live: list[Any] = []


def close_at_exit(mon: _Closable) -> None:
    """Close, at interpreter exit, the monitors a script never closed (their last report,
    the goodbye frame); zero-code mode's own are closed by :func:`sentinel.instrument.auto.close_all`.

    A ``multiprocessing`` worker (a Hogwild trainer) never runs ``atexit``: a forked one
    leaves through ``os._exit``. Its monitors are closed by a ``multiprocessing`` finalizer
    instead, which the worker runs as its target returns (or raises)."""
    global _exit_hooked
    _close_at_worker_exit(mon)
    if mon.auto:
        return
    if not _exit_hooked:
        _exit_hooked = True
        atexit.register(_close_live)
        leaving.install()
        leaving.on_hard_exit = _close_live_at
    _live.add(mon)


def _close_at_worker_exit(mon: _Closable) -> None:
    global _worker_pid
    if multiprocessing.parent_process() is None:
        return  # a main process: atexit runs
    if _worker_pid != os.getpid():  # the first monitor made in this worker (a forked one inherits the list)
        _worker_pid = os.getpid()
        _worker_live.clear()
        from multiprocessing import util

        util.Finalize(None, _close_worker, exitpriority=100)  # before the worker's own queues are finalized
    _worker_live.append(mon)


def _close_worker() -> None:
    if _worker_pid != os.getpid():
        return
    for mon in list(_worker_live):
        try:
            mon.close()
        except Exception:  # at exit: nothing may raise
            pass
    _worker_live.clear()


def _close_live() -> None:
    error = leaving.error()  # an uncaught exception, a non-zero sys.exit: the goodbye says so
    for mon in list(_live):
        try:
            mon.close(error)
        except Exception:  # at exit: nothing may raise
            pass


def _close_live_at(status: int) -> None:
    """The script ends itself with ``os._exit(status)``: no ``atexit`` runs."""
    error = leaving.error()  # its SystemExit(status), and where os._exit was called
    for mon in list(_live):
        try:
            mon.close(error)
        except Exception:  # at exit: nothing may raise
            pass


def hook_body(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Hook bodies run without autograd and are never traced by torch.compile."""
    return torch.compiler.disable(torch.no_grad()(fn))


class _Ahead(NamedTuple):
    step: int
    grouped: Any  # the layout's tensors of the optimizer when read
    grads: tuple[torch.Tensor | None, ...]  # the gradient tensors read
    read: GradRead
    stand_in: type


class _Unhook:
    """Stops handing an optimizer's steps to its monitor."""

    def __init__(self, hooks: Hooks, opt: torch.optim.Optimizer) -> None:
        self.hooks, self.key = hooks, id(opt)

    def remove(self) -> None:
        for table in (self.hooks.pres, self.hooks.posts, self.hooks.states):
            table.pop(self.key, None)


class Hooks:
    """The step hooks of a monitor's optimizers, and every other handle it holds.

    Args:
        boundary: the monitor's boundary (the closure's gradient read runs inside it).
        record: the state record, due again when an optimizer is given new state.
        measure: what reads the gradients.
        loss_sum: the losses captured at ``backward()``, or None.

    Attributes:
        handles: the handles of hooks on the model and on ``clip_grad_norm_``.
        opt_handles: per optimizer, the handles that stop its step hooks.
        closure_done: per optimizer stepping with a closure, whether its gradients were read yet.
    """

    def __init__(self, boundary: Boundary, record: StateRecord, measure: Measure, loss_sum: LossSum | None) -> None:
        self.boundary, self.record, self.measure, self.losses = boundary, record, measure, loss_sum
        self.handles: list[Any] = []
        self.opt_handles: list[list[Any]] = []
        self.pres: dict[int, StepHook] = {}
        self.posts: dict[int, StepHook] = {}
        self.states: dict[int, Any] = {}  # each optimizer's state dict, to see a load_state_dict
        self.closure_done: dict[int, bool] = {}
        self.unread: set[int] = set()  # optimizers whose next step's gradients a stand-in changed already
        self.ahead: dict[int, _Ahead] = {}  # per optimizer, its gradients read as a stand-in's step began

    def hook(self, opt: torch.optim.Optimizer, pre: StepHook, post: StepHook) -> list[Any]:
        """Hand ``opt``'s steps to ``pre`` and ``post``; the handles that stop it."""
        # the registry's global step hooks hand this optimizer's steps to step_pre/step_post:
        # nothing is registered on the optimizer, so nothing of ours is pickled with it
        self.pres[id(opt)] = hook_body(pre)
        self.posts[id(opt)] = hook_body(post)
        self.states[id(opt)] = opt.state
        return [_Unhook(self, opt)]

    def remove(self) -> None:
        """Remove every hook."""
        for h in self.handles + [h for hs in self.opt_handles for h in hs]:
            h.remove()
        self.handles.clear()
        self.opt_handles.clear()

    def step_pre(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
        """The registry's global step pre-hook, for an optimizer this monitor watches."""
        fn = self.pres.get(id(opt))
        if fn is None:
            return None
        if opt.state is not self.states.get(id(opt)):  # load_state_dict gives it new state
            self.states[id(opt)] = opt.state
            self.record.restart()
        return fn(opt, args, kwargs)

    def step_post(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """The registry's global step post-hook, for an optimizer this monitor watches."""
        fn = self.posts.get(id(opt))
        if fn is not None:
            fn(opt, args, kwargs)

    def read_ahead(self, k: int, step: int, opt: torch.optim.Optimizer, stand_in: type) -> None:
        """Read optimizer ``k``'s gradients as a stand-in's step begins (:mod:`.outerstep`),
        with the tensors they are in, for its step to take."""
        grads = tuple(p.grad for g in opt.param_groups for p in g["params"])
        m = self.measure
        was = m.gradless
        self.ahead[k] = _Ahead(step, m.layout.tensors[k], grads, m.grad_read(k, step), stand_in)
        m.gradless = was  # a read taken had gradients (_ahead); one left, the step's own read says

    def _ahead(self, k: int, step: int, opt: torch.optim.Optimizer) -> GradRead | None:
        """The gradients read as the stand-in's step began, when the parameters hold the
        same tensors (scaled in place); None: read them now, and the stand-in, which makes
        its gradients in its step, reads nothing ahead any more."""
        got = self.ahead.pop(k, None)
        if got is None:
            return None
        if got.step != step or self.measure.layout.tensors[k] is not got.grouped:
            return None  # a new report or a new layout began in between: read them now
        params = [p for g in opt.param_groups for p in g["params"]]
        if (len(params) == len(got.grads) and all(a is p.grad for a, p in zip(got.grads, params))
                and any(a is not None for a in got.grads)):
            return got.read  # the same tensors (a parameter without one still has none)
        outerstep.stop(got.stand_in)
        return None

    def closure_aware(self, k: int, step: int, args: Any, kwargs: Any) -> Any:
        """Read the gradients now, or, when ``step`` was given a closure (Lightning's
        automatic optimization, LBFGS), right after the closure's first call inside
        ``step()``: the gradients the optimizer applies. The plain loop pays nothing."""
        # torch passes step()'s own arguments, the optimizer first: (opt, closure?)
        closure = kwargs.get("closure") if "closure" in kwargs else (args[1] if len(args) > 1 else None)
        if self.unread and k in self.unread:  # a stand-in scaled them before this step (outerstep.py)
            self.unread.discard(k)
            return None
        if not callable(closure):
            m = self.measure
            read = self._ahead(k, step, args[0]) if self.ahead else None
            m.guard_grads(k, step, m.grad_stats(k, step, read))
            return None
        self.closure_done[k] = False
        measure, done, run, sums = self.measure, self.closure_done, self.boundary.run, self.losses
        beat = measure.heartbeat

        def closure_then_read(*a: Any, **kw: Any) -> Any:
            out = closure(*a, **kw)
            if not done.get(k, True):
                done[k] = True
                with torch.no_grad():
                    measure.guard_grads(k, step, run("grad", measure.grad_stats, k, step))
                if sums is not None:
                    sums.freeze()  # LBFGS re-evaluates: the first loss is the step's
            elif beat is not None:
                # a re-evaluation inside the step is progress: a physics-informed network's
                # one LBFGS step of max_iter 50,000 after its Adam phase runs for many minutes,
                # its forwards in training mode (no beat), and paged TrainingStalled
                beat(time.perf_counter())
            return out

        if "closure" in kwargs:
            return args, {**kwargs, "closure": closure_then_read}
        return (args[0], closure_then_read, *args[2:]), kwargs
