"""Run history end to end: real runs recorded by the embedded engine, by ``sentinel run`` and by
a daemon killed mid-run; ``sentinel runs``, ``report`` (loaded in a real headless Chromium)
and ``compare`` (checked against the runs' own numbers)."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import sentinel
from sentinel.history import db as hdb
from tests.helpers import MLP, train_steps, wait_for
from tests.integration.test_prometheus import _free_port

pytestmark = pytest.mark.integration
SCRIPTS = Path(__file__).parent / "scripts"
TARGET = 30.0


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sentinel.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def train(run: str, lr: float, seed: int, steps: int, frames: list[dict[str, Any]]) -> list[float]:
    """A real CPU run under the embedded engine (a thread), tagged; returns its losses. Every
    frame the engine admits is also kept in ``frames`` (the run's own numbers)."""
    torch.manual_seed(seed)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    with sentinel.watch(model, opt, run=run, engine="thread", listen="127.0.0.1:0", update_every=5,
                        memory_every=5, tags={"optimizer": "adamw", "lr": str(lr), "seed": str(seed)}) as mon:
        mon.engine.service.engine.frame_listeners.append(frames.append)
        gen = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            x = torch.randn(8, 16, generator=gen)
            loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
            mon.log(loss=loss)
            losses.append(float(loss.detach()))
    return losses


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three embedded runs (two seeds of one config, one other lr) in the default history file."""
    runs: dict[str, Any] = {}
    for name, lr, seed in (("h-a1", 1e-2, 1), ("h-a2", 1e-2, 2), ("h-b1", 3e-3, 1)):
        frames: list[dict[str, Any]] = []
        runs[name] = {"losses": train(name, lr, seed, 40, frames), "frames": frames}
    runs["db"] = str(hdb.default_path())
    return runs


def _peak(frames: list[dict[str, Any]]) -> float:
    return max(f["mem"]["host_rss"] for f in frames if isinstance(f.get("mem"), dict))


def test_embedded_and_sentinel_run_runs_appear_in_sentinel_runs(recorded: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "losses.json"
    env = dict(os.environ, SENTINEL_RUN="h-cli")
    res = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0",
                          "--tag", "optimizer=sgd", "--tag", "seed=7", "--",
                          sys.executable, str(SCRIPTS / "history_train.py"), "25", "0.01", str(out)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    listing = cli("runs", "--db", recorded["db"])
    assert listing.returncode == 0, listing.stderr
    for name in ("h-a1", "h-a2", "h-b1", "h-cli"):
        assert name in listing.stdout
    line = next(ln for ln in listing.stdout.splitlines() if "h-cli" in ln)
    assert "SGD" in line and " 25 " in line and "finished" in line  # the class from the frames, not the tag
    losses = json.loads(out.read_text())
    assert f"{losses[-1]:.4g}" in line  # the zero-code run's final loss, as the script saw it
    tagged = cli("runs", "--db", recorded["db"], "--tag", "seed=7", "--since", "1h")
    assert "h-cli" in tagged.stdout and "h-a1" not in tagged.stdout
    assert "h-b1" in cli("runs", "--db", recorded["db"], "--job", "train").stdout
    db = hdb.connect(recorded["db"], readonly=True)
    cmd, tags, status = db.execute("SELECT command, tags, exit_status FROM runs WHERE run = 'h-cli'").fetchone()
    assert "history_train.py" in cmd and json.loads(tags) == {"optimizer": "sgd", "seed": "7"} and status == 0


def test_compare_gives_the_seed_table_from_the_runs_own_numbers(recorded: dict[str, Any], tmp_path: Path) -> None:
    csv_path, html_path = tmp_path / "t.csv", tmp_path / "t.html"
    res = cli("compare", "h-a1", "h-a2", "h-b1", "--target-loss", str(TARGET), "--csv", str(csv_path),
              "--html", str(html_path), "--db", recorded["db"])
    assert res.returncode == 0, res.stderr
    for col in ("optimizer", "lr", "final loss", "steps to target", "mean grad norm", "mean update",
                "peak memory", "diverged", "warnings", "criticals"):
        assert col in res.stdout
    rows = list(csv.DictReader(csv_path.open()))
    assert [r["runs"] for r in rows] == ["2", "1"]  # the two seeds of lr 0.01 form one row
    a = [recorded[n] for n in ("h-a1", "h-a2")]
    finals = [r["losses"][-1] for r in a]
    assert float(rows[0]["final_loss_mean"]) == pytest.approx(sum(finals) / 2, rel=1e-6)
    assert float(rows[1]["final_loss_mean"]) == pytest.approx(recorded["h-b1"]["losses"][-1], rel=1e-6)
    assert float(rows[0]["peak_memory_bytes"]) == pytest.approx(sum(_peak(r["frames"]) for r in a) / 2)
    reach = [next((i + 1 for i, v in enumerate(r["losses"]) if v <= TARGET), None) for r in a]
    hit = [s for s in reach if s is not None]
    assert hit, "the test's target must be reached"
    assert float(rows[0]["steps_to_target_mean"]) == pytest.approx(sum(hit) / len(hit))
    assert rows[0]["reached"] == str(len(hit))
    # the optimizer class comes from the frames (the tags say "adamw"), each row names its runs
    assert rows[0]["diverged"] == "0" and rows[0]["optimizer"] == "AdamW" and rows[0]["lr"] == "0.01"
    assert [r["run_names"] for r in rows] == ["h-a1 h-a2", "h-b1"]
    assert "<td>h-a1, h-a2</td>" in html_path.read_text() and "<th>run</th>" in html_path.read_text()
    assert "h-b1" in res.stdout
    assert "±" in res.stdout  # mean ± std over the seeds
    assert html_path.read_text().count("<polyline") >= 3


def _chromium(url: str, tmp: Path) -> tuple[str, str]:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    res = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                          "--no-first-run", f"--user-data-dir={tmp}", "--enable-logging=stderr", "--v=0",
                          "--dump-dom", url], capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout, res.stderr


def test_report_html_loads_in_chromium_with_its_plots_and_no_console_errors(recorded: dict[str, Any],
                                                                             tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    res = cli("report", "h-a1", "-o", str(page), "--db", recorded["db"])
    assert res.returncode == 0, res.stderr
    assert "final loss" in res.stdout  # the terminal summary
    html = page.read_text()
    outside = html.replace('xmlns="http://www.w3.org/2000/svg"', "")  # a namespace name, never fetched
    assert "http://" not in outside and "https://" not in outside and "<script" not in outside
    dom, log = _chromium(page.as_uri(), tmp_path / "profile")
    assert "CONSOLE" not in log and "Uncaught" not in log
    for title in ("Loss", "Gradient norm", "Learning rate", "Per-group gradient norm"):
        assert f'data-plot="{title}"' in dom
    assert dom.count('<svg class="plot"') >= 4 and dom.count("<polyline") >= 4
    assert dom.count('<svg class="heatmap"') >= 1
    # the check would see an error: the same browser on a page that logs one
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><script>console.error('boom')</script></body></html>")
    _, bad_log = _chromium(bad.as_uri(), tmp_path / "profile2")
    assert "CONSOLE" in bad_log and "boom" in bad_log


def test_a_daemon_killed_mid_run_loses_at_most_its_last_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    history = tmp_path / "h.sqlite"
    config = tmp_path / "sentinel.yaml"
    config.write_text(f"history: {{path: {history}, flush_seconds: 0.1}}\n")
    sock, port = tmp_path / "run" / "engine.sock", _free_port()
    monkeypatch.setenv("SENTINEL_SOCKET", str(sock))

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "sentinel.cli", "daemon", "--socket", str(sock), "--listen",
                                 f"127.0.0.1:{port}", "--config", str(config)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def last_step() -> int:
        try:
            db = sqlite3.connect(f"{history.as_uri()}?mode=ro", uri=True)
            try:
                return int(db.execute("SELECT COALESCE(MAX(step), 0) FROM samples").fetchone()[0])
            finally:
                db.close()
        except sqlite3.Error:
            return 0

    daemon = start()
    try:
        wait_for(lambda: sock.exists() and history.exists(), what="the daemon")
        torch.manual_seed(0)
        model = MLP()
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        mon = sentinel.watch(model, opt, run="killed")
        step = 0

        def steps(n: int) -> None:
            nonlocal step
            train_steps(model, opt, n, mon, seed=step)
            step += n

        steps(20)
        wait_for(lambda: last_step() >= 19, what="steps committed")  # a report is read back a step later
        committed = last_step()
        steps(15)  # these may sit in the daemon's queue, unflushed
        daemon.send_signal(signal.SIGKILL)
        daemon.wait()
        db = hdb.connect(history)  # opens cleanly for writing: WAL recovered, nothing to repair
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        kept = [r[0] for r in db.execute("SELECT step FROM samples ORDER BY step")]
        assert kept == list(range(1, len(kept) + 1))  # no holes: whole batches or nothing
        assert committed <= len(kept) <= step  # only what came after the last commit was lost
        db.close()
        daemon = start()  # a new daemon goes on recording the same run in the same file
        wait_for(lambda: sock.exists(), what="the restarted daemon")
        def step_and_check() -> bool:
            steps(1)
            return last_step() > step - 2

        wait_for(step_and_check, timeout=20, what="steps after the restart")
        mon.close()
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(10)


def test_a_reused_run_name_is_a_new_run_listed_reported_and_compared_apart(tmp_path: Path) -> None:
    first = train("h-again", 1e-2, 1, 30, [])
    second = train("h-again", 3e-3, 2, 20, [])  # the same job and name: a second run, not more of the first
    db = str(hdb.default_path())
    listing = cli("runs", "--db", db)
    assert listing.returncode == 0, listing.stderr
    lines = [ln for ln in listing.stdout.splitlines() if "h-again" in ln]
    assert len(lines) == 2 and "h-again@2" in lines[0] and "h-again@1" in lines[1]  # newest first
    assert " 20 " in lines[0] and f"{second[-1]:.4g}" in lines[0]
    assert " 30 " in lines[1] and f"{first[-1]:.4g}" in lines[1]
    latest = cli("report", "h-again", "--format", "text", "--db", db).stdout  # the latest by default
    assert "train/h-again@2" in latest and re.search(r"^steps\s+20$", latest, re.M) and "lr=0.003" in latest
    older = cli("report", "h-again@1", "--format", "text", "--db", db).stdout
    assert "train/h-again@1" in older and re.search(r"^steps\s+30$", older, re.M) and "lr=0.01" in older
    run_id = re.search(r"#(\d+)", lines[1])
    assert run_id is not None
    assert cli("report", f"#{run_id.group(1)}", "--format", "text", "--db", db).stdout == older
    csv_path = tmp_path / "again.csv"
    res = cli("compare", "h-again@1", "h-again", "--csv", str(csv_path), "--db", db)
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(csv_path.open()))
    assert [r["run_names"] for r in rows] == ["h-again@1", "h-again@2"]
    assert [float(r["final_loss_mean"]) for r in rows] == pytest.approx([first[-1], second[-1]], rel=1e-6)


def test_a_run_named_with_a_slash_is_reported_into_one_file_of_the_folder(tmp_path: Path) -> None:
    """A run named like a path (``exp/lr-3e-4``, ``../x``: a launcher's group/name, a typo)
    gets its HTML report and its PNGs as files of the folder asked for, named after the run
    with the odd characters replaced and a hash of the name. ``sentinel report`` ended on a
    traceback (``FileNotFoundError``: no folder ``sentinel-report-exp``), and where such
    folders existed it wrote outside the current one."""
    train("exp/lr-3e-4", 1e-2, 1, 12, [])
    train("../x", 1e-2, 1, 12, [])
    db = str(hdb.default_path())
    here = tmp_path / "here"
    here.mkdir()
    for run, name in (("exp/lr-3e-4", "sentinel-report-exp_lr-3e-4-523f6405.html"),
                      ("../x", "sentinel-report-_._x-d6b96a97.html")):
        res = subprocess.run([sys.executable, "-m", "sentinel.cli", "report", run, "--db", db], cwd=here,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip().splitlines()[-1] == f"report: {name}"
    assert sorted(p.name for p in here.iterdir()) == ["sentinel-report-_._x-d6b96a97.html",
                                                       "sentinel-report-exp_lr-3e-4-523f6405.html"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here"]
    pytest.importorskip("matplotlib")
    png = cli("report", "exp/lr-3e-4", "--format", "png", "-o", str(tmp_path / "png"), "--db", db)
    assert png.returncode == 0, png.stderr
    files = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert files and all(f.startswith("exp_lr-3e-4-523f6405-") and f.endswith(".png") for f in files)


def test_a_locked_history_file_is_waited_out_and_the_run_recorded_whole(tmp_path: Path) -> None:
    """Another process holds the history file's write lock during part of a real run: training
    goes on, the writer retries (counted in /metrics), and once the lock goes every step is there."""
    import urllib.request

    history = tmp_path / "h.sqlite"
    config = tmp_path / "sentinel.yaml"
    config.write_text(f"history: {{path: {history}, flush_seconds: 0.05}}\n")

    def committed() -> int:
        ro = sqlite3.connect(f"{history.as_uri()}?mode=ro", uri=True)
        try:
            return int(ro.execute("SELECT COALESCE(MAX(step), 0) FROM samples").fetchone()[0])
        finally:
            ro.close()

    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with sentinel.watch(model, opt, run="h-locked", engine="thread", listen="127.0.0.1:0",
                        config=str(config)) as mon:
        rec = mon.engine.service.history

        def steps(n: int) -> None:
            train_steps(model, opt, n, mon)

        steps(10)
        wait_for(lambda: committed() >= 9, what="the first steps committed")  # a report leaves a step later
        holder = sqlite3.connect(history, isolation_level=None, timeout=10)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            before = committed()
            steps(10)  # training goes on: the engine only queues, the writer waits
            wait_for(lambda: rec.retries >= 1, what="the writer to find the file locked")
            steps(10)
            assert committed() == before  # nothing could be written meanwhile
            with urllib.request.urlopen(f"{mon.url}/metrics", timeout=5) as r:
                metrics = r.read().decode()
            retried = re.search(r"^sentinel_history_retries_total (\S+)$", metrics, re.M)
            assert retried is not None and float(retried.group(1)) >= 1
            assert re.search(r"^sentinel_history_up 1\.0$", metrics, re.M)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        steps(10)
    assert rec.degraded == 0 and rec.dropped == 0
    db = hdb.connect(history, readonly=True)
    assert [r[0] for r in db.execute("SELECT step FROM samples ORDER BY step")] == list(range(1, 41))
    assert db.execute("SELECT steps, state FROM runs WHERE run = 'h-locked'").fetchone() == (40, "finished")


def test_tags_are_exported_as_one_info_series(tmp_path: Path) -> None:
    import urllib.request

    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with sentinel.watch(model, opt, run="h-info", engine="thread", listen="127.0.0.1:0",
                        tags={"optimizer": "lion", "lr": "3e-4", "seed": "1"}) as mon:
        train_steps(model, opt, 3, mon)

        def info() -> list[str]:
            with urllib.request.urlopen(f"{mon.url}/metrics", timeout=5) as r:
                text = r.read().decode()
            return [ln for ln in text.splitlines() if ln.startswith("sentinel_run_info{")]

        [line] = wait_for(info, what="sentinel_run_info")
    assert line == 'sentinel_run_info{job="train",lr="3e-4",optimizer="lion",run="h-info",seed="1"} 1.0'


def test_compare_by_a_tag_and_report_as_text_and_png(recorded: dict[str, Any], tmp_path: Path) -> None:
    csv_path = tmp_path / "by.csv"
    res = cli("compare", "h-a1", "h-a2", "h-b1", "--by", "optimizer", "--csv", str(csv_path), "--db", recorded["db"])
    assert res.returncode == 0, res.stderr
    [row] = list(csv.DictReader(csv_path.open()))
    assert row["runs"] == "3" and row["run_names"] == "h-a1 h-a2 h-b1"
    text = cli("report", "h-b1", "--format", "text", "--db", recorded["db"])
    assert text.returncode == 0 and "train/h-b1" in text.stdout and "lr=0.003" in text.stdout
    missing = cli("report", "no-such-run", "--db", recorded["db"])
    assert missing.returncode == 2 and "no run 'no-such-run'" in missing.stderr
    pytest.importorskip("matplotlib")
    png = cli("report", "h-b1", "--format", "png", "-o", str(tmp_path / "png"), "--db", recorded["db"])
    assert png.returncode == 0, png.stderr
    files = sorted((tmp_path / "png").glob("*.png"))
    assert len(files) >= 4 and all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in files)


def test_a_non_finite_run_is_diverged_with_its_critical_alert_in_compare_and_report(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with sentinel.watch(model, opt, run="h-nan", engine="thread", listen="127.0.0.1:0",
                        tags={"optimizer": "sgd", "lr": "1e-3"}) as mon:
        for i in range(12):
            x = torch.randn(8, 16)
            loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
            mon.log(loss=loss if i < 9 else torch.tensor(float("nan")))
    db = str(hdb.default_path())
    csv_path = tmp_path / "nan.csv"
    res = cli("compare", "h-nan", "--csv", str(csv_path), "--db", db)
    assert res.returncode == 0, res.stderr
    [row] = list(csv.DictReader(csv_path.open()))
    assert row["diverged"] == "1" and int(row["criticals"]) >= 1
    text = cli("report", "h-nan", "--format", "text", "--db", db).stdout
    assert "TrainingNonFinite (critical)" in text and "first checks:" in text
    page = tmp_path / "nan.html"
    assert cli("report", "h-nan", "-o", str(page), "--db", db).returncode == 0
    html = page.read_text()
    assert 'class="marker"' in html and "TrainingNonFinite" in html and "likely causes" in html
