"""What ingesting one frame tells the rest of the engine: the contract between
:mod:`sentinel.engine.ingest` (which fills it) and :mod:`sentinel.rules.evaluator` (which
reads it), and the engine's hand-off of assembled sharded steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sentinel.wire import GuardNote


@dataclass(slots=True)
class Ingested:
    """The result of ingesting one frame.

    Attributes:
        nonfinite_groups: ``{source: [group, ...]}`` (``grad``, ``param``, ``loss``,
            ``guard``), the first non-finite groups first.
        lr_change_step: the last step at which the rank's learning rate changed by more
            than 10% in some group, or None.
        lr_restart_step: the last step at which a torch scheduler took the rank's learning
            rate back up to its peak in one step (a warm restart), or whose frame said the
            script had set the weights itself (``rewrite``: a rewind, a pruning), or None.
        rewrite_step: the last step whose frame said the script had set the weights itself
            (``rewrite``: a checkpoint restored, a rewind, a pruning), or None.
        lr_fraction: the rank's learning rate over its peak (:mod:`sentinel.engine.schedule`),
            or None when unknown.
        written: the gauges this frame wrote (rules reading none of them are skipped);
            None: judge every rule.
        note: a phrase for the detectors that print one (``Context.note``): the step
            guard's note, a dead rank's last values.
        crossrank: the ranks whose cross-rank series got a sample at this frame's step
            (:meth:`sentinel.engine.crossrank.CrossRank.observe`).
        assembled: the whole model's sums of each step this frame completed, for a
            sharded run (:meth:`sentinel.engine.shards.ShardAssembler.route`).
        guard: the frame's step-guard note, if it had one.
        short_batch: the step's batch was its loader's short last one (the frame's
            ``short_batch``): rules with ``skip_short_batch`` do not judge it.
        guard_skipped: the frame held non-finite values of a step the step guard kept out
            of the weights (its note said so): they never reached the weights.
        game: the stream plays a game (it reported an ``objective``, not a loss):
            rules with ``skip_games`` do not judge it.
        loss_start: the level the stream's loss began at (the median of its first 3 finite
            values, since its training began or the script last set its weights), or None
            before the third.
    """

    nonfinite_groups: dict[str, list[str]] = field(default_factory=dict)
    lr_change_step: int | None = None
    lr_restart_step: int | None = None
    rewrite_step: int | None = None
    lr_fraction: float | None = None
    written: frozenset[str] | None = None
    note: str = ""
    crossrank: list[int] = field(default_factory=list)
    assembled: list[dict[str, Any]] = field(default_factory=list)
    guard: GuardNote | None = None
    guard_skipped: bool = False
    short_batch: bool = False
    loss_start: float | None = None
    game: bool = False
