"""Zero-code instrumentation, switched on by ``SENTINEL_AUTO=1`` (``sentinel run`` sets it).

:func:`install` is idempotent and cheap: it tells the registry
(:mod:`sentinel.instrument.registry`, whose one global optimizer step hook sees every
optimizer that steps) to attach a monitor to any optimizer no monitor watches, and wraps
gradient clipping (:mod:`sentinel.instrument.preclip`) to keep the pre-clip total norm.
Nothing connects until an optimizer actually steps, so launchers and DataLoader workers
never do. At an optimizer's first step a :class:`~sentinel.instrument.monitor.Monitor`
is attached to it, with the module that owns its parameters (found once) naming the
groups, taking the step's loss from ``backward()`` (:mod:`sentinel.instrument.losses`).
An optimizer re-created over the same parameters is followed by the same monitor, and a
script's own ``sentinel.watch`` of an optimizer replaces the automatic monitor.

A script that makes a new model and optimizer per task (Reptile's and MAML's inner loop,
FedAvg's client, a test-time adaptation per sample) would pay a monitor's attach (about
0.2 s) for every short training: after three in turn that each took less than 20 times
their attach, each new optimizer is watched only once it has trained for 20 times that
(:class:`_Turns`).

A script that never steps an optimizer (it updates its parameters by hand) is seen at its
second ``backward()``, when the gradients of the first were reset in between, no
optimizer holds the parameters (or at its :data:`HAND_AFTER`-th backward() otherwise; SAM
resets them between its two passes before its optimizer's first step) and the
parameters changed since the first: one line says what cannot be watched, and a monitor
of the parameters that received gradients reports one step per ``backward()`` (loss,
gradient norms, NaN/Inf), the gradients read right after it. The first ``backward()``'s
gradient norms are kept on the device until then (one fused norm, once per process), so
its step is reported too.

A script whose ``backward()`` calls change no parameter trains nothing: an attack or an
explanation of a trained model (the FGSM tutorial, saliency maps, Grad-CAM) reads the
gradients of its inputs or activations. It gets no monitor and no line. The change is
read from a few of the smallest parameters the first ``backward()`` reached, copied then
(:data:`PROBE_TENSORS`); on an accelerator the comparison travels to the host behind an
event, and the verdict waits for a later ``backward()`` rather than for the device.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import sys
import threading
import time
import weakref
from typing import Any

import torch

from sentinel.instrument import leaving, losses, profiled
from sentinel.instrument.gcscan import first, held_beyond, live
from sentinel.instrument.naming import holders
from sentinel.instrument.readback import Readback
from sentinel.instrument.untraced import eager_only
from sentinel.lines import ScriptLines

log = logging.getLogger("sentinel")

_installed = False
_monitors: list[weakref.ref[Any]] = []  # zero-code mode's monitors, weakly (registry.hold says why)
_last_clip: tuple[torch.Tensor, float, int] | None = None  # clipped before any monitor attached, in that thread
_early: Any = None  # the losses passed to backward() since any optimizer last stepped (LossSum)
_optimizer_seen = False  # an optimizer has begun a step in this process
HAND_AFTER = 64
"""backward() calls with no optimizer step after which the parameters count as updated by hand
even though their gradients were never reset in between (they accumulate on purpose)."""
PROBE_TENSORS = 4
"""The smallest parameters the first ``backward()`` reached, copied to tell whether the script
changes its parameters between ``backward()`` calls (a bias or a norm's weight: a few bytes)."""
STILL_AFTER = 16
"""Looks that found the parameters as they were, after which the script counts as training
nothing (each look compares with the values of the one before)."""
SHORT_IN_TURN = 3
"""Short trainings one after the other that make a series (see :class:`_Turns`)."""
COST_SHARE = 0.05
"""A training is short when its monitor's attach took more than this share of its time (see
:class:`_Turns`)."""


def enabled() -> bool:
    return os.environ.get("SENTINEL_AUTO") == "1"


def install() -> bool:
    """Register the global hooks once, when ``SENTINEL_AUTO=1``. Returns True if installed now."""
    global _installed
    if _installed or not enabled():
        return False
    _installed = True
    _own_lines()
    from sentinel.instrument.options import env_problem

    problem = env_problem()  # what sentinel run checks before its command; a process started otherwise
    if problem is not None:  # (a pod's trainer beside its sidecar) would fail at each attach, unwatched
        log.warning("sentinel: %s; this process is not watched", problem)
        return False
    atexit.register(close_all)
    leaving.install()
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from sentinel.instrument import losses, preclip, registry

    global _early
    _early = losses.LossSum()  # a first step's micro-batches run before its optimizer is seen
    registry.set_fallback(_attach)
    register_optimizer_step_post_hook(_on_post_step)
    preclip.attach(_on_clip)
    losses.backward_listeners.add(_hand_watch)
    return True


def _own_lines() -> None:
    """Sentinel's records in a script it was not asked into go to stderr alone, its warnings
    as the bare ``sentinel: ...`` lines they are, never through the script's own logging
    set-up: a script that configures the root logger (``logging.basicConfig`` with a handler
    to stdout or a ``train.log``, as the Hugging Face examples do) keeps its stdout and its
    files its own. The stream is the one stderr is at install (at ``import torch``), so a
    script that later tees ``sys.stderr`` into a file does not get these lines in it."""
    own = logging.getLogger("sentinel")
    if not own.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setLevel(logging.WARNING)
        handler.setFormatter(ScriptLines())
        own.addHandler(handler)
    own.propagate = False


class _HandWatch:
    """Looks for a training loop without an optimizer at each ``backward()`` (see the module doc)."""

    def __init__(self) -> None:
        self.calls = 0
        self.param: Any = None  # a weakref to a parameter the first backward() reached
        self.first: tuple[list[torch.Tensor], torch.Tensor] | None = None  # its leaves' grad norms
        self._leaves: list[torch.Tensor] = []  # what the first backward() reached, until it returns
        self.done = False
        self.held: bool | None = None  # an optimizer holds the parameter (looked for once)
        self.probe: list[tuple[torch.Tensor, torch.Tensor]] = []  # (parameter, its values when copied)
        self.answer: Readback | None = None  # the comparison on its way to the host (one at a time)
        self.still = 0  # looks that found the probed parameters unchanged
        self.stepped_in: int | None = None  # the thread of the first backward(): its look is of that training

    def _finish(self) -> None:
        """Decided either way: off the backward() path for the rest of the process."""
        from sentinel.instrument import losses

        self.done, self.first, self._leaves, self.probe, self.answer = True, None, [], [], None
        losses.backward_listeners.discard(self)

    def before_backward(self, loss: Any) -> None:
        from sentinel.instrument import registry

        # an optimizer attached, watched or stepping (a closure's backward() calls run inside the step)
        if self.done or _optimizer_seen or registry.any_optimizer():
            self._finish()
            return
        try:
            self.calls += 1
            if self.calls == 1:
                self.stepped_in = threading.get_ident()  # (losses calls it from this thread only from now on)
                leaves = _leaves_of(loss)
                self.param = weakref.ref(leaves[0]) if leaves else None
                if _early is not None and leaves:  # the first step's passes: reset gradients start its loss again
                    _early.watch(next((t for t in leaves if isinstance(t, torch.nn.Parameter)), leaves[0]))
                self._leaves = leaves
                self.probe = _copies(leaves)
                return
            p = self.param() if self.param is not None else None
            if p is None:
                self._finish()  # nothing trainable reached: nothing to watch
                return
            if p.grad is None or self.calls >= HAND_AFTER:  # reset between backward() calls: a step each
                if self.calls < HAND_AFTER and self._in_optimizer(p):
                    return  # SAM's two passes before its optimizer's first step: not by hand, wait
                moved = self._moved()
                if moved is None:
                    return  # the device's answer is on its way: read at a later backward()
                if not moved:  # an evaluation's backward(): look again from the values now
                    self.still += 1
                    self.first = None  # a later verdict's first step is not the first backward()'s
                    self.probe = [] if self.still >= STILL_AFTER else _copies([q for q, _ in self.probe])
                    if not self.probe:
                        self._finish()  # trains nothing (or nothing the copies show)
                    return
                first = self.first
                self._finish()
                if not any(not m.closed for m in registry.owners([p])):  # the script's watch(model) watches it
                    _attach_hand(p, self.calls - 1, first if self.calls == 2 else None)
        except Exception:
            self._finish()
            log.warning("sentinel: could not watch a loop without an optimizer; training continues", exc_info=True)

    def _moved(self) -> bool | None:
        """Whether a probed parameter changed since it was copied (True when none was): None
        while the device's comparison is on its way to the host (asked now, read at a later
        call through a :class:`Readback`, which never waits for the device)."""
        if self.answer is None:
            if not self.probe:
                return True
            if any(p.shape != ref.shape or p.dtype != ref.dtype or p.device != ref.device or not _readable(p)
                   for p, ref in self.probe):
                return True  # cast, moved, replaced or freed: changed, as far as can be told
            with torch.no_grad():
                changed = torch.stack([torch.ne(p, ref).any() for p, ref in self.probe]).any().reshape(1)
            self.answer = Readback(max_pending=1)
            self.answer.submit(None, {changed.device: {"changed": changed}})
        done = self.answer.poll()
        if not done:
            return None
        self.answer = None
        return bool(done[0][1]["changed"][0])

    def _in_optimizer(self, p: torch.Tensor) -> bool:
        """Whether an optimizer made over ``p`` exists, one that has not stepped yet (one
        gc scan, the first time the gradients are found reset)."""
        if self.held is None:
            self.held = any(any(q is p for g in getattr(o, "param_groups", ()) for q in g.get("params", ()))
                            for o in live(torch.optim.Optimizer))
        return self.held

    def after_backward(self) -> None:
        """After the first backward(): its gradients' norms, kept on the device (no sync) in
        case this is a loop without an optimizer, whose first step they are."""
        if self.calls != 1 or self.done or self.first is not None:
            return
        try:
            leaves, self._leaves = self._leaves, []
            with torch.no_grad():
                have = [t for t in leaves if t.grad is not None]
                if have:
                    from sentinel.instrument.stats import _norms

                    self.first = (have, torch.stack([n.to(have[0].device) for n in _norms(
                        [t.grad for t in have], 2.0)]))  # type: ignore[misc]
        except Exception:
            self.first = None


def _leaves_of(loss: Any) -> list[torch.Tensor]:
    """The parameters the loss's graph accumulates gradients into (a bounded walk, once)."""
    todo, seen, out, ids = [getattr(loss, "grad_fn", None)], 0, [], set()
    while todo and seen < 10_000:
        node = todo.pop()
        seen += 1
        if node is None:
            continue
        var = getattr(node, "variable", None)
        if isinstance(var, torch.Tensor) and var.requires_grad:
            if id(var) not in ids:
                ids.add(id(var))
                out.append(var)
            continue
        todo.extend(n for n, _ in node.next_functions)
    return out


def _copies(leaves: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The :data:`PROBE_TENSORS` smallest of the parameters among ``leaves`` (of all of them
    where none is an ``nn.Parameter``: a loop over bare tensors), on the first one's
    device, each with a copy of its values now."""
    params = [t for t in leaves if isinstance(t, torch.nn.Parameter)] or leaves
    if not params:
        return []
    device = params[0].device
    small = sorted((t for t in params if t.device == device and _readable(t)), key=lambda t: t.numel())
    with torch.no_grad():
        return [(t, t.detach().clone()) for t in small[:PROBE_TENSORS]]


def _readable(t: torch.Tensor) -> bool:
    """Whether ``t``'s values may be read: dense, not empty, and its storage holds them. FSDP2
    frees the storage of a layer's gathered parameters after its forward (``resize_(0)``):
    the graph still reaches them, and reading one ends the process (a segmentation fault,
    not an exception)."""
    try:
        if t.is_sparse or t.numel() == 0 or t.device.type == "meta":
            return False
        end = t.storage_offset() + 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
        return bool(t.untyped_storage().nbytes() >= end * t.element_size())
    except Exception:  # a tensor subclass without a storage of its own (DTensor)
        return False


def _attach_hand(param: torch.Tensor, steps_so_far: int,
                 first: tuple[list[torch.Tensor], torch.Tensor] | None) -> None:
    from sentinel.instrument.losses import LossSum
    from sentinel.instrument.monitor import Monitor
    from sentinel.instrument.options import from_kwargs

    global _early
    model = _find_model(param)
    params = [p for p in model.parameters() if p.requires_grad] if model is not None else [param]
    early, _early = _early, LossSum()
    replay = first if steps_so_far == 1 else None  # the first backward()'s step, from what it left
    log.warning("%s", hand_line(_foreign_stepper(param, model), steps_so_far + 1, 1 if replay else None))
    mon = Monitor(model, [], from_kwargs({"capture_loss": True}),
                  scaler=early.grad_scaler() if early is not None else None, auto=True, loss_sum=early, hand=params)
    if replay is not None:
        mon.replay_first(*replay, clip=_last_clip[:2] if _last_clip is not None else None)
    else:
        mon.sync_step(steps_so_far)
        early.take()  # the losses before this backward() belong to steps that were not watched
    _keep(mon)


def _foreign_stepper(param: torch.Tensor, model: torch.nn.Module | None = None) -> str | None:
    """The class (``module.name``) of an object that steps ``param`` and is no torch
    optimizer: one with a ``step`` method whose ``param_groups`` hold it. fastai's own
    ``Optimizer`` (its ``Learner``'s default) is one; it zeroes the gradients in place, so
    the loop read as parameters updated by hand, and the line said so. A Keras 3 model on
    the torch backend (``model``) is stepped by its own optimizer (``model.optimizer``, set
    by ``compile``), which holds Keras variables, not param groups. One gc scan, once;
    None when there is none."""
    if model is not None and type(model).__module__.startswith("keras."):
        keras_optimizer = getattr(model, "optimizer", None)
        if keras_optimizer is not None:
            return f"{type(keras_optimizer).__module__}.{type(keras_optimizer).__qualname__}"
    kinds: dict[type, bool] = {}  # whether a class can be such a stepper, asked once per class

    def steps_it(obj: Any) -> bool:
        kind = type(obj)
        can = kinds.get(kind)
        if can is None:
            can = kinds[kind] = False  # until the class is known to be one (a raise leaves it out)
            can = kinds[kind] = (not issubclass(kind, torch.optim.Optimizer) and callable(getattr(kind, "step", None))
                                 and hasattr(kind, "param_groups"))
        return can and any(q is param for g in obj.param_groups for q in g["params"])

    found = first(steps_it)
    return None if found is None else f"{type(found).__module__}.{type(found).__qualname__}"


def hand_line(stepper: str | None, calls: int, since: int | None = None) -> str:
    """The one line that says a loop is watched without an optimizer, ``calls`` being the
    ``backward()`` calls by then and ``since`` the first one watched (None: the last);
    ``stepper``: the class that steps its parameters, when one that is no torch optimizer
    does (:func:`_foreign_stepper`)."""
    if stepper is None:
        return (f"sentinel: no optimizer has stepped after {calls} backward() calls: the parameters are updated by "
                "hand. Watching the loss, gradient norms and NaN/Inf after each backward(), one step each; update "
                "ratios, optimizer state and learning rates need an optimizer and are not reported.")
    hint = (" (fastai: Learner(..., opt_func=partial(OptimWrapper, opt=torch.optim.AdamW)) steps a torch "
            "optimizer, watched whole)" if stepper.startswith("fastai.") else "")
    return (f"sentinel: the parameters are stepped by {stepper}, which is no torch.optim.Optimizer and has no step "
            f"hooks. Watching the loss, gradient norms and NaN/Inf after each backward() from backward() "
            f"{calls if since is None else since} on, "
            f"one step each; update ratios, optimizer state and learning rates are not reported{hint}.")


_hand_watch = _HandWatch()


class _Turn:
    __slots__ = ("opt", "mon", "began", "cost", "overlapped")

    def __init__(self, opt: torch.optim.Optimizer, mon: Any, began: float, cost: float) -> None:
        self.opt = weakref.ref(opt)
        self.mon = weakref.ref(mon)
        self.began = began  # time.perf_counter() as its monitor began to attach
        self.cost = cost  # seconds attaching its monitor took
        # it stepped after the next optimizer came, or the script holds it: not a training that had ended
        self.overlapped = False


class _Turns:
    """New optimizers made one after the other, each stepping a little and then left for the
    next: Reptile's and MAML's inner loop per task over a fresh copy of the model, FedAvg's
    local training per client, a test-time adaptation per sample. Each would be a new
    training with a new monitor, whose attach costs about 0.2 s (a full garbage collection
    and a scan of the heap for its model): 200 tasks of 8 steps took 40 s where the script
    alone took 1.7 s, and 30 clients of 60 steps 16.5 s against 13.7 s.

    After :data:`SHORT_IN_TURN` such trainings in turn (none stepping again once the next
    came, each one's attach more than :data:`COST_SHARE` of its time from its attach to the
    next one's), one line says so, their monitors close (their streams end), and each new
    optimizer steps unwatched until it has trained long enough for an attach to cost less
    than that share (``1 / COST_SHARE`` times the series' costliest). Its steps are counted
    as a resumed optimizer's are, from its own count (Adam's), so the rules of a training's
    first steps do not read a late start as the start; the engine and the history begin its
    stream anew (it said goodbye with the series' last). Until then it costs a clock read
    per step. Two optimizers that alternate (a GAN's) are not in turn; a few short trials
    before a long training (a batch-size search) hold the long one's watch back by a few
    seconds."""

    def __init__(self) -> None:
        self.turns: list[_Turn] = []  # the last optimizers that got a monitor here, oldest first
        self.by_id: dict[int, _Turn] = {}
        # the optimizers made during a series, while they wait: the time of their first step
        self.waiting: weakref.WeakKeyDictionary[torch.optim.Optimizer, float] = weakref.WeakKeyDictionary()
        self.wait = 0.0  # seconds a new optimizer trains unwatched during a series
        self.deferring = False
        self.said = False

    def stepped(self, opt: torch.optim.Optimizer) -> None:
        """An optimizer's step ended (every optimizer's: keep this cheap)."""
        turn = self.by_id.get(id(opt))
        if turn is not None and turn is not self.turns[-1] and turn.opt() is opt:
            turn.overlapped = True

    def attached(self, opt: torch.optim.Optimizer, mon: Any, began: float) -> None:
        """``opt`` got its monitor ``mon``, which began to attach at ``began`` (perf_counter)."""
        turn = _Turn(opt, mon, began, time.perf_counter() - began)
        self.turns = [*self.turns[1 - SHORT_IN_TURN:], turn]
        self.by_id = {id(o): t for t in self.turns if (o := t.opt()) is not None}

    def defer(self, opt: torch.optim.Optimizer) -> bool:
        """At each step of ``opt`` while it has no monitor: whether it stays unwatched at
        this one."""
        if not self.deferring:
            if not self._in_turn():
                return False
            self._begin()
        now = time.perf_counter()
        if now - self.waiting.setdefault(opt, now) < self.wait:
            return True
        self.deferring = False  # a training of its own: watched from here; a series may begin anew
        self.turns, self.by_id = [], {}
        return False

    def _in_turn(self) -> bool:
        last = self.turns[-SHORT_IN_TURN:]
        if len(last) < SHORT_IN_TURN:
            return False
        ends = [t.began for t in last[1:]] + [time.perf_counter()]
        if not all(not t.overlapped and t.cost > COST_SHARE * (end - t.began) for t, end in zip(last, ends)):
            return False
        if _held_by_script(last):
            for t in last:  # no series member: not looked for again (an ensemble of 50 scans 17 times)
                t.overlapped = True
            return False
        return True

    def _begin(self) -> None:
        self.deferring = True
        self.wait = max(t.cost for t in self.turns) / COST_SHARE
        if not self.said:
            self.said = True
            log.warning("sentinel: %d optimizers made one after the other each trained for less than %d times what "
                        "watching it cost (an inner loop per task, a client's local training, an adaptation per "
                        "sample): each new optimizer from now on is watched once it has trained for %.1f s, and one "
                        "that stops sooner is left alone.",
                        SHORT_IN_TURN, round(1 / COST_SHARE), self.wait)
        for turn in self.turns:
            mon = turn.mon()
            try:
                if mon is not None:
                    mon.close()  # its training is over: its stream ends now, not at exit
            except Exception:
                log.debug("sentinel: could not close a short training's monitor", exc_info=True)
        self.turns, self.by_id = [], {}
        gc.collect()  # what the script dropped of them goes now (their monitors held it in cycles)


def _held_by_script(turns: list[_Turn]) -> bool:
    """Whether the script still holds an optimizer of ``turns`` (one scan of the heap's
    references): optimizers it made up front and steps in turn, each one's first round
    ahead of the others' (a deep ensemble's models with one Adam each, stepped one after
    another on every batch), look like a series of short trainings until their second
    round. A series' optimizers are left to their monitors: the script made each anew
    and dropped the one before (its model's hooks and its monitor hold it in a cycle). A
    frame of the script holding one (an optimizer in a local) holds it too."""
    opts = [o for o in [t.opt() for t in turns] if o is not None]
    return held_beyond(opts, [m.optimizers for m in [t.mon() for t in turns] if m is not None])


_turns = _Turns()


def monitors() -> list[Any]:
    """The monitors zero-code mode made that are alive now (closed ones included)."""
    return [m for m in (r() for r in _monitors) if m is not None]


def _keep(mon: Any) -> None:
    """Remember a monitor made here, to close it at exit if it is still alive then; the
    Python programs this process runs from now on are runs of their own (shim.watched)."""
    from sentinel.instrument import shim

    _monitors[:] = [r for r in _monitors if r() is not None]
    _monitors.append(weakref.ref(mon))
    shim.watched()


def _on_clip(total_norm: torch.Tensor, max_norm: float, params: Any = None) -> None:
    # the first step clips before its optimizer has a monitor: keep it for _attach
    global _last_clip
    _last_clip = (total_norm, max_norm, threading.get_ident())


def _find_model(first: torch.Tensor | None) -> torch.nn.Module | None:
    """The largest module holding the parameter (one gc scan, at attach)."""
    roots = holders({id(first)}) if first is not None else []
    return roots[0][0] if roots else None


def _optimizers_alive() -> int:
    """Initialised optimizers alive now over parameters that take gradients, now or later
    (one gc scan, at the first attach): pix2pix and CycleGAN scripts turn their
    discriminators' ``requires_grad`` off for the generators' step, which comes first, so
    at that attach the discriminators' optimizer trains nothing yet (counting it only then
    made the two streams one). A wrapper that never ran ``Optimizer.__init__`` (Accelerate's)
    is not one, nor is one over plain tensors that take none (Lightning's mock optimizer)."""
    return len(_trainers())


def _trainers() -> list[torch.optim.Optimizer]:
    """The optimizers :func:`_optimizers_alive` counts (one gc scan)."""
    from sentinel.instrument.registry import held_inside, shared_inner

    alive = live(torch.optim.Optimizer)
    inner = held_inside(alive)  # a ZeroRedundancyOptimizer's local optimizer is a part of it
    out = []
    for obj in alive:
        groups = getattr(obj, "param_groups", None) if hasattr(obj, "_optimizer_step_pre_hooks") else None
        if groups and any(isinstance(p, torch.nn.Parameter) or p.requires_grad for g in groups
                          for p in g.get("params", ())) and shared_inner(obj) is None and id(obj) not in inner:
            out.append(obj)  # (a SAM optimizer and its base optimizer are one: the base steps)
    return out


def _stepped_with(opt: torch.optim.Optimizer, model: torch.nn.Module | None) -> list[torch.optim.Optimizer]:
    """For an optimizer whose first step runs inside ``backward()``: the other unwatched
    optimizers over parameters of the same model, the parts of one step (one gc scan).

    The optimizer step fused into the backward pass (PyTorch's tutorial of that name,
    torchtune's ``optimizer_in_bwd``) makes an optimizer per parameter and steps each from
    the parameter's ``register_post_accumulate_grad_hook`` as soon as its gradient is
    ready. Each one a stream of its own, a model of 9 layers made 18 streams, paged a
    critical ``EarlyGradientGrowth`` for one bias, and took 7.7 s for 300 steps against
    0.66 s unwatched. One monitor of them all is one stream, whose report closes when each
    has stepped once (or one steps again: a parameter without a gradient this step)."""
    from sentinel.instrument import registry

    if model is None:
        return []
    own = {id(p) for g in opt.param_groups for p in g["params"]}
    mine = {id(p) for p in model.parameters()}
    parts = []
    for other in _trainers():
        params = [p for g in other.param_groups for p in g["params"]]
        if (other is not opt and params and registry.monitor_of(other) is None
                and all(id(p) in mine and id(p) not in own for p in params)):
            parts.append(other)
    return parts


def _in_model_order(optimizers: list[torch.optim.Optimizer], model: torch.nn.Module) -> list[torch.optim.Optimizer]:
    """``optimizers`` in the order of their first parameters in ``model`` (its groups' order)."""
    order = {id(p): i for i, p in enumerate(model.parameters())}
    return sorted(optimizers, key=lambda o: min((order.get(id(p), len(order)) for g in o.param_groups
                                                 for p in g["params"]), default=len(order)))


def _attach(opt: torch.optim.Optimizer) -> Any:
    from sentinel.instrument.losses import LossSum
    from sentinel.instrument.monitor import Monitor
    from sentinel.instrument.options import from_kwargs

    global _early, _optimizer_seen
    first_param = next((p for g in opt.param_groups for p in g["params"]), None)
    in_backward = torch._C._current_graph_task_id() != -1  # stepped by a gradient hook
    model = _find_model(first_param) if in_backward else None
    parts = _stepped_with(opt, model) if in_backward else []
    if not _optimizer_seen:  # a GAN's optimizers: labelled streams from the first report on
        from sentinel.instrument import registry

        registry.expect_streams(_optimizers_alive() - len(parts))
    _optimizer_seen = True
    if _turns.defer(opt):  # one of a series of short trainings: watched once it has trained long enough
        return None
    began = time.perf_counter()
    if monitors():
        # a monitor made before lives in cycles of its own parts: one whose model the script
        # dropped closed and was collected then (monitor._model_gone), but one with no
        # model (loose tensors) or whose model went in a collection of the script's own
        # cycles is freed here, not at some later collection, with what it holds
        gc.collect()
    if _early is None or _early.thread in (None, losses.caller()):
        early, _early = _early, LossSum()  # this step's losses so far are the new monitor's
    else:  # they are another thread's training's (trials in threads): this first step's loss is not known
        early = LossSum()
    if not in_backward:  # (one gc scan: not for an attach deferred above)
        model = _find_model(first_param)
    optimizers = _in_model_order([opt, *parts], model) if parts and model is not None else [opt]
    mon = Monitor(model, optimizers, from_kwargs({"capture_loss": True}),
                  scaler=early.grad_scaler() if early is not None else None, auto=True, loss_sum=early)
    _keep(mon)
    _turns.attached(opt, mon, began)
    if _last_clip is not None and _last_clip[2] == losses.caller():  # clipped just before this first step
        mon.note_clip(*_last_clip[:2])
    return mon


@eager_only
@profiled.labelled(profiled.STEP)
def _on_post_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    global _last_clip
    _last_clip = None
    _turns.stepped(opt)
    if _early is not None and _early.thread in (None, losses.caller()):
        _early.take()  # losses before an optimizer's first step are its step's, not older ones


def close_all() -> None:
    """Close every auto-attached monitor (registered with atexit by the shim's initializer):
    their goodbye frames say how the script leaves (:func:`.leaving.error`: an uncaught
    exception, a non-zero ``sys.exit``)."""
    error = leaving.error()
    for mon in monitors():
        try:
            mon.close(error)
        except Exception:
            pass
