"""``sentinel run -- CMD``: a script with no sentinel import is monitored; exit status passes through."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Receiver, end_process, retry_gloo_exit_abort, wait_for, write_config

pytestmark = pytest.mark.integration
SCRIPTS = Path(__file__).parent / "scripts"


LOG: list[str] = []
DRAIN: list[threading.Thread] = []  # the thread that drains the running job's stderr into LOG


def _start(args: list[str], config: str | None = None) -> tuple[subprocess.Popen[str], str]:
    """Start `sentinel run [--config config] -- args`; returns it and its metrics URL. Its
    stderr is drained into LOG by a thread, so a chatty CMD can never block on a full pipe."""
    options = ["--config", config] if config else []
    proc = subprocess.Popen([sys.executable, "-m", "sentinel.cli", "run", *options, "--listen", "127.0.0.1:0",
                             "--", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    LOG.clear()
    for line in proc.stderr:  # type: ignore[union-attr]
        LOG.append(line)
        m = re.search(r"metrics at (http://127\.0\.0\.1:\d+)/metrics", line)
        if m:
            DRAIN[:] = [threading.Thread(target=lambda: LOG.extend(proc.stderr), daemon=True)]  # type: ignore[arg-type]
            DRAIN[0].start()
            return proc, m.group(1)
    proc.kill()
    raise AssertionError("sentinel run printed no metrics address:\n" + "".join(LOG))


def _stderr() -> str:
    """All of the ended job's stderr (the drain reads to its end)."""
    for t in DRAIN:
        t.join(10)
    return "".join(LOG)


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return r.read().decode()


def test_unmodified_script_is_monitored(tmp_path: Path) -> None:
    release = tmp_path / "release"
    proc, url = _start([sys.executable, str(SCRIPTS / "plain_train.py"), "30", str(release)])
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "trained"

        def stepped() -> str | None:
            text = _metrics(url)
            return text if re.search(r"sentinel_step\{[^}]*\} 30.0", text) else None

        text = wait_for(stepped, what="30 steps on /metrics")
        assert re.search(r'sentinel_step\{job="train",rank="0",run="[^"]+"\} 30.0', text)
        assert "sentinel_loss{" in text and "sentinel_group_grad_norm{group=\"0\"" in text
        release.touch()
        assert proc.wait(60) == 0, _stderr()
    finally:
        end_process(proc)


