"""What a monitor sends: its reports, held for ``log()``'s values, read back from the device,
framed (:class:`~sentinel.wire.Frame`) and sent; and what the engine says back (alerts, the
stop and capture actions)."""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch

from sentinel import wire
from sentinel.instrument import games, losses
from sentinel.instrument.boundary import Boundary
from sentinel.instrument.capture import InputCapture
from sentinel.instrument.frames import Report, Segs, assemble
from sentinel.instrument.layout import Layout
from sentinel.instrument.losses import LossSum
from sentinel.instrument.options import WatchOptions
from sentinel.instrument.readback import Readback
from sentinel.instrument.scalars import MAX_NAME_LENGTH, MAX_NAMES, NameBudget, Scalars, to_value
from sentinel.instrument.sender import Sender

log = logging.getLogger("sentinel")
_streams_said = False  # the line on more streams than a frame can label, once per process


def _too_many_streams() -> None:
    global _streams_said
    if not _streams_said:
        _streams_said = True
        log.warning("sentinel: more than 100 optimizers of this process step side by side; the 101st and any "
                    "further one are not reported (a report names at most 100 streams of a process)")


def command_line() -> str:
    """The command line as typed (``python -m pkg.train --lr 3e-4``: the history's record of
    what ran); in a ``multiprocessing`` worker, whose own is multiprocessing's bootstrap, the
    interpreter and the script's arguments it inherited."""
    import multiprocessing

    orig = getattr(sys, "orig_argv", None)
    if orig and multiprocessing.parent_process() is None:
        return " ".join(orig)
    return " ".join([os.path.basename(sys.executable) or "python", *sys.argv])


class Farewell:
    """The goodbye of a monitor that goes without being closed: a zero-code monitor is
    collected with the model it watched once the script drops it (a function that trained
    and returned, a fold of a k-fold loop). Called then (``weakref.finalize``), it sends the
    stream's goodbye frame at its last step, so the engine sees a training that ended rather
    than a process gone silent (a crash, once the process is gone).

    It holds nothing of the monitor's but where frames go and the stream's identity, kept by
    :meth:`Reporter.send`; it sends on a socket of its own (a collection may run anywhere,
    even inside the dead monitor's sender), and only to a daemon's socket path.
    """

    def __init__(self, sender: Sender, engine: Any) -> None:
        self.path: str | None = getattr(sender, "path", None)
        self.reply: str | None = getattr(engine, "reply_path", None)
        self.last: wire.Frame | None = None  # the identity and step of the stream's last frame

    def __call__(self) -> None:
        last, self.last = self.last, None
        try:
            if last is not None and self.path is not None:
                bye = wire.Frame(kind="bye", job=last.job, run=last.run, rank=last.rank, world=last.world,
                                 step=last.step, t=time.time(), opt=last.opt)
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                try:
                    sock.setblocking(False)
                    sock.sendto(wire.encode(bye), self.path)
                finally:
                    sock.close()
            if self.reply is not None:
                os.unlink(self.reply)  # the dead link's way back, which nobody reads now
        except Exception:
            pass  # a daemon gone, a full queue: the process's end still reaches it


RL_MODULES = ("gymnasium", "gym", "envpool", "dm_env", "pettingzoo")
"""Environment libraries: a script that imported one trains an agent (WatchOptions.rl)."""


