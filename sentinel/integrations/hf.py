"""The HF ``Trainer``: ``Trainer(..., callbacks=[SentinelCallback()])``.

At ``on_train_begin`` the callback watches the ``model`` and ``optimizer`` the Trainer
hands its callbacks (the optimizer is Accelerate's ``AcceleratedOptimizer``; the monitor
hooks the real one inside), and closes the monitor at ``on_train_end``, or at interpreter
exit if training raised (the Trainer has no exception hook for callbacks).

- **The loss per optimizer step** is taken where the Trainer hands it to autograd
  (``capture_loss=True``): the sum of the micro-batch losses passed to ``backward()``.
  The Trainer divides each micro-batch's loss for gradient accumulation (by the number
  of micro-batches, or by the step's token count when the model takes
  ``num_items_in_batch``) and logs, with ``logging_steps=1``, exactly that sum as
  ``loss``. Its log comes only every ``logging_steps``; the capture gives every step.
- **The global step**: a resumed run continues at ``state.global_step``.
- **The run name** is ``args.run_name`` unless ``run=`` is given.
- **What the Trainer logged** (``learning_rate``, ``grad_norm``, your ``compute_metrics``
  in training logs, ...) goes to ``Monitor.log`` as extra scalars, at most
  ``max_metrics``: the Trainer already made them Python numbers, so this costs no sync.
  Its ``loss`` is left out (it is the mean over ``logging_steps``).

The pre-clip gradient norm that the Trainer logs as ``grad_norm`` is what the monitor
exports as ``sentinel_grad_norm_preclip``: it is seen at ``clip_grad_norm_``.
"""

from __future__ import annotations

import atexit
import logging
import sys
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

import sentinel
from sentinel.integrations._scalars import MAX_SCALARS, launcher_run, scalars

log = logging.getLogger("sentinel")

__all__ = ["SentinelCallback"]


class SentinelCallback(TrainerCallback):  # type: ignore[misc]
    """Watch an HF ``Trainer.train()`` with :func:`sentinel.watch`.

    Args:
        max_metrics: at most this many of the Trainer's logged values per log call.
        **watch_options: passed to :func:`sentinel.watch` (``run``, ``listen``,
            ``config``, ``on_alert``, ...). ``capture_loss`` defaults to True.
    """

    def __init__(self, *, max_metrics: int = MAX_SCALARS, **watch_options: Any) -> None:
        self.watch_options = watch_options
        self.max_metrics = max_metrics
        self.monitor: sentinel.Monitor | None = None
        self._at_exit = False

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: Any = None, optimizer: Any = None, **kwargs: Any) -> None:
        if self.monitor is not None or optimizer is None:
            return
        options = dict(self.watch_options)
        options.setdefault("capture_loss", True)
        if not options.get("run") and not launcher_run() and args.run_name:
            options["run"] = str(args.run_name)
        try:
            self.monitor = sentinel.watch(model, optimizer, **options)
        except Exception:  # never into training
            log.warning("sentinel: SentinelCallback could not watch this run; training continues", exc_info=True)
            return
        if state.global_step:
            self.monitor.sync_step(state.global_step)
        if not self._at_exit:
            atexit.register(self._close_at_exit)
            self._at_exit = True

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self.monitor is None or not logs:
            return
        values = scalars(logs.items(), self.max_metrics)
        if values:  # computed after the step: they belong to it, wherever its report is
            self.monitor.log(step=state.global_step, **values)

    def on_prediction_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                           **kwargs: Any) -> None:
        if self.monitor is not None:  # an evaluation step: no stall, whichever module it ran
            self.monitor.heartbeat()

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self._close(None)

    def _close(self, error: BaseException | None) -> None:
        mon, self.monitor = self.monitor, None
        if mon is not None:
            mon.close(error)

    def _close_at_exit(self) -> None:
        # train() raised past on_train_end: the interpreter set sys.last_value by now
        error = getattr(sys, "last_value", None)
        self._close(error if isinstance(error, BaseException) else None)
