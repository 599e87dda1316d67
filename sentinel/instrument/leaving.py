"""How the script leaves, for its goodbye frames as the interpreter exits (``atexit``).

An uncaught exception is in ``sys.last_value`` by the time ``atexit`` runs. A
``sys.exit(1)`` leaves no trace there: the interpreter takes the ``SystemExit``'s code and
runs ``atexit`` as after a clean end. Yet scripts stop themselves that way when training
goes wrong: the training engines of DeiT, MAE, DETR and their many copies check
``if not math.isfinite(loss_value): print("Loss is nan, stopping training"); sys.exit(1)``
before ``backward()``, and hydra's ``@hydra.main`` prints an error and calls
``sys.exit(1)``. Their goodbye said the script had ended cleanly, and the crash alert that
the training "failed as it exited, after training".

:func:`install` wraps ``sys.exit`` (the same call, and pickled by the same name): a
non-zero exit the main thread asks for is kept, with its traceback, until the next
optimizer step (a script that caught the ``SystemExit`` and trained on left by another
way), and :func:`error` hands it to the goodbye. The ``exit()`` and ``quit()`` builtins
(``site``'s, which scripts call as often: ``print("NaN loss"); exit(1)``) are kept the same
way: their class's ``__call__`` is wrapped, so the objects, their repr and their pickling
stay the interpreter's. ``raise SystemExit(1)`` is not seen: it calls nothing.

A training loop run in a thread of its own (a web UI's, a server's, a notebook's background
training) that dies on an exception leaves nothing the interpreter keeps: the thread's
traceback is printed, the main thread joins it and exits 0. :func:`install` chains
``threading.excepthook`` too: when a thread that stepped a watched optimizer ends on an
uncaught exception, :data:`on_thread_failure` (the registry's) closes the monitors stepped
in it with that exception at once, so the crash is reported when it happens, where it
happened, whether the process goes on or not.
"""

from __future__ import annotations

import builtins
import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from sentinel.instrument.raised import called_from

_installed = False
_exiting: SystemExit | None = None  # the main thread's last non-zero sys.exit, no step since
_place: str | None = None  # the script's line that called it
_real_exit = sys.exit  # what sys.exit was before install()
_prior_hook = threading.excepthook  # what threading.excepthook was before install()
on_thread_failure: Callable[[threading.Thread, BaseException], None] | None = None
"""Called with a thread and the exception it ended on (not a ``SystemExit``), in that
thread; set by the registry, which knows the monitors whose optimizers stepped in it."""
_real_os_exit = os._exit  # what os._exit was before install()
_owner = 0  # the process that installed: its os._exit closes its monitors first
on_hard_exit: Callable[[int], None] | None = None
"""Called with the status of an ``os._exit`` of the process that installed (not of a
forked worker), before it ends the process without ``atexit``: set by the monitors' exit
hook, which says their goodbyes with that status."""


def install() -> None:
    """Wrap ``sys.exit`` and the ``exit()``/``quit()`` builtins' call once per process."""
    global _installed, _real_exit, _prior_hook
    if _installed:
        return
    _installed = True
    _real_exit = sys.exit
    sys.exit = exit  # type: ignore[assignment]
    global _real_os_exit, _owner
    _real_os_exit, _owner = os._exit, os.getpid()
    os._exit = _os_exit
    _prior_hook = threading.excepthook
    threading.excepthook = _thread_ended
    quitter = type(getattr(builtins, "exit", None))
    if quitter.__module__ == "_sitebuiltins":  # absent under python -S; left alone if replaced
        quitter.__call__ = _quitting(quitter.__call__)  # type: ignore[method-assign]


def exit(*args: Any) -> None:  # noqa: A001  (it is sys.exit)
    try:
        _real_exit(*args)
    except SystemExit as leaving:
        try:
            _keep(leaving)
        except Exception:  # noqa: S110  (nothing of Sentinel's may change how the script leaves)
            pass
        raise


