"""The wire format between a training process and the engine.

Every message in both directions is declared here once, as a typed struct (msgspec)
with its constraints (ranges, lengths, caps): :class:`Frame` (the step, log and
goodbye reports a training process sends), and the engine's replies :class:`Ready`
(the hello of an engine process), :class:`Alert` (what ``on_alert`` callbacks get),
:class:`Stop`, :class:`Arm` and :class:`Capture`. The training side encodes the structs;
the engine decodes frames strictly into :class:`Frame` (:func:`decode_strict`), and
only a frame that fails that is checked field by field
(:func:`sentinel.engine.validate.check_frame`), so that a bad optional field is dropped
and the rest kept.

A frame is one msgpack map. Version 2 has these keys (``?`` marks optional ones):

=================  ==========================================================
``v``              schema version, :data:`SCHEMA_VERSION`; an engine of version N
                   also takes frames of version N-1 (:data:`ACCEPTED_VERSIONS`),
                   and ignores keys it does not know
``kind``           ``"step"`` (one optimizer step's report) or ``"log"``
                   (scalars passed to ``Monitor.log``) or ``"bye"``
``job``/``run``    identity strings
``rank``/``world`` int rank and world size
``opt``?           the optimizer stream in a process that steps several optimizers
                   (a GAN's two): ``"0"``, ``"1"``, ... (one or two digits) in the order
                   their monitors were made; absent for a process's only optimizer (and
                   in version 1). Each stream has its own steps, series (label
                   ``optimizer``) and goodbye
``step``           completed optimizer steps when the values were taken
``t``              wall-clock seconds (``time.time()``) when taken
``groups``?        list of group names; the ``*_sumsq`` lists are aligned to it
``grad_sumsq``?    per-group sum of squares of gradients
``param_sumsq``?   per-group sum of squares of parameters
``delta_sumsq``?   per-group sum of squares of the last update (None = not sampled)
``delta_l1``?      per-group sum of ``|Δw|`` of the last update (None = not sampled)
``param_l1``?      per-group sum of ``|w|`` before it, same groups (the seed's UAR)
``shard``?         ``"replicated"`` or ``"sharded"``: how ranks' sums combine
                   (sharded: each rank's sums cover its own shards, and the
                   engine adds up the ``world`` ranks' sums for a step)
``clip_norm``?     total grad norm ``clip_grad_norm_`` computed, before clipping
``clip_max``?      the ``max_norm`` it clipped to
``grad_l1``?       sum of ``|g|`` over all gradient elements (for the SNR)
``grad_count``?    number of gradient elements
``sat``?           ``[above, total]`` sampled ``exp_avg_sq`` counts (Adam-like optimizers)
``opt_health``?    ``{figure: [numerator, total]}`` sampled per-optimizer figures
                   (``instrument/optstate.py``)
``trust_ratio``?   per-group mean LAMB trust ratio (None where no LAMB parameter)
``lr``?            learning rate per optimizer param group (list)
``lr_peak``?       per param group, the lr a torch scheduler scales from
                   (``max_lr``/``initial_lr``; NaN for a group without one)
``step_seconds``?  wall time since the previous step
``state_bytes``?   ``{state_key: bytes}`` of optimizer state
``param_bytes``?   bytes of parameters
``mem``?           ``{name: value}`` memory figures (see the exporter)
``optim``?         per optimizer an :class:`OptimizerRecord` (``class``, ``dtype``, ``hp``:
                   :class:`Hyperparameters`; ``instrument/optinfo.py``); with ``state_bytes``
``total_steps``?   the run's planned optimizer steps, when the user gave them
``env``?           ``{name: str}`` versions, GPU model and numerics flags
                   (``instrument/envprobe.py``); at the first step and with
                   ``state_bytes``
``amp``?           ``{"scale": float, "skipped": int}``
``scalars``?       ``{name: float}`` from ``Monitor.log``
``errors``?        instrument errors so far (monotonic)
``scalars_dropped``? values ``Monitor.log`` dropped so far (monotonic)
``dropped``?       frames dropped by the sender so far (monotonic)
``beat``?          on a ``log`` frame: the rank works although it took no step since
                   ``step`` (an evaluation); the evaluation forwards, the
                   ``DataLoader`` batches drawn with gradients off and the
                   ``Monitor.heartbeat()`` calls since then; 0: none, the process
                   waits for work (a Jupyter kernel between cells). Sent at most once
                   per ``heartbeat_seconds``
``where``?         on a ``log`` frame: where the training thread was when no step had
                   come for ``heartbeat_seconds`` (its innermost Python frame, and the
                   script's innermost one: ``wait (threading.py:355) from
                   load_batch (train.py:40)``); no heartbeat: a hang sends it too. The
                   engine keeps it until the rank's next step (``TrainingStalled`` says it)
``short_batch``?   ``[size, batch size]``: the step's batch was its ``DataLoader``'s
                   short last one (``drop_last=False``), less than half a batch: its
                   gradient norm and loss are a few samples', not a batch's
``skipped_nonfinite``? times so far (a running count) that the script threw away the
                   gradients of ``backward()`` passes whose loss was not finite and took
                   no step with them: it skipped its step on a NaN or Inf loss (captured
                   losses only; a ``GradScaler``'s skips are ``amp``'s)
``no_gradient``?   steps in a row, this one included, at which an optimizer of the
                   stream stepped and none of its parameters that require a gradient
                   had one: the loss does not reach them. Sent while it lasts, and a 0
                   at the first step with gradients again
``not_reset``?     steps in a row, this one included, whose gradients began from the
                   last step's: no ``zero_grad()`` between them (instrument/resets.py).
                   Sent while it lasts, and a 0 at the first step reset again
``rewrite``?       ``"load_state_dict"`` or ``"prune"``: the script set the watched
                   weights itself since the last step (a rewind, a roll-back, a pruning
                   mask); the engine restarts the loss's baselines as at a warm restart
``guard``?         on a ``log`` frame at the step it judged: the step guard's
                   :class:`GuardNote` (a skip, the end of a run of skips, the
                   ``max_consecutive`` outcome, or the first judged step), sent
                   before that step's report
``status``?        on ``"bye"`` only: the exit status a launcher saw (``sentinel run``
                   attached to a node's daemon), ``128 + N`` for signal ``N``, or the
                   one a training process leaves with by ``sys.exit(N)``; ``exc``
                   then says who ended and why, in words (``SystemExit(1) at train.py:62``)
``exc``?           on ``"bye"``: the exception the training process leaves on, its
                   type and the script's line it came through, never its message
                   (``RuntimeError at train.py:40``); on the ``log`` frame of
                   ``skipped_nonfinite`` sent as it leaves: the same, the exception
                   that threw the last passes away (they were not skipped)
``thread``?        on ``"bye"`` with ``exc`` only: the name of the thread the
                   training ran in, when that thread ended on ``exc`` and the
                   process went on (a web UI's, a server's training thread)
=================  ==========================================================

Sums of squares rather than norms travel so that sharded ranks can be added up where
the data meets. The format never carries pickled objects.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgpack
import msgspec
from msgspec import UNSET as UNSET
from msgspec import Meta, Struct
from msgspec import UnsetType as UnsetType

SCHEMA_VERSION = 2
ACCEPTED_VERSIONS = (SCHEMA_VERSION - 1, SCHEMA_VERSION)
"""The rule for old and new peers: an engine of version N takes frames of N and N-1 (version 1
had no ``opt``; what it sent means the same in version 2), and refuses newer ones whole
(``sentinel_daemon_frames_refused_total{reason="schema"}``): upgrade the daemon first."""
MAX_FRAME_BYTES = 60_000  # fits a Unix datagram on every Linux default
MAX_STEP = 2**53
"""Steps beyond this are not exact as floats (the store's times and the exporter's values)."""
_FLOAT_MAX = 1.7976931348623157e308
MAX_WORLD = 1 << 20
"""The largest job (``world``, ranks numbered below it). An engine tracks at most
``Limits.max_ranks`` ranks of a run, which a node's daemon, hearing its node's, never nears."""
MAX_STATE_KEYS = 64
"""Optimizer state keys a frame carries (``state_bytes``), each a string of 1..64 characters."""
MAX_GROUPS = 256
"""Parameter groups (by module) a frame carries: ``groups`` and the sums aligned to it. A
monitor's ``max_groups`` is at most this."""
HYPERPARAMETERS = ("lr", "beta1", "beta2", "eps", "weight_decay", "momentum")
"""The settings an optimizer record's ``hp`` carries (``sentinel_optimizer_hyperparameter``)."""
MAX_OPTIMIZERS = 8
"""Optimizers an optimizer record (``optim``) describes: a stream's first this many."""
MAX_PARAM_GROUPS = 256
"""Learning rates a frame carries (``lr``, ``lr_peak``): the first this many param groups of
the stream's optimizers. A model with a param group per parameter (layer-wise lr decay) has
more; they follow the same schedule."""


