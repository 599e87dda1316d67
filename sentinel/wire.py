"""The wire format between a training process and the engine.

A frame is one msgpack map. Version 1 has these keys (``?`` marks optional ones):

=================  ==========================================================
``v``              schema version, :data:`SCHEMA_VERSION`
``kind``           ``"step"`` (one optimizer step's report) or ``"log"``
                   (scalars passed to ``Monitor.log``) or ``"bye"``
``job``/``run``    identity strings
``rank``/``world`` int rank and world size
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
``status``?        on ``"bye"`` only: the exit status a launcher saw (``sentinel run``
                   attached to a node's daemon), ``128 + N`` for signal ``N``; ``exc``
                   then says who ended and why, in words
=================  ==========================================================

Sums of squares rather than norms travel so that sharded ranks can be added up where
the data meets. The format never carries pickled objects.
"""

from __future__ import annotations

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


_last_groups: list[list[str]] = [[]]  # the groups of the last valid frame with groups


def decode(data: bytes) -> dict[str, Any]:
    """Decode and validate one frame.

    Raises:
        FrameError: the bytes are not a valid frame of this schema version.
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
    groups = frame.get("groups")
    if groups is not None:
        # a rank sends the same groups every step: compare with the last valid list (one
        # C-level comparison) before checking each element
        if not isinstance(groups, list) or (groups != _last_groups[0]
                                            and not all(isinstance(g, str) for g in groups)):
            raise FrameError("field 'groups' must be a list of strings")
        _last_groups[0] = groups
        for key in ("grad_sumsq", "param_sumsq", "delta_sumsq"):
            vals = frame.get(key)
            if vals is not None and (not isinstance(vals, list) or len(vals) != len(groups)):
                raise FrameError(f"field {key!r} does not match 'groups'")
    return frame
