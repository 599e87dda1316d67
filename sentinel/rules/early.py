"""``early``: the first steps of a run, judged from step 0, before any baseline exists.

Every other detector waits for a baseline, so a learning rate far too high from the very
first step, one that makes the loss swing and then settles instead of producing NaN, goes
unseen. This one judges only the samples of steps ``1..until`` and needs no baseline:

- ``jumps``: how often a sample rose ``factor`` times above the one before it, back to
  at least ``rebound`` of the starting level (a loss swinging up and down; falling fast
  is healthy and never counts); only for a positive loss: where a value is 0 or below
  (PPO's surrogate + value loss − entropy bonus, a Gaussian VAE's negative ELBO) the 0 is
  arbitrary, and a step from 0.003 to 0.012 is noise, not a 4× jump;
- ``above``: how many samples exceed ``value`` (updates larger than 10 % of the weights);
  with ``unless_falling``, the loss (the rule's ``reference``) decides whether they are
  trouble. A fit from a small or far start takes large steps that each lower the loss: the
  PyTorch tutorial's cubic polynomial (four ``randn`` coefficients, SGD on a summed loss
  over 2,000 points) updated its weights by 46 %, 23 % and 12 % at steps 1-3 while its
  loss fell from 295,569 to 40,748; d2l.ai's first example (linear regression, weights
  drawn with a standard deviation of 0.01, SGD at lr 0.03 on batches of 10) by 4,300 %,
  150 % and 32 % while its loss fell from 35 to 6 in ten steps, through batches as noisy
  as 46; its softmax regression by 18-29 % a step for twelve steps, its loss falling at
  each. All paged critical. So the check fires at once when the loss has risen to
  ``factor`` times its value at the first large update (a thrown loss: each fault
  scenario's did by step 4), and otherwise waits for ``at_step`` samples of the loss from
  there: then it fires while the loss's level (the median of its last 3 samples) has not
  fallen below ``falls_to`` (0.9) of its start (the median of its first 3): the loss has
  not fallen. A minibatch's noise neither doubles a falling loss nor keeps its level up for
  ten steps. A fall by less than a third is no fault either: Adam at lr 0.01 on a fresh
  MLP of width 128 (a choice torch-lr-finder's range test made for it) moves the weights
  by 16 %, 12 % and 11 % at its first steps, as its default initialisation's weights are
  small, while its loss falls by 18 % in ten steps and by half in twenty; with 2/3 that
  paged critical. Without a positive, finite loss to read, the updates alone decide;
- ``growth``: the value rose at every one of the last ``count`` samples, by ``factor``
  overall (gradient norms growing step over step), and no single rise carried more than
  half of it on a log scale: a norm that crept up 1.5× over seven steps and then jumped
  17× at a regularization step (StyleGAN2's lazy R1 step) grew by one jump, which is
  ``spike``'s to judge, not step over step;
- ``rise``: from ``at_step`` on, the level (median of the last ``chunk`` samples) has
  risen to ``factor`` times the starting level: with ``start: first`` the first sample,
  the loss of the model before any update was applied (a loss that blows up at step 1
  puts the blow-up into the median of the first samples, and a median start hides it),
  with ``start: median`` the median of the first ``chunk``; with ``separation``, the last
  ``chunk`` samples must also lie above the first ``chunk`` in that share of their pairs
  (a rank test: two medians of 20 batches of a loss that swings 5× between batches
  differ by 30 % by chance, their samples interleave; a loss that rose has most of its
  last ones above its first);
- ``stall``: from ``at_step`` on, the loss has not fallen by ``min_drop``: the fall of the
  least-squares trend of log(loss) since step 1, judged only when its standard error is
  below ``min_drop`` (a noisy loss gives no verdict).

``count`` and the levels make single noisy batches harmless: on the clean scenario runs
the most upward jumps of 3× in 50 steps was one, and the most consecutive gradient-norm
rises five. After ``until`` (the rule's ``until_steps``) the verdict is OK, so an alert
resolves once the early phase is over.

Weights the script set itself within the early phase (``ctx.rewrite_step``) end the samples
judged before them: Lightning's batch-size finder trains a few steps per trial, then
restores the initial weights for the fit, whose first losses, judged against the trials'
(steps of other batch sizes), paged ``EarlyLossRising``.

Cost: only during the first ``until`` steps; one pass over at most ``until`` samples.
"""

from __future__ import annotations

import bisect
import math
from typing import Literal

from pydantic import Field, PositiveInt

from sentinel.rules.base import Context, Params, Verdict, log_trend, median, since
from sentinel.store import Window

Check = Literal["jumps", "above", "growth", "rise", "stall"]