Rewrite = Literal["load_state_dict", "prune"]
"""How the script set the watched weights itself (``Frame.rewrite``)."""


class FrameError(ValueError):
    """A frame that cannot be accepted: malformed, wrong version, or too large."""


# -- the field types, with their constraints ---------------------------------------------------
# A msgspec constraint is checked as the bytes are decoded (C); ``ge`` refuses NaN, ``le``
# below the largest float refuses +inf. Sums of squares may also be NaN (a measurement that
# went non-finite is news, not an error): a frame carrying one fails the strict decode and
# is checked field by field instead (validate.check_frame, which takes NaN), as a frame
# with any other value the struct refuses is.

Count = Annotated[int, Meta(ge=0, le=MAX_STEP)]
Finite = Annotated[float, Meta(ge=-_FLOAT_MAX, le=_FLOAT_MAX)]
FiniteNonNeg = Annotated[float, Meta(ge=0, le=_FLOAT_MAX)]
NonNegOrInf = Annotated[float, Meta(ge=0)]
MAX_LABEL_LENGTH = 128
Label = Annotated[str, Meta(min_length=1, max_length=MAX_LABEL_LENGTH)]
"""``job`` and ``run`` (``Limits.max_label_length`` may lower the cap)."""
MAX_GROUP_NAME_LENGTH = 200
"""Characters of a group name (the instrument shortens a longer one, see
:func:`sentinel.instrument.groups.bounded`)."""
GroupName = Annotated[str, Meta(max_length=MAX_GROUP_NAME_LENGTH)]
Groups = Annotated[list[GroupName], Meta(max_length=MAX_GROUPS)]
Sums = list[NonNegOrInf]
"""Per-group sums of squares, aligned to ``groups`` (the length is checked against it after decoding)."""
SampledSums = list[NonNegOrInf | None]
"""Per-group sums of the groups sampled this step (None: not sampled)."""
Sampled = list[float | None]
"""Per-group values of the groups sampled this step (None: not sampled)."""
ShortKey = Annotated[str, Meta(min_length=1, max_length=64)]
SCALAR_NAME = r"^[A-Za-z0-9_.:/@+\-]+\Z"  # \Z: "$" would let a trailing newline through
ScalarName = Annotated[str, Meta(max_length=64, pattern=SCALAR_NAME)]
RESERVED_TAGS = frozenset({"job", "run", "rank", "group", "instance", "le", "quantile"})
TagKey = Annotated[str, Meta(pattern=r"^(?!(?:" + "|".join(sorted(RESERVED_TAGS)) + r")$)[A-Za-z_][A-Za-z0-9_]{0,31}\Z")]
"""Label-safe, and not one of the series' own labels."""
TagValue = Annotated[str, Meta(max_length=64)]
Tags = Annotated[dict[TagKey, TagValue], Meta(max_length=16)]
Text200 = Annotated[str, Meta(max_length=200)]
StreamLabel = Annotated[str, Meta(pattern=r"^[0-9]{1,2}\Z")]
"""An optimizer stream's label (``opt``): one or two ASCII digits."""

