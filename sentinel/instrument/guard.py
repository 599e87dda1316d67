"""The step guard (opt-in): keep a poisoned step out of the weights, decided on the device.

At the optimizer step, after the gradients are read (after the closure, for an optimizer
stepped with one), the monitor hands the guard the per-group gradient sums of squares it
has just computed on the device (and the pre-clip total norm, where the script clips).
From them, without reading anything back, the guard makes a 0-d flag ``skip``:

- ``nonfinite``: the sum is NaN or Inf (a NaN or an Inf in the gradients);
- ``spike``: the norm is above ``factor`` × the median of the last ``window`` applied
  steps' norms (a device-side ring buffer, ``nanmedian``), once ``warmup`` are known;
- never for a step that a ``GradScaler`` found an overflow in (``found_inf``): that is
  the scaler's skip, not the guard's;
- ``max_consecutive``: a device-side count of skips in a row; with ``through`` the flag
  drops when it is reached, with ``halt`` the host raises ``TrainingHalted`` once it
  reads the count (the steps until then stay skipped).

How the flag keeps the step out (per optimizer, :func:`choose`):

- ``fused``: torch's fused Adam/AdamW/SGD take ``found_inf`` (the ``GradScaler``
  protocol) and skip the update on the device, step counters included. Nothing extra.
- ``select``: :class:`~sentinel.instrument.guardstate.DeviceSelect`, a device-side
  snapshot and select; Python numbers and other-device state are put back once the flag
  is on the host (at the latest at the next step, before the optimizer reads them, or at
  an ``optimizer.state_dict()`` before that: a pre-hook waits for the flag then).
- ``sync``: the flag is read on the host (a sync on an accelerator, free on the CPU);
  a skipped step is copied before and put back after (no memory on applied steps).

The learning-rate schedulers stepping the optimizer (found once, at its first guarded
step) are put back before the next step, and a ``GradScaler``'s scale and growth counter
after its ``update()``. Each verdict is read back asynchronously (pinned memory and an
event); the host then counts, sends a :class:`~sentinel.wire.GuardNote` at the judged
step (always before that step's report leaves, :meth:`Guard.notes_upto`, so the engine
knows a skipped step's non-finite values never reached the weights), and acts on
``max_consecutive``. A note also goes at the first judged step, so that the engine's guard
series start at 0 (a Prometheus ``increase()`` then sees the first skip).
"""

from __future__ import annotations

import functools
import gc
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from sentinel.instrument.gcscan import unshown
from sentinel.instrument.guardopts import GuardOptions
from sentinel.instrument.guardstate import DeviceSelect, HostCopy, select_fits
from sentinel.wire import GuardNote

log = logging.getLogger("sentinel")
Tensor = torch.Tensor
_FIELDS = 9  # skip, raw, nonfinite, spike, norm, bound, consecutive, exhausted, amp


def is_fused(opt: torch.optim.Optimizer) -> bool:
    """A torch optimizer whose fused step takes ``found_inf`` (Adam, AdamW, SGD, …)."""
    return bool(getattr(opt, "_step_supports_amp_scaling", False)) and bool(opt.defaults.get("fused"))


def choose(opt: torch.optim.Optimizer, device: torch.device, options: GuardOptions) -> str:
    """The method for ``opt`` (see the module docstring)."""
    if options.method != "auto":
        return "fused" if options.method == "fused" and is_fused(opt) else (
            "sync" if options.method == "fused" else options.method)
    if is_fused(opt):
        return "fused"
    if device.type != "cpu" and select_fits(opt):
        return "select"
    return "sync"


@dataclass
class _Verdict:
    step: int
    k: int
    values: Tensor
    event: Any
    method: str
    batch: int | None
    host: HostCopy | None = None  # what a select could not put back, until the flag is read
    read: list[float] | None = None

    def ready(self) -> bool:
        return self.event is None or bool(self.event.query())

    def get(self) -> list[float]:
        if self.read is None:
            if self.event is not None and not self.event.query():  # complete: no wait, no sync call
                self.event.synchronize()
            self.read = [float(x) for x in self.values.tolist()]
        return self.read


