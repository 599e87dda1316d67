"""Frames are checked before anything of them is written.

The types, ranges and lengths of every field are declared once, in :class:`sentinel.wire.Frame`.
A frame that decodes strictly into it (:func:`sentinel.wire.decode_strict`, in C) and passes
:func:`fits` (what ties fields together, and the caps of :class:`Limits`) is whole: nothing
of it is dropped (the fast path, every frame a real instrument sends). Any other frame is
decoded into a map and :func:`check_frame` holds it against the schema field by field
(types, ranges, list lengths), so that a bad field goes alone. :class:`Admission` then holds
either against the engine's own caps (groups, ranks, runs, series, scalar names), so a
crafted sender cannot cost the engine more than a well-behaved instrument would.

- A frame whose identity cannot be read (``kind``, ``job``, ``run``, ``rank``, ``world``,
  ``step``, ``t``), or that would take the engine past its runs, ranks or series caps,
  is refused whole (:class:`Refused`, counted in
  ``sentinel_daemon_frames_refused_total{reason}``) and changes nothing.
- Any other field that is malformed, out of range or past a cap is dropped before the
  frame is ingested, counted in ``sentinel_daemon_frame_fields_dropped_total{field,reason}``;
  the frame's good fields are kept. Fields that only mean something together go
  together (the group names and every per-group list).

The caps do not trust the instrument's own (``max_groups``): the engine enforces them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import UNSET

from sentinel.engine.guard import valid as guard_note_valid
from sentinel.wire import (
    ACCEPTED_VERSIONS,
    MAX_GROUP_NAME_LENGTH,
    MAX_GROUPS,
    MAX_LABEL_LENGTH,
    MAX_PARAM_GROUPS,
    MAX_STATE_KEYS,
    MAX_STEP,
    MAX_WORLD,
    RESERVED_TAGS,
    SCALAR_NAME,
    Frame,
    OptimizerRecords,
)

_NUM = (int, float)
_NUM_SET = frozenset(_NUM)
_NUM_OR_NONE_SET = frozenset((int, float, type(None)))
_ZERO = 0.0
_SCALAR_NAME = re.compile(SCALAR_NAME)
_KINDS = frozenset({"step", "log", "bye"})
_SHARDS = frozenset({"replicated", "sharded"})
BASE_SERIES = 60
"""Series a rank can have besides its groups, scalars, learning rates and state keys
(every per-rank metric in the catalog, with room to spare)."""
SERIES_PER_GROUP = 5
"""Series one group name can have: grad, local grad, param and update norms, and ratio."""


@dataclass(frozen=True)
class Limits:
    """The engine's caps; ``limits:`` in the config file.

    Attributes:
        max_frame_bytes: a larger datagram is refused before it is decoded.
        max_groups: group names per frame, and distinct group names per rank.
        max_group_name_length: characters of a group name.
        max_label_length: characters of ``job`` and ``run``.
        max_ranks: ranks of a run one engine tracks (a node's daemon hears its node's; the job's
            ``world`` may be far larger, up to 2^20 ranks).
        max_runs: runs tracked at once; frames of a further run are refused until one is forgotten.
        max_series: estimated series in the store, over every run (see :data:`BASE_SERIES`).
        max_scalars: scalars per frame (``Monitor.log``).
        max_scalar_names: distinct scalar names per rank.
        max_scalar_name_length: characters of a scalar name (letters, digits, ``_.:/@+-``).
        max_param_groups: learning rates per frame (optimizer param groups).
        max_state_keys: optimizer state keys per frame.
    """

    max_frame_bytes: int = 60_000
    max_groups: int = MAX_GROUPS
    max_group_name_length: int = MAX_GROUP_NAME_LENGTH
    max_label_length: int = MAX_LABEL_LENGTH
    max_ranks: int = 4096
    max_runs: int = 100
    max_series: int = 50_000
    max_scalars: int = 32
    max_scalar_names: int = 64
    max_scalar_name_length: int = 64
    max_param_groups: int = MAX_PARAM_GROUPS
    max_state_keys: int = MAX_STATE_KEYS


PER_GROUP = ("grad_sumsq", "param_sumsq", "delta_sumsq", "delta_l1", "param_l1", "trust_ratio")
"""The fields aligned to ``groups``."""


class Dropped(list):  # type: ignore[type-arg]
    """The fields :func:`check_frame` and :meth:`Admission.admit` took out of a frame:
    ``(field, reason, detail)`` each."""

    def drop(self, f: dict[str, Any], keys: tuple[str, ...], reason: str, detail: str) -> None:
        present = [k for k in keys if k in f]
        for k in present:
            del f[k]
        if present:
            self.append((keys[0], reason, detail))


class Refused(ValueError):
    """A frame refused whole.

    Attributes:
        reason: the ``reason`` label it is counted under (``schema``, ``range``,
            ``groups``, ``ranks``, ``runs``, ``series``, ``scalars``).
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _num(v: Any) -> bool:
    return type(v) in _NUM  # bool is not a number here


