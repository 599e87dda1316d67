"""Module hooks that leave no trace in the user's objects.

A hook registered with ``module.register_forward_pre_hook`` lives in the module's
``_forward_pre_hooks`` dict, so ``torch.save(model)``, ``pickle``, ``copy.deepcopy`` and
``torch.jit.script`` take it along: a file that needs Sentinel to load, a copy that
reports as the original, a script that fails to compile a Python hook.

:func:`register` keeps torch's own per-module hooks (a module with hooks costs nothing
more per call than torch already charges), but while Sentinel holds one it swaps the
module's hook dicts for a :class:`HookDict`: an ``OrderedDict`` that pickles and deep-copies
as a plain ``OrderedDict`` of the other hooks only, and hides Sentinel's from ``values()``
(which ``torch.jit.script`` and ``torch.jit.trace`` read; ``nn.Module.__call__`` reads
``items()`` and still runs them). When the last of Sentinel's hooks on a module goes, the
module gets its own dicts back, holding whatever hooks the script added meanwhile.
"""

from __future__ import annotations

import copy
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import torch

_DICTS = {"pre": ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs"),
          "post": ("_forward_hooks", "_forward_hooks_with_kwargs")}


class HookDict(OrderedDict):  # type: ignore[type-arg]
    """A module's hook dict while Sentinel holds hooks in it (see the module doc).

    Args:
        base: the module's own dict, whose entries it starts with; given back at the end.
    """

    def __init__(self, base: dict[Any, Any]) -> None:
        super().__init__(base)
        self.base = base
        self.hidden: set[int] = set()
        self._inherited = set(base)  # hooks the script registered before Sentinel

    def visible(self) -> Iterator[tuple[Any, Any]]:
        self.sync()
        return ((k, v) for k, v in super().items() if k not in self.hidden)

    def sync(self) -> None:
        """Drop a hook the script removed through a handle it took before Sentinel (the
        handle deletes it from the module's own dict, which this one copied)."""
        if self._inherited:
            for k in [k for k in self._inherited if k not in self.base]:
                self._inherited.discard(k)
                self.pop(k, None)

    def items(self) -> Any:
        if self._inherited:
            self.sync()
        return super().items()

    def values(self) -> Any:  # what torch.jit compiles: never Sentinel's
        return [v for _, v in self.visible()]

    def __reduce__(self) -> Any:
        return (OrderedDict, (), None, None, iter(list(self.visible())))

    def __deepcopy__(self, memo: dict[int, Any]) -> OrderedDict[Any, Any]:
        return OrderedDict((k, copy.deepcopy(v, memo)) for k, v in self.visible())

    def copy(self) -> OrderedDict[Any, Any]:  # type: ignore[override]  # a plain copy, never ours
        return OrderedDict(self.visible())


class HiddenHandle:
    """Removes one hidden hook; the module's own dicts come back with its last one.

    It holds the module weakly, as torch's own ``RemovableHandle`` holds the hook dict: the
    hook's owner keeps its handles, and a module that its hooks' owner held would outlive
    the script's last reference until a collection (a sweep's dropped model, kept with its
    gradients and optimizer state through the next model's first step)."""

    def __init__(self, module: torch.nn.Module, kind: str, handle: Any) -> None:
        self.module, self.kind, self.handle = weakref.ref(module), kind, handle

    def remove(self) -> None:
        if self.handle is None:
            return
        self.handle.remove()
        hid = self.handle.id
        self.handle = None
        module = self.module()
        if module is None:  # gone, and its hooks with it
            return
        for attr in _DICTS[self.kind]:
            d = module.__dict__.get(attr)
            if isinstance(d, HookDict):
                d.hidden.discard(hid)
                if not d.hidden:
                    _restore(module, attr, d)


def _restore(module: torch.nn.Module, attr: str, d: HookDict) -> None:
    d.sync()
    if any(k not in d.base for k in d):
        return  # the script registered hooks meanwhile; their handles point here: keep it
    d.base.clear()
    d.base.update(d)
    module.__dict__[attr] = d.base


def _hookdict(module: torch.nn.Module, attr: str) -> HookDict:
    d = module.__dict__[attr]
    if not isinstance(d, HookDict):
        d = HookDict(d)
        # in the module's own __dict__, where nn.Module keeps it: a wrapper that forwards
        # setattr (torch.compile's OptimizedModule, to the module it compiles) is not asked
        module.__dict__[attr] = d
    return d


def hookable(module: torch.nn.Module) -> bool:
    """Whether ``module`` takes forward hooks: a ``torch.jit.script``-ed module (trained as
    it is by older production code) refuses them (its forward is TorchScript's)."""
    return not isinstance(module, torch.jit.ScriptModule)


def register(module: torch.nn.Module, kind: str, fn: Callable[..., Any], *,
             with_kwargs: bool = False) -> HiddenHandle:
    """Register ``fn`` as a forward pre-hook (``kind="pre"``) or forward hook (``"post"``)
    of ``module``, hidden from pickling, deep copies and TorchScript.

    Returns:
        A handle whose ``remove()`` removes the hook (idempotent).
    """
    for attr in _DICTS[kind]:
        _hookdict(module, attr)
    if kind == "pre":
        handle = module.register_forward_pre_hook(fn, with_kwargs=with_kwargs)
    else:
        handle = module.register_forward_hook(fn, with_kwargs=with_kwargs)
    for attr in _DICTS[kind]:
        module.__dict__[attr].hidden.add(handle.id)
    return HiddenHandle(module, kind, handle)