GUARD_REASONS = ("nonfinite", "spike")
GUARD_OUTCOMES = ("", "halt", "through")


class GuardNote(Struct, frozen=True, forbid_unknown_fields=True):
    """What the step guard tells the engine about one step it judged (``frame["guard"]``).

    Attributes:
        skipped: the step was not applied.
        reason: ``nonfinite`` or ``spike`` (``""`` for a step applied after skips).
        norm: the global gradient norm (pre-clip where the script clips), NaN if non-finite.
        bound: the spike bound at that step (``factor × median``; NaN during warm-up).
        groups: the groups whose gradients held non-finite values.
        consecutive: skips in a row, this one included (0: this step was applied).
        outcome: ``halt`` or ``through`` when ``max_consecutive`` was reached here.
        batch: the step's batch index, when the script or adapter told it (else None).
        method: how the skip was made (``fused``, ``select``, ``sync``).
    """

    skipped: bool
    reason: Annotated[str, Meta(pattern=r"^(nonfinite|spike|)\Z")]
    norm: float
    bound: float
    groups: Annotated[tuple[GroupName, ...], Meta(max_length=64)] = ()
    consecutive: Annotated[int, Meta(ge=0, le=2**31)] = 0
    outcome: Annotated[str, Meta(pattern=r"^(halt|through|)\Z")] = ""
    batch: int | None = None
    method: Annotated[str, Meta(max_length=16)] = ""

    def to_wire(self) -> dict[str, Any]:
        d = msgspec.structs.asdict(self)
        d["groups"] = list(self.groups)
        return d

    @classmethod
    def from_wire(cls, d: Any) -> GuardNote:
        """The lenient reading of a note that failed the strict one (long names cut).

        Raises:
            FrameError: not a guard note of this schema."""
        try:
            if not isinstance(d, dict) or set(d) - _GUARD_KEYS:
                raise TypeError
            note = cls(bool(d["skipped"]), str(d["reason"]), float(d["norm"]), float(d["bound"]),
                       tuple(str(g)[:200] for g in d.get("groups", ())[:64]), int(d.get("consecutive", 0)),
                       str(d.get("outcome", "")), None if d.get("batch") is None else int(d["batch"]),
                       str(d.get("method", ""))[:16])
        except (TypeError, ValueError, KeyError):
            raise FrameError("field 'guard' is not a guard note") from None
        if (note.reason not in GUARD_REASONS + ("",) or note.outcome not in GUARD_OUTCOMES
                or not 0 <= note.consecutive <= 2**31):
            raise FrameError("field 'guard' is out of range")
        return note