@pytest.mark.parametrize(("code", "expected"), [("raise SystemExit(3)", 3),
                                                ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 137),
                                                ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", 143)])
def test_exit_status_passes_through(code: str, expected: int) -> None:
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--",
                          sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == expected, out.stderr


_TRAINED_THEN_EXIT = """
import atexit, os, sys
if sys.argv[1] == "teardown":
    atexit.register(os._exit, 3)  # before torch's import: it runs after Sentinel's goodbye
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(5):
    opt.zero_grad(); model(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()
print("trained", flush=True)
if sys.argv[1] == "exit":
    sys.exit(3)
if sys.argv[1] == "builtin":
    exit(3)  # site's exit(), as often called as sys.exit
"""


def test_a_failure_after_the_script_ended_says_so(tmp_path: Path) -> None:
    """docs/instrumenting.md: the ranks said a clean goodbye, then the command failed as its
    Python exited (here an atexit handler's ``os._exit(3)``; torch's gloo exit abort looks
    the same from outside): the crash line says the script had ended and it failed as it
    exited."""
    script = tmp_path / "train.py"
    script.write_text(_TRAINED_THEN_EXIT)
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--",
                          sys.executable, str(script), "teardown"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 3 and out.stdout == "trained\n", out.stderr
    [line] = [line for line in out.stderr.splitlines() if "TrainingCrashed" in line]
    assert "Training crashed on rank 0 at step 5: exited with status 3" in line, line
    assert ("after the script had ended without an error (its goodbye came first): it failed as it exited (a "
            "raise SystemExit(N), which Sentinel does not see, an atexit handler") in line, line


_TRAINING_THREAD = """
import sys, threading, time
from pathlib import Path
import torch

def train():  # a web UI's shape: the loop runs in a thread of its own
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(20):
        x = torch.randn(8, 4 if step != 12 else 5)  # a bad batch at its 13th step
        opt.zero_grad(); model(x).pow(2).mean().backward(); opt.step()

t = threading.Thread(target=train, name="trainer")
t.start()
t.join()
print("serving on", flush=True)
while not Path(sys.argv[1]).exists():  # the UI goes on serving
    time.sleep(0.05)
"""


def test_a_training_thread_that_fails_is_a_crash_told_while_the_process_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/instrumenting.md: the thread the training ran in ended on an uncaught exception
    while the process went on (its traceback printed, the main thread serving): the crash is
    on /api/v1/alerts and in the history before the process ends, names the thread, the
    exception and the line, and the process's exit status 0 does not make the run finished."""
    script, release, state = tmp_path / "app.py", tmp_path / "release", tmp_path / "state"
    script.write_text(_TRAINING_THREAD)
    monkeypatch.setenv("XDG_STATE_HOME", str(state))  # its own history file
    proc, url = _start([sys.executable, str(script), str(release)])
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "serving on"

        def crashed() -> dict[str, Any] | None:
            with urllib.request.urlopen(url + "/api/v1/alerts", timeout=5) as r:
                alerts = json.load(r)["data"]["alerts"]
            return next((a for a in alerts if a["alertname"] == "TrainingCrashed"), None)

        alert = wait_for(crashed, timeout=60, what="TrainingCrashed while the process serves")
        assert proc.poll() is None
        assert alert["step"] == 12 and alert["state"] == "firing", alert
        assert ("Training crashed on rank 0 at step 12: its training thread ended on an uncaught exception, the "
                "process going on; thread 'trainer' of rank 0") in alert["summary"], alert
        assert "raised RuntimeError at app.py:11; last values" in alert["summary"], alert
        release.touch()
        assert proc.wait(60) == 0, _stderr()
    finally:
        end_process(proc)
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied" in _stderr()  # the thread's own traceback
    db = sqlite3.connect(state / "sentinel" / "history.sqlite")
    assert db.execute("SELECT state, exit_status, steps FROM runs").fetchall() == [("crashed", 0, 12)]


@pytest.mark.parametrize("mode", ["exit", pytest.param("builtin", marks=pytest.mark.slow),
                                  pytest.param("deit", marks=pytest.mark.slow),
                                  pytest.param("hydra", marks=pytest.mark.slow)])
def test_a_script_that_stops_itself_with_sys_exit_is_told_where(mode: str, tmp_path: Path) -> None:
    """A ``sys.exit(N)`` is no clean end that failed in teardown: the crash line names the
    code and the script's line that called it (docs/instrumenting.md). ``exit``: at the end
    of the script; ``builtin``: the same with the ``exit()`` builtin; ``deit``: DeiT's, MAE's and DETR's check of the loss before
    ``backward()``, ``if not math.isfinite(loss_value): ... sys.exit(1)``, mid-training;
    ``hydra``: ``main()`` raised, and the wrapper around it printed the error and called
    ``sys.exit(1)``: the line names the error it was handling too."""
    if mode in ("exit", "builtin"):
        script = tmp_path / "train.py"
        script.write_text(_TRAINED_THEN_EXIT)
        line = 12 if mode == "exit" else 14
        cmd, status, step, said = [str(script), mode], 3, 5, f"SystemExit(3) at train.py:{line}"
    else:
        cmd = [str(SCRIPTS / "stop_on_nan.py"), mode, "40", "31"]
        status, step = 1, 30
        said = ("SystemExit(1) at stop_on_nan.py:39" if mode == "deit" else
                "SystemExit(1) at stop_on_nan.py:52, handling FloatingPointError at stop_on_nan.py:37")
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--",
                          sys.executable, *cmd], capture_output=True, text=True, timeout=120)
    assert out.returncode == status, out.stderr
    [line] = [line for line in out.stderr.splitlines() if "TrainingCrashed" in line]
    assert f"Training crashed on rank 0 at step {step}: exited with status {status}; {said}; last values" in line, line
    assert "ended without an error" not in line and "loss is inf" not in line, line  # never the error's message


@retry_gloo_exit_abort
def test_torchrun_ddp_exports_both_ranks(tmp_path: Path) -> None:
    release = tmp_path / "release"
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    proc, url = _start([torchrun, "--standalone", "--nproc-per-node", "2",
                        str(SCRIPTS / "ddp_train.py"), "20", str(release)])
    try:
        def both() -> str | None:
            text = _metrics(url)
            ranks = set(re.findall(r'sentinel_step\{job="train",rank="(\d)",run="[^"]+"\} 20.0', text))
            return text if ranks == {"0", "1"} else None

        try:
            text = wait_for(both, timeout=120, what="both ranks at step 20")  # torchrun starts 3 Pythons
        except BaseException:  # say what was there instead
            steps = re.findall(r'sentinel_step\{[^}]*\} \S+', _metrics(url))
            raise AssertionError(f"steps on /metrics: {steps}\nsentinel run's stderr:\n{''.join(LOG)}") from None
        runs = set(re.findall(r'sentinel_step\{job="train",rank="\d",run="([^"]+)"\}', text))
        assert len(runs) == 1, f"ranks must agree on the run name: {runs}"
        # DDP grads are all-reduced: the replicated grad norms of the two ranks agree
        norms = dict(re.findall(r'sentinel_grad_norm\{job="train",rank="(\d)",run="[^"]+"\} (\S+)', text))
        assert float(norms["0"]) == pytest.approx(float(norms["1"]), rel=1e-6)
        # ... bit for bit, so the cross-rank comparison stays quiet
        assert re.search(r'sentinel_rank_grad_norm_deviation\{job="train",rank="1",run="[^"]+"\} 0.0', text)
        assert not {a["alertname"] for a in _alerts(url)} & {"RankDivergence", "RankStraggler"}
        release.touch()
        assert proc.wait(60) == 0, _stderr()
    finally:
        end_process(proc)


