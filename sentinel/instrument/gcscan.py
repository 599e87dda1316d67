"""One scan of the garbage collector's objects, for what a process holds but never handed us
(the model that owns an optimizer's parameters, the DDP wrapper around a watched model)."""

from __future__ import annotations

import gc
import sys
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any


def live(kind: type) -> list[Any]:
    """Every live object of ``kind`` (one gc scan): ``isinstance`` on some objects warns
    (torch.distributed's deprecated aliases) or raises (a dead ``weakref.proxy`` that
    torch.compile leaves behind), and neither may reach the user."""
    return _scan(kind, None, False)


def first(pred: Callable[[Any], bool]) -> Any:
    """The first live object for which ``pred`` is true (one gc scan, stopped there; a
    ``pred`` that raises or warns counts as false and says nothing), or None."""
    found = _scan(object, pred, True)
    return found[0] if found else None


def _scan(kind: type, pred: Callable[[Any], bool] | None, one: bool) -> list[Any]:
    found = []
    with unshown():
        for obj in gc.get_objects():
            if type(obj) in _PROXIES:
                continue
            try:
                if isinstance(obj, kind) and (pred is None or pred(obj)):
                    found.append(obj)
                    if one:
                        break
            except Exception:
                continue
    return found


def held_beyond(objs: list[Any], known: Iterable[Any]) -> bool:
    """Whether anything but the containers ``known`` (and ``objs`` itself, this call and its
    caller) refers to an object of ``objs`` (one scan of the heap's references): whether the
    script still holds them. A frame of the script holding one (in a local) does. The
    frames are told by their ids: a frame kept in a local is a cycle, which would keep the
    calling frames, and what they step, alive until a collection."""
    ours = {id(c) for c in known} | {id(objs), id(sys._getframe()), id(sys._getframe(1))}
    return any(id(r) not in ours for r in gc.get_referrers(*objs))


_PROXIES = (weakref.ProxyType, weakref.CallableProxyType)


@contextmanager
def unshown() -> Iterator[None]:
    """Warnings raised inside are not shown (``-W error``'s become exceptions, which the
    scans catch), and the filters are left as they are. ``warnings.catch_warnings()`` marks
    them changed on entry and exit, which clears every module's record of the warnings it
    has shown: a script's warning shown once per line under the default filter (mse_loss's
    "Using a target size ... different to the input size" at every step) was shown again
    after zero-code mode's first scan, two lines where the script alone printed one."""
    show = warnings.showwarning
    warnings.showwarning = _drop
    try:
        yield
    finally:
        warnings.showwarning = show


def _drop(*args: Any, **kwargs: Any) -> None:
    pass
