"""Which monitor watches which optimizer, process-wide: one monitor per optimizer.

- :func:`unwrap` finds the real ``torch.optim.Optimizer`` inside a framework's wrapper.
- :func:`claim` and :func:`release` keep the map from optimizers (and their parameters)
  to the live monitors.
- One global optimizer step pre-hook and one post-hook (torch's
  ``register_optimizer_step_pre_hook``/``..._post_hook``, registered with the first
  monitor) see every optimizer that steps and hand it to the monitor that watches it.
  Nothing is registered on the optimizer itself, so nothing of Sentinel's is in the
  optimizer a script pickles or ``torch.save``s. An optimizer that no monitor hooks but
  that steps a watched model's parameters is an optimizer re-created mid-run (an LR
  finder, a restart): the monitor follows it and its step count goes on. Zero-code mode
  (:mod:`sentinel.instrument.auto`) hands in what to do with any other unwatched
  optimizer: attach a new monitor. The hooks cost one dictionary lookup per step.
- An optimizer that steps inside a watched optimizer's ``step()`` (a
  ``ZeroRedundancyOptimizer``'s local optimizer over this rank's shard) is part of that
  step, not a stream nor the watched optimizer's successor; :func:`stepper` gives the one
  whose state and class describe the update.
- :func:`stream_label` names each optimizer's stream when a process has several (a GAN's
  two optimizers): ``"0"``, ``"1"``, ... in the order their monitors were made, the
  engine's ``optimizer`` label; ``""`` (no label) for a process's only one. The workers
  of a Hogwild script (``multiprocessing`` processes that each step their own optimizer
  outside ``torch.distributed``) share their parent's rank: each is a stream of it, named
  by the worker's number (see :func:`worker_number`).
"""

from __future__ import annotations

import logging
import multiprocessing
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from sentinel.instrument import leaving, losses, outerstep, profiled
from sentinel.instrument.gcscan import held_beyond
from sentinel.instrument.untraced import eager_only

log = logging.getLogger("sentinel")

# optimizer -> the monitor hooking it, held weakly both ways (None: nobody's, don't look again):
# what keeps a monitor alive is :func:`hold` or the model it watches (see :func:`hold`)
_by_opt: weakref.WeakKeyDictionary[torch.optim.Optimizer, weakref.ref[Any] | None] = weakref.WeakKeyDictionary()
_held: dict[int, Any] = {}  # id -> a monitor kept until it closes
_owner: dict[int, weakref.ref[Any]] = {}  # id(parameter) -> the monitor watching it
_hooked = False
_fallback: Callable[[torch.optim.Optimizer], Any] | None = None
# optimizers the fallback let step unwatched (zero-code mode's series of short trainings): at
# their next steps only it is asked again, without the look for a monitor to adopt them
_waiting: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
_failures = 0
_streams: list[weakref.ref[Any]] = []  # monitors of optimizers, in the order they were made
_expected = 1  # optimizers zero-code mode found alive when it attached its first monitor
_before: dict[int, frozenset[int]] = {}  # per monitor: the live monitors that had reported when it was made
_taken: weakref.WeakSet[Any] = weakref.WeakSet()  # monitors whose stream a later one reports on
_now = threading.local()  # .stepping: the watched optimizer whose step() runs in this thread (None: none)
_looked: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()  # looked for a wrapper at their first step
# an optimizer that steps inside another's step() -> that outer one (ZeroRedundancyOptimizer's local optimizer)
_inner_of: weakref.WeakKeyDictionary[torch.optim.Optimizer, weakref.ref[torch.optim.Optimizer]] = (
    weakref.WeakKeyDictionary())
# an optimizer -> the optimizer it holds as an attribute (None: none), see _holds
_holder_of: weakref.WeakKeyDictionary[torch.optim.Optimizer, Any] = weakref.WeakKeyDictionary()


class UnsupportedOptimizer(TypeError):
    """What :func:`unwrap` says of an object that holds no usable optimizer."""