def _nonneg(v: Any) -> bool:
    """A non-negative number, or NaN/+inf (a measurement that went non-finite)."""
    return type(v) in _NUM and not v < 0


def _finite_nonneg(v: Any) -> bool:
    return type(v) in _NUM and math.isfinite(v) and v >= 0


def _count(v: Any) -> bool:
    return type(v) is int and 0 <= v <= MAX_STEP


def _sums(key: str, vals: Any, n: int, allow_none: bool) -> None:
    """A list of ``n`` sums of squares: numbers >= 0, NaN or +inf (None too where allowed)."""
    if type(vals) is not list or len(vals) != n:
        raise Refused("schema", f"field {key!r} must be a list as long as 'groups'")
    kinds = set(map(type, vals))
    if not kinds <= (_NUM_OR_NONE_SET if allow_none else _NUM_SET):
        raise Refused("schema", f"field {key!r} must hold numbers")
    if type(None) in kinds:
        vals = [v for v in vals if v is not None]
    # min() is exact unless a NaN comes first (NaN then sticks): only then look at each
    if vals and not min(vals) >= 0 and any(map(_ZERO.__gt__, vals)):  # 0 > NaN is False
        raise Refused("range", f"field {key!r} holds a negative sum of squares")


def _str_map(key: str, value: Any, cap: int, key_len: int, ok: Callable[[Any], bool]) -> None:
    if type(value) is not dict:
        raise Refused("schema", f"field {key!r} must be a map")
    if len(value) > cap:
        raise Refused("range", f"field {key!r} has {len(value)} entries, more than {cap}")
    for k, v in value.items():
        if type(k) is not str or not 0 < len(k) <= key_len:
            raise Refused("schema", f"field {key!r} has a key that is not a short string")
        if not ok(v):
            raise Refused("range", f"field {key!r}.{k[:40]} is out of range")


_DECLARED = Limits()
"""The caps :class:`sentinel.wire.Frame` declares (a decoded frame is within them)."""


def fits(f: Frame, limits: Limits) -> bool:
    """Whether a frame that decoded strictly into :class:`~sentinel.wire.Frame` is whole: its
    identity in range, its per-group lists as long as its groups, and within ``limits``. True means :func:`check_frame` would drop nothing of it; False sends
    it there."""
    if f.v not in ACCEPTED_VERSIONS:
        return False
    if limits.max_label_length < _DECLARED.max_label_length and (
            len(f.job) > limits.max_label_length or len(f.run) > limits.max_label_length):
        return False
    world = f.world
    if f.rank >= (MAX_WORLD if world is None or world is UNSET else world):
        return False
    groups = f.groups
    if groups is UNSET:
        if (f.grad_sumsq is not UNSET or f.param_sumsq is not UNSET or f.delta_sumsq is not UNSET
                or f.delta_l1 is not UNSET or f.param_l1 is not UNSET or f.trust_ratio is not UNSET):
            return False
    else:
        n = len(groups)
        if n > limits.max_groups or (limits.max_group_name_length < _DECLARED.max_group_name_length and groups
                                     and max(map(len, groups)) > limits.max_group_name_length):
            return False
        for per in (f.grad_sumsq, f.param_sumsq, f.delta_sumsq, f.delta_l1, f.param_l1, f.trust_ratio):
            if per is not UNSET and len(per) != n:
                return False
    if f.sat is not UNSET and f.sat[0] > f.sat[1]:
        return False
    if f.lr is not UNSET and len(f.lr) > limits.max_param_groups:
        return False
    if f.state_bytes is not UNSET and len(f.state_bytes) > limits.max_state_keys:
        return False
    scalars = f.scalars
    if scalars is not UNSET and (len(scalars) > limits.max_scalars or (
            limits.max_scalar_name_length < _DECLARED.max_scalar_name_length
            and any(len(k) > limits.max_scalar_name_length for k in scalars))):
        return False
    return True


