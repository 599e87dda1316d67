"""Every exported metric: its type, help text and extra labels. Names are a contract.

All series carry ``job``, ``run`` and ``rank`` besides the extra labels listed here. In a
process that steps several optimizers (a GAN's two), each optimizer is its own stream and
every series of a stream carries ``optimizer`` too: ``"0"``, ``"1"``, ... in the order their
monitors were made (the optimizer records say each one's ``class``).
Counter names end in ``_total`` (the exporter strips it for prometheus_client).
"""

from __future__ import annotations

from typing import NamedTuple


class Spec(NamedTuple):
    kind: str  # "gauge" | "counter"
    help: str
    labels: tuple[str, ...] = ()


G, C = "gauge", "counter"

CATALOG: dict[str, Spec] = {
    "sentinel_loss": Spec(
        G, "Training loss as passed to Monitor.log (the step's mean), or captured at backward() (unscaled)."),
    "sentinel_scalar": Spec(G, "Other scalars passed to Monitor.log, by name (the step's mean).", ("name",)),
    "sentinel_scalars_dropped_total": Spec(
        C, "Values passed to Monitor.log that were dropped: not a real number, a bad name, or past the name cap."),
    "sentinel_grad_norm": Spec(
        G, "Global L2 norm of the gradients at the optimizer step, every step: torch.nn.utils.get_total_norm "
           "of the gradients the step applies (after clipping; sharded runs: assembled over the ranks)."),
    "sentinel_group_grad_norm": Spec(G, "L2 norm of the gradients of one parameter group.", ("group",)),
    "sentinel_grad_norm_preclip": Spec(
        G, "Global L2 norm of the gradients as clip_grad_norm_ computed it, before clipping."),
    "sentinel_grad_clip_max_norm": Spec(G, "The max_norm passed to clip_grad_norm_."),
    "sentinel_learning_rate_vanished_steps": Spec(
        G, "Steps since the learning rate fell below a millionth of its peak (every group's), while it stays "
           "there; 0 once it is back."),
    "sentinel_steps_without_gradient": Spec(
        G, "Steps in a row at which an optimizer stepped and none of its parameters that require a gradient "
           "had one (0 when gradients came back; written only around such steps)."),
    "sentinel_steps_without_grad_reset": Spec(
        G, "Steps in a row whose gradients began from the last step's: nothing reset them (zero_grad()) between "
           "the two steps, so each step applied the sum of the gradients since the first (0 when a reset came "
           "back; written only around such steps)."),
    "sentinel_grad_clipped_steps_total": Spec(C, "Steps whose pre-clip gradient norm exceeded max_norm."),
    "sentinel_local_grad_norm": Spec(
        G, "L2 norm of this rank's shard of the gradients (sharded runs; not the model's norm)."),
    "sentinel_local_group_grad_norm": Spec(
        G, "L2 norm of this rank's shard of one group's gradients (sharded runs).", ("group",)),
    "sentinel_shard_steps_incomplete_total": Spec(
        C, "Steps of a sharded run whose global norm could not be assembled: some rank's frame never came."),
    "sentinel_param_norm": Spec(G, "Global L2 norm of the parameters (every update_every steps)."),
    "sentinel_group_param_norm": Spec(G, "L2 norm of the parameters of one group.", ("group",)),
    "sentinel_update_ratio": Spec(G, "Update ratio ||dw||/||w|| over the sampled groups (0-1 scale)."),
    "sentinel_group_update_ratio": Spec(
        G, "Update ratio ||dw||/||w|| of one group (groups with ||w|| = 0 are skipped).", ("group",)),
    "sentinel_update_norm": Spec(G, "Update size ||dw|| (L2, absolute) over the sampled groups."),
    "sentinel_group_update_norm": Spec(G, "Update size ||dw|| (L2, absolute) of one group.", ("group",)),
    "sentinel_update_mean_abs_ratio": Spec(
        G, "Update ratio UAR = mean|dw| / mean|w| (mean absolute values) over the sampled groups (0-1 scale)."),
    "sentinel_group_update_mean_abs_ratio": Spec(G, "UAR = mean|dw| / mean|w| of one group.", ("group",)),
    "sentinel_optimizer_state_bytes": Spec(
        G, "Bytes of optimizer state by state key (exp_avg, momentum_buffer, row_var, ... at their real, "
           "factored sizes; the step counter is left out), this rank's (its shards under FSDP2); past 63 keys "
           "the rest as state=\"other\".", ("state",)),
    "sentinel_model_optimizer_state_bytes": Spec(
        G, "Sharded runs (FSDP2): the whole model's optimizer state, the ranks' shards added up (written "
           "under every rank's labels, like the norms).", ("state",)),
    "sentinel_param_bytes": Spec(G, "Bytes of the watched parameters this rank holds (its shards under FSDP2)."),
    "sentinel_optimizer_state_param_ratio": Spec(G, "Optimizer state bytes divided by parameter bytes (2 for Adam)."),
    "sentinel_nonfinite_detected": Spec(G, "1 when the last report of this source held a NaN or Inf, else 0.",
                               ("source",)),
    "sentinel_nonfinite_total": Spec(
        C, "Steps at which the loss, a gradient or a parameter was NaN or Inf, and for the loss also the "
           "backward() passes with a NaN or Inf loss whose step the script skipped (a counter: a NaN between two "
           "scrapes is still seen).",
                                     ("source",)),
    "sentinel_step": Spec(G, "Completed optimizer steps (the step of the latest report)."),
    "sentinel_steps_total": Spec(C, "Optimizer steps completed."),
    "sentinel_step_duration_seconds": Spec(G, "Wall time of the last training step."),
    "sentinel_last_step_timestamp_seconds": Spec(G, "Unix time of the last completed step."),
    "sentinel_last_heartbeat_timestamp_seconds": Spec(
        G, "Unix time of the rank's last heartbeat: evaluation forwards (eval() mode or no_grad), DataLoader "
           "batches drawn with gradients off or Monitor.heartbeat() calls while it took no step, sent at most every heartbeat_seconds (20 s by default). "
           "TrainingStalled counts a rank's silence from the later of its last step and the latest heartbeat of any "
           "rank of its run."),
    "sentinel_last_wait_timestamp_seconds": Spec(
        G, "Unix time of the rank's last heartbeat sent while its process waited for work rather than did any "
           "(a Jupyter kernel between cells): the status page shows such a rank as waiting, not evaluating."),
    "sentinel_step_busy_seconds": Spec(
        G, "Time of the last step spent before the gradient sync: data loading plus forward."),
    "sentinel_rank_grad_norm_deviation": Spec(
        G, "DDP: relative distance of this rank's grad norm from the median over ranks at the same step."),
    "sentinel_rank_step_time_ratio": Spec(
        G, "This rank's median busy time over the median of the other ranks' (a straggler reads > 1)."),
    "sentinel_exit_status": Spec(
        G, "Exit status of a rank that ended without finishing: the code, 128+N for signal N, "
           "-1 when its process vanished, -2 when its training thread ended on an exception and the "
           "process went on; 0 once it reports again."),
    "sentinel_learning_rate": Spec(G, "Learning rate per optimizer param group (the first 256).", ("param_group",)),
    "sentinel_learning_rate_schedule_ratio": Spec(
        G, "Learning rate over its peak (the highest seen, or the scheduler's initial/max lr), "
           "the largest over param groups: 1 for a constant lr, near 0 late in a decay or early in a warmup."),
    "sentinel_gradient_variance_ratio": Spec(G, "GVR: var/mean^2 of the last 50 global grad norms."),
    "sentinel_gradient_snr": Spec(
        G, "Gradient signal-to-noise: mean(|g|)/std(|g|) over all elements, every health_every steps (from the "
           "L1 sums read in the norms' pass)."),
    "sentinel_optimizer_state_saturation_ratio": Spec(
        G, "Fraction of sampled Adam exp_avg_sq entries above the saturation threshold (1e-3; Adam-like "
           "optimizers only)."),
    "sentinel_cuda_memory_allocated_bytes": Spec(G, "CUDA memory allocated by tensors."),
    "sentinel_cuda_memory_reserved_bytes": Spec(G, "CUDA memory reserved by the caching allocator."),
    "sentinel_cuda_memory_peak_bytes": Spec(G, "Peak CUDA memory allocated by tensors."),
    "sentinel_cuda_memory_total_bytes": Spec(G, "Total memory of the CUDA devices in use."),
    "sentinel_cuda_alloc_retries_total": Spec(C, "CUDA allocations retried after freeing cached blocks."),
    "sentinel_cuda_ooms_total": Spec(C, "CUDA out-of-memory errors raised by the allocator."),
    "sentinel_host_memory_rss_bytes": Spec(G, "Resident memory of the training process."),
    "sentinel_memory_capacity_bytes": Spec(
        G, "Memory the OOM rule compares usage to: CUDA total, else the host/cgroup limit."),
    "sentinel_memory_used_bytes": Spec(
        G, "Memory the OOM rule watches: CUDA reserved, else the host RSS."),
    "sentinel_environment_info": Spec(
        G, "1, labelled with what the rank runs on: torch, CUDA, cuDNN and NCCL versions, GPU model, "
           "TF32 and determinism flags (0 for an environment the rank no longer reports).",
        ("torch", "cuda", "cudnn", "nccl", "gpu_model", "tf32_matmul", "tf32_cudnn", "deterministic",
         "cudnn_deterministic", "cudnn_benchmark")),
    "sentinel_optimizer_info": Spec(
        G, "1 per optimizer the rank steps: its class, position and lowest parameter dtype.",
        ("class", "index", "dtype")),
    "sentinel_optimizer_hyperparameter": Spec(
        G, "An optimizer's hyperparameter (lr, beta1, beta2, eps, weight_decay, momentum), reduced over "
           "its param groups (smallest beta1/momentum/eps, largest beta2/weight_decay/lr); lr as the script set "
           "it, before any schedule, or the highest a group has been at where a schedule written by hand set "
           "it higher (sentinel_lr is each step's).",
        ("class", "index", "name")),
    "sentinel_optimizer_beta1": Spec(G, "An optimizer's smallest beta1 (first-moment decay).", ("class", "index")),
    "sentinel_optimizer_beta2_memory_ratio": Spec(
        G, "Second-moment memory 1/(1-beta2) over the run's planned steps (when given).", ("class", "index")),
    "sentinel_optimizer_fp16_eps": Spec(
        G, "eps of an optimizer with fp16 parameters (so fp16 state).", ("class", "index")),
    "sentinel_optimizer_decoupled_weight_decay": Spec(
        G, "Largest weight decay of an AdamW-style (decoupled) optimizer.", ("class", "index")),
    "sentinel_optimizer_sgd_clip_max_norm": Spec(
        G, "An SGD-family optimizer: the max_norm its gradients were last clipped to, else the bound each "
           "sample's gradient is clipped to (differentially private SGD); 0: never clipped.",
        ("class", "index")),
    "sentinel_optimizer_adaptive": Spec(
        G, "1 when every optimizer of the stream scales each update by its gradients' own size (Adam and its "
           "kin, RMSprop, Adagrad, Adadelta, Rprop, Adafactor, Lion, LAMB, Sophia): a large but steady gradient "
           "norm does not make its updates large; 0 otherwise (SGD, LBFGS)."),
    "sentinel_optimizer_health_ratio": Spec(
        G, "A sampled health figure of the optimizer (0-1): adafactor_saturation (second moment above the "
           "threshold), lion_sign_agreement (gradient sign = momentum sign), sophia_clip_fraction "
           "(steps clipped at rho).", ("figure",)),
    "sentinel_optimizer_hessian_mean": Spec(G, "Sophia: mean of the sampled Hessian-diagonal estimate."),
    "sentinel_trust_ratio": Spec(G, "LAMB: mean trust ratio ||w||/||update|| over the groups."),
    "sentinel_group_trust_ratio": Spec(G, "LAMB: mean trust ratio of one group's parameters.", ("group",)),
    "sentinel_cuda_ooms_new": Spec(G, "CUDA out-of-memory errors since the previous memory report."),
    "sentinel_cuda_alloc_retries_new": Spec(G, "CUDA allocation retries since the previous memory report."),
    "sentinel_amp_loss_scale": Spec(G, "AMP GradScaler loss scale."),
    "sentinel_guard_skipped_total": Spec(
        C, "Optimizer steps the step guard kept out of the weights, by reason (nonfinite, spike).", ("reason",)),
    "sentinel_guard_consecutive_skips": Spec(
        G, "Steps the step guard skipped in a row, at a step it judged (0: applied after skips)."),
    "sentinel_guard_exhausted": Spec(
        G, "1 where the step guard reached max_consecutive (the run halted or steps were let through)."),
    "sentinel_guard_skip_run_length": Spec(
        G, "Steps skipped in a row in the step guard's latest run of skips (kept after the run ends)."),
    "sentinel_guard_exhausted_total": Spec(
        C, "Steps the step guard judged at max_consecutive: the one that halted the run, or each one let through."),
    "sentinel_amp_skipped_steps_total": Spec(C, "Optimizer steps skipped by GradScaler for inf/NaN grads."),
    "sentinel_instrument_errors_total": Spec(C, "Exceptions caught inside sentinel's training hooks."),
    "sentinel_frames_dropped_total": Spec(C, "Frames the training process could not deliver."),
}

