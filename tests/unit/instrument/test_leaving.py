"""How a script leaves, for its goodbye (``sentinel.instrument.leaving``): ``sys.exit`` is
the same call, wrapped; the main thread's non-zero exit is what the goodbye names, with its
code and the script's line, until an optimizer steps after it."""

from __future__ import annotations

import os
import pickle
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from sentinel.instrument import hooks, leaving
from tests.helpers import MLP, make_monitor, train_steps

SCRIPT = '''
import sys

def check(loss_value):
    if loss_value != loss_value:
        print("Loss is nan, stopping training")
        sys.exit(1)
'''


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    leaving.install()
    monkeypatch.delattr(sys, "last_value", raising=False)  # pytest keeps a failed test's there
    leaving.stepped()
    yield
    leaving.stepped()


def _exits(tmp_path: Path) -> SystemExit:
    """The script's check, run from its file: it calls sys.exit(1) at train.py:7."""
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    scope: dict[str, object] = {"__name__": "train"}
    exec(compile(SCRIPT, str(path), "exec"), scope)
    with pytest.raises(SystemExit) as caught:
        scope["check"](float("nan"))  # type: ignore[operator]
    return caught.value


@pytest.mark.parametrize("name", ["exit", "quit"])
def test_the_exit_builtins_are_kept_as_sys_exit_is(name: str, tmp_path: Path) -> None:
    """``print("NaN loss"); exit(1)``: site's ``exit()`` and ``quit()`` are the same objects,
    and their non-zero exit is named with the script's line."""
    call = getattr(__import__("builtins"), name)
    assert type(call).__module__ == "_sitebuiltins" and repr(call).startswith(f"Use {name}() or ")
    assert pickle.loads(pickle.dumps(type(call))) is type(call)
    path = tmp_path / "train.py"
    path.write_text(f"def check():\n    {name}(2)\n")
    scope: dict[str, object] = {"__name__": "train"}
    exec(compile(path.read_text(), str(path), "exec"), scope)
    with pytest.raises(SystemExit) as caught:
        scope["check"]()  # type: ignore[operator]
    assert caught.value.code == 2 and caught.value.args == (2,)
    assert leaving.error() is caught.value and leaving.place(caught.value) == "train.py:2"
    with pytest.raises(SystemExit) as caught:
        call()
    assert caught.value.code is None and leaving.error() is None  # a clean end, after the caught exit(2)


def test_sys_exit_is_the_same_call() -> None:
    assert sys.exit is leaving.exit
    for args, code in [((), None), ((3,), 3), (("bad config",), "bad config"), ((None,), None)]:
        with pytest.raises(SystemExit) as caught:
            sys.exit(*args)
        assert caught.value.code == code and caught.value.args == (() if code is None else args)
    with pytest.raises(TypeError):
        sys.exit(1, 2)  # type: ignore[call-arg]
    # a program that pickles sys.exit (a multiprocessing target) gets the name, not Sentinel's function
    assert b"sentinel" not in pickle.dumps(sys.exit) and pickle.loads(pickle.dumps(sys.exit)) is sys.exit


def test_os_exit_is_the_same_call_and_pickles_by_its_name() -> None:
    """``os._exit`` is wrapped too (its goodbyes first: no ``atexit`` runs), and a forked
    worker's passes straight on (tests/integration/test_watch_exit.py runs both)."""
    assert os._exit is leaving._os_exit and os._exit.__name__ == "_exit"
    assert b"sentinel" not in pickle.dumps(os._exit) and pickle.loads(pickle.dumps(os._exit)) is os._exit
    pid = os.fork()
    if pid == 0:  # the child: not the process that installed, so nothing of Sentinel's runs
        leaving.on_hard_exit = lambda status: leaving._real_os_exit(99)
        os._exit(7)
    assert os.waitpid(pid, 0)[1] >> 8 == 7