def _config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "sentinel.yaml"
    path.write_text(text)
    return str(path)


def test_sigkill_fires_training_crashed_and_run_exits_with_its_status(tmp_path: Path) -> None:
    receiver = Receiver()
    try:
        cfg = _config(tmp_path, f"notify:\n  urls: ['{receiver.url}']\n")
        out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--config", cfg, "--listen", "127.0.0.1:0",
                              "--", sys.executable, str(SCRIPTS / "faulty_train.py"), "25", "kill"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 137, out.stderr
        assert "trained" in out.stdout
        # the on-call person's message: which rule, how it died, and where the run was
        crash = [b for b in receiver.bodies if "TrainingCrashed" in b.get("title", "")]
        assert len(crash) == 1, receiver.bodies
        body = crash[0]["title"] + "\n" + crash[0]["message"]
        assert "killed by SIGKILL (signal 9)" in body and "OOM killer" in body, body
        assert "last values (step 25" in body and "loss " in body, body
        assert "dmesg" in body  # a first check from the rule pack
        # one line on stderr, the reason in words
        [line] = [line for line in out.stderr.splitlines() if "TrainingCrashed" in line]
        assert line.startswith("sentinel: [FIRING] critical TrainingCrashed — run "), out.stderr
        assert ": Training crashed on rank 0 at step 25: was killed by SIGKILL (signal 9)" in line, line
    finally:
        receiver.close()


def test_an_optimizer_that_no_gradient_reaches_pages_gradients_missing() -> None:
    """The model built again after its optimizer was made: the optimizer steps parameters
    the loss never reaches. Nothing trains, and the on-call person hears it at step 20,
    with what to check first."""
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0",
                          "--", sys.executable, str(SCRIPTS / "rebuilt_model.py"), "40"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("trained 40 steps"), out.stderr
    [line] = [line for line in out.stderr.splitlines() if "GradientsMissing" in line and "[FIRING]" in line]
    assert line.startswith("sentinel: [FIRING] critical GradientsMissing — run "), line
    assert ("since step 20: No gradient reached the parameters of rank 0's optimizer for 20 steps in a row at "
            "step 20: it steps, and nothing trains") in line, line


def test_a_loop_that_never_resets_its_gradients_pages_gradients_not_reset_first() -> None:
    """examples/mnist's loop with ``optimizer.zero_grad()`` lost: every step applies the sum
    of the gradients so far. The first page names the missing reset at step 4, not the
    learning rate that the later alerts blame."""
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0",
                          "--", sys.executable, str(SCRIPTS / "no_zero_grad.py"), "60"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout == "trained 60 steps\n", out.stderr
    fired = [line for line in out.stderr.splitlines() if "[FIRING]" in line]
    assert fired and fired[0].startswith("sentinel: [FIRING] critical GradientsNotReset — run "), out.stderr
    assert ("since step 4: Gradients are not reset between steps on rank 0: each of the last 3 steps began from "
            "the gradients of the step before (no zero_grad())") in fired[0], fired[0]


def test_an_exception_fires_training_crashed_with_exit_status_1() -> None:
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0",
                          "--", sys.executable, str(SCRIPTS / "faulty_train.py"), "5", "raise"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "RuntimeError: CUDA error" in out.stderr  # CMD's own traceback is untouched
    [line] = [line for line in out.stderr.splitlines() if "TrainingCrashed" in line]  # one line
    assert line.startswith("sentinel: [FIRING] critical TrainingCrashed — run "), out.stderr
    assert "since step 5: Training crashed on rank 0 at step 5: exited with status 1" in line, line
    # the type and the script's line, never the message: a message may hold anything
    raised = next(i for i, text in enumerate((SCRIPTS / "faulty_train.py").read_text().splitlines(), 1)
                  if "raise RuntimeError(" in text)
    assert f"raised RuntimeError at faulty_train.py:{raised};" in line and "illegal memory" not in line, line