@dataclass
class _OptState:
    ring: Tensor | None = None
    pos: int = 0
    consecutive: Tensor | None = None
    schedulers: list[Any] | None = None
    sched_saved: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)
    sched_groups: list[dict[str, Any]] = field(default_factory=list)
    select: DeviceSelect | None = None
    found_inf_given: Any = None  # the GradScaler's found_inf, while our combined one is set
    plan: tuple[str, Tensor, HostCopy | None, bool] | None = None  # this step: method, skip, copy, host skip
    sched_undo: bool = False
    opt: Any = None
    last_consecutive: int = 0  # as the host last read it
    settle: Any = None  # the state_dict() pre-hook's handle (select: put host-side values back first)
    verdict: _Verdict | None = None  # this step's, until its post-hook


class Guard:
    """The step guard of one monitor. Made by the monitor from ``WatchOptions.guard``.

    Args:
        options: what to skip.
        groups: the monitor's group names (per-group non-finite flags are reported by them).
        send: sends a frame to the engine (the monitor's; adds job/run/rank).
        request_stop: makes the next step raise ``TrainingHalted``.
        scaler: returns the script's ``GradScaler`` (or None).
        sharded: the gradients are sharded (FSDP): the sum is all-reduced (one scalar).
    """

    def __init__(self, options: GuardOptions, groups: Callable[[], Sequence[str]],
                 send: Callable[[dict[str, Any]], None], request_stop: Callable[[str], None],
                 scaler: Callable[[], Any], sharded: Callable[[], bool]) -> None:
        self.options = options
        self._groups, self._send, self._stop, self._scaler, self._sharded = groups, send, request_stop, scaler, sharded
        self._opts: dict[int, _OptState] = {}
        self._pending: list[_Verdict] = []
        self._batch: int | None = None
        self.skipped: dict[str, int] = {"nonfinite": 0, "spike": 0}
        """Skips so far, by reason (known on the host: up to a step late on an accelerator)."""
        self.skips: list[GuardNote] = []
        """The last skipped steps' notes (at most 1000), with ``step`` in :attr:`steps`."""
        self.steps: list[int] = []
        self.through = 0
        """Steps let through past ``max_consecutive`` (``on_exhausted: through``)."""
        self.methods: dict[int, str] = {}
        """The method used per optimizer index at its last step."""
        self._noted = False  # a note was sent (the first goes at the first judged step)

    # -- the monitor's calls ----------------------------------------------------------------

    def note_batch(self, index: int | None) -> None:
        """The index of the batch the coming step trains on (for the skip list)."""
        self._batch = None if index is None else int(index)

    def before_step(self, k: int) -> None:
        """At the step's pre-hook, before the gradients are read: act on the verdicts the
        host can read, and put back what a skipped step of optimizer ``k`` left on the host
        (its schedulers' position), waiting for its verdict when needed."""
        st = self._opts.get(k)
        must = st is not None and (bool(st.schedulers) or any(v.host is not None for v in self._pending if v.k == k))
        self.poll(wait_for=k if must else None)
        if st is not None and st.sched_undo:
            st.sched_undo = False
            for sched, saved in st.sched_saved:
                sched.load_state_dict(saved)
            for g, saved_g in zip(st.opt.param_groups, st.sched_groups):
                g.update(saved_g)

    def after_grads(self, k: int, opt: torch.optim.Optimizer, step: int, sums: dict[torch.device, Tensor],
                    clip_norm: Tensor | None) -> None:
        """Judge the step from the gradient sums (the monitor's ``_grad_stats``) and prepare
        the skip; called once the gradients the optimizer applies are final."""
        if not sums:
            return
        st = self._opts.setdefault(k, _OptState())
        st.opt = opt
        if st.schedulers is None:
            st.schedulers = _schedulers_of(opt)
        dev = next(iter(sums))
        per_group = sum((v.to(dev, non_blocking=True) for v in sums.values()), torch.zeros_like(sums[dev]))
        total = per_group.sum()
        if self._sharded() and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(total)  # FSDP: one scalar, the same flag on every rank
        gs = getattr(opt, "grad_scale", None)  # a GradScaler's scale, for a fused step of scaled grads
        if isinstance(gs, Tensor):
            total = total / gs.to(dev, torch.float32).square()
            per_group = per_group / gs.to(dev, torch.float32).square()
        norm = total.sqrt() if clip_norm is None else clip_norm.to(dev, torch.float32).reshape(())
        o = self.options
        if st.ring is None or st.ring.device != dev:
            st.ring = torch.full((o.window,), float("nan"), device=dev)
            st.consecutive = torch.zeros((), device=dev)
        nonfin = ~torch.isfinite(total) | ~torch.isfinite(norm)
        bound = torch.nanmedian(st.ring) * o.factor
        known = (~torch.isnan(st.ring)).sum()
        spike = (known >= o.warmup) & (norm > bound)
        false = torch.zeros((), dtype=torch.bool, device=dev)
        raw = (nonfin if o.nonfinite else false) | (spike if o.spike else false)
        given = getattr(opt, "found_inf", None)
        amp = (given.to(dev, non_blocking=True) > 0) if isinstance(given, Tensor) else false
        raw = raw & ~amp
        c = st.consecutive
        assert c is not None
        exhausted = raw & (c >= o.max_consecutive)
        skip = raw & ~exhausted if o.on_exhausted == "through" else raw
        st.consecutive = torch.where(raw, torch.clamp(c + 1, max=float(o.max_consecutive)), torch.zeros_like(c))
        slot = st.ring.narrow(0, st.pos, 1)
        slot.copy_(torch.where(skip | nonfin, slot, norm.reshape(1)))
        st.pos = (st.pos + 1) % o.window
        values = torch.cat([torch.stack([skip.float(), raw.float(), nonfin.float(), spike.float(), norm,
                                         bound, st.consecutive, exhausted.float(), amp.float()]),
                            (~torch.isfinite(per_group)).float()])
        method = choose(opt, dev, o)
        if method == "fused" and any(p.grad is not None and p not in opt.state
                                     for g in opt.param_groups for p in g["params"]):
            method = "sync"  # a first step: fused SGD's momentum would start from an empty buffer
        host: HostCopy | None = None
        host_skip = False
        if method == "select":
            if st.select is None or st.select.device != dev:
                st.select = DeviceSelect(dev, o.snapshot_bytes)
            if st.select.take(opt):
                host = HostCopy(opt, dev)
                if st.settle is None:  # a state_dict() before the flag is read: read it, put back
                    st.settle = opt.register_state_dict_pre_hook(functools.partial(self._settle, k))
            else:
                method = "sync"
        if method == "sync":
            host_skip = bool(skip.item())  # the documented sync (none on the CPU)
            host = HostCopy(opt) if host_skip else None
        st.plan = (method, skip, host, host_skip)
        self.methods[k] = method
        st.verdict = self._record(k, step, values, method)
        if method == "fused":  # last: a plan exists, so the post-hook takes it off again
            st.found_inf_given = given
            opt.found_inf = (skip | amp).float()  # type: ignore[attr-defined]

    def after_step(self, k: int, opt: torch.optim.Optimizer) -> None:
        """At the step's post-hook: undo a skipped step by the chosen method."""
        st = self._opts.get(k)
        if st is None or st.plan is None:
            return
        (method, skip, host, host_skip), st.plan = st.plan, None
        verdict, st.verdict = st.verdict, None
        if method == "fused":
            if st.found_inf_given is not None:
                opt.found_inf = st.found_inf_given  # type: ignore[attr-defined]  # the scaler deletes it
            elif hasattr(opt, "found_inf"):
                del opt.found_inf  # type: ignore[attr-defined]
            st.found_inf_given = None
        elif method == "select" and st.select is not None:
            st.select.select(skip)
            if verdict is not None:
                verdict.host = host
        elif method == "sync" and host_skip and host is not None:
            host.restore()
        if st.schedulers:
            st.sched_saved = [(s, _copy_state(s.state_dict())) for s in st.schedulers]
            st.sched_groups = [{key: g[key] for key in ("lr", "momentum", "betas") if key in g}
                               for g in opt.param_groups]
        self._guard_scaler(skip)
        self.poll()

    def poll(self, wait_for: int | None = None) -> None:
        """Act on the verdicts read back so far (all of optimizer ``wait_for``'s, waiting)."""
        last = max((i for i, v in enumerate(self._pending) if v.k == wait_for), default=-1)
        i = 0
        while self._pending:
            if i > last and not self._pending[0].ready():
                break
            self._act(self._pending.pop(0))
            i += 1

    def notes_upto(self, step: int) -> None:
        """Before the monitor sends reports read back: act on the verdicts of the steps up
        to ``step`` (the latest step report among them), so their notes go first and the
        engine knows a step was kept out when it judges that step's non-finite values. A
        step report read back from the device means its verdict is too (its copy was queued
        before the report's, on the same stream): no wait. Those steps are over (a report
        is made after its steps' post-hooks), so acting now undoes nothing half-way; a
        step's ``log()`` frames leave after its report (the readback keeps their order)."""
        while self._pending and self._pending[0].step <= step:
            self._act(self._pending.pop(0))

    def flush(self) -> None:
        """Wait for every verdict and act on it (at ``close()``); nothing of the guard is
        left on an optimizer (a ``found_inf`` of a step that never reached its post-hook)."""
        for st in self._opts.values():
            if st.settle is not None:
                st.settle.remove()
                st.settle = None
            if st.plan is not None and st.plan[0] == "fused" and st.opt is not None:
                if st.found_inf_given is not None:
                    st.opt.found_inf = st.found_inf_given
                elif hasattr(st.opt, "found_inf"):
                    del st.opt.found_inf
            st.plan = None
        while self._pending:
            self._act(self._pending.pop(0))

    # -- internals --------------------------------------------------------------------------

    def _settle(self, k: int, _opt: Any = None) -> None:
        """``optimizer.state_dict()`` on the select path: wait for optimizer ``k``'s verdicts
        and put back what a skipped step left on the host (its Python numbers and
        other-device step counters), so the state taken is the applied steps'. A wait at a
        checkpoint only; never raises into the script's call."""
        try:
            self.poll(wait_for=k)
        except Exception as exc:  # the boundary of a user's call
            log.warning("sentinel guard: settling before state_dict() failed: %s", type(exc).__name__)

    def _record(self, k: int, step: int, values: Tensor, method: str) -> _Verdict:
        event = None
        if values.device.type == "cuda":
            buf = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            buf.copy_(values, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            values = buf
        elif values.device.type != "cpu":
            values = values.to("cpu")
        batch, self._batch = self._batch, None
        verdict = _Verdict(step, k, values, event, method, batch)
        self._pending.append(verdict)
        return verdict

    def _guard_scaler(self, skip: Tensor) -> None:
        """Keep a GradScaler's scale and growth counter as they were, through the
        ``update()`` that follows a skipped step (device-side, no sync)."""
        scaler = self._scaler()
        scale = getattr(scaler, "_scale", None)
        tracker = getattr(scaler, "_growth_tracker", None)
        if not isinstance(scale, Tensor) or not isinstance(tracker, Tensor) or "update" in vars(scaler):
            return
        saved = (scale.clone(), tracker.clone())
        flag = skip.to(scale.device, non_blocking=True)

        def update(*args: Any, **kwargs: Any) -> None:
            del scaler.update  # one update only: the instance is left as it was
            type(scaler).update(scaler, *args, **kwargs)
            torch.where(flag, saved[0], scaler._scale, out=scaler._scale)
            torch.where(flag, saved[1], scaler._growth_tracker, out=scaler._growth_tracker)

        scaler.update = update

    def _act(self, v: _Verdict) -> None:
        vals = v.get()
        skip, _raw, nonfin, _spike, norm, bound, consec, exhausted, _amp = vals[:_FIELDS]
        st = self._opts.get(v.k)
        if skip and v.host is not None:
            v.host.restore()
        if skip and st is not None and st.schedulers:
            st.sched_undo = True
        names = list(self._groups())
        groups = tuple(names[i] for i, bad in enumerate(vals[_FIELDS:]) if bad and i < len(names))
        o = self.options
        outcome = ""
        if exhausted and o.on_exhausted == "through":
            outcome = "through"
            self.through += 1
        elif skip and consec >= o.max_consecutive and o.on_exhausted == "halt":
            outcome = "halt"
        reason = "nonfinite" if nonfin else "spike"
        if skip:
            self.skipped[reason] += 1
        if not skip and not outcome:
            if st is not None and st.last_consecutive:
                st.last_consecutive = 0
                self._note(v, GuardNote(False, "", norm, bound, (), 0, "", v.batch, v.method))
            elif not self._noted:  # the first judged step: the engine's guard series start at 0
                self._note(v, GuardNote(False, "", norm, bound, (), 0, "", v.batch, v.method))
            return
        if st is not None:
            st.last_consecutive = int(consec)
        note = GuardNote(bool(skip), reason, norm, bound, groups, int(consec) if skip else 0, outcome,
                         v.batch, v.method)
        if skip:
            self.skips = (self.skips + [note])[-1000:]
            self.steps = (self.steps + [v.step])[-1000:]
            log.info("sentinel guard: skipped step %d (%s: norm %.4g, bound %.4g)%s", v.step, reason, norm, bound,
                     f" groups {', '.join(groups)}" if groups else "")
        if outcome == "halt":
            self._stop(f"sentinel guard: {int(consec)} steps skipped in a row (max_consecutive), the last at step "
                       f"{v.step} ({reason}: gradient norm {norm:.4g}, bound {bound:.4g}); the skipped steps are "
                       "not in the weights. Save a checkpoint and exit; `sentinel skips RUN` lists them")
        elif outcome == "through":
            log.warning("sentinel guard: %d skips in a row; letting step %d through (on_exhausted: through)",
                        o.max_consecutive, v.step)
        self._note(v, note)

    def _note(self, v: _Verdict, note: GuardNote) -> None:
        self._noted = True
        self._send({"kind": "log", "step": v.step, "t": time.time(), "guard": note.to_wire()})


def _copy_state(d: dict[str, Any]) -> dict[str, Any]:
    import copy

    return copy.deepcopy(d)


def _schedulers_of(opt: torch.optim.Optimizer) -> list[Any]:
    """The learning-rate schedulers stepping ``opt`` (one gc scan, at its first guarded step)."""
    out = []
    with unshown():  # isinstance() on some lazy modules warns
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.optim.lr_scheduler.LRScheduler) and getattr(obj, "optimizer", None) is opt:
                    out.append(obj)
            except Exception:  # isinstance on a lazy proxy may raise
                continue
    return out


def make_guard(mon: Any) -> Guard | None:
    """The guard of a monitor, from ``options.guard`` (or, with a config file and no
    ``guard`` given, its ``actions.guard``); None when the guard is off."""
    o = mon.options
    opts = o.guard
    if opts is None and o.config:
        from sentinel.instrument.guardopts import parse_guard
        from sentinel.instrument.link import config_guard  # validated once by link.connect already

        opts = parse_guard(config_guard(o.config))
    if opts is None:
        return None
    return Guard(opts, lambda: mon.groups, mon.reporter.send, mon.request_stop, lambda: mon.scaler, lambda: mon.sharded)
