"""A report's frame: the host-side meta of a step merged with the values read back from
the device (see :mod:`sentinel.wire` for the fields)."""

from __future__ import annotations

from typing import Any

from sentinel.instrument.scalars import means


def assemble(meta: dict[str, Any], values: dict[str, list[float]], n_groups: int, sharded: bool) -> dict[str, Any]:
    """The frame for one report: ``meta`` (host-side fields) with the read-back ``values``.

    Args:
        meta: the report's host-side fields (``kind``, ``step``, ``groups``, ...;
            ``scalars`` as :meth:`~sentinel.instrument.scalars.Scalars.meta` gives them).
        values: device values by segment name, as :class:`~sentinel.instrument.readback.Readback`
            returns them (``grad_sumsq``, ``s:<scalar>``, ``amp_scale``, ...).
        n_groups: the number of groups, for a step frame whose gradients were all missing.
        sharded: whether the sums are of local shards.
    """
    frame = dict(meta)
    if values.get("amp_scale"):
        frame["amp"] = {"scale": values["amp_scale"][0]}
    if "scalars" in frame:
        frame["scalars"] = means(frame["scalars"], values)
    if frame["kind"] == "step":
        g = n_groups
        if "grad_sumsq" in values:  # absent: the probe failed (never a made-up 0)
            frame["grad_sumsq"] = values["grad_sumsq"]
        if "param_sumsq" in values:
            frame["param_sumsq"] = values["param_sumsq"]
        if "delta_sumsq" in values:
            sampled = set(frame.pop("delta_groups", ()))
            frame["delta_sumsq"] = [v if i in sampled else None
                                    for i, v in enumerate(values["delta_sumsq"])]
            for key in ("delta_l1", "param_l1"):  # the seed's UAR (instrument/magnitude.py)
                if key in values and len(values[key]) == g:
                    frame[key] = [v if i in sampled else None for i, v in enumerate(values[key])]
        frame.pop("delta_groups", None)
        if "grad_l1" in values and "grad_count" in frame:
            frame["grad_l1"] = values["grad_l1"][0]
        if "sat_above" in values and "sat_total" in frame:
            frame["sat"] = [values["sat_above"][0], frame.pop("sat_total")]
        frame.pop("sat_total", None)
        totals = frame.pop("health_total", None)  # optstate.py's figures: [numerator, total]
        if isinstance(totals, dict):
            health = {n: [values[f"h:{n}"][0], t] for n, t in totals.items() if values.get(f"h:{n}")}
            if health:
                frame["opt_health"] = health
        counts = frame.pop("trust_count", None)  # LAMB's trust ratio per group
        sums = values.get("trust_sum")
        if isinstance(counts, list) and sums and len(sums) == len(counts):
            frame["trust_ratio"] = [s / c if c else None for s, c in zip(sums, counts)]
        if values.get("clip_norm") and "clip_max" in frame:
            frame["clip_norm"] = values["clip_norm"][0]
        else:
            frame.pop("clip_max", None)
        frame["shard"] = "sharded" if sharded else "replicated"
    return frame
