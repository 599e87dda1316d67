"""Lightning: ``Trainer(callbacks=[SentinelCallback(run="exp-42")])``.

The callback watches the LightningModule and the trainer's optimizers when training
starts and closes the monitor when it ends (or raises). What it adds to the zero-code mode:

- **The step's loss as Lightning sees it.** In automatic optimization Lightning divides
  ``training_step``'s loss by ``accumulate_grad_batches`` before ``backward()``, and the
  ``outputs["loss"]`` that ``on_train_batch_end`` receives is that divided value. The
  callback adds up the micro-batches of an optimizer step and logs their mean (the sum
  times ``k``, divided by the micro-batches actually run, so a short last window at the
  end of an epoch is a mean too), once, right after the step.
- **Manual optimization** (``self.automatic_optimization = False``): the loss is captured
  at ``manual_backward`` (``capture_loss``, unless given), since ``training_step`` may return
  nothing; and each optimizer is a stream of its own, as zero-code mode makes them: a
  monitor per optimizer (:attr:`SentinelCallback.monitors`), one engine serving them all.
  Lightning's GAN tutorial steps a generator and a discriminator in turn, each with the
  other's parameters frozen (``toggle_optimizer``): as one stream, the losses of both
  players were one loss, and their gradients one norm. The logged step values go with the
  first stream that stepped in their batch.
- **The global step**: a run resumed from a checkpoint at ``global_step`` n reports n+1
  next (``Monitor.sync_step``; with several optimizers, whose steps the global step counts
  together, each stream goes on from its optimizer's own count).
- **The run name**: ``run=`` if given, else the launcher's (``SENTINEL_RUN``,
  torchrun's or Slurm's id, which all ranks share), else the logger's ``name/version``.
- **Metrics the LightningModule logged** with ``self.log(..., on_step=True)``: their
  tensors, at most ``max_metrics``, named as logged (``sentinel_scalar{name=...}``).
  They are taken from the values ``self.log`` stored, not from ``trainer.callback_metrics``,
  whose progress-bar entries are converted with ``.item()`` (a host sync on CUDA).

- **The step guard's skip list** (``guard=True`` or ``actions.guard``): the guard learns
  each step's ``(epoch, batch_idx)`` (the last batch of an accumulation window), and the
  callback keeps the skipped ones in its checkpoint state (``state_dict``), so a run
  restarted from the checkpoint finds them in :attr:`SentinelCallback.skips` and can
  leave those batches out (:meth:`SentinelCallback.skipped`).

Gradient statistics need nothing from Lightning: the monitor hooks the real optimizer
under its ``LightningOptimizer`` and reads the gradients the step applies, also when
Lightning runs forward and backward in a closure inside ``optimizer.step``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
except ImportError:  # the standalone pytorch_lightning package
    from pytorch_lightning import Callback, LightningModule, Trainer  # type: ignore[assignment]

import sentinel
from sentinel.integrations._scalars import MAX_SCALARS, launcher_run, scalars

log = logging.getLogger("sentinel")

__all__ = ["SentinelCallback"]


class SentinelCallback(Callback):  # type: ignore[misc]
    """Watch a Lightning ``fit`` with :func:`sentinel.watch`.

    Args:
        max_metrics: at most this many of the module's logged step metrics per step.
        **watch_options: passed to :func:`sentinel.watch` (``run``, ``listen``,
            ``config``, ``on_alert``, ``scaler``, ...).
    """

    def __init__(self, *, max_metrics: int = MAX_SCALARS, **watch_options: Any) -> None:
        super().__init__()
        self.watch_options = watch_options
        self.max_metrics = max_metrics
        self.monitor: sentinel.Monitor | None = None
        """The monitor of the fit's optimizer (the first one's, when it has several)."""
        self.monitors: list[sentinel.Monitor] = []
        """Every monitor of the fit: one per optimizer in manual optimization, else one."""
        self._capture = False  # the losses are captured at backward(): none taken from the outputs
        self._counts: list[int] = []  # each monitor's steps at the last logged batch
        self._logged: dict[str, Any] = {}  # each step metric's tensor at the last batch
        self._loss: torch.Tensor | None = None
        self._micro = 0
        self._global_step = 0
        self._epochs: dict[int, int] = {}  # batch step -> epoch, for the skip list
        self.skips: list[dict[str, Any]] = []
        """The steps the guard skipped, ``{"step", "epoch", "batch", "reason"}``, this fit's
        and those of the checkpoint it resumed from."""

    def skipped(self, epoch: int, batch_idx: int) -> bool:
        """Whether the guard skipped the step of this batch (in this run or before the
        restart), e.g. for a ``training_step`` that returns None for a known bad batch."""
        return any(s["epoch"] == epoch and s["batch"] == batch_idx for s in self.skips)

    def state_dict(self) -> dict[str, Any]:
        self._collect()
        return {"guard_skips": list(self.skips)} if self.skips else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        skips = state_dict.get("guard_skips")
        if isinstance(skips, list):
            self.skips = [dict(s) for s in skips if isinstance(s, dict)]

    def _collect(self) -> None:
        """Add the guard's skips known so far to :attr:`skips`."""
        guard = getattr(self.monitor, "guard", None)
        if guard is None:
            return
        seen = {s["step"] for s in self.skips}
        for step, note in zip(guard.steps, guard.skips):
            if step not in seen:
                self.skips.append({"step": step, "epoch": self._epochs.get(step), "batch": note.batch,
                                   "reason": note.reason})

    # -- hooks ----------------------------------------------------------------------------

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # here, not in on_fit_start: a resumed checkpoint's global step is restored by now
        if self.monitor is not None:
            return
        options = dict(self.watch_options)
        if not options.get("run") and not launcher_run():  # ranks agree on a launcher's id
            options["run"] = _run_name(trainer)
        optimizers = list(trainer.optimizers)
        if not pl_module.automatic_optimization:
            # training_step calls manual_backward(loss) and may return nothing: the loss is
            # what backward() got, each optimizer's own
            options.setdefault("capture_loss", True)
        self._capture = bool(options.get("capture_loss"))
        # in manual optimization each optimizer is a stream of its own (a GAN's players,
        # stepped in turn on losses of their own), as in zero-code mode; one engine serves them
        groups = [[o] for o in optimizers] if not pl_module.automatic_optimization else [optimizers]
        try:
            for group in groups:
                self.monitors.append(sentinel.watch(pl_module, group, **options))
        except Exception:  # never into training
            log.warning("sentinel: SentinelCallback could not watch this fit; training continues", exc_info=True)
            self._close(None)
            return
        self.monitor = self.monitors[0]
        self._counts = [m.steps for m in self.monitors]
        self._global_step = trainer.global_step
        if trainer.global_step and len(self.monitors) == 1:  # several: each optimizer's own count goes on
            self.monitor.sync_step(trainer.global_step)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any,
                             batch_idx: int) -> None:
        guard = getattr(self.monitor, "guard", None)
        if guard is not None:  # the step guard's skip list: which batch this step trains on
            guard.note_batch(batch_idx)
            self._epochs[trainer.global_step + 1] = trainer.current_epoch
            if len(self._epochs) > 4096:
                self._epochs.pop(next(iter(self._epochs)))

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        mon = self.monitor
        if mon is None:
            return
        try:
            loss = None if self._capture else _loss_of(outputs)
            if loss is not None:
                # automatic optimization divided it by k before backward (and before here)
                k = trainer.accumulate_grad_batches if pl_module.automatic_optimization else 1
                loss = loss.detach().reshape(()) * k
                self._loss = loss if self._loss is None else self._loss + loss
                self._micro += 1
            if trainer.global_step == self._global_step:  # accumulating: no step yet
                return
            self._global_step = trainer.global_step
            values = _step_metrics(trainer, self.max_metrics, self._logged)
            if self._capture:
                values.pop("loss", None)  # the loss is the one captured at backward()
            elif self._loss is not None:
                values["loss"] = self._loss / self._micro
            self._loss, self._micro = None, 0
            values.pop("step", None)  # log()'s own argument
            if len(self.monitors) > 1:
                # several streams: the batch's values go with the first stream that stepped in
                # it (a WGAN's generator steps every n-th batch), at that step, though the
                # others' backward() came after it
                counts = [m.steps for m in self.monitors]
                mon = next((m for m, c, was in zip(self.monitors, counts, self._counts) if c != was), mon)
                self._counts = counts
                if values:
                    mon.log(step=mon.steps, **values)
            elif values:
                mon.log(**values)
        except Exception:
            log.warning("sentinel: SentinelCallback could not log this step", exc_info=True)

    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        # a validation_step that calls submodules (self.net(x)) runs no forward of the
        # watched module: a long validation would look like a stalled fit without this
        for mon in self.monitors:
            mon.heartbeat()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._close(None)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._close(exception)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self._close(None)

    def _close(self, error: BaseException | None) -> None:
        for mon in self.monitors:
            mon.close(error)
        if self.monitors:
            self._collect()  # close() read the last verdicts back
        self.monitor, self.monitors = None, []


