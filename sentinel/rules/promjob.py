"""Job-wide figures for clusters: Prometheus recording rules that assemble a job from the
nodes' series, and the alerting rules that need that job-wide view.

One daemon per node sees only that node's ranks. The ranks' additive quantities let
Prometheus finish the job: an FSDP job's gradient norm is the root of the sum, over every
rank of every node, of ``sentinel_local_grad_norm ^ 2`` (each rank's shard); a DDP job's
(replicated) norm is any rank's ``sentinel_grad_norm``. The slowest rank sets a synchronous
job's pace, so the job's step rate is the lowest rank's rate.

Series are named ``level:metric:operation`` (Prometheus' convention), aggregated ``by
(job, run)``; scrape the daemons with ``honor_labels: true`` so that ``job`` is Sentinel's.
``sentinel rules export --format prometheus-job`` writes ``alerts/sentinel.job.rules.yml``.
"""

from __future__ import annotations

from typing import Any

import yaml

from sentinel.rules.promexport import HEADER, RUN_HEARTBEAT_AGE

BY = "job, run, optimizer"  # a process with several optimizers: each stream is its own

RECORDING: list[dict[str, str]] = [
    # the whole model's gradient norm: sharded ranks' shards add up; replicated ranks agree
    {"record": "job_run:sentinel_grad_norm:l2",
     "expr": f"sqrt(sum by ({BY}) (sentinel_local_grad_norm ^ 2)) or max by ({BY}) (sentinel_grad_norm)"},
    {"record": "job_run_group:sentinel_grad_norm:l2",
     "expr": f"sqrt(sum by ({BY}, group) (sentinel_local_group_grad_norm ^ 2)) "
             f"or max by ({BY}, group) (sentinel_group_grad_norm)"},
    {"record": "job_run:sentinel_ranks:count", "expr": f"count by ({BY}) (sentinel_step)"},
    {"record": "job_run:sentinel_step:min", "expr": f"min by ({BY}) (sentinel_step)"},
    # the slowest rank: its labels (rank, instance) say where it runs
    {"record": "job_run:sentinel_step_duration_seconds:slowest",
     "expr": f"topk by ({BY}) (1, sentinel_step_duration_seconds)"},
    {"record": "job_run:sentinel_step_duration_seconds:median",
     "expr": f"quantile by ({BY}) (0.5, sentinel_step_duration_seconds)"},
    # a synchronous job moves at its slowest rank's pace
    {"record": "job_run:sentinel_steps:rate1m", "expr": f"min by ({BY}) (rate(sentinel_steps_total[1m]))"},
    {"record": "job_run:sentinel_nonfinite:increase5m",
     "expr": f"sum by ({BY}) (increase(sentinel_nonfinite_total[5m]))"},
]

ALERTS: list[dict[str, Any]] = [
    {"alert": "SentinelJobNonFinite", "expr": "job_run:sentinel_nonfinite:increase5m > 0",
     "labels": {"severity": "critical"},
     "annotations": {"summary": "NaN/Inf in run {{ $labels.run }} (job {{ $labels.job }}), on some node of the job",
                     "first_checks": "1. The per-node TrainingNonFinite alerts name the ranks and the first "
                                     "groups; 2. Lower the learning rate; 3. Dump the batch of that step"}},
    {"alert": "SentinelJobStraggler",
     "expr": "job_run:sentinel_step_duration_seconds:slowest > on (job, run, optimizer) group_left () "
             "(1.5 * job_run:sentinel_step_duration_seconds:median) and on (job, run, optimizer) "
             "(job_run:sentinel_ranks:count > 1)",
     "for": "5m", "labels": {"severity": "warning"},
     "annotations": {"summary": "Rank {{ $labels.rank }} of run {{ $labels.run }} ({{ $labels.instance }}) "
                                "steps 1.5x slower than the job's median rank",
                     "first_checks": "1. That node's GPU panel (throttling, temperature); 2. Its data loader "
                                     "and host load; 3. Drain the node if it stays slow"}},
    # not while a rank sends heartbeats (every 20 s while it evaluates): an evaluation is no stall
    {"alert": "SentinelJobStalled", "expr": "job_run:sentinel_steps:rate1m == 0 and job_run:sentinel_step:min > 0 "
                                            f"unless on (job, run) ({RUN_HEARTBEAT_AGE} < 120)",
     "for": "10m", "labels": {"severity": "warning"},
     "annotations": {"summary": "Run {{ $labels.run }} (job {{ $labels.job }}) made no step for 10 minutes, "
                                "on the slowest of its ranks, and none of its ranks evaluates"}},
]


def job_rules() -> dict[str, Any]:
    """The rule file: one group of recording rules, one of job-wide alerts."""
    return {"groups": [{"name": "sentinel-job-recording", "rules": [dict(r) for r in RECORDING]},
                       {"name": "sentinel-job", "rules": [dict(r) for r in ALERTS]}]}


def export_job_rules() -> str:
    """``alerts/sentinel.job.rules.yml``'s text."""
    return HEADER.replace("--format prometheus`", "--format prometheus-job`") + yaml.safe_dump(
        job_rules(), sort_keys=False, allow_unicode=True, width=120)
