"""One scan of the garbage collector's objects, for what a process holds but never handed us
(the model that owns an optimizer's parameters, the DDP wrapper around a watched model)."""

from __future__ import annotations

import gc
import sys
import warnings
import weakref
from collections.abc import Iterable
from typing import Any


def live(kind: type) -> list[Any]:
    """Every live object of ``kind`` (one gc scan): ``isinstance`` on some objects warns
    (torch.distributed's deprecated aliases) or raises (a dead ``weakref.proxy`` that
    torch.compile leaves behind), and neither may reach the user."""
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if type(obj) in _PROXIES:
                continue
            try:
                if isinstance(obj, kind):
                    found.append(obj)
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