_GUARD_KEYS = frozenset(GuardNote.__struct_fields__)


class Amp(Struct, forbid_unknown_fields=True):
    """``amp``: the GradScaler's scale (NaN too: validate.check_frame) and skipped steps."""

    scale: NonNegOrInf | UnsetType = UNSET
    skipped: Count | UnsetType = UNSET


class Hyperparameters(Struct, kw_only=True, omit_defaults=True):
    """An optimizer record's ``hp``: its settings, each reduced over its param groups the
    way the advice reads them (``instrument/optinfo.py``), and only those it has."""

    lr: Finite | UnsetType = UNSET
    beta1: Finite | UnsetType = UNSET
    beta2: Finite | UnsetType = UNSET
    eps: Finite | UnsetType = UNSET
    weight_decay: Finite | UnsetType = UNSET
    momentum: Finite | UnsetType = UNSET
    decoupled: Finite | UnsetType = UNSET
    """1: its weight decay is applied apart from the gradient (AdamW, Lion)."""
    sample_clip: Finite | UnsetType = UNSET
    """The norm each sample's gradient is clipped to before the step (DP-SGD)."""

    def given(self) -> dict[str, float]:
        """The settings it has, by name, in field order."""
        return {k: float(v) for k in self.__struct_fields__ if (v := getattr(self, k)) is not UNSET}


