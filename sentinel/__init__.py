"""Sentinel: a runtime training-health monitor for PyTorch."""

from sentinel.instrument import Monitor, TrainingHalted, watch

__all__ = ["Monitor", "TrainingHalted", "watch"]
__version__ = "0.1.0"