def check_frame(f: dict[str, Any], limits: Limits) -> Dropped:
    """Hold a decoded frame (as :func:`sentinel.wire.decode` returns it) against the schema,
    taking out every optional field that fails (see the module doc).

    Returns:
        What was dropped.

    Raises:
        Refused: the frame's identity is unreadable (the first problem found).
    """
    if f["kind"] not in _KINDS:  # wire.decode checked the required fields' types
        raise Refused("schema", "unknown kind")
    for key in ("job", "run"):
        if not 0 < len(f[key]) <= limits.max_label_length:
            raise Refused("range", f"field {key!r} is empty or longer than {limits.max_label_length}")
    step, rank, t = f["step"], f["rank"], f["t"]
    if not 0 <= step <= MAX_STEP:
        raise Refused("range", "field 'step' is out of range")
    if not math.isfinite(t) or t < 0:
        raise Refused("range", "field 't' is not a finite time")
    world = f.get("world")
    if world is not None and (type(world) is not int or not 0 < world <= MAX_WORLD):
        raise Refused("range", f"field 'world' is not in 1..{MAX_WORLD}")
    if not 0 <= rank < (world if world is not None else MAX_WORLD):
        raise Refused("range", "field 'rank' is not in 0..world-1")
    opt = f.get("opt")
    if opt is not None and not (type(opt) is str and 0 < len(opt) <= 2 and opt.isdigit() and opt.isascii()):
        raise Refused("schema", "field 'opt' is not a stream number of up to 2 digits")
    dropped = Dropped()
    _groups(f, limits, dropped)
    for key, value in list(f.items()):
        test = _FIELDS.get(key)
        if test is not None and not test(value, limits):
            dropped.drop(f, (key,), "range" if _schema_ok(key, value) else "schema", f"field {key!r} is invalid")
    if "scalars" in f:
        _scalars(f, limits, dropped)
    return dropped


_last_groups: list[Any] = [None]  # the groups of the last good frame: a rank sends the same ones


def _groups(f: dict[str, Any], limits: Limits, dropped: Dropped) -> None:
    groups = f.get("groups")
    if groups is None:
        if any(k in f for k in PER_GROUP):
            dropped.drop(f, PER_GROUP, "schema", "per-group sums without 'groups'")
        return
    # one C-level comparison with the last good list before looking at each name
    if type(groups) is not list or (groups != _last_groups[0] and not all(type(g) is str for g in groups)):
        dropped.drop(f, ("groups", *PER_GROUP), "schema", "field 'groups' must be a list of strings")
        return
    if len(groups) > limits.max_groups:
        dropped.drop(f, ("groups", *PER_GROUP), "groups", f"{len(groups)} groups, more than {limits.max_groups}")
        return
    if groups and max(map(len, groups)) > limits.max_group_name_length:
        dropped.drop(f, ("groups", *PER_GROUP), "range", "a group name is too long")
        return
    _last_groups[0] = groups
    n = len(groups)
    for key in ("grad_sumsq", "param_sumsq", "delta_sumsq"):
        if key in f:
            try:
                _sums(key, f[key], n, key == "delta_sumsq")
            except Refused as exc:
                dropped.drop(f, (key,), exc.reason, str(exc))
    for key in ("delta_l1", "param_l1", "trust_ratio"):  # lists of numbers or None, one per group
        v = f.get(key)
        if v is not None and (type(v) is not list or len(v) != n
                              or not set(map(type, v)) <= _NUM_OR_NONE_SET):
            dropped.drop(f, (key,), "schema", f"field {key!r} must be a list as long as 'groups'")


def _scalars(f: dict[str, Any], limits: Limits, dropped: Dropped) -> None:
    """A bad map, or one with too many entries, is dropped; a bad entry alone goes alone."""
    scalars = f["scalars"]
    if type(scalars) is not dict:
        dropped.drop(f, ("scalars",), "schema", "field 'scalars' must be a map")
        return
    if len(scalars) > limits.max_scalars:
        dropped.drop(f, ("scalars",), "scalars", f"{len(scalars)} scalars, more than {limits.max_scalars}")
        return
    for name, value in list(scalars.items()):
        if (type(name) is not str or len(name) > limits.max_scalar_name_length
                or not _SCALAR_NAME.fullmatch(name)):
            del scalars[name]
            dropped.append(("scalars", "scalars", "a scalar name is too long or has characters outside "
                            "[A-Za-z0-9_.:/@+-]"))
        elif not _num(value):
            del scalars[name]
            dropped.append(("scalars", "schema", f"scalar {name[:40]!r} is not a number"))


