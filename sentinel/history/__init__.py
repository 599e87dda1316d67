"""The run history (SQLite, written by the engine side), ``sentinel runs``, ``report`` and ``compare``."""