exit.__doc__ = _real_exit.__doc__
exit.__module__ = "sys"  # pickle finds it as sys.exit, the name it stands for
exit.__qualname__ = "exit"


def _os_exit(status: int) -> NoReturn:
    """``os._exit``: a script that ends itself this way after training (to skip a teardown
    that hangs) runs no ``atexit``, so its monitors said no goodbye, and its run was left
    running, or read as a crash. Their goodbyes go out first, with the status; a forked
    worker's ``os._exit`` (multiprocessing's, a DataLoader worker's) is passed straight on,
    and so is another thread's (a hang watchdog's ``os._exit(1)`` must not wait on a
    training thread that may hold what the goodbyes need: the engine records that end as
    a process gone without its goodbye)."""
    global _exiting, _place
    if on_hard_exit is not None and os.getpid() == _owner and threading.current_thread() is threading.main_thread():
        try:
            _exiting = SystemExit(status) if status else None
            _place = called_from(sys._getframe(1)) if status else None  # the caller of os._exit
            on_hard_exit(status)
        except BaseException:  # noqa: S110  (nothing of Sentinel's may change how the script leaves)
            pass
    _real_os_exit(status)


_os_exit.__doc__ = os._exit.__doc__
_os_exit.__module__ = "os"  # pickle finds it as os._exit, the name it stands for
_os_exit.__qualname__ = _os_exit.__name__ = "_exit"


def _thread_ended(args: Any) -> None:
    """``threading.excepthook``: the hook before it first (the traceback is printed as
    without Sentinel), then a training thread's failure goes to :data:`on_thread_failure`."""
    try:
        _prior_hook(args)
    finally:
        try:
            error, thread = args.exc_value, args.thread
            if on_thread_failure is not None and isinstance(error, Exception) and thread is not None:
                on_thread_failure(thread, error)
        except Exception:  # noqa: S110  (nothing of Sentinel's may change how the thread ends)
            pass


_thread_ended.__module__ = "threading"  # pickled (should anything) by the name it stands for
_thread_ended.__qualname__ = "excepthook"


def _quitting(call: Callable[..., Any]) -> Callable[..., Any]:
    """``site``'s ``Quitter.__call__`` (``exit(1)``, ``quit()``), keeping the exit it raises."""

    @functools.wraps(call)
    def __call__(self: object, *args: Any) -> None:  # noqa: N807  (it is the class's __call__)
        try:
            call(self, *args)
        except SystemExit as leaving:
            try:
                _keep(leaving)
            except Exception:  # noqa: S110  (as in exit above)
                pass
            raise

    return __call__


def _keep(leaving: SystemExit) -> None:
    global _exiting, _place
    if threading.current_thread() is not threading.main_thread():
        return  # it ends only its thread
    if exit_status(leaving):
        _exiting, _place = leaving, called_from(sys._getframe(2))  # the caller of sys.exit
    else:  # a clean end, whatever a caught exit before it said
        _exiting = _place = None


def place(error: BaseException | None) -> str | None:
    """The script's line that called ``sys.exit`` for ``error``, when :func:`error` is it."""
    return _place if error is not None and error is _exiting else None


def stepped() -> None:
    """An optimizer stepped: a ``sys.exit`` before it was caught, and the script went on."""
    global _exiting, _place
    _exiting = _place = None


def error() -> BaseException | None:
    """What the process leaves by, for the goodbye (call at exit): the uncaught exception,
    or the main thread's last non-zero ``sys.exit`` with no optimizer step since; None for
    a clean end."""
    last = getattr(sys, "last_value", None)
    if isinstance(last, BaseException):
        return last
    return _exiting


def exit_status(error: BaseException) -> int:
    """The status a process leaving by ``error`` exits with, as the interpreter turns it
    into one: a ``SystemExit``'s code (None: 0; an int: its low byte, what the system
    keeps; anything else is printed, and the status is 1); 1 for any other exception."""
    if not isinstance(error, SystemExit):
        return 1
    code = error.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1
