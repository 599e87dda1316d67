"""The README's defaults, as written: the engine `sentinel.watch` starts and `sentinel run`'s
daemon serve on `127.0.0.1:9400`, and `mon.url` tells the address bound: another free port
when 9400 is in use (a second run on the node), with a warning that says so. `SENTINEL_LISTEN`
sets it for `sentinel run` and `sentinel daemon` as for `watch`, and `SENTINEL_CONFIG` names the
config file of every command."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import sentinel
from tests.helpers import MLP, end_process, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def port_9400_free() -> None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no owner
        try:
            probe.bind(("127.0.0.1", 9400))
        except OSError:
            pytest.skip("127.0.0.1:9400 is taken on this machine by something else")


@pytest.fixture
def port_9400_busy() -> Iterator[None]:
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(("127.0.0.1", 9400))
        holder.listen()
    except OSError:
        pass  # taken already: busy all the same
    yield
    holder.close()


def _step_and_scrape(mon: sentinel.Monitor, model: MLP, opt: torch.optim.Optimizer) -> str:
    opt.zero_grad()
    loss = model(torch.randn(4, 16)).square().mean()
    loss.backward()
    opt.step()
    mon.log(loss=loss)
    url = mon.url
    assert url is not None

    def scraped() -> str | None:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            text = r.read().decode()
        return text if "sentinel_step{" in text else None

    return str(wait_for(scraped, timeout=30, what="the step on /metrics"))


def test_watch_serves_on_127_0_0_1_9400_by_default(port_9400_free: None) -> None:
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = sentinel.watch(model, opt, run="default-port")
    try:
        assert mon.url == "http://127.0.0.1:9400"
        assert 'run="default-port"' in _step_and_scrape(mon, model, opt)
    finally:
        mon.close()


def test_with_9400_in_use_watch_serves_on_a_free_port_and_mon_url_tells_which(
        port_9400_busy: None, capfd: pytest.CaptureFixture[str]) -> None:
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = sentinel.watch(model, opt, run="busy-port")
    try:
        assert mon.url is not None and mon.url.startswith("http://127.0.0.1:")
        assert not mon.url.endswith(":9400")
        assert 'run="busy-port"' in _step_and_scrape(mon, model, opt)
    finally:
        mon.close()
    assert "127.0.0.1:9400 is in use" in capfd.readouterr().err  # the engine's warning, on the script's stderr


def test_sentinel_run_serves_on_127_0_0_1_9400_by_default(port_9400_free: None) -> None:
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--", sys.executable, "-c", "print('ok')"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr
    assert "sentinel: metrics at http://127.0.0.1:9400/metrics" in out.stderr.splitlines()


def test_with_9400_in_use_sentinel_run_serves_on_a_free_port_and_says_so_once(port_9400_busy: None) -> None:
    """A second run on the node: one warning line that names the busy address (no doubled
    "sentinel: sentinel:"), and the address served instead."""
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--", sys.executable, "-c", "print('ok')"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr
    warned = [line for line in out.stderr.splitlines() if "is in use" in line]
    assert warned == ["sentinel: 127.0.0.1:9400 is in use (another run?); serving on a free port instead"], warned
    served = [line for line in out.stderr.splitlines() if line.startswith("sentinel: metrics at http://127.0.0.1:")]
    assert len(served) == 1 and ":9400/" not in served[0], out.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_sentinel_listen_sets_the_address_of_sentinel_run_and_of_the_daemon(tmp_path: Path) -> None:
    """docs/deployment.md: `SENTINEL_LISTEN=0.0.0.0:9400` on each node for a cluster Prometheus
    (loopback here); an explicit --listen wins."""
    port = _free_port()
    env = {**os.environ, "SENTINEL_LISTEN": f"127.0.0.1:{port}"}
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--", sys.executable, "-c", "print('ok')"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert f"sentinel: metrics at http://127.0.0.1:{port}/metrics" in out.stderr.splitlines()
    other = _free_port()
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", f"127.0.0.1:{other}", "--",
                          sys.executable, "-c", "print('ok')"], capture_output=True, text=True, timeout=120, env=env)
    assert f"sentinel: metrics at http://127.0.0.1:{other}/metrics" in out.stderr.splitlines(), out.stderr
    daemon = subprocess.Popen([sys.executable, "-m", "sentinel.cli", "daemon", "--socket", str(tmp_path / "e.sock")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = daemon.stdout.readline()  # type: ignore[union-attr]
    finally:
        end_process(daemon)
    assert f"SENTINEL_URL=http://127.0.0.1:{port}" in line, line


def test_sentinel_config_is_the_config_file_of_run_daemon_and_runs(tmp_path: Path) -> None:
    """deploy/systemd (a drop-in's Environment=SENTINEL_CONFIG=...), the Slurm batch script's
    SENTINEL_CONFIG, and `sentinel runs` reading the same file's history; --config wins."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("notify: {min_severity: loud}\n")
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "daemon", "--socket", str(tmp_path / "e.sock")],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "SENTINEL_CONFIG": str(bad)})
    assert out.returncode == 2 and "notify.min_severity" in out.stderr, out.stderr  # the file was read
    history = tmp_path / "h.sqlite"
    good = tmp_path / "good.yaml"
    good.write_text(f"history: {{path: {history}}}\n")
    env = {**os.environ, "SENTINEL_CONFIG": str(good), "SENTINEL_RUN": "from-env-config"}
    code = "import torch; m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n" \
           "for _ in range(3):\n    o.zero_grad(); m(torch.ones(1, 2)).sum().backward(); o.step()"
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--",
                          sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    runs = subprocess.run([sys.executable, "-m", "sentinel.cli", "runs"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert runs.returncode == 0 and "from-env-config" in runs.stdout, runs.stdout + runs.stderr
    # --config wins over the variable: the good file is read, and the start fails only on the bad address
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "daemon", "--config", str(good), "--socket",
                          str(tmp_path / "e2.sock"), "--listen", "127.0.0.1:99999"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "SENTINEL_CONFIG": str(bad)})
    assert out.returncode == 2 and out.stderr == "sentinel: listen: expected HOST:PORT, got '127.0.0.1:99999'\n"


@pytest.mark.parametrize("command", [["daemon", "--socket", "/tmp/unused.sock"], ["run", "--", "true"]])
def test_a_bad_listen_address_is_one_line_and_exit_status_2(command: list[str]) -> None:
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", *command], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "SENTINEL_LISTEN": "nonsense"})
    assert (out.returncode, out.stderr) == (2, "sentinel: listen: expected HOST:PORT, got 'nonsense'\n")


def test_a_node_daemon_does_not_move_off_a_busy_port(port_9400_busy: None, tmp_path: Path) -> None:
    """`sentinel daemon`'s address is what Prometheus scrapes: a busy port is one line and exit
    status 2 (systemd restarts it), never a random port nobody scrapes."""
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "daemon", "--socket", str(tmp_path / "e.sock")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.splitlines()[-1] == "sentinel: cannot start: Address already in use"
    assert not (tmp_path / "e.sock").exists()  # nothing left behind
