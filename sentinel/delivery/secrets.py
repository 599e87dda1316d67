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

_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://[^\s'\"<>()…]+")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*$")


def scheme_of(url: str) -> str:
    """``slack`` for ``slack://T/B/X``; ``?`` when there is no readable scheme."""
    head, sep, _ = url.partition("://")
    return head.lower() if sep and _SCHEME.match(head) and len(head) <= 32 else "?"


def describe(index: int | str, url: str) -> str:
    """``#1 (slack://…)``: how a URL may appear in a log line, an error or CLI output."""
    return f"#{index} ({scheme_of(url)}://…)"


_KNOWN: set[str] = set()
"""Every secret URL seen, and the parts of it that are tokens: redacted wherever they appear
(a library's error may quote a URL's path without its scheme)."""


def remember(url: str) -> None:
    """Register ``url`` and its token-like parts (user, password, path and query pieces,
    a host name that is not a domain or an address) for redaction."""
    from urllib.parse import parse_qsl, urlsplit

    _KNOWN.add(url)
    try:
        parts = urlsplit(url)
        pieces = [parts.username or "", parts.password or ""]
        host = parts.hostname or ""
        if host and "." not in host and ":" not in host and host != "localhost":
            pieces.append(host)
        pieces += [p for p in parts.path.split("/")]
        pieces += [v for _, v in parse_qsl(parts.query)]
    except ValueError:
        pieces = []
    _KNOWN.update(p for p in pieces if len(p) >= 4)


def redact_text(text: str, every_url: bool = True) -> str:
    """Every ``scheme://anything`` in ``text`` becomes ``scheme://…`` (unless
    ``every_url`` is False), and every remembered secret or token-like part of one ``…``."""
    if every_url:
        text = _URL.sub(lambda m: f"{m.group(1)}://…", text)
    for secret in sorted(_KNOWN, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, "…")
    return text


class RedactingFilter(logging.Filter):
    """Rewrites a record's message so that no URL survives, whatever the level.

    Args:
        every_url: redact every URL; False redacts only the remembered secrets (for
            sentinel's own logger, which may name its own /metrics address).
    """

    def __init__(self, every_url: bool = True) -> None:
        super().__init__()
        self.every_url = every_url

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: keep only the template
            message = str(record.msg)
        record.msg = redact_text(message, self.every_url)
        record.args = None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info), self.every_url)
            record.exc_info = None
        return True


_FILTER = RedactingFilter()
_OWN = RedactingFilter(every_url=False)
_GUARDED = ("apprise", "urllib3", "urllib3.connectionpool", "urllib3.connection", "urllib3.util.retry",
            "requests", "requests_oauthlib", "oauthlib")


def guard_apprise_log() -> None:
    """Hold the ``apprise`` logger at WARNING and redact every record it emits, and those of
    the HTTP stack under it (urllib3 logs request paths, where webhook tokens live, at
    DEBUG) and sentinel's own (which name URLs by index and scheme already). A logger's
    filter sees only records made by that very logger, so each one is named."""
    logger = logging.getLogger("apprise")
    if logger.level == logging.NOTSET or logger.level < logging.WARNING:
        logger.setLevel(logging.WARNING)
    for name in _GUARDED:
        lg = logging.getLogger(name)
        if _FILTER not in lg.filters:
            lg.addFilter(_FILTER)
    own = logging.getLogger("sentinel")
    if _OWN not in own.filters:
        own.addFilter(_OWN)


def load_url(url: str) -> Any | None:
    """The apprise plugin object for ``url``, or None when apprise cannot parse it.

    apprise is imported here, lazily: only the daemon side pays for it.
    """
    guard_apprise_log()
    remember(url)
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