def test_a_script_that_stops_stepping_fires_training_stalled_and_says_where_it_waits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the stall limit is max(min_seconds, factor x median step time): 2 s here, so the test is
    # quick; where the training thread waits is looked at every heartbeat interval, 0.5 s here
    monkeypatch.setenv("SENTINEL_HEARTBEAT_SECONDS", "0.5")
    cfg = _config(tmp_path, "rules:\n  TrainingStalled:\n    params: {min_seconds: 2}\n")
    proc, url = _start([sys.executable, str(SCRIPTS / "faulty_train.py"), "30", "stall"], config=cfg)
    try:
        def stalled() -> dict[str, Any] | None:
            return next((a for a in _alerts(url) if a["alertname"] == "TrainingStalled" and a["state"] == "firing"),
                        None)

        alert = wait_for(stalled, timeout=30, what="TrainingStalled firing")
        assert alert["ranks"] == [0] and alert["step"] == 30 and alert["severity"] == "critical"
        assert alert["threshold"] == pytest.approx(2.0) and alert["value"] > 2.0
        assert "no step for" in alert["summary"]
        # the page says what py-spy would: the call it waits in, and the script's line that made it
        line = next(i for i, text in enumerate((SCRIPTS / "faulty_train.py").read_text().splitlines(), 1)
                    if "threading.Event().wait(seconds)" in text)
        assert re.search(r"its training thread is in wait \(threading\.py:\d+\) from wait_for_peer "
                         rf"\(\S*faulty_train\.py:{line}\)", alert["summary"]), alert["summary"]
    finally:
        end_process(proc)


def test_an_evaluation_longer_than_the_stall_limit_is_no_stall_and_a_hang_after_it_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a validation pass (forward passes, no step) of 5 s against a stall limit of 2 s; the
    # model's forwards send a heartbeat every 0.5 s here (20 s by default, for 600 s)
    monkeypatch.setenv("SENTINEL_HEARTBEAT_SECONDS", "0.5")
    cfg = _config(tmp_path, "rules:\n  TrainingStalled:\n    params: {min_seconds: 2}\n")
    proc, url = _start([sys.executable, str(SCRIPTS / "faulty_train.py"), "30", "evaluate"], config=cfg)
    out: list[str] = []
    threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True).start()  # type: ignore[arg-type]
    try:
        wait_for(lambda: "trained\n" in out, timeout=60, what="30 steps")
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + 60
        while "evaluated\n" not in out and time.monotonic() < deadline:
            seen += [a for a in _alerts(url) if a["alertname"] == "TrainingStalled"]
            time.sleep(0.2)
        assert "evaluated\n" in out
        assert seen == [], seen  # the evaluation paged no one

        def stalled() -> dict[str, Any] | None:
            return next((a for a in _alerts(url) if a["alertname"] == "TrainingStalled" and a["state"] == "firing"),
                        None)

        alert = wait_for(stalled, timeout=30, what="TrainingStalled firing after the evaluation")
        assert alert["ranks"] == [0] and alert["step"] == 30
        m = re.search(r"no step for (\d+) s, the run's last heartbeat (\d+) s ago \(limit 2 s\)", alert["summary"])
        assert m, alert["summary"]
        assert int(m.group(1)) >= 5 > int(m.group(2))  # the silence counts from the evaluation's end
    finally:
        end_process(proc)


