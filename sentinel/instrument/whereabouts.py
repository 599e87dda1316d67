"""Where a training thread is while no step comes, for the page that says it stalled.

``TrainingStalled``'s first check is a stack dump of each rank (``py-spy dump``): the call
the training waits in tells a collective that a rank never joined from a stuck data
loader, a lock or a save to slow storage. Once a monitor has taken no step for a
heartbeat's interval (``heartbeat_seconds``, 20 s), a thread of Sentinel's reads its
training thread's Python stack (``sys._current_frames()``: no signal, nothing of that
thread runs) and sends where it is, whenever that changed: the innermost frame and the
script's innermost one, ``all_reduce (torch/distributed/distributed_c10d.py:2501) from
train_step (train.py:88)``. The engine keeps it until the stream's next step and ends
``TrainingStalled``'s detail with it. It is no heartbeat: a hang sends it too.

While steps come the thread only compares each monitor's step count, once an interval.
A thread that holds the GIL in C code stops this one as well, and the page goes out
without a place. Frames of the standard library, of installed packages and of Sentinel
are not the script's; a notebook cell's are (``/tmp/ipykernel_…/….py``).
"""

from __future__ import annotations

import logging
import os
import sys
import sysconfig
import threading
import time
import weakref
from types import FrameType
from typing import Any

log = logging.getLogger("sentinel")
MAX_CHARS = 200  # wire.Frame's ``where``
_SENTINEL = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# each monitor and the process that made it: a forked child (a DataLoader worker, a Hogwild
# worker) inherits its parent's monitors, whose streams it must never speak for
# (it starts no thread of its own, below; the filter is the second guard)
_monitors: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_started: int | None = None  # the pid whose thread runs
_lock = threading.Lock()
_PID = os.getpid()  # the process that imported this module; a forked child starts no thread


def _forked() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it as the parent forked


os.register_at_fork(after_in_child=_forked)


def watch(monitor: Any) -> None:
    """Say where ``monitor``'s training thread is whenever it takes no step. Never raises."""
    global _started
    try:
        _monitors[monitor] = os.getpid()
        with _lock:
            # a forked child (a Hogwild worker) starts no thread: a child of a threaded
            # process had better start none (two such workers, with this thread in them, once
            # spun in MKL's allocator in the suite; the cause is not established)
            if _started == os.getpid() or os.getpid() != _PID:
                return
            _started = os.getpid()
        threading.Thread(target=_run, name="sentinel-whereabouts", daemon=True).start()
    except Exception:
        log.debug("sentinel: could not follow where training waits", exc_info=True)


def _live() -> list[Any]:
    """This process's open monitors. Held only for a look: a list kept over the sleep kept a
    dropped model (a k-fold loop's last fold) and its optimizer alive."""
    me = os.getpid()
    return [m for m, pid in list(_monitors.items()) if pid == me and m.active and not m.closed]


def _run() -> None:
    looked: dict[int, tuple[int, str]] = {}  # id(monitor) -> (its steps when looked, where it was said to be)
    while True:
        try:
            time.sleep(min((float(m.options.heartbeat_seconds) for m in _live()), default=20.0))
            _look(_live(), looked)
        except Exception:
            log.debug("sentinel: could not tell where training waits", exc_info=True)
            time.sleep(20.0)


def _look(mons: list[Any], looked: dict[int, tuple[int, str]]) -> None:
    """Send, for each monitor that took no step since the last look, where its thread is
    (when that changed)."""
    frames: dict[int, FrameType] | None = None
    for m in mons:
        steps, before = m.steps, looked.get(id(m))
        if steps == 0 or before is None or before[0] != steps:
            looked[id(m)] = (steps, "")  # it stepped since: look again next time
            continue
        if frames is None:
            frames = sys._current_frames()
        frame = frames.get(m.stepped_in)
        where = describe(frame) if frame is not None else ""
        if where and where != before[1]:
            m.say_where(where)
            looked[id(m)] = (steps, where)
    alive = {id(m) for m in mons}
    for key in [k for k in looked if k not in alive]:
        del looked[key]


def _prefixes() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    found = {os.path.abspath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    found |= {os.path.abspath(p) + os.sep for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
    return tuple(sorted(found, key=len, reverse=True))  # the longest first: site-packages inside the stdlib's folder


def _place(frame: FrameType, prefixes: tuple[str, ...]) -> tuple[str, bool]:
    """``func (path:line)`` and whether it is the script's (not the standard library's, an
    installed package's or Sentinel's)."""
    path = frame.f_code.co_filename
    full = os.path.abspath(path) if not path.startswith("<") else path
    short, own = full, not path.startswith("<frozen") and not full.startswith(_SENTINEL)
    for prefix in prefixes:
        if full.startswith(prefix):
            short, own = full[len(prefix):], False
            break
    else:
        if own:
            cwd = os.getcwd() + os.sep
            short = full[len(cwd):] if full.startswith(cwd) else os.path.basename(full)
    return f"{frame.f_code.co_name} ({short}:{frame.f_lineno})", own


def describe(frame: FrameType) -> str:
    """Where ``frame`` (a thread's innermost) is: ``inner (file:line)``, followed by ``from
    func (script.py:line)`` for the script's innermost frame when that is another one."""
    prefixes = _prefixes()
    inner, own = _place(frame, prefixes)
    if own:
        return inner[:MAX_CHARS]
    f = frame.f_back
    while f is not None:
        place, own = _place(f, prefixes)
        if own:
            return f"{inner} from {place}"[:MAX_CHARS]
        f = f.f_back
    return inner[:MAX_CHARS]
