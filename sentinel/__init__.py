"""Sentinel: a runtime training-health monitor for PyTorch.

``import sentinel`` is cheap: torch is imported when :func:`watch` is first used, so the
launcher shim costs nothing in Pythons that never train.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sentinel.instrument.monitor import Monitor, TrainingHalted
    from sentinel.instrument.watching import watch

__all__ = ["Monitor", "TrainingHalted", "watch"]
__version__ = "0.1.0"


def _start_engine(options: Any) -> Any:
    """A monitor's own engine: the package root joins the instrument to the daemon side
    (:func:`sentinel.daemon.launch.start`), so that neither imports the other's floor."""
    from sentinel.daemon.launch import start

    return start(options)


def _config_guard(path: str) -> Any:
    """A config file's guard options (:func:`sentinel.daemon.launch.config_guard`)."""
    from sentinel.daemon.launch import config_guard

    return config_guard(path)


def __getattr__(name: str) -> Any:
    if name == "watch":
        from sentinel.instrument.watching import watch

        return watch
    if name in __all__:
        from sentinel.instrument import monitor

        return getattr(monitor, name)
    raise AttributeError(f"module 'sentinel' has no attribute {name!r}")
