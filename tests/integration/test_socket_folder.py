"""The daemon's socket folder under /tmp is never followed through a symlink, nor taken
from another user; refusals are one line and status 2; ``sentinel run`` leaves nothing
behind on any exit path (issue 10, item 3)."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
NOBODY = 65534
needs_root = pytest.mark.skipif(os.getuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root and setpriv to act as another uid")


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A /tmp-like folder (1777) that another uid can reach, as TMPDIR."""
    base = Path(tempfile.mkdtemp(prefix="sentinel-test-", dir="/tmp"))
    os.chmod(base, 0o1777)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _as_nobody(*cmd: str) -> None:
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *cmd], check=True,
                   timeout=30)


def _sentinel(tmpdir: Path, *args: str, xdg: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "SENTINEL_SOCKET")}
    env["TMPDIR"] = str(tmpdir)
    if xdg is not None:
        env["XDG_RUNTIME_DIR"] = xdg
    return subprocess.run([sys.executable, "-m", "sentinel.cli", *args], capture_output=True, text=True,
                          env=env, timeout=90, stdin=subprocess.DEVNULL)


@needs_root
def test_a_symlink_planted_by_another_uid_is_refused(shared_tmp: Path) -> None:
    victim = shared_tmp / "victim"  # a folder of ours that the link points at
    victim.mkdir(mode=0o755)
    os.chmod(victim, 0o755)
    (victim / "engine.sock").write_text("precious\n")
    link = shared_tmp / f"sentinel-{os.getuid()}"
    _as_nobody("ln", "-s", str(victim), str(link))
    assert os.lstat(link).st_uid == NOBODY

    proc = _sentinel(shared_tmp, "daemon", "--listen", "127.0.0.1:0")

    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"refusing the socket folder {link}: it is a symlink (planted by uid {NOBODY})" in lines[0]
    assert stat.S_IMODE(os.stat(victim).st_mode) == 0o755  # not chmodded
    assert (victim / "engine.sock").read_text() == "precious\n"  # not deleted
    assert os.path.islink(link) and os.listdir(victim) == ["engine.sock"]


@needs_root
def test_a_folder_planted_by_another_uid_is_refused_in_one_line(shared_tmp: Path) -> None:
    planted = shared_tmp / f"sentinel-{os.getuid()}"
    _as_nobody("mkdir", "-m", "0777", str(planted))

    proc = _sentinel(shared_tmp, "daemon", "--listen", "127.0.0.1:0")

    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"sentinel: cannot start: refusing the socket folder {planted}: it belongs to uid {NOBODY}, not to uid "
        f"{os.getuid()}; remove it or choose another --socket path"]
    assert os.listdir(planted) == [] and stat.S_IMODE(os.stat(planted).st_mode) == 0o777


def test_a_file_at_the_socket_path_is_not_deleted(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir(mode=0o700)
    (folder / "engine.sock").write_text("not a socket\n")
    proc = _sentinel(tmp_path, "daemon", "--listen", "127.0.0.1:0", "--socket", str(folder / "engine.sock"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert (folder / "engine.sock").read_text() == "not a socket\n"


def test_the_daemon_prefers_xdg_runtime_dir_and_cleans_up(tmp_path: Path) -> None:
    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if k != "SENTINEL_SOCKET"}
    env.update(XDG_RUNTIME_DIR=str(runtime), TMPDIR=str(tmp_path / "unused"))
    proc = subprocess.Popen([sys.executable, "-m", "sentinel.cli", "daemon", "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        sock = runtime / "sentinel" / "engine.sock"
        assert f"SENTINEL_SOCKET={sock} " in line
        assert stat.S_ISSOCK(os.lstat(sock).st_mode)
        assert stat.S_IMODE(os.lstat(sock.parent).st_mode) == 0o700
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == 0
    assert os.listdir(runtime) == []  # the socket and the folder it made are gone


# The daemon, with SIGTERM sent at the worst moment after its address line: just as its
# main thread has taken a threading.Condition's lock (what an Event.wait() holds on its way
# in), or at its first sleep, whichever comes first. A handler that takes that lock (an
# Event.set(), as the handler did when CI hung at stop 24) then waits on it for ever.
_TERM_AT_THE_WORST_MOMENT = r"""
import os, signal, sys, threading, time
import sentinel.daemon.daemon as daemon_module

def fire(frame, event, arg):
    in_condition = (event == "c_return" and frame.f_code.co_name == "__enter__"
                    and frame.f_code.co_filename == threading.__file__)
    if in_condition or (event == "c_call" and arg is time.sleep):
        sys.setprofile(None)
        os.kill(os.getpid(), signal.SIGTERM)

serve = daemon_module.serve_forever

def serve_forever(daemon, ready=None, drain_seconds=0.0):
    def armed():
        if ready is not None:
            ready()
        sys.setprofile(fire)  # the main thread only, from here on
    serve(daemon, ready=armed, drain_seconds=drain_seconds)

daemon_module.serve_forever = serve_forever
sys.argv = ["sentinel", "daemon", "--listen", "127.0.0.1:0"]
from sentinel.cli import main
main()
"""


def test_a_sigterm_just_after_the_address_line_stops_the_daemon(tmp_path: Path) -> None:
    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if k != "SENTINEL_SOCKET"}
    env.update(XDG_RUNTIME_DIR=str(runtime), TMPDIR=str(tmp_path / "unused"))
    proc = subprocess.Popen([sys.executable, "-c", _TERM_AT_THE_WORST_MOMENT], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the daemon did not stop after SIGTERM")
    assert "export SENTINEL_SOCKET=" in out
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert os.listdir(runtime) == []  # stopped cleanly: the socket and its folder are gone


_CRASHING_RANK = r"""
import os, socket, sys
folder = os.path.dirname(os.environ["SENTINEL_SOCKET"])
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(os.path.join(folder, "reply-%d-0.sock" % os.getpid()))  # as a rank's DaemonLink does
os._exit(3)  # crashes without removing it
"""


@pytest.mark.parametrize(("args", "status"), [
    (["--listen", "127.0.0.1:0", "--", sys.executable, "-c", _CRASHING_RANK], 3),
    (["--listen", "127.0.0.1:0", "--", "/nonexistent/command"], 127),
    (["--listen", "192.0.2.1:0", "--", "true"], 2),  # an address not on this machine: nothing starts
])
def test_sentinel_run_leaves_no_folder_or_socket(tmp_path: Path, args: list[str], status: int) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proc = _sentinel(tmpdir, "run", *args)
    assert proc.returncode == status, proc.stderr
    assert "Traceback" not in proc.stderr
    assert os.listdir(tmpdir) == []


def test_a_stale_socket_of_a_dead_engine_is_replaced(tmp_path: Path) -> None:
    from sentinel.daemon.listener import DatagramListener

    path = str(tmp_path / "engine.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stale.bind(path)
    stale.close()  # the socket file stays, as after a SIGKILL
    got: list[bytes] = []
    listener = DatagramListener(path, lambda batch: got.extend(d for d, _ in batch))
    try:
        tx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        tx.sendto(b"hello", path)
        listener.close()
        assert got == [b"hello"]
    finally:
        listener.close()
