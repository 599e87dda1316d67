"""The wire format between a training process and the engine.

A frame is one msgpack map. Version 1 has these keys (``?`` marks optional ones):

=================  ==========================================================
``v``              schema version, :data:`SCHEMA_VERSION`
``kind``           ``"step"`` (one optimizer step's report) or ``"log"``
                   (scalars passed to ``Monitor.log``) or ``"bye"``
``job``/``run``    identity strings
``rank``/``world`` int rank and world size
``opt``?           the optimizer stream in a process that steps several optimizers
                   (a GAN's two): ``"0"``, ``"1"``, ... in the order their monitors
                   were made; absent for a process's only optimizer. Each stream has
                   its own steps, series (label ``optimizer``) and goodbye
``step``           completed optimizer steps when the values were taken
``t``              wall-clock seconds (``time.time()``) when taken
``groups``?        list of group names; the ``*_sumsq`` lists are aligned to it
``grad_sumsq``?    per-group sum of squares of gradients
``param_sumsq``?   per-group sum of squares of parameters
``delta_sumsq``?   per-group sum of squares of the last update (None = not sampled)
``delta_l1``?      per-group sum of ``|Δw|`` of the last update (None = not sampled)
``param_l1``?      per-group sum of ``|w|`` before it, same groups (the seed's UAR)
``shard``?         ``"replicated"`` or ``"sharded"``: how ranks' sums combine
                   (sharded: each rank's sums cover its own shards, and the
                   engine adds up the ``world`` ranks' sums for a step)
``clip_norm``?     total grad norm ``clip_grad_norm_`` computed, before clipping
``clip_max``?      the ``max_norm`` it clipped to
``grad_l1``?       sum of ``|g|`` over all gradient elements (for the SNR)
``grad_count``?    number of gradient elements
``sat``?           ``[above, total]`` sampled ``exp_avg_sq`` counts (Adam-like optimizers)
``opt_health``?    ``{figure: [numerator, total]}`` sampled per-optimizer figures
                   (``instrument/optstate.py``)
``trust_ratio``?   per-group mean LAMB trust ratio (None where no LAMB parameter)
``lr``?            learning rate per optimizer param group (list)
``lr_peak``?       per param group, the lr a torch scheduler scales from
                   (``max_lr``/``initial_lr``; NaN for a group without one)
``step_seconds``?  wall time since the previous step
``state_bytes``?   ``{state_key: bytes}`` of optimizer state
``param_bytes``?   bytes of parameters
``mem``?           ``{name: value}`` memory figures (see the exporter)
``optim``?         per optimizer ``{"class", "dtype", "hp": {name: float}}``
                   (``instrument/optinfo.py``); with ``state_bytes``
``total_steps``?   the run's planned optimizer steps, when the user gave them
``env``?           ``{name: str}`` versions, GPU model and numerics flags
                   (``instrument/environment.py``); at the first step and with
                   ``state_bytes``
``amp``?           ``{"scale": float, "skipped": int}``
``scalars``?       ``{name: float}`` from ``Monitor.log``
``errors``?        instrument errors so far (monotonic)
``scalars_dropped``? values ``Monitor.log`` dropped so far (monotonic)
``dropped``?       frames dropped by the sender so far (monotonic)
``guard``?         on a ``log`` frame at the step it judged: the step guard's
                   :class:`GuardNote` (a skip, the end of a run of skips, the
                   ``max_consecutive`` outcome, or the first judged step), sent
                   before that step's report
``status``?        on ``"bye"`` only: the exit status a launcher saw (``sentinel run``
                   attached to a node's daemon), ``128 + N`` for signal ``N``; ``exc``
                   then says who ended and why, in words
=================  ==========================================================

Sums of squares rather than norms travel so that sharded ranks can be added up where
the data meets. The format never carries pickled objects.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import msgpack

SCHEMA_VERSION = 1
MAX_FRAME_BYTES = 60_000  # fits a Unix datagram on every Linux default


class FrameError(ValueError):
    """A frame that cannot be accepted: malformed, wrong version, or too large."""


def encode(frame: dict[str, Any]) -> bytes:
    """Encode one frame; adds the schema version.

    Raises:
        FrameError: the encoded frame exceeds :data:`MAX_FRAME_BYTES`.
    """
    frame = {"v": SCHEMA_VERSION, **frame}
    data: bytes = msgpack.packb(frame, use_bin_type=True)
    if len(data) > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    return data


_REQUIRED: dict[str, type | tuple[type, ...]] = {"kind": str, "run": str, "job": str, "rank": int, "step": int, "t": (int, float)}


def decode(data: bytes) -> dict[str, Any]:
    """Decode one frame and check the fields that identify it (``kind``, ``job``, ``run``,
    ``rank``, ``step``, ``t``); the engine checks the rest field by field
    (:mod:`sentinel.engine.validate`).

    Raises:
        FrameError: the bytes are not a frame of this schema version.
    """
    if len(data) > MAX_FRAME_BYTES:
        raise FrameError("oversized frame")
    try:
        frame = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types
        raise FrameError(f"malformed frame: {type(exc).__name__}") from None
    if not isinstance(frame, dict):
        raise FrameError("frame is not a map")
    if frame.get("v") != SCHEMA_VERSION:
        raise FrameError(f"unsupported schema version {frame.get('v')!r}")
    for key, typ in _REQUIRED.items():
        if not isinstance(frame.get(key), typ) or isinstance(frame.get(key), bool):
            raise FrameError(f"field {key!r} missing or of the wrong type")
    return frame


GUARD_REASONS = ("nonfinite", "spike")
GUARD_OUTCOMES = ("", "halt", "through")


@dataclass(frozen=True)
class GuardNote:
    """What the step guard tells the engine about one step it judged (``frame["guard"]``).

    Attributes:
        skipped: the step was not applied.
        reason: ``nonfinite`` or ``spike`` (``""`` for a step applied after skips).
        norm: the global gradient norm (pre-clip where the script clips), NaN if non-finite.
        bound: the spike bound at that step (``factor × median``; NaN during warm-up).
        groups: the groups whose gradients held non-finite values.
        consecutive: skips in a row, this one included (0: this step was applied).
        outcome: ``halt`` or ``through`` when ``max_consecutive`` was reached here.
        batch: the step's batch index, when the script or adapter told it (else None).
        method: how the skip was made (``fused``, ``select``, ``sync``).
    """

    skipped: bool
    reason: str
    norm: float
    bound: float
    groups: tuple[str, ...] = ()
    consecutive: int = 0
    outcome: str = ""
    batch: int | None = None
    method: str = ""

    def to_wire(self) -> dict[str, Any]:
        d = asdict(self)
        d["groups"] = list(self.groups)
        return d

    @classmethod
    def from_wire(cls, d: Any) -> GuardNote:
        """Raises:
            FrameError: not a guard note of this schema."""
        try:
            if not isinstance(d, dict) or set(d) - _GUARD_KEYS:
                raise TypeError
            note = cls(bool(d["skipped"]), str(d["reason"]), float(d["norm"]), float(d["bound"]),
                       tuple(str(g)[:200] for g in d.get("groups", ())[:64]), int(d.get("consecutive", 0)),
                       str(d.get("outcome", "")), None if d.get("batch") is None else int(d["batch"]),
                       str(d.get("method", ""))[:16])
        except (TypeError, ValueError, KeyError):
            raise FrameError("field 'guard' is not a guard note") from None
        if (note.reason not in GUARD_REASONS + ("",) or note.outcome not in GUARD_OUTCOMES
                or not 0 <= note.consecutive <= 2**31):
            raise FrameError("field 'guard' is out of range")
        return note


_GUARD_KEYS = frozenset(f.name for f in fields(GuardNote))
