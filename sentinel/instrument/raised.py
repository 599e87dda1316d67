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
from types import FrameType, TracebackType

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


def raised(error: BaseException, place: str | None = None) -> str:
    """``Type at file.py:LINE`` (``Type`` alone when no frame is the script's), at most 195
    characters (the goodbye frame's ``exc`` takes 200: a longer one would fail the engine's
    check, and the crash would go unreported). Never raises.

    A ``SystemExit`` shows its code when it is a number (``SystemExit(1) at train.py:62``),
    and the exception it was raised while handling, when there is one: hydra's wrapper
    and many scripts catch an error, print it and call ``sys.exit(1)``
    (``SystemExit(1) at train.py:120, handling RuntimeError at model.py:55``). ``place``:
    where it was raised when its traceback cannot say (a ``sys.exit`` that
    :mod:`.leaving` saw: on Python 3.11 the exception's own traceback then ends at the
    ``sys.exit`` call, whatever frames it left)."""
    word = _one(error, place)
    context = error.__context__
    if isinstance(error, SystemExit) and context is not None and not error.__suppress_context__:
        word = f"{word}, handling {_one(context)}"
    return word[:195]


def _one(error: BaseException, place: str | None = None) -> str:
    name = type(error).__name__[:100]
    if isinstance(error, SystemExit) and isinstance(error.code, int) and -1000 < error.code < 1000:
        name = f"{name}({int(error.code)})"
    try:
        where = _script_frame(error.__traceback__) or place
    except Exception:
        where = place
    return f"{name} at {where}" if where else name


def called_from(frame: FrameType | None) -> str | None:
    """``file.py:LINE`` of the innermost frame of the script among ``frame`` and its
    callers (None: none is the script's). Never raises."""
    try:
        libraries = _libraries()
        for _ in range(200):
            if frame is None:
                return None
            where = _script_line(frame.f_code.co_filename, frame.f_lineno, libraries)
            if where is not None:
                return where
            frame = frame.f_back
    except Exception:
        pass
    return None


def _script_frame(tb: TracebackType | None) -> str | None:
    libraries = _libraries()
    found = None
    while tb is not None:
        found = _script_line(tb.tb_frame.f_code.co_filename, tb.tb_lineno, libraries) or found
        tb = tb.tb_next
    return found


def _script_line(path: str, line: int | None, libraries: tuple[str, ...]) -> str | None:
    """``file.py:LINE`` when ``path`` is the script's (no library's, not ``<string>``)."""
    if path.startswith("<"):
        return None
    full = os.path.abspath(path)
    if any(full == lib or full.startswith(lib + os.sep) for lib in libraries):
        return None
    return f"{os.path.basename(full)[:80]}:{line}"