class EarlyParams(Params):
    """Parameters of :func:`detect`.

    Attributes:
        check: which early check (see the module docstring).
        until: the last step judged; later samples are ignored and the verdict is OK.
        factor: the jump, growth or rise factor.
        value: for ``above``: the level samples must exceed.
        count: for ``jumps``/``above``: how many count before it fires; for ``growth``:
            consecutive rises.
        at_step: for ``rise``/``stall``: judged once a sample at or after this step exists.
        chunk: for ``rise``/``stall``: samples per level (median).
        min_drop: for ``stall``: the level must be at least this fraction below the start.
        start: for ``rise``/``stall``: the starting level is the ``first`` sample or the
            ``median`` of the first ``chunk``.
        level: for ``rise``: the current level is the ``median`` or the ``min`` of the last
            ``chunk`` samples (``min``: every one of them has risen).
        separation: for ``rise``: the share of pairs (one of the last ``chunk``, one of
            the first) in which the later sample is the higher, at least (0: not checked).
        rebound: for ``jumps``: a jump counts only when it reaches this fraction of the
            starting level (median of the first 3 samples): a loss thrown back towards
            where it began, not a noisy batch near its floor (a small-batch MSE there
            jumps 3-10× between batches on a healthy run).
        unless_falling: for ``above``: the rule's ``reference`` metric (the loss) decides
            (see the module docstring): fire when it has risen to ``factor`` times its value
            at the first sample above ``value``, or when ``at_step`` of its samples from
            there have not brought its level below ``falls_to`` of its start; large
            updates that lower the loss are a descent from a small or far start, not a
            learning rate that throws the weights.
        falls_to: for ``above`` with ``unless_falling``: the share of its start the loss's
            level must have fallen to.
    """

    check: Check
    until: PositiveInt = 100
    factor: float = Field(default=3.0, gt=1.0)
    value: float = 0.1
    count: PositiveInt = 3
    at_step: PositiveInt = 50
    chunk: PositiveInt = 5
    min_drop: float = Field(default=0.01, ge=0.0, lt=1.0)
    rebound: float = Field(default=0.0, ge=0.0)
    start: Literal["median", "first"] = "median"
    level: Literal["median", "min"] = "median"
    separation: float = Field(default=0.0, ge=0.0, le=1.0)
    unless_falling: bool = False
    falls_to: float = Field(default=0.9, gt=0.0, lt=1.0)

    def samples(self) -> int:
        return self.until + 1

    def reference_samples(self) -> int:
        return self.until + 1 if self.unless_falling else 0


