"""A config file that cannot be read as UTF-8 YAML is one ``ConfigError`` line and exit
status 2, never a traceback (item 7 of issue 10)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sentinel.config import load_config
from sentinel.rules.config import ConfigError


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sentinel.cli", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONWARNINGS": "ignore"})


@pytest.mark.parametrize(("content", "message"), [
    (b"rules:\n  LossSpike: {enabled: false}\n# caf\xe9 in latin-1\n", "not UTF-8 text (byte 42 is 0xe9)"),
    (b"\xff\xfe\x00r\x00u\x00l\x00e\x00s", "not UTF-8 text (byte 0 is 0xff)"),  # UTF-16
])
def test_a_non_utf8_config_is_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "sentinel.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.problems == [f"{path}: {message}"]
    for command in (["check-config", str(path)], ["daemon", "--config", str(path)],
                    ["run", "--config", str(path), "--", "true"]):
        proc = _cli(*command)
        assert proc.returncode == 2, (command, proc.stderr)
        assert proc.stderr.strip().splitlines() == [f"config error: {path}: {message}"]


def test_an_unreadable_config_is_one_line(tmp_path: Path) -> None:
    proc = _cli("check-config", str(tmp_path))  # a folder: EISDIR
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"config error: {tmp_path}: cannot read: Is a directory"]
    proc = _cli("check-config", str(tmp_path / "missing.yaml"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"config error: {tmp_path / 'missing.yaml'}: cannot read: No such file or directory"]


@pytest.mark.parametrize(("env", "line"), [
    ({"SENTINEL_MAX_GROUPS": "400"},
     "SENTINEL_MAX_GROUPS: max_groups: must be 1..256 (the groups a report carries), got 400"),
    ({"SENTINEL_UPDATE_EVERY": "often"}, "SENTINEL_UPDATE_EVERY: update_every: must be an integer, got 'often'"),
    ({"SENTINEL_UPDATE_EVERY": "0"}, "SENTINEL_UPDATE_EVERY: update_every: must be an integer >= 1, got 0"),
    ({"SENTINEL_GROUP_DEPTH": "deep"}, "SENTINEL_GROUP_DEPTH: group_depth: must be auto or an integer, got 'deep'"),
    ({"SENTINEL_RUN": "r" * 129}, "SENTINEL_RUN: run: must be 1..128 characters, got 129 characters"),
    ({"SENTINEL_JOB": "j" * 200}, "SENTINEL_JOB: job: must be 1..128 characters, got 200 characters"),
])
def test_sentinel_run_refuses_a_bad_monitor_option_before_its_command_starts(tmp_path: Path, env: dict[str, str],
                                                                            line: str) -> None:
    """The zero-code monitors take their options from ``SENTINEL_*`` variables. With a bad
    one each would fail to attach, and the script trained unwatched: a traceback in its
    stderr, then the end's "sent no report"; or, for a job name over the frame's 128
    characters, every frame refused (a history row of 0 steps) with one line of the engine's
    that named no variable. ``sentinel run`` now says which variable is wrong, in one line,
    with exit status 2, and does not start the command."""
    marker = tmp_path / "ran"
    proc = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--",
                           sys.executable, "-c", f"open({str(marker)!r}, 'w')"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONWARNINGS": "ignore",
                                           "XDG_STATE_HOME": str(tmp_path), **env})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"config error: {line}"]
    assert not marker.exists()


def test_an_empty_sentinel_variable_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job template's ``SENTINEL_JOB=`` left blank is no job name: the default, ``train``,
    as ``sentinel run`` records it. It was the empty name, which the engine refuses in every
    frame: the run's history row had 0 steps, and the one line said the field 'job' was
    empty, not which variable made it so."""
    from sentinel.instrument.options import env_problem, from_kwargs

    for name in ("SENTINEL_JOB", "SENTINEL_UPDATE_EVERY", "SENTINEL_CAPTURE_LOSS"):
        monkeypatch.setenv(name, "")
    opts = from_kwargs({})
    assert (opts.job, opts.update_every, opts.capture_loss) == ("train", 100, False)
    assert env_problem() is None


def test_a_misspelt_key_names_the_one_it_is_closest_to() -> None:
    """Under any section, a list's items and the guard's options too; a key close to none is
    told as unknown, with no guess."""
    with pytest.raises(ConfigError) as info:
        load_config({"retension": {"ended_seconds": 10},
                     "notify": {"min_serverity": "warning", "routes": [{"urls": [], "alertname": ["LossSpike"]}]},
                     "actions": {"guard": {"factr": 5}}, "listen": "127.0.0.1:9400"})
    assert sorted(info.value.problems) == [
        "actions.guard.factr: Extra inputs are not permitted (did you mean 'factor'?)",
        "listen: Extra inputs are not permitted",
        "notify.min_serverity: Extra inputs are not permitted (did you mean 'min_severity'?)",
        "notify.routes.0.alertname: Extra inputs are not permitted (did you mean 'alertnames'?)",
        "retension: Extra inputs are not permitted (did you mean 'retention'?)",
    ]
