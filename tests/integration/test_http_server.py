"""The HTTP server on a shared node: many scrapes at once, idle and slow clients closed,
forged Host names refused, HEAD, no version banner, TLS and basic auth (real sockets)."""

from __future__ import annotations

import base64
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sentinel.rules.config import ConfigError
from sentinel.serve.exporter import StoreCollector, make_registry
from sentinel.serve.http import PENDING, WORKERS, HttpServer, exposure_warning, is_loopback
from sentinel.serve.webconfig import load_web_config
from sentinel.store import Store, labels_of
from tests.certs import make_certs
from tests.helpers import wait_for

pytestmark = pytest.mark.integration


def _server(**kwargs: object) -> HttpServer:
    store = Store()
    for rank in range(8):  # a /metrics body of some size
        for g in range(64):
            store.add("sentinel_group_grad_norm", labels_of(job="j", run="r", rank=rank, group=f"layers.{g}"),
                      1, 1.0, 0.5)
    collector = StoreCollector(store)
    return HttpServer("127.0.0.1", 0, make_registry(collector), exposition=collector.exposition,
                      alerts=lambda: {"status": "success", "data": {"alerts": []}}, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def server() -> Iterator[HttpServer]:
    s = _server(header_timeout=2.0, idle_timeout=2.0)
    yield s
    s.stop()


def _request(server: HttpServer, raw: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes, read until the server closes or a full reply is in."""
    with socket.create_connection((server.host, server.port), timeout=timeout) as c:
        c.sendall(raw)
        return _read_reply(c, timeout)


def _read_reply(c: socket.socket, timeout: float) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = c.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")]
            if length and len(body) >= length[0]:
                break
    return data


def _get(path: str, host: str = "127.0.0.1", extra: str = "", method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n".encode()


def test_200_simultaneous_scrapes_all_succeed(server: HttpServer) -> None:
    n = 200
    conns = [socket.socket() for _ in range(n)]
    try:
        for c in conns:  # every connection opened before the first is served: a burst
            c.setblocking(False)
            c.connect_ex((server.host, server.port))
        for c in conns:
            select.select([], [c], [], 30)
            c.setblocking(True)
            c.settimeout(30)
        replies: list[bytes] = [b""] * n
        barrier = threading.Barrier(n)

        def scrape(i: int) -> None:
            barrier.wait()
            conns[i].sendall(_get("/metrics", f"127.0.0.1:{server.port}"))
            replies[i] = _read_reply(conns[i], 30)

        threads = [threading.Thread(target=scrape, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        ok = [r for r in replies if r.startswith(b"HTTP/1.1 200 ") and b"sentinel_group_grad_norm{" in r]
        assert len(ok) == n, [r[:40] for r in replies if r not in ok][:5]
    finally:
        for c in conns:
            c.close()


def test_idle_and_trickling_connections_are_closed(server: HttpServer) -> None:
    idle = [socket.create_connection((server.host, server.port), timeout=30) for _ in range(40)]
    slow = socket.create_connection((server.host, server.port), timeout=30)
    kept = socket.create_connection((server.host, server.port), timeout=30)
    try:
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # keep-alive, then idle
        assert _read_reply(kept, 10).startswith(b"HTTP/1.1 200 ")
        closed: set[int] = set()

        def all_closed() -> bool:
            try:
                slow.send(b"X")  # a header that never ends, a byte at a time
            except OSError:
                pass
            for i, c in enumerate([*idle, kept]):
                if i not in closed and select.select([c], [], [], 0)[0]:
                    try:
                        if c.recv(1) == b"":
                            closed.add(i)
                    except ConnectionResetError:
                        closed.add(i)
            return len(closed) == len(idle) + 1

        wait_for(all_closed, timeout=20, what="the server to close idle connections")
        wait_for(lambda: select.select([slow], [], [], 0)[0] and _eof(slow), timeout=20,
                 what="the server to close a trickling client")
        # the 40 silent clients and the trickling one are slow clients; the kept-alive
        # connection closed after its request is the usual end of one, not counted
        assert server.stats["timeout"] == len(idle) + 1
        # and the server still answers
        assert _request(server, _get("/healthz")).startswith(b"HTTP/1.1 200 ")
    finally:
        for c in [*idle, slow, kept]:
            c.close()


def _eof(c: socket.socket) -> bool:
    try:
        return c.recv(4096) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize(("host", "status"), [
    ("127.0.0.1", 200), ("127.0.0.1:9400", 200), ("localhost:9400", 200), ("[::1]:9400", 200),
    ("evil.example", 403), ("evil.example:9400", 403), ("127.0.0.1.nip.io", 403), ("10.0.0.1", 403),
])
def test_a_loopback_server_refuses_foreign_host_names(server: HttpServer, host: str, status: int) -> None:
    reply = _request(server, _get("/api/v1/alerts", host))
    assert reply.startswith(f"HTTP/1.1 {status} ".encode()), reply[:80]
    assert (b'"alerts"' in reply) == (status == 200)
    assert server.stats["host"] == (status == 403)


def test_past_the_queue_a_connection_gets_an_immediate_503_and_the_server_recovers() -> None:
    """Every worker held by a client that sends nothing and the queue of accepted
    connections full: the next connections get a 503 at once (not a hang), are counted,
    and the server answers again as soon as the holders go."""
    server = _server(header_timeout=120.0)
    extra = 12
    conns = [socket.socket() for _ in range(WORKERS + PENDING + extra)]
    try:
        for c in conns:
            c.setblocking(False)
            c.connect_ex((server.host, server.port))
        wait_for(lambda: server.stats["busy"] >= extra, timeout=30, what="connections past the queue refused")
        replies: dict[int, bytes] = {}

        def answered() -> bool:
            for i, c in enumerate(conns):
                if i not in replies and select.select([c], [], [], 0)[0]:
                    c.setblocking(True)
                    replies[i] = _read_reply(c, 5)
            return len(replies) == server.stats["busy"]

        wait_for(answered, timeout=10, what="every refused connection's reply")
        assert len(replies) >= extra  # the race between accepting and the workers' first take moves a few
        for reply in replies.values():
            assert reply.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in reply, reply[:80]
        assert {r for r in server.rows()} >= {("sentinel_daemon_http_refused_total", "counter", (("reason", "busy"),),
                                                float(len(replies)))}
        assert server.stats["timeout"] == 0  # nobody held long enough to be cut off
    finally:
        for c in conns:
            c.close()
    # the holders gone, the workers are free again
    reply = wait_for(lambda: (r := _request(server, _get("/healthz"))).startswith(b"HTTP/1.1 200 ") and r,
                     timeout=30, what="the server to answer again")
    assert reply.endswith(b"ok\n")
    server.stop()


@pytest.mark.parametrize(("host", "web", "warned"), [
    ("0.0.0.0", None, True), ("::", None, True), ("10.1.2.3", None, True), ("node7.cluster", None, True),
    ("0.0.0.0", "tls", False), ("0.0.0.0", "auth", False),
    ("127.0.0.1", None, False), ("::1", None, False), ("localhost", None, False),
])
def test_a_non_loopback_listen_without_tls_or_auth_is_warned_of(tmp_path: Path, host: str, web: str | None,
                                                                 warned: bool) -> None:
    # the decision and its text, not a bind: a test here may listen on loopback only
    security = None
    if web == "tls":
        make_certs(tmp_path)
        security = load_web_config(_web(tmp_path, "tls_server_config: {cert_file: server.crt, key_file: server.key}\n"))
    elif web == "auth":
        hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
        security = load_web_config(_web(tmp_path, f"basic_auth_users: {{prom: '{hashed}'}}\n"))
    warning = exposure_warning(host, f"http://{host}:9400", security)
    assert (warning is not None) == warned
    if warning is not None:
        assert f"on {host} without TLS or basic auth" in warning
        assert "--web.config.file" in warning and "listen on 127.0.0.1" in warning


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.1.2.3", False), ("node7.cluster", False), ("", False),
])
def test_loopback_names(host: str, loopback: bool) -> None:
    assert is_loopback(host) == loopback


def _web(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return path


def test_basic_auth_and_tls_from_a_web_config_file(tmp_path: Path) -> None:
    make_certs(tmp_path)
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode().replace("$2b$", "$2y$", 1)  # as htpasswd writes
    web = load_web_config(_web(tmp_path, f"tls_server_config: {{cert_file: server.crt, key_file: server.key}}\n"
                                         f"basic_auth_users: {{prom: '{hashed}'}}\n"))
    s = _server(web=web)
    try:
        assert s.url.startswith("https://")
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))

        def fetch(auth: str | None) -> bytes:
            with socket.create_connection((s.host, s.port), timeout=10) as raw:
                with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as c:
                    extra = f"Authorization: Basic {base64.b64encode(auth.encode()).decode()}\r\n" if auth else ""
                    c.sendall(_get("/metrics", extra=extra))
                    return _read_reply(c, 10)  # type: ignore[arg-type]

        assert fetch("prom:s3cret").startswith(b"HTTP/1.1 200 ")
        assert fetch("prom:wrong").startswith(b"HTTP/1.1 401 ")
        assert fetch("nobody:s3cret").startswith(b"HTTP/1.1 401 ")
        assert fetch(None).startswith(b"HTTP/1.1 401 ") and b'WWW-Authenticate: Basic realm="sentinel"' in fetch(None)
        assert s.stats["auth"] == 4 and s.stats["host"] == 0
        plain = _request(s, _get("/metrics"), timeout=5)  # plain HTTP on the TLS port: no reply
        assert not plain.startswith(b"HTTP/1.1 200")
    finally:
        s.stop()


@pytest.mark.parametrize(("text", "error"), [
    ("tls_server_config: {cert_file: nope.crt, key_file: nope.key}\n",
     "tls_server_config.cert_file: cannot load the certificate and key"),
    ("basic_auth_users: {prom: plaintext}\n", "basic_auth_users: Value error, the password of 'prom' is not a bcrypt"),
    ("tls_server_config: {cert_file: a, key_file: b, client_auth_type: RequireAnyClientCert}\n",
     "tls_server_config.client_auth_type: "),
    ("tls_config: {}\n", "tls_config: Extra inputs are not permitted"),
])
def test_a_bad_web_config_names_the_key(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_web_config(_web(tmp_path, text))
    assert any(error.replace("Value error, ", "") in line for line in err.value.problems), err.value.problems


_TOKENS = st.sampled_from([b"GET", b"HEAD", b"POST", b"PUT", b"/metrics", b"/healthz", b"/api/v1/alerts", b"/",
                           b"/%00", b"HTTP/1.1", b"HTTP/1.0", b"HTTP/9.9", b"Host:", b"127.0.0.1", b"evil",
                           b"Content-Length:", b"-1", b"99999999999", b"Transfer-Encoding: chunked",
                           b"Authorization: Basic", b"\r\n", b"\n", b" ", b":", b"\x00", b"\xff", b"A" * 300])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=400), st.lists(_TOKENS, max_size=25).map(b"".join)))
def test_fuzzed_requests_get_an_answer_or_a_close_and_the_server_lives_on(server: HttpServer, raw: bytes) -> None:
    reply = _request(server, raw + b"\r\n\r\n", timeout=5)
    assert reply == b"" or reply.startswith(b"HTTP/1."), reply[:60]
    assert b"Traceback" not in reply and b"Python/" not in reply
    assert _request(server, _get("/healthz")).startswith(b"HTTP/1.1 200 ")