def _loss_of(outputs: Any) -> torch.Tensor | None:
    """The loss in what ``training_step`` returned, as Lightning hands it on."""
    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
        return outputs
    return None


def _run_name(trainer: Trainer) -> str:
    """``name/version`` of the trainer's first logger; empty (sentinel's default) without one."""
    logger = trainer.logger
    if logger is None:
        return ""
    try:
        name, version = logger.name, logger.version
    except Exception:
        return ""
    version = f"version_{version}" if isinstance(version, int) else version
    return "/".join(str(p) for p in (name, version) if p not in (None, ""))


def _step_metrics(trainer: Trainer, limit: int, before: dict[str, Any]) -> dict[str, Any]:
    """The step values the module passed to ``self.log`` this batch, as tensors.

    Read from the trainer's result collection (what ``self.log`` stored): the public
    ``trainer.callback_metrics`` would also convert every progress-bar value with
    ``.item()``. A metric the module did not log in this batch still holds its last value
    there, which is no value of this step (a WGAN's generator loss, logged in the
    generator's batches only): Lightning stores a new tensor at each ``self.log``, so one
    that is still ``before``'s (updated here, by name) is left out. Lightning's internals
    may move: then no metrics, never an error.
    """
    if limit <= 0:
        return {}
    try:
        results = trainer._results
        if results is None:
            return {}
        items = []
        for _, metric in results.valid_items():
            meta = metric.meta
            value = metric._forward_cache
            if meta.on_step and isinstance(value, torch.Tensor):
                if before.get(meta.name) is not value:
                    items.append((meta.name, value))
                before[meta.name] = value
        return scalars(items, limit)
    except Exception:
        return {}
