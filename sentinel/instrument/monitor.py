"""The monitor: hooks on the optimizers that report one frame per optimizer step."""

from __future__ import annotations

import atexit
import logging
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from sentinel.instrument import losses, preclip, probes, registry
from sentinel.instrument.cadence import Cadence
from sentinel.instrument.capture import InputCapture
from sentinel.instrument.guard import make_guard
from sentinel.instrument.boundary import Boundary
from sentinel.instrument.frames import Report
from sentinel.instrument.layout import Layout
from sentinel.instrument.link import connect
from sentinel.instrument.losses import LossSum
from sentinel.instrument.options import WatchOptions, rank_world
from sentinel.instrument.readback import Readback
from sentinel.instrument.reporting import Reporter, Segs
from sentinel.instrument.scalars import NameBudget, Scalars, to_value
from sentinel.instrument.sender import NullSender, Sender
from sentinel.instrument.staterecord import StateRecord
from sentinel.instrument.timing import BusyClock, ddp_parts

log = logging.getLogger("sentinel")


def _hook(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Hook bodies run without autograd and are never traced by torch.compile."""
    return torch.compiler.disable(torch.no_grad()(fn))


_live: weakref.WeakSet[Monitor] = weakref.WeakSet()
_exit_hooked = False


def _at_exit(mon: Monitor) -> None:
    """Close, at interpreter exit, the monitors a script never closed (their last report,
    the goodbye frame); zero-code mode's own are closed by :func:`sentinel.instrument.auto.close_all`."""
    global _exit_hooked
    if mon.auto:
        return
    if not _exit_hooked:
        _exit_hooked = True
        atexit.register(_close_live)
    _live.add(mon)


def _close_live() -> None:
    for mon in list(_live):
        try:
            mon.close()
        except Exception:  # at exit: nothing may raise
            pass


class _HandUpdated:
    """The parameters of a script that updates them by hand, as the one param group the
    layout groups them by (never stepped, never described as an optimizer)."""

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        self.param_groups = [{"params": list(params)}]


class _Unhook:
    """Stops handing an optimizer's steps to its monitor."""

    def __init__(self, monitor: Monitor, opt: torch.optim.Optimizer) -> None:
        self.monitor, self.key = monitor, id(opt)

    def remove(self) -> None:
        for table in (self.monitor._pres, self.monitor._posts, self.monitor._states):
            table.pop(self.key, None)


class TrainingHalted(RuntimeError):
    """Raised at the next optimizer step (before any weight changes) after an alert that the
    config's ``actions.stop_on`` names has fired, so the script can checkpoint and exit."""


class Monitor(Reporter):
    """A handle on one watched training loop. Use :func:`watch` to make one.

    Call :meth:`log` with the loss each step; :meth:`close` (or leaving a ``with`` block)
    removes every hook, flushes the last report and stops the embedded engine.

    Args:
        model: the module whose parameter names define the groups (may be None).
        optimizers: the real optimizers (see :func:`~sentinel.instrument.registry.unwrap`).
        options: see :class:`~sentinel.instrument.options.WatchOptions`.
        sender: where frames go (default: the engine :func:`~sentinel.instrument.link.connect` finds).
        auto: made by zero-code mode; an explicit :func:`watch` of its optimizer replaces it.
        loss_sum: with ``capture_loss``, the losses summed since before this monitor existed
            (zero-code mode's, from the start of the process).
        hand: parameters a script updates by hand, without an optimizer (zero-code mode):
            a step per ``backward()``, its gradients read right after it.
    """

    def __init__(self, model: torch.nn.Module | None, optimizers: Sequence[torch.optim.Optimizer],
                 options: WatchOptions, sender: Sender | None = None, *, scaler: Any = None,
                 on_alert: Callable[[dict[str, Any]], None] | Sequence[Callable[[dict[str, Any]], None]] = (),
                 auto: bool = False, loss_sum: LossSum | None = None,
                 hand: Sequence[torch.Tensor] | None = None) -> None:
        self.options = o = options
        self._hand = _HandUpdated(hand) if hand is not None else None
        self._hand_read = False  # gradients of a backward() read, its step not ended yet
        self.optimizers = list(optimizers)
        self.stream: str | None = None
        """The ``optimizer`` label of this monitor's stream, set at its first report
        (:func:`registry.stream_label`; ``""``: the process's only stream)."""
        self.scaler = scaler
        self.auto = auto
        self.on_alert = [on_alert] if callable(on_alert) else list(on_alert)
        self.active = True
        """False for the inert monitor :func:`watch` returns when it cannot watch."""
        self._halt: str | None = None
        self.boundary = Boundary(o.max_errors)
        self.cadence = Cadence(o.update_every, o.early_steps, o.health_every)
        self.rank, self.world = rank_world()
        self.steps = 0
        self.probe_seconds = 0.0
        """Wall time spent inside sentinel's hooks and ``log`` (host side), cumulative."""
        self.url: str | None = None
        self.engine: Any = None
        self.closed = False
        self._handles: list[Any] = []
        self._opt_handles: list[list[Any]] = []
        self._pres: dict[int, Callable[..., Any]] = {}
        self._posts: dict[int, Callable[..., Any]] = {}
        self._states: dict[int, Any] = {}  # each optimizer's state dict, to see a load_state_dict
        self._readback = Readback(o.max_pending, on_drop=self._count_drop)
        self._report_drops = 0
        self._last_step_time: float | None = None
        self._record = StateRecord(self.boundary, o)
        self._contributed: set[int] = set()
        self._segs: Segs = {}
        self._open: tuple[Report, Segs, Scalars] | None = None  # finalized, waiting for log()
        self._pending = Scalars()  # logged while no report was open: the coming step's
        self._backwards_at_step = self._backwards_at_log = -1  # losses.backward_calls then
        self._logs = 0  # log() calls so far: a script that never logs never makes a report wait
        self._names = NameBudget()
        self._meta_groups: set[int] = set()
        self._grad_count = 0
        self._clip_max: float | None = None
        self._closure_done: dict[int, bool] = {}  # optimizer k stepping with a closure: read yet?
        self._losses = (loss_sum or LossSum()) if o.capture_loss else None
        losses.install()  # counts backward() calls: which step a log() belongs to
        losses.backward_listeners.add(self)  # a backward() ends the wait for a log() of the last step
        _at_exit(self)

        outer, inner, self.ddp = ddp_parts(model, self.world)
        # a DDP wrapper's names start with "module."; the groups come from the wrapped model's
        self._names_by_id = {id(p): n for n, p in inner.named_parameters()} if inner is not None else {}
        self.capture = InputCapture(outer, lambda: self.steps, self.rank, self.boundary)  # hooks once armed
        self._relayout()
        if sender is None:
            sender, self.engine, self.url = connect(o)
        self.sender: Sender = sender
        if self.optimizers:
            registry.add_stream(self)
        self.guard = make_guard(self)  # issue 21: the step guard (opt-in); None when off, nothing hooked
        try:
            for k, opt in enumerate(self.optimizers):
                self._opt_handles.append(self._hook_optimizer(k, opt))
            self._handles.append(preclip.attach(self.note_clip))
            # busy time: data loading plus forward compute, before the step's gradient sync
            self._busy = BusyClock(outer, inner) if outer is not None else None
            if self._busy is not None:
                self._handles += self._busy.handles
        except Exception:  # leave nothing behind: no hook, no engine process
            self.close()
            raise

    @classmethod
    def inert(cls, options: WatchOptions, reason: str) -> Monitor:
        """A monitor that watches nothing (what :func:`watch` returns when it cannot watch)."""
        mon = cls(None, [], options, NullSender())
        mon.close()  # detaches what construction attached (the clip listener)
        mon.active = False
        mon.boundary.errors = 1
        mon.reason = reason
        return mon

    reason = ""
    """Why this monitor is inert (empty while it is active)."""

    # -- public ---------------------------------------------------------------------------

    def log(self, loss: Any = None, *, step: int | None = None, **scalars: Any) -> None:
        """Record the loss and any other scalars for the current step.

        Values are numbers or one-element tensors; tensors are read back without a host
        sync, and values appear in the step's frame. Other names are exported as
        ``sentinel_scalar{name=...}``. A bad value or name is dropped and counted.

        Which step a value belongs to: called after ``optimizer.step()`` with no
        ``backward()`` in between, the step just taken; called after a ``backward()``
        (before the step, or for the next micro-batch), the coming step. Values logged
        for one step (each micro-batch of an accumulation window) are averaged. With a
        ``GradScaler``, a value logged when no step was taken (a step the scaler skipped)
        is reported at once, at the last step's number.

        Args:
            loss: the loss (a number or a one-element tensor).
            step: the step the values belong to, for a framework that computes them
                after the step's report left (e.g. the HF Trainer's ``on_log``);
                default: as above.
            **scalars: more values by name.

        Never raises.
        """
        if not self.active:
            return
        t0 = time.perf_counter()
        if loss is not None:
            scalars["loss"] = loss
        self.boundary.run("log", self._log, scalars, step)
        self.probe_seconds += time.perf_counter() - t0

    def sync_step(self, step: int) -> None:
        """Continue counting from ``step`` (the next optimizer step reports ``step + 1``),
        e.g. for a framework that resumed at its global step."""
        if self.active and step >= 0:
            self.steps = int(step)

    def close(self, error: BaseException | None = None) -> None:
        """Remove the hooks, flush pending reports and stop the embedded engine. Idempotent.

        Args:
            error: the exception ending training, if one is; the goodbye frame names its
                type (only the type: messages may hold anything) so the engine reports a
                crash rather than a finished run.
        """
        if self.closed:
            return
        self.closed = True
        for h in self._handles + [h for hs in self._opt_handles for h in hs]:
            h.remove()
        self._handles.clear()
        self._opt_handles.clear()
        registry.release(self)
        losses.backward_listeners.discard(self)
        if self._losses is not None:
            self._losses.close()
        if self._hand_read:  # the last backward()'s step
            self._hand_read = False
            self.boundary.run("report", self._finalize)
        if self.guard is not None:  # the guard: the last verdicts reach the engine
            self.boundary.run("guard", self.guard.flush)
        self.boundary.run("report", self._submit_open)
        self.boundary.run("emit", self._emit_ready, True)
        bye = self._frame("bye", self.steps, time.time())
        if error is not None and not isinstance(error, TrainingHalted) and not (
                isinstance(error, SystemExit) and error.code in (0, None)):
            bye.exc = type(error).__name__
        self.boundary.run("emit", self._send, bye)
        self.boundary.run("emit", self.sender.close)  # delivers any backlog while the engine still listens
        if self.engine is not None:
            self.boundary.run("engine", self.engine.stop)
            self.boundary.run("messages", self._messages)  # the last alerts reach on_alert too
        self.boundary.run("capture_close", self.capture.close)  # pending batch files are written

    def before_backward(self, loss: Any = None) -> None:
        """At a ``backward()``: a report still waiting for ``log()`` gets nothing more (a value
        logged from now on is the coming step's), so it goes out now; with parameters
        updated by hand, the last backward()'s step ends here. Never raises."""
        if self.closed:
            return
        if self._hand_read:
            self._hand_read = False
            self.boundary.run("report", self._finalize)
        if self._open is not None:
            self.boundary.run("report", self._submit_open)

    def replay_first(self, params: Sequence[torch.Tensor], norms: torch.Tensor,
                     clip: tuple[torch.Tensor, float] | None = None) -> None:
        """With parameters updated by hand, found at the second ``backward()``: report the
        first one's step from the gradient norms taken right after it (``norms``, per
        parameter, on the device), its loss and its clip."""
        grouped = self.layout.tensors[0]
        group_of = {id(p): g for b in grouped.buckets.values() for p, g in zip(b.params, b.groups)}
        pos = [(i, group_of[id(p)]) for i, p in enumerate(params) if id(p) in group_of]
        if pos:
            vec = torch.zeros(max(1, grouped.n_groups), dtype=torch.float32, device=norms.device)
            idx = torch.tensor([g for _, g in pos], dtype=torch.long, device=norms.device)
            vec.index_add_(0, idx, norms[[i for i, _ in pos]].to(torch.float32).square())
            self._add("grad_sumsq", {norms.device: vec})
        self._hand_read = True
        if clip is not None:
            self.note_clip(*clip)
        self._hand_read = False
        self.boundary.run("report", self._finalize)

    def after_backward(self) -> None:
        """With parameters updated by hand: read the gradients this ``backward()`` left."""
        if self._hand is not None and not self.closed:
            t0 = time.perf_counter()
            with torch.no_grad():
                self.boundary.run("grad", self._grad_stats, 0, self.steps + 1)
            self._hand_read = True
            self.probe_seconds += time.perf_counter() - t0

    def request_stop(self, reason: str) -> None:
        """Make the next optimizer step raise :class:`TrainingHalted` (the stop action)."""
        if self._halt is None:
            self._halt = reason

    def note_clip(self, total_norm: torch.Tensor, max_norm: float) -> None:
        """Record the total gradient norm that ``clip_grad_norm_`` computed before clipping
        (called by :mod:`sentinel.instrument.preclip`). The tensor is read back with the
        coming step's report, never here. Never raises."""
        if self.active:
            self.boundary.run("clip", self._note_clip, total_norm, max_norm)

    def adopt(self, opt: torch.optim.Optimizer) -> None:
        """Follow ``opt``, a new optimizer over parameters this monitor watches (one
        re-created mid-run), in place of the one it replaces; the step count goes on."""
        new = {id(p) for g in opt.param_groups for p in g["params"]}
        k = next((i for i, old in enumerate(self.optimizers)
                  if any(id(p) in new for g in old.param_groups for p in g["params"])), len(self.optimizers))
        old_name = type(self.optimizers[k]).__name__ if k < len(self.optimizers) else "none"
        if k < len(self.optimizers):
            for h in self._opt_handles[k]:
                h.remove()
            registry.release(self, self.optimizers[k])
            self.optimizers[k] = opt
            self._opt_handles[k] = self._hook_optimizer(k, opt)
        else:
            self.optimizers.append(opt)
            self._opt_handles.append(self._hook_optimizer(k, opt))
        self._contributed.discard(k)
        self._relayout()
        log.warning("sentinel: a new %s steps the watched parameters (in place of %s): following it; "
                    "steps continue from %d", type(opt).__name__, old_name, self.steps)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, kind: object, error: BaseException | None, tb: object) -> None:
        self.close(error)

    @property
    def errors(self) -> int:
        """Exceptions caught inside probes so far."""
        return self.boundary.errors

    # -- hooks ----------------------------------------------------------------------------

    def _hook_optimizer(self, k: int, opt: torch.optim.Optimizer) -> list[Any]:
        # the registry's global step hooks hand this optimizer's steps to step_pre/step_post:
        # nothing is registered on the optimizer, so nothing of ours is pickled with it
        self._pres[id(opt)] = _hook(self._make_pre(k))
        self._posts[id(opt)] = _hook(self._make_post(k))
        self._states[id(opt)] = opt.state
        registry.claim(self, opt, [p for g in opt.param_groups for p in g["params"]])
        return [_Unhook(self, opt)]

    def step_pre(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
        """The registry's global step pre-hook, for an optimizer this monitor watches."""
        fn = self._pres.get(id(opt))
        if fn is None:
            return None
        if opt.state is not self._states.get(id(opt)):  # load_state_dict gives it new state
            self._states[id(opt)] = opt.state
            self._record.due = True
        return fn(opt, args, kwargs)

    def step_post(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """The registry's global step post-hook, for an optimizer this monitor watches."""
        fn = self._posts.get(id(opt))
        if fn is not None:
            fn(opt, args, kwargs)

    def _relayout(self) -> None:
        o = self.options
        stepped: list[Any] = list(self.optimizers) or ([self._hand] if self._hand is not None else [])
        self.layout = Layout(self._names_by_id, stepped, self.rank, o.group_depth, o.max_groups,
                             o.update_snapshot_bytes)
        self.groups, self.sharded, self.devices = self.layout.groups, self.layout.sharded, self.layout.devices
        self.param_bytes = self.layout.param_bytes
        self._record.due = True
        if self._opt_handles:  # parameters added to an optimizer are watched ones now
            for opt in self.optimizers:
                registry.claim(self, opt, [p for g in opt.param_groups for p in g["params"]])

    def _make_pre(self, k: int) -> Callable[..., Any]:
        def pre(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
            t0 = time.perf_counter()
            self.boundary.run("messages", self._messages)
            if self.guard is not None:  # the guard: act on read-back verdicts (halt, host-side restores)
                self.boundary.run("guard", self.guard.before_step, k)
            if self._halt is not None:  # opt-in stop action: deliberately raised into the loop
                raise TrainingHalted(self._halt)
            if self._open is not None:  # no log() since the last step: send it without a loss
                self.boundary.run("report", self._submit_open)
            if k in self._contributed:  # this optimizer steps again: a new report begins
                self.boundary.run("report", self._finalize)
            step = self.steps + 1
            if not self._contributed:  # the step's first optimizer
                self.boundary.run("cadence", self.cadence.begin, step, self.optimizers)
                if self.boundary.run("layout", self.layout.changed, self.optimizers, self.cadence.update_due(step)):
                    self.boundary.run("layout", self._relayout)
            out = self.boundary.run("grad", self._closure_aware, k, step, args, kwargs)
            if self.cadence.update_due(step):
                self.boundary.run("update", self.layout.snapshots[k].take)
            self.probe_seconds += time.perf_counter() - t0
            return out
        return pre

    def _closure_aware(self, k: int, step: int, args: Any, kwargs: Any) -> Any:
        """Read the gradients now, or, when ``step`` was given a closure (Lightning's
        automatic optimization, LBFGS), right after the closure's first call inside
        ``step()``: the gradients the optimizer applies. The plain loop pays nothing."""
        # torch passes step()'s own arguments, the optimizer first: (opt, closure?)
        closure = kwargs.get("closure") if "closure" in kwargs else (args[1] if len(args) > 1 else None)
        if not callable(closure):
            self._guard_grads(k, step, self._grad_stats(k, step))
            return None
        self._closure_done[k] = False

        def closure_then_read(*a: Any, **kw: Any) -> Any:
            out = closure(*a, **kw)
            if not self._closure_done.get(k, True):
                self._closure_done[k] = True
                with torch.no_grad():
                    self._guard_grads(k, step, self.boundary.run("grad", self._grad_stats, k, step))
                if self._losses is not None:
                    self._losses.freeze()  # LBFGS re-evaluates: the first loss is the step's
            return out

        if "closure" in kwargs:
            return args, {**kwargs, "closure": closure_then_read}
        return (args[0], closure_then_read, *args[2:]), kwargs

    def _make_post(self, k: int) -> Callable[..., None]:
        def post(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            t0 = time.perf_counter()
            step = self.steps + 1
            if self.guard is not None:  # the guard: undo a skipped step
                self.boundary.run("guard", self.guard.after_step, k, opt)
            if self._closure_done.pop(k, True) is False:  # the optimizer never called the closure
                self.boundary.run("grad", self._grad_stats, k, step)
            if self.cadence.update_due(step):
                self.boundary.run("update", self._update_stats, k)
                self.boundary.run("param", self._param_stats, k)
            self._contributed.add(k)
            if len(self._contributed) == len(self.optimizers):
                self.boundary.run("report", self._finalize)
            self.probe_seconds += time.perf_counter() - t0
        return post

    # -- probes ---------------------------------------------------------------------------

    def _add(self, name: str, per_device: dict[torch.device, torch.Tensor]) -> None:
        for dev, t in per_device.items():
            segs = self._segs.setdefault(dev, {})
            segs[name] = segs[name] + t if name in segs else t

    def _grad_stats(self, k: int, step: int) -> dict[torch.device, torch.Tensor]:
        grouped = self.layout.tensors[k]
        sums, l1, count = grouped.grad_sums(l1=self.cadence.health_due(step))
        if not sums:  # read, and no parameter has a gradient: a norm of 0, said so
            sums = {torch.device("cpu"): torch.zeros(max(1, grouped.n_groups))}
        self._add("grad_sumsq", sums)
        if count:
            self._add("grad_l1", {d: t.sum().reshape(1) for d, t in l1.items()})
            self._grad_count += count
        return sums

    def _guard_grads(self, k: int, step: int, sums: dict[torch.device, torch.Tensor] | None) -> None:
        """The guard judges the step from the sums just read (issue 21)."""
        if self.guard is not None and sums is not None:
            clip_norm = next((s["clip_norm"] for s in self._segs.values() if "clip_norm" in s), None)
            self.boundary.run("guard", self.guard.after_grads, k, self.optimizers[k], step, sums, clip_norm)

    def _update_stats(self, k: int) -> None:
        snap = self.layout.snapshots[k]
        for name, sums in snap.measure().items():  # ‖Δw‖ and the seed's UAR (deltas.py)
            self._add(name, sums)
        self._meta_groups |= snap.groups

    def _note_clip(self, total_norm: torch.Tensor, max_norm: float) -> None:
        for segs in self._segs.values():  # clipped twice before a step: the last one counts
            segs.pop("clip_norm", None)
        t = total_norm.detach().reshape(1).to(torch.float32)
        if self._hand_read:  # read at backward(), before this clip: scale as torch scaled the gradients
            coef = torch.clamp(float(max_norm) / (t + 1e-6), max=1.0).square()
            for segs in self._segs.values():
                if "grad_sumsq" in segs:
                    segs["grad_sumsq"] = segs["grad_sumsq"] * coef.to(segs["grad_sumsq"].device)
        self._segs.setdefault(t.device, {})["clip_norm"] = t
        self._clip_max = float(max_norm)

    def _param_stats(self, k: int) -> None:
        self._add("param_sumsq", self.layout.tensors[k].param_sumsq())

    def _finalize(self) -> None:
        """Close the current report: add host-side values and start its readback."""
        self._contributed.clear()
        self.steps += 1
        o, now = self.options, time.time()
        frame = self._frame("step", self.steps, now)
        frame.groups, frame.lr = self.groups, self.cadence.lrs  # read as the step began
        report = Report(frame)
        if o.tags and (self.steps == 1 or self.steps % o.tags_every == 0):
            frame.tags = o.tags
        if self.steps == 1:  # the history's record of what ran (engine side)
            frame.cmd = " ".join(sys.argv)[:1000]
        peaks = probes.schedule_peaks(self.optimizers)
        if peaks is not None:
            frame.lr_peak = peaks
        if self._last_step_time is not None:
            frame.step_seconds = now - self._last_step_time
        self._last_step_time = now
        busy = self._busy.step_done() if self._busy is not None else None
        if busy is not None:
            frame.busy_seconds = busy
        if self.ddp:
            frame.ddp = True
        if self._grad_count:
            frame.grad_count, self._grad_count = self._grad_count, 0
        if self._clip_max is not None:
            frame.clip_max, self._clip_max = self._clip_max, None
        if self._meta_groups:
            report.delta_groups = sorted(self._meta_groups)
            self._meta_groups = set()
        self._record.add_to(report, self._add, self.steps, self.optimizers, self.layout, self.devices)
        if self.steps % o.memory_every == 0 or self.steps == 1:
            mem = self.boundary.run("memory", self._memory)
            if mem:
                frame.mem = mem
        if self._open is not None:
            self._submit_open()
        scalars, self._pending = self._pending, Scalars()  # logged before this step's end: its own
        loss_in = False  # captured at backward(): nothing more comes for this step's loss
        if self._losses is not None:
            if self.scaler is None:
                self.scaler = losses.scaler()  # the GradScaler the script uses, once it scaled a loss
            captured = self._losses.claim()
            if captured is not None and "loss" not in scalars:
                scalars.add("loss", captured)
                loss_in = True
        logged_last = bool(scalars) and self._backwards_at_log == losses.backward_calls
        self._open, self._segs = (report, self._segs, scalars), {}
        self._backwards_at_step = losses.backward_calls
        # send it now when nothing more is coming: zero-code mode, the loss in (captured at
        # backward(), or logged before the step), a script that has not logged by its
        # second step (it never waits for a log() again), or values logged after the
        # step's last backward(); else at the next log(), backward() or step
        if self.auto or logged_last or loss_in or (not self._logs and self.steps > 1):
            self._submit_open()

    def _log(self, scalars: dict[str, Any], step: int | None) -> None:
        self._logs += 1
        values = Scalars()
        for name, v in scalars.items():
            value = to_value(v) if self._names.admit(name) else None
            if value is None:
                if name in self._names.names:
                    self._names.dropped += 1  # a known name with a bad value
                continue
            values.add(name, value)
        report = self._open
        if step is not None and (report is None or report[0].frame.step != step):
            if 0 < step <= self.steps:  # a step whose report has left: its own frame
                self._submit(Report(self._frame("log", int(step), time.time())), {}, values)
            return
        # the common loop logs right after the step: ride on that step's report (one frame)
        if report is not None and report[0].frame.step == self.steps:
            if step is not None or losses.backward_calls == self._backwards_at_step:
                report[2].merge(values)
                self._submit_open()
                return
            self._submit_open()  # a backward() since the step: these values are the next step's
        elif (report is None and self.steps > 0 and step is None and not self._pending
              and losses.backward_calls == self._backwards_at_step):
            # right after a step whose report has left (the first of a loop that logs after
            # the step): the values are that step's, in a frame of their own
            self._submit(Report(self._frame("log", self.steps, time.time())), {}, values)
            return
        if self.scaler is not None and not self._pending:
            # with a GradScaler, an iteration without an optimizer step is a step the scaler
            # skipped: report it at once, so the loss and the scale of skipped steps show
            self._submit(Report(self._frame("log", self.steps, time.time())), {}, values)
            return
        self._pending.merge(values)  # before the step (gradient accumulation): the coming step's
        self._backwards_at_log = losses.backward_calls
