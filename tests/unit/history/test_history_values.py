"""What a frame puts in its ``samples`` row: the per-group blob is the float32 roots of the
sums the frame sent (NaN where it sent none), and a value that is not a number is left out."""

from __future__ import annotations

import math
from array import array
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.history.values import group_blob, sample, unpack_groups

NAN = float("nan")
SUM = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.none(), st.integers(-3, 3), st.booleans())


def _root(x: Any) -> float:
    return math.sqrt(x) if isinstance(x, (int, float)) and x >= 0 else NAN


def _floats(blob: bytes) -> list[float]:
    a = array("f")
    a.frombytes(blob)
    return a.tolist()


def _same(xs: list[float], ys: list[float]) -> bool:
    return len(xs) == len(ys) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(xs, ys))


def _expected_blob(frame: dict[str, Any]) -> list[float]:
    """The blob by its definition: grad roots, parameter roots, update ratios, n each."""
    n = len(frame["groups"])

    def roots(key: str) -> list[float]:
        xs = frame.get(key)
        return [_root(x) for x in xs] if isinstance(xs, list) and len(xs) == n else [NAN] * n

    g, p, d = roots("grad_sumsq"), roots("param_sumsq"), roots("delta_sumsq")
    ratio = [dd / pp if pp else NAN for dd, pp in zip(d, p)]
    return _floats(array("f", g + p + ratio).tobytes())


@st.composite
def step_frames(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 5))
    frame: dict[str, Any] = {"kind": "step", "groups": [f"g{i}" for i in range(n)]}
    for key in ("grad_sumsq", "param_sumsq", "delta_sumsq"):
        if draw(st.booleans()):
            size = draw(st.sampled_from([n, n, n, n + 1, max(0, n - 1)]))
            frame[key] = draw(st.lists(SUM, min_size=size, max_size=size))
    return frame


@given(step_frames())
def test_the_group_blob_is_the_float32_roots_of_what_was_sent(frame: dict[str, Any]) -> None:
    blob = group_blob(frame)
    if "grad_sumsq" not in frame and "param_sumsq" not in frame:
        assert blob is None
    else:
        assert blob is not None and _same(_floats(blob), _expected_blob(frame))


def test_a_blob_without_parameter_or_update_sums_holds_nan_there() -> None:
    blob = group_blob({"kind": "step", "groups": ["a", "b"], "grad_sumsq": [4.0, 9.0]})
    unpacked = unpack_groups(blob, 2)
    assert unpacked is not None
    grads, params, ratios = unpacked
    assert grads == [2.0, 3.0]
    assert all(math.isnan(x) for x in params + ratios)


@pytest.mark.parametrize("value, kept", [(2.5, 2.5), (3, 3.0), (True, None), (None, None), ("2", None),
                                         (NAN, NAN)])
def test_a_sample_keeps_numbers_only(value: Any, kept: float | None) -> None:
    frame = {"kind": "step", "scalars": {"loss": value}, "clip_norm": value, "lr": [value],
             "amp": {"scale": value}, "step_seconds": value}
    vals = sample(frame)
    for column in ("loss", "clip_norm", "lr", "loss_scale", "step_seconds"):
        if kept is None:
            assert column not in vals
        else:
            got = vals[column]
            assert type(got) is float and (got == kept or (math.isnan(got) and math.isnan(kept)))