def shared_inner(obj: Any) -> torch.optim.Optimizer | None:
    """The optimizer inside ``obj`` that steps ``obj``'s own parameter groups, when ``obj``
    is an optimizer built around another one over the same groups: the SAM optimizer (and
    its copies, ASAM, GSAM), whose ``first_step``/``second_step`` move the weights by hand
    and leave the update to its ``base_optimizer``; Lookahead-style wrappers. None for any
    other object. Only the instance's own attributes are looked at (no properties run)."""
    groups = getattr(obj, "param_groups", None) if isinstance(obj, torch.optim.Optimizer) else None
    attrs = getattr(obj, "__dict__", None)
    if not groups or not isinstance(attrs, dict):
        return None
    for value in attrs.values():
        if value is obj or not isinstance(value, torch.optim.Optimizer):
            continue
        inner = value.__dict__.get("param_groups")
        if inner is groups or (isinstance(inner, list) and len(inner) == len(groups)
                               and all(a is b for a, b in zip(inner, groups, strict=True))):
            return value
    return None


def unwrap(obj: Any) -> torch.optim.Optimizer:
    """The ``torch.optim.Optimizer`` that really steps, inside any wrappers.

    Accelerate's ``AcceleratedOptimizer`` (an ``Optimizer`` subclass that never ran
    ``Optimizer.__init__``), Lightning's ``LightningOptimizer``, DeepSpeed-style wrappers,
    apex's ``LARC``: anything that keeps the real one as ``.optimizer``, ``._optimizer``
    or ``.optim`` (:data:`.outerstep.INNER`); and an
    optimizer whose inner optimizer steps the same parameter groups (SAM's
    ``base_optimizer``: :func:`shared_inner`).

    Raises:
        UnsupportedOptimizer: no initialised ``torch.optim.Optimizer`` inside ``obj``.
    """
    seen = {id(obj)}
    for _ in range(8):
        inner = outerstep.inner_of(obj)
        if inner is not None and id(inner) in seen:
            inner = None
        if inner is None:
            cand = shared_inner(obj)
            inner = cand if cand is not None and id(cand) not in seen else None
        if inner is None:
            break
        seen.add(id(inner))
        obj = inner
    if not isinstance(obj, torch.optim.Optimizer) or not hasattr(obj, "_optimizer_step_pre_hooks"):
        raise UnsupportedOptimizer(f"{type(obj).__name__} is not a torch.optim.Optimizer and holds none "
                                   "as .optimizer")
    return obj


def any_optimizer() -> bool:
    """Whether any optimizer is watched, or has stepped, in this process."""
    return len(_by_opt) > 0


def known_optimizers() -> list[torch.optim.Optimizer]:
    """Every live optimizer that a monitor watches or that stepped in this process."""
    return list(_by_opt.keys())


def monitor_of(opt: torch.optim.Optimizer) -> Any:
    """The live monitor hooking ``opt``, or None."""
    ref = _by_opt.get(opt)
    return ref() if ref is not None else None


def owners(params: Any) -> list[Any]:
    """The live monitors watching any of ``params`` (an iterable of tensors), each once."""
    if not _owner:
        return []
    found: list[Any] = []
    for p in params:
        ref = _owner.get(id(p))
        mon = ref() if ref is not None else None
        if mon is not None and all(m is not mon for m in found):
            found.append(mon)
    return found


def hold(monitor: Any) -> None:
    """Keep ``monitor`` alive until it closes (:func:`release`).

    Sentinel's own tables hold monitors weakly, as the monitors hold the script's model
    and optimizers: a monitor that nothing kept would keep them alive for the rest of the
    process. A script's own monitor (``watch``) is held here; zero-code mode's lives as
    long as the model it watches, whose hooks hold it, so a script that drops a model and
    its optimizer (each fold of a k-fold loop) gets their memory back, as without Sentinel.
    """
    _held[id(monitor)] = monitor


