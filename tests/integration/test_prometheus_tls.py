"""A real Prometheus scrapes ``sentinel daemon --web.config.file`` over TLS with a client
certificate (mutual TLS) and basic auth; scrapes without the certificate or with a wrong
password fail. The certificates are made at test time."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import bcrypt
import pytest

from tests.certs import make_certs
from tests.helpers import end_process, start_prometheus, wait_for
from tests.integration.test_prometheus import _free_port, _query

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")]


def _job(name: str, port: int, tmp: Path, cert: bool, password: str) -> str:
    tls = f"{{ca_file: {tmp / 'ca.crt'}" + (f", cert_file: {tmp / 'client.crt'}, key_file: {tmp / 'client.key'}"
                                            if cert else "") + "}"
    return (f"  - job_name: {name}\n    scheme: https\n    tls_config: {tls}\n"
            f"    basic_auth: {{username: prometheus, password: {password}}}\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n")


@pytest.mark.slow  # make test-slow
def test_prometheus_scrapes_over_mutual_tls_with_basic_auth(tmp_path: Path) -> None:
    make_certs(tmp_path)
    hashed = bcrypt.hashpw(b"scrape-me", bcrypt.gensalt(4)).decode()
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                   "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
                   f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    port, prom_port = _free_port(), _free_port()
    daemon = subprocess.Popen([sys.executable, "-m", "sentinel.cli", "daemon", "--listen", f"127.0.0.1:{port}",
                               "--socket", str(tmp_path / "s" / "engine.sock"), "--web.config.file", str(web)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert daemon.stdout is not None
    line = daemon.stdout.readline()
    assert f"SENTINEL_URL=https://127.0.0.1:{port}" in line, (line, daemon.stderr.read() if daemon.poll() else "")
    prom = start_prometheus(tmp_path, "global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n"
                            + _job("good", port, tmp_path, True, "scrape-me")
                            + _job("no_client_cert", port, tmp_path, False, "scrape-me")
                            + _job("bad_password", port, tmp_path, True, "guess"), prom_port)
    base = f"http://127.0.0.1:{prom_port}"
    try:
        up = wait_for(lambda: (r := _query(base, "up")) and len(r) == 3 and r, timeout=90,
                      what="Prometheus to scrape all three jobs")
        wait_for(lambda: _query(base, 'sentinel_daemon_up{job="good"} == 1'), timeout=60,
                 what="a sentinel series scraped over mutual TLS with basic auth")
        up = {m["metric"]["job"]: m["value"][1] for m in _query(base, "up")}  # type: ignore[index]
        assert up == {"good": "1", "no_client_cert": "0", "bad_password": "0"}
        assert not _query(base, 'sentinel_daemon_up{job!="good"}')
    finally:
        prom.terminate()
        prom.wait(20)
        end_process(daemon)
