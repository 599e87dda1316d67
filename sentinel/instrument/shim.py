"""What ``hooks/sitecustomize.py`` calls: gated, idempotent, and never fatal."""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType

log = logging.getLogger("sentinel")
_done = False
PROGRAM_PID = "SENTINEL_PROGRAM_PID"
"""The environment's name for the pid of the watched Python whose children it names."""
PROGRAM_RANK = "SENTINEL_PROGRAM_RANK"
"""... and for that Python's ``RANK`` ("" when it had none)."""
_rank = ""  # this Python's RANK at start-up, for the programs it runs once it trains (watched)


def initialize(shim_file: str) -> None:
    """Install zero-code instrumentation if ``SENTINEL_AUTO=1``, then run the
    ``sitecustomize`` this shim shadows, if any. Safe to call more than once."""
    global _done
    if _done:
        return
    _done = True
    if os.environ.get("SENTINEL_AUTO") == "1":
        try:
            _own_run(os.environ)
        except Exception:
            log.debug("sentinel: could not tell a program run by another", exc_info=True)
        if "torch" in sys.modules:
            _install()
        else:  # most Pythons a launcher starts never import torch: don't make them pay for it
            sys.meta_path.insert(0, _AfterTorch())
    _chain(shim_file)


def _own_run(env: os._Environ[str]) -> None:
    """A program that a Python which trained ran as a process of its own
    (``subprocess.run([python, "eval.py"])`` after training: an evaluation that trains a
    linear probe) reports as a run of its own, ``RUN-eval``: under its parent's name it took
    the parent's rank, and the history read the training and each probe as restarts of one
    run, the last probe's loss its final one. Told apart from the ranks a launcher starts
    (torchrun's, Lightning's: each its own ``RANK``), from ``multiprocessing``'s spawned
    workers (the parent's own), and from the program a launcher that trains nothing starts
    (``accelerate launch``'s single process: its CLI imports torch; a sweep script's
    ``subprocess.run`` of each trial): the parent names its programs only once it trains
    (:func:`watched`)."""
    global _rank
    spawned = "--multiprocessing-fork" in getattr(sys, "orig_argv", ())
    rank, me = env.get("RANK", ""), str(os.getpid())
    parent = env.get(PROGRAM_PID)
    if (not spawned and parent is not None and parent != me and rank == env.get(PROGRAM_RANK, "")
            and env.get("SENTINEL_RUN")):
        name = _program_name()
        if name:
            env["SENTINEL_RUN"] = f"{env['SENTINEL_RUN']}-{name}"[:128]
    if not spawned:  # the programs this one runs keep its run until it trains
        _rank = rank
        env.pop(PROGRAM_PID, None)
        env.pop(PROGRAM_RANK, None)


def watched() -> None:
    """This Python trains (zero-code mode watches a model of it): the Python programs it runs
    from now on are programs of their own (:func:`_own_run`). Never raises."""
    try:
        if os.environ.get("SENTINEL_AUTO") == "1" and "--multiprocessing-fork" not in getattr(sys, "orig_argv", ()):
            os.environ[PROGRAM_PID], os.environ[PROGRAM_RANK] = str(os.getpid()), _rank
    except Exception:
        log.debug("sentinel: could not mark this process as training", exc_info=True)


def _program_name() -> str:
    """The script's name without ``.py``, or the module's of ``-m``."""
    argv = list(getattr(sys, "orig_argv", ()))
    name = ""
    if sys.argv and sys.argv[0] == "-m":
        i = argv.index("-m", 1) + 1 if "-m" in argv[1:] else len(argv)  # (not "-um": then no name)
        name = argv[i] if i < len(argv) else ""
    elif sys.argv and sys.argv[0] not in ("", "-c", "-"):
        name = os.path.splitext(os.path.basename(sys.argv[0]))[0]
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:64]


def _install() -> None:
    try:
        from sentinel.instrument import auto

        auto.install()
    except Exception:
        log.warning("sentinel: zero-code instrumentation failed to install", exc_info=True)


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Runs :func:`_install` right after ``import torch`` completes, whoever imports it."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            _install()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _chain(shim_file: str) -> None:
    here = os.path.dirname(os.path.abspath(shim_file))
    for entry in sys.path:
        folder = os.path.abspath(entry or os.getcwd())
        if folder == here:
            continue
        candidate = os.path.join(folder, "sitecustomize.py")
        if os.path.isfile(candidate):
            try:
                spec = importlib.util.spec_from_file_location("_sentinel_shadowed_sitecustomize", candidate)
                if spec is not None and spec.loader is not None:
                    module = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(module)
            except Exception:
                log.warning("sentinel: the shadowed sitecustomize %s failed", candidate, exc_info=True)
            return
