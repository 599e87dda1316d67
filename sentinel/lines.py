"""Sentinel's log lines on a stderr it shares with a training script.

Under ``sentinel run`` and inside an instrumented script, every line Sentinel writes starts
with ``sentinel:`` (the README's contract: a user can tell its lines from the script's, and
filter them out), carries no time stamp of its own, and names its part once:
``sentinel: notify: delivery on route 0 ... failed``. A library's record that reaches the
handler (apprise's "A Connection error occurred ...") gets its logger's name after the
prefix, and each line of a traceback gets the prefix too.
"""

from __future__ import annotations

import logging

PREFIX = "sentinel: "


class ScriptLines(logging.Formatter):
    """Formats a record as ``sentinel: [part: ]message``, one prefix per line."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if text.startswith(PREFIX):
            text = text[len(PREFIX):]
        elif text.startswith("sentinel "):  # "sentinel notify: ..." → "notify: ..."
            text = text[len("sentinel "):]
        if record.name != "sentinel" and not record.name.startswith("sentinel."):
            text = f"{record.name}: {text}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return "\n".join(PREFIX + line for line in text.splitlines() or [""])
