"""Rule configuration: the typed rule model, the default pack, and user overrides.

A user's config carries a section shaped like::

    rules:                       # overrides of built-in rules, by name
      LossSpike: {enabled: false}
      GradientSpike: {params: {factor: 20}, severity: critical}
    extra_rules:                 # whole new rules, same shape as the default pack's
      - {name: MyRule, kind: threshold, metric: sentinel_loss, params: {value: 10}, ...}

Every problem is reported at once as a :class:`ConfigError`, one ``dotted.key: message``
line each (``rules.LossSpike.params.factor: Input should be a valid number``), so the CLI
can print it and exit with status 2 without a traceback.
"""

from __future__ import annotations

import copy
import string
from collections.abc import Mapping, Sequence
from functools import lru_cache
from importlib import resources
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    SerializeAsAny,
    ValidationError,
    field_validator,
)

from sentinel.errors import ConfigError as ConfigError  # the ground floor's, re-exported
from sentinel.errors import did_you_mean
from sentinel.rules.base import Params
from sentinel.rules.registry import DETECTORS

Severity = Literal["info", "warning", "critical"]

SUMMARY_FIELDS: dict[str, object] = {
    "alertname": "Rule",
    "severity": "warning",
    "job": "job",
    "run": "run",
    "step": 100,
    "value": 1.0,
    "threshold": 1.0,
    "baseline": 1.0,
    "detail": "detail",
    "ranks": "ranks 0–7",
    "groups": "layers.0",
    "where": "ranks 0–7 (layers.0)",
}
"""The fields a summary template may use, with sample values used to validate templates.

``ranks`` is rendered compactly ("rank 3", "ranks 0–7, 9"); ``groups`` lists the first
groups ("layers.3, layers.4 (+5 more)", or "-" when none); ``where`` is ``ranks`` plus
the groups in parentheses when there are any.
"""


def dotted(loc: Sequence[str | int]) -> str:
    """``("rules", "LossSpike", "params", "factor")`` → ``rules.LossSpike.params.factor``."""
    return ".".join(str(p) for p in loc) or "<root>"


def format_errors(exc: ValidationError, prefix: Sequence[str | int] = (),
                  model: type[BaseModel] | None = None) -> list[str]:
    """One ``dotted.key: message`` line per pydantic error, keys prefixed with ``prefix``.

    Args:
        exc: the validation error.
        prefix: the location of the validated object inside the whole config.
        model: the model validated: an unknown key then names the known one it is closest
            to (``notify.min_serverity``: did you mean ``min_severity``?).
    """
    lines = []
    for err in exc.errors(include_url=False):
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden" and model is not None:
            msg += did_you_mean(str(err["loc"][-1]), _keys_at(model, err["loc"][:-1]))
        lines.append(f"{dotted([*prefix, *err['loc']])}: {msg}")
    return lines


