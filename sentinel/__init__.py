"""Sentinel: a runtime training-health monitor for PyTorch."""

from sentinel.instrument import Monitor, watch

__all__ = ["Monitor", "watch"]
__version__ = "0.1.0"
