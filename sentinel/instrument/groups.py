"""Parameter groups: module-path prefixes at a configurable depth, capped in count."""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from sentinel.wire import MAX_GROUP_NAME_LENGTH

OTHER = "other"


def bounded(name: str) -> str:
    """``name``, or a longer one's first characters and a checksum of the whole, in the
    :data:`~sentinel.wire.MAX_GROUP_NAME_LENGTH` characters a frame takes (a longer name, a
    ``ModuleDict`` key written out in full, made the engine drop every frame's groups and
    their norms). The same on every rank: two long names that begin alike stay apart."""
    if len(name) <= MAX_GROUP_NAME_LENGTH:
        return name
    return f"{name[:MAX_GROUP_NAME_LENGTH - 9]}~{zlib.crc32(name.encode()):08x}"


def group_name(param_name: str, depth: int | str = "auto") -> str:
    """The group of a parameter, from its dotted name.

    ``"auto"`` picks the block level: up to and including the first numeric path
    component (``layers.7``, ``transformer.h.3``), else the first two module components
    (``transformer.wte``, ``head``). An integer keeps that many module components.

    A Keras 3 model on the torch backend holds all its variables in one ``ParameterDict``
    keyed by their paths (``_functional._torch_params.sequential/conv2d/kernel``): the
    path's layers are the components there (``sequential/conv2d``), or every layer would
    be in one group.

    Args:
        param_name: as from ``model.named_parameters()``, e.g. ``layers.7.attn.q.weight``; a
            parametrized one (``conv.parametrizations.weight.original0``) is its module's.
        depth: ``"auto"`` or a positive number of module-path components.
    """
    own = param_name.rsplit(".", 1)[-1]
    if "/" in own.strip("/"):  # a Keras variable's path: its layers, joined as Keras joins them
        return _prefix([p for p in own.split("/")[:-1] if p], depth, "/") or own
    parts = param_name.split(".")[:-1]  # drop the parameter's own name
    if len(parts) >= 2 and parts[-2] == "parametrizations":
        # torch.nn.utils.parametrize (the parametrizations' weight_norm and spectral_norm):
        # ``post.parametrizations.weight.original0`` is post's weight, in post's group
        parts, own = parts[:-2], parts[-1]
        if not parts:
            return own  # the root module's: its own group, as its unparametrized weight is
    if not parts:
        return param_name  # a parameter held by the root module is its own group
    return _prefix(parts, depth, ".")


def _prefix(parts: list[str], depth: int | str, sep: str) -> str:
    """The group of a parameter held at the module path ``parts`` (see :func:`group_name`)."""
    if depth == "auto":
        for i, part in enumerate(parts):
            if part.isdigit():
                return sep.join(parts[: i + 1])
        return sep.join(parts[:2])
    return sep.join(parts[: max(1, int(depth))])


def assign_groups(
    param_names: Iterable[str], depth: int | str = "auto", max_groups: int = 64
) -> tuple[list[str], list[int]]:
    """Group names in order of first appearance, and each parameter's group index.

    Groups past ``max_groups - 1`` merge into ``"other"``, which is always last.
    """
    names: list[str] = []
    index: dict[str, int] = {}
    assignment: list[int] = []
    for pname in param_names:
        g = bounded(group_name(pname, depth))
        if g not in index and len(names) < max_groups - 1:
            index[g] = len(names)
            names.append(g)
        assignment.append(index.get(g, -1))  # -1: merged into "other"
    if -1 in assignment:
        names.append(OTHER)
        assignment = [len(names) - 1 if i == -1 else i for i in assignment]
    return names, assignment