@pytest.mark.slow  # 17-41 s: behind the marker, to keep `make test` well under its 20 minutes
def test_a_pinns_long_lbfgs_step_is_no_stall(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A physics-informed network's Adam phase, then its one LBFGS step of many closure calls
    (scripts/pinn.py): every forward in that step is a training forward, and the step, minutes
    long in the public ports, paged TrainingStalled (critical). Here a step of 8 s or more
    against a stall limit of 3 s, heartbeats every 0.5 s (20 s by default, for 600 s)."""
    monkeypatch.setenv("SENTINEL_HEARTBEAT_SECONDS", "0.5")
    cfg = _config(tmp_path, "rules:\n  TrainingStalled:\n    params: {min_seconds: 3}\n")
    done = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--config", cfg, "--listen", "127.0.0.1:0",
                           "--", sys.executable, str(SCRIPTS / "pinn.py"), "200", "300", "0.1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    m = re.search(r"^lbfgs: ([\d.]+) s, (\d+) evaluations$", done.stdout, re.M)
    assert m and float(m.group(1)) >= 8 and int(m.group(2)) >= 80, done.stdout  # one step, far past the limit
    assert "sentinel: metrics at" in done.stderr  # watched: the daemon ran and said where
    assert "TrainingStalled" not in done.stderr, done.stderr
    # the LBFGS over the Adam's parameters takes its place in one stream (as two, the LBFGS's
    # first step, this long one, had no step before it to beat from, and the Adam's paged)


@pytest.mark.parametrize("bad_until", [pytest.param(41, marks=pytest.mark.slow), 10_000])  # 41: make test-slow
def test_a_script_that_skips_its_step_on_a_nan_loss_is_told_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               bad_until: int) -> None:
    """scripts/nan_skip.py skips its step when the loss is not finite: for two corrupt
    batches (steps go on), or from iteration 40 to its end (no step comes again). Sentinel
    said nothing of either before (no step reported the NaN losses); now TrainingNonFinite
    says the script skipped its step, while it goes on (heartbeats every 0.5 s here), and
    the script's output and exit status are its own."""
    monkeypatch.setenv("SENTINEL_HEARTBEAT_SECONDS", "0.5")
    argv = [str(SCRIPTS / "nan_skip.py"), "120", "40", str(bad_until), "0.02"]
    plain = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300)
    done = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0",
                           "--", sys.executable, *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == plain.returncode == 0, done.stderr
    assert done.stdout == plain.stdout
    skipped = 2 if bad_until < 120 else 81
    assert f"{120 - skipped} steps, {skipped} skipped" in done.stdout
    firing = [line for line in done.stderr.splitlines() if "[FIRING] critical TrainingNonFinite" in line]
    assert len(firing) == 1, done.stderr
    assert "the script skipped its step after" in firing[0]
    if bad_until > 120:  # paged at the last step while the script still skipped, not only as it ended
        m = re.search(r"after (\d+) backward\(\) passes .* at step 39 on rank 0", firing[0])
        assert m and int(m.group(1)) < 81, firing[0]
    else:  # at the step after the two skipped iterations
        assert "after 2 backward() passes with a non-finite loss or gradient norm so far) at step 40 on rank 0" in firing[0]


@pytest.mark.slow  # 17-41 s: behind the marker, to keep `make test` well under its 20 minutes
def test_a_layer_trained_before_the_next_one_is_no_stall(tmp_path: Path) -> None:
    """Forward-Forward (scripts/forward_forward.py): one Adam per layer, the layers trained
    one after the other, each optimizer kept alive by its layer. The first one's stream is
    silent while the second trains, and paged TrainingStalled (critical) before; here the
    second layer trains for 6 s or more against a stall limit of 3 s."""
    history = tmp_path / "h.sqlite"
    cfg = write_config(tmp_path, history={"path": str(history), "flush_seconds": 0.05},
                       rules={"TrainingStalled": {"params": {"min_seconds": 3}}})
    done = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--config", cfg, "--listen", "127.0.0.1:0",
                           "--", sys.executable, str(SCRIPTS / "forward_forward.py"), "200", "0.03"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(history) as db:
        first = db.execute("SELECT count(*), max(t) FROM samples").fetchone()
        second = db.execute("SELECT stream, count(*), min(t), max(t) FROM stream_samples GROUP BY stream").fetchall()
    # each layer's optimizer its own stream, 200 steps each, the second trained after the first, 6 s+
    assert first[0] == 200 and [s[:2] for s in second] == [("1", 200)], (first, second)
    assert second[0][2] > first[1] and second[0][3] - first[1] > 6
    assert "TrainingStalled" not in done.stderr, done.stderr


_NAMED = """
import os, signal, sys, torch, sentinel
from torch import nn
torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mon = sentinel.watch(model, opt, run="exp-42")
for i in range(20):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step(); mon.log(loss=loss)
if sys.argv[1] == "kill":  # the OOM killer: no goodbye, once the last report is in
    sys.path.insert(0, sys.argv[2])
    from engine_has import wait_for_step
    wait_for_step(os.environ["SENTINEL_URL"], 20)
    os.kill(os.getpid(), signal.SIGKILL)
mon.close()
"""


