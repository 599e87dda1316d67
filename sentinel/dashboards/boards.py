"""The four dashboards. Units follow the catalog's base units; threshold lines come from the
rule pack (see :mod:`sentinel.dashboards.panels`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import dashboard as dm

from sentinel.dashboards.panels import (
    GROUP,
    LEGEND,
    RANK,
    RUN,
    Panel,
    above,
    alert_annotation,
    band,
    event_annotation,
    graph,
    heatmap_panel,
    limit,
    row,
    stat_panel,
    table_panel,
    variables,
)
from sentinel.rules.config import RulePack

RATE = "$__rate_interval"
GPU_LEGEND = "{{Hostname}} GPU {{gpu}}"
GPU_NOTE = ("NVML, from the daemon's poller; labelled gpu, UUID and Hostname as dcgm-exporter's series are, "
            "so the two join on them.")


def _board(uid: str, title: str, description: str, sections: Sequence[tuple[str, Sequence[Panel]]]) -> db.Dashboard:
    d = (db.Dashboard(title).uid(uid).description(description).tags(["sentinel", "training"])
         .time("now-1h", "now").refresh("30s").timezone("browser").editable()
         .tooltip(dm.DashboardCursorSync.CROSSHAIR).variables(variables()).annotation(alert_annotation())
         .annotation(event_annotation())
         .link(db.DashboardLink("Sentinel dashboards").type(dm.DashboardLinkType.DASHBOARDS)
               .tags(["sentinel"]).as_dropdown(True).include_vars(True).keep_time(True)))
    for title_, panels in sections:
        d = d.with_row(row(title_))
        for p in panels:
            d = d.with_panel(p)
    return d


def overview(pack: RulePack) -> db.Dashboard:
    """Training overview: the run at a glance."""
    oom = limit(pack, "OOMRisk")
    return _board("sentinel-overview", "Sentinel / Training overview",
                  "Loss, gradient norm, update ratio, learning rate, throughput, alerts, memory headroom and "
                  "non-finite counts of the chosen runs. Red regions: Sentinel alerts firing.", [
        ("Now", [
            stat_panel("Step", [(f"max by (job, run) (sentinel_step{{{RANK}}})", "{{run}}")], "none"),
            stat_panel("Steps/s", [(f"sum by (job, run) (rate(sentinel_steps_total{{{RANK}}}[{RATE}])) "
                                    f"/ count by (job, run) (sentinel_step{{{RANK}}})", "{{run}}")], "none",
                       description="Optimizer steps per second (the mean over ranks)."),
            stat_panel("Firing alerts", [(f"sum(sentinel_alert_firing{{{RUN}}}) or vector(0)", "firing")], "none",
                       steps=[(None, "green"), (1, "red")]),
            stat_panel("Memory headroom", [(
                f"min by (job, run) (1 - sentinel_memory_used_bytes{{{RANK}}} "
                f"/ sentinel_memory_capacity_bytes{{{RANK}}})", "{{run}}")], "percentunit",
                description=f"1 - used/capacity of the tightest rank; OOMRisk fires at {oom:.0%} used.",
                steps=[(None, "red"), (round(1 - oom, 6), "green")]),
        ]),
        ("Training", [
            graph("Loss", [(f'sentinel_loss{{{RANK}}} or sentinel_scalar{{{RANK}, name="objective"}}',
                            LEGEND + " {{name}}")], "none",
                  description="The loss, or the objective where what backward() got is no loss to judge "
                              "(maximize=True, a coefficient's optimizer, reinforcement learning)."),
            graph("Gradient norm (pre- and post-clip)", [
                (f"sentinel_grad_norm{{{RANK}}}", LEGEND + " post-clip"),
                (f"sentinel_grad_norm_preclip{{{RANK}}}", LEGEND + " pre-clip")], "none", log=True,
                description="Pre-clip: what clip_grad_norm_ saw (only where the script clips). "
                            "Line: GradientExplosion's ceiling.",
                steps=above(pack, "GradientExplosion")),
            graph("Update ratio (UAR and L2)", [
                (f"sentinel_update_mean_abs_ratio{{{RANK}}}", LEGEND + " UAR mean|Δw|/mean|w|"),
                (f"sentinel_update_ratio{{{RANK}}}", LEGEND + " L2 ‖Δw‖/‖w‖")], "none", log=True,
                  description="Lines: UpdateRatioLow and UpdateRatioHigh, which judge UAR (the seeds state "
                              "their thresholds for it), or the L2 ratio where a run has no UAR (sharded).",
                  steps=band(pack, "UpdateRatioLow", "UpdateRatioHigh")),
            graph("Learning rate", [(f"sentinel_learning_rate{{{RANK}}}", LEGEND + " pg{{param_group}}")], "none",
                  log=True),
            graph("Steps/s", [(f"rate(sentinel_steps_total{{{RANK}}}[{RATE}])", LEGEND)], "none"),
            graph("Memory used / capacity", [(
                f"sentinel_memory_used_bytes{{{RANK}}} / sentinel_memory_capacity_bytes{{{RANK}}}", LEGEND)],
                "percentunit", description="CUDA reserved (else host RSS) over capacity. Line: OOMRisk.",
                steps=above(pack, "OOMRisk")),
            graph("Non-finite steps", [(f"increase(sentinel_nonfinite_total{{{RANK}}}[{RATE}])",
                                        LEGEND + " {{source}}")], "none",
                  description="Steps whose loss, gradients or parameters held NaN/Inf (a counter: none is "
                              "missed between scrapes)."),
            table_panel("Alerts (1 = firing, 0 = resolved)", [(
                f"max by (alertname, severity, job, run) (sentinel_alert_firing{{{RUN}}})", "")]),
        ]),
    ])


def layers(pack: RulePack) -> db.Dashboard:
    """Layers: which group is largest, smallest, or moving fastest."""
    per = f"max by (group) (sentinel_group_grad_norm{{{GROUP}}})"
    return _board("sentinel-layers", "Sentinel / Layers",
                  "Per-group (module-path prefix) gradient norm, parameter norm and update ratio, as heatmaps "
                  "and as top-k, so which layer is answered at a glance.", [
        ("Gradient norm per group", [
            heatmap_panel("Gradient norm by group", per, "none"),
            graph("Largest gradient norms (top 5)", [(f"topk(5, {per})", "{{group}}")], "none", log=True),
            graph("Smallest non-zero gradient norms (bottom 5)", [(
                f"bottomk(5, max by (group) (sentinel_group_grad_norm{{{GROUP}}} > 0))", "{{group}}")], "none",
                log=True, description="Line: GradientVanishing's floor.",
                steps=[(None, "orange"), (limit(pack, "GradientVanishing"), "green")]),
            table_panel("Groups now, largest gradient first", [(f"sort_desc({per})", "")], "none"),
        ]),
        ("Parameters and updates per group", [
            heatmap_panel("Parameter norm by group",
                          f"max by (group) (sentinel_group_param_norm{{{GROUP}}})", "none"),
            graph("Largest parameter norms (top 5)", [(
                f"topk(5, max by (group) (sentinel_group_param_norm{{{GROUP}}}))", "{{group}}")], "none"),
            heatmap_panel("Update ratio by group",
                          f"max by (group) (sentinel_group_update_ratio{{{GROUP}}})", "none"),
            graph("Largest update ratios (top 5)", [(
                f"topk(5, max by (group) (sentinel_group_update_ratio{{{GROUP}}}))", "{{group}}")], "none",
                log=True, description="Lines: UpdateRatioLow and UpdateRatioHigh.",
                steps=band(pack, "UpdateRatioLow", "UpdateRatioHigh")),
        ]),
    ])


def optimizer_memory(pack: RulePack) -> db.Dashboard:
    """Optimizer & memory: state bytes, CUDA allocator, AMP, clipping, the seeds' ratios."""
    return _board("sentinel-optimizer-memory", "Sentinel / Optimizer & memory",
                  "Optimizer state against parameter memory, CUDA memory, allocator retries, AMP loss scale and "
                  "skipped steps, clipping, and the health ratios (GVR, SNR, Adam saturation).", [
        ("Optimizer state", [
            graph("State bytes by key vs parameter bytes", [
                (f"sum by (job, run, state) (sentinel_optimizer_state_bytes{{{RANK}}})", "{{run}} {{state}}"),
                (f"sum by (job, run) (sentinel_param_bytes{{{RANK}}})", "{{run}} parameters")], "bytes"),
            graph("State / parameter bytes", [(f"sentinel_optimizer_state_param_ratio{{{RANK}}}", LEGEND)],
                  "none"),
            graph("Gradient noise (GVR)", [(f"sentinel_gradient_variance_ratio{{{RANK}}}", LEGEND)], "none",
                  description="var/mean² of recent grad norms. Line: GradientNoiseHigh.",
                  steps=above(pack, "GradientNoiseHigh")),
            graph("Gradient SNR", [(f"sentinel_gradient_snr{{{RANK}}}", LEGEND)], "none"),
            graph("Adam state saturation", [(f"sentinel_optimizer_state_saturation_ratio{{{RANK}}}", LEGEND)],
                  "percentunit", description="Line: OptimizerStateSaturated.",
                  steps=above(pack, "OptimizerStateSaturated")),
        ]),
        ("Memory", [
            graph("CUDA memory", [
                (f"sentinel_cuda_memory_allocated_bytes{{{RANK}}}", LEGEND + " allocated"),
                (f"sentinel_cuda_memory_reserved_bytes{{{RANK}}}", LEGEND + " reserved"),
                (f"sentinel_cuda_memory_peak_bytes{{{RANK}}}", LEGEND + " peak"),
                (f"sentinel_cuda_memory_total_bytes{{{RANK}}}", LEGEND + " capacity")], "bytes"),
            graph("CUDA allocator retries and OOMs", [
                (f"increase(sentinel_cuda_alloc_retries_total{{{RANK}}}[{RATE}])", LEGEND + " retries"),
                (f"increase(sentinel_cuda_ooms_total{{{RANK}}}[{RATE}])", LEGEND + " OOMs")], "none"),
            graph("Memory the OOM rule watches", [
                (f"sentinel_memory_used_bytes{{{RANK}}}", LEGEND + " used"),
                (f"sentinel_memory_capacity_bytes{{{RANK}}}", LEGEND + " capacity"),
                (f"sentinel_host_memory_rss_bytes{{{RANK}}}", LEGEND + " host RSS")], "bytes"),
        ]),
        ("AMP and clipping", [
            graph("AMP loss scale", [(f"sentinel_amp_loss_scale{{{RANK}}}", LEGEND)], "none", log=True,
                  description="Line: LossScaleCollapse's floor.",
                  steps=[(None, "red"), (limit(pack, "LossScaleCollapse"), "green")]),
            graph("Skipped steps (AMP overflow)", [
                (f"increase(sentinel_amp_skipped_steps_total{{{RANK}}}[{RATE}])", LEGEND)], "none"),
            graph("Clipping", [
                (f"sentinel_grad_clip_max_norm{{{RANK}}}", LEGEND + " max_norm"),
                (f"increase(sentinel_grad_clipped_steps_total{{{RANK}}}[{RATE}])", LEGEND + " clipped steps")],
                "none"),
        ]),
    ])


