"""docs/instrumenting.md: every option of ``sentinel.watch`` can come from ``SENTINEL_<NAME>``,
explicit arguments win, and bad options raise at once (before anything is hooked)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import sentinel
from sentinel.instrument import registry
from sentinel.instrument.options import from_kwargs
from tests.helpers import MLP


@pytest.mark.parametrize(("env", "kwargs", "name", "expected"), [
    ({"SENTINEL_UPDATE_EVERY": "20"}, {}, "update_every", 20),
    ({"SENTINEL_UPDATE_EVERY": "20"}, {"update_every": 5}, "update_every", 5),  # the argument wins
    ({}, {}, "update_every", 100),
    ({"SENTINEL_RUN": "from-env"}, {}, "run", "from-env"),
    ({"SENTINEL_RUN": "from-env"}, {"run": "exp-42"}, "run", "exp-42"),
    ({"SENTINEL_CAPTURE_LOSS": "true"}, {}, "capture_loss", True),
    ({"SENTINEL_CAPTURE_LOSS": "true"}, {"capture_loss": False}, "capture_loss", False),
    ({"SENTINEL_LISTEN": "127.0.0.1:9555"}, {}, "listen", "127.0.0.1:9555"),
])
def test_sentinel_variables_fill_what_no_argument_gives(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                                       kwargs: dict[str, Any], name: str, expected: Any) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert getattr(from_kwargs(kwargs), name) == expected


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"update_evry": 5}, TypeError, "unknown sentinel.watch option(s): update_evry (did you mean 'update_every'?)"),
    ({"update_every": 0}, ValueError, "update_every: must be an integer >= 1, got 0"),
    ({"update_every": "ten"}, ValueError, "update_every: must be an integer >= 1, got 'ten'"),  # not int()'s words
    ({"state_every": 2.5}, ValueError, "state_every: must be an integer >= 1, got 2.5"),
    ({"engine": "gpu"}, ValueError, "engine: must be process, thread or off, got 'gpu'"),
    ({"max_groups": 257}, ValueError, "max_groups: must be 1..256"),  # more than a frame carries: every norm dropped
])
def test_a_bad_option_raises_at_once_and_hooks_nothing(kwargs: dict[str, Any], error: type[Exception],
                                                       message: str) -> None:
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with pytest.raises(error) as info:
        sentinel.watch(model, opt, **kwargs)
    assert str(info.value).startswith(message)
    assert registry.monitor_of(opt) is None  # no monitor follows its steps
    good = sentinel.watch(model, opt, engine="off")  # the check of the test itself: a good call does
    try:
        assert registry.monitor_of(opt) is good
    finally:
        good.close()


def test_max_groups_is_bounded_by_what_a_frame_carries() -> None:
    """``max_groups`` above the frame's bound (256 groups) is refused with the bound in the
    message. It was taken: a 300-module model watched with ``max_groups=400`` sent 300
    groups, and the engine dropped every frame's groups with their sums, the gradient norm
    of every step too."""
    from sentinel import wire

    assert from_kwargs({"max_groups": wire.MAX_GROUPS}).max_groups == 256
    with pytest.raises(ValueError, match=r"^max_groups: must be 1\.\.256 \(the groups a report carries\), got 400$"):
        from_kwargs({"max_groups": 400})