class Reporter:
    """A monitor's way out: the report waiting for ``log()``, the values logged before their
    step ends, the readback, the frames and the sender, and the engine's replies.

    Args:
        options: the monitor's options (the frames' identity, the readback's depth).
        boundary: the monitor's boundary (every send and callback runs inside it).
        rank, world: this process's place.
        sender: where frames go.
        engine: the monitor's own engine, or a shared daemon's handle (its ``poll()`` gives
            the replies, its ``reply_path`` the way back), or None.
        capture: the capture action's input capture (its ``arm`` and ``take``).
        on_alert: the alert callbacks.
        request_stop: the stop action's way into the training loop.
        stream_label: the ``optimizer`` label of the frames, asked once, at the first send.
        restream: asked at each step frame after that: a new label for this stream's frames
            from now on (a later monitor took its label while it still trains), or None.
        loss_sum: the losses captured at ``backward()`` (``capture_loss``), or None.
        layout: the current groups (the monitor sets it again at each new layout).
        scaler: the script's ``GradScaler``, if known (found once it scaled a loss).
        auto: zero-code mode's monitor: a report never waits for ``log()``.
        passes_averaged: whether a step of several ``backward()`` passes applies the mean of
            their gradients (DP-SGD's physical batches), so that its loss is their losses' mean.
    """

    def __init__(self, options: WatchOptions, boundary: Boundary, rank: int, world: int, sender: Sender,
                 engine: Any, capture: InputCapture, on_alert: Iterable[Callable[[dict[str, Any]], None]],
                 request_stop: Callable[[str], None], stream_label: Callable[[], str],
                 loss_sum: LossSum | None, layout: Layout, *, scaler: Any = None, auto: bool = False,
                 passes_averaged: Callable[[], bool] = lambda: False,
                 restream: Callable[[], str | None] = lambda: None) -> None:
        self.options, self.boundary, self.rank, self.world = options, boundary, rank, world
        # whereabouts' and the notebook's threads send until the goodbye, never after it (a log
        # frame after it reopens the finished rank at the engine)
        self._leaving = threading.Lock()
        self._left = False
        self.sender, self.engine, self.capture, self.on_alert = sender, engine, capture, on_alert
        self.request_stop, self.stream_label, self.losses = request_stop, stream_label, loss_sum
        self.layout, self.scaler, self.auto = layout, scaler, auto
        self.passes_averaged, self.restream = passes_averaged, restream
        self.stream: str | None = None  # decided at the first send (and again by restream)
        self.farewell = Farewell(sender, engine)
        self.readback = Readback(options.max_pending, on_drop=self._count_drop)
        self.report_drops = 0
        self.not_reset_run = 0  # step reports in a row whose gradients began from the last step's
        self.guard: Any = None  # the step guard (sentinel.instrument.guard.Guard) or None
        self.names = NameBudget()
        self.waiting: tuple[Report, Segs, Scalars] | None = None  # finalized, waiting for log()
        self.pending = Scalars()  # logged while no report was open: the coming step's
        self.backwards_at_step = self.backwards_at_log = -1  # losses.calls() then
        self.logs = 0  # log() calls so far: a script that never logs never makes a report wait
        self.step_warned = False  # said once that a log(step=) named no step of ours
        self.value_warned: set[str] = set()  # names whose value log() dropped, said once each
        self.first_count: int | None = None  # backward() calls of the first step with a captured loss
        self.player: games.Player | None = None  # the monitor's place in a game (a GAN's), if it can be in one
        self.held_at = self.skips_sent_at = time.monotonic()  # the last step's report; the last report of skips
        self.started = False  # a step frame was made

    @property
    def frames_dropped(self) -> int:
        return self.sender.dropped + self.report_drops

    def frame(self, kind: Literal["step", "log", "bye"], step: int, t: float) -> wire.Frame:
        """A new frame of this process (its identity is set again as it leaves)."""
        o = self.options
        return wire.Frame(kind=kind, job=o.job, run=o.run, rank=self.rank, world=self.world, step=step, t=t)

    def step_frame(self, steps: int, now: float, groups: list[str], lrs: list[float]) -> wire.Frame:
        """The frame of step ``steps``, with its groups and learning rates (read as it
        began), and the tags and the command line when they are due."""
        o = self.options
        frame = self.frame("step", steps, now)
        frame.groups, frame.lr = groups, lrs
        first = steps == 1 or not self.started  # a training's first step; a resumed one's first in this process
        self.started = True
        if o.tags and (first or steps % o.tags_every == 0):
            frame.tags = o.tags
        if first:  # the history's record of what ran (engine side)
            frame.cmd = command_line()[:1000]
        return frame

    def beat(self, steps: int, beats: int) -> None:
        """Say the rank works between steps (``beats``: evaluation forwards, batches and
        heartbeat calls since step ``steps``): reports still held go first, so the engine has the last
        step before its heartbeat. Also from :mod:`.notebook`'s thread, while the kernel's
        thread that trains waits for a cell; never after the goodbye."""
        with self._leaving:
            if self._left:
                return
            self.submit_open()
            self.emit_ready(False)
            frame = self.frame("log", steps, time.time())
            frame.beat = beats
            self.send(frame)

    def where(self, steps: int, where: str) -> None:
        """Say where the training thread is, no step having come since ``steps``
        (:mod:`.whereabouts`, from its own thread: the sender is thread-safe, and nothing
        held is touched)."""
        with self._leaving:
            if self._left:
                return
            frame = self.frame("log", steps, time.time())
            frame.where = where
            self.send(frame)

    # -- reports --------------------------------------------------------------------------

    def hold(self, report: Report, segs: Segs, steps: int, objective: bool = False,
             ended_at: int | None = None) -> None:
        """Take a step's finalized report (``steps``: its number): it waits for ``log()``'s
        values unless nothing more is coming for it. ``objective``: what ``backward()`` got
        is no loss to judge, and is recorded as the scalar ``objective``, which the loss
        rules never judge: every optimizer of the step ascends (``maximize=True``: it rises
        as training goes well), or steps only coefficients (SAC's entropy temperature: its
        loss settles around 0 as the policy's entropy meets its target, with either sign).
        ``ended_at``: ``losses.calls()`` at the step's end, where the report closes after
        the next step's ``backward()`` (default: now); a ``log()`` after that is the next step's."""
        if self.waiting is not None:
            self.submit_open()
        scalars, self.pending = self.pending, Scalars()  # logged before this step's end: its own
        loss_in = False  # captured at backward(): nothing more comes for this step's loss
        if self.losses is not None:
            if self.scaler is None:
                self.scaler = self.losses.grad_scaler()  # the GradScaler the script uses, once it scaled a loss
            captured = self.losses.claim()
            if captured is not None:
                captured = self._in_first_units(captured, self.losses.taken)
            name = "objective" if objective else "loss"
            if captured is not None and "loss" not in scalars and name not in scalars:
                scalars.add(name, captured)
                loss_in = True
            self._add_skipped(segs)
        calls = losses.calls() if ended_at is None else ended_at
        logged_last = bool(scalars) and self.backwards_at_log == calls
        self.held_at = time.monotonic()
        self.waiting = (report, segs, scalars)
        self.backwards_at_step = calls
        # send it now when nothing more is coming: zero-code mode, the loss in (captured at
        # backward(), or logged before the step), a script that has not logged by its
        # second step (it never waits for a log() again), or values logged after the
        # step's last backward(); else at the next log(), backward() or step
        if self.auto or logged_last or loss_in or (not self.logs and steps > 1):
            self.submit_open()

    def _in_first_units(self, total: torch.Tensor, count: int) -> torch.Tensor:
        """A step's summed loss over ``count`` backward() calls, in the units of the stream's
        first step when it has more calls than that step: scaled by first count / ``count``
        (see :mod:`sentinel.instrument.losses`); their mean where the step applies the mean
        of their gradients (:attr:`passes_averaged`, asked only of a step with several). On
        the device: no read-back."""
        if count > 1 and self.passes_averaged():
            return total / count
        if self.first_count is None:
            self.first_count = count
        if count <= self.first_count or self.first_count <= 0:
            return total
        return total * (self.first_count / count)

    def log(self, scalars: dict[str, Any], step: int | None, steps: int) -> None:
        """Route ``log()``'s values (``steps``: the steps taken so far) to their step's report."""
        self.logs += 1
        values = Scalars()
        for name, v in scalars.items():
            value = to_value(v)
            if value is None:
                self.names.dropped += 1  # a bad value: counted, and its name takes no slot
                self._say_dropped(name, v)
                continue
            if self.names.admit(name):  # a bad name, or one past the slots: counted there
                values.add(name, value)
            else:
                self._say_dropped(name, None, named=True)
        report = self.waiting
        if step is not None and not 0 < step <= steps:
            # no optimizer step of Sentinel's count (a script's own counter of batches or
            # samples, 0-based, wandb's `step=`): the values go where a log() without one goes
            if step != steps + 1 and not self.step_warned:
                self.step_warned = True
                log.warning("sentinel: log(step=%s) names no optimizer step taken (%d so far); its values, and "
                            "those of later such calls, go to the step Sentinel counts", step, steps)
            step = None
        if step is not None and (report is None or report[0].frame.step != step):
            # a step whose report has left: its own frame
            self.submit(Report(self.frame("log", int(step), time.time())), {}, values)
            return
        # the common loop logs right after the step: ride on that step's report (one frame)
        if report is not None and report[0].frame.step == steps:
            if step is not None or losses.calls() == self.backwards_at_step:
                report[2].merge(values)
                self.submit_open()
                return
            self.submit_open()  # a backward() since the step: these values are the next step's
        elif (report is None and steps > 0 and step is None and not self.pending
              and losses.calls() == self.backwards_at_step):
            # right after a step whose report has left (the first of a loop that logs after
            # the step): the values are that step's, in a frame of their own
            self.submit(Report(self.frame("log", steps, time.time())), {}, values)
            return
        if self.scaler is not None and not self.pending:
            # with a GradScaler, an iteration without an optimizer step is a step the scaler
            # skipped: report it at once, so the loss and the scale of skipped steps show
            self.submit(Report(self.frame("log", steps, time.time())), {}, values)
            return
        self.pending.merge(values)  # before the step (gradient accumulation): the coming step's
        self.backwards_at_log = losses.calls()

    def _say_dropped(self, name: Any, v: Any, named: bool = False) -> None:
        """Once per name (of the first 32): a value ``log()`` dropped, and why, on the
        script's own log (a per-sample loss, reduction="none", ``get_last_lr()``'s list or a
        name with a space was dropped with nothing said but a counter). ``named``: the name
        was refused, not the value."""
        key = str(name)[:64]
        if key in self.value_warned or len(self.value_warned) >= MAX_NAMES:
            return
        self.value_warned.add(key)
        if named:
            log.warning("sentinel: log(%r=...) dropped: a name is 1 to %d characters of A-Za-z0-9_.:/@+-, and a "
                        "monitor takes %d names (counted in sentinel_scalars_dropped_total); this is said once per "
                        "name", key, MAX_NAME_LENGTH, MAX_NAMES)
            return
        if isinstance(v, torch.Tensor):
            what = f"a tensor of {v.numel()} elements" if v.numel() != 1 else f"a {v.dtype} tensor"
        elif isinstance(v, (list, tuple)):
            what = f"a {type(v).__name__} of {len(v)}"
        else:
            what = "None" if v is None else f"a {type(v).__name__}"
        log.warning("sentinel: log(%s=...) got %s, not a real number or a one-element tensor: dropped (and "
                    "counted in sentinel_scalars_dropped_total); this is said once per name", key, what)

    def submit_open(self) -> None:
        """Start the readback of the finalized report (with any scalars log() added)."""
        if self.waiting is None:
            return
        (report, segs, scalars), self.waiting = self.waiting, None
        self.submit(report, segs, scalars)

    def submit(self, report: Report, segs: Segs, scalars: Scalars) -> None:
        if "loss" in scalars and (self.reinforcement() or self.player is not None and self.player.adversarial):
            scalars.rename("loss", "objective")  # captured or logged: an agent's or a game's, no loss to judge
        if scalars:
            report.scalars = scalars.meta()
            for dev, named in scalars.segments().items():
                segs.setdefault(dev, {}).update(named)
        if self.names.dropped:
            report.frame.scalars_dropped = self.names.dropped
        self._add_amp_scale(segs)
        self.readback.submit(report, segs)
        self.emit_ready(False)

    def reinforcement(self) -> bool:
        """Whether this is a reinforcement-learning run (:attr:`WatchOptions.rl`): said, or
        an environment library imported (a script imports it before it trains; once seen,
        for good)."""
        said = self.options.rl
        if said is None and any(name in sys.modules for name in RL_MODULES):
            said = self.options.rl = True
        return bool(said)

    def _add_skipped(self, segs: Segs) -> None:
        """The count of passes thrown away with a non-finite loss or norm (:attr:`LossSum.skipped`),
        read back with the report, once there was a reset."""
        skipped = self.losses.skipped if self.losses is not None else None
        if skipped is not None:
            segs.setdefault(skipped.device, {})["skipped"] = skipped.reshape(1)

    def _add_amp_scale(self, segs: Segs) -> None:
        """The GradScaler's scale tensor, read back with the report (``get_scale()`` would sync)."""
        scale = getattr(self.scaler, "_scale", None)
        if isinstance(scale, torch.Tensor) and getattr(self.scaler, "_enabled", True):
            segs.setdefault(scale.device, {})["amp_scale"] = scale.detach().reshape(1).to(torch.float32)

    # -- emission -------------------------------------------------------------------------

    def emit_ready(self, wait: bool) -> None:
        ready = self.readback.poll(wait)
        if ready and self.guard is not None:  # the guard's notes of these steps go first (issue 21)
            steps = [int(r.frame.step) for r, _ in ready if r.frame.kind == "step"]
            if steps:
                self.boundary.run("guard", self.guard.notes_upto, max(steps))
        for report, values in ready:
            self.boundary.run("emit", self._emit, report, values)

    def _emit(self, report: Report, values: dict[str, list[float]]) -> None:
        frame = assemble(report, values, len(self.layout.groups), self.layout.sharded)
        if report.unless_skipped and frame.skipped_nonfinite is wire.UNSET:
            return  # the passes thrown away at the end had finite losses: nothing to say
        if frame.kind == "step":  # a run of steps whose gradients were not reset, and the 0 that ends it
            carried = frame.not_reset == 1
            if carried or self.not_reset_run:
                self.not_reset_run = frame.not_reset = self.not_reset_run + 1 if carried else 0
            else:
                frame.not_reset = wire.UNSET
        frame.errors = self.boundary.errors
        frame.dropped = self.frames_dropped
        self.send(frame)

    def send(self, frame: wire.Frame | dict[str, Any]) -> None:
        """Send a frame (a map: the step guard's notes) as this process's."""
        o = self.options
        if self.stream is None:  # decided once, at the first report
            self.stream = self.stream_label()
            if len(self.stream) > 2:  # the 101st optimizer stepping beside the others: no stream label left
                _too_many_streams()
        elif isinstance(frame, wire.Frame) and frame.kind == "step":
            label = self.restream()
            if label is not None:
                self.stream = label
        if len(self.stream) > 2:
            self.report_drops += 1
            return
        reply = getattr(self.engine, "reply_path", None)  # a shared daemon's way back to us
        if isinstance(frame, wire.Frame):
            frame.job, frame.run, frame.rank, frame.world = o.job, o.run, self.rank, self.world
            if self.stream:
                frame.opt = self.stream
            if reply and frame.kind == "step":
                frame.reply = reply
        else:
            frame.update(job=o.job, run=o.run, rank=self.rank, world=self.world)
            if self.stream:
                frame["opt"] = self.stream
        self.sender.send(wire.encode(frame))
        if isinstance(frame, wire.Frame) and frame.kind == "step":
            self.farewell.last = frame

    def _count_drop(self) -> None:
        self.report_drops += 1

    def close(self, steps: int, exc: str | None, status: int | None = None, thread: str | None = None,
              silent: bool = False) -> None:
        """The last reports, the goodbye frame (``exc``: the type of the exception that ended
        training and the script's line it came through, if one did: :mod:`.raised`;
        ``status``: the exit status a ``sys.exit`` asked for; ``thread``: the name of the
        training thread ``exc`` ended, the process going on), the sender's backlog; then
        the engine stops and its last alerts reach ``on_alert``. ``silent``: no last report
        and no goodbye (a later training reports on this stream: ``registry.stream_taken``)."""
        with self._leaving:
            self._left = True
        run = self.boundary.run
        if not silent:
            run("report", self.submit_open)
            run("report", self.thrown_away, steps, True, exc)
            run("emit", self.emit_ready, True)
            bye = self.frame("bye", steps, time.time())
            if exc is not None:
                bye.exc = exc
            if status is not None:
                bye.status = status
            if thread is not None and exc is not None:
                bye.thread = thread[:64]
            run("emit", self.send, bye)
        run("emit", self.sender.close)  # delivers any backlog while the engine still listens
        if self.engine is not None:
            run("engine", self.engine.stop)
            run("messages", self.messages)  # the last alerts reach on_alert too

    def thrown_away(self, steps: int, end: bool = False, exc: str | None = None) -> None:
        """Passes thrown away and no step since (``end``: the script ends, and the passes no
        step took are thrown away too): a frame at the last step says so if one of them had
        a non-finite loss, for a script that skips its steps on a NaN loss for good. While
        it goes on, at most once per ``heartbeat_seconds``, once no step came for as long.
        ``exc``: the script ends on that exception (:mod:`.raised`), which threw the last
        passes away: the frame names it, so that the engine does not call them skipped."""
        if self.losses is None:
            return
        now = time.monotonic()
        if not end and (now - self.held_at < self.options.heartbeat_seconds
                        or now - self.skips_sent_at < self.options.heartbeat_seconds):
            return
        if not self.losses.thrown_away(end):
            return
        self.skips_sent_at = now
        segs: Segs = {}
        self._add_skipped(segs)
        if segs:
            frame = self.frame("log", steps, time.time())
            if exc is not None:
                frame.exc = exc
            self.readback.submit(Report(frame, unless_skipped=True), segs)
            self.emit_ready(False)

    # -- replies --------------------------------------------------------------------------

    def messages(self) -> None:
        """Act on what the engine said: alert callbacks, the stop action, and the capture
        action's ``arm`` and ``capture`` (training thread)."""
        if self.engine is None:
            return
        for msg in self.engine.poll():  # maps decoded and checked by wire.decode_message
            if msg.get("kind") == "stop":
                self.request_stop(str(msg.get("reason", "sentinel stop action")))
            elif msg.get("kind") == "arm":
                self.boundary.run("capture_message", self.capture.arm, msg)
            elif msg.get("kind") == "capture":
                self.boundary.run("capture_message", self.capture.take, msg)
            elif msg.get("kind") == "alert":
                alert = {k: v for k, v in msg.items() if k != "kind"}
                for cb in self.on_alert:
                    self.boundary.run("on_alert", cb, alert)
