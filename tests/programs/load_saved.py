"""Loads files a zoo program saved, in a Python where Sentinel cannot be imported, and
prints a digest of each as JSON (one object: path -> digest or error).

Run it as ``python -I load_saved.py PROGRAMS_DIR FILE...``: ``-I`` ignores PYTHONPATH (so
neither the project nor Sentinel's launcher shim is on the path) and the user's site; a
meta-path finder then refuses ``sentinel`` and ``sentinel_hooks`` outright (an editable
install would otherwise still find them), and the programs' folder is put on the path for
the model classes a whole-model file names (``models.GPT``).

A digest is what two equal files share: every tensor's dtype, shape and bytes (sha256),
every dict's keys, every module's class, state dict and hooks, and whether the file loads
with ``weights_only=True`` too.
"""

import hashlib
import importlib.abc
import json
import pickle
import sys
import zipfile


class _NoSentinel(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname.split(".")[0] in ("sentinel", "sentinel_hooks"):
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked by the zoo's loader)")
        return None


sys.meta_path.insert(0, _NoSentinel())
sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402

_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
          "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
          "_load_state_dict_post_hooks", "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs")


def digest(obj, depth=0):  # type: ignore[no-untyped-def]
    if depth > 20:
        return "<deep>"
    if isinstance(obj, torch.jit.ScriptModule):
        return {"script": getattr(obj, "original_name", type(obj).__name__), "code": obj.code,
                "state": digest(obj.state_dict(), depth + 1)}
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        data = t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return {"tensor": str(t.dtype), "shape": list(t.shape), "sha": hashlib.sha256(data).hexdigest()[:16],
                "grad": obj.grad is not None, "requires_grad": obj.requires_grad,
                "class": type(obj).__name__, "hooks": len(getattr(obj, "_backward_hooks", None) or {}),
                "post_accumulate_hooks": len(getattr(obj, "_post_accumulate_grad_hooks", None) or {})}
    if isinstance(obj, torch.nn.Module):
        return {"module": f"{type(obj).__module__}.{type(obj).__qualname__}",
                "attributes": sorted(vars(obj)),
                "hooks": {h: len(getattr(obj, h, {}) or {}) for h in _HOOKS},
                "state": digest(obj.state_dict(), depth + 1),
                "children": {n: digest(m, depth + 1) for n, m in obj.named_children()}}
    if isinstance(obj, dict):
        return {"dict": type(obj).__name__, "items": {str(k): digest(v, depth + 1) for k, v in obj.items()}}
    if isinstance(obj, (list, tuple)):
        return {type(obj).__name__: [digest(v, depth + 1) for v in obj]}
    if isinstance(obj, (int, float, str, bool, type(None))):
        return repr(obj)
    return {"object": f"{type(obj).__module__}.{type(obj).__qualname__}"}


def load(path):  # type: ignore[no-untyped-def]
    """The file as its program loads it: pickle for ``.pkl``, text for ``.log`` and
    ``.txt`` (a log file, its lines), TorchScript archives with ``torch.jit.load``,
    anything else with ``torch.load``."""
    if path.endswith((".log", ".txt")):
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    if path.endswith(".pkl"):
        with open(path, "rb") as f:
            return pickle.load(f)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            if any("/code/" in n or n.startswith("code/") for n in z.namelist()):
                return torch.jit.load(path, map_location="cpu")
    return torch.load(path, map_location="cpu", weights_only=False)


out = {}
for path in sys.argv[2:]:
    entry = {}
    try:
        entry["digest"] = digest(load(path))
    except BaseException as exc:  # noqa: BLE001 -- the error is the finding
        entry["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    try:
        torch.load(path, map_location="cpu", weights_only=True)
        entry["weights_only"] = True
    except Exception:  # a whole model, a pickle, a TorchScript archive
        entry["weights_only"] = False
    out[path] = entry
print(json.dumps(out))
