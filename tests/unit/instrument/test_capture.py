"""The capture action's config, bounds and folders (issue 13, item 7)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sentinel.config import load_config
from sentinel.daemon.evidence import Capturer
from sentinel.files import safe_name
from sentinel.instrument.capture import bound, tensors_of
from sentinel.rules.alert import Transition
from sentinel.rules.config import ConfigError
from sentinel.store import Store, labels_of


@pytest.mark.parametrize(("actions", "line"), [
    ({"capture_on": ["NoSuchRule"]}, "actions.capture_on.0: 'NoSuchRule' is neither a severity nor a rule name"),
    ({"capture_on": ["critical", "fatal"]}, "actions.capture_on.1: 'fatal' is neither a severity nor a rule name"),
    ({"capture_on": ["critical"], "capture_max_bytes": 10},
     "actions.capture_max_bytes: Input should be greater than or equal to 1024"),
    ({"capture_on": ["critical"], "capture_keep": 0}, "actions.capture_keep: Input should be greater than or equal to 1"),
    ({"capture_on": "critical"}, "actions.capture_on: Input should be a valid list"),
])
def test_a_bad_capture_entry_is_one_dotted_line(actions: dict[str, object], line: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config({"actions": actions})
    assert err.value.problems == [line]


def test_capture_on_takes_severities_and_rule_names_and_is_off_by_default() -> None:
    cfg, _ = load_config({"actions": {"capture_on": ["critical", "GradientNoiseRising"]}})
    assert cfg.actions.capture_on == ["critical", "GradientNoiseRising"]
    default, _ = load_config(None)
    assert default.actions.capture_on == [] and default.actions.capture_max_bytes == 4 * 2**20


def test_the_cli_refuses_a_bad_capture_on_with_status_2(tmp_path: Path) -> None:
    path = tmp_path / "sentinel.yaml"
    path.write_text("actions:\n  capture_on: [GradientNoiseRisen]\n")
    proc = subprocess.run([sys.executable, "-m", "sentinel.cli", "check-config", str(path)], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "config error: actions.capture_on.0: 'GradientNoiseRisen' is neither a severity nor a rule name"]


@pytest.mark.parametrize(("shapes", "max_bytes", "saved"), [
    ([(8, 16)], 1024, [(8, 16)]),  # 512 bytes: whole
    ([(64, 16)], 1024, [(16, 16)]),  # 4 KiB: the first 16 rows
    ([(64, 16), (64,)], 1088, [(16, 16), (16,)]),  # one row count for every tensor: 68 bytes a row
    ([(64, 16), ()], 1027, [(15, 16), ()]),  # a 0-d tensor is kept whole, its bytes first
    ([(4, 1024)], 1024, []),  # one row is 4 KiB: nothing saved, and said so
])
def test_inputs_over_the_bound_keep_their_first_rows(shapes: list[tuple[int, ...]], max_bytes: int,
                                                     saved: list[tuple[int, ...]]) -> None:
    named = [(f"args.{i}", torch.arange(float(torch.Size(s).numel())).reshape(s)) for i, s in enumerate(shapes)]
    out, info = bound(named, max_bytes)
    assert [tuple(t.shape) for t in out.values()] == saved
    assert sum(t.numel() * t.element_size() for t in out.values()) <= max_bytes
    for name, t in out.items():
        original = dict(named)[name]
        assert torch.equal(t, original[: t.shape[0]] if t.dim() else original)
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()  # a compact copy, not a view
    if not saved:
        assert "nothing saved" in info["note"]
    elif saved != [tuple(s) for s in shapes]:
        assert info["truncated"]["rows_kept"] == saved[0][0]


def test_the_tensors_of_a_forward_are_named_by_where_they_were() -> None:
    x, ids, mask = torch.ones(2, 3, requires_grad=True), torch.zeros(2, dtype=torch.long), torch.ones(2)
    held = dict(tensors_of((x, [ids, "text"]), {"batch": {"mask": mask}, "flag": True}))
    assert list(held) == ["args.0", "args.1.0", "kwargs.batch.mask"]
    assert not held["args.0"].requires_grad and held["args.1.0"] is ids  # detached; never copied


def _firing(step: int, run: str = "r1") -> Transition:
    return Transition("GradientSpike", "warning", "inactive", "firing", "j", run, (0,), ("layers.1",), step,
                      1.0, 50.0, 10.0, f"spike at step {step}", ("bad batch",), ("check the batch",), "",
                      True, step, 1.0)


def test_at_most_capture_keep_folders_are_kept_per_run(tmp_path: Path) -> None:
    store = Store()
    labels = labels_of(job="j", run="r1", rank=0)
    for s in range(1, 40):
        store.add("sentinel_loss", labels, s, float(s), 1.0 / s)
        store.add("sentinel_group_grad_norm", labels_of(job="j", run="r1", rank=0, group="layers.1"), s, float(s),
                  float("inf") if s == 30 else 2.0)
    ticks = itertools.count(1_800_000_000)
    cap = Capturer(["warning"], str(tmp_path / "c"), store, keep=2, clock=lambda: float(next(ticks)))
    made = [cap.capture(_firing(step)) for step in (10, 20, 30)]
    assert all(m is not None for m in made)
    left = sorted(p.name for p in (tmp_path / "c" / "j" / "r1").iterdir())
    assert [n.split("-")[1] for n in left] == ["step20", "step30"]  # the oldest went
    doc = json.loads(Path(made[-1]["evidence"]).read_text())  # type: ignore[index]
    assert doc["ranks"]["0"]["groups"]["layers.1"]["grad_norm"] == {"step": 30, "value": "inf"}
    assert doc["ranks"]["0"]["history"]["loss"]["steps"][-1] == 39
    assert made[-1]["message"]["step"] == 30 and made[-1]["message"]["ranks"] == [0]  # type: ignore[index]


@pytest.mark.parametrize("run", ["..", "../../etc", "a/b", ".hidden", ""])
def test_odd_run_names_stay_inside_the_capture_folder(tmp_path: Path, run: str) -> None:
    name = safe_name(run)
    assert "/" not in name and not name.startswith(".") and name
    made = Capturer(["warning"], str(tmp_path / "c"), Store()).capture(_firing(5, run=run))
    assert made is not None
    assert Path(made["folder"]).resolve().is_relative_to((tmp_path / "c").resolve())


def test_the_messages_name_the_evidence_and_the_batch() -> None:
    from sentinel.delivery.messages import body
    from sentinel.delivery.sinks import alertmanager_alert

    n = {**_firing(9).to_json(), "evidence": "/c/j/r_1/x/evidence.json", "inputs": ["/c/j/r_1/x/inputs.rank0.pt"]}
    assert "evidence: /c/j/r_1/x/evidence.json\nbatch: /c/j/r_1/x/inputs.rank0.pt" in body(n)
    assert "**evidence**: `/c/j/r_1/x/evidence.json`" in body(n, markdown=True)
    ann = alertmanager_alert(n, None)["annotations"]
    assert ann["evidence"] == "/c/j/r_1/x/evidence.json" and ann["batch"] == "/c/j/r_1/x/inputs.rank0.pt"
    plain = _firing(9).to_json()
    assert "evidence" not in body(plain) and "evidence" not in alertmanager_alert(plain, None)["annotations"]


def test_the_hook_holds_the_last_steps_and_a_late_capture_gets_the_nearest(tmp_path: Path) -> None:
    from sentinel.instrument.boundary import Boundary
    from sentinel.instrument.capture import InputCapture
    from tests.helpers import MLP

    model, done = MLP(), [0]
    cap = InputCapture(model, lambda: done[0], 0, Boundary())
    model(torch.ones(2, 16))
    assert cap.handle is None and not cap.held  # not armed: nothing hooked
    cap.arm({"kind": "arm", "rank": 0, "steps": 2})
    fed = {}
    for step in (1, 2, 3):
        fed[step] = torch.full((2, 16), float(step))
        model(fed[step])
        with torch.no_grad():
            model(torch.zeros(2, 16))  # an evaluation: not the batch that trained
        done[0] = step
    assert list(cap.held) == [2, 3] and [len(f) for f in cap.held.values()] == [1, 1]
    cap.take({"kind": "capture", "ranks": [0], "step": 1, "folder": str(tmp_path), "max_bytes": 2**20})
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    cap.take({"kind": "capture", "ranks": [1], "step": 3, "folder": str(other), "max_bytes": 2**20})
    cap.close()
    assert cap.handle is None and not cap.held and not model._forward_pre_hooks_with_kwargs
    d = json.loads((tmp_path / "inputs.rank0.json").read_text())
    assert d["requested_step"] == 1 and d["step"] == 2 and d["exact"] is False and "nearest" in d["note"]
    assert torch.equal(torch.load(tmp_path / "inputs.rank0.pt", weights_only=True)["args.0"], fed[2])
    assert not any(other.iterdir())  # rank 1's capture is not this rank's to write


def test_a_capture_with_nothing_held_says_so(tmp_path: Path) -> None:
    from sentinel.instrument.boundary import Boundary
    from sentinel.instrument.capture import InputCapture

    cap = InputCapture(None, lambda: 0, 0, Boundary())
    cap.arm({"kind": "arm", "rank": 0, "steps": 4})
    cap.take({"kind": "capture", "ranks": [0], "step": 7, "folder": str(tmp_path)})
    cap.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inputs.rank0.json"]
    d = json.loads((tmp_path / "inputs.rank0.json").read_text())
    assert d["step"] is None and d["note"] == "no model is watched: no inputs to hold"