OPTIMIZER_HP: tuple[str, ...] = Hyperparameters.__struct_fields__
"""Every key of an optimizer record's ``hp``: the settings (:data:`HYPERPARAMETERS`, each a
``sentinel_optimizer_hyperparameter``), ``decoupled`` and ``sample_clip``.
``instrument/optinfo.py`` writes them, ``engine/optimizer.py`` and the history read them."""


class OptimizerRecord(Struct, kw_only=True):
    """One optimizer of a stream, in a bounded form (``optim``; ``instrument/optinfo.py``)."""

    cls: Annotated[str, Meta(min_length=1, max_length=64)] = msgspec.field(name="class")
    """Its class name."""
    dtype: Annotated[str, Meta(max_length=16)] = "none"
    """The lowest-precision floating dtype among its parameters (``float16``, ...; ``none``)."""
    hp: Hyperparameters = msgspec.field(default_factory=Hyperparameters)


OptimizerRecords = Annotated[list[OptimizerRecord], Meta(max_length=MAX_OPTIMIZERS)]
"""A frame's ``optim``: a stream's optimizers, in order."""


def optimizer_records(optim: Any) -> list[OptimizerRecord] | None:
    """A decoded frame's ``optim`` read through its type (both decode paths held it to it
    already; the engine's gauges and the history read it here, never by key), or None when
    it is not one."""
    try:
        return msgspec.convert(optim, OptimizerRecords)
    except msgspec.ValidationError:
        return None


class Frame(Struct, kw_only=True):
    """One report of a training process (see the module doc for every field). Fields left
    :data:`~msgspec.UNSET` are not sent."""

    v: int | UnsetType = UNSET  # encode() stamps SCHEMA_VERSION; a decoded frame without it is refused
    kind: Literal["step", "log", "bye"]
    job: Label
    run: Label
    rank: Annotated[int, Meta(ge=0)]
    world: Annotated[int, Meta(ge=1, le=MAX_WORLD)] | None | UnsetType = UNSET
    step: Count
    t: Annotated[float, Meta(ge=0, le=_FLOAT_MAX)]
    opt: StreamLabel | UnsetType = UNSET
    groups: Groups | UnsetType = UNSET
    grad_sumsq: Sums | UnsetType = UNSET
    param_sumsq: Sums | UnsetType = UNSET
    delta_sumsq: SampledSums | UnsetType = UNSET
    delta_l1: Sampled | UnsetType = UNSET
    param_l1: Sampled | UnsetType = UNSET
    trust_ratio: Sampled | UnsetType = UNSET
    shard: Literal["replicated", "sharded"] | UnsetType = UNSET
    ddp: bool | UnsetType = UNSET
    clip_norm: NonNegOrInf | UnsetType = UNSET  # NaN too (validate.check_frame)
    clip_max: NonNegOrInf | UnsetType = UNSET  # inf: the norm taken, nothing clipped
    grad_l1: NonNegOrInf | UnsetType = UNSET  # NaN too (validate.check_frame)
    grad_count: FiniteNonNeg | UnsetType = UNSET
    sat: Annotated[list[FiniteNonNeg], Meta(min_length=2, max_length=2)] | UnsetType = UNSET  # [above, total]
    opt_health: dict[str, list[float]] | UnsetType = UNSET
    lr: Annotated[list[Finite], Meta(max_length=MAX_PARAM_GROUPS)] | UnsetType = UNSET
    lr_peak: Annotated[list[float], Meta(max_length=MAX_PARAM_GROUPS)] | UnsetType = UNSET
    step_seconds: FiniteNonNeg | UnsetType = UNSET
    busy_seconds: FiniteNonNeg | UnsetType = UNSET
    state_bytes: Annotated[dict[ShortKey, Annotated[int, Meta(ge=0)]], Meta(max_length=MAX_STATE_KEYS)] | UnsetType = UNSET
    param_bytes: FiniteNonNeg | UnsetType = UNSET
    mem: Annotated[dict[ShortKey, FiniteNonNeg], Meta(max_length=32)] | UnsetType = UNSET
    optim: OptimizerRecords | UnsetType = UNSET
    total_steps: int | UnsetType = UNSET
    env: dict[str, str] | UnsetType = UNSET
    amp: Amp | UnsetType = UNSET
    scalars: Annotated[dict[ScalarName, float], Meta(max_length=32)] | UnsetType = UNSET
    errors: Count | UnsetType = UNSET
    scalars_dropped: int | UnsetType = UNSET
    dropped: Count | UnsetType = UNSET
    beat: Count | UnsetType = UNSET
    short_batch: Annotated[list[Count], Meta(min_length=2, max_length=2)] | UnsetType = UNSET
    skipped_nonfinite: Count | UnsetType = UNSET
    no_gradient: Count | UnsetType = UNSET
    not_reset: Count | UnsetType = UNSET
    rewrite: Rewrite | UnsetType = UNSET
    guard: GuardNote | UnsetType = UNSET
    tags: Tags | UnsetType = UNSET
    cmd: Annotated[str, Meta(max_length=1000)] | UnsetType = UNSET
    reply: Text200 | UnsetType = UNSET
    where: Text200 | UnsetType = UNSET
    exc: Text200 | UnsetType = UNSET
    status: Annotated[int, Meta(ge=-1, le=255)] | UnsetType = UNSET
    thread: Annotated[str, Meta(max_length=64)] | UnsetType = UNSET