GPU_CATALOG: dict[str, Spec] = {  # node-level: labelled gpu and UUID (as dcgm-exporter), not job/run/rank
    "sentinel_gpu_monitoring_up": Spec(G, "1 when NVML is available and polled, else 0."),
    "sentinel_gpu_info": Spec(G, "1, labelled with the GPU's model name (NVML).", ("model",)),
    "sentinel_gpu_utilization_ratio": Spec(G, "GPU busy fraction over the last sample period (NVML)."),
    "sentinel_gpu_memory_used_bytes": Spec(G, "GPU memory in use, all processes (NVML)."),
    "sentinel_gpu_memory_total_bytes": Spec(G, "GPU memory in total (NVML)."),
    "sentinel_gpu_temperature_celsius": Spec(G, "GPU core temperature."),
    "sentinel_gpu_power_watts": Spec(G, "GPU board power draw."),
    "sentinel_gpu_clock_throttled": Spec(G, "1 while clocks are held down for this reason.", ("reason",)),
    "sentinel_gpu_ecc_errors_total": Spec(C, "ECC errors since the driver loaded, by type.", ("type",)),
    "sentinel_gpu_xid_errors_total": Spec(C, "XID critical error events seen."),
    "sentinel_gpu_last_xid": Spec(G, "Code of the last XID error (see NVIDIA's XID table)."),
    "sentinel_gpu_xid_code": Spec(G, "Code of the last XID error since the previous poll, 0 when none."),
    "sentinel_gpu_ecc_uncorrected_new": Spec(G, "Uncorrected ECC errors since the previous poll."),
}

