"""Sentinel's launcher shim. No logic here: see ``sentinel.instrument.shim``."""

try:
    from sentinel.instrument.shim import initialize
except Exception:  # sentinel not importable in this interpreter: stay out of the way
    initialize = None

if initialize is not None:
    initialize(__file__)
