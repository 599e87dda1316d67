"""The engine's HTTP server: ``/metrics``, ``/healthz``, ``/api/v1/alerts`` and a status page.

The standard library's HTTP/1.1 parser behind a bounded worker pool, rather than a thread
per connection: a listen backlog of :data:`BACKLOG`, :data:`WORKERS` threads, a bounded
queue of accepted connections (past it, an immediate 503), a deadline for a request's
TLS handshake and headers and for an idle keep-alive connection (a watchdog shuts down
sockets past theirs, so a slow client cannot hold a worker by trickling bytes), ``HEAD``,
and no version banner. TLS, mutual TLS and basic auth come from an exporter-toolkit web
config file (:mod:`sentinel.serve.webconfig`). On a loopback bind, requests whose
``Host`` is not a loopback name are refused (DNS rebinding: a web page the user visits
must not read the alerts through a name that resolves to 127.0.0.1).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import queue
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from sentinel.serve.webconfig import WebSecurity
from sentinel.store import Row

log = logging.getLogger("sentinel")

BACKLOG = 1024
"""Connections the kernel queues before the server accepts them (capped by somaxconn)."""
WORKERS = 16
"""Threads serving requests."""
PENDING = 512
"""Accepted connections waiting for a worker; past that a connection gets a 503 at once."""
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
         b"Retry-After: 1\r\nConnection: close\r\n\r\nbusy\n")


def is_loopback(host: str) -> bool:
    """Whether a bind address or a ``Host`` name stays on this machine."""
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, url: str, web: WebSecurity | None) -> str | None:
    """The warning a server bound to ``host`` logs at start: one off this machine with
    neither TLS nor basic auth serves the metrics and alerts to anyone who reaches it."""
    if is_loopback(host) or (web is not None and (web.tls or web.auth)):
        return None
    return (f"sentinel http: serving {url} on {host} without TLS or basic auth: anyone who can reach this "
            "address reads the metrics and alerts; pass --web.config.file (tls_server_config, "
            "basic_auth_users) or listen on 127.0.0.1")


def _host_name(header: str) -> str:
    """The name of a ``Host`` header without its port (``[::1]:9400`` → ``[::1]``)."""
    header = header.strip()
    if header.startswith("["):
        return header[: header.find("]") + 1]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class _Deadlines:
    """Sockets with a deadline; a watchdog thread shuts down those past theirs and counts
    the clients that were too slow (an idle keep-alive connection closed is not one)."""

    def __init__(self) -> None:
        self._at: dict[socket.socket, tuple[float, bool]] = {}
        self._lock = threading.Lock()
        self.expired = 0  # slow clients cut off: a handshake, headers or a reply not done in time

    def arm(self, sock: socket.socket, seconds: float, slow: bool = True) -> None:
        """Shut ``sock`` down in ``seconds``; ``slow``: count it as a slow client then."""
        with self._lock:
            self._at[sock] = (time.monotonic() + seconds, slow)

    def expire(self, sock: socket.socket) -> None:
        """``sock``'s own timeout struck first: counted as the watchdog would have (once)."""
        with self._lock:
            entry = self._at.pop(sock, None)
            if entry is not None:
                self.expired += entry[1]

    def disarm(self, sock: socket.socket) -> None:
        with self._lock:
            self._at.pop(sock, None)

    def reap(self) -> None:
        now = time.monotonic()
        with self._lock:  # the worker disarms before it closes, so the fd is still this socket's
            for sock in [s for s, (at, _) in self._at.items() if at <= now]:
                self.expired += self._at.pop(sock)[1]
                try:
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the TCP socket, under any TLS
                except OSError:
                    pass


class _PoolServer(socketserver.TCPServer):
    request_queue_size = BACKLOG
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], owner: HttpServer) -> None:
        self.owner = owner
        self.deadlines = _Deadlines()
        self.jobs: queue.Queue[tuple[socket.socket, Any] | None] = queue.Queue(PENDING)
        self.busy = 0
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            self.jobs.put_nowait((request, client_address))
        except queue.Full:
            self.busy += 1
            try:
                request.setblocking(False)
                request.send(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)

    def work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            request, address = job
            owner = self.owner
            try:
                request.settimeout(owner.header_timeout)
                self.deadlines.arm(request, owner.header_timeout)
                if owner.web is not None and owner.web.context is not None:
                    raw = request
                    request = owner.web.context.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
                    self.deadlines.disarm(raw)  # detached now: the TLS socket owns the fd
                    self.deadlines.arm(request, owner.header_timeout)
                    request.do_handshake()
                self.finish_request(request, address)
            except TimeoutError:
                self.deadlines.expire(request)  # a TLS handshake not done in time
            except (OSError, ssl.SSLError, ValueError):
                pass  # a client that failed the handshake or went away
            except Exception:
                log.warning("sentinel http: error serving a connection", exc_info=True)
            finally:
                self.deadlines.disarm(request)
                self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # socketserver would print a traceback to stderr


