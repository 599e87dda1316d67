"""The goodbye's word on the exception that ends training (``sentinel.instrument.raised``):
its type and the script's line it came through, never its message."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sentinel import wire
from sentinel.instrument.raised import raised

SCRIPT = '''
import torch
model = torch.nn.Linear(4, 2)

def step(x):
    return model(x).sum()

def main(width):
    loss = step(torch.randn(8, width))
    if width == 4:
        raise KeyError("token-3f9a8c1d2e7b6a5f4e3d2c1b")
    return loss
'''


def _caught(tmp_path: Path, width: int) -> BaseException:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    scope: dict[str, object] = {"__name__": "train"}
    exec(compile(SCRIPT, str(path), "exec"), scope)
    try:
        scope["main"](width)  # type: ignore[operator]
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise AssertionError("it did not raise")


def test_an_error_inside_torch_names_the_scripts_line_that_called_it(tmp_path: Path) -> None:
    error = _caught(tmp_path, 5)  # mat1 and mat2 shapes cannot be multiplied, raised in torch
    assert raised(error) == "RuntimeError at train.py:6"  # step()'s line, not torch's nor main()'s


def test_an_error_the_script_raises_names_its_line_and_never_its_message(tmp_path: Path) -> None:
    error = _caught(tmp_path, 4)
    assert raised(error) == "KeyError at train.py:11"
    assert "token" not in raised(error)


def test_an_error_with_no_frame_of_the_script_is_its_type() -> None:
    assert raised(ValueError("no traceback")) == "ValueError"
    try:
        json.loads("{")  # raised two frames down, in Python's own json
    except ValueError as exc:
        tb = exc.__traceback__
        assert tb is not None and tb.tb_next is not None
        exc.__traceback__ = tb.tb_next  # without this file's frame, only the library's are left
        assert raised(exc) == "JSONDecodeError"


def test_a_sys_exit_names_its_code_and_the_error_it_was_handling(tmp_path: Path) -> None:
    """hydra's wrapper, and many scripts' own, print the error and call ``sys.exit(1)``."""
    error = _caught(tmp_path, 5)
    try:
        try:
            raise error
        except RuntimeError:
            sys.exit(1)
    except SystemExit as leaving:
        assert raised(leaving).startswith("SystemExit(1) at test_raised.py:")  # its traceback says where
        leaving.__traceback__ = None  # as Python 3.11 leaves it at exit: the sys.exit call's frame alone
        word = raised(leaving, "train.py:40")  # where leaving.py saw sys.exit called
    assert word == "SystemExit(1) at train.py:40, handling RuntimeError at train.py:6", word


def test_a_sys_exit_with_a_message_never_says_it() -> None:
    assert raised(SystemExit("token-3f9a8c1d2e7b6a5f4e3d2c1b"), "train.py:9") == "SystemExit at train.py:9"
    assert raised(SystemExit(None)) == "SystemExit"


def test_a_long_name_still_fits_the_goodbye_frame(tmp_path: Path) -> None:
    """The word goes in the goodbye frame's ``exc`` (200 characters at most): a generated
    exception class with a 300-character name, raised from a file with a long name, still
    makes a frame the engine's strict decode takes."""
    long_error = type("E" * 300, (RuntimeError,), {})
    path = tmp_path / ("train_" + "x" * 150 + ".py")
    code = compile("def boom(cls):\n    raise cls('no')\n", str(path), "exec")
    scope: dict[str, object] = {}
    exec(code, scope)
    try:
        scope["boom"](long_error)  # type: ignore[operator]
    except RuntimeError as exc:
        word = raised(exc)
    assert len(word) <= 200 and word.startswith("E" * 100 + " at train_") and word.endswith(":2"), word
    bye = wire.Frame(kind="bye", job="j", run="r", rank=0, world=1, step=3, t=1.0, exc=word)
    assert wire.decode_strict(wire.encode(bye)).exc == word