def claim(monitor: Any, opt: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
    """Record that ``monitor`` hooks ``opt`` and watches ``params``."""
    _hook()
    _by_opt[opt] = weakref.ref(monitor)
    claim_hand(monitor, params)


def claim_hand(monitor: Any, params: Sequence[torch.Tensor]) -> None:
    """Record that ``monitor`` watches ``params`` (with no optimizer: updated by hand)."""
    ref = weakref.ref(monitor)
    for p in params:
        _owner[id(p)] = ref


closed_by: weakref.WeakKeyDictionary[torch.optim.Optimizer, tuple[str, str, int]] = weakref.WeakKeyDictionary()
"""Per optimizer, the ``(job, run, steps)`` of the script's own monitor that watched it last
and closed (:func:`sentinel.watch` says once when it is watched again under that run)."""


def release(monitor: Any, opt: torch.optim.Optimizer | None = None) -> None:
    """Forget ``opt`` (or every optimizer and parameter of ``monitor``, and stop holding it)."""
    for o in [o for o, r in list(_by_opt.items()) if r is not None and r() is monitor and (opt is None or o is opt)]:
        del _by_opt[o]
        if opt is None and not monitor.auto:  # closed
            closed_by[o] = (monitor.options.job, monitor.options.run, monitor.steps)
    if opt is None:
        _held.pop(id(monitor), None)
        for pid in [pid for pid, r in _owner.items() if r() is monitor or r() is None]:
            del _owner[pid]


def live_streams() -> list[Any]:
    """The monitors of optimizers that are open, in the order they were made."""
    return [m for m in (r() for r in _streams) if m is not None and not getattr(m, "closed", False)]


def add_stream(monitor: Any) -> None:
    """Record a new monitor of optimizers (its place names its stream), and which live
    monitors had reported already: those belong to an earlier run of the process (a
    notebook cell run again, a script's second experiment), not beside this one."""
    _streams[:] = [weakref.ref(m) for m in live_streams()]
    _before[id(monitor)] = frozenset(id(m) for m in _streams_reported())
    _streams.append(weakref.ref(monitor))
    weakref.finalize(monitor, _before.pop, id(monitor), None)


def _streams_reported() -> list[Any]:
    return [m for m in live_streams() if getattr(m, "stream", None) is not None]


def expect_streams(n: int) -> None:
    """Zero-code mode found ``n`` optimizers alive at its first attach: when more than one,
    its streams are labelled from the first report on (their monitors attach one by one,
    at each optimizer's first step)."""
    global _expected
    _expected = max(_expected, n)


def worker_number() -> int | None:
    """This process's number among the ``multiprocessing`` processes its parent started
    (0 for ``Process-1``), when it trains outside ``torch.distributed``: a Hogwild worker,
    whose frames carry its parent's rank. None in a main process, in a rank of a
    ``torch.distributed`` group (``mp.spawn`` DDP: the group names the rank), in a worker
    of a worker, and past the hundredth."""
    if multiprocessing.parent_process() is None:
        return None
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return None
    ident = multiprocessing.current_process()._identity
    if len(ident) != 1 or not 1 <= ident[0] <= 100:
        return None
    return ident[0] - 1


def stream_label(monitor: Any) -> str:
    """The ``optimizer`` label of ``monitor``'s frames (see :func:`_process_label`); in a
    Hogwild worker, its worker number first: ``"1"`` for the second worker's only
    optimizer, ``"10"`` and ``"11"`` for its two (up to 10 workers with several)."""
    label = _in_worker(_process_label(monitor))
    for m in live_streams():
        if m is not monitor and getattr(m, "stream", None) == label:
            _taken.add(m)
    return label


def _in_worker(label: str) -> str:
    worker = worker_number()
    if worker is None:
        return label
    return str(worker) if not label else f"{worker}{label}" if worker < 10 and len(label) == 1 else label


def restream(monitor: Any) -> str | None:
    """At a step of ``monitor``: when a later monitor took its stream (:func:`stream_taken`)
    and it steps still, it trains beside that one, not before it (a discriminator trained
    alone first, then the generator's optimizer made for the game; SRGAN's generator
    pretrained, then its discriminator's made). Its steps from now on go to a stream of
    their own, the smallest number no live monitor's label holds (``""``, the stream that
    took its label, holds ``"0"``: the history keeps both as the run's first), which this
    returns; None otherwise (one set lookup)."""
    if monitor not in _taken:
        return None
    _taken.discard(monitor)
    live = live_streams()
    held = {getattr(m, "stream", None) for m in live}
    held |= {_in_worker("0") for label in held if label == _in_worker("")}
    return next(label for label in (_in_worker(str(i)) for i in range(len(live) + 2)) if label not in held)


def stream_taken(monitor: Any) -> bool:
    """Whether a monitor made later reports on ``monitor``'s stream (the same label): a
    training of the process after this one's (a distilled student after its teacher, a
    script's second experiment), which the engine took for the stream starting over. This
    one's training is over; what it would still send (at exit, its goodbye) would be read
    as the later one's: a crash's goodbye at the teacher's last step ended the student's
    training, and the student's last report after it opened a third run in the history."""
    return monitor in _taken


def _process_label(monitor: Any) -> str:
    """The ``optimizer`` label of ``monitor``'s frames, decided at its first report and kept.

    Streams run side by side when their monitors were all made before any of them
    reported (a GAN's two ``watch()`` calls), or when zero-code mode found several
    optimizers alive at its first attach. Such a monitor's label is its index in creation
    order among them (``"0"``, ``"1"``, ...), or the smallest number no live monitor's
    label holds when another took that one (a model and optimizer made anew per task
    beside a meta-optimizer: the task's stream is the one the last task's was, the
    meta-optimizer's stays its own); a monitor alone is ``""`` (no label)."""
    live = live_streams()
    if not any(m is monitor for m in live):
        return ""
    if getattr(monitor, "auto", False) and _expected > 1:
        side = [m for m in live if getattr(m, "auto", False)]
    else:
        mine = _before.get(id(monitor), frozenset())
        at = next(i for i, m in enumerate(live) if m is monitor)
        # made before it and unreported then, or made after it (it had not reported yet)
        side = [m for i, m in enumerate(live) if m is monitor or i > at or id(m) not in mine]
        if len(side) < 2:
            return ""
    label = str(next(i for i, m in enumerate(side) if m is monitor))
    taken = {getattr(m, "stream", None) for m in live if m is not monitor}
    return label if label not in taken else next(str(i) for i in range(len(live) + 1) if str(i) not in taken)


def set_fallback(fn: Callable[[torch.optim.Optimizer], Any] | None) -> None:
    """What to do with an optimizer that steps no watched parameter (zero-code: attach).
    ``fn`` returns the monitor it attached, or None to let the optimizer step unwatched and
    be asked again at its next step."""
    global _fallback
    _fallback = fn
    if fn is not None:
        _hook()


def _hook() -> None:
    global _hooked
    if not _hooked:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        register_optimizer_step_pre_hook(_on_step)
        register_optimizer_step_post_hook(_on_post)
        leaving.on_thread_failure = _thread_failed
        _hooked = True


def _thread_failed(thread: threading.Thread, error: BaseException) -> None:
    """A thread ended on ``error``: the monitors whose optimizers last stepped in it are
    closed with it (their goodbye reports the crash now, the process going on; see
    :mod:`.leaving`)."""
    for mon in live_streams():
        if getattr(mon, "stepped_in", None) == thread.ident:
            mon.close(error, thread=thread.name)


_UNSEEN: Any = object()


@eager_only
@profiled.labelled(profiled.STEP)
def reads_ahead(opt: torch.optim.Optimizer, stand_in: type) -> None:
    """A stand-in's ``step()`` begins (:mod:`.outerstep`): ``opt``'s monitor reads the
    gradients now, before the stand-in scales them. Never raises."""
    mon = monitor_of(opt)
    if mon is not None:
        mon.read_ahead(opt, stand_in)


@eager_only
@profiled.labelled(profiled.STEP)
def _on_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
    outer = getattr(_now, "stepping", None)
    if outer is not None and outer is not opt and _steps_inside(opt, outer):
        return None  # part of the outer optimizer's step, which its monitor measures whole
    ref = _by_opt.get(opt, _UNSEEN)
    mon = ref() if ref is not None and ref is not _UNSEEN else None
    if mon is None and ref is not None:  # never seen, or its monitor is gone with its model
        _unwatched(opt)
        mon = monitor_of(opt)
    if mon is not None:
        _now.stepping = opt
        if opt not in _looked:  # its first watched step: called by a wrapper that changes its gradients?
            _looked.add(opt)
            wrapper = outerstep.caller_of(opt)
            if outerstep.is_stand_in(wrapper, opt) and outerstep.follow(wrapper, reads_ahead):
                mon.unread(opt)  # this step's gradients are the wrapper's already
            else:  # Opacus's DPOptimizer: each sample's gradient is clipped before this step
                outerstep.note_clipper(opt, wrapper)
        return mon.step_pre(opt, args, kwargs)  # never raises (the monitor's boundary)
    return None


@eager_only
@profiled.labelled(profiled.STEP)
def _on_post(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    outer = getattr(_now, "stepping", None)
    if outer is not None and outer is not opt:
        return  # an inner optimizer's step ended (its start was left out too)
    _now.stepping = None
    leaving.stepped()  # a sys.exit before this step did not end the script
    mon = monitor_of(opt)
    if mon is not None:
        mon.stepped_in = losses.caller()  # the thread whose failure ends its training
        mon.step_post(opt, args, kwargs)
    else:  # its step took the losses since the last one: no other optimizer's step may count them
        losses.unclaimed()


def _steps_inside(opt: torch.optim.Optimizer, outer: torch.optim.Optimizer) -> bool:
    """Whether ``opt`` steps from inside the watched ``outer``'s ``step()``: the local
    optimizer of a ``ZeroRedundancyOptimizer`` (which steps this rank's shard of the
    parameters, then broadcasts them), any wrapper over its own groups that steps another
    optimizer inside (one that shares its groups is :func:`shared_inner`'s). Its step is the outer
    one's: followed as an optimizer of its own, or in the outer's place, it would count
    the parameters twice or measure only a shard. Learnt once per pair from the stack;
    when ``outer``'s frame is not on it, its ``step()`` raised and its post-hook never ran:
    forgotten."""
    ref = _inner_of.get(opt)
    if ref is not None and ref() is outer:
        return True
    frame: Any = sys._getframe(1)
    for _ in range(64):
        if frame is None:
            break
        if frame.f_locals.get("self") is outer:
            _inner_of[opt] = weakref.ref(outer)
            return True
        frame = frame.f_back
    _now.stepping = None
    return False


def inner(opt: torch.optim.Optimizer) -> torch.optim.Optimizer | None:
    """The optimizer seen stepping inside ``opt``'s ``step()`` (see :func:`_steps_inside`), or None."""
    for o, ref in list(_inner_of.items()):
        if ref() is opt:
            return o
    return None


def stepper(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer whose state and class say what ``opt``'s update is: ``opt``, or, where
    ``opt`` keeps no state of its own and another optimizer steps inside its ``step()`` (a
    ``ZeroRedundancyOptimizer``: its local optimizer, over this rank's shard of the
    parameters, holding the state this rank keeps), that one; before its first step, the
    optimizer it holds as an attribute (the step guard's copy before step 1 needs it)."""
    if opt.state:
        return opt
    found = inner(opt) if _inner_of else None
    if found is None:
        found = _holds(opt)
    return found if found is not None else opt


def _holds(opt: torch.optim.Optimizer) -> torch.optim.Optimizer | None:
    """An optimizer ``opt`` holds as an attribute over groups of its own (not a SAM's base),
    looked for once per optimizer: a stateless one (SGD without momentum) asks at every
    guarded step, and the scan costs 2 µs."""
    ref = _holder_of.get(opt, _UNSEEN)
    if ref is _UNSEEN:
        attrs = getattr(opt, "__dict__", None)
        base = shared_inner(opt) if isinstance(attrs, dict) else None
        found = next((v for v in attrs.values() if isinstance(v, torch.optim.Optimizer) and v is not opt
                      and v is not base), None) if isinstance(attrs, dict) else None
        ref = weakref.ref(found) if found is not None else None
        _holder_of[opt] = ref
    return ref() if ref is not None else None


def held_inside(optimizers: Sequence[torch.optim.Optimizer]) -> set[int]:
    """The ids of those of ``optimizers`` that another of them holds as an attribute (a
    ``ZeroRedundancyOptimizer``'s ``optim``, which it steps from its own ``step()``): parts
    of it, not optimizers of their own. A SAM optimizer's base optimizer, over the SAM's own
    groups, is the one that steps (:func:`shared_inner`), and is not left out."""
    return {id(h) for h in map(_holds, optimizers) if h is not None}


def _owner_of(opt: torch.optim.Optimizer) -> Any:
    """The live monitor whose optimizer ``opt`` takes the place of, or None: one watching
    ``opt``'s first parameter (an optimizer made anew over the same model), or one whose
    optimizer's parameters ``opt`` all holds, whatever it lists first (a fine-tuning
    script's optimizer once it unfreezes its backbone: the backbone first, then the head
    watched so far). Another optimizer that only shares some parameters with a watched one
    (an actor-critic's two optimizers over a shared trunk) steps beside it, not in its place."""
    params = [p for g in opt.param_groups for p in g["params"]]
    ids = {id(p) for p in params}
    seen: dict[int, list[tuple[dict[int, Any], bool]]] = {}  # per monitor: its optimizers' parameters
    for i, p in enumerate(params):
        ref = _owner.get(id(p))
        mon = ref() if ref is not None else None
        if mon is None:
            continue
        if id(mon) not in seen:
            tables = [{id(q): q for g in o.param_groups for q in g["params"]} for o in getattr(mon, "optimizers", ())]
            seen[id(mon)] = [(t, t.keys() <= ids) for t in tables]
        for theirs, within in seen[id(mon)]:
            # the parameter itself (not another that took its id after it was freed)
            if theirs.get(id(p)) is p and (i == 0 or within):
                return mon
    return None


def _replaced_still_held(mon: Any, opt: torch.optim.Optimizer) -> bool:
    """Whether the optimizer of ``mon`` that ``opt`` would take the place of steps parameters
    ``opt`` does not and is still held by the script (one scan of the heap's references):
    two optimizers over a shared trunk, each with its head, stepped in turn on losses of
    their own (a multi-task script's), are two trainings side by side, not one optimizer
    made anew (the last one is then left to its monitor). Taken for one, each step of
    either handed the stream to it, and one stream alternated between the two losses. One
    over all of the old one's parameters takes its place, held or not: an optimizer made
    anew each epoch, a fine-tuning script's once it unfreezes the backbone, a
    physics-informed network's LBFGS after its Adam phase (one stream goes on)."""
    new = {id(p) for g in opt.param_groups for p in g["params"]}
    olds = []
    for o in getattr(mon, "optimizers", ()):
        theirs = {id(p) for g in o.param_groups for p in g["params"]}
        if theirs & new and not theirs <= new:
            olds.append(o)
    return bool(olds) and held_beyond(olds, [mon.optimizers])


def _unwatched(opt: torch.optim.Optimizer) -> None:
    global _failures
    if _failures >= 3:
        return
    try:
        if opt in _waiting and _fallback is not None:  # let wait at its first step: the fallback's alone now
            if _fallback(opt) is not None:
                _waiting.discard(opt)
            return
        if shared_inner(opt) is not None:  # SAM.step(closure): its base optimizer's step is the update
            _by_opt[opt] = None
            return
        mon = _owner_of(opt)
        if mon is not None and not getattr(mon, "closed", True) and not _replaced_still_held(mon, opt):
            mon.adopt(opt)  # claims it: the step goes to it now
        elif _fallback is not None:
            if _fallback(opt) is None:
                _waiting.add(opt)
        else:
            _by_opt[opt] = None  # nobody's: don't look again
    except Exception:
        _failures += 1
        if _failures == 1:
            log.warning("sentinel: could not attach to %s; training continues", type(opt).__name__,
                        exc_info=True)