def starts_over(step: int, last: int | None) -> bool:
    """Whether a step frame at ``step``, from a stream whose last step frame was at ``last``
    (None: none yet), begins that stream's training again: a monitor counts from step 1,
    so a new model and optimizer in the same process (the next fold of a k-fold loop, a
    notebook cell run again, a script's second experiment) or a process started again from
    scratch under the same name. The engine's series and alerts of the rank, and the
    history's run row, start over there; a restart from a checkpoint (its step goes on
    from the checkpoint's) does not."""
    return step == 1 and last is not None and last >= 1


_encoder = msgspec.msgpack.Encoder()
_strict = msgspec.msgpack.Decoder(Frame)
_plain = msgspec.msgpack.Decoder(dict[str, Any])


def encode(frame: Frame | dict[str, Any]) -> bytes:
    """Encode one frame (a :class:`Frame`, or a map of its fields: the version is added).

    Raises:
        FrameError: the encoded frame exceeds :data:`MAX_FRAME_BYTES`.
    """
    if isinstance(frame, Frame):
        if frame.v is UNSET:
            frame.v = SCHEMA_VERSION
        data = _encoder.encode(frame)
    else:
        data = _encoder.encode({"v": SCHEMA_VERSION, **frame})
    if len(data) > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    return data


def decode_strict(data: bytes) -> Frame:
    """Decode a frame that holds to every type and constraint of :class:`Frame` (the fast
    path; the engine checks the rest, the caps and what ties fields together).

    Raises:
        msgspec.DecodeError: anything else (``msgspec.ValidationError`` is one).
    """
    return _strict.decode(data)


_REQUIRED: dict[str, type | tuple[type, ...]] = {"kind": str, "run": str, "job": str, "rank": int, "step": int, "t": (int, float)}


