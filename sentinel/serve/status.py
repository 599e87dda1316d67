"""The read-only status page (``GET /``) and its assets, shipped in the package.

The page is static: ``static/index.html`` loads ``status.css`` and ``status.js`` from
``/static/``, and the script polls ``/api/v1/status`` (:mod:`sentinel.serve.snapshot`)
every two seconds. Nothing is loaded from anywhere else (the server's
Content-Security-Policy forbids it too), so it works offline and behind any firewall.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".png": "image/png", ".svg": "image/svg+xml"}


@lru_cache(maxsize=16)
def _read(name: str) -> bytes | None:
    if "/" in name or "\\" in name or name.startswith("."):
        return None
    try:
        return (resources.files("sentinel.serve") / "static" / name).read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def status_page() -> str:
    """The page's HTML."""
    page = _read("index.html")
    return "" if page is None else page.decode("utf-8")


def asset(name: str) -> tuple[bytes, str] | None:
    """``(body, content type)`` of a file under ``static/``; None for anything else."""
    suffix = name[name.rfind("."):] if "." in name else ""
    body = _read(name) if suffix in TYPES else None
    return None if body is None else (body, TYPES[suffix])
