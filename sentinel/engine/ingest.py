"""Turns decoded frames into series in the store. Norms are taken here, where data meets."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sentinel.engine.clip import ingest_clip
from sentinel.engine.crossrank import CrossRank
from sentinel.engine.derived import GroupLabels, GvrTracker, group_norms, write_update_ratios
from sentinel.engine.derived import sqrt as _sqrt
from sentinel.engine.environment import env_labels
from sentinel.engine.guard import ingest_guard, kept_out
from sentinel.engine.magnitude import write_mean_abs_ratios, write_update_norms
from sentinel.engine.optimizer import ingest_health, ingest_optimizers
from sentinel.engine.schedule import SchedulePeaks
from sentinel.engine.shards import ShardAssembler
from sentinel.rules.ingested import Ingested
from sentinel.store import Labels, Plan, PlanKey, Store, labels_of

ENV_INFO = "sentinel_environment_info"
VANISHED = 1e-6
"""A schedule fraction (lr over its peak) below which the weights no longer move."""


class _Rank:
    """What the ingest keeps of one rank (stream) from frame to frame: its labels, the
    series its gauges go to (:class:`~sentinel.store.Plan`), the label sets of its groups,
    and which of its counters exist."""

    __slots__ = ("base", "plan", "rows", "groups", "group_labels", "totals", "nonfinite", "amp_counted", "step",
                 "loss_seen", "loss_first", "loss_start", "game")

    def __init__(self, base: Labels) -> None:
        self.base = base
        self.plan = Plan(base)
        self.rows: list[tuple[PlanKey, float]] = []
        self.groups: list[str] | None = None
        self.group_labels: tuple[Labels, ...] = ()
        self.totals: dict[str, Any] = {}  # the last total written per counter
        self.nonfinite: dict[str, Labels] = {}  # source -> labels of its counter, once it exists
        self.amp_counted = False
        self.step: int | None = None  # the last step frame's step
        self.loss_seen = False  # a sentinel_loss series of this stream exists
        self.loss_first: list[float] = []  # its first 3 finite losses (since the script last set its weights)
        self.loss_start: float | None = None  # their median, once there are 3
        self.game = False  # the stream reported an objective: a player in a game (instrument/games.py)

    def add(self, metric: str, value: float, /, **extra: str) -> None:
        """Queue a gauge sample of this rank for the frame's one write. ``metric`` is
        positional-only, so a ``name=`` label (``sentinel_scalar``) does not clash with it."""
        self.rows.append(((metric, *extra.items()) if extra else metric, value))


class Ingestor:
    """Writes one frame's values into the store and reports what the rules need.

    Args:
        store: where series go.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.shards = ShardAssembler(store)
        self.crossrank = CrossRank(store)
        self._gvr = GvrTracker()
        self._lr_last: dict[Labels, list[float]] = {}
        self.lr_change_step: dict[Labels, int] = {}
        self.lr_restart_step: dict[Labels, int] = {}
        self.rewrite_step: dict[Labels, int] = {}
        self._scale_last: dict[Labels, float] = {}
        self._ranks: dict[tuple[str, str, int, str], _Rank] = {}
        self._group_labels = GroupLabels()
        self.schedule = SchedulePeaks()
        self._sched_last: dict[Labels, float] = {}
        self._sched_in: dict[Labels, tuple[list[Any], Any, float | None]] = {}  # the last report's lr, lr_peak, fraction
        self._env: dict[Labels, Labels] = {}  # the info series of each rank
        self._vanished: dict[Labels, int] = {}  # the step each rank's lr fell below VANISHED of its peak

    def ingest(self, f: dict[str, Any]) -> Ingested:
        """Record a decoded frame.

        Returns:
            What the rules need of it (:class:`Ingested`; ``written`` is the engine's to fill).
        """
        r = self._rank(f["job"], f["run"], f["rank"], f.get("opt", ""))
        base = r.base
        step, t = f["step"], float(f["t"])
        ctx = Ingested(lr_change_step=self.lr_change_step.get(base), lr_restart_step=self.lr_restart_step.get(base),
                       lr_fraction=self.schedule.fraction(base), loss_start=r.loss_start, game=r.game)
        r.rows = []  # a fresh queue: a frame that failed halfway leaves nothing behind
        add = r.add
        if "errors" in f:
            self._total(r, "sentinel_instrument_errors_total", f["errors"])
        if "dropped" in f:
            self._total(r, "sentinel_frames_dropped_total", f["dropped"])
        if "scalars_dropped" in f:
            self._total(r, "sentinel_scalars_dropped_total", f["scalars_dropped"])
        kind = f["kind"]
        amp = f.get("amp")
        if isinstance(amp, dict) and isinstance(amp.get("scale"), (int, float)):
            self._amp(float(amp["scale"]), r)
        tags = f.get("tags")
        info: Labels | None = None
        if isinstance(tags, dict) and kind in ("step", "log"):  # checked by engine/validate.py
            info = labels_of(job=f["job"], run=f["run"], **tags)
            if self.store.last("sentinel_run_info", info) is None:
                self._drop_info(f["job"], f["run"])  # one info series per run: the latest tags
        if kind == "step":
            r.step = step
            self._step(f, r, ctx)
        elif "beat" in f:  # working between steps (an evaluation): TrainingStalled counts from here
            add("sentinel_last_heartbeat_timestamp_seconds", t)
            if f["beat"] == 0:  # no work at all: a notebook's kernel waiting for its next cell
                add("sentinel_last_wait_timestamp_seconds", t)
        skipped = self._skipped(f.get("skipped_nonfinite"), r)
        if kind in ("step", "log") and isinstance(f.get("scalars"), dict):
            self._scalars(f["scalars"], r, ctx, skipped)
        if skipped:
            if "loss" not in (f.get("scalars") or ()):
                self._nonfinite("loss", True, r, skipped)
            ctx.nonfinite_groups["loss"] = []
            total = r.totals["skipped_nonfinite"]
            if isinstance(f.get("exc"), str):  # no skip: the pass was the script's last, it ended on an error
                ctx.note = f"a backward() pass had one, then the script ended on {f['exc']} before its step"
            else:
                ctx.note = (f"the script skipped its step after {total} backward() pass{'es' if total > 1 else ''} "
                            f"with a non-finite loss or gradient norm so far")
        if "guard" in f:  # the step guard's note (issue 21)
            ingest_guard(self.store, f, add, base, ctx)
        if info is not None:
            self.store.add("sentinel_run_info", info, step, t, 1.0)
        self.store.add_planned(r.plan, r.rows, step, t)
        if ctx.nonfinite_groups:  # non-finite: did the step guard keep this step out? (issue 21)
            ctx.guard_skipped = kept_out(self.store, base, step)
        return ctx

    def forget(self, job: str, run: str) -> None:
        """Drop what is kept per rank of a run that ended (the label caches are bounded
        on their own)."""
        pairs = (("job", job), ("run", run))
        for table in (self._lr_last, self.lr_change_step, self.lr_restart_step, self.rewrite_step, self._scale_last,
                      self._vanished):
            for base in [b for b in table if all(p in b for p in pairs)]:
                del table[base]
        gone = [b for b in self.schedule.keys() if isinstance(b, tuple) and all(p in b for p in pairs)]
        self.schedule.forget(gone)
        for b in gone:
            self._sched_last.pop(b, None)  # type: ignore[arg-type]
            self._sched_in.pop(b, None)  # type: ignore[arg-type]
        for key in [k for k in self._ranks if k[:2] == (job, run)]:
            del self._ranks[key]  # a run started again under the same name gets its series and counters back

    def last_step(self, job: str, run: str, rank: int, opt: str = "") -> int | None:
        """The step of the stream's last step frame (None: none yet)."""
        r = self._ranks.get((job, run, rank, opt))
        return r.step if r is not None else None

    def forget_rank(self, job: str, run: str, rank: int) -> None:
        """Drop what is kept of every stream of one rank (its training started over)."""
        for key in [k for k in self._ranks if k[:3] == (job, run, rank)]:
            base = self._ranks.pop(key).base
            for table in (self._lr_last, self.lr_change_step, self.lr_restart_step, self.rewrite_step,
                          self._scale_last, self._sched_last, self._sched_in, self._env, self._vanished):
                table.pop(base, None)
            self.schedule.forget([base])
            self._gvr.forget(base)

    def _drop_info(self, job: str, run: str) -> None:
        for labels in self.store.labelsets("sentinel_run_info"):
            d = dict(labels)
            if d.get("job") == job and d.get("run") == run:
                self.store.remove("sentinel_run_info", labels)

    def _rank(self, job: str, run: str, rank: int, opt: str = "") -> _Rank:
        """What is kept of a rank, with its ``job, run, rank`` labels (and ``optimizer`` for
        a stream of a process with several optimizers)."""
        rk = (job, run, rank, opt)
        r = self._ranks.get(rk)
        if r is None:
            if len(self._ranks) > 10_000:
                self._ranks.clear()
            r = self._ranks[rk] = _Rank(labels_of(job=job, run=run, rank=rank, optimizer=opt) if opt
                                        else labels_of(job=job, run=run, rank=rank))
        return r

    def _base(self, job: str, run: str, rank: int, opt: str = "") -> Labels:
        return self._rank(job, run, rank, opt).base

    def _group_labels_of(self, r: _Rank, groups: list[str]) -> tuple[Labels, ...]:
        """The rank's group label sets (:class:`GroupLabels`), looked up only when its groups
        changed: one comparison of the lists, not a hash of every name."""
        if groups != r.groups:
            r.group_labels = self._group_labels(r.base, groups)
            r.groups = list(groups)
        return r.group_labels

    def _total(self, r: _Rank, name: str, total: Any) -> None:
        """Set a counter from the sender's running total, only when it moved (most stay 0)."""
        if r.totals.get(name) != total:
            r.totals[name] = total
            self.store.set_counter(name, r.base, float(total))

    def _nonfinite(self, source: str, bad: bool, r: _Rank, times: int = 1) -> None:
        r.add("sentinel_nonfinite_detected", 1.0 if bad else 0.0, source=source)
        # inc by 0 too, so the counter exists (at 0) from the first report
        labels = r.nonfinite.get(source)
        if labels is None or bad:
            if labels is None:
                labels = r.nonfinite[source] = tuple(sorted(r.base + (("source", source),)))
            self.store.inc("sentinel_nonfinite_total", labels, float(times if bad else 0))

    @staticmethod
    def _skipped(total: Any, r: _Rank) -> int:
        """How many more times than the stream's last frame said the script threw away a
        non-finite loss's gradients and took no step (the frame's ``skipped_nonfinite``, a
        running count; a smaller one is a process that started again)."""
        if not isinstance(total, int) or isinstance(total, bool):
            return 0
        last = r.totals.get("skipped_nonfinite", 0)
        r.totals["skipped_nonfinite"] = total
        return total - last if total >= last else total

    def _scalars(self, scalars: dict[str, Any], r: _Rank, ctx: Ingested, skipped: int = 0) -> None:
        add = r.add
        for name, value in scalars.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            if name == "loss":
                add("sentinel_loss", float(value))
                r.loss_seen = True
                bad = not math.isfinite(value)
                if r.loss_start is None and not bad:
                    first = r.loss_first
                    first.append(float(value))
                    if len(first) == 3:
                        ctx.loss_start = r.loss_start = sorted(first)[1]
                self._nonfinite("loss", bad or skipped > 0, r, int(bad) + skipped)
                if bad:
                    ctx.nonfinite_groups["loss"] = []
            else:  # the engine's admission caps the names (engine/validate.py)
                add("sentinel_scalar", float(value), name=str(name))
                if name == "objective":
                    ctx.game = r.game = True
                if name == "objective" and r.loss_seen:
                    # the stream's value turned out to be no loss (a GAN's discriminator steps before the
                    # generator's step shows the game; an environment library imported late): its first
                    # steps' loss series goes, so no stale sentinel_loss stays beside the objective
                    r.loss_seen = False
                    r.loss_first, r.loss_start = [], None
                    self.store.remove("sentinel_loss", r.base)

    def _step(self, f: dict[str, Any], r: _Rank, ctx: Ingested) -> None:
        base, add = r.base, r.add
        f = self.shards.route(f, add, base, ctx)  # sharded: local norms, global assembly (shards.py)
        ingest_clip(f, add, self.store, base)  # the pre-clip grad norm (clip.py)
        step, t = f["step"], float(f["t"])
        store = self.store
        add("sentinel_step", float(step))
        add("sentinel_last_step_timestamp_seconds", t)
        store.set_counter("sentinel_steps_total", base, float(step))
        if isinstance(f.get("step_seconds"), (int, float)):
            add("sentinel_step_duration_seconds", float(f["step_seconds"]))
        if isinstance(f.get("busy_seconds"), (int, float)):
            add("sentinel_step_busy_seconds", float(f["busy_seconds"]))
        groups: list[str] = f.get("groups") or []
        glabels = self._group_labels_of(r, groups)
        gsq = f.get("grad_sumsq")
        norm: float | None = None
        if gsq is not None:
            total = math.fsum(gsq)
            norm = _sqrt(total)
            add("sentinel_grad_norm", norm)
            norms, bad = group_norms(gsq, groups, total)
            store.add_row("sentinel_group_grad_norm", glabels, norms, step, t)
            self._nonfinite("grad", bool(bad) or not math.isfinite(total), r)
            if bad:
                ctx.nonfinite_groups["grad"] = bad
            if "short_batch" in f:  # a few samples' norm would stay in GVR's window for 50 steps
                ctx.short_batch = True
            elif norm > 0.0:  # a step with no gradient at all (a margin loss every sample met) has no noise
                gvr = self._gvr.push(base, norm)
                if gvr is not None:
                    add("sentinel_gradient_variance_ratio", gvr)
            if isinstance(f.get("grad_l1"), (int, float)) and f.get("grad_count"):
                n = float(f["grad_count"])
                mean_abs, mean_sq = f["grad_l1"] / n, total / n
                std = _sqrt(mean_sq - mean_abs * mean_abs)
                add("sentinel_gradient_snr", mean_abs / std if std > 0 else float("nan"))
        if "no_gradient" in f:  # steps in a row whose optimizer's parameters got no gradient
            add("sentinel_steps_without_gradient", float(f["no_gradient"]))
        if "not_reset" in f:  # steps in a row whose gradients began from the last step's (no zero_grad())
            add("sentinel_steps_without_grad_reset", float(f["not_reset"]))
        opt = f.get("opt", "")
        ctx.crossrank = self.crossrank.observe(f, lambda rank: self._base(f["job"], f["run"], rank, opt), norm)
        psq = f.get("param_sumsq")
        if psq is not None:
            ptotal = math.fsum(psq)
            add("sentinel_param_norm", _sqrt(ptotal))
            pnorms, pbad = group_norms(psq, groups, ptotal)
            store.add_row("sentinel_group_param_norm", glabels, pnorms, step, t)
            self._nonfinite("param", bool(pbad), r)
            if pbad:
                ctx.nonfinite_groups["param"] = pbad
            dsq = f.get("delta_sumsq")
            if dsq is not None:
                ratio = write_update_ratios(store, base, glabels, psq, dsq, step, t)
                if ratio is not None:
                    add("sentinel_update_ratio", ratio)
                if isinstance(dsq, list) and len(dsq) == len(groups):  # magnitude.py: ‖Δw‖ and the seed's UAR
                    unorm = write_update_norms(store, glabels, dsq, step, t)
                    if unorm is not None:
                        add("sentinel_update_norm", unorm)
                    uar = write_mean_abs_ratios(store, glabels, f.get("delta_l1"), f.get("param_l1"), step, t)
                    if uar is not None:
                        add("sentinel_update_mean_abs_ratio", uar)
        sat = f.get("sat")
        if isinstance(sat, list) and len(sat) == 2 and sat[1]:
            add("sentinel_optimizer_state_saturation_ratio", float(sat[0]) / float(sat[1]))
        self._lr(f.get("lr"), add, base, step)
        ctx.lr_change_step = self.lr_change_step.get(base)
        ctx.lr_fraction = frac = self._schedule(f, add, base, step)
        if frac is not None and frac < VANISHED:  # a millionth of its peak: the weights no longer move
            add("sentinel_learning_rate_vanished_steps", float(step - self._vanished.setdefault(base, step) + 1))
        elif self._vanished and base in self._vanished:  # back: said once
            del self._vanished[base]
            add("sentinel_learning_rate_vanished_steps", 0.0)
        if "rewrite" in f:  # weights the script set itself (a rewind, a pruning): the loss starts anew there
            self.lr_restart_step[base] = self.rewrite_step[base] = step
            r.loss_first, r.loss_start = [], None
            ctx.loss_start = None
        ctx.lr_restart_step = self.lr_restart_step.get(base)
        ctx.rewrite_step = self.rewrite_step.get(base)
        st = f.get("state_bytes")
        if isinstance(st, dict):
            for key, nbytes in st.items():
                add("sentinel_optimizer_state_bytes", float(nbytes), state=str(key))
            pb = f.get("param_bytes")
            if isinstance(pb, (int, float)) and pb > 0:
                add("sentinel_param_bytes", float(pb))
                add("sentinel_optimizer_state_param_ratio", sum(st.values()) / pb)
        mem = f.get("mem")
        if isinstance(mem, dict):
            self._memory(mem, add, base)
        if "env" in f:
            self._environment(f["env"], base, step, float(f["t"]))
        if "optim" in f:
            clip = f.get("clip_max")
            if not isinstance(clip, (int, float)):  # not clipped at this step: the last time it was
                last = store.last("sentinel_grad_clip_max_norm", base)
                clip = last[2] if last is not None else None
            ingest_optimizers(f["optim"], f.get("total_steps"), add, clip)
        trust = ingest_health(f, add)
        if trust is not None and len(trust) == len(groups):
            rows = [(ls, v) for ls, v in zip(glabels, trust) if v is not None]
            store.add_many("sentinel_group_trust_ratio", rows, step, float(f["t"]))

    def _amp(self, scale: float, r: _Rank) -> None:
        # GradScaler halves the scale exactly when it skips a step for inf/NaN grads, so each
        # decrease seen is one skipped step (frames come at least once per iteration via log)
        base = r.base
        r.add("sentinel_amp_loss_scale", scale)
        prev = self._scale_last.get(base)
        skipped = prev is not None and scale < prev
        if skipped or not r.amp_counted:  # the counter exists (at 0) from the first report
            self.store.inc("sentinel_amp_skipped_steps_total", base, float(skipped))
            r.amp_counted = True
        self._scale_last[base] = scale

    def _lr(self, lrs: Any, add: Callable[..., None], base: Labels, step: int) -> None:
        if not isinstance(lrs, list):
            return
        prev = self._lr_last.get(base)
        if prev == lrs:
            return  # unchanged: the series keeps its value (no rule reads its history)
        for i, lr in enumerate(lrs):
            add("sentinel_learning_rate", float(lr), param_group=str(i))
        if prev is not None and len(prev) == len(lrs):
            # a change of more than 10% in any group (schedulers' small steps are not changes)
            if any(abs(a - b) > 0.1 * max(abs(a), abs(b)) for a, b in zip(prev, lrs)):
                self.lr_change_step[base] = step
        self._lr_last[base] = list(lrs)

    def _environment(self, env: Any, base: Labels, step: int, t: float) -> None:
        """``sentinel_environment_info{torch,cuda,...} 1`` (environment.py); a rank whose
        environment changed (a restart under the same name) keeps only the new series."""
        labels = env_labels(base, env)
        if labels is None:
            return
        old = self._env.get(base)
        if old is not None and old != labels:
            self.store.add(ENV_INFO, old, step, t, 0.0)
        if len(self._env) > 10_000:
            self._env.clear()
        self._env[base] = labels
        self.store.add(ENV_INFO, labels, step, t, 1.0)

    def _schedule(self, f: dict[str, Any], add: Callable[..., None], base: Labels, step: int) -> float | None:
        """The lr over its peak (schedule.py); its gauge is written when it moves, and a
        warm restart of the schedule is noted at ``step``."""
        lrs: Any = f.get("lr")
        hints: Any = f.get("lr_peak")
        prev = self._sched_in.get(base)
        if prev is not None and prev[0] == lrs and prev[1] == hints and self.schedule.fraction(base) == prev[2]:
            # the rates and peaks of the last report again (the usual case between scheduler
            # steps): the same update would leave the peaks and the fraction as they are
            return prev[2]
        if not isinstance(lrs, list) or not all(isinstance(x, (int, float)) for x in lrs):
            return self.schedule.fraction(base)
        if not isinstance(hints, list) or not all(isinstance(x, (int, float)) for x in hints):
            hints = None
        frac = self.schedule.update(base, [float(x) for x in lrs], hints)
        if self.schedule.restarted:
            self.lr_restart_step[base] = step
        if frac is not None and self._sched_last.get(base) != frac:
            self._sched_last[base] = frac
            add("sentinel_learning_rate_schedule_ratio", frac)
        if len(self._sched_in) > 10_000:
            self._sched_in.clear()
        self._sched_in[base] = (list(lrs), list(hints) if isinstance(hints, list) else hints, frac)
        return frac

    def _memory(self, mem: dict[str, Any], add: Callable[..., None], base: Labels) -> None:
        gauges = {"cuda_allocated": "sentinel_cuda_memory_allocated_bytes",
                  "cuda_reserved": "sentinel_cuda_memory_reserved_bytes",
                  "cuda_peak": "sentinel_cuda_memory_peak_bytes",
                  "cuda_total": "sentinel_cuda_memory_total_bytes",
                  "host_rss": "sentinel_host_memory_rss_bytes"}
        for key, name in gauges.items():
            if isinstance(mem.get(key), (int, float)):
                add(name, float(mem[key]))
        for key, name in (("cuda_retries", "sentinel_cuda_alloc_retries_total"),
                          ("cuda_ooms", "sentinel_cuda_ooms_total")):
            if isinstance(mem.get(key), (int, float)):
                prev = self.store.counter(name, base)
                self.store.set_counter(name, base, float(mem[key]))
                # the rise since the last report, as a gauge the OOM rules read
                add(name.replace("_total", "_new"), max(0.0, float(mem[key]) - prev))
        on_cuda = bool(mem.get("cuda_total"))
        used = mem.get("cuda_reserved") if on_cuda else mem.get("host_rss")
        capacity = mem.get("capacity") or (mem.get("cuda_total") if on_cuda else mem.get("host_limit"))
        if isinstance(used, (int, float)) and isinstance(capacity, (int, float)) and capacity > 0:
            add("sentinel_memory_capacity_bytes", float(capacity))
            add("sentinel_memory_used_bytes", float(used))
