"""An FSDP2 run's global norms, assembled by the daemon from the ranks' shards, equal the
unsharded reference: ``sentinel run -- torchrun --nproc-per-node 2`` with gloo on the CPU,
both in /metrics and in the run history."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from sentinel.history import db as hdb
from sentinel.history.query import find_run
from sentinel.history.query import series as history_series
from tests.helpers import end_process, retry_gloo_exit_abort, wait_for

pytestmark = pytest.mark.integration
SCRIPTS = Path(__file__).parent / "scripts"
STEPS = 12
_SAMPLE = re.compile(r"^(\w+)\{([^}]*)\} (\S+)$", re.M)


def _series(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a /metrics page, keyed by name and label set."""
    out = {}
    for name, labels, value in _SAMPLE.findall(text):
        pairs = frozenset(tuple(kv.split("=", 1)) for kv in re.findall(r'\w+="[^"]*"', labels))
        out[(name, frozenset((k, v.strip('"')) for k, v in pairs))] = float(value)
    return out


def _get(series: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    hits = [v for (n, ls), v in series.items() if n == name and set(labels.items()) <= ls]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} series"
    return hits[0]


@pytest.mark.slow  # make test-slow (the two-node FSDP test in make test covers the sharded path too)
@retry_gloo_exit_abort
def test_fsdp2_global_norm_equals_the_unsharded_reference(tmp_path: Path) -> None:
    ref_file, release = tmp_path / "reference.json", tmp_path / "release"
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    env = {**os.environ, "SENTINEL_UPDATE_EVERY": "1", "SENTINEL_RUN": "fsdp-history"}  # param norms every frame
    proc = subprocess.Popen([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--",
                             torchrun, "--standalone", "--nproc-per-node", "2",
                             str(SCRIPTS / "fsdp_train.py"), str(STEPS), str(ref_file), str(release)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    log: list[str] = []
    try:
        url = None
        for line in proc.stderr:  # type: ignore[union-attr]
            log.append(line)
            m = re.search(r"metrics at (http://127\.0\.0\.1:\d+)/metrics", line)
            if m:
                url = m.group(1)
                drain = threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
                drain.start()
                break
        assert url is not None, "".join(log)

        def both_done() -> str | None:
            with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
                text = r.read().decode()
            done = re.findall(rf'sentinel_step\{{job="train",rank="(\d)",run="[^"]+"\}} {STEPS}\.0', text)
            written = ref_file.exists() and all(Path(f"{ref_file}.rank{r}").exists() for r in (0, 1))
            return text if set(done) == {"0", "1"} and written else None

        series = _series(wait_for(both_done, timeout=120, what=f"both ranks at step {STEPS}"))
        ref = json.loads(ref_file.read_text())[-1]
        assert ref["step"] == STEPS
        for rank in ("0", "1"):  # the whole model's norms, on every rank's series
            assert _get(series, "sentinel_grad_norm", rank=rank) == pytest.approx(ref["grad_norm"], rel=1e-5)
            for group, norm in ref["group_grad_norm"].items():
                got = _get(series, "sentinel_group_grad_norm", rank=rank, group=group)
                assert got == pytest.approx(norm, rel=1e-5), group
            assert _get(series, "sentinel_param_norm", rank=rank) == pytest.approx(ref["param_norm"], rel=1e-5)
            # clip_grad_norm_ on DTensors returns the (replicated) global norm: read without a collective
            assert _get(series, "sentinel_grad_norm_preclip", rank=rank) == pytest.approx(ref["preclip"], rel=1e-5)
        for rank in ("0", "1"):  # the script clipped every step but the last, whose norm is above 2
            assert ref["grad_norm"] > 2.0
            assert _get(series, "sentinel_grad_clipped_steps_total", rank=rank) == STEPS - 1
        # each rank's own shard is exported apart, and is not the model's norm
        local = [_get(series, "sentinel_local_grad_norm", rank=r) for r in ("0", "1")]
        assert sum(v * v for v in local) == pytest.approx(ref["grad_norm"] ** 2, rel=1e-5)
        assert all(v < ref["grad_norm"] for v in local)
        assert not any(n == "sentinel_shard_steps_incomplete_total" and v for (n, _), v in series.items())
        # optimizer state: each rank's own shards (not the global size on every rank), and
        # the whole model's as the ranks' sum, on every rank's series
        held = [json.loads(Path(f"{ref_file}.rank{r}").read_text()) for r in (0, 1)]
        assert held[0]["state"] != held[1]["state"]  # 3 + 2 rows: the shards differ in size
        for rank, mine in zip(("0", "1"), held):
            for key, nbytes in mine["state"].items():
                assert _get(series, "sentinel_optimizer_state_bytes", rank=rank, state=key) == nbytes
                assert _get(series, "sentinel_model_optimizer_state_bytes", rank=rank, state=key) == sum(
                    h["state"][key] for h in held)
            assert _get(series, "sentinel_param_bytes", rank=rank) == mine["params"]
            assert _get(series, "sentinel_optimizer_state_param_ratio", rank=rank) == pytest.approx(2.0)  # AdamW
        release.touch()
        rc = proc.wait(120)
        drain.join(10)  # the job's stderr to its end
        assert rc == 0, "".join(log)
    finally:
        end_process(proc)
    # the run history holds the whole model's norms at every step, not rank 0's shards
    reference = json.loads(ref_file.read_text())
    db = hdb.connect(hdb.default_path(), readonly=True)
    run = find_run(db, "fsdp-history")
    assert run is not None and run.steps == STEPS and run.ranks == 2 and run.state == "finished"
    kept = history_series(db, run)
    assert kept.steps == [r["step"] for r in reference]
    assert kept.columns["grad_norm"] == pytest.approx([r["grad_norm"] for r in reference], rel=1e-5)
    assert kept.columns["param_norm"] == pytest.approx([r["param_norm"] for r in reference], rel=1e-5)
    groups = list(reference[-1]["group_grad_norm"])
    assert sorted(run.groups) == sorted(groups)
    last = dict(zip(run.groups, kept.group_grad[-1]))
    assert last == pytest.approx(reference[-1]["group_grad_norm"], rel=1e-5)
    assert run.mean_grad_norm == pytest.approx(sum(r["grad_norm"] for r in reference) / STEPS, rel=1e-5)


_WORLD_OF_ONE = r"""
import os
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"], RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
for layer in model:
    if isinstance(layer, nn.Linear):
        fully_shard(layer)  # each layer's gathered parameters freed after its forward
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for step in range(6):
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step))
    loss = nn.functional.mse_loss(model(x), x[:, :1])
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(step, f"{loss.item():.6f}")
dist.destroy_process_group()
"""


def test_sentinel_run_of_fsdp2_layers_that_free_their_gathered_parameters(tmp_path: Path) -> None:
    """FSDP2 frees each layer's gathered parameters after its forward (their storage
    resized to 0) while the graph still reaches them: reading one at the first backward()
    (the look for a loop updated by hand copied the smallest) ended the process with a
    segmentation fault. Under ``sentinel run`` it trains as plainly, every step reported."""
    from tests.integration.test_prometheus import _free_port

    env = {**os.environ, "PORT": str(_free_port()), "XDG_STATE_HOME": str(tmp_path)}
    plain = subprocess.run([sys.executable, "-c", _WORLD_OF_ONE], capture_output=True, text=True, timeout=120,
                           env={**env, "PORT": str(_free_port())})
    out = subprocess.run([sys.executable, "-m", "sentinel.cli", "run", "--listen", "127.0.0.1:0", "--",
                          sys.executable, "-c", _WORLD_OF_ONE], capture_output=True, text=True, timeout=120, env=env)
    assert plain.returncode == 0, plain.stderr
    assert out.returncode == 0, out.stderr
    assert out.stdout == plain.stdout
    db = hdb.connect(str(tmp_path / "sentinel" / "history.sqlite"))
    assert [r[0] for r in db.execute("SELECT steps FROM runs")] == [6]


@pytest.mark.slow  # two ranks under torchrun
@retry_gloo_exit_abort
def test_watch_in_each_rank_of_a_plain_torchrun_says_it_cannot_assemble_the_shards(tmp_path: Path) -> None:
    """``sentinel.watch`` in each rank of a plain ``torchrun`` (no ``sentinel run``, no node
    daemon) starts an engine per rank, which sees one rank's shards only: the history's
    gradient norm stays empty. Each rank says so once, with the way out, and trains on."""
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    program = Path(__file__).parents[1] / "programs" / "tensor_parallel.py"
    env = {**os.environ, "ZOO_WATCH": "1", "XDG_STATE_HOME": str(tmp_path), "SENTINEL_RUN": "tp-watch",
           "SENTINEL_LISTEN": "127.0.0.1:0", "PYTHONPATH": os.pathsep.join([str(program.parent), *sys.path])}
    out = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", str(program), str(tmp_path / "out"), "12"],
                         capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    said = [line for line in out.stderr.splitlines() if "sees only its shards" in line]
    assert len(said) == 2 and all(line.startswith("sentinel: ") and "sentinel run -- torchrun" in line
                                  for line in said), out.stderr[-3000:]
    db = hdb.connect(str(tmp_path / "sentinel" / "history.sqlite"), readonly=True)
    run = find_run(db, "tp-watch")  # one row: two engines write the file, rank 1's could end it first
    assert run is not None and run.steps == 12 and run.attempts == 1 and run.mean_grad_norm is None, run
    # (no gradient norm assembled: what the line warns of)