def test_os_exit_from_another_thread_runs_nothing_of_sentinels(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hang watchdog's ``os._exit(1)`` in a thread of its own: no goodbye, which could wait
    on the stuck training thread; the process ends at once."""
    called, ended = [], []
    monkeypatch.setattr(leaving, "on_hard_exit", called.append)
    monkeypatch.setattr(leaving, "_real_os_exit", ended.append)
    watchdog = threading.Thread(target=os._exit, args=(1,))
    watchdog.start()
    watchdog.join()
    assert called == [] and ended == [1]
    os._exit(0)  # the main thread's: the goodbyes first (the real exit is the stand-in above)
    assert called == [0] and ended == [1, 0]


def test_a_non_zero_exit_is_what_the_goodbye_names_with_its_code_and_line(tmp_path: Path) -> None:
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mon, sender = make_monitor(model, opt)
    train_steps(model, opt, 6, mon)
    error = _exits(tmp_path)
    assert leaving.error() is error and leaving.place(error) == "train.py:7"
    mon.close(leaving.error())  # as atexit does
    [bye] = [f for f in sender.frames if f["kind"] == "bye"]
    assert bye["status"] == 1 and bye["exc"] == "SystemExit(1) at train.py:7", bye
    [alert] = [a for a in sender.engine.alerts_json() if a["alertname"] == "TrainingCrashed"]
    assert "exited with status 1; SystemExit(1) at train.py:7;" in alert["summary"], alert


def test_an_exit_caught_before_an_optimizer_step_is_forgotten(tmp_path: Path) -> None:
    _exits(tmp_path)  # caught: the script goes on
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    mon, sender = make_monitor(model, opt)
    train_steps(model, opt, 3, mon)
    assert leaving.error() is None
    mon.close(leaving.error())
    [bye] = [f for f in sender.frames if f["kind"] == "bye"]
    assert "exc" not in bye and "status" not in bye, bye


@pytest.mark.parametrize("code", [0, None, False, 256])
def test_an_exit_with_status_0_is_a_clean_end(code: object) -> None:
    with pytest.raises(SystemExit):
        sys.exit(code)
    assert leaving.error() is None


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_another_threads_exit_ends_only_that_thread() -> None:
    def worker() -> None:
        sys.exit(2)  # ends the thread, silently; the script goes on

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert leaving.error() is None


def test_a_watched_script_that_raises_says_so_in_its_goodbye(monkeypatch: pytest.MonkeyPatch) -> None:
    """``sentinel.watch`` without ``with``: its monitor is closed at exit; after an uncaught
    exception (``sys.last_value``, as the interpreter leaves it) the goodbye names it."""
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    mon, sender = make_monitor(model, opt)
    train_steps(model, opt, 3, mon)
    try:
        raise KeyError("token-3f9a8c1d")
    except KeyError as exc:
        monkeypatch.setattr(sys, "last_value", exc, raising=False)
    hooks._close_live()
    [bye] = [f for f in sender.frames if f["kind"] == "bye"]
    assert bye["exc"].startswith("KeyError at test_leaving.py:") and "status" not in bye, bye


def _train_in_thread(model: torch.nn.Module, opt: torch.optim.Optimizer, mon: object, fail: bool,
                     name: str = "trainer") -> None:
    """A web UI's or a server's shape: the loop runs in a thread; with ``fail`` it raises
    after 3 steps, uncaught, and the main thread goes on."""

    def loop() -> None:
        train_steps(model, opt, 3, mon)
        if fail:
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    t = threading.Thread(target=loop, name=name)
    t.start()
    t.join()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_training_thread_that_fails_says_so_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    """The thread that stepped the optimizer ends on an uncaught exception: its monitor says
    goodbye then, naming the exception, the script's line and the thread (the process goes
    on, and would exit 0); the thread's traceback is printed as without Sentinel."""
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    mon, sender = make_monitor(model, opt)
    before = threading.excepthook

    def printing(args: threading.ExceptHookArgs) -> None:
        print("their hook:", args.exc_type.__name__)

    leaving._prior_hook, prior = printing, leaving._prior_hook  # a hook the script set before Sentinel's
    try:
        _train_in_thread(model, opt, mon, fail=True)
    finally:
        leaving._prior_hook = prior
    assert threading.excepthook is before
    assert mon.closed
    [bye] = [f for f in sender.frames if f["kind"] == "bye"]
    assert bye["exc"].startswith("RuntimeError at test_leaving.py:") and bye["thread"] == "trainer", bye
    assert "status" not in bye and bye["step"] == 3
    assert "their hook: RuntimeError" in capsys.readouterr().out
    assert leaving.error() is None  # the main thread's own end is still clean


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_failure_of_a_thread_that_did_not_train_leaves_the_monitors_alone() -> None:
    """A helper thread (a logger's, a prefetcher's) fails while the main thread trains: no
    monitor closes; and a training thread that ends cleanly leaves its monitor open too."""
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    mon, sender = make_monitor(model, opt)
    train_steps(model, opt, 2, mon)

    def helper() -> None:
        raise OSError("disk full")

    t = threading.Thread(target=helper)
    t.start()
    t.join()
    _train_in_thread(model, opt, mon, fail=False)
    assert not mon.closed and not [f for f in sender.frames if f["kind"] == "bye"]
    mon.close()
    [bye] = [f for f in sender.frames if f["kind"] == "bye"]
    assert "exc" not in bye and "thread" not in bye and bye["step"] == 5