@pytest.mark.parametrize("end", ["finish", "kill"])
def test_a_script_that_names_its_run_has_its_end_and_its_crash_under_that_name(end: str, tmp_path: Path) -> None:
    """``sentinel run -- python train.py`` over a script that calls ``sentinel.watch(..., run="exp-42")``:
    the exit status, the command and the tags went to the run ``sentinel run`` started it as,
    which nothing reported to, so the history listed an empty run beside ``exp-42`` (which a
    SIGKILL left "running" for good), and the crash page named the empty run, at "step 0", "no
    step reported", without the last values of the run that died."""
    script = tmp_path / "named.py"
    script.write_text(_NAMED)
    history = tmp_path / "h.sqlite"
    cfg = write_config(tmp_path, history={"path": str(history), "flush_seconds": 0.05})
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--config", cfg, "--listen", "127.0.0.1:0",
                          "--tag", "team=nlp", "--", sys.executable, str(script), end, str(SCRIPTS)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == (137 if end == "kill" else 0), out.stderr
    with sqlite3.connect(history) as db:
        runs = db.execute("SELECT run, steps, state, exit_status, command, tags FROM runs").fetchall()
    assert len(runs) == 1, runs
    run, steps, state, status, command, tags = runs[0]
    assert (run, steps, state, status) == ("exp-42", 20, "crashed" if end == "kill" else "finished",
                                           137 if end == "kill" else 0)
    assert command.endswith(f"named.py {end} {SCRIPTS}") and json.loads(tags) == {"team": "nlp"}
    crashed = [line for line in out.stderr.splitlines() if "TrainingCrashed" in line]
    if end == "kill":
        assert crashed[0].startswith("sentinel: [FIRING] critical TrainingCrashed — run exp-42, since step 20"), crashed
        assert "last values (step 20" in crashed[0]
    else:
        assert crashed == []


@pytest.mark.slow  # 17-41 s: behind the marker, to keep `make test` well under its 20 minutes
def test_a_script_run_by_the_training_script_reports_as_a_run_of_its_own(tmp_path: Path) -> None:
    """A training script that runs its linear evaluation as another Python process after each
    phase (scripts/train_and_probe.py, scripts/linear_probe.py): the probe took the training's
    run and rank, and the history read the training and the probes as four restarts of one run
    (the training split in two, the last probe's loss the run's final one)."""
    history = tmp_path / "h.sqlite"
    cfg = write_config(tmp_path, history={"path": str(history), "flush_seconds": 0.05})
    args = [sys.executable, str(SCRIPTS / "train_and_probe.py"), str(tmp_path / "ckpt.pt"), "2", "100"]
    plain = subprocess.run(args, capture_output=True, text=True, timeout=300)
    done = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--config", cfg, "--listen", "127.0.0.1:0",
                           "--", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SENTINEL_RUN": "ssl"})
    assert done.returncode == plain.returncode == 0, done.stderr
    assert done.stdout == plain.stdout  # the probes' numbers too
    with sqlite3.connect(history) as db:
        runs = db.execute("SELECT run, attempt, steps, samples FROM runs ORDER BY id").fetchall()
        steps = [s for (s,) in db.execute(
            "SELECT step FROM samples JOIN runs ON runs.id = run_id WHERE run = 'ssl' ORDER BY step")]
    assert runs == [("ssl", 1, 200, 200), ("ssl-linear_probe", 1, 60, 60), ("ssl-linear_probe", 2, 60, 60)], runs
    assert steps == list(range(1, 201))  # the training's steps one run, through its probes


@pytest.mark.slow  # 25-47 s: behind the marker, to keep `make test` well under its 20 minutes
def test_a_sweeps_trials_run_side_by_side_are_runs_of_their_own(tmp_path: Path) -> None:
    """A sweep's launcher that trains nothing runs its three trials as processes of their own,
    side by side (scripts/sweep_trials.py): all three were rank 0 of the job's run, their
    steps interleaved in one stream, each new process read as a restart (five history rows,
    two of 2 and 4 steps), and EarlyLossExplosion and LossDivergence paged critical on the
    mix. Each is now a run of its own, its steps whole, its final loss its own."""
    history = tmp_path / "h.sqlite"
    cfg = write_config(tmp_path, history={"path": str(history), "flush_seconds": 0.05})
    (tmp_path / "plain").mkdir()
    (tmp_path / "watched").mkdir()
    script = str(SCRIPTS / "sweep_trials.py")
    plain = subprocess.run([sys.executable, script, str(tmp_path / "plain")], capture_output=True, text=True,
                           timeout=300)
    done = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--config", cfg, "--listen", "127.0.0.1:0",
                           "--", sys.executable, script, str(tmp_path / "watched")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "SENTINEL_RUN": "sweep"})
    assert done.returncode == plain.returncode == 0, done.stderr
    assert done.stdout == plain.stdout  # every trial's numbers bit for bit
    finals = sorted(float(line.rsplit(" ", 1)[1]) for line in done.stdout.splitlines())
    with sqlite3.connect(history) as db:
        runs = db.execute("SELECT run, attempt, steps, samples, final_loss FROM runs ORDER BY run").fetchall()
        steps = {run: [s for (s,) in db.execute("SELECT step FROM samples JOIN runs ON runs.id = run_id "
                                                "WHERE run = ? ORDER BY step", (run,))]
                 for run, *_ in runs}
        paged = db.execute("SELECT alertname, severity FROM alerts WHERE severity != 'info'").fetchall()
    assert [r[:4] for r in runs] == [("sweep", 1, 200, 200), ("sweep-2", 1, 200, 200), ("sweep-3", 1, 200, 200)], runs
    assert sorted(r[4] for r in runs) == pytest.approx(finals, rel=1e-6)  # each run's final loss a trial's
    assert all(s == list(range(1, 201)) for s in steps.values()), steps
    assert paged == []
    split = [line for line in done.stderr.splitlines() if "go to run" in line]
    assert len(split) == 2 and all(line.startswith("sentinel: ") for line in split), done.stderr
    assert "reports rank 0 of run 'sweep', which pid" in split[0] and split[0].endswith("frames go to run 'sweep-2'")


