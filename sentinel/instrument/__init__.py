"""What runs inside training. Imports only the standard library, torch and msgpack."""

from sentinel.instrument.monitor import Monitor, TrainingHalted, watch

__all__ = ["Monitor", "TrainingHalted", "watch"]