def _schema_ok(key: str, value: Any) -> bool:
    """Whether a field that failed its test at least had the right shape (a range problem)."""
    shape = {"lr": list, "sat": list, "mem": dict, "state_bytes": dict, "amp": dict, "shard": str,
             "exc": str, "thread": str, "reply": str, "where": str, "ddp": bool, "status": int, "short_batch": list, "rewrite": str,
             "tags": dict, "cmd": str}.get(key)
    if shape is not None:
        return type(value) is shape
    return _num(value)


def _amp(v: Any, limits: Limits) -> bool:
    return (type(v) is dict and set(v) <= {"scale", "skipped"} and _nonneg(v.get("scale", 0))
            and _count(v.get("skipped", 0)))


def _optim(v: Any, _: Limits) -> bool:
    """The optimizer record, held to its type in :mod:`sentinel.wire` (the fast path's)."""
    try:
        msgspec.convert(v, OptimizerRecords)
    except msgspec.ValidationError:
        return False
    return True


def _map(cap_of: Callable[[Limits], int]) -> Callable[[Any, Limits], bool]:
    def test(v: Any, limits: Limits) -> bool:
        try:
            _str_map("map", v, cap_of(limits), 64, _finite_nonneg)
        except Refused:
            return False
        return True
    return test


_TAG_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")


def _tags(v: Any, _: Limits) -> bool:
    """At most 16 tags, keys label-safe (and not the series' own labels), values <= 64 chars."""
    return (type(v) is dict and len(v) <= 16
            and all(type(k) is str and _TAG_KEY.fullmatch(k) is not None and k not in RESERVED_TAGS
                    and type(x) is str and len(x) <= 64 for k, x in v.items()))


_FIELDS: dict[str, Callable[[Any, Limits], bool]] = {
    "tags": _tags,
    "cmd": lambda v, _: type(v) is str and len(v) <= 1000,
    "shard": lambda v, _: type(v) is str and v in _SHARDS,
    "ddp": lambda v, _: type(v) is bool,
    "clip_norm": lambda v, _: _nonneg(v),
    "clip_max": lambda v, _: _nonneg(v) and v == v,  # inf: the norm taken, nothing clipped
    "grad_l1": lambda v, _: _nonneg(v),
    "grad_count": lambda v, _: _finite_nonneg(v),
    "sat": lambda v, _: (type(v) is list and len(v) == 2 and _finite_nonneg(v[0]) and _finite_nonneg(v[1])
                         and v[0] <= v[1]),
    "lr": lambda v, lim: (type(v) is list and len(v) <= lim.max_param_groups
                          and all(_num(x) and math.isfinite(x) for x in v)),
    "step_seconds": lambda v, _: _finite_nonneg(v),
    "busy_seconds": lambda v, _: _finite_nonneg(v),
    "param_bytes": lambda v, _: _finite_nonneg(v),
    "state_bytes": _map(lambda lim: lim.max_state_keys),
    "mem": _map(lambda lim: 32),
    "amp": _amp,
    "optim": _optim,
    "errors": lambda v, _: _count(v),
    "dropped": lambda v, _: _count(v),
    "beat": lambda v, _: _count(v),
    "skipped_nonfinite": lambda v, _: _count(v),
    "no_gradient": lambda v, _: _count(v),
    "not_reset": lambda v, _: _count(v),
    "short_batch": lambda v, _: type(v) is list and len(v) == 2 and _count(v[0]) and _count(v[1]),  # as wire.Frame's
    "rewrite": lambda v, _: v in ("load_state_dict", "prune"),
    "exc": lambda v, _: type(v) is str and len(v) <= 200,
    "status": lambda v, _: type(v) is int and -1 <= v <= 255,
    "thread": lambda v, _: type(v) is str and len(v) <= 64,
    "reply": lambda v, _: type(v) is str and len(v) <= 200,
    "where": lambda v, _: type(v) is str and len(v) <= 200,
    "guard": guard_note_valid,  # the step guard's note (sentinel/engine/guard.py)
}


class _Rank:
    __slots__ = ("groups", "last_groups", "scalars", "lr", "state", "cost")

    def __init__(self) -> None:
        self.groups: set[str] = set()
        self.last_groups: list[str] | None = None
        self.scalars: set[str] = set()
        self.lr = 0
        self.state: set[str] = set()
        self.cost = BASE_SERIES


