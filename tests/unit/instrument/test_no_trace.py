"""Nothing Sentinel attaches reaches a user's torch.save, pickle, deepcopy, TorchScript or
torch.compile of a watched model or its optimizer (issue 18, point 1)."""

from __future__ import annotations

import copy
import io
import pickle
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

import sentinel

# a fresh interpreter in which `import sentinel` fails, as on a machine without it
_LOAD = r"""
import sys
class _NoSentinel:
    def find_spec(self, name, path=None, target=None):
        if name == "sentinel" or name.startswith("sentinel.") or name.startswith("sentinel_"):
            raise ImportError("sentinel is not installed here")
sys.meta_path.insert(0, _NoSentinel())
import torch
sys.path.insert(0, sys.argv[3])
import no_trace_model  # the user's class, importable as in their project
for name in ("model", "optimizer"):
    a = torch.load(sys.argv[1] + f"/{name}.pt", weights_only=False)
    b = torch.load(sys.argv[2] + f"/{name}.pt", weights_only=False)
    sa, sb = a.state_dict(), b.state_dict()
    if name == "model":
        assert list(sa) == list(sb), (list(sa), list(sb))
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
        hooks = [d for attr in ("_forward_pre_hooks", "_forward_hooks") for m in a.modules()
                 for d in getattr(m, attr).values()]
        assert not hooks, hooks
        assert type(a._forward_pre_hooks) is type(b._forward_pre_hooks)
    else:
        assert sa["param_groups"] == sb["param_groups"]
        assert sorted(sa["state"]) == sorted(sb["state"])
        assert not a._optimizer_step_pre_hooks and not a._optimizer_step_post_hooks
        assert not a._optimizer_load_state_dict_post_hooks
print("loaded both without sentinel")
"""

_MODEL = '''
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh())
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.body(x))
'''


def _train(watch: bool, folder: Path) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    sys.path.insert(0, str(folder.parent))
    import no_trace_model

    torch.manual_seed(0)
    model = no_trace_model.Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mon = sentinel.watch(model, opt, engine="off") if watch else None
    for _ in range(3):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if mon is not None:
            mon.log(loss=loss)
    folder.mkdir()
    torch.save(model, folder / "model.pt")  # saved while watched, as a script saves mid-run
    torch.save(opt, folder / "optimizer.pt")
    if mon is not None:
        mon.close()
    return model, opt


@pytest.fixture()
def user_module(tmp_path: Path) -> Path:
    (tmp_path / "no_trace_model.py").write_text(_MODEL)
    yield tmp_path
    sys.modules.pop("no_trace_model", None)
    sys.path.remove(str(tmp_path)) if str(tmp_path) in sys.path else None


def test_saved_model_and_optimizer_load_where_sentinel_is_not(user_module: Path) -> None:
    _train(True, user_module / "watched")
    _train(False, user_module / "plain")
    out = subprocess.run([sys.executable, "-c", _LOAD, str(user_module / "watched"), str(user_module / "plain"),
                          str(user_module)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "loaded both without sentinel" in out.stdout
    assert b"sentinel" not in (user_module / "watched" / "model.pt").read_bytes()
    assert b"sentinel" not in (user_module / "watched" / "optimizer.pt").read_bytes()


def _watched() -> tuple[torch.nn.Module, torch.optim.Optimizer, object]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = sentinel.watch(model, opt, engine="off")
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt, mon


def test_pickle_and_deepcopy_leave_sentinel_out() -> None:
    model, opt, mon = _watched()
    assert len(model._forward_pre_hooks) > 0  # watched: the busy clock's hooks are there
    for copied in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert len(copied._forward_pre_hooks) == 0 and len(copied._forward_hooks) == 0
        assert type(copied._forward_pre_hooks) is OrderedDict
    assert b"sentinel" not in pickle.dumps(model) and b"sentinel" not in pickle.dumps(opt)
    opt2 = copy.deepcopy(opt)
    assert not opt2._optimizer_step_pre_hooks and not opt2._optimizer_step_post_hooks
    mon.close()


def test_torchscript_trace_and_compile_of_a_watched_model() -> None:
    model, opt, mon = _watched()
    x = torch.randn(3, 4)
    scripted = torch.jit.script(model)
    traced = torch.jit.trace(model, x)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        want = model(x)
        for other in (scripted, traced, compiled):
            assert torch.equal(other(x), want)
    buf = io.BytesIO()
    torch.jit.save(scripted, buf)
    assert b"sentinel" not in buf.getvalue()
    mon.close()


def test_close_gives_the_module_its_own_dicts_back_and_keeps_the_scripts_hooks() -> None:
    model = torch.nn.Linear(2, 1)
    before = model._forward_pre_hooks
    calls: list[str] = []
    early = model.register_forward_pre_hook(lambda m, a: calls.append("early"))
    mon = sentinel.watch(model, torch.optim.SGD(model.parameters(), lr=0.1), engine="off")
    early.remove()  # a handle taken before watch() still removes its hook
    model(torch.randn(1, 2))
    assert calls == []
    mon.close()
    assert model._forward_pre_hooks is before and type(before) is OrderedDict and not before
    late = model.register_forward_pre_hook(lambda m, a: calls.append("late"))
    model(torch.randn(1, 2))
    late.remove()
    model(torch.randn(1, 2))
    assert calls == ["late"]
