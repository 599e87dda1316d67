"""Weights the script sets itself between two steps: ``load_state_dict`` into a watched
model, and a ``torch.nn.utils.prune`` mask put on one of its parameters.

A lottery-ticket script prunes a trained model and rewinds the surviving weights to their
initial values (``load_state_dict``), then trains again; an early stop returns to its best
checkpoint; a script that rolls back after a divergence loads an older one; iterative
pruning masks a fifth of the weights each round and fine-tunes. Each time the loss jumps
to where the new weights put it, by the script's design: a lottery ticket's rewind took a
classifier's loss from 0.07 back to 2.2 and paged ``LossDivergence`` (critical;
tests/programs/lottery.py), and a second round of pruning a converged classifier paged it
at 3× its best level of 0.0016. The step after it says so in its frame (``rewrite``), and the
engine judges it as a warm restart of the schedule: the loss and gradient rules with a
``restart_grace_steps`` wait that many steps, and their baselines begin after them.

``nn.Module.load_state_dict`` and ``BasePruningMethod.apply`` (every pruning function
calls it) are wrapped once per process; a call that raises raises as before, and its
return value is the original's. The wrapper looks the module's parameters up among the
watched ones (a dictionary lookup each; nothing when no monitor watches any): a DQN's
target network, loaded every step, and an EMA copy are no watched model.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from sentinel import wire
from sentinel.instrument import registry

log = logging.getLogger("sentinel")

_installed = False
_failures = 0


def _note(module: Any, kind: wire.Rewrite) -> None:
    """Tell the monitors watching ``module``'s parameters that the script set them. Never raises."""
    global _failures
    if _failures >= 3:
        return
    try:
        if isinstance(module, torch.nn.Module):
            for mon in registry.owners(module.parameters()):
                mon.note_rewrite(kind)
    except Exception:  # never into training
        _failures += 1
        if _failures == 1:
            log.warning("sentinel: noting weights set by the script failed; training continues", exc_info=True)


def install() -> None:
    """Wrap ``nn.Module.load_state_dict`` and ``prune.BasePruningMethod.apply``, once."""
    global _installed
    if _installed:
        return
    _installed = True
    original = torch.nn.Module.load_state_dict

    def load_state_dict(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        _note(self, "load_state_dict")
        return out

    load_state_dict.__doc__ = original.__doc__
    torch.nn.Module.load_state_dict = load_state_dict  # type: ignore[method-assign]

    from torch.nn.utils import prune

    apply = prune.BasePruningMethod.__dict__["apply"].__func__

    def pruned(cls: Any, module: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        out = apply(cls, module, name, *args, **kwargs)
        _note(module, "prune")
        return out

    pruned.__doc__ = apply.__doc__
    prune.BasePruningMethod.apply = classmethod(pruned)  # type: ignore[assignment, method-assign]
