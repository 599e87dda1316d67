"""Building blocks of the dashboards: the variables, the alert annotation, panels whose
queries carry the variables, and threshold lines read from the rule pack.

Every query selects ``job=~"$job", run=~"$run", rank=~"$rank"`` (and ``group=~"$group"``
for per-group series): the variables are multi-select with "All" (``.*``), so one
dashboard shows one run, several, or all. Prometheus must scrape Sentinel with
``honor_labels: true``: ``job``, ``run`` and ``rank`` are the training job's identity,
not the scrape's.
"""

from __future__ import annotations

from collections.abc import Sequence

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm

from sentinel.dashboards.provision import DATASOURCE_NAME, DATASOURCE_UID
from sentinel.rules.config import RulePack

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
RUN = 'job=~"$job", run=~"$run"'
"""The run selector: series of the chosen jobs and runs."""
RANK = RUN + ', rank=~"$rank"'
"""The rank selector: every per-rank series."""
GROUP = RANK + ', group=~"$group"'
"""The per-group selector."""
LEGEND = "{{run}} r{{rank}} {{optimizer}}"
"""A per-rank line's name; a process with several optimizers has one line per optimizer stream
(its ``optimizer`` label: ``"0"``, ``"1"``, ...; empty, and so invisible, for a process's only one)."""

Panel = cogbuilder.Builder[dm.Panel]


def variables() -> list[cogbuilder.Builder[dm.VariableModel]]:
    """datasource, job, run, rank, group: each but the first multi-select with "All" (``.*``)."""
    out: list[cogbuilder.Builder[dm.VariableModel]] = [
        db.DatasourceVariable("datasource").label("Data source").type("prometheus")
        # open on the datasource that provisioning makes; a Grafana without it falls back to
        # the organisation's default one
        .current(dm.VariableOption(selected=True, text=DATASOURCE_NAME, value=DATASOURCE_UID))]
    for name, query in (("job", "label_values(sentinel_step, job)"),
                        ("run", 'label_values(sentinel_step{job=~"$job"}, run)'),
                        ("rank", 'label_values(sentinel_step{job=~"$job", run=~"$run"}, rank)'),
                        ("group", 'label_values(sentinel_group_grad_norm{job=~"$job", run=~"$run"}, group)')):
        out.append(db.QueryVariable(name).label(name).datasource(DATASOURCE)
                   .query({"query": query, "refId": f"sentinel-{name}"})
                   .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
                   .multi(True).include_all(True).all_value(".*")
                   .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"])))
    return out


ALERT_EXPR = 'max by (alertname, severity, job, run) (sentinel_alert_firing{' + RUN + '}) > 0'
"""The alert annotation: a region while an alert of the chosen runs fires."""


def alert_annotation() -> db.AnnotationQuery:
    """Annotations from ``sentinel_alert_firing``: one region per alert while it fires.

    The SDK's model has no ``titleFormat``/``tagKeys`` (Prometheus annotation fields);
    :data:`ANNOTATION_EXTRA` is merged into the JSON by the generator."""
    return (db.AnnotationQuery().name("Sentinel alerts").datasource(DATASOURCE).enable(True)
            .icon_color("red").expr(ALERT_EXPR))


def event_annotation() -> db.AnnotationQuery:
    """Grafana's own annotations tagged ``sentinel``: what an annotation sink posted (see
    :func:`sentinel.dashboards.links.annotation`), kept in Grafana after Prometheus forgets."""
    return (db.AnnotationQuery().name("Sentinel events").enable(True).icon_color("orange")
            .datasource(dm.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .target(db.AnnotationTarget().type("tags").tags(["sentinel"]).match_any(True).limit(200)))


ANNOTATION_EXTRA: dict[str, object] = {
    "titleFormat": "{{alertname}} ({{severity}})", "tagKeys": "alertname,severity,run",
    "textFormat": "run {{run}} of job {{job}}", "step": "10s", "useValueForTime": False}


def query(expr: str, legend: str = LEGEND, ref: str = "A", instant: bool = False) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
    return q.instant() if instant else q.range()


def _targets(exprs: Sequence[tuple[str, str]], instant: bool = False) -> list[prometheus.Dataquery]:
    return [query(e, legend, chr(ord("A") + i), instant) for i, (e, legend) in enumerate(exprs)]


Steps = Sequence[tuple[float | None, str]]
"""Threshold steps: ``(value, colour)``, the first with value None (the base)."""


def _thresholds(steps: Steps) -> db.ThresholdsConfig:
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(value=v, color=c) for v, c in steps])


