"""``collapse``: the network stopped answering its inputs. The loss went flat at a level
no better than it had reached or where it began, its batch-to-batch spread shrank several
times over, and the gradient norm (the rule's ``reference``) fell several times below
what it was.

A network killed by one step too large (a one-cycle peak too high for a BatchNorm convnet,
ReLUs that a large update left dead) gives every input the same answer: the loss sits at
the labels' entropy (ln C for C balanced classes), and only the mix of labels in each
batch moves it. A small convnet on 10 classes, SGD under ``OneCycleLR(max_lr=0.4)``: its
loss fell from 2.48 to 2.16, then at the peak lr went to 2.31 and stayed there for 400
steps, its spread between consecutive batches 10× smaller than before, its gradient norm
from 0.8 down to 0.12. No other rule saw it: the loss is not twice its best (that is
``LossDivergence``), it did not rise for long (``LossRising``), and the gradients are
small, not vanishing.

All three must hold, because each alone is a healthy run's too:

- **the loss is no better than before**: its level (the median of the last ``recent``
  samples) is ``above_best`` above the best ``chunk``-sample median before it, or still at
  ``near_start`` of where it began (``ctx.loss_start``). A training that is learning,
  however slowly, is at its best; a converged one is far below its start;
- **its spread collapsed**: the median change between consecutive batches is
  ``noise_drop`` times below the largest chunk's before it. A live network's batch losses
  keep the spread of the examples they hold, whatever their level (a pretraining run's
  spread shrinks with its loss, and that loss is at its best);
- **the gradient norm collapsed**: its median over the recent steps is ``grad_drop``
  times below the largest chunk median before them. Gradients that shrink as a model
  converges come with a loss at its best.

A run that stays dead longer than the window has no "before" left in it: then the verdict
is none (the alert holds) while the loss stays as flat as a dead network's (a spread below
``dead_spread`` of its level), and quiet once it moves again.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field, model_validator

from sentinel.rules.base import Context, Params, Verdict, median, row_medians, since
from sentinel.store import Window


class CollapseParams(Params):
    """Parameters of :func:`detect`.

    Attributes:
        window: loss samples considered (bounded by the store's capacity).
        recent: the latest samples, judged against the ones before them.
        chunk: samples per chunk of the earlier part (its levels, spreads and gradient norms).
        min_samples: fewer finite samples since the baseline's start give no verdict.
        above_best: the recent level is at least this fraction above the best chunk level ...
        near_start: ... or at least this fraction of where the loss began.
        noise_drop: the loss's batch-to-batch spread fell by at least this factor.
        grad_drop: the gradient norm fell by at least this factor.
        dead_spread: with no earlier part left to compare with, a spread below this fraction
            of the level holds an alert (no verdict) instead of resolving it.
    """

    window: int = Field(default=400, ge=20)
    recent: int = Field(default=50, ge=5)
    chunk: int = Field(default=25, ge=5)
    min_samples: int = Field(default=150, ge=20)
    above_best: float = Field(default=0.03, ge=0.0)
    near_start: float = Field(default=0.85, gt=0.0, le=1.0)
    noise_drop: float = Field(default=4.0, gt=1.0)
    grad_drop: float = Field(default=4.0, gt=1.0)
    dead_spread: float = Field(default=0.02, gt=0.0)

    @model_validator(mode="after")
    def _fits(self) -> CollapseParams:
        if self.recent + 2 * self.chunk > self.min_samples:
            raise ValueError("min_samples must be at least recent + 2 chunks")
        if self.min_samples > self.window:
            raise ValueError("min_samples must not exceed window")
        return self

    def samples(self) -> int:
        return self.window

    def reference_samples(self) -> int:
        return self.window


def _spread(values: np.ndarray) -> float:
    """The median absolute change between consecutive samples: the batches' spread, which a
    slow trend barely moves."""
    return median(np.abs(np.diff(values)).tolist()) if len(values) > 1 else math.nan


def detect(window: Window, params: CollapseParams, ctx: Context) -> Verdict | None:
    """Fire when the loss is flat and no better than before, with its spread and the
    gradient norm both collapsed.

    Returns:
        None with fewer than ``min_samples`` finite loss samples since the baseline's
        start, without gradient norms for both parts, or while a collapse longer than the
        window holds. The verdict's value is the loss's recent level, its baseline the
        best level before it.
    """
    start = ctx.since_step
    if ctx.rewrite_step is not None:  # weights the script set itself: a new training from there
        start = max(start, ctx.rewrite_step)
    w = since(window, start)
    ok = np.isfinite(w.values)
    vals, steps = w.values[ok][-params.window:], w.steps[ok][-params.window:]
    if len(vals) < params.min_samples:
        return None
    recent, older = vals[-params.recent:], vals[: -params.recent]
    level = median(recent.tolist())
    c = params.chunk
    n = len(older) // c * c
    rows = older[len(older) - n:].reshape(-1, c)
    best = float(row_medians(rows).min())
    spread_now = _spread(recent)
    spread_then = float(row_medians(np.abs(np.diff(rows, axis=1))).max())
    grads = ctx.reference_window
    if grads is None or len(grads) == 0:
        return None
    g_ok = np.isfinite(grads.values)
    g_vals, g_steps = grads.values[g_ok], grads.steps[g_ok]
    cut = int(steps[-params.recent])
    g_now_vals = g_vals[g_steps >= cut]
    g_then_vals = g_vals[(g_steps < cut) & (g_steps >= int(steps[len(older) - n]))]
    if len(g_now_vals) < params.recent // 2 or len(g_then_vals) < c:
        return None
    g_now = median(g_now_vals.tolist())
    gm = len(g_then_vals) // c * c
    g_then = float(row_medians(g_then_vals[len(g_then_vals) - gm:].reshape(-1, c)).max())
    loss_start = ctx.loss_start
    regressed = best > 0 and level >= best * (1.0 + params.above_best)
    unlearned = loss_start is not None and loss_start > 0 and level >= params.near_start * loss_start
    half = params.recent // 2
    flat = median(recent[half:].tolist()) >= median(recent[:half].tolist()) - spread_now
    spread_fell = spread_then > 0 and spread_now * params.noise_drop <= spread_then  # a loss that had a spread
    grad_fell = g_now * params.grad_drop <= g_then
    firing = (regressed or unlearned) and flat and spread_fell and grad_fell
    if regressed or not unlearned:
        where = f"above its best {best:.3g}" + (f", its start {loss_start:.3g}" if loss_start is not None else "")
    else:  # it never left its start: no fall, a training that has not learned
        where = f"still near its start {loss_start:.3g}, its best {best:.3g}"
    detail = (f"the loss is flat at {level:.4g} ({where}), its batch-to-batch change "
              f"{spread_then / spread_now if spread_now > 0 else math.inf:.3g}× below what it was, "
              f"and the gradient norm fell {g_then / g_now if g_now > 0 else math.inf:.3g}× "
              f"to {g_now:.3g}")
    if not firing and flat and abs(level) > 0 and spread_now <= params.dead_spread * abs(level):
        return None  # as flat as a dead network: too long for the window to show the fall; hold
    return Verdict(firing, level, best * (1.0 + params.above_best), baseline=best, detail=detail)
