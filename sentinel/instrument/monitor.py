"""The monitor: hooks on the optimizers that report one frame per optimizer step.

A :class:`Monitor` is composed of parts, each with its own small interface: its
:class:`~sentinel.instrument.hooks.Hooks` (what is hooked), its
:class:`~sentinel.instrument.measure.Measure` (what is measured per step) and its
:class:`~sentinel.instrument.reporter.Reporter` (what is sent, and what the engine says back).
The monitor itself holds the step count and decides, at each optimizer step, which part
does what."""

from __future__ import annotations

import gc
import logging
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from sentinel import wire
from sentinel.instrument import (
    games,
    hidden,
    leaving,
    loaders,
    losses,
    notebook,
    outerstep,
    preclip,
    profiled,
    registry,
    replaced,
    rewrites,
    whereabouts,
)
from sentinel.instrument.boundary import Boundary
from sentinel.instrument.cadence import Cadence
from sentinel.instrument.capture import InputCapture
from sentinel.instrument.frames import Report
from sentinel.instrument.guard import make_guard
from sentinel.instrument.hooks import Hooks, StepHook, close_at_exit
from sentinel.instrument.layout import Layout
from sentinel.instrument.link import EngineShare, connect
from sentinel.instrument.losses import LossSum
from sentinel.instrument.measure import HandUpdated, Measure
from sentinel.instrument.naming import parameter_names
from sentinel.instrument.optinfo import resumed_step
from sentinel.instrument.options import WatchOptions, rank_world
from sentinel.instrument.raised import raised
from sentinel.instrument.reporter import Reporter
from sentinel.instrument.resets import Resets
from sentinel.instrument.sender import NullSender, Sender
from sentinel.instrument.staterecord import StateRecord
from sentinel.instrument.timing import BusyClock, Heartbeat, ddp_parts

log = logging.getLogger("sentinel")


class TrainingHalted(RuntimeError):
    """Raised at the next optimizer step (before any weight changes) after an alert that the
    config's ``actions.stop_on`` names has fired, so the script can checkpoint and exit."""