def graph(title: str, exprs: Sequence[tuple[str, str]], unit: str, *, description: str = "",
          steps: Steps | None = None, log: bool = False, width: int = 12, height: int = 8,
          stack: bool = False) -> timeseries.Panel:
    """A time series panel; ``steps`` become dashed threshold lines."""
    p = (timeseries.Panel().title(title).description(description).datasource(DATASOURCE)
         .targets(_targets(exprs)).unit(unit).span(width).height(height).line_width(1).fill_opacity(5)
         .show_points(cm.VisibilityMode.NEVER)
         .legend(cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST)
                 .placement(cm.LegendPlacement.BOTTOM).show_legend(True)))
    if log:
        p = p.scale_distribution(cb.ScaleDistributionConfig().type(cm.ScaleDistribution.LOG).log(10))
    if stack:
        p = p.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL)).fill_opacity(40)
    if steps:
        p = p.thresholds(_thresholds(steps)).thresholds_style(
            cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.DASHED))
    return p


def stat_panel(title: str, exprs: Sequence[tuple[str, str]], unit: str, *, description: str = "",
               steps: Steps | None = None, width: int = 6, height: int = 4) -> stat.Panel:
    """A stat panel of the latest value (the query runs as a range; the panel reduces it)."""
    p = (stat.Panel().title(title).description(description).datasource(DATASOURCE)
         .targets(_targets(exprs)).unit(unit).span(width).height(height)
         .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
         .color_mode(cm.BigValueColorMode.BACKGROUND))
    if steps:
        p = p.thresholds(_thresholds(steps))
    return p


def table_panel(title: str, exprs: Sequence[tuple[str, str]], unit: str = "", *, description: str = "",
                width: int = 12, height: int = 8) -> table.Panel:
    """A table of the latest value of every series (instant queries)."""
    return (table.Panel().title(title).description(description).datasource(DATASOURCE)
            .targets([q.format(pm.PromQueryFormat.TABLE) for q in _targets(exprs, instant=True)])
            .unit(unit).span(width).height(height)
            .with_transformation(dm.DataTransformerConfig(id_val="organize", options={
                "excludeByName": {"Time": True, "__name__": True, "instance": True}})))


def heatmap_panel(title: str, expr: str, unit: str, *, description: str = "", width: int = 12,
                  height: int = 9) -> heatmap.Panel:
    """One row per series (e.g. per group), coloured by value on a log scale."""
    return (heatmap.Panel().title(title).description(description).datasource(DATASOURCE)
            .targets(_targets([(expr, "{{group}}")])).span(width).height(height)
            .calculate(False)
            .color(heatmap.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME).scheme("Spectral")
                   .scale(hm.HeatmapColorScale.EXPONENTIAL).exponent(0.5).steps(64))
            .y_axis(heatmap.YAxisConfig().unit("none"))
            .cell_values(heatmap.CellValues().unit(unit))
            .rows_frame(heatmap.RowsHeatmapOptions().layout(cm.HeatmapCellLayout.AUTO)))


def row(title: str) -> db.Row:
    return db.Row(title)


# -- thresholds from the rule pack -------------------------------------------------


def limit(pack: RulePack, name: str, key: str | None = None) -> float:
    """The constant a rule compares with: ``params.<key>``, by default ``value`` (threshold
    rules), ``ratio`` (the OOM forecast's level) or ``floor`` (the loss-scale floor).

    Raises:
        KeyError: the rule has no such constant (a renamed parameter must fail the build).
    """
    params = pack.get(name).params
    for k in (key,) if key else ("value", "ratio", "floor"):
        v = getattr(params, k, None)
        if isinstance(v, (int, float)):
            return float(v)
    raise KeyError(f"rule {name} has no constant threshold")


def above(pack: RulePack, *names: str) -> list[tuple[float | None, str]]:
    """Steps green below, then orange/red at each rule's limit (warning, critical)."""
    out: list[tuple[float | None, str]] = [(None, "green")]
    for n in sorted(names, key=lambda n: limit(pack, n)):
        out.append((limit(pack, n), "red" if pack.get(n).severity == "critical" else "orange"))
    return out


def band(pack: RulePack, low: str, high: str) -> list[tuple[float | None, str]]:
    """Steps orange below the ``low`` rule's limit, green between, red above ``high``'s."""
    return [(None, "orange"), (limit(pack, low), "green"), (limit(pack, high), "red")]
