"""What a goodbye frame says of the exception that ends training: its type and the line of
the script it came through, ``RuntimeError at train.py:88``, so the crash notice tells the
on-call person what and where before they open the job's log.

Only the type and the place, never the message: a message may hold anything (a URL with
its token, a path with a user's data). The place is the innermost frame of the traceback
that is not in Python's own library, an installed package or Sentinel (whose ``backward()``
wrapper is in every traceback through a backward): the script's line that called into
torch, or the line that raised when the script itself did. A file is named by its base name.
"""

from __future__ import annotations

import os
import site
import sysconfig
from types import TracebackType

_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the sentinel package


def _libraries() -> tuple[str, ...]:
    """Python's library and every site-packages folder (a Debian Python's torch lives in
    ``/usr/lib/python3/dist-packages``, which ``sysconfig`` does not name), and Sentinel."""
    paths = sysconfig.get_paths()
    found = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    try:
        found.update(site.getsitepackages())
        found.add(site.getusersitepackages())
    except (AttributeError, OSError):  # an old virtualenv's site module has neither
        pass
    return (*sorted(os.path.abspath(p) for p in found), _OURS)


def raised(error: BaseException) -> str:
    """``Type at file.py:LINE`` (``Type`` alone when no frame is the script's), at most 195
    characters (the goodbye frame's ``exc`` takes 200: a longer one would fail the engine's
    check, and the crash would go unreported). Never raises."""
    name = type(error).__name__[:100]
    try:
        where = _script_frame(error.__traceback__)
    except Exception:
        where = None
    return f"{name} at {where}" if where else name


def _script_frame(tb: TracebackType | None) -> str | None:
    libraries = _libraries()
    found = None
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        if not path.startswith("<"):
            full = os.path.abspath(path)
            if not any(full == lib or full.startswith(lib + os.sep) for lib in libraries):
                found = f"{os.path.basename(full)[:80]}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found