def test_a_seq2seq_scripts_decoder_gets_groups_of_its_own(tmp_path: Path) -> None:
    release = tmp_path / "release"
    proc, url = _start([sys.executable, str(SCRIPTS / "shapes_train.py"), "seq2seq", str(release)])
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "trained"
        text = wait_for(lambda: _at_step(url, 10), what="10 steps on /metrics")
        groups = re.findall(r'^sentinel_group_grad_norm\{group="([^"]+)"', text, re.M)
        assert groups == ["Encoder.emb", "Encoder.rnn", "Decoder.emb", "Decoder.rnn", "Decoder.out"], groups
        release.touch()
        assert proc.wait(60) == 0, _stderr()
    finally:
        end_process(proc)


def test_a_maximized_objective_is_exported_as_the_objective_not_the_loss(tmp_path: Path) -> None:
    release = tmp_path / "release"
    proc, url = _start([sys.executable, str(SCRIPTS / "shapes_train.py"), "maximize", str(release)])
    try:
        assert proc.stdout is not None
        printed = [float(proc.stdout.readline()) for _ in range(10)]
        assert proc.stdout.readline().strip() == "trained" and printed[-1] > printed[0]
        text = wait_for(lambda: _at_step(url, 10), what="10 steps on /metrics")
        [value] = re.findall(r'^sentinel_scalar\{[^}]*name="objective"[^}]*\} (\S+)$', text, re.M)
        assert float(value) == pytest.approx(printed[-1], rel=1e-6)  # the script's own number and sign
        assert not re.search(r"^sentinel_loss\{", text, re.M)
        release.touch()
        assert proc.wait(60) == 0, _stderr()
    finally:
        end_process(proc)


def _at_step(url: str, step: int) -> str | None:
    """The /metrics text once it holds ``step`` (None before)."""
    text = _metrics(url)
    return text if re.search(rf"^sentinel_step{{[^}}]*}} {step}\.0$", text, re.M) else None


