"""Alert rules: pure detectors, the rule pack, the alert life cycle and the rule engine.

- :data:`DETECTORS` maps a rule's ``kind`` to a pure ``(window, params, ctx) -> Verdict``.
- :func:`load_pack` reads the shipped ``default.yaml`` and applies a user's overrides.
- :class:`RuleEngine` evaluates a pack against the store after every ingested frame and
  keeps the one life cycle (:mod:`sentinel.rules.lifecycle`) of every alert.
"""

from sentinel.rules.base import Context, Params, Verdict
from sentinel.rules.config import ConfigError, Rule, RulePack, format_errors, load_pack
from sentinel.rules.evaluator import RuleEngine
from sentinel.rules.lifecycle import Alert, Lifecycle, Transition, compact_ranks
from sentinel.rules.registry import DETECTORS

__all__ = [
    "DETECTORS",
    "Alert",
    "ConfigError",
    "Context",
    "Lifecycle",
    "Params",
    "Rule",
    "RuleEngine",
    "RulePack",
    "Transition",
    "Verdict",
    "compact_ranks",
    "format_errors",
    "load_pack",
]
