"""What runs inside training. Imports only the standard library, torch and msgpack."""

from sentinel.instrument.monitor import Monitor, watch

__all__ = ["Monitor", "watch"]