class HttpServer:
    """Serves the engine on ``host:port`` from background threads.

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
        web: TLS and basic auth (:func:`~sentinel.serve.webconfig.load_web_config`).
        header_timeout: seconds for a connection's TLS handshake and a request's headers.
        idle_timeout: seconds a keep-alive connection may wait for its next request.
        workers: threads serving requests.

    Raises:
        OSError: the address cannot be bound.
    """

    def __init__(self, host: str, port: int, registry: CollectorRegistry,
                 alerts: Callable[[], Any] | None = None,
                 status_page: Callable[[], str] | None = None,
                 healthy: Callable[[], bool] | None = None,
                 exposition: Callable[[str], tuple[bytes, str]] | None = None,
                 status: Callable[[dict[str, str]], Any] | None = None,
                 assets: Callable[[str], tuple[bytes, str] | None] | None = None,
                 web: WebSecurity | None = None, header_timeout: float = 10.0, idle_timeout: float = 10.0,
                 workers: int = WORKERS) -> None:
        self.registry = registry
        self.alerts = alerts
        self.status_page = status_page
        self.healthy = healthy
        self.exposition = exposition or self._encode
        self.status = status
        self.assets = assets
        self.web = web
        self.header_timeout, self.idle_timeout = header_timeout, idle_timeout
        self.loopback = is_loopback(host)
        self.refused_hosts = 0
        self.refused_certs = 0
        self.unauthorized = 0
        server_class = type("_Server", (_PoolServer,), {"address_family": socket.AF_INET6 if ":" in host
                                                        else socket.AF_INET})
        self._server: _PoolServer = server_class((host, port), _handler_class(self), self)
        self.host, self.port = str(self._server.server_address[0]), int(self._server.server_address[1])
        self._stopping = threading.Event()
        self._threads = [threading.Thread(target=self._server.work, name=f"sentinel-http-{i}", daemon=True)
                         for i in range(workers)]
        self._threads.append(threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                              name="sentinel-http", daemon=True))
        self._threads.append(threading.Thread(target=self._watch, name="sentinel-http-watch", daemon=True))
        for t in self._threads:
            t.start()
        warning = exposure_warning(host, self.url, web)
        if warning is not None:
            log.warning("%s", warning)

    def _watch(self) -> None:
        while not self._stopping.wait(0.2):
            self._server.deadlines.reap()

    def _encode(self, accept: str) -> tuple[bytes, str]:
        encoder, ctype = choose_encoder(accept)
        return encoder(self.registry), ctype

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self.web is not None and self.web.tls else "http"
        return f"{scheme}://{host}:{self.port}"

    @property
    def stats(self) -> dict[str, int]:
        """What the server refused or cut off, by reason: connections past the queue
        (``busy``, a 503), slow clients cut off at a deadline (``timeout``), requests refused
        for their ``Host`` (``host``, a 403), their client certificate (``cert``, a 403) or
        their credentials (``auth``, a 401)."""
        return {"busy": self._server.busy, "timeout": self._server.deadlines.expired,
                "host": self.refused_hosts, "cert": self.refused_certs, "auth": self.unauthorized}

    def rows(self) -> Iterator[Row]:
        """:attr:`stats` as ``sentinel_daemon_http_refused_total{reason}``, for /metrics."""
        for reason, n in self.stats.items():
            yield ("sentinel_daemon_http_refused_total", "counter", (("reason", reason),), float(n))

    def respond(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        """Answer one GET or HEAD request."""
        path, _, qs = h.path.partition("?")
        if self.loopback and h.headers.get("Host") is not None and not is_loopback(_host_name(h.headers["Host"])):
            self.refused_hosts += 1
            self._reply(h, head, 403, "text/plain", b"forbidden: this server answers loopback names only\n")
            return
        web = self.web
        if web is not None and web.context is not None and not web.peer_allowed(_peer_cert(h)):
            self.refused_certs += 1
            self._reply(h, head, 403, "text/plain", b"forbidden: client certificate not allowed\n")
            return
        if web is not None and not web.authorized(h.headers.get("Authorization")):
            self.unauthorized += 1
            self._reply(h, head, 401, "text/plain", b"unauthorized\n",
                        {"WWW-Authenticate": 'Basic realm="sentinel", charset="UTF-8"'})
            return
        try:
            if path == "/metrics":
                body, ctype = self.exposition(h.headers.get("Accept", ""))
                self._reply(h, head, 200, ctype, body)
            elif path == "/healthz":
                ok = self.healthy() if self.healthy else True
                self._reply(h, head, 200 if ok else 503, "text/plain", b"ok\n" if ok else b"unhealthy\n")
            elif path == "/api/v1/alerts":
                doc = self.alerts() if self.alerts else {"status": "success", "data": []}
                self._reply(h, head, 200, "application/json", json.dumps(doc).encode())
            elif path == "/api/v1/status" and self.status is not None:
                doc = self.status(dict(parse_qsl(qs)))
                self._reply(h, head, 200, "application/json", json.dumps(doc, allow_nan=False).encode())
            elif path == "/" and self.status_page is not None:
                self._reply(h, head, 200, "text/html; charset=utf-8", self.status_page().encode())
            elif path.startswith("/static/") and self.assets is not None:
                found = self.assets(path.removeprefix("/static/"))
                if found is None:
                    self._reply(h, head, 404, "text/plain", b"not found\n")
                else:
                    self._reply(h, head, 200, found[1], found[0])
            else:
                self._reply(h, head, 404, "text/plain", b"not found\n")
        except (OSError, ssl.SSLError):
            raise  # the client went away mid-reply
        except Exception:
            log.warning("sentinel http: error serving %s", path, exc_info=True)
            self._reply(h, head, 500, "text/plain", b"internal error\n")

    def _reply(self, h: BaseHTTPRequestHandler, head: bool, code: int, ctype: str, body: bytes,
               extra: dict[str, str] | None = None) -> None:
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.send_header("X-Content-Type-Options", "nosniff")
        # read-only and self-contained: the status page may load nothing from anywhere else
        h.send_header("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; "
                                                 "style-src 'self'; script-src 'self'; connect-src 'self'")
        h.send_header("Cache-Control", "no-store")
        for k, v in {**(self.web.headers if self.web is not None else {}), **(extra or {})}.items():
            h.send_header(k, v)
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        for _ in self._threads:
            self._server.jobs.put(None)
        for t in self._threads:
            t.join(2.0)


def _peer_cert(h: BaseHTTPRequestHandler) -> dict[str, Any] | None:
    conn = h.connection
    return conn.getpeercert() if isinstance(conn, ssl.SSLSocket) else None


def _handler_class(server: HttpServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive for Prometheus; every reply has a length
        default_request_version = "HTTP/1.0"  # never an HTTP/0.9 reply: status line and headers always
        server_version = "sentinel"
        sys_version = ""

        def setup(self) -> None:
            super().setup()
            self._served = 0

        def version_string(self) -> str:
            return "sentinel"  # no Python or library version for a scanner to match

        def handle_one_request(self) -> None:
            deadlines = self.server.deadlines  # type: ignore[attr-defined]
            # the first request's headers must come within the header timeout; a kept-alive
            # connection may wait the idle timeout for its next one
            if self._served == 0:
                deadlines.arm(self.connection, server.header_timeout)
            else:  # closing a kept-alive connection that stays idle is the usual end, not a slow client
                deadlines.arm(self.connection, server.idle_timeout, slow=False)
            self.connection.settimeout(server.header_timeout if self._served == 0 else server.idle_timeout)
            super().handle_one_request()
            self._served += 1

        def parse_request(self) -> bool:
            ok = super().parse_request()
            # headers are in; the reply gets its own bound (a reader that stalls mid-body)
            self.server.deadlines.arm(self.connection, max(30.0, server.header_timeout))  # type: ignore[attr-defined]
            return ok

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            server.respond(self, head=False)

        def do_HEAD(self) -> None:  # noqa: N802
            server.respond(self, head=True)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # scrapes every few seconds would flood the training log

        def log_error(self, format: str, *args: Any) -> None:
            # http.server's word for its socket's timeout while reading a request line: a
            # slow client, unless the deadline was an idle keep-alive wait (not armed slow)
            if format.startswith("Request timed out"):
                self.server.deadlines.expire(self.connection)  # type: ignore[attr-defined]

    return Handler
