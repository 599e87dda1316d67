"""Thin, optional framework adapters.

Each submodule imports its framework, so import the one you use, and only where that
framework is installed: ``from sentinel.integrations.lightning import SentinelCallback`` or
``from sentinel.integrations.hf import SentinelCallback``. Importing :mod:`sentinel` (or
this package) never imports Lightning or transformers.

Accelerate needs no adapter: call :func:`sentinel.watch` after ``accelerator.prepare()``
with the prepared model and optimizer.
"""
