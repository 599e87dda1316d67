"""What one frame contributes to the history: pure functions from a decoded frame to the
values of a ``samples`` row and the run's metadata."""

from __future__ import annotations

import math
from array import array
from typing import Any

from sentinel.rules.alert import Transition
from sentinel.wire import optimizer_records

COLUMNS = ("loss", "grad_norm", "clip_norm", "param_norm", "update_ratio", "delta_norm", "lr",
           "mem_used", "mem_peak", "loss_scale", "step_seconds")
"""The scalar columns of ``samples``, in order."""

MAX_TAGS, MAX_TAG_KEY, MAX_TAG_VALUE = 16, 32, 64


def _num(v: Any) -> float | None:
    if type(v) is float:  # what a decoded frame holds: the common case first
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _sqrt_sum(xs: list[Any]) -> float | None:
    # frames reach the history admitted (engine/validate.py: numbers, or None where not
    # sampled), so the C-level sum is the common path
    try:
        total = math.fsum(xs)
    except TypeError:
        vals = [x for x in xs if isinstance(x, (int, float))]
        if not vals:
            return None
        total = math.fsum(vals)
    return math.sqrt(total) if total >= 0 else float("nan")


def _roots(xs: Any, n: int) -> list[float] | None:
    """Square roots of per-group sums (NaN where one is negative or not a number); None unless one per group."""
    if not isinstance(xs, list) or len(xs) != n:
        return None
    try:
        return list(map(math.sqrt, xs))
    except (TypeError, ValueError):
        nan = float("nan")
        return [math.sqrt(x) if isinstance(x, (int, float)) and x >= 0 else nan for x in xs]


_NAN32 = array("f", [float("nan")]).tobytes()


def _float32(xs: list[float] | None, n: int) -> bytes:
    """``xs`` as float32 bytes; ``n`` NaNs for None (a part the frame did not send)."""
    return _NAN32 * n if xs is None else array("f", xs).tobytes()


def sample(frame: dict[str, Any]) -> dict[str, float | None]:
    """The ``samples`` columns a frame sets (absent ones are left out, not None).

    Norms are taken from the frame's sums of squares: rank 0's, which are the model's for
    a replicated (DDP) run; for a sharded run the recorder passes the engine's assembled
    sums instead (see :func:`local_only`). The grad norm is the one the optimizer stepped
    with (after any clipping); ``clip_norm`` is the norm before clipping.
    """
    out: dict[str, float | None] = {}
    scalars = frame.get("scalars")
    loss = _num(scalars.get("loss")) if isinstance(scalars, dict) else None
    if loss is not None:
        out["loss"] = loss
    if frame["kind"] != "step":
        return out
    gsq, psq, dsq = frame.get("grad_sumsq"), frame.get("param_sumsq"), frame.get("delta_sumsq")
    if isinstance(gsq, list):
        out["grad_norm"] = _sqrt_sum(gsq)
    clip = _num(frame.get("clip_norm"))
    if clip is not None:
        out["clip_norm"] = clip
    if isinstance(psq, list):
        out["param_norm"] = _sqrt_sum(psq)
        if isinstance(dsq, list) and len(dsq) == len(psq):
            every = None not in dsq
            pairs = list(zip(dsq, psq)) if every else [(d, p) for d, p in zip(dsq, psq) if d is not None]
            if pairs:
                dn = _sqrt_sum(dsq) if every else _sqrt_sum([d for d, _ in pairs])
                pn = out["param_norm"] if every else _sqrt_sum([p for _, p in pairs])
                if dn is not None and pn:
                    out["update_ratio"] = dn / pn
                if every:  # every group sampled: the whole update's norm
                    out["delta_norm"] = dn
    lrs = frame.get("lr")
    lr = _num(lrs[0]) if isinstance(lrs, list) and lrs else None
    if lr is not None:
        out["lr"] = lr
    mem = frame.get("mem")
    if isinstance(mem, dict):
        cuda = _num(mem.get("cuda_allocated"))
        used = cuda if cuda is not None else _num(mem.get("host_rss"))
        if used is not None:
            out["mem_used"] = used
        peak = _num(mem.get("cuda_peak")) if cuda is not None else _num(mem.get("host_rss"))
        if peak is not None:
            out["mem_peak"] = peak
    amp = frame.get("amp")
    scale = _num(amp.get("scale")) if isinstance(amp, dict) else None
    if scale is not None:
        out["loss_scale"] = scale
    seconds = _num(frame.get("step_seconds"))
    if seconds is not None:
        out["step_seconds"] = seconds
    return out


