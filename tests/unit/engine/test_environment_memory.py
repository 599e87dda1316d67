"""sentinel_environment_info, the OOM and allocator-retry gauges and rules, the headroom levels."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from sentinel import wire
from sentinel.engine.engine import Engine
from sentinel.instrument import envprobe as environment
from sentinel.store import labels_of
from tests.helpers import MLP, make_monitor, train_steps

BASE = labels_of(job="j", run="r", rank=0)


def _frame(step: int, **extra: Any) -> bytes:
    f = {"kind": "step", "job": "j", "run": "r", "rank": 0, "step": step, "t": float(step),
         "groups": ["w"], "grad_sumsq": [1.0], **extra}
    return wire.encode(f)


def test_describe_reads_torchs_own_versions_and_flags() -> None:
    env = environment.describe([torch.device("cpu")])
    assert env["torch"] == torch.__version__
    assert env["cuda"] == str(torch.version.cuda or "none")
    assert env["gpu_model"] == "none"
    assert env["tf32_matmul"] == str(torch.backends.cuda.matmul.allow_tf32).lower()
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert environment.describe([])["deterministic"] == "true"
    finally:
        torch.use_deterministic_algorithms(before)


def test_the_first_frame_carries_the_environment_and_the_engine_exports_it(mlp: MLP) -> None:
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    mon, sender = make_monitor(mlp, opt)
    train_steps(mlp, opt, 3, mon)
    mon.close()
    steps = sender.steps()
    assert "env" in steps[0] and "env" not in steps[1]
    store = sender.engine.store
    [labels] = store.labelsets("sentinel_environment_info")
    d = dict(labels)
    assert d["torch"] == torch.__version__ and d["rank"] == "0" and "deterministic" in d
    assert store.last("sentinel_environment_info", labels)[2] == 1.0  # type: ignore[index]


def test_an_environment_that_changed_keeps_one_live_series() -> None:
    eng = Engine()
    eng.feed(_frame(1, env={"torch": "2.13.0", "gpu_model": "A"}))
    eng.feed(_frame(2, env={"torch": "2.13.0", "gpu_model": "B", "junk": "x" * 500}))
    live = {dict(ls)["gpu_model"]: eng.store.last("sentinel_environment_info", ls)[2]  # type: ignore[index]
            for ls in eng.store.labelsets("sentinel_environment_info")}
    assert live == {"A": 0.0, "B": 1.0}
    assert all("junk" not in dict(ls) for ls in eng.store.labelsets("sentinel_environment_info"))


def _mem(used: float, ooms: float = 0.0, retries: float = 0.0) -> dict[str, float]:
    return {"cuda_reserved": used, "cuda_total": 100.0, "cuda_allocated": used, "cuda_peak": used,
            "cuda_ooms": ooms, "cuda_retries": retries}


@pytest.mark.parametrize(
    ("series", "fired"),
    [
        ([_mem(50.0)] * 30, set()),
        ([_mem(50.0)] * 10 + [_mem(50.0, ooms=1.0)] * 20, {"CudaOOM"}),  # one more OOM
        ([_mem(50.0, retries=float(i)) for i in range(30)], {"CudaAllocRetries"}),  # rising every report
        ([_mem(50.0, retries=5.0)] * 30, set()),  # retries long ago, none since
        ([_mem(85.0)] * 30, {"OOMRisk"}),  # 80 %: the seeds' 20 % headroom
        ([_mem(95.0)] * 30, {"OOMRisk", "MemoryCritical"}),
    ],
)
def test_memory_rules(series: list[dict[str, float]], fired: set[str]) -> None:
    eng = Engine()
    for step, mem in enumerate(series, 1):
        assert eng.feed(_frame(step, mem=mem))
    got = {t.alertname for t in eng.transitions if t.state_to == "firing"}
    assert got == fired
    assert eng.store.counter("sentinel_cuda_ooms_total", BASE) == series[-1]["cuda_ooms"]