def _keys_at(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """The keys the model takes at ``loc`` (its fields' names, down through nested models,
    lists and maps); [] where that is no model."""
    kind: Any = model
    index = False  # the next part is a list's index or a map's key
    for part in loc:
        if index:
            index = False
            continue
        if not _is_model(kind):
            return []
        field = kind.model_fields.get(str(part))
        if field is None:
            return []
        kind = field.annotation
        while get_origin(kind) is not None:  # list[Route], dict[str, Rule], Route | None: what it holds
            origin, args = get_origin(kind), get_args(kind)
            if origin is Annotated:
                kind = args[0]
                continue
            index = index or origin in (list, dict, tuple, set, frozenset)
            models = [a for a in args if _is_model(a)]
            kind = models[0] if models else args[-1]
    return list(kind.model_fields) if _is_model(kind) else []


def _is_model(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, BaseModel)


class Rule(BaseModel):
    """One alerting rule: which series, which detector, and how its alerts behave.

    Build rules through :func:`load_pack` or :func:`parse_rule`, which validate
    ``params`` against the kind's model and name every bad key.

    Attributes:
        name: the alert name (a contract for built-in rules).
        kind: a key of :data:`~sentinel.rules.registry.DETECTORS`.
        metric: the series read; with a list, the first one the rank reports.
        reference: a metric of the same rank whose latest value is ``ctx.reference`` (and
            whose latest samples are ``ctx.reference_window``, for a detector that asks).
        per: ``rank`` reads every series of the metric for the rank (one, or one per
            extra label such as ``source``); ``group`` reads only series with a
            ``group`` label, and the alert lists the groups; ``gpu`` reads the node's GPU
            series (labelled ``gpu`` and ``UUID``, no rank) on the engine's tick, and the
            alert lists the GPUs as its groups.
        severity: ``info``, ``warning`` or ``critical``.
        for_steps: consecutive failing evaluations before a series counts (0/1: first).
        resolve_after: consecutive OK evaluations before a series stops counting.
        cooldown_seconds: a re-fire this soon after a resolve is recorded, not notified.
        warmup_steps: no evaluation before this step, unless the rule is critical;
            baselines never use samples from before it.
        until_steps: no evaluation after this step (0: no end), except to resolve an
            alert that is open: for the checks of the first steps of a run.
        every_steps: evaluate at most every this many steps (for heavy detectors).
            ``for_steps``/``resolve_after`` count evaluations, not steps.
        lr_grace_steps: no evaluation for this many steps from a learning-rate change.
        restart_grace_steps: after a warm restart of the schedule (a torch scheduler took the
            lr back up to half its peak or more after it had fallen below a quarter of it:
            SGDR's ``CosineAnnealingWarmRestarts``, a cosine with hard restarts, each cycle of
            ``CyclicLR``; :mod:`sentinel.engine.schedule`), or after the script set the
            watched weights itself (``load_state_dict``: a lottery ticket's rewind, a
            roll-back; a ``torch.nn.utils.prune`` mask: :mod:`sentinel.instrument.rewrites`),
            no evaluation for this many steps, and baselines (``ctx.since_step``) begin after
            them: the loss's jump to where the restart or the new weights put it is the
            script's design, not a divergence (0: off).
        skip_short_batch: no evaluation at a step whose batch was its ``DataLoader``'s short
            last one (``drop_last=False``, less than half a batch): its gradient and loss are
            a few samples', whose noise is no spike of the run's.
        skip_games: no evaluation of a stream that plays a game (a GAN's generator or
            discriminator, an actor or its critic: its value is an ``objective``, not a loss;
            :mod:`sentinel.instrument.games`): its gradients follow the other player's moves,
            so their sudden changes are the game's, not a bad batch's.
        lr_for_steps: for this many steps from a learning-rate change, one failing
            verdict is enough (``for_steps`` 1): the instrument samples every step right
            after a jump, and a rate raised far too high shows at once (0: off).
        schedule_floor: no evaluation while the learning rate is below this fraction of
            its peak by a schedule's doing (the end of a decay, the start of a warmup); 0:
            always evaluated. For rules that a small scheduled lr explains.
        lr_resets_baseline: baselines (``ctx.since_step``) restart at a learning-rate
            change, so a level the new rate legitimately brings is not compared with the
            old one. False keeps the samples from before the change: a loss or gradient
            that jumps because the rate was just raised too far still counts.
        group_wait_seconds: how long a new alert waits for more ranks before firing
            (it fires at once when every known rank fails).
        params: the detector's parameters.
        summary: a ``str.format`` template over :data:`SUMMARY_FIELDS`.
        causes, checks, runbook: shown with the alert.
        tags: free labels for routing (``notify.routes.N.tags``) and Alertmanager.
        enabled: a disabled rule is never evaluated.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_]*$")
    kind: str
    metric: str | list[str] = Field(
        description="series name; a list means the first one the rank reports"
    )
    reference: str | None = Field(default=None, description="metric passed as ctx.reference")
    per: Literal["rank", "group", "gpu"] = "rank"
    severity: Severity = "warning"
    for_steps: NonNegativeInt = 1
    resolve_after: PositiveInt = 1
    cooldown_seconds: NonNegativeFloat = 0.0
    warmup_steps: NonNegativeInt = 0
    until_steps: NonNegativeInt = 0
    every_steps: PositiveInt = 1
    lr_grace_steps: NonNegativeInt = 0
    lr_for_steps: NonNegativeInt = 0
    restart_grace_steps: NonNegativeInt = 0
    skip_short_batch: bool = False
    skip_games: bool = False
    schedule_floor: NonNegativeFloat = 0.0
    lr_resets_baseline: bool = True
    group_wait_seconds: NonNegativeFloat = 2.0
    params: SerializeAsAny[Params]
    summary: str
    causes: list[str] = []
    checks: list[str] = []
    runbook: str = ""
    tags: list[str] = []
    enabled: bool = True

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        if v not in DETECTORS:
            raise ValueError(f"unknown detector kind {v!r}; expected one of {', '.join(DETECTORS)}")
        return v

    @field_validator("metric")
    @classmethod
    def _some_metric(cls, v: str | list[str]) -> str | list[str]:
        if not v:
            raise ValueError("at least one metric is required")
        return v

    @field_validator("summary")
    @classmethod
    def _template(cls, v: str) -> str:
        check_template(v)
        return v

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metric names in order of preference."""
        return (self.metric,) if isinstance(self.metric, str) else tuple(self.metric)


class RulePack(BaseModel):
    """An ordered set of rules with unique names."""

    model_config = ConfigDict(frozen=True)

    rules: list[Rule]

    def get(self, name: str) -> Rule:
        """The rule called ``name``.

        Raises:
            KeyError: no such rule.
        """
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(name)

    def enabled(self) -> list[Rule]:
        """The enabled rules, in pack order."""
        return [r for r in self.rules if r.enabled]

    def names(self) -> list[str]:
        return [r.name for r in self.rules]


def check_template(template: str) -> None:
    """Validate a summary template against :data:`SUMMARY_FIELDS`.

    Raises:
        ValueError: an unknown field, a positional field or a bad format spec.
    """
    for _, fname, _, _ in string.Formatter().parse(template):
        if fname is None:
            continue
        root = fname.split(".")[0].split("[")[0]
        if root == "" or root.isdigit():
            raise ValueError("positional fields are not allowed; use names such as {value}")
        if root not in SUMMARY_FIELDS:
            raise ValueError(f"unknown field {{{root}}}; known: {', '.join(SUMMARY_FIELDS)}")
    try:
        template.format(**SUMMARY_FIELDS)
    except (ValueError, IndexError, KeyError, AttributeError, TypeError) as exc:
        raise ValueError(f"bad template: {exc}") from None


def parse_rule(raw: object, loc: Sequence[str | int]) -> tuple[Rule | None, list[str]]:
    """Validate one rule given as a mapping.

    Args:
        raw: the rule's fields, ``params`` as a mapping.
        loc: where the rule sits in the config, for error keys.

    Returns:
        ``(rule, [])``, or ``(None, problems)`` with every problem found.
    """
    if not isinstance(raw, Mapping):
        return None, [f"{dotted(loc)}: Input should be a valid dictionary"]
    data = dict(raw)
    problems: list[str] = []
    kind = data.get("kind")
    spec = DETECTORS.get(kind) if isinstance(kind, str) else None
    raw_params = data.get("params", {})
    params: Params | None = None
    if spec is not None:
        if raw_params is None:
            raw_params = {}
        if not isinstance(raw_params, Mapping):
            problems.append(f"{dotted([*loc, 'params'])}: Input should be a valid dictionary")
        else:
            try:
                params = spec.params.model_validate(dict(raw_params))
            except ValidationError as exc:
                problems += format_errors(exc, [*loc, "params"], spec.params)
    # validate the rest even when params failed, so every problem is reported at once
    data["params"] = params if params is not None else Params()
    try:
        rule = Rule.model_validate(data)
    except ValidationError as exc:
        problems += format_errors(exc, loc, Rule)
        return None, problems
    return (rule, []) if not problems else (None, problems)


@lru_cache(maxsize=1)
def _default_raw() -> tuple[dict[str, Any], ...]:
    text = resources.files("sentinel.rules").joinpath("default.yaml").read_text("utf-8")
    doc = yaml.safe_load(text)
    return tuple(doc["rules"])


def default_rules() -> list[dict[str, Any]]:
    """The built-in rules as raw mappings (deep copies of ``default.yaml``)."""
    return copy.deepcopy(list(_default_raw()))


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Override fields of a raw rule; ``params`` merges key by key unless the kind changes."""
    out = dict(base)
    for k, v in override.items():
        if k == "params" and isinstance(v, Mapping) and "kind" not in override:
            out["params"] = {**(base.get("params") or {}), **v}
        else:
            out[k] = v
    return out


def load_pack(user_config: Mapping[str, Any] | None = None) -> RulePack:
    """The default pack with a user's ``rules`` overrides and ``extra_rules`` applied.

    Args:
        user_config: a mapping that may hold ``rules`` (``{name: {field: value}}``,
            ``params`` merged key by key) and ``extra_rules`` (a list of whole rules).
            Other keys are ignored: the caller may pass its whole config.

    Returns:
        The validated pack: built-in rules in their shipped order, then extra rules.

    Raises:
        ConfigError: every problem found, one ``dotted.key: message`` line each.
    """
    user = user_config or {}
    problems: list[str] = []
    raws = {r["name"]: r for r in default_rules()}
    locs: dict[str, tuple[str | int, ...]] = {n: ("default", n) for n in raws}

    overrides = user.get("rules") or {}
    if not isinstance(overrides, Mapping):
        problems.append("rules: Input should be a valid dictionary")
        overrides = {}
    for name, ov in overrides.items():
        if name not in raws:
            problems.append(f"rules.{name}: unknown rule{did_you_mean(name, list(raws))}; the built-in rules are "
                            f"{', '.join(raws)}")
        elif not isinstance(ov, Mapping):
            problems.append(f"rules.{name}: Input should be a valid dictionary")
        elif "name" in ov and ov["name"] != name:
            problems.append(f"rules.{name}.name: a built-in rule cannot be renamed")
        else:
            raws[name] = _merge(raws[name], ov)
            locs[name] = ("rules", name)

    extra = user.get("extra_rules") or []
    if not isinstance(extra, list):
        problems.append("extra_rules: Input should be a valid list")
        extra = []
    extra_names: set[str] = set()
    for i, raw in enumerate(extra):
        name = raw.get("name") if isinstance(raw, Mapping) else None
        if isinstance(name, str) and (name in raws or name in extra_names):
            problems.append(f"extra_rules.{i}.name: duplicate rule name {name!r}")
            continue
        if isinstance(name, str):
            extra_names.add(name)
        rule, errs = parse_rule(raw, ("extra_rules", i))
        problems += errs
        if rule is not None:
            raws[rule.name] = {"__rule__": rule}
            locs[rule.name] = ("extra_rules", i)

    rules: list[Rule] = []
    for name, raw in raws.items():
        if "__rule__" in raw:
            rules.append(raw["__rule__"])
            continue
        rule, errs = parse_rule(raw, locs[name])
        problems += errs
        if rule is not None:
            rules.append(rule)
    if problems:
        raise ConfigError(problems)
    return RulePack(rules=rules)