def _adds_nothing(r: _Rank, f: dict[str, Any]) -> bool:
    """Whether a frame of a known rank names only what the rank has named before (the
    usual case): its footprint stays, and :meth:`Admission.admit` has nothing to check."""
    groups, scalars, st, lr = f.get("groups"), f.get("scalars"), f.get("state_bytes"), f.get("lr")
    return ((groups is None or groups == r.last_groups) and (not scalars or r.scalars.issuperset(scalars))
            and (not st or r.state.issuperset(st)) and (not lr or len(lr) <= r.lr))


class Admission:
    """The engine's caps over what it keeps: runs, ranks per run, distinct group and scalar
    names per rank, and an estimate of the series in the store (bounded work per frame).

    Args:
        limits: the caps.
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._runs: dict[tuple[str, str], dict[int | tuple[int, str], _Rank]] = {}
        self.series = 0
        """The estimated series of every admitted rank."""

    def admit(self, f: dict[str, Any], dropped: Dropped | None = None) -> None:
        """Record a checked frame's footprint, or refuse it (recording nothing). Group
        names, scalar names or state keys past their caps are dropped (into ``dropped``).

        Raises:
            Refused: the frame would take the engine past its runs, ranks or series caps.
        """
        lim, key = self.limits, (f["job"], f["run"])
        rank: int | tuple[int, str] = (f["rank"], f["opt"]) if "opt" in f else f["rank"]  # a rank's stream
        ranks = self._runs.get(key)
        r = None if ranks is None else ranks.get(rank)
        if r is not None and _adds_nothing(r, f):
            if f.get("groups") is not None:  # the names admitted last, the same string objects: the
                f["groups"] = r.last_groups  # ingest and the history compare the list to theirs at once
            return
        dropped = Dropped() if dropped is None else dropped
        if ranks is None:
            if len(self._runs) >= lim.max_runs:
                raise Refused("runs", f"{len(self._runs)} runs tracked already (limits.max_runs)")
            ranks = {}
        if r is None:
            if len(ranks) >= lim.max_ranks:
                raise Refused("ranks", f"{len(ranks)} ranks in the run already (limits.max_ranks)")
            r = _Rank()
        groups = f.get("groups")
        new_groups: set[str] = set()
        if groups is not None and groups != r.last_groups:
            new_groups = set(groups) - r.groups
            if len(r.groups) + len(new_groups) > lim.max_groups:
                dropped.drop(f, ("groups", *PER_GROUP), "groups", f"more than {lim.max_groups} distinct groups "
                             "for one rank")
                groups, new_groups = None, set()
        scalars = f.get("scalars")
        new_scalars: set[str] = set()
        if scalars:
            new_scalars = set(scalars) - r.scalars
            if len(r.scalars) + len(new_scalars) > lim.max_scalar_names:
                for name in new_scalars:  # the names it knows go on
                    del scalars[name]
                dropped.append(("scalars", "scalars", f"more than {lim.max_scalar_names} distinct scalar names "
                                "for one rank"))
                new_scalars = set()
        st = f.get("state_bytes")
        new_state = set(st) - r.state if st else set()
        if len(r.state) + len(new_state) > lim.max_state_keys:
            dropped.drop(f, ("state_bytes",), "series", f"more than {lim.max_state_keys} optimizer state keys "
                         "for one rank")
            new_state = set()
        lr = max(r.lr, len(f.get("lr") or ()))
        cost = (BASE_SERIES + SERIES_PER_GROUP * (len(r.groups) + len(new_groups))
                + len(r.scalars) + len(new_scalars) + lr + len(r.state) + len(new_state))
        fresh = rank not in ranks
        grow = cost - (0 if fresh else r.cost)
        if grow > 0 and self.series + grow > lim.max_series:
            raise Refused("series", f"the store would pass {lim.max_series} series (limits.max_series)")
        # admitted: record its footprint
        if groups is not None:
            r.groups |= new_groups
            r.last_groups = groups
        r.scalars |= new_scalars
        r.state |= new_state
        r.lr, r.cost = lr, cost
        self.series += grow
        ranks[rank] = r
        self._runs[key] = ranks

    def forget(self, job: str, run: str) -> None:
        """A run whose series the store dropped no longer counts."""
        ranks = self._runs.pop((job, run), None)
        if ranks:
            self.series -= sum(r.cost for r in ranks.values())

    def forget_rank(self, job: str, run: str, rank: int) -> None:
        """A rank whose training begins again (its series go): its streams' group and
        scalar names, state keys and series count anew."""
        ranks = self._runs.get((job, run))
        if ranks:
            for key in [k for k in ranks if (k[0] if isinstance(k, tuple) else k) == rank]:
                self.series -= ranks.pop(key).cost

    @property
    def runs(self) -> int:
        return len(self._runs)
