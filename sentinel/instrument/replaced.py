"""A module of the model replaced after its optimizer was made: never trained.

The fine-tuning tutorials' order is the model, its new head, then the optimizer. Made the
other way round (``optimizer = SGD(model.parameters())``, then ``model.fc = nn.Linear(512,
10)``), the optimizer steps the old head's parameters, which no module holds any more and
which get no gradient, while the new head gets gradients that no optimizer applies. The
rest of the model trains and the loss falls, so no rule sees anything: the new head stays
as it was initialised. A script that freezes part of a model by leaving it out of the
optimizer (its parameters get gradients nobody applies) is told apart: its optimizer holds
no parameter outside the model.

:func:`check` looks once, at a monitor's early step (every optimizer of a GAN has stepped
by then), and the monitor prints one warning naming the parameters.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

CHECK_AT = 3
"""The monitor's step at which to look (its optimizers, and the process's others, have stepped)."""
LAST = 10
"""The last step to look at when the model has no gradient yet (reset right after each step)."""


def check(model: torch.nn.Module | None, optimizers: Sequence[torch.optim.Optimizer], loose: set[int],
          stepped: Iterable[torch.optim.Optimizer]) -> tuple[bool, str | None]:
    """``(decided, line)``: whether the parameters had gradients to judge by, and the
    warning when a module was replaced (None: none was).

    Args:
        model: the watched model.
        optimizers: the monitor's optimizers.
        loose: ids of their parameters that no live module held when the monitor was made.
        stepped: every optimizer of the process known to have stepped or been watched.
    """
    if model is None or not loose:
        return True, None
    own = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not any(p.grad is not None for _, p in own):
        return False, None
    left = [p for opt in optimizers for g in opt.param_groups for p in g["params"]
            if id(p) in loose and p.requires_grad]
    if not left or any(p.grad is not None for p in left):
        return True, None  # loose parameters the loss reaches: an optimized image, SAC's log_alpha
    held = {id(p) for opt in stepped for g in opt.param_groups for p in g["params"]}
    unstepped = [n for n, p in own if p.grad is not None and id(p) not in held]
    if not unstepped:
        return True, None
    names = ", ".join(unstepped[:6]) + (f" and {len(unstepped) - 6} more" if len(unstepped) > 6 else "")
    n = len(left)
    return True, (f"the optimizer steps {n} parameter{'s' if n > 1 else ''} that no module of the model holds "
                  f"and that get{'s' if n == 1 else ''} no gradient, while the model's {names} get gradients "
                  "that no optimizer applies: a module replaced after the optimizer was made (model.fc = "
                  "nn.Linear(...)) is never trained. Make the optimizer after changing the model, or give it "
                  "the new parameters (optimizer.add_param_group).")