def ranks_gpus(pack: RulePack) -> db.Dashboard:
    """Ranks & GPUs: stragglers, replicas out of step, and the GPUs under them."""
    step_rank = f"sentinel_step{{{RANK}}}"
    return _board("sentinel-ranks-gpus", "Sentinel / Ranks & GPUs",
                  "Step and busy time per rank, the straggler and divergence views, and NVML temperature, "
                  "utilisation, power, throttle reasons, ECC and XID (joinable with dcgm-exporter on "
                  "gpu/UUID/Hostname).", [
        ("Ranks", [
            graph("Step time per rank", [(f"sentinel_step_duration_seconds{{{RANK}}}", LEGEND)], "s"),
            graph("Busy time per rank (data + forward)", [(f"sentinel_step_busy_seconds{{{RANK}}}", LEGEND)], "s",
                  description="Time before the gradient sync: in lockstep training a straggler shows here."),
            graph("Straggler: busy time / other ranks'", [(f"sentinel_rank_step_time_ratio{{{RANK}}}", LEGEND)],
                  "none", description="Line: RankStraggler.", steps=above(pack, "RankStraggler")),
            graph("Divergence: grad norm off the median", [(
                f"sentinel_rank_grad_norm_deviation{{{RANK}}}", LEGEND)], "none", log=True,
                description="All-reduced gradients are identical on every rank. Line: RankDivergence.",
                steps=above(pack, "RankDivergence")),
            graph("Steps behind the leading rank", [(
                f"max by (job, run) ({step_rank}) - on (job, run) group_right () {step_rank}", LEGEND)], "none"),
            graph("Seconds since the last step, and the run's last heartbeat", [
                (f"time() - sentinel_last_step_timestamp_seconds{{{RANK}}}", LEGEND),
                (f"time() - max by (job, run) (sentinel_last_heartbeat_timestamp_seconds{{{RUN}}})",
                 "{{run}} heartbeat")], "s",
                description="TrainingStalled fires for a rank when both its line and its run's heartbeat "
                            "line (an evaluation, any rank's) are past its limit. Line: TrainingStalled's "
                            "minimum (its threshold also scales with the step time).",
                steps=[(None, "green"), (limit(pack, "TrainingStalled", "min_seconds"), "red")]),
        ]),
        ("GPUs (NVML)", [
            graph("GPU monitoring up", [("sentinel_gpu_monitoring_up", "{{instance}}")], "none",
                  description="0: no NVML driver on that node; the GPU panels below stay empty."),
            graph("GPU utilisation", [("sentinel_gpu_utilization_ratio", GPU_LEGEND)], "percentunit",
                  description=GPU_NOTE),
            graph("GPU temperature", [("sentinel_gpu_temperature_celsius", GPU_LEGEND)], "celsius",
                  description="Line: GPUOverheating.", steps=above(pack, "GPUOverheating")),
            graph("GPU power", [("sentinel_gpu_power_watts", GPU_LEGEND)], "watt"),
            graph("GPU memory", [("sentinel_gpu_memory_used_bytes", GPU_LEGEND + " used"),
                                 ("sentinel_gpu_memory_total_bytes", GPU_LEGEND + " total")], "bytes"),
            graph("Clock throttle reasons", [("sentinel_gpu_clock_throttled == 1",
                                              GPU_LEGEND + " {{reason}}")], "none"),
            graph("ECC errors", [(f"increase(sentinel_gpu_ecc_errors_total[{RATE}])", GPU_LEGEND + " {{type}}")],
                  "none"),
            graph("XID errors", [(f"increase(sentinel_gpu_xid_errors_total[{RATE}])", GPU_LEGEND + " events"),
                                 ("sentinel_gpu_last_xid", GPU_LEGEND + " last code")], "none"),
            graph("dcgm-exporter SM clock of the same GPUs", [(
                "DCGM_FI_DEV_SM_CLOCK * on (gpu, UUID, Hostname) group_left () "
                "(0 * sentinel_gpu_temperature_celsius + 1)", GPU_LEGEND)], "MHz",
                description="Joined with dcgm-exporter on gpu, UUID and Hostname: empty without it."),
        ]),
    ])


BOARDS: dict[str, Callable[[RulePack], db.Dashboard]] = {
    "overview": overview, "layers": layers, "optimizer-memory": optimizer_memory, "ranks-gpus": ranks_gpus}
"""File stem → dashboard. The uids are ``sentinel-<stem>`` and never change."""