def _alerts(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(url + "/api/v1/alerts", timeout=5) as r:
        return list(json.loads(r.read())["data"]["alerts"])


@pytest.mark.parametrize(("fault", "rule", "ranks"), [pytest.param("perturb", "RankDivergence", [0, 1],
                                                                   marks=pytest.mark.slow),
                                                      pytest.param("slow", "RankStraggler", [1],
                                                                   marks=pytest.mark.slow)])  # make test-slow
@retry_gloo_exit_abort
def test_torchrun_cross_rank_faults_fire_their_rule(tmp_path: Path, fault: str, rule: str, ranks: list[int]) -> None:
    release = tmp_path / "release"
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    proc, url = _start([torchrun, "--standalone", "--nproc-per-node", "2",
                        str(SCRIPTS / "ddp_train.py"), "60", str(release), fault])
    try:
        def fired() -> dict[str, Any] | None:
            return next((a for a in _alerts(url) if a["alertname"] == rule and a["state"] == "firing"), None)

        alert = wait_for(fired, timeout=120, what=f"{rule} firing")
        assert alert["ranks"] == ranks, alert
        if rule == "RankDivergence":  # rank 1's grads are 1 % larger from step 11: each rank is 0.5 % off the middle
            assert alert["step"] >= 11 and alert["value"] == pytest.approx(0.005, rel=0.05), alert
        else:  # rank 1 waits 30 ms per batch; rank 0 only computes (about 1 ms)
            assert alert["value"] > 1.5 and "before the gradient sync" in alert["summary"]
        others = {a["alertname"] for a in _alerts(url) if a["state"] == "firing"} - {rule}
        assert not others & {"RankDivergence", "RankStraggler"}, others
        release.touch()
        assert proc.wait(60) == 0, _stderr()
    finally:
        end_process(proc)


def test_stop_action_reaches_an_unmodified_script_through_the_daemon(tmp_path: Path) -> None:
    """`actions.stop_on` under `sentinel run`: the daemon sends the stop to the ranks' reply
    sockets, the next optimizer step raises TrainingHalted, and that exit is no crash."""
    cfg = _config(tmp_path, "actions:\n  stop_on: [critical]\n")
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--config", cfg, "--listen", "127.0.0.1:0",
                          "--", sys.executable, str(SCRIPTS / "faulty_train.py"), "400", "nan"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    assert "trained" not in out.stdout  # stopped before the 400 steps were done
    assert "sentinel.instrument.monitor.TrainingHalted: sentinel stopped training: TrainingNonFinite" in out.stderr
    assert "TrainingCrashed" not in out.stderr, out.stderr


@pytest.mark.parametrize("nan_at", [0, 20])
def test_a_distillation_is_two_trainings_and_its_crash_on_a_nan_is_the_students(nan_at: int, tmp_path: Path) -> None:
    """Knowledge distillation as PyTorch's tutorial writes it (scripts/distill.py): a teacher
    trained, then a student on its soft targets, one stream after the other. With anomaly
    detection on, the student's NaN loss makes its ``backward()`` raise; the teacher's monitor,
    closed at the exit, reported that loss as a step its script skipped (at the teacher's last
    step) and a crash's goodbye: the crash paged twice, and a third run of 0 steps, crashed,
    took the student's last report."""
    history = tmp_path / "h.sqlite"
    cfg = write_config(tmp_path, history={"path": str(history), "flush_seconds": 0.05})
    args = [sys.executable, str(SCRIPTS / "distill.py"), *([str(nan_at)] if nan_at else [])]
    plain = subprocess.run(args, capture_output=True, text=True, timeout=300)
    done = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--config", cfg, "--listen", "127.0.0.1:0",
                           "--", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SENTINEL_RUN": "kd"})
    assert done.returncode == plain.returncode == (1 if nan_at else 0), done.stderr
    assert done.stdout == plain.stdout
    with sqlite3.connect(history) as db:
        runs = db.execute("SELECT id, attempt, steps, state FROM runs ORDER BY id").fetchall()
        alerts = db.execute("SELECT run_id, alertname, step FROM alerts WHERE state_to = 'firing' ORDER BY id").fetchall()
    teacher_steps, student_steps = 3 * 16, (nan_at - 1 if nan_at else 4 * 16)
    assert [r[1:] for r in runs] == [(1, teacher_steps, "finished"),
                                     (2, student_steps, "crashed" if nan_at else "finished")], runs
    student = runs[1][0]
    if nan_at:
        assert sorted(alerts) == [(student, "TrainingCrashed", student_steps),
                                  (student, "TrainingNonFinite", student_steps)], alerts
        crashed = [line for line in done.stderr.splitlines() if "[FIRING] critical TrainingCrashed" in line]
        assert len(crashed) == 1 and "raised RuntimeError at distill.py" in crashed[0], done.stderr
        nonfinite = [line for line in done.stderr.splitlines() if "[FIRING] critical TrainingNonFinite" in line]
        # the NaN pass was not skipped: the script ended on it
        assert len(nonfinite) == 1 and "then the script ended on RuntimeError at distill.py" in nonfinite[0], done.stderr
        assert "skipped its step" not in nonfinite[0]
    else:
        assert alerts == []


_WARNS_EACH_STEP = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(30):
    x = torch.randn(16, 8)
    loss = nn.functional.mse_loss(model(x), x.sum(1))  # a [16, 1] output against a [16] target
    opt.zero_grad()
    loss.backward()
    opt.step()
print("final", repr(loss.item()))
"""


def test_a_warning_the_script_is_shown_once_is_shown_once(tmp_path: Path) -> None:
    """mse_loss warns at every step of a script whose output and target shapes differ ("Using
    a target size ... that is different to the input size"), and Python shows it once per line.
    Zero-code mode's scans for the model turned warnings off and on again, which clears the
    record of warnings shown: the script's stderr had the warning twice."""
    script = tmp_path / "broadcast.py"
    script.write_text(_WARNS_EACH_STEP)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    done = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--", sys.executable,
                           str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")})
    assert done.returncode == plain.returncode == 0, done.stderr
    assert done.stdout == plain.stdout
    assert plain.stderr.count("UserWarning: Using a target size") == 1, plain.stderr
    assert done.stderr.count("UserWarning: Using a target size") == 1, done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("sentinel:")] == [
        line for line in done.stderr.splitlines() if line.startswith("sentinel: metrics at")]
