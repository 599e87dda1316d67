"""``sentinel run`` says at once when the command's Python cannot load Sentinel: ``-I`` and
``-E`` ignore ``PYTHONPATH`` (the shim's way in), ``-S`` imports no ``site`` (which runs it).
The options are read as CPython reads them, up to the script, ``-c`` or ``-m``."""

from __future__ import annotations

import pytest

from sentinel.run import unloadable


@pytest.mark.parametrize(("cmd", "flag"), [
    (["python", "-I", "train.py"], "-I"),
    (["/usr/bin/python3.11", "-u", "-E", "train.py"], "-E"),
    (["python", "-uI", "train.py"], "-I"),  # flags grouped in one argument
    (["python", "-W", "error", "-S", "train.py"], "-S"),  # past -W's value in the next argument
    (["python", "-Werror", "-X", "importtime", "-E", "train.py"], "-E"),
    (["python", "-WI", "train.py"], None),  # "I" is -W's value here
    (["python", "-X", "I", "train.py"], None),
    (["python", "train.py", "-I"], None),  # the script's own argument
    (["python", "-m", "torch.distributed.run", "-I"], None),
    (["python", "-c", "import x", "-E"], None),
    (["python", "-sB", "train.py"], None),  # -s (no user site) keeps PYTHONPATH
    (["torchrun", "-I", "train.py"], None),  # not a Python interpreter's options
    (["bash", "-E", "run.sh"], None),
])
def test_the_options_that_keep_sentinel_out(cmd: list[str], flag: str | None) -> None:
    assert unloadable(cmd) == flag
