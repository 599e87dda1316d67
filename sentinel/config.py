"""The sentinel config file (YAML), validated by pydantic, with ``SENTINEL_*`` overrides.

Example::

    rules:
      LossSpike: {enabled: false}
      GradientSpike: {params: {factor: 20}}
    extra_rules: []
    notify:
      urls: ["slack://T000/B000/XXXX"]
      min_severity: warning
    actions:
      stop_on: [critical]       # raise sentinel.TrainingHalted at the next step
      capture_on: [critical, GradientNoiseRising]   # save the evidence (opt-in)
      capture_dir: ""           # default $XDG_STATE_HOME/sentinel/captures (mode 0700)
      capture_max_bytes: 4194304   # the inputs saved per rank and capture, at most
      capture_keep: 20          # captures kept per run; the oldest are deleted
      capture_steps: 4          # steps of inputs each rank holds references to

``actions.capture_on`` takes severities or rule names, as ``stop_on`` does. When a
matching alert fires, the engine writes ``evidence.json`` (the alert, the loss, grad-norm,
loss-scale and learning-rate history, the per-group norms at its step) into a folder of
its own under ``capture_dir/<job>/<run>/``, and each rank of the alert saves its watched
model's inputs of the alert's first step there (``inputs.rank<N>.pt``, tensors only,
``torch.load(path, weights_only=True)``; ``inputs.rank<N>.json`` says which step and what
was bounded). The alert's messages (chat, Alertmanager, the stop action's) name the
evidence and batch files. Without ``capture_on`` nothing is hooked and nothing is
written (see :mod:`sentinel.daemon.evidence` and :mod:`sentinel.instrument.capture`).

Errors are :class:`~sentinel.rules.config.ConfigError`, one ``dotted.key: message`` line each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from sentinel.engine.validate import Limits
from sentinel.rules.config import ConfigError, RulePack, format_errors, load_pack
from sentinel.serve.webconfig import load_web_config

Severity = Literal["info", "warning", "critical"]


def _parseable(url: SecretStr) -> SecretStr:
    """Parse with apprise's own parser at load; the error names the scheme, never the URL."""
    from sentinel.delivery.secrets import check_url

    problem = check_url(url.get_secret_value())
    if problem is not None:
        raise ValueError(problem)
    return url


NotifyUrl = Annotated[SecretStr, AfterValidator(_parseable)]
"""An apprise URL: a secret, parsed when the config loads."""


class RouteConfig(BaseModel):
    """One notification route: where messages go, which alerts it takes, how often."""

    model_config = ConfigDict(extra="forbid")
    name: str = ""
    """Names the route in metrics and CLI output (default: its index)."""
    urls: list[NotifyUrl] = []
    """apprise URLs; secrets, named by index and scheme only."""
    min_severity: Severity = "warning"
    """The least severity the route takes."""
    severities: list[Severity] = []
    """Exactly these severities (overrides ``min_severity`` when set)."""
    alertnames: list[str] = []
    """Alert names the route takes; empty lists match everything."""
    tags: list[str] = []
    """Rule tags the route takes (an alert matches with any one of them); empty: all."""
    runs: list[str] = []
    """Runs the route takes; empty: all."""
    jobs: list[str] = []
    """Jobs the route takes; empty: all."""
    cooldown_seconds: float = Field(default=0.0, ge=0)
    """After a message for an alert key (alertname, job, run), its re-fires for this long are not sent."""
    rate_limit_seconds: float = Field(default=1.0, ge=0)
    """At most one message per this many seconds on this route; later ones wait their turn."""
    resolved: bool = True
    """Whether the route gets resolved messages."""
    format: Literal["auto", "markdown", "text"] = "auto"
    """Body format; ``auto``: markdown where the service renders it, plain text otherwise."""


class NotifyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    urls: list[NotifyUrl] = []
    """apprise URLs of the default route; each is a secret and is never logged in full."""
    min_severity: Severity = "warning"
    cooldown_seconds: float = Field(default=0.0, ge=0)
    rate_limit_seconds: float = Field(default=1.0, ge=0)
    resolved: bool = True
    routes: list[RouteConfig] = []
    """More routes; ``urls``/``min_severity`` above form route 0 when ``urls`` is set."""
    console: bool = True
    """Write each warning and critical alert's firing and resolve on stderr, one line each
    (``sentinel: [FIRING] critical TrainingNonFinite — run r7, since step 200: …``), whatever
    the routes; info alerts, and re-fires inside a rule's cooldown, go to the ``sentinel`` log
    at INFO. false: stderr stays quiet and every alert goes to the log at INFO (``sentinel
    demo`` sets it: its live view shows the alerts)."""


class OutboxConfig(BaseModel):
    """The durable outbox: every notification is written here before it is sent."""

    model_config = ConfigDict(extra="forbid")
    path: str = ""
    """SQLite file; default ``$XDG_STATE_HOME/sentinel/outbox.sqlite`` (``~/.local/state/…``)."""
    retry_initial_seconds: float = Field(default=1.0, gt=0)
    """The first retry of a failed delivery waits this long; each next one twice as long,
    with jitter."""
    retry_max_seconds: float = Field(default=300.0, gt=0)
    """The longest wait between two tries."""
    max_age_seconds: float = Field(default=86_400.0, gt=0)
    """A notification still undelivered after this long is given up (counted ``expired``)."""
    keep_seconds: float = Field(default=86_400.0, ge=0)
    """Delivered rows are pruned after this long."""
    max_rows: int = Field(default=10_000, ge=100)
    """Rows kept at most; the oldest delivered ones go first, then the oldest pending."""


class HistoryConfig(BaseModel):
    """The run history: runs, thinned series and alert transitions in one SQLite file (WAL),
    written by the engine (embedded or daemon), read by ``sentinel runs/report/compare``."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    """Record runs at all (off: ``sentinel runs/report/compare`` have nothing to read)."""
    path: str = ""
    """SQLite file; default ``$XDG_STATE_HOME/sentinel/history.sqlite`` (``~/.local/state/…``)."""
    max_points: int = Field(default=4096, ge=64, le=1_000_000)
    """Sample rows kept per run at most: every step at first, then thinned by doubling strides."""
    keep_days: float = Field(default=90.0, gt=0)
    """Runs last seen longer ago than this are deleted."""
    max_bytes: int = Field(default=2**30, ge=2**20)
    """Past this size in use, the oldest runs are deleted (the newest one is always kept)."""
    queue_size: int = Field(default=65_536, ge=16)
    """Frames waiting for the writer thread at most; past it the oldest are dropped and counted."""
    flush_seconds: float = Field(default=0.5, gt=0, le=60)
    """The writer commits a batch at least this often (what a killed engine can lose)."""
    retry_seconds: float = Field(default=300.0, ge=0)
    """A file locked by another process is retried (the batch kept) for this long in a row,
    then history is switched off."""


class AlertmanagerConfig(BaseModel):
    """An optional Alertmanager sink (v2 API), through the same outbox."""

    model_config = ConfigDict(extra="forbid")
    url: SecretStr | None = None
    """e.g. ``http://127.0.0.1:9093``; may carry basic-auth credentials, so it is a secret."""
    min_severity: Severity = "warning"
    """The least severity posted."""
    resend_seconds: float = Field(default=60.0, gt=0)
    """Re-post firing alerts this often (well inside Alertmanager's ``resolve_timeout``)."""
    timeout_seconds: float = Field(default=5.0, gt=0)
    """The HTTP timeout of one post."""


class GrafanaConfig(BaseModel):
    """Grafana: dashboard links in messages, and an optional annotation sink."""

    model_config = ConfigDict(extra="forbid")
    url: str = ""
    """e.g. ``https://grafana.example.com``; messages link the dashboard when set."""
    dashboard_uid: str = ""
    """The dashboard messages link; empty: the one that answers the alert first (a NaN
    opens Layers, a straggler Ranks & GPUs, anything else the Training overview)."""
    token: SecretStr | None = None
    """A service-account token: with ``url``, every firing and resolve is also posted as a
    Grafana annotation (tags ``sentinel``, ``alertname:``, ``severity:``, ``run:``),
    through the outbox like every other sink."""
    min_severity: Severity = "warning"
    """The annotation sink's threshold."""


