"""Options of :func:`sentinel.watch`, with environment overrides."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from sentinel.errors import did_you_mean
from sentinel.instrument.guardopts import parse_guard
from sentinel.listen import parse_listen
from sentinel.wire import MAX_GROUPS, MAX_LABEL_LENGTH

DEFAULT_LISTEN = "127.0.0.1:9400"


@dataclass
class WatchOptions:
    """Everything :func:`sentinel.watch` can be told.

    Intervals are in optimizer steps. ``SENTINEL_<NAME>`` environment variables override
    the defaults (not explicit arguments), e.g. ``SENTINEL_LISTEN=0.0.0.0:9400``.
    """

    job: str = "train"
    """The ``job`` label on every series (a training job may hold many runs)."""
    run: str = ""
    """The ``run`` label: the launcher's run id (``SENTINEL_RUN``, torchrun's, Slurm's job id),
    else the host name and the start time, so all ranks of one launch share it."""
    listen: str = DEFAULT_LISTEN
    """HOST:PORT of the HTTP endpoint (``/metrics``, ``/api/v1/alerts``, ``/``); a busy port
    falls back to a free one, with a warning (``Monitor.url`` tells the one bound)."""
    group_depth: int | str = "auto"
    """A group is a module-path prefix: ``auto`` is the block level (``layers.7``,
    ``transformer.h.3``), an int keeps that many path components. A name over 200
    characters keeps its first 191 and a checksum of the whole (``~1a2b3c4d``)."""
    max_groups: int = 64
    """Groups past the cap merge into ``other`` (at most 256: what a report carries)."""
    update_every: int = 100
    """Update ratio ‖Δw‖/‖w‖, ‖Δw‖, UAR and parameter norms, every N steps, and at every
    step of the first ``early_steps`` and of the 10 after a learning-rate jump
    (instrument/cadence.py). A sample copies the weights and reads them again after the
    step: 8–16 ms on the CPU reference model, so every 100 steps keeps Sentinel's mean cost
    per step below Lightning's per-step ``grad_norm`` (benchmarks/peers.py). A comparison of
    optimizers, whose runs are short and whose point is the update's size, wants more
    samples: pass 50 there."""
    early_steps: int = 50
    """... and at every step of the first N steps, which the early-training rules judge (a
    learning rate far too high shows in the first ten updates, before any baseline
    exists); 0: never."""
    update_snapshot_bytes: int = 256 * 2**20
    """Bound on the snapshot buffer for the update ratio; groups rotate when exceeded."""
    state_every: int = 100
    """Optimizer-state bytes and Adam state saturation, every N steps (also at step 1 and
    after ``load_state_dict``)."""
    health_every: int = 100
    """Gradient SNR (the gradients' L1 sums, read in the same pass as their norms), every N
    steps, half-way between two update samples so no step carries both."""
    memory_every: int = 10
    """CUDA allocator and host RSS figures, every N steps."""
    memory_capacity_bytes: int = 0
    """Memory the OOM rule compares usage to; 0 = the CUDA devices' total, else the host or
    cgroup limit."""
    saturation_threshold: float = 1e-3
    """An Adam ``exp_avg_sq`` entry above this counts as saturated
    (``sentinel_optimizer_state_saturation_ratio``)."""
    saturation_max_tensors: int = 32
    """State tensors sampled for the saturation ratio at most."""
    heartbeat_seconds: float = 20.0
    """While the rank evaluates (forwards in ``eval()`` mode or with gradients off, loader
    batches drawn with gradients off; a step's closure called again, as a long LBFGS step
    does) but takes no optimizer step, a frame says so at most
    this often, so that ``TrainingStalled`` and the status page count its silence from the
    last heartbeat, not from the last step. Also how long passes thrown away with a
    non-finite loss or gradient norm wait for a step before a frame tells them (a script
    that skips its steps on a NaN), and then how often."""
    rl: bool | None = None
    """Reinforcement learning: the loss (a temporal-difference loss against the target
    network's own estimates, a critic's, a policy-gradient surrogate) measures no progress,
    and rises as the agent gets better (its value targets grow), so it is recorded as the
    scalar ``objective``, which no loss rule judges. None (the default): a run is taken for
    one when the script imported an environment library (``gymnasium``, ``gym``,
    ``envpool``, ``dm_env``, ``pettingzoo``); ``SENTINEL_RL=1`` or ``0`` says it."""
    game: bool | None = None
    """Optimizers in a game (a GAN's generator and discriminator, an actor and its critic):
    each one's loss is measured against the other, who moves (a generator's loss rises as
    its discriminator learns), so it is recorded as the scalar ``objective``, which no loss
    rule judges. None (the default): two optimizers are taken for players when they step in
    turn on losses of their own, and one's loss changes the other's gradients (or finds them
    frozen, as WGAN and pix2pix scripts freeze the discriminator for the generator's step);
    ``SENTINEL_GAME=1`` or ``0`` says it (1: every optimizer's loss is an objective)."""
    max_errors: int = 3
    """A probe that raised this many times is switched off."""
    max_pending: int = 4
    """Reports in flight from device to host; older ones are dropped and counted."""
    config: str | None = None
    """Path of a sentinel config file (rules, notifications) for the embedded engine."""
    engine: str = "process"
    """Where the engine runs when no daemon is reachable: ``process`` (a child process,
    off this process's GIL), ``thread`` (a thread of this process) or ``off``."""
    total_steps: int = 0
    """The optimizer steps the run is planned for, if known; the β2 advice compares Adam's
    second-moment memory 1/(1-β2) with it: a memory longer than a good part of the run
    adapts slowly to the gradients' scale. 0: unknown."""
    capture_loss: bool = False
    """Take each step's loss from ``Tensor.backward`` (the sum of the losses passed to it
    since the previous step, unscaled for a GradScaler), as zero-code mode does, instead
    of from :meth:`~sentinel.instrument.monitor.Monitor.log`."""
    tags: dict[str, str] = field(default_factory=dict)
    """Run metadata, e.g. ``{"optimizer": "lion", "lr": "3e-4", "seed": "1"}``: recorded in the
    history and exported as ``sentinel_run_info{...}``. At most 16; keys label-safe, at most
    32 characters, not ``job``/``run``/``rank``/``group``; values at most 64 characters.
    ``SENTINEL_TAGS`` (a JSON map, as ``sentinel run --tag`` sets it) adds to them."""
    tags_every: int = 100
    """Step frames carry the tags at the first step and then every N steps."""
    guard: Any = None
    """The step guard (opt-in): True, or a map of
    :class:`~sentinel.instrument.guardopts.GuardOptions` fields; ``SENTINEL_GUARD`` (``1`` or
    a JSON map, as ``sentinel run`` sets it from ``actions.guard``). None: off."""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.guard = parse_guard(self.guard)
        if not self.run:
            self.run = default_run_name()
            DEFAULTED_RUNS.add(self.run)
        for name in ("job", "run"):  # a frame with a longer one is refused whole
            value = getattr(self, name)
            if not isinstance(value, str) or not 0 < len(value) <= MAX_LABEL_LENGTH:
                got = f"{len(value)} characters" if isinstance(value, str) else repr(value)
                raise ValueError(f"{name}: must be 1..{MAX_LABEL_LENGTH} characters, got {got}")
        if isinstance(self.group_depth, str) and self.group_depth != "auto":
            try:
                self.group_depth = int(self.group_depth)
            except ValueError:
                raise ValueError(f"group_depth: must be auto or an integer, got {self.group_depth!r}") from None
        for name in ("max_groups", "update_every", "state_every", "health_every", "memory_every", "tags_every"):
            value = getattr(self, name)
            try:
                n = int(value)
                if isinstance(value, bool) or n < 1 or isinstance(value, float) and n != value:
                    raise ValueError
            except (TypeError, ValueError):
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}") from None
            setattr(self, name, n)
        if int(self.max_groups) > MAX_GROUPS:  # the engine would drop the groups of every frame, and their norms
            raise ValueError(f"max_groups: must be 1..{MAX_GROUPS} (the groups a report carries), got {self.max_groups!r}")
        if not float(self.heartbeat_seconds) > 0:
            raise ValueError(f"heartbeat_seconds: must be > 0, got {self.heartbeat_seconds!r}")
        self.rl, self.game = _said("rl", self.rl), _said("game", self.game)  # SENTINEL_RL, SENTINEL_GAME
        parse_listen(self.listen)
        self.tags = check_tags(self.tags)
        if self.engine not in ("process", "thread", "off"):
            raise ValueError(f"engine: must be process, thread or off, got {self.engine!r}")


def _said(name: str, value: Any) -> bool | None:
    """A yes/no/auto option: True, False or None, or its ``SENTINEL_*`` text (1, 0, auto)."""
    if isinstance(value, str):
        said = value.strip().lower()
        if said not in ("1", "true", "yes", "0", "false", "no", "", "auto"):
            raise ValueError(f"{name}: must be 1, 0 or auto, got {value!r}")
        return None if said in ("", "auto") else said in ("1", "true", "yes")
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{name}: must be True, False or None, got {value!r}")
    return value


MAX_TAGS, MAX_TAG_KEY, MAX_TAG_VALUE = 16, 32, 64
_RESERVED = frozenset({"job", "run", "rank", "group", "instance", "le", "quantile"})


def check_tags(tags: Any) -> dict[str, str]:
    """Tags as strings, checked against the bounds (see :attr:`WatchOptions.tags`).

    Raises:
        ValueError: too many tags, a bad key, or a value too long.
    """
    if not isinstance(tags, dict):
        raise ValueError(f"tags: must be a mapping of str to str, got {type(tags).__name__}")
    if len(tags) > MAX_TAGS:
        raise ValueError(f"tags: at most {MAX_TAGS}, got {len(tags)}")
    out: dict[str, str] = {}
    for k, v in tags.items():
        if (not isinstance(k, str) or not 0 < len(k) <= MAX_TAG_KEY or not (k[0].isalpha() or k[0] == "_")
                or not all(c.isascii() and (c.isalnum() or c == "_") for c in k) or k in _RESERVED):
            raise ValueError(f"tags: key {k!r} must match [A-Za-z_][A-Za-z0-9_]* (at most {MAX_TAG_KEY} "
                             f"characters) and not be one of {', '.join(sorted(_RESERVED))}")
        if isinstance(v, bool) or not isinstance(v, (str, int, float)) or len(str(v)) > MAX_TAG_VALUE:
            raise ValueError(f"tags.{k}: must be a string of at most {MAX_TAG_VALUE} characters")
        out[k] = str(v)
    return out


def env_tags(value: str | None) -> dict[str, str]:
    """``SENTINEL_TAGS``: a JSON map; anything else is ignored (never break training)."""
    if not value:
        return {}
    import json

    try:
        parsed = json.loads(value)
        return check_tags(parsed) if isinstance(parsed, dict) else {}
    except ValueError:
        return {}


def launcher_run_name(env: Mapping[str, str] | None = None) -> str:
    """The run id a launcher gave every rank (``SENTINEL_RUN``, torchrun's, Slurm's), or ''
    (``env``: the process's environment by default).

    Under Slurm it is the job id, and ``JOBID_INDEX`` for a task of an array job (as
    ``squeue`` shows it), so every task of an array is its own run."""
    env = os.environ if env is None else env
    for var in ("SENTINEL_RUN", "TORCHELASTIC_RUN_ID"):
        value = env.get(var)
        if value and value != "none":
            return value
    return slurm_job_name(env)


def slurm_job_name(env: Mapping[str, str]) -> str:
    """``SLURM_JOB_ID``, or ``ARRAY_JOB_ID_TASK_ID`` in an array job; '' outside Slurm."""
    array, index = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array and index:
        return f"{array}_{index}"
    return env.get("SLURM_JOB_ID", "")


def slurm_tags(env: Mapping[str, str]) -> dict[str, str]:
    """The Slurm job id (array: ``ID_INDEX``), step id and node name, as run tags
    (``slurm_job``, ``slurm_step``, ``slurm_node``); {} outside Slurm."""
    job = slurm_job_name(env)
    if not job:
        return {}
    out = {"slurm_job": job}
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")
    if step:
        out["slurm_step"] = step
    node = env.get("SLURMD_NODENAME") or env.get("SLURM_NODENAME")
    if node:
        out["slurm_node"] = node
    return {k: v[:MAX_TAG_VALUE] for k, v in out.items()}


DEFAULTED_RUNS: set[str] = set()
"""The run names this process's options made up (no ``run=``, no ``SENTINEL_RUN``): a
monitor that shares its engine with an earlier one takes that one's run instead
(:func:`sentinel.instrument.link.connect`)."""


def default_run_name(env: Mapping[str, str] | None = None) -> str:
    """A run name that all ranks of one launch agree on, when the launcher tells one."""
    return launcher_run_name(env) or f"{socket.gethostname()}-{time.strftime('%Y%m%d-%H%M%S')}"


def from_kwargs(kwargs: dict[str, Any]) -> WatchOptions:
    """Build options from keyword arguments, filling unset ones from ``SENTINEL_*``.

    Raises:
        TypeError: an unknown option name.
        ValueError: an invalid value.
    """
    known = {f.name: f for f in fields(WatchOptions)}
    unknown = set(kwargs) - set(known)
    if unknown:
        raise TypeError("unknown sentinel.watch option(s): "
                        + ", ".join(u + did_you_mean(u, list(known)) for u in sorted(unknown)))
    values: dict[str, Any] = {}
    for name, f in known.items():
        if name in kwargs and name != "tags":
            values[name] = kwargs[name]
            continue
        env = os.environ.get(f"SENTINEL_{name.upper()}")
        if name == "tags":  # the launcher's tags, with the script's own over them
            values[name] = {**env_tags(env), **check_tags(kwargs.get("tags", {}))}
            continue
        if not env or name == "extra":  # empty is unset (a job template's SENTINEL_JOB= left blank)
            continue
        default = f.default
        try:
            if isinstance(default, bool):
                values[name] = env.lower() in ("1", "true", "yes")
            elif isinstance(default, int) and not isinstance(default, bool):
                values[name] = int(env)
            elif isinstance(default, float):
                values[name] = float(env)
            else:
                values[name] = env
        except ValueError:
            kind = "an integer" if isinstance(default, int) else "a number"
            raise ValueError(f"{name}: must be {kind}, got {env!r}") from None
    return WatchOptions(**values)


def env_problem() -> str | None:
    """What is wrong with the ``SENTINEL_*`` options of this environment, naming the
    variable (``SENTINEL_MAX_GROUPS: max_groups: must be 1..256 ...``), or None. ``sentinel
    run`` asks before it starts its command: the zero-code monitors it loads take their
    options from these variables, and with a bad one they would watch nothing."""
    named = set(DEFAULTED_RUNS)
    try:
        from_kwargs({})
    except (TypeError, ValueError) as exc:
        text = str(exc)
        var = f"SENTINEL_{text.split(':', 1)[0].upper()}"
        return f"{var}: {text}" if var in os.environ else text
    finally:
        DEFAULTED_RUNS.intersection_update(named)  # a question only: no run name is taken
    return None


def rank_world() -> tuple[int, int]:
    """This process's ``(rank, world size)``: torch.distributed's, else the launcher's."""
    import torch  # here, not at the top: importing the options costs no torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    for rk, ws in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        if rk in os.environ:
            return int(os.environ[rk]), int(os.environ.get(ws, "1"))
    return 0, 1