class Monitor:
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

    step_pre: StepHook
    """The registry's global step pre-hook, for an optimizer this monitor watches
    (:meth:`Hooks.step_pre <sentinel.instrument.hooks.Hooks.step_pre>`, bound once)."""
    step_post: StepHook
    """The registry's global step post-hook, for an optimizer this monitor watches."""
    layout: Layout
    """What the optimizers step now, grouped (built anew when that changes)."""

    def __init__(self, model: torch.nn.Module | None, optimizers: Sequence[torch.optim.Optimizer],
                 options: WatchOptions, sender: Sender | None = None, *, scaler: Any = None,
                 on_alert: Callable[[dict[str, Any]], None] | Sequence[Callable[[dict[str, Any]], None]] = (),
                 auto: bool = False, loss_sum: LossSum | None = None,
                 hand: Sequence[torch.Tensor] | None = None) -> None:
        self.options = o = options
        self._hand = HandUpdated(hand) if hand is not None else None
        self.optimizers = list(optimizers)
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
        self._stepped_in: int | None = losses.caller()
        self._record = StateRecord(self.boundary, o)
        self._farewell: weakref.finalize[Any, Any] | None = None
        self._adopted = 0  # optimizers made anew over the watched parameters, followed (adopt)
        self._counted = False  # the first step has looked for a resumed optimizer's count
        self._contributed: set[int] = set()  # the optimizers that stepped in the current step
        self._calls_at_post = 0  # losses.calls() at the last optimizer step's end
        self._losses = (loss_sum or LossSum()) if o.capture_loss else None
        self._resets = Resets(self.optimizers)  # a loop that never resets its gradients (no zero_grad())
        first = next((p for g in self.optimizers[0].param_groups for p in g["params"] if p.requires_grad),
                     None) if self.optimizers else None
        if self._losses is not None:
            self._losses.thread = self._stepped_in  # its training's, not another thread's (stepped_in)
            if first is not None:  # its gradient tells a pass whose gradients were thrown away
                self._losses.watch(first)
        # its gradient tells a game's players apart (a GAN's): where each one's loss reaches
        self._player = games.Player(first, (p for opt in self.optimizers for g in opt.param_groups for p in g["params"])
                                    ) if self.optimizers and o.game is not False else None
        if self._player is not None and o.game:
            self._player.adversarial = True
        losses.install()  # counts backward() calls: which step a log() belongs to
        loaders.install()  # an evaluation's batches are heartbeats (an EMA copy's too)
        notebook.watch(self)  # a Jupyter kernel waiting for its next cell is no stall
        whereabouts.watch(self)  # where the training thread waits, once no step comes
        rewrites.install()  # weights the script sets itself (a rewind, a pruning) restart the loss's baselines
        self._rewrite: wire.Rewrite | None = None  # how the script set the watched weights since the last step
        close_at_exit(self)

        outer, inner, self.ddp = ddp_parts(model, self.world)
        self.measure = Measure(self.boundary, self.cadence, self.optimizers, o.memory_capacity_bytes, self.ddp)
        self.measure.heartbeat = Heartbeat(o.heartbeat_seconds, self._beat)
        self.hooks = Hooks(self.boundary, self._record, self.measure, self._losses)
        self.step_pre, self.step_post = self.hooks.step_pre, self.hooks.step_post
        # a DDP wrapper's names start with "module."; the groups come from the wrapped model's
        # (and from the other modules the optimizers step parameters of: a seq2seq's decoder)
        # (and the loose tensors no module holds: an optimized image, SAC's log_alpha)
        self._names_by_id, self._loose = parameter_names(inner, self.optimizers)
        # a module of the model replaced after the optimizer was made (replaced.py): looked for once
        self._replaced: weakref.ref[torch.nn.Module] | None = (
            weakref.ref(inner) if inner is not None and self._loose and self.optimizers else None)
        # requires_grad by parameter id, as an optimizer showed it at its own step, when it
        # no longer matched the layout: taken into the next one (layout.py)
        self._seen: dict[int, dict[int, bool]] = {}
        self.capture = InputCapture(outer, lambda: self.steps, self.rank, self.boundary)  # hooks once armed
        self._new_layout()
        if sender is None:
            sender, self.engine, self.url = connect(o)
            if self.sharded and self.world > 1 and isinstance(self.engine, EngineShare):
                log.warning("sentinel: this rank's own engine sees only its shards of a model sharded over %d ranks, "
                            "so the whole model's gradient and parameter norms are never assembled; run the job "
                            "under `sentinel run -- torchrun ...` (or give the ranks a node daemon's "
                            "SENTINEL_SOCKET) for them", self.world)
        # an engine shared with the process's other monitors gives each alert to all their callbacks
        alerts = self.engine.callbacks(self.on_alert) if isinstance(self.engine, EngineShare) else self.on_alert
        self.reporter = Reporter(o, self.boundary, self.rank, self.world, sender, self.engine, self.capture,
                                 alerts, self.request_stop, self._stream_label, self._losses, self.layout,
                                 scaler=scaler, auto=auto, passes_averaged=self._passes_averaged,
                                 restream=self._restream)
        self.reporter.player = self._player
        losses.backward_listeners.add(self)  # a backward() ends the wait for a log() of the last step
        if self.optimizers:
            registry.add_stream(self)
        elif hand is not None:
            registry.claim_hand(self, hand)  # one monitor of them: zero-code's gives way to watch's
        self.guard = make_guard(self)  # issue 21: the step guard (opt-in); None when off, nothing hooked
        self.measure.guard = self.reporter.guard = self.guard
        try:
            for k, opt in enumerate(self.optimizers):
                self.hooks.opt_handles.append(self._hook_optimizer(k, opt))
            self.hooks.handles.append(preclip.attach(self.note_clip))
            # busy time: data loading plus forward compute, before the step's gradient sync
            # (not of a scripted model: it takes no hook; its loop's steps are watched all the same)
            if outer is not None and hidden.hookable(outer) and hidden.hookable(inner):
                self.measure.busy = BusyClock(outer, inner)
                self.measure.busy.heartbeat = self.measure.heartbeat  # a forward between steps beats it
                self.hooks.handles += self.measure.busy.handles
            # what keeps this monitor alive (Sentinel's tables hold it weakly): zero-code
            # mode's, the model it watches (its hooks hold the clock, the clock holds this),
            # so a script that drops a model and its optimizer gets their memory back;
            # a script's own monitor, and one with no model, Sentinel until it closes
            if auto and self.measure.busy is not None:
                self.measure.busy.owner = self
                # collected with its model, unclosed: the stream's goodbye still goes out
                self._farewell = weakref.finalize(self, self.reporter.farewell)
                self._farewell.atexit = False  # at exit, auto.close_all closes it (its last reports too)
                # the model dropped (a sweep's trial, a fold): its training is over, and what
                # this monitor holds of it goes now, as without Sentinel (_model_gone)
                _when_gone(self, inner)
            else:
                registry.hold(self)
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

    @profiled.labelled(profiled.LOG)
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
            step: the optimizer step (counted from 1) the values belong to, for a
                framework that computes them after the step's report left (e.g. the HF
                Trainer's ``on_log``); default: as above. A number that names no step
                taken yet but the coming one (a count of batches or samples) is treated
                as no ``step`` (one warning says so): the values are never dropped.
            **scalars: more values by name.

        Never raises.
        """
        if not self.active or self.closed:  # after close(): its training's goodbye has gone out
            return
        t0 = time.perf_counter()
        if loss is not None:
            scalars["loss"] = loss
        self.boundary.run("log", self.reporter.log, scalars, step, self.steps)
        self.probe_seconds += time.perf_counter() - t0

    def heartbeat(self) -> None:
        """Say that this rank is working although it takes no optimizer step, for a long
        loop that runs none of the watched model's forward passes (an evaluation of
        another model, generation through a wrapper, a long checkpoint upload). Cheap
        enough to call per batch: at most one frame per ``heartbeat_seconds`` leaves.

        The watched model's own evaluation forwards (``eval()`` mode or gradients off) and
        the ``DataLoader`` batches drawn with gradients off beat it already, so a plain
        evaluation loop needs no call. While beats come, ``TrainingStalled`` measures the
        silence from the run's last one rather than from the last step. Never raises.
        """
        if self.active and not self.closed and self.measure.heartbeat is not None:
            self.measure.heartbeat(time.perf_counter())

    def sync_step(self, step: int) -> None:
        """Continue counting from ``step`` (the next optimizer step reports ``step + 1``),
        e.g. for a framework that resumed at its global step."""
        if self.active and step >= 0:
            self.steps = int(step)

    def close(self, error: BaseException | None = None, *, thread: str | None = None) -> None:
        """Remove the hooks, flush pending reports and stop the embedded engine. Idempotent.

        Args:
            error: the exception ending training, if one is; the goodbye frame names its
                type and the script's line it came through (never its message: messages
                may hold anything; :mod:`sentinel.instrument.raised`) so the engine reports
                a crash rather than a finished run.
            thread: the name of the thread the training ran in, when ``error`` ended that
                thread and the process goes on (:mod:`sentinel.instrument.leaving`).
        """
        if self.closed:
            return
        self.closed = True
        taken = registry.stream_taken(self)  # its stream is a later training's: it sends nothing more
        if self._farewell is not None:
            self._farewell.detach()  # the goodbye goes out below
        self.hooks.remove()
        registry.release(self)
        losses.backward_listeners.discard(self)
        if self._losses is not None:
            self._losses.close()
        if taken:
            pass  # no last report: its steps were reported, and what came since is the later training's
        elif self.measure.hand_read:  # the last backward()'s step
            self.measure.hand_read = False
            self.boundary.run("report", self._finalize)
        elif self._contributed:  # the last step, where not every optimizer stepped (a phase's, a critic's)
            self.boundary.run("report", self._finalize, self._calls_at_post)
        if self._player is not None:
            self._player.leave()
        if self.guard is not None:  # the guard: the last verdicts reach the engine, nothing of it stays on an optimizer
            self.boundary.run("guard", self.guard.flush)
        status = 0 if error is None or isinstance(error, TrainingHalted) else leaving.exit_status(error)
        # a sys.exit's status is the process's own (sys.exit(3): 3); any other exception's is 1
        self.reporter.close(self.steps, raised(error, leaving.place(error)) if status and error is not None else None,
                            status if status and isinstance(error, SystemExit) else None, thread, silent=taken)
        self.boundary.run("capture_close", self.capture.close)  # pending batch files are written

    @property
    def stepped_in(self) -> int | None:
        """The thread of its training (``threading.get_ident``): the one that made it, then
        the one its optimizers last stepped in (the registry sets it). A ``backward()`` of
        another thread is another training's (Optuna's ``n_jobs`` trials, each a thread with
        a model of its own): the monitor must not read this training's gradients from there,
        while this thread's autograd may be writing them (the race corrupted the heap:
        ``free(): corrupted unsorted chunks``). A failure of this thread ends its training."""
        return self._stepped_in

    @stepped_in.setter
    def stepped_in(self, ident: int | None) -> None:
        self._stepped_in = ident
        if self._losses is not None:
            self._losses.thread = ident

    def before_backward(self, loss: Any = None) -> None:
        """At a ``backward()``: a report still waiting for ``log()`` gets nothing more (a value
        logged from now on is the coming step's), so it goes out now; with parameters
        updated by hand, the last backward()'s step ends here. Never raises."""
        if self.closed:
            return
        self._resets.before()
        if self._player is not None:
            self._player.before()
        if self.measure.hand_read:
            self.measure.hand_read = False
            self.boundary.run("report", self._finalize)
        if self.reporter.waiting is not None:
            self.boundary.run("report", self.reporter.submit_open)
        if self._losses is not None and self._losses.pending_skips:  # passes thrown away, no step since
            self.boundary.run("report", self.reporter.thrown_away, self.steps)

    def replay_first(self, params: Sequence[torch.Tensor], norms: torch.Tensor,
                     clip: tuple[torch.Tensor, float] | None = None) -> None:
        """With parameters updated by hand, found at the second ``backward()``: report the
        first one's step from the gradient norms taken right after it (``norms``, per
        parameter, on the device), its loss and its clip."""
        self.measure.replay(params, norms)
        self.measure.hand_read = True
        if clip is not None:
            self.note_clip(*clip)
        self.measure.hand_read = False
        self.boundary.run("report", self._finalize)

    def after_backward(self) -> None:
        """With parameters updated by hand: read the gradients this ``backward()`` left;
        a game's player: whether it changed this monitor's gradients; :mod:`.resets`: the
        gradient it left, for the next ``backward()`` to compare."""
        if not self.closed:
            self._resets.after()
        if self._player is not None and not self.closed:
            self._player.after()
        if self._hand is not None and not self.closed:
            t0 = time.perf_counter()
            with torch.no_grad():
                self.boundary.run("grad", self.measure.grad_stats, 0, self.steps + 1)
            self.measure.hand_read = True
            self.probe_seconds += time.perf_counter() - t0

    def note_rewrite(self, kind: wire.Rewrite) -> None:
        """The script set watched weights itself (``load_state_dict``, ``prune``): the next
        step's frame says so (:mod:`sentinel.instrument.rewrites`). Before the first step
        (a resumed checkpoint) it is where training starts, no rewrite."""
        if self.steps > 0 and not self.closed:
            self._rewrite = kind

    def request_stop(self, reason: str) -> None:
        """Make the next optimizer step raise :class:`TrainingHalted` (the stop action)."""
        if self._halt is None:
            self._halt = reason

    def note_clip(self, total_norm: torch.Tensor, max_norm: float,
                  params: Sequence[torch.Tensor] | None = None) -> None:
        """Record the total gradient norm that ``clip_grad_norm_`` computed before clipping
        (called by :mod:`sentinel.instrument.preclip`). The tensor is read back with the
        coming step's report, never here. Never raises. Another thread's clipping is another
        training's (trials in threads), and the clipping of ``params`` another monitor watches
        is that monitor's: a GAN whose discriminator alone clips gave its generator's stream
        the discriminator's norm (199 of 200 steps)."""
        if params and registry.owners(params[:1]) not in ([], [self]):
            return
        if self.active and losses.mine(self._stepped_in):
            self.boundary.run("clip", self.measure.note_clip, total_norm, max_norm)
            if self._losses is not None:  # a step skipped on a non-finite norm throws these passes away
                self._losses.note_norm(total_norm)

    def adopt(self, opt: torch.optim.Optimizer) -> None:
        """Follow ``opt``, a new optimizer over parameters this monitor watches (one
        re-created mid-run), in place of the one it replaces; the step count goes on."""
        new = {id(p) for g in opt.param_groups for p in g["params"]}
        k = next((i for i, old in enumerate(self.optimizers)
                  if any(id(p) in new for g in old.param_groups for p in g["params"])), len(self.optimizers))
        old_name = type(self.optimizers[k]).__name__ if k < len(self.optimizers) else "none"
        if k < len(self.optimizers):
            for h in self.hooks.opt_handles[k]:
                h.remove()
            registry.release(self, self.optimizers[k])
            self.optimizers[k] = opt
            self.hooks.opt_handles[k] = self._hook_optimizer(k, opt)
        else:
            self.optimizers.append(opt)
            self.hooks.opt_handles.append(self._hook_optimizer(k, opt))
        self._contributed.discard(k)
        self._relayout()
        # said once to a script's own monitor; zero-code mode's stderr holds only its address,
        # what it cannot watch and its alerts (a script that makes its optimizer anew each
        # epoch, to set its lr, would get a line an epoch)
        say = log.warning if not (self.auto or self._adopted) else log.info
        say("sentinel: a new %s steps the watched parameters (in place of %s): following it; steps continue "
            "from %d", type(opt).__name__, old_name, self.steps)
        self._adopted += 1

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, kind: object, error: BaseException | None, tb: object) -> None:
        self.close(error)

    @property
    def errors(self) -> int:
        """Exceptions caught inside probes so far."""
        return self.boundary.errors

    @property
    def frames_dropped(self) -> int:
        """Frames dropped so far: by the sender, and reports the readback had no room for."""
        return self.reporter.frames_dropped

    @property
    def stream(self) -> str | None:
        """The ``optimizer`` label of this monitor's stream, set at its first report
        (:func:`registry.stream_label`; ``""``: the process's only stream)."""
        return self.reporter.stream

    @property
    def scaler(self) -> Any:
        """The script's ``GradScaler`` (given, or found once it scaled a loss), or None."""
        return self.reporter.scaler

    def _stream_label(self) -> str:
        return registry.stream_label(self)  # a hand-updated Hogwild worker is a stream too

    def _restream(self) -> str | None:
        return registry.restream(self)

    # -- the step -------------------------------------------------------------------------

    def _hook_optimizer(self, k: int, opt: torch.optim.Optimizer) -> list[Any]:
        handles = self.hooks.hook(opt, self._make_pre(k), self._make_post(k))
        registry.claim(self, opt, [p for g in opt.param_groups for p in g["params"]])
        return handles

    def _new_layout(self, stepping: int | None = None) -> None:
        """A layout of what the optimizers step now; at optimizer ``stepping``'s step, the
        others' parameters as they were at their own last step (layout.py)."""
        o = self.options
        stepped: list[Any] = list(self.optimizers) or ([self._hand] if self._hand is not None else [])
        known: list[dict[int, bool] | None] = []
        if stepping is not None:
            old = self.layout
            known = [None if j == stepping else {**old.known(j), **self._seen.get(j, {})}
                     for j in range(len(stepped))]
        self._seen.clear()
        self.layout = Layout(self._names_by_id, stepped, self.rank, o.group_depth, o.max_groups,
                             o.update_snapshot_bytes, self._loose, known)
        self.groups, self.sharded, self.devices = self.layout.groups, self.layout.sharded, self.layout.devices
        self.param_bytes = self.layout.param_bytes
        self.measure.layout = self.layout
        self._record.due = True

    def read_ahead(self, opt: torch.optim.Optimizer, stand_in: type) -> None:
        """The step of a stand-in that will scale ``opt``'s gradients before stepping it
        begins: read them now (:mod:`.outerstep`). Never raises."""
        for k, o in enumerate(self.optimizers):
            if o is opt:
                self.boundary.run("grad", self.hooks.read_ahead, k, self.steps + 1, opt, stand_in)

    def unread(self, opt: torch.optim.Optimizer) -> None:
        """The gradients at ``opt``'s coming step are not the loss's: the wrapper whose step
        called it has scaled them (:mod:`.outerstep`); that step reports no gradient."""
        for k, o in enumerate(self.optimizers):
            if o is opt:
                self.hooks.unread.add(k)

    def _relayout(self, stepping: int | None = None) -> None:
        self._new_layout(stepping)
        self.reporter.layout = self.layout
        if self.hooks.opt_handles:  # parameters added to an optimizer are watched ones now
            for opt in self.optimizers:
                registry.claim(self, opt, [p for g in opt.param_groups for p in g["params"]])

    def _layout_due(self, k: int, opt: torch.optim.Optimizer, full: bool, first: bool) -> bool:
        """Whether to build the layout anew at optimizer ``k``'s step: what it steps changed
        (kept in :attr:`_seen`), or another optimizer's did since, and ``k`` is the step's
        first optimizer (the groups do not change within a step)."""
        layout = self.layout
        if len(self.optimizers) != layout.count or layout.changed_at(k, opt, full):
            self._seen[k] = {id(p): p.requires_grad for g in opt.param_groups for p in g["params"]}
        return first and bool(self._seen)

    def _make_pre(self, k: int) -> Callable[..., Any]:
        run, cadence, contributed, reporter = self.boundary.run, self.cadence, self._contributed, self.reporter
        messages, closure_aware, finalize = reporter.messages, self.hooks.closure_aware, self._finalize

        def pre(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
            t0 = time.perf_counter()
            run("messages", messages)
            if self.guard is not None:  # the guard: act on read-back verdicts (halt, host-side restores)
                run("guard", self.guard.before_step, k)
            if self._halt is not None:  # opt-in stop action: deliberately raised into the loop
                raise TrainingHalted(self._halt)
            if reporter.waiting is not None:  # no log() since the last step: send it without a loss
                run("report", reporter.submit_open)
            if k in contributed:  # this optimizer steps again: a new report begins
                run("report", finalize, self._calls_at_post)
            if not self._counted:  # the first step: a resumed optimizer's count goes on
                self._counted = True
                resumed = run("resume", resumed_step, opt) if self.steps == 0 else None
                if resumed:
                    self.steps = resumed
            step = self.steps + 1
            if not contributed:  # the step's first optimizer
                run("cadence", cadence.begin, step, self.optimizers)
            if run("layout", self._layout_due, k, opt, cadence.update_due(step), not contributed):
                run("layout", self._relayout, k)
            out = run("grad", closure_aware, k, step, args, kwargs)
            if cadence.update_due(step):
                run("update", self.layout.snapshots[k].take)
            self.probe_seconds += time.perf_counter() - t0
            return out
        return pre

    def _make_post(self, k: int) -> Callable[..., None]:
        run, cadence, contributed, measure = self.boundary.run, self.cadence, self._contributed, self.measure
        closure_done, finalize = self.hooks.closure_done, self._finalize

        def post(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            t0 = time.perf_counter()
            step = self.steps + 1
            if self.guard is not None:  # the guard: undo a skipped step
                run("guard", self.guard.after_step, k, opt)
            if closure_done.pop(k, True) is False:  # the optimizer never called the closure
                run("grad", measure.grad_stats, k, step)
            if cadence.update_due(step):
                run("update", measure.update_stats, k)
                run("param", measure.param_stats, k)
            contributed.add(k)
            if len(self.optimizers) > 1:  # a report may close later, at another optimizer's step
                self._calls_at_post = losses.calls()
            if len(contributed) == len(self.optimizers):
                run("report", finalize)
            self.probe_seconds += time.perf_counter() - t0
        return post

    def say_where(self, where: str) -> None:
        """From :mod:`.whereabouts`' thread: where this training's thread is, no step
        having come for a heartbeat's interval."""
        if self.active and not self.closed:
            self.boundary.run("where", self.reporter.where, self.steps, where)

    def idle_beat(self) -> None:
        """A heartbeat from :mod:`.notebook`'s thread, while the kernel whose thread trains
        this monitor waits for its next cell (nothing of the training runs meanwhile)."""
        if self.active and not self.closed and self.steps > 0:
            self._beat(0)

    def _beat(self, beats: int) -> None:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return  # a forward captured into a CUDA graph: no event query may run there
        self.boundary.run("heartbeat", self.reporter.beat, self.steps, beats)

    def _finalize(self, ended_at: int | None = None) -> None:
        """Close the current report: add host-side values; the reporter holds it for ``log()``.
        ``ended_at``: ``losses.calls()`` when the step ended, where it closes later (an
        optimizer that steps again before the others did: the next step's ``backward()``
        has run since)."""
        self._contributed.clear()
        self.steps += 1
        o, now, steps = self.options, time.time(), self.steps
        report = Report(self.reporter.step_frame(steps, now, self.groups, self.cadence.lrs))
        measure = self.measure
        measure.close_step(report)
        if self._rewrite is not None:
            report.frame.rewrite, self._rewrite = self._rewrite, None
        self._record.add_to(report, measure.add, steps, self.optimizers, self.layout, self.devices, self.cadence.lrs)
        if steps % o.memory_every == 0 or steps == 1:
            mem = self.boundary.run("memory", measure.memory)
            if mem:
                report.frame.mem = mem
        # what backward() got is no loss to judge: an objective ascended, or a coefficient's
        objective = bool(self.optimizers) and (self.layout.coefficients or all(
            g.get("maximize") is True for opt in self.optimizers for g in opt.param_groups))
        if self._player is not None:  # ... or a game's (Reporter.submit names it so, logged too)
            self.boundary.run("game", self._player.stepped)
        if self.optimizers:
            self._resets.stepped(measure.add)
        if self._replaced is not None and steps >= replaced.CHECK_AT:
            self.boundary.run("layout", self._look_for_a_replaced_module, steps)
        self.reporter.hold(report, measure.take(), steps, objective, ended_at)

    def _passes_averaged(self) -> bool:
        """Whether a step applies the mean of its ``backward()`` passes' gradients (DP-SGD's
        physical batches: :func:`.outerstep.averages_passes`); asked of a step with several."""
        return any(outerstep.averages_passes(opt) for opt in self.optimizers)

    def _look_for_a_replaced_module(self, steps: int) -> None:
        """Once, early: warn when a module of the model was replaced after the optimizer was
        made (:mod:`.replaced`)."""
        model = self._replaced() if self._replaced is not None else None
        decided, line = replaced.check(model, self.optimizers, self._loose, registry.known_optimizers())
        if decided or steps >= replaced.LAST:
            self._replaced = None
        if line is not None:
            log.warning("sentinel: %s", line)


def _when_gone(mon: Monitor, model: torch.nn.Module) -> None:
    """Close zero-code mode's ``mon`` once the script has dropped ``model`` (``_model_gone``)."""
    kids = [weakref.ref(m) for m in model.children()]
    weakref.finalize(model, _model_gone, weakref.ref(mon), kids).atexit = False


def _one_holder() -> int:
    """What ``getrefcount`` says, read as :func:`_held_elsewhere` reads it, of an object
    that one dict holds: the interpreter's own count of the local and the argument, which
    differs between Python versions (3.14 counts borrowed references differently)."""
    class Kid:
        pass

    holder = {"kid": Kid()}
    ref = weakref.ref(holder["kid"])
    kid = ref()
    return sys.getrefcount(kid)


def _held_elsewhere(kids: list[weakref.ref[torch.nn.Module]]) -> bool:
    """Whether a submodule of a model being freed is held by more than that model: a
    model dropped whose body, holding the parameters, trains on (``body = net.body``).
    As the model's finalizer runs, its ``_modules`` (freed right after) is a submodule's
    one holder; a count above that of :func:`_one_holder` is another's. A count that
    errs can only err high (a submodule the model names twice), and then the monitor
    stays open."""
    one = _ONE_HOLDER
    for ref in kids:
        kid = ref()
        if kid is not None and sys.getrefcount(kid) > one:
            return True
    return False


_ONE_HOLDER = _one_holder()


def _model_gone(mon_ref: weakref.ref[Monitor], kids: list[weakref.ref[torch.nn.Module]]) -> None:
    """Zero-code mode's monitor of a model the script dropped (a sweep's trial, a fold):
    its training is over, so it closes, and one collection frees it. A monitor lives in
    cycles of its own parts, and it holds the model's parameters (their gradients) and its
    optimizers (their state), so without this they outlived the script's last reference
    until a later collection: through the next trial's first forward and backward, two
    trials' memory at once on a GPU sized for one. The model is held weakly
    (``hidden.HiddenHandle``, ``InputCapture``), so it goes when the script drops it, and
    with it the hooks that held this monitor; the optimizer the script still holds
    (``opt`` is bound anew on the next line) is then the script's alone."""
    try:
        mon = mon_ref()
        if mon is None or mon.closed or _held_elsewhere(kids):
            return
        mon.close()
        del mon
        gc.collect()
    except Exception:  # a finalizer: nothing escapes into the script's line that dropped the model
        log.debug("sentinel: closing the monitor of a dropped model failed", exc_info=True)