def detect(window: Window, params: EarlyParams, ctx: Context) -> Verdict | None:
    """Judge the samples of steps ``1..until`` by ``params.check``.

    Returns:
        None while there is too little to judge; an OK verdict once ``ctx.step`` is past
        ``until``. The value is the count (``jumps``, ``above``, ``growth``) or the level's
        ratio to the start (``rise``, ``stall``).
    """
    p = params
    if ctx.step > p.until:
        return Verdict(False, 0.0, float(p.count), detail="past the early phase")
    if ctx.rewrite_step is not None:  # weights the script set: the samples before were of others
        window = since(window, ctx.rewrite_step)
    steps = window.steps.tolist()
    vals = [v for s, v in zip(steps, window.values.tolist()) if s <= p.until]
    if not vals:
        return None
    begun = 1 if ctx.rewrite_step is None else ctx.rewrite_step
    if p.check in ("jumps", "rise", "stall") and steps[0] > begun + 2:
        # the checks against the start judge no training watched from its middle (an
        # optimizer made per task, watched once it had trained a while: its steps go on from
        # Adam's count): its first watched losses are no start, and a fine-tune near its
        # floor swings 3-4× between batches
        return None
    if p.check == "jumps":
        if any(v <= 0 for v in vals):  # a loss that reaches 0 or below has no ratios to judge
            return None
        floor = p.rebound * median(vals[:3]) if p.rebound > 0 else -math.inf
        jumps = [(b / a, i) for i, (a, b) in enumerate(zip(vals, vals[1:]), 1)
                 if a > 0 and math.isfinite(a) and math.isfinite(b) and b >= p.factor * a and b >= floor]
        if not jumps:
            return Verdict(False, 0.0, float(p.count))
        top, at = max(jumps)
        detail = (f"rose ≥{p.factor:g}× from one step to the next {len(jumps)} times since step 1 "
                  f"(largest {top:.3g}× at step {steps[at]})")
        return Verdict(len(jumps) >= p.count, float(len(jumps)), float(p.count), detail=detail)
    if p.check == "above":
        over = [i for i, v in enumerate(vals) if v > p.value]
        detail = f"{len(over)} samples above {p.value:g} since step 1 (largest {max(vals):.3g})"
        firing = len(over) >= p.count
        if firing and p.unless_falling:
            said = _loss_says(ctx.reference_window, steps[over[0]], ctx.step, p)
            if said is not None:
                firing, why = said
                detail += why
        return Verdict(firing, float(len(over)), float(p.count), detail=detail)
    if p.check == "growth":
        run = 0
        for a, b in zip(vals[-p.count - 1 :], vals[-p.count :]):
            run = run + 1 if math.isfinite(b) and b > a else 0
        if len(vals) <= p.count or run < p.count:
            return Verdict(False, float(run), float(p.count))
        last = vals[-p.count - 1:]
        grown = last[-1] / last[0] if last[0] > 0 else math.inf
        detail = f"rose at each of the last {p.count} steps, {grown:.3g}× in all"
        jump = max(b / a if a > 0 else math.inf for a, b in zip(last, last[1:]))
        if grown >= p.factor and jump * jump > grown:
            return Verdict(False, float(run), float(p.count), detail=f"{detail}, {jump:.3g}× of it in one step")
        return Verdict(grown >= p.factor, float(run), float(p.count), detail=detail)
    # rise / stall: from at_step on, the level against the start
    need = p.chunk + 1 if p.start == "first" else 2 * p.chunk  # the first sample, then a chunk
    if steps[-1] < p.at_step or len(vals) < need:
        return None
    pairs = [(s, v) for s, v in zip(steps, vals) if math.isfinite(v)]
    if len(pairs) < need:
        return None
    fin = [v for _, v in pairs]
    start = fin[0] if p.start == "first" else median(fin[: p.chunk])
    level = min(fin[-p.chunk :]) if p.level == "min" else median(fin[-p.chunk :])
    if not start > 0:
        return None
    ratio = level / start
    first = f"{start:.4g} at step {pairs[0][0]}" if p.start == "first" else f"{start:.4g} at the start"
    worst_step, worst = max(pairs, key=lambda sv: sv[1])
    detail = (f"level {level:.4g} at step {steps[-1]} vs {first} ({ratio:.3g}×; "
              f"highest {worst:.4g} at step {worst_step})")
    if p.check == "rise":
        firing = ratio >= p.factor
        if firing and p.separation > 0:
            firsts = sorted(fin[: p.chunk])
            above = sum(bisect.bisect_left(firsts, v) for v in fin[-p.chunk:]) / (len(firsts) * p.chunk)
            firing = above >= p.separation
            detail += f"; the last {p.chunk} above the first {p.chunk} in {above:.0%} of their pairs"
        return Verdict(firing, ratio, p.factor, baseline=start, detail=detail)
    return _stall(pairs, p, start, detail)


def _stall(pairs: list[tuple[int, float]], p: EarlyParams, start: float, detail: str) -> Verdict | None:
    """Not fallen by ``min_drop``: the fall is the least-squares trend of log(loss) across
    the samples, and it is judged only when the trend is known to within ``min_drop``
    (one standard error). Two medians of a few noisy batches cannot tell a 1 % fall from
    none; a flat, noisy loss is left to LossPlateau."""
    if any(v <= 0 for _, v in pairs):
        return None
    fit = log_trend([s for s, _ in pairs], [v for _, v in pairs])
    if fit is None:
        return None
    slope, se = fit
    span = float(pairs[-1][0] - pairs[0][0])
    se *= span
    fall = 1.0 - math.exp(slope * span)
    if se > p.min_drop:
        return None  # too noisy to say
    return Verdict(fall < p.min_drop, fall, p.min_drop, baseline=start,
                   detail=f"fell {fall:.2%} over the first {len(pairs)} steps (trend); {detail}")


def _loss_says(window: Window | None, first: int, last: int, p: EarlyParams) -> tuple[bool, str] | None:
    """Whether large updates since step ``first`` are trouble, by the loss (``window``) at
    steps ``first..last``: ``(fire, why)``; None when there is no positive, finite loss
    there to read."""
    if window is None:
        return None
    vals = [v for s, v in zip(window.steps.tolist(), window.values.tolist()) if first <= s <= last]
    if not vals or not all(math.isfinite(v) and v > 0 for v in vals):
        return None
    top = max(vals)
    if top >= p.factor * vals[0]:
        return True, f"; the loss rose to {top / vals[0]:.3g}× its {vals[0]:.4g} at step {first}"
    if len(vals) < p.at_step:
        return False, f"; the loss has not risen to {p.factor:g}× its start: {len(vals)} of {p.at_step} samples"
    start, level = median(vals[:3]), median(vals[-3:])
    if level < p.falls_to * start:
        return False, f"; the loss fell to {level / start:.2g} of its start ({start:.4g} → {level:.4g}) meanwhile"
    return True, f"; the loss is at {level / start:.2g} of its start ({start:.4g} → {level:.4g})"