SHARD_SUMS = ("grad_sumsq", "param_sumsq", "delta_sumsq", "grad_l1", "grad_count")
"""The fields of a sharded rank's frame that cover its own shards only."""


def local_only(frame: dict[str, Any]) -> dict[str, Any]:
    """A sharded rank's frame without its shard sums: the rest (loss, lr, memory, …) is the
    rank's own and recorded as sent; the model's norms come from the engine's assembly."""
    return {k: v for k, v in frame.items() if k not in SHARD_SUMS}


def group_blob(frame: dict[str, Any]) -> bytes | None:
    """Per-group grad norms, parameter norms and update ratios as float32 (NaN: not sent);
    None when the frame carries no per-group sums."""
    groups = frame.get("groups")
    if frame["kind"] != "step" or not isinstance(groups, list) or not groups:
        return None
    if "grad_sumsq" not in frame and "param_sumsq" not in frame:
        return None
    n = len(groups)
    g, p = _roots(frame.get("grad_sumsq"), n), _roots(frame.get("param_sumsq"), n)
    d = _roots(frame.get("delta_sumsq"), n)
    ratio = None
    if d is not None and p is not None:
        nan = float("nan")
        ratio = [dd / pp if pp else nan for dd, pp in zip(d, p)]
    return _float32(g, n) + _float32(p, n) + _float32(ratio, n)


def unpack_groups(blob: bytes | None, n: int) -> tuple[list[float], list[float], list[float]] | None:
    """The inverse of :func:`group_blob`: (grad norms, parameter norms, update ratios)."""
    if not blob or n <= 0:
        return None
    a = array("f")
    a.frombytes(blob)
    if len(a) != 3 * n:
        return None
    vals = a.tolist()
    return vals[:n], vals[n:2 * n], vals[2 * n:]


def tags_of(value: Any) -> dict[str, str] | None:
    """A frame's ``tags``, bounded (count, key and value length); None when it has none."""
    if not isinstance(value, dict) or not value:
        return None
    out: dict[str, str] = {}
    for k, v in list(value.items())[:MAX_TAGS]:
        if isinstance(k, str) and isinstance(v, (str, int, float)) and not isinstance(v, bool):
            out[k[:MAX_TAG_KEY]] = str(v)[:MAX_TAG_VALUE]
    return out or None


def optimizer_of(value: Any) -> list[dict[str, Any]] | None:
    """A frame's ``optim`` field (:class:`sentinel.wire.OptimizerRecord` each, read through
    the type) as the history keeps it: ``[{"class": str, "dtype": str, setting: number,
    ...}]``, or None when it is no such list or an empty one."""
    records = optimizer_records(value)
    if not records:
        return None
    return [{"class": o.cls, "dtype": o.dtype, **o.hp.given()} for o in records]


def optimizer_label(optimizer: list[dict[str, Any]] | None, tags: dict[str, str] | None) -> str:
    """How tables name a run's optimizer: the frame's class, else the ``optimizer`` tag."""
    if optimizer:
        return "+".join(str(o["class"]) for o in optimizer)
    return (tags or {}).get("optimizer", "")


def transition_row(t: Transition) -> tuple[Any, ...]:
    """The ``alerts`` columns (after ``run_id``) of a transition."""
    import json

    def num(x: float) -> float | None:
        return x if math.isfinite(x) else None

    return (t.alertname, t.severity, t.state_from, t.state_to, t.step, t.time, num(t.value), num(t.threshold),
            t.summary, json.dumps(list(t.causes)), json.dumps(list(t.checks)), json.dumps(list(t.ranks)),
            json.dumps(list(t.groups)))
