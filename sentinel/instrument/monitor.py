"""``sentinel.watch``: attach to a training loop and report one frame per optimizer step."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from sentinel import wire
from sentinel.instrument import clip, probes
from sentinel.instrument.frames import assemble
from sentinel.instrument.groups import assign_groups
from sentinel.instrument.guard import Guard
from sentinel.instrument.link import connect
from sentinel.instrument.options import WatchOptions, from_kwargs, rank_world
from sentinel.instrument.readback import Readback
from sentinel.instrument.sender import Sender
from sentinel.instrument.stats import GroupedTensors, UpdateSnapshot, adam_saturation, shard_plan
from sentinel.instrument.timing import BusyClock, ddp_parts

log = logging.getLogger("sentinel")

Segs = dict[torch.device, dict[str, torch.Tensor]]


def _hook(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Hook bodies run without autograd and are never traced by torch.compile."""
    return torch.compiler.disable(torch.no_grad()(fn))


class TrainingHalted(RuntimeError):
    """Raised at the next optimizer step (before any weight changes) after an alert that the
    config's ``actions.stop_on`` names has fired, so the script can checkpoint and exit."""


class Monitor:
    """A handle on one watched training loop. Use :func:`watch` to make one.

    Call :meth:`log` with the loss each step; :meth:`close` (or leaving a ``with`` block)
    removes every hook, flushes the last report and stops the embedded engine.
    """

    def __init__(self, model: torch.nn.Module | None, optimizers: Sequence[torch.optim.Optimizer],
                 options: WatchOptions, sender: Sender | None = None, *, scaler: Any = None,
                 on_alert: Callable[[dict[str, Any]], None] | Sequence[Callable[[dict[str, Any]], None]] = (),
                 ) -> None:
        self.options = o = options
        self.optimizers = list(optimizers)
        self.scaler = scaler
        self.on_alert = [on_alert] if callable(on_alert) else list(on_alert)
        self._halt: str | None = None
        self.guard = Guard(o.max_errors)
        self.rank, self.world = rank_world()
        self.steps = 0
        self.probe_seconds = 0.0
        """Wall time spent inside sentinel's hooks and ``log`` (host side), cumulative."""
        self.url: str | None = None
        self.engine: Any = None
        self._closed = False
        self._handles: list[Any] = []
        self._readback = Readback(o.max_pending, on_drop=self._count_drop)
        self._report_drops = 0
        self._last_step_time: float | None = None
        self._state_due = True
        self._sat_cursor = 0
        self._contributed: set[int] = set()
        self._segs: Segs = {}
        self._open: tuple[dict[str, Any], Segs] | None = None  # finalized, waiting for log()
        self._meta_groups: set[int] = set()
        self._grad_count = 0
        self._clip_max: float | None = None

        outer, inner, self.ddp = ddp_parts(model, self.world)
        # a DDP wrapper's names start with "module."; the groups come from the wrapped model's
        names = {id(p): n for n, p in inner.named_parameters()} if inner is not None else {}
        per_opt: list[list[tuple[str, torch.Tensor]]] = []
        for k, opt in enumerate(self.optimizers):
            plist = []
            for gi, group in enumerate(opt.param_groups):
                for pi, p in enumerate(group["params"]):
                    if p.requires_grad:
                        plist.append((names.get(id(p), f"optimizer{k}.group{gi}.{pi}"), p))
            per_opt.append(plist)
        all_names = [n for plist in per_opt for n, _ in plist]
        self.groups, assignment = assign_groups(all_names, o.group_depth, o.max_groups)
        gmap = dict(zip(all_names, assignment))
        # groups come from every name, so all ranks of a sharded run list the same groups
        self.sharded, keep = shard_plan([p for pl in per_opt for _, p in pl], self.rank)
        kept = iter(keep)
        per_opt = [[(n, p) for n, p in pl if next(kept)] for pl in per_opt]
        self._tensors = [GroupedTensors([p for _, p in pl], [gmap[n] for n, _ in pl], len(self.groups),
                                        self.sharded) for pl in per_opt]
        self._snapshots = [UpdateSnapshot(t, o.update_snapshot_bytes) for t in self._tensors]
        self.param_bytes = sum(t.param_bytes for t in self._tensors)
        self.devices = sorted({d for t in self._tensors for d in t.devices}, key=str)

        if sender is None:
            sender, self.engine, self.url = connect(o)
        self.sender: Sender = sender

        for k, opt in enumerate(self.optimizers):
            self._handles.append(opt.register_step_pre_hook(_hook(self._make_pre(k))))
            self._handles.append(opt.register_step_post_hook(_hook(self._make_post(k))))
            self._handles.append(opt.register_load_state_dict_post_hook(self._on_load))
        self._handles.append(clip.attach(self.note_clip))
        # busy time: data loading plus forward compute, before the step's gradient sync
        self._busy = BusyClock(outer, inner) if outer is not None else None
        if self._busy is not None:
            self._handles += self._busy.handles

    # -- public ---------------------------------------------------------------------------

    def log(self, loss: Any = None, **scalars: Any) -> None:
        """Record the loss (and any other scalars) for the current step.

        Tensors are read back without a host sync; values appear in the next frame.
        Never raises.
        """
        t0 = time.perf_counter()
        if loss is not None:
            scalars["loss"] = loss
        self.guard.run("log", self._log, scalars)
        self.probe_seconds += time.perf_counter() - t0

    def close(self, error: BaseException | None = None) -> None:
        """Remove the hooks, flush pending reports and stop the embedded engine. Idempotent.

        Args:
            error: the exception ending training, if one is; the goodbye frame names its
                type (only the type: messages may hold anything) so the engine reports a
                crash rather than a finished run.
        """
        if self._closed:
            return
        self._closed = True
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.guard.run("report", self._submit_open)
        self.guard.run("emit", self._emit_ready, True)
        bye: dict[str, Any] = {"kind": "bye", "step": self.steps, "t": time.time()}
        if error is not None and not isinstance(error, TrainingHalted) and not (
                isinstance(error, SystemExit) and error.code in (0, None)):
            bye["exc"] = type(error).__name__
        self.guard.run("emit", self._send, bye)
        self.guard.run("emit", self.sender.close)  # delivers any backlog while the engine still listens
        if self.engine is not None:
            self.guard.run("engine", self.engine.stop)
            self.guard.run("messages", self._messages)  # the last alerts reach on_alert too

    def request_stop(self, reason: str) -> None:
        """Make the next optimizer step raise :class:`TrainingHalted` (the stop action)."""
        if self._halt is None:
            self._halt = reason

    def note_clip(self, total_norm: torch.Tensor, max_norm: float) -> None:
        """Record the total gradient norm that ``clip_grad_norm_`` computed before clipping
        (called by :mod:`sentinel.instrument.clip`). The tensor is read back with the
        coming step's report, never here. Never raises."""
        self.guard.run("clip", self._note_clip, total_norm, max_norm)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, kind: object, error: BaseException | None, tb: object) -> None:
        self.close(error)

    @property
    def errors(self) -> int:
        """Exceptions caught inside probes so far."""
        return self.guard.errors

    @property
    def frames_dropped(self) -> int:
        return self.sender.dropped + self._report_drops

    # -- hooks ----------------------------------------------------------------------------

    def _make_pre(self, k: int) -> Callable[..., None]:
        def pre(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            t0 = time.perf_counter()
            self.guard.run("messages", self._messages)
            if self._halt is not None:  # opt-in stop action: deliberately raised into the loop
                raise TrainingHalted(self._halt)
            if self._open is not None:  # no log() since the last step: send it without a loss
                self.guard.run("report", self._submit_open)
            if k in self._contributed:  # this optimizer steps again: a new report begins
                self.guard.run("report", self._finalize)
            step = self.steps + 1
            self.guard.run("grad", self._grad_stats, k, step)
            if step % self.options.update_every == 0:
                self.guard.run("update", self._snapshots[k].take)
            self.probe_seconds += time.perf_counter() - t0
        return pre

    def _make_post(self, k: int) -> Callable[..., None]:
        def post(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            t0 = time.perf_counter()
            step = self.steps + 1
            if step % self.options.update_every == 0:
                self.guard.run("update", self._update_stats, k)
                self.guard.run("param", self._param_stats, k)
            self._contributed.add(k)
            if len(self._contributed) == len(self.optimizers):
                self.guard.run("report", self._finalize)
            self.probe_seconds += time.perf_counter() - t0
        return post

    def _on_load(self, opt: torch.optim.Optimizer) -> None:
        self._state_due = True

    # -- probes ---------------------------------------------------------------------------

    def _add(self, name: str, per_device: dict[torch.device, torch.Tensor]) -> None:
        for dev, t in per_device.items():
            segs = self._segs.setdefault(dev, {})
            segs[name] = segs[name] + t if name in segs else t

    def _grad_stats(self, k: int, step: int) -> None:
        sums, _ = self._tensors[k].grad_sums(2.0)
        self._add("grad_sumsq", sums)
        if step % self.options.health_every == 0:
            l1, count = self._tensors[k].grad_sums(1.0)
            self._add("grad_l1", {d: t.sum().reshape(1) for d, t in l1.items()})
            self._grad_count += count

    def _update_stats(self, k: int) -> None:
        snap = self._snapshots[k]
        self._add("delta_sumsq", snap.delta_sumsq())
        self._meta_groups |= snap.groups

    def _note_clip(self, total_norm: torch.Tensor, max_norm: float) -> None:
        for segs in self._segs.values():  # clipped twice before a step: the last one counts
            segs.pop("clip_norm", None)
        t = total_norm.detach().reshape(1).to(torch.float32)
        self._segs.setdefault(t.device, {})["clip_norm"] = t
        self._clip_max = float(max_norm)

    def _param_stats(self, k: int) -> None:
        self._add("param_sumsq", self._tensors[k].param_sumsq())

    def _finalize(self) -> None:
        """Close the current report: add host-side values and start its readback."""
        self._contributed.clear()
        self.steps += 1
        o, now = self.options, time.time()
        meta: dict[str, Any] = {"kind": "step", "step": self.steps, "t": now,
                                "groups": self.groups, "lr": probes.learning_rates(self.optimizers)}
        if self._last_step_time is not None:
            meta["step_seconds"] = now - self._last_step_time
        self._last_step_time = now
        busy = self._busy.step_done() if self._busy is not None else None
        if busy is not None:
            meta["busy_seconds"] = busy
        if self.ddp:
            meta["ddp"] = True
        if self._grad_count:
            meta["grad_count"], self._grad_count = self._grad_count, 0
        if self._clip_max is not None:
            meta["clip_max"], self._clip_max = self._clip_max, None
        if self._meta_groups:
            meta["delta_groups"] = sorted(self._meta_groups)
            self._meta_groups = set()
        if self._state_due or self.steps % o.state_every == 0:
            self._state_due = False
            st = self.guard.run("state", probes.state_bytes, self.optimizers)
            if st is not None:
                meta["state_bytes"] = st
                meta["param_bytes"] = self.param_bytes
            sat = self.guard.run("saturation", adam_saturation, self.optimizers,
                                 o.saturation_threshold, o.saturation_max_tensors, self._sat_cursor)
            if sat is not None and sat[1]:
                self._add("sat_above", sat[0])
                meta["sat_total"], self._sat_cursor = sat[1], sat[2]
        if self.steps % o.memory_every == 0 or self.steps == 1:
            mem = self.guard.run("memory", self._memory)
            if mem:
                meta["mem"] = mem
        if self._open is not None:
            self._submit_open()
        self._open, self._segs = (meta, self._segs), {}

    def _submit_open(self) -> None:
        """Start the readback of the finalized report (with any scalars log() added)."""
        if self._open is None:
            return
        (meta, segs), self._open = self._open, None
        self._add_amp_scale(segs)
        self._readback.submit(meta, segs)
        self._emit_ready(False)

    def _add_amp_scale(self, segs: Segs) -> None:
        """The GradScaler's scale tensor, read back with the report (``get_scale()`` would sync)."""
        scale = getattr(self.scaler, "_scale", None)
        if isinstance(scale, torch.Tensor) and getattr(self.scaler, "_enabled", True):
            segs.setdefault(scale.device, {})["amp_scale"] = scale.detach().reshape(1).to(torch.float32)

    def _memory(self) -> dict[str, float]:
        mem = probes.host_memory()
        if any(d.type == "cuda" for d in self.devices):
            mem.update(probes.cuda_memory(self.devices))
        if self.options.memory_capacity_bytes > 0:
            mem["capacity"] = float(self.options.memory_capacity_bytes)
        return mem

    def _log(self, scalars: dict[str, Any]) -> None:
        # the common loop logs right after the step: ride on that step's report (one frame)
        merge = self._open is not None and self._open[0]["step"] == self.steps
        host: dict[str, float] = {}
        dev: Segs = self._open[1] if merge and self._open is not None else {}
        for name, v in scalars.items():
            if isinstance(v, torch.Tensor):
                if v.device.type == "cpu":  # reading a CPU tensor is no sync
                    v = v.detach()
                    host[name] = float(v.reshape(-1)[0]) if v.numel() != 1 else float(v)
                else:
                    dev.setdefault(v.device, {})[f"s:{name}"] = v.detach().reshape(-1)[:1].to(torch.float32)
            else:
                host[name] = float(v)
        if merge and self._open is not None:
            self._open[0].setdefault("scalars", {}).update(host)
            self._submit_open()
            return
        self._add_amp_scale(dev)
        meta = {"kind": "log", "step": self.steps, "t": time.time(), "scalars": host}
        self._readback.submit(meta, dev)
        self._emit_ready(False)

    # -- emission -------------------------------------------------------------------------

    def _emit_ready(self, wait: bool) -> None:
        for meta, values in self._readback.poll(wait):
            self.guard.run("emit", self._emit, meta, values)

    def _emit(self, meta: dict[str, Any], values: dict[str, list[float]]) -> None:
        frame = assemble(meta, values, len(self.groups), self.sharded)
        frame["errors"] = self.guard.errors
        frame["dropped"] = self.frames_dropped
        self._send(frame)

    def _send(self, frame: dict[str, Any]) -> None:
        o = self.options
        frame.update(job=o.job, run=o.run, rank=self.rank, world=self.world)
        reply = getattr(self.engine, "reply_path", None)  # a shared daemon's way back to us
        if reply and frame["kind"] == "step":
            frame["reply"] = reply
        self.sender.send(wire.encode(frame))

    def _count_drop(self) -> None:
        self._report_drops += 1

    def _messages(self) -> None:
        """Act on what the engine said: alert callbacks and the stop action (training thread)."""
        if self.engine is None:
            return
        for msg in self.engine.poll():
            if msg.get("kind") == "stop":
                self.request_stop(str(msg.get("reason", "sentinel stop action")))
            elif msg.get("kind") == "alert":
                alert = {k: v for k, v in msg.items() if k != "kind"}
                for cb in self.on_alert:
                    self.guard.run("on_alert", cb, alert)


def watch(model: torch.nn.Module | None,
          optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
          *, scaler: Any = None,
          on_alert: Callable[[dict[str, Any]], None] | Sequence[Callable[[dict[str, Any]], None]] = (),
          **options: Any) -> Monitor:
    """Watch a training loop: one line, then ``mon.log(loss=loss)`` each step.

    Args:
        model: the module whose parameter names define the groups (may be None).
        optimizer: one optimizer or several; a report closes when each has stepped once.
        scaler: a ``torch.amp.GradScaler``, to export its scale and count skipped steps.
        on_alert: callables given each firing/resolved alert (a dict, as in
            ``/api/v1/alerts``). They run in the training thread at the next optimizer
            step (or at ``close()``); an exception in one is caught and counted.
        **options: any field of :class:`~sentinel.instrument.options.WatchOptions`, e.g.
            ``listen="127.0.0.1:9400"``, ``run="exp-42"``, ``update_every=10``.

    Returns:
        A :class:`Monitor`; also a context manager.

    Raises:
        TypeError: an unknown option.
        ValueError: an invalid option value.
    """
    opts = from_kwargs(options)
    optimizers = [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else list(optimizer)
    if not optimizers:
        raise ValueError("optimizer: at least one optimizer is required")
    return Monitor(model, optimizers, opts, scaler=scaler, on_alert=on_alert)
