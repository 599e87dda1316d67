"""The engine's HTTP server: ``/metrics``, ``/healthz``, ``/api/v1/alerts`` and a status page."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

log = logging.getLogger("sentinel")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class HttpServer:
    """Serves the engine on ``host:port`` from a background thread.

    Args:
        host, port: where to listen; port 0 picks a free one.
        registry: the Prometheus registry for ``/metrics``.
        alerts: returns the JSON body of ``/api/v1/alerts``.
        status_page: returns the HTML of ``/``.
        status: returns the JSON body of ``/api/v1/status`` for the query's parameters.
        assets: returns the body and content type of ``/static/<name>``, or None.
        healthy: returns True while the engine runs.
        exposition: renders ``/metrics`` for an ``Accept`` header, returning the body and
            content type (e.g. :meth:`StoreCollector.exposition`); prometheus_client's
            encoders over ``registry`` by default.
    """

    def __init__(self, host: str, port: int, registry: CollectorRegistry,
                 alerts: Callable[[], Any] | None = None,
                 status_page: Callable[[], str] | None = None,
                 healthy: Callable[[], bool] | None = None,
                 exposition: Callable[[str], tuple[bytes, str]] | None = None,
                 status: Callable[[dict[str, str]], Any] | None = None,
                 assets: Callable[[str], tuple[bytes, str] | None] | None = None) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path, _, qs = self.path.partition("?")
                try:
                    if path == "/metrics":
                        metrics, ctype = outer.exposition(self.headers.get("Accept", ""))
                        outer._reply(self, 200, ctype, metrics)
                    elif path == "/healthz":
                        ok = outer.healthy() if outer.healthy else True
                        outer._reply(self, 200 if ok else 503, "text/plain", b"ok\n" if ok else b"unhealthy\n")
                    elif path == "/api/v1/alerts":
                        body = outer.alerts() if outer.alerts else {"status": "success", "data": []}
                        outer._reply(self, 200, "application/json", json.dumps(body).encode())
                    elif path == "/api/v1/status" and outer.status is not None:
                        body = outer.status(dict(parse_qsl(qs)))
                        outer._reply(self, 200, "application/json", json.dumps(body, allow_nan=False).encode())
                    elif path == "/" and outer.status_page is not None:
                        outer._reply(self, 200, "text/html; charset=utf-8", outer.status_page().encode())
                    elif path.startswith("/static/") and outer.assets is not None:
                        asset = outer.assets(path.removeprefix("/static/"))
                        if asset is None:
                            outer._reply(self, 404, "text/plain", b"not found\n")
                        else:
                            outer._reply(self, 200, asset[1], asset[0])
                    else:
                        outer._reply(self, 404, "text/plain", b"not found\n")
                except Exception:
                    log.warning("sentinel http: error serving %s", path, exc_info=True)
                    outer._reply(self, 500, "text/plain", b"internal error\n")

            def log_message(self, format: str, *args: Any) -> None:
                pass  # scrapes every few seconds would flood the training log

        self.registry = registry
        self.alerts = alerts
        self.status_page = status_page
        self.healthy = healthy
        self.exposition = exposition or self._encode
        self.status = status
        self.assets = assets
        self._server = _Server((host, port), Handler)
        self.host, self.port = str(self._server.server_address[0]), int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="sentinel-http",
                                        daemon=True)
        self._thread.start()

    def _encode(self, accept: str) -> tuple[bytes, str]:
        encoder, ctype = choose_encoder(accept)
        return encoder(self.registry), ctype

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @staticmethod
    def _reply(handler: BaseHTTPRequestHandler, code: int, ctype: str, body: bytes) -> None:
        handler.send_response(code)
        handler.send_header("Content-Type", ctype)
        handler.send_header("Content-Length", str(len(body)))
        # read-only and self-contained: the page may load nothing from anywhere else
        handler.send_header("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; "
                                                        "style-src 'self'; script-src 'self'; connect-src 'self'")
        handler.send_header("Cache-Control", "no-store")
        handler.end_headers()
        handler.wfile.write(body)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
