"""Options of the step guard (``sentinel.watch(..., guard=...)``, ``actions.guard``).

Kept apart from :mod:`sentinel.instrument.guard` so that the options and the config can
name them without importing torch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any

METHODS = ("auto", "fused", "select", "sync")
OUTCOMES = ("halt", "through")


@dataclass
class GuardOptions:
    """What the guard skips, and what it does after too many skips in a row.

    Attributes:
        nonfinite: skip a step whose gradients hold a NaN or an Inf.
        spike: skip a step whose global gradient norm (the pre-clip norm where the script
            clips) is above ``factor`` times the median of the last ``window`` applied
            steps' norms, once ``warmup`` of them are known.
        factor: the spike bound over the running median. 10, as the ``GradientSpike``
            rule's factor: a step the guard skips is one the rule would call a spike by
            its factor (the rule adds a z-score over the MAD; the guard keeps only the
            factor, which a device-side median gives without a sort of deviations).
        window: applied steps in the running median.
        warmup: applied steps known before the spike check starts.
        max_consecutive: after this many skips in a row the guard stops skipping.
        on_exhausted: then ``halt`` (raise ``TrainingHalted`` at the next step, the
            weights untouched by the skipped steps) or ``through`` (let the steps through
            while they stay out of bounds; their norms then move the median).
        method: ``auto`` (fused where torch's fused optimizer takes ``found_inf``, else
            ``select`` on an accelerator within ``snapshot_bytes``, else ``sync``), or one
            of ``fused``, ``select``, ``sync`` (see docs/guard.md).
        snapshot_bytes: the most the ``select`` snapshot may hold per optimizer.
    """

    nonfinite: bool = True
    spike: bool = True
    factor: float = 10.0
    window: int = 50
    warmup: int = 20
    max_consecutive: int = 8
    on_exhausted: str = "halt"
    method: str = "auto"
    snapshot_bytes: int = 2 * 2**30

    def __post_init__(self) -> None:
        if not float(self.factor) > 1.0:
            raise ValueError(f"guard.factor: must be > 1, got {self.factor!r}")
        for name, low in (("window", 3), ("warmup", 1), ("max_consecutive", 1), ("snapshot_bytes", 0)):
            if int(getattr(self, name)) < low:
                raise ValueError(f"guard.{name}: must be >= {low}, got {getattr(self, name)!r}")
        if int(self.warmup) > int(self.window):
            raise ValueError(f"guard.warmup: must be <= guard.window ({self.window}), got {self.warmup!r}")
        if self.on_exhausted not in OUTCOMES:
            raise ValueError(f"guard.on_exhausted: must be halt or through, got {self.on_exhausted!r}")
        if self.method not in METHODS:
            raise ValueError(f"guard.method: must be one of {', '.join(METHODS)}, got {self.method!r}")

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def parse_guard(value: Any) -> GuardOptions | None:
    """``guard=`` as given: None/False (off), True (defaults), a mapping of
    :class:`GuardOptions` fields, a :class:`GuardOptions`, or a string (``SENTINEL_GUARD``:
    ``1``/``true``/``0``/``false`` or a JSON map).

    Raises:
        ValueError: an unknown field or a bad value.
    """
    if value is None or value is False:
        return None
    if value is True:
        return GuardOptions()
    if isinstance(value, GuardOptions):
        return value
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("", "0", "false", "no", "off"):
            return None
        if low in ("1", "true", "yes", "on"):
            return GuardOptions()
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(f"guard: expected true/false or a JSON map, got {value!r}") from None
        if value is None or isinstance(value, bool):
            return parse_guard(value)
    if not isinstance(value, dict):
        raise ValueError(f"guard: expected a bool or a mapping, got {type(value).__name__}")
    known = {f.name for f in fields(GuardOptions)}
    unknown = set(value) - known - {"enabled"}
    if unknown:
        raise ValueError(f"guard: unknown option(s) {', '.join(sorted(unknown))}")
    if value.get("enabled") is False:
        return None
    return GuardOptions(**{k: v for k, v in value.items() if k != "enabled"})
