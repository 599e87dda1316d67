"""``sentinel.watch``: the one call a training loop makes, and the one monitor per optimizer."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from sentinel.instrument import outerstep, registry
from sentinel.instrument.monitor import Monitor
from sentinel.instrument.options import from_kwargs

log = logging.getLogger("sentinel")

unsupported_total = 0
"""How many times :func:`watch` was handed something it cannot watch (and returned an
inert monitor)."""
_rewatch_said = False


def watch(model: torch.nn.Module | None,
          optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | Any = None,
          *, scaler: Any = None,
          on_alert: Callable[[dict[str, Any]], None] | Sequence[Callable[[dict[str, Any]], None]] = (),
          **options: Any) -> Monitor:
    """Watch a training loop: one line, then ``mon.log(loss=loss)`` each step.

    Args:
        model: the module whose parameter names define the groups (may be None).
        optimizer: one optimizer or several; a report closes when each has stepped once.
            Framework wrappers (Accelerate's ``AcceleratedOptimizer``, Lightning's
            ``LightningOptimizer``, anything holding the real one as ``.optimizer``) are
            unwrapped and the real optimizer is hooked. None (left out): the model's
            parameters are stepped by no torch optimizer (updated by hand, or by a Keras
            model's own optimizer): a step per ``backward()``, its loss taken from it
            (``capture_loss``, unless set), and no update ratios, optimizer state or
            learning rates, as zero-code mode watches such a loop.
        scaler: a ``torch.amp.GradScaler``, to export its scale and count skipped steps.
        on_alert: callables given each alert's change to firing or resolved (a dict of
            :class:`sentinel.wire.Alert`'s fields: ``state_from``, ``state_to``,
            ``alertname``, ``severity``, ``summary``, ...). They run in the training thread
            at the next optimizer step (or at ``close()``); an exception in one is caught
            and counted.
        **options: any field of :class:`~sentinel.instrument.options.WatchOptions`, e.g.
            ``listen="127.0.0.1:9400"``, ``run="exp-42"``, ``update_every=10``.

    Returns:
        A :class:`Monitor`; also a context manager. An optimizer that a live monitor
        already watches gets that monitor back (with a warning). Handed something it
        cannot watch, ``watch`` logs one warning, counts it in :data:`unsupported_total`
        and returns an inert monitor (``mon.active`` is False) with no engine behind it.

    Raises:
        TypeError: an unknown option.
        ValueError: an invalid option value.
        ConfigError: an invalid config file.
    """
    global unsupported_total
    by_hand = optimizer is None and isinstance(model, torch.nn.Module)  # no torch optimizer steps it
    opts = from_kwargs({"capture_loss": True, **options} if by_hand else options)
    hand: list[torch.Tensor] | None = None
    try:
        if model is not None and not isinstance(model, torch.nn.Module):
            swapped = hasattr(model, "param_groups") or isinstance(optimizer, torch.nn.Module)
            raise registry.UnsupportedOptimizer(f"the model is a {type(model).__name__}, not a torch.nn.Module"
                                                + ("; the model comes first: watch(model, optimizer)" if swapped else ""))
        if by_hand:
            optimizers: list[torch.optim.Optimizer] = []
            hand = [p for p in model.parameters() if p.requires_grad]  # type: ignore[union-attr]
            if not hand:
                raise registry.UnsupportedOptimizer("the model has no parameter that requires grad"
                                                    + _unregistered(model))  # type: ignore[arg-type]
        else:
            many = not isinstance(optimizer, torch.optim.Optimizer) and outerstep.inner_of(optimizer) is None
            given: list[Any] = list(optimizer) if many else [optimizer]  # type: ignore[arg-type]  # not iterable: TypeError
            optimizers = [registry.unwrap(o) for o in given]
            for o, inner in zip(given, optimizers, strict=True):
                outerstep.note_clipper(inner, o)  # Opacus's DPOptimizer, given as make_private returned it
            optimizers = list({id(o): o for o in optimizers}.values())  # one given twice (or with its wrapper) is one
            if not optimizers:
                raise registry.UnsupportedOptimizer("no optimizer was given")
    except Exception as exc:
        unsupported_total += 1
        log.warning("sentinel: cannot watch this (%s); training continues unmonitored", exc)
        return Monitor.inert(opts, str(exc))
    owners = registry.owners(hand) if hand is not None else [registry.monitor_of(o) for o in optimizers]
    for m in owners:
        if m is not None and not m.auto and not m.closed:
            log.warning("sentinel: this %s is already watched (run %r); returning that monitor",
                        "model" if by_hand else "optimizer", m.options.run)
            return m  # type: ignore[no-any-return]
    autos = {m for m in owners if m is not None and not m.closed}  # zero-code monitors give way
    start = max((m.steps for m in autos), default=0)
    for m in autos:
        m.close()
    try:
        mon = Monitor(model, optimizers, opts, scaler=scaler, on_alert=on_alert, hand=hand)
    except Exception as exc:
        if type(exc).__name__ == "ConfigError":  # sentinel.rules.config's: loud at construction
            raise
        unsupported_total += 1
        log.warning("sentinel: watch failed (%s: %s); training continues unmonitored", type(exc).__name__, exc,
                    exc_info=True)
        return Monitor.inert(opts, f"{type(exc).__name__}: {exc}")
    mon.sync_step(start)
    _say_if_watched_again(mon, optimizers)
    return mon


def _say_if_watched_again(mon: Monitor, optimizers: list[torch.optim.Optimizer]) -> None:
    """Once per process: an optimizer watched again under the same run after its monitor
    closed (``with sentinel.watch(...)`` inside the epoch loop, or in a ``train_one_epoch``)
    is a new training to the engine and the history (a run row per epoch, the rules
    starting over), and a new engine process each time."""
    global _rewatch_said
    for opt in optimizers:
        before = registry.closed_by.get(opt)
        if before is not None and before[:2] == (mon.options.job, mon.options.run) and not _rewatch_said:
            _rewatch_said = True
            log.warning("sentinel: this optimizer was watched before in this process, by a monitor closed at step %d "
                        "(run %r): each watch() after a close() is a new training, with a run row of its own in the "
                        "history and its rules starting over; call watch() once, before the training loop",
                        before[2], mon.options.run)


def _unregistered(model: torch.nn.Module) -> str:
    """Where a model with no parameters keeps modules that have some, in a plain list, tuple
    or dict attribute that ``nn.Module`` does not register (the PyTorch examples'
    Forward-Forward keeps its layers in a list, each with its own optimizer): said, with
    the way out. Empty when there is none."""
    for name, value in vars(model).items():
        if name.startswith("_"):  # nn.Module's own: _modules, _parameters, ...
            continue
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
        held = [m for m in items if isinstance(m, torch.nn.Module) and any(True for _ in m.parameters())]
        if held:
            kind = "nn.ModuleDict" if isinstance(value, dict) else "nn.ModuleList"
            return (f": its attribute {name!r} is a plain {type(value).__name__} of {len(held)} module(s) with "
                    f"parameters, which nn.Module does not register ({kind} does); give watch() the optimizers "
                    "that step them")
    return ""
