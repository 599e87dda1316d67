"""Notification URLs are secrets: parse them with apprise's own parser, name them by index
and scheme only, and keep apprise's log output free of them at every level.

:func:`check_url` is what config validation calls; :func:`guard_apprise_log` installs
the redacting filter (idempotent) and holds apprise's logger at WARNING, because its
DEBUG output prints webhook tokens and its ERROR lines print an unparseable URL whole.
"""

from __future__ import annotations

import logging
import re
from typing import Any

_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://[^\s'\"<>]*")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*$")


def scheme_of(url: str) -> str:
    """``slack`` for ``slack://T/B/X``; ``?`` when there is no readable scheme."""
    head, sep, _ = url.partition("://")
    return head.lower() if sep and _SCHEME.match(head) and len(head) <= 32 else "?"


def describe(index: int | str, url: str) -> str:
    """``#1 (slack://…)``: how a URL may appear in a log line, an error or CLI output."""
    return f"#{index} ({scheme_of(url)}://…)"


def redact_text(text: str) -> str:
    """Every ``scheme://anything`` in ``text`` becomes ``scheme://…``."""
    return _URL.sub(lambda m: f"{m.group(1)}://…", text)


class RedactingFilter(logging.Filter):
    """Rewrites a record's message so that no URL survives, whatever the level."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: keep only the template
            message = str(record.msg)
        record.msg = redact_text(message)
        record.args = None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


_FILTER = RedactingFilter()


def guard_apprise_log() -> None:
    """Hold the ``apprise`` logger at WARNING and redact every record it emits."""
    logger = logging.getLogger("apprise")
    if logger.level == logging.NOTSET or logger.level < logging.WARNING:
        logger.setLevel(logging.WARNING)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)


def load_url(url: str) -> Any | None:
    """The apprise plugin object for ``url``, or None when apprise cannot parse it.

    apprise is imported here, lazily: only the daemon side pays for it.
    """
    guard_apprise_log()
    import apprise

    try:
        return apprise.Apprise.instantiate(url, suppress_exceptions=True)
    except Exception:  # a plugin's constructor may raise despite suppress_exceptions
        return None


def check_url(url: str) -> str | None:
    """None if apprise parses ``url``; else ``cannot parse a <scheme>:// URL`` (no secret)."""
    if load_url(url) is None:
        return f"cannot parse a {scheme_of(url)}:// URL"
    return None