DAEMON_CATALOG: dict[str, Spec] = {
    "sentinel_daemon_frames_received_total": Spec(C, "Frames received by the engine."),
    "sentinel_daemon_frames_malformed_total": Spec(
        C, "Frames the engine rejected whole (undecodable, off-schema, out of range or over a limit); "
           "nothing of them was written."),
    "sentinel_daemon_up": Spec(G, "1 while the engine runs."),
    "sentinel_run_info": Spec(G, "1 per run, labelled with its tags (sentinel.watch(tags=...), sentinel run --tag; "
                                 "at most 16)."),
    "sentinel_history_up": Spec(G, "1 while run history is written to its SQLite file, 0 with no history."),
    "sentinel_history_degraded_total": Spec(C, "Times the history file could not be used (corrupt, full, "
                                               "unreadable, or locked past history.retry_seconds) and history "
                                               "was switched off."),
    "sentinel_history_dropped_total": Spec(C, "Frames and transitions not written to history (the oldest, pushed "
                                              "out of a full queue, or no history)."),
    "sentinel_history_retries_total": Spec(C, "Attempts at a history batch that found the file locked by another "
                                              "process (the batch is kept and tried again)."),
    "sentinel_history_queue_depth": Spec(G, "Frames and transitions waiting for the history writer."),
    "sentinel_daemon_frames_refused_total": Spec(
        C, "Frames refused whole, by reason: uid (another user's), size, decode, schema, range (of the fields "
           "that identify a frame), or the limit hit (ranks, runs, series; see limits: in the config).",
        ("reason",)),
    "sentinel_daemon_frame_fields_dropped_total": Spec(
        C, "Fields taken out of frames whose other fields were kept, by field and reason (schema, range, or "
           "the limit hit: groups, scalars, series).", ("field", "reason")),
    "sentinel_daemon_frames_oversized_total": Spec(C, "Frames larger than the maximum frame size."),
    "sentinel_daemon_queue_depth": Spec(G, "Frames waiting for ingest."),
    "sentinel_daemon_frames_dropped_total": Spec(C, "Frames dropped because the ingest queue was full."),
    "sentinel_daemon_queue_capacity": Spec(G, "Frames the ingest queue holds at most; past that they are dropped."),
    "sentinel_daemon_rule_evaluations_total": Spec(C, "Rule verdicts taken (one rule judging one series)."),
    "sentinel_daemon_http_refused_total": Spec(
        C, "HTTP connections and requests refused or cut off, by reason: busy (every worker busy and the queue "
           "of accepted connections full: a 503), timeout (a client too slow with its TLS handshake, headers or "
           "reading the reply; an idle keep-alive connection closed is not counted), host (a Host name not "
           "of this machine on a loopback bind: a 403), cert (a client certificate not allowed: a 403), auth "
           "(missing or wrong basic auth: a 401).", ("reason",)),
    "sentinel_daemon_resident_memory_bytes": Spec(G, "Resident memory (RSS) of the process running the engine."),
    "sentinel_engine_restarts_total": Spec(
        C, "Times the training process found its embedded engine process dead and started it again."),
    "sentinel_alert_firing": Spec(G, "1 for each alert that is firing.", ("alertname", "severity")),
    "sentinel_notifications_total": Spec(
        C, "Alert notifications by route and outcome (sent, failed attempt, suppressed by cooldown, expired).",
        ("route", "outcome")),
    "sentinel_captures_total": Spec(
        C, "Evidence captures of alerts that actions.capture_on names, by outcome (written, failed).",
        ("outcome",)),
    "sentinel_outbox_depth": Spec(G, "Notifications stored in the outbox and not yet delivered."),
    "sentinel_outbox_oldest_age_seconds": Spec(G, "Age of the oldest undelivered notification (0 when none)."),
    "sentinel_outbox_degraded_total": Spec(C, "Times the outbox file could not be used and delivery went on from memory."),
    "sentinel_outbox_durable": Spec(G, "1 while the outbox is a file (survives a restart), 0 in memory."),
}


def spec(name: str) -> Spec:
    """The spec of a metric; unknown names export as untyped-looking gauges."""
    return (CATALOG.get(name) or GPU_CATALOG.get(name) or DAEMON_CATALOG.get(name)
            or Spec(G, f"Sentinel metric {name}."))
