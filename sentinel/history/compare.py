"""``sentinel compare``: seed 004's comparison table (§4.5) over recorded runs.

Columns: the run (its label, ``RUN@N`` for a reused name; for a row of seeds, the runs it
holds), optimizer, lr, final loss, steps to the target loss, mean grad norm, mean update
magnitude (‖Δw‖), peak memory, diverged, and the warning and critical alerts fired. Runs
whose tags differ only by ``seed`` form one row, as mean ± std (with ``--by TAG``: the runs
sharing that tag's value). "Diverged" means a non-finite loss or grad norm was seen, or
the final loss is above the first.
"""

from __future__ import annotations

import csv
import io
import math
import sqlite3
import statistics
from dataclasses import dataclass
from html import escape

from sentinel.history import query
from sentinel.history.query import RunInfo
from sentinel.history.report import fmt_bytes
from sentinel.history.svg import line_chart

COLUMNS = ("run", "optimizer", "lr", "runs", "final loss", "steps to target", "mean grad norm", "mean update",
           "peak memory", "diverged", "warnings", "criticals")


def diverged(run: RunInfo) -> bool:
    """A non-finite value seen, or a final loss above the first."""
    if run.nonfinite:
        return True
    return run.final_loss is not None and run.first_loss is not None and run.final_loss > run.first_loss


def lr_of(run: RunInfo) -> str:
    """The run's learning rate: its ``lr`` tag, else the optimizer's ``lr`` hyperparameter."""
    if "lr" in run.tags:
        return run.tags["lr"]
    for o in run.optimizer or []:
        if "lr" in o:
            return f"{o['lr']:g}" if isinstance(o["lr"], (int, float)) else str(o["lr"])
    return ""


@dataclass
class Row:
    """One line of the table: one run, or the runs of one group."""

    key: str
    runs: list[RunInfo]
    final_loss: list[float]
    steps_to_target: list[int | None]
    grad_norm: list[float]
    update: list[float]
    peak_memory: list[float]
    diverged: int
    warnings: int
    criticals: int

    @property
    def optimizer(self) -> str:
        return self.runs[0].optimizer_name

    @property
    def lr(self) -> str:
        return lr_of(self.runs[0])


def group_key(run: RunInfo, by: str | None) -> str:
    """Runs with the same key share a row: the ``by`` tag's value, else every tag but ``seed``."""
    if by:
        return f"{by}={run.tags.get(by, '')}"
    rest = {k: v for k, v in sorted(run.tags.items()) if k != "seed"}
    if not rest and "seed" not in run.tags:
        return f"{run.job}/{run.label}"  # untagged runs stand alone
    return ",".join(f"{k}={v}" for k, v in rest.items()) + f"|{run.optimizer_name}|{run.job}"


def rows(db: sqlite3.Connection, runs: list[RunInfo], target: float | None = None, by: str | None = None) -> list[Row]:
    """The table's rows, in the order the runs were given (a group at its first run)."""
    groups: dict[str, list[RunInfo]] = {}
    for r in runs:
        groups.setdefault(group_key(r, by), []).append(r)
    out = []
    for key, members in groups.items():
        fin = [r.final_loss for r in members if r.final_loss is not None]
        out.append(Row(
            key, members, fin,
            [query.steps_to_target(db, r, target) for r in members] if target is not None else [],
            [r.mean_grad_norm for r in members if r.mean_grad_norm is not None],
            [r.mean_delta_norm for r in members if r.mean_delta_norm is not None],
            [r.peak_memory for r in members if r.peak_memory is not None],
            sum(diverged(r) for r in members),
            sum(r.alerts.get("warning", 0) for r in members), sum(r.alerts.get("critical", 0) for r in members)))
    return out


def mean_std(xs: list[float], spec: str = ".4g") -> str:
    """``mean ± std`` (sample std) for several values, the value for one, ``—`` for none."""
    if not xs:
        return "—"
    if len(xs) == 1:
        return format(xs[0], spec)
    finite = [x for x in xs if math.isfinite(x)]
    if len(finite) < len(xs):
        return f"{format(statistics.fmean(finite), spec) if finite else 'nan'} ({len(xs) - len(finite)} non-finite)"
    return f"{format(statistics.fmean(xs), spec)} ± {format(statistics.stdev(xs), spec)}"


def cells(row: Row, target: float | None) -> list[str]:
    """The row as text cells, in :data:`COLUMNS` order."""
    if target is None:
        reach = "—"
    else:
        hit = [float(s) for s in row.steps_to_target if s is not None]
        n = len(row.runs)
        reach = "not reached" if not hit else mean_std(hit, ".0f") + (f" ({len(hit)}/{n})" if len(hit) < n else "")
    peaks = row.peak_memory
    mem = "—" if not peaks else fmt_bytes(statistics.fmean(peaks)) + (
        f" ± {fmt_bytes(statistics.stdev(peaks))}" if len(peaks) > 1 else "")
    n = len(row.runs)
    div = ("yes" if row.diverged else "no") if n == 1 else f"{row.diverged}/{n}"
    return [", ".join(r.label for r in row.runs), row.optimizer or "—", row.lr or "—", str(n), mean_std(row.final_loss), reach, mean_std(row.grad_norm),
            mean_std(row.update, ".3g"), mem, div, str(row.warnings), str(row.criticals)]


def to_csv(table: list[Row], target: float | None) -> str:
    """The table as CSV, raw numbers (means; std in their own columns)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["optimizer", "lr", "runs", "final_loss_mean", "final_loss_std", "steps_to_target_mean",
                "reached", "mean_grad_norm", "mean_update", "peak_memory_bytes", "diverged", "warnings",
                "criticals", "run_names"])

    def m(xs: list[float]) -> str:
        return repr(statistics.fmean(xs)) if xs else ""

    for r in table:
        hit = [float(s) for s in r.steps_to_target if s is not None]
        w.writerow([r.optimizer, r.lr, len(r.runs), m(r.final_loss),
                    repr(statistics.stdev(r.final_loss)) if len(r.final_loss) > 1 else "",
                    m(hit) if target is not None else "", len(hit) if target is not None else "", m(r.grad_norm),
                    m(r.update), m(r.peak_memory), r.diverged, r.warnings, r.criticals,
                    " ".join(x.label for x in r.runs)])
    return buf.getvalue()


def to_html(db: sqlite3.Connection, table: list[Row], target: float | None) -> str:
    """The table and the loss curves of every run overlaid, as one self-contained page."""
    head = "".join(f"<th>{escape(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells(r, target)) + "</tr>" for r in table)
    lines = []
    for r in table:
        for run in r.runs:
            s = query.series(db, run)
            lines.append((f"{r.optimizer} {r.lr} {run.tags.get('seed', run.label)}", s.steps, s.columns["loss"]))
    chart = line_chart("Loss, every run", lines, log=True)
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>sentinel compare</title>"
            "<style>body{font-family:system-ui,sans-serif;margin:24px}table{border-collapse:collapse}"
            "td,th{border:1px solid #ddd;padding:3px 8px;font-size:13px}</style></head><body>"
            f"<h1>sentinel compare</h1><table><tr>{head}</tr>{body}</table><figure>{chart}</figure></body></html>")
