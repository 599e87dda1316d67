"""One scan of the garbage collector's objects, for what a process holds but never handed us
(the model that owns an optimizer's parameters, the DDP wrapper around a watched model)."""

from __future__ import annotations

import gc
import warnings
import weakref
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


_PROXIES = (weakref.ProxyType, weakref.CallableProxyType)
