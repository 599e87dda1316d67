"""The names of the parameters an optimizer steps, for their groups.

A model names its own parameters (``layers.7.attn.q.weight``). An optimizer may also step
parameters of other models: the encoder and the decoder of a seq2seq script, each its own
module, under one ``Adam(list(enc.parameters()) + list(dec.parameters()))``. Without a
name those parameters would merge into one group per optimizer param group
(``optimizer0.group0``), and a vanishing gradient in the decoder could not say where.
:func:`parameter_names` finds the modules that hold them (one gc scan, only when some
parameter has no name) and names every parameter after its root module's class:
``Encoder.emb``, ``Decoder.rnn``. A parameter that no module holds keeps its place name,
and is *loose*: weights a functional training keeps in a dict (``torch.func.functional_call``),
an input being optimized (neural style transfer's image), or a coefficient (SAC's entropy
temperature ``log_alpha``, a Lagrange multiplier, a bare learned temperature). A loose
scalar is taken for a coefficient: the update-size figures leave it out, and an optimizer
stepping only such scalars tunes coefficients, whose loss is no training loss
(:attr:`~sentinel.instrument.layout.Layout.coefficients`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from sentinel.instrument.gcscan import live

log = logging.getLogger("sentinel")


WRAPPERS = frozenset({"_orig_mod", "_module"})
"""The attribute under which a wrapper that adds nothing of its own to a model keeps it:
``torch.compile``'s ``OptimizedModule`` and Opacus's ``GradSampleModule`` (DDP's ``module``
is unwrapped with the other parts of DDP, ``timing.ddp_parts``)."""


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model a wrapper of :data:`WRAPPERS` holds, wrappers within wrappers too: a
    ``sentinel.watch(torch.compile(model), opt)`` names its groups ``transformer.h.0``, as
    the script's ``state_dict`` of the model does, not ``_orig_mod.transformer.h.0``."""
    for _ in range(8):
        children = list(model.named_children())
        own = next(model.parameters(recurse=False), None)
        if len(children) != 1 or children[0][0] not in WRAPPERS or own is not None:
            break
        model = children[0][1]
    return model


def parameter_names(model: torch.nn.Module | None, optimizers: Sequence[Any]) -> tuple[dict[int, str], set[int]]:
    """Parameter name by ``id(param)``: the model's own names (a wrapper's, :func:`unwrapped`,
    without its prefix), or, when the optimizers also step parameters of other modules,
    every name prefixed with its root module's class name (the same class twice: ``Tower``,
    ``Tower_2``); and the ids of the loose ones, which no live module holds (none known when
    the scan failed)."""
    if model is not None:
        model = unwrapped(model)
    names = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
    try:
        missing = {id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]
                   if isinstance(p, torch.Tensor) and p.requires_grad and id(p) not in names}
        roots = holders(missing, model) if missing else []
    except Exception:  # a name is a label: never worth an error in the user's watch()
        log.debug("sentinel: could not name the parameters outside the model", exc_info=True)
        return names, set()
    loose = missing - {id(p) for _, own in roots for _, p in own}
    if not roots:
        return names, loose
    labels = _labels([model] + [r for r, _ in roots] if model is not None else [r for r, _ in roots])
    out = {i: f"{labels[0]}.{n}" for i, n in names.items()} if model is not None else {}
    for (_, own), label in zip(roots, labels[1:] if model is not None else labels):
        out.update((id(p), f"{label}.{n}") for n, p in own)
    return out, loose


def holders(missing: set[int], skip: torch.nn.Module | None = None) -> list[tuple[torch.nn.Module, list[tuple[str, Any]]]]:
    """The live modules (one gc scan) holding the parameters whose ids are ``missing``, but
    ``skip``: the largest first (the first of equal ones as the scan met them), each with
    the names of those it holds that no larger one took already."""
    found = []
    for obj in live(torch.nn.Module):
        if obj is skip:
            continue
        named = list(obj.named_parameters())
        if any(id(p) in missing for _, p in named):
            found.append((len(named), obj, named))
    found.sort(key=lambda h: -h[0])
    roots = []
    for _, obj, named in found:
        own = [(n, p) for n, p in named if id(p) in missing]
        if own:
            roots.append((obj, own))
            missing = missing - {id(p) for _, p in own}
        if not missing:
            break
    return roots


def _labels(modules: list[torch.nn.Module]) -> list[str]:
    """Each module's class name, a repeated one with ``_2``, ``_3``, ... (never a bare number:
    a numeric component would make the group the whole module, :func:`group_name`)."""
    seen: dict[str, int] = {}
    out = []
    for m in modules:
        name = type(m).__name__
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return out