class GuardConfig(BaseModel):
    """``actions.guard``: the step guard (opt-in; see docs/guard.md and
    :class:`sentinel.instrument.guardopts.GuardOptions` for each field)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = False
    """Switch the guard on (for ``sentinel run``'s scripts and ``watch(config=...)``)."""
    nonfinite: bool = True
    spike: bool = True
    factor: float = Field(default=10.0, gt=1.0)
    window: int = Field(default=50, ge=3)
    warmup: int = Field(default=20, ge=1)
    max_consecutive: int = Field(default=8, ge=1)
    on_exhausted: Literal["halt", "through"] = "halt"
    method: Literal["auto", "fused", "select", "sync"] = "auto"
    snapshot_bytes: int = Field(default=2 * 2**30, ge=0)

    def to_options(self) -> dict[str, Any] | None:
        """The ``guard=`` of ``sentinel.watch`` (None when off)."""
        return self.model_dump(exclude={"enabled"}) if self.enabled else None


class ActionsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stop_on: list[str] = []
    """Alert names or severities whose firing stops training at the next step (opt-in)."""
    capture_on: list[str] = []
    """Alert names or severities whose firing saves the evidence and the batch (opt-in)."""
    capture_dir: str = ""
    """Where captures go; default ``$XDG_STATE_HOME/sentinel/captures`` (created 0700)."""
    capture_max_bytes: int = Field(default=4 * 2**20, ge=1024, le=2**31)
    """The inputs one rank saves per capture, at most: a larger batch keeps its first rows."""
    capture_keep: int = Field(default=20, ge=1, le=10_000)
    """Captures kept per run; past that the oldest folder is deleted."""
    capture_steps: int = Field(default=4, ge=1, le=64)
    """Steps whose inputs each rank holds references to (never copies), once capture is on."""
    guard: GuardConfig = GuardConfig()
    """The step guard (opt-in): skip a step with non-finite or spiking gradients."""


class GpuConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    """Poll NVML (needs nvidia-ml-py and a driver; otherwise sentinel_gpu_monitoring_up is 0)."""
    interval_seconds: float = Field(default=5.0, gt=0)
    """Seconds between two polls of every GPU."""


class RetentionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ended_seconds: float = Field(default=600.0, ge=0)
    """A run that ended (every rank said goodbye or crashed) keeps its series this long."""
    idle_seconds: float = Field(default=86_400.0, gt=0)
    """A run that sent nothing for this long is forgotten too."""


_L = Limits()


class LimitsConfig(BaseModel):
    """The engine's caps on what frames may cost it (see :class:`sentinel.engine.validate.Limits`).
    A frame over one is refused whole and counted in
    ``sentinel_daemon_frames_refused_total{reason}``."""

    model_config = ConfigDict(extra="forbid")
    max_frame_bytes: int = Field(default=_L.max_frame_bytes, ge=1024, le=_L.max_frame_bytes)
    max_groups: int = Field(default=_L.max_groups, ge=1)
    max_group_name_length: int = Field(default=_L.max_group_name_length, ge=8)
    max_label_length: int = Field(default=_L.max_label_length, ge=8)
    max_ranks: int = Field(default=_L.max_ranks, ge=1)
    max_runs: int = Field(default=_L.max_runs, ge=1)
    max_series: int = Field(default=_L.max_series, ge=100)
    max_scalars: int = Field(default=_L.max_scalars, ge=1)
    max_scalar_names: int = Field(default=_L.max_scalar_names, ge=1)
    max_scalar_name_length: int = Field(default=_L.max_scalar_name_length, ge=8)
    max_param_groups: int = Field(default=_L.max_param_groups, ge=1)
    max_state_keys: int = Field(default=_L.max_state_keys, ge=1)

    def limits(self) -> Limits:
        """The engine's form of these caps."""
        return Limits(**self.model_dump())


class WebConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    config_file: str | None = None
    """A Prometheus exporter-toolkit web config file (``tls_server_config``,
    ``basic_auth_users``); ``--web.config.file`` on the command line wins."""


class SentinelConfig(BaseSettings):
    """The whole config file. ``SENTINEL_NOTIFY__URLS='["json://…"]'`` style env overrides."""

    model_config = SettingsConfigDict(env_prefix="SENTINEL_", env_nested_delimiter="__", extra="forbid")
    profile: Literal["full", "fleet"] = "full"
    """Export profile (``SENTINEL_PROFILE``): ``fleet`` exports per-group series only from a
    run's lowest rank and for groups an active alert names (sentinel/serve/profile.py)."""
    rules: dict[str, dict[str, Any]] = {}
    """Overrides of built-in rules by name: any rule field (see "Rules" below)."""
    extra_rules: list[dict[str, Any]] = []
    """Whole rules of your own, of the default pack's shape."""
    notify: NotifyConfig = NotifyConfig()
    actions: ActionsConfig = ActionsConfig()
    gpu: GpuConfig = GpuConfig()
    retention: RetentionConfig = RetentionConfig()
    outbox: OutboxConfig = OutboxConfig()
    history: HistoryConfig = HistoryConfig()
    alertmanager: AlertmanagerConfig = AlertmanagerConfig()
    grafana: GrafanaConfig = GrafanaConfig()
    limits: LimitsConfig = LimitsConfig()
    web: WebConfig = WebConfig()


def load_config(source: str | Path | dict[str, Any] | None = None) -> tuple[SentinelConfig, RulePack]:
    """Read, validate and merge a config file (or mapping) with the default rule pack.

    Args:
        source: a YAML file path, an already-parsed mapping, or None for the defaults.

    Returns:
        The config and the effective rule pack.

    Raises:
        ConfigError: every problem found, as ``dotted.key: message`` lines.
    """
    raw: Any = {}
    if isinstance(source, (str, Path)):
        path = Path(source)
        try:
            raw = yaml.safe_load(path.read_bytes().decode("utf-8")) or {}
        except OSError as exc:
            raise ConfigError([f"{path}: cannot read: {exc.strerror or type(exc).__name__}"]) from None
        except UnicodeDecodeError as exc:
            raise ConfigError([f"{path}: not UTF-8 text (byte {exc.start} is 0x{exc.object[exc.start]:02x})"]) from None
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            at = f" (line {where.line + 1})" if where is not None else ""
            raise ConfigError([f"{path}: not valid YAML{at}"]) from None
    elif isinstance(source, dict):
        raw = source
    if not isinstance(raw, dict):
        raise ConfigError(["<root>: the config must be a mapping"])
    problems: list[str] = []
    cfg: SentinelConfig | None = None
    try:
        cfg = SentinelConfig(**raw)
    except ValidationError as exc:
        problems += format_errors(exc, model=SentinelConfig)
    pack: RulePack | None = None
    try:  # the rules are checked even when another section is wrong: report everything at once
        pack = load_pack({"rules": raw.get("rules"), "extra_rules": raw.get("extra_rules")}
                         if cfg is None else {"rules": cfg.rules, "extra_rules": cfg.extra_rules})
    except ConfigError as exc:
        problems += [p for p in exc.problems if p not in problems]
    severities = {"info", "warning", "critical"}
    names = set(pack.names()) if pack is not None else set()
    for key in ("stop_on", "capture_on"):
        for i, target in enumerate(getattr(cfg.actions, key) if cfg is not None else []):
            if target not in severities and pack is not None and target not in names:
                problems.append(f"actions.{key}.{i}: {target!r} is neither a severity nor a rule name")
    if cfg is not None and cfg.web.config_file:
        try:
            load_web_config(cfg.web.config_file)
        except ConfigError as exc:
            problems += [f"web.config_file: {p}" for p in exc.problems]
    if problems or pack is None or cfg is None:
        raise ConfigError(problems)
    return cfg, pack


def with_web_config(cfg: SentinelConfig, path: str | None) -> SentinelConfig:
    """``cfg`` with the web config file that ``--web.config.file`` named (None: as it is).

    Raises:
        ConfigError: the file cannot be read or is invalid (``web.config.file: ...`` lines).
    """
    if path is None:
        return cfg
    try:
        load_web_config(path)
    except ConfigError as exc:
        raise ConfigError([f"--web.config.file: {p}" for p in exc.problems]) from None
    return cfg.model_copy(update={"web": WebConfig(config_file=path)})