def decode(data: bytes) -> dict[str, Any]:
    """Decode one frame into a map and check the fields that identify it (``kind``, ``job``,
    ``run``, ``rank``, ``step``, ``t``); the engine checks the rest field by field
    (:mod:`sentinel.engine.validate`).

    Raises:
        FrameError: the bytes are not a frame of an accepted schema version.
    """
    if len(data) > MAX_FRAME_BYTES:
        raise FrameError("oversized frame")
    try:
        frame = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types
        raise FrameError(f"malformed frame: {type(exc).__name__}") from None
    if not isinstance(frame, dict):
        raise FrameError("frame is not a map")
    if type(frame.get("v")) is not int or frame["v"] not in ACCEPTED_VERSIONS:
        raise FrameError(f"unsupported schema version {frame.get('v')!r}")
    for key, typ in _REQUIRED.items():
        if not isinstance(frame.get(key), typ) or isinstance(frame.get(key), bool):
            raise FrameError(f"field {key!r} missing or of the wrong type")
    return frame


def as_map(frame: Frame) -> dict[str, Any]:
    """A decoded :class:`Frame` as the map the engine ingests, as :func:`decode` would give
    it: the fields that were sent (and ``opt``), ``amp`` and ``guard`` as maps."""
    out: dict[str, Any] = msgspec.to_builtins(frame)
    guard = out.get("guard")
    if guard is not None:
        guard["groups"] = list(guard["groups"])
    return out


# -- the engine's replies to a training process ----------------------------------------------


class Ready(Struct, tag="ready", tag_field="kind"):
    """The hello of an engine process: where its metrics are served."""

    url: str


class Alert(Struct, tag="alert", tag_field="kind", kw_only=True):
    """An alert's change of state, as ``on_alert`` callbacks get it (the fields of
    :meth:`sentinel.rules.alert.Transition.to_json`, ``evidence`` when a capture was written)."""

    alertname: str
    severity: str
    state_from: str
    state_to: str
    job: str
    run: str
    ranks: list[int]
    groups: list[str]
    step: int
    time: float
    value: float | None
    threshold: float | None
    summary: str
    causes: list[str]
    checks: list[str]
    runbook: str
    notify: bool = True
    started_step: int = 0
    started_at: float = 0.0
    optimizers: list[str] = msgspec.field(default_factory=list)  # the streams, in a process with several
    ended: bool = False  # resolved because its ranks ended while it fired: nothing recovered
    evidence: str | UnsetType = UNSET


class Stop(Struct, tag="stop", tag_field="kind", kw_only=True):
    """The stop action: every rank of the run saves and exits."""

    job: str
    run: str
    reason: str = "sentinel stop action"


class Arm(Struct, tag="arm", tag_field="kind", kw_only=True):
    """The capture action: ``rank`` (every rank when None) holds its last ``steps`` inputs."""

    job: str | None = None
    run: str | None = None
    rank: int | None = None
    steps: int = 4  # the training side bounds it (instrument/capture.py)


class Capture(Struct, tag="capture", tag_field="kind", kw_only=True):
    """The capture action: the ranks write the inputs they hold of ``step`` into ``folder``."""

    job: str
    run: str
    ranks: list[int]
    step: int
    alert_step: int
    alertname: str
    folder: str
    max_bytes: int


Message = Ready | Alert | Stop | Arm | Capture
_messages = msgspec.msgpack.Decoder(Message)


def encode_message(msg: Message | dict[str, Any]) -> bytes:
    """Encode one reply, checked against its type (a map is converted first).

    Raises:
        FrameError: a map that is no message of this schema.
    """
    if isinstance(msg, dict):
        try:
            msg = msgspec.convert(msg, Message)  # type: ignore[arg-type]
        except msgspec.ValidationError as exc:
            raise FrameError(f"not a reply of this schema: {exc}") from None
    return _encoder.encode(msg)


def decode_message(data: bytes) -> dict[str, Any] | None:
    """A reply as a map (``kind`` and the fields its type declares), or None when the bytes
    are no message of this schema (dropped: a training process acts on nothing unchecked)."""
    try:
        msg = _messages.decode(data)
    except msgspec.DecodeError:
        return None
    out: dict[str, Any] = msgspec.to_builtins(msg)
    return out
