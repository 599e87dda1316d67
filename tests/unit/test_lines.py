"""Sentinel's log lines on a script's stderr (``sentinel.lines``): one ``sentinel:`` prefix
on every line, its part named once, another library's name kept, a traceback prefixed."""

from __future__ import annotations

import logging

from sentinel.lines import ScriptLines


def _line(name: str, msg: str, *args: object, exc: bool = False) -> str:
    record = logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, None)
    if exc:
        try:
            raise ValueError("bad frame")
        except ValueError:
            import sys

            record.exc_info = sys.exc_info()
    return ScriptLines().format(record)


def test_a_part_is_named_after_one_prefix() -> None:
    assert _line("sentinel", "sentinel notify: delivery on %s failed", "route 0") == \
        "sentinel: notify: delivery on route 0 failed"
    assert _line("sentinel", "sentinel: 127.0.0.1:9400 is in use") == "sentinel: 127.0.0.1:9400 is in use"
    assert _line("sentinel.engine", "no prefix of its own") == "sentinel: no prefix of its own"


def test_another_librarys_record_keeps_its_name() -> None:
    assert _line("apprise", "A Connection error occurred.") == "sentinel: apprise: A Connection error occurred."


def test_every_line_of_a_traceback_is_prefixed() -> None:
    text = _line("sentinel", "sentinel engine: error in the rule tick", exc=True)
    lines = text.splitlines()
    assert lines[0] == "sentinel: engine: error in the rule tick"
    assert lines[1] == "sentinel: Traceback (most recent call last):" and lines[-1] == "sentinel: ValueError: bad frame"
    assert all(line.startswith("sentinel: ") for line in lines)
