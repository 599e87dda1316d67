"""The ``sentinel`` command line."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Optional, TypeVar

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Sentinel: a runtime training-health monitor for PyTorch.")


class _LogFormat(logging.Formatter):
    """The commands' log lines: time, level, logger and message, the message without the
    ``sentinel: `` it starts with for a training script's stderr (where it is the only
    prefix), so a line does not read ``WARNING sentinel: sentinel: ...``."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        return line.replace(f" {record.name}: sentinel: ", f" {record.name}: ", 1)


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at INFO.")) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(_LogFormat("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])


@app.command()
def demo(
    fault: str = typer.Option("none", help="none|nan|spike|lr-high|lr-low|oscillate|leak|hang"),
    steps: int = typer.Option(400, min=10, help="Training steps."),
    listen: str = typer.Option("127.0.0.1:9400", help="HOST:PORT of the metrics endpoint."),
    fault_step: int = typer.Option(0, help="Step the fault starts at (default: 40% of the run)."),
    delay: float = typer.Option(0.04, min=0.0, help="Sleep per step, to keep the view watchable."),
    config: Optional[str] = typer.Option(None, help="Sentinel config file (rules, notifications)."),
) -> None:
    """Train a tiny GPT on the CPU with an injected fault and watch sentinel catch it."""
    from sentinel.demo.run import FAULTS, DemoConfig, run_demo

    if fault not in FAULTS:
        typer.echo(f"fault: must be one of {', '.join(FAULTS)}; got {fault!r}", err=True)
        raise typer.Exit(2)
    if config:
        _load_or_exit(config)
    summary = run_demo(DemoConfig(fault=fault, steps=steps, listen=listen, fault_step=fault_step,
                                  delay=delay, config=config))
    fired = ", ".join(summary["alerts"]) or "none"
    typer.echo(f"done: {summary['steps']} steps, alerts: {fired}, instrument errors: {summary['errors']}")


_WEB_HELP = ("Prometheus exporter-toolkit web config file: tls_server_config (TLS, mutual TLS) and "
             "basic_auth_users (bcrypt). Overrides web.config_file in --config.")


def _load_or_exit(path: str | None, web_config: str | None = None) -> tuple[object, object]:
    """Validate a config file; on error print ``dotted.key: message`` lines and exit 2."""
    from sentinel.config import load_config, with_web_config
    from sentinel.rules.config import ConfigError

    try:
        cfg, pack = load_config(path)
        return with_web_config(cfg, web_config), pack
    except ConfigError as exc:
        for line in exc.problems:
            typer.echo(f"config error: {line}", err=True)
        raise typer.Exit(2) from None


T = TypeVar("T")


def _start_or_exit(start: Callable[[], T]) -> T:
    """Run ``start``; a socket folder that is not ours, or an address that cannot be bound,
    is one line on stderr and exit status 2 (what it started is stopped already)."""
    try:
        return start()
    except OSError as exc:  # UnsafeFolder is one: its message is the line
        line = str(exc) if exc.strerror is None else f"{exc.strerror}" + (f": {exc.filename}" if exc.filename else "")
        typer.echo(f"sentinel: cannot start: {line}", err=True)
        raise typer.Exit(2) from None


def _listen_or_exit(listen: str) -> None:
    """A ``--listen`` (or ``SENTINEL_LISTEN``) that is no ``HOST:PORT`` is one line on stderr
    and exit status 2, before anything starts."""
    from sentinel.listen import parse_listen

    try:
        parse_listen(listen)
    except ValueError as exc:
        typer.echo(f"sentinel: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command("check-config")
def check_config(path: str = typer.Argument(..., help="The YAML config file.")) -> None:
    """Validate a config file and print the effective rules."""
    _, pack = _load_or_exit(path)
    enabled = [r.name for r in pack.enabled()]  # type: ignore[attr-defined]
    typer.echo(f"ok: {len(enabled)} rules enabled: {', '.join(enabled)}")


@app.command()
def daemon(
    config: Optional[str] = typer.Option(None, envvar="SENTINEL_CONFIG", help="Sentinel config file."),
    listen: str = typer.Option("127.0.0.1:9400", envvar="SENTINEL_LISTEN", help="HOST:PORT of /metrics and the API."),
    socket_path: Optional[str] = typer.Option(None, "--socket", help="Unix socket for frames."),
    web_config: Optional[str] = typer.Option(None, "--web.config.file", help=_WEB_HELP),
    drain_seconds: float = typer.Option(0.0, "--drain-seconds", min=0.0,
                                        help="After SIGTERM, wait up to this long for the ranks to end and their "
                                             "exits to be reported (a daemon inside a Slurm job: below KillWait)."),
) -> None:
    """Run the engine standalone (a sidecar or a systemd unit) until SIGINT/SIGTERM."""
    from sentinel.daemon.daemon import Daemon, default_socket_path, serve_forever

    cfg, pack = _load_or_exit(config, web_config)
    _listen_or_exit(listen)
    path = socket_path or default_socket_path()
    # its address is what Prometheus scrapes: a busy port fails here, never moves elsewhere
    d = _start_or_exit(lambda: Daemon(cfg, pack, listen, path, fallback_port=False))  # type: ignore[arg-type]
    serve_forever(d, ready=lambda: typer.echo(f"sentinel daemon: export SENTINEL_SOCKET={path} SENTINEL_URL={d.url}"),
                  drain_seconds=drain_seconds)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    config: Optional[str] = typer.Option(None, envvar="SENTINEL_CONFIG", help="Sentinel config file."),
    listen: str = typer.Option("127.0.0.1:9400", envvar="SENTINEL_LISTEN", help="HOST:PORT of /metrics and the API."),
    web_config: Optional[str] = typer.Option(None, "--web.config.file", help=_WEB_HELP),
    tag: list[str] = typer.Option([], "--tag", help="Run metadata KEY=VALUE (repeatable): recorded in the "
                                                     "history and exported in sentinel_run_info."),
) -> None:
    """Run CMD (python, torchrun, ...) with zero-code instrumentation: sentinel run -- CMD ..."""
    from sentinel.run import run_command

    tags = _tags_or_exit(tag, "--tag")
    if not ctx.args:
        typer.echo("usage: sentinel run [--config FILE] [--listen HOST:PORT] [--web.config.file FILE] -- CMD ...",
                   err=True)
        raise typer.Exit(2)
    _script_lines()
    cfg, pack = _load_or_exit(config, web_config)
    _listen_or_exit(listen)
    _options_or_exit()
    raise typer.Exit(_start_or_exit(lambda: run_command(list(ctx.args), cfg, pack, listen,  # type: ignore[arg-type]
                                                        tags)))


def _script_lines() -> None:
    """``sentinel run`` shares its stderr with CMD: its log lines (a delivery that failed,
    apprise's own, a busy port) are ``sentinel: ...`` lines like its alerts, with no time
    stamp (:mod:`sentinel.lines`)."""
    from sentinel.lines import ScriptLines

    for handler in logging.getLogger().handlers:
        handler.setFormatter(ScriptLines())


def _options_or_exit() -> None:
    """The ``SENTINEL_*`` options the zero-code monitors will read; a bad one is one line
    and exit status 2, before CMD starts (its monitors would refuse it and watch nothing)."""
    from sentinel.instrument.options import env_problem

    problem = env_problem()
    if problem is not None:
        typer.echo(f"config error: {problem}", err=True)
        raise typer.Exit(2)


def _tags_or_exit(pairs: list[str], option: str) -> dict[str, str]:
    """``KEY=VALUE`` options as tags; a bad one is one line and exit status 2."""
    from sentinel.instrument.options import check_tags

    tags: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            typer.echo(f"{option}: expected KEY=VALUE, got {pair!r}", err=True)
            raise typer.Exit(2)
        tags[key.strip()] = value.strip()
    try:
        return check_tags(tags)
    except ValueError as exc:
        typer.echo(f"{option}: {exc}", err=True)
        raise typer.Exit(2) from None


_DB_HELP = "History file (default: history.path in --config, else $XDG_STATE_HOME/sentinel/history.sqlite)."


def _history_or_exit(db: str | None, config: str | None) -> object:
    """The history file opened read-only; a missing or unreadable one is one line, exit 2."""
    import sqlite3

    from sentinel.history.db import connect, default_path

    path = db
    if path is None and config:
        cfg, _ = _load_or_exit(config)
        path = cfg.history.path or None  # type: ignore[attr-defined]
    try:
        return connect(path or default_path(), readonly=True)
    except (OSError, sqlite3.Error) as exc:
        typer.echo(f"sentinel: no history to read: {exc}", err=True)
        raise typer.Exit(2) from None


def _since(value: str | None) -> float | None:
    from sentinel.history.query import parse_since

    try:
        return parse_since(value) if value else None
    except ValueError as exc:
        typer.echo(f"--since: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command("runs")
def runs_cmd(
    job: Optional[str] = typer.Option(None, help="Only this job."),
    tag: list[str] = typer.Option([], "--tag", help="Only runs with this tag KEY=VALUE (repeatable: all must match)."),
    since: Optional[str] = typer.Option(None, help="Only runs started since: 30m, 12h, 7d, or a date."),
    limit: int = typer.Option(50, min=1, help="At most this many (newest first)."),
    db: Optional[str] = typer.Option(None, "--db", help=_DB_HELP),
    config: Optional[str] = typer.Option(None, envvar="SENTINEL_CONFIG", help="Sentinel config file."),
) -> None:
    """List the recorded runs, newest first; a name used again shows as RUN@N (N: its attempt, from 1)."""
    from rich.console import Console
    from rich.table import Table

    from sentinel.history.query import list_runs
    from sentinel.history.report import fmt, fmt_duration, fmt_time

    conn = _history_or_exit(db, config)
    found = list_runs(conn, job, _tags_or_exit(tag, "--tag"), _since(since), limit)  # type: ignore[arg-type]
    table = Table(title=f"{len(found)} run(s)")
    for col in ("id", "run", "job", "optimizer", "steps", "final loss", "alerts", "state", "started", "duration"):
        table.add_column(col, justify="right" if col in ("id", "steps", "final loss") else "left")
    for r in found:
        alerts = ", ".join(f"{n} {sev}" for sev, n in sorted(r.alerts.items())) or "—"
        table.add_row(f"#{r.id}", r.label, r.job, r.optimizer_name or "—", str(r.steps), fmt(r.final_loss), alerts,
                      r.state, fmt_time(r.started), fmt_duration(r.duration))
    Console(width=200).print(table)


def _run_or_exit(conn: object, name: str) -> object:
    from sentinel.history.query import find_run

    run = find_run(conn, name)  # type: ignore[arg-type]
    if run is None:
        typer.echo(f"sentinel: no run {name!r} in the history (see: sentinel runs)", err=True)
        raise typer.Exit(2)
    return run


@app.command()
def skips(
    run: str = typer.Argument(..., help="RUN or JOB/RUN (the latest), RUN@N (the N-th, from 1), or #ID."),
    db: Optional[str] = typer.Option(None, "--db", help=_DB_HELP),
    config: Optional[str] = typer.Option(None, envvar="SENTINEL_CONFIG", help="Sentinel config file."),
) -> None:
    """The steps the step guard skipped in a run, with their batches: a skip list for a restart."""
    from sentinel.history.skips import skips_of, text

    conn = _history_or_exit(db, config)
    info = _run_or_exit(conn, run)
    typer.echo(text(skips_of(conn, info.id), info.label))  # type: ignore[arg-type, attr-defined]


@app.command()
def report(
    run: str = typer.Argument(..., help="RUN or JOB/RUN (the latest), RUN@N (the N-th, from 1), or #ID."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="File (html) or folder (png) to write."),
    format: str = typer.Option("html", "--format", help="html (one self-contained page), png (the plots), text."),
    db: Optional[str] = typer.Option(None, "--db", help=_DB_HELP),
    config: Optional[str] = typer.Option(None, envvar="SENTINEL_CONFIG", help="Sentinel config file."),
) -> None:
    """Report one recorded run: plots over steps, alerts with causes and first checks, the environment."""
    from pathlib import Path

    from sentinel.files import safe_name
    from sentinel.history import report as rep

    if format not in ("html", "png", "text"):
        typer.echo(f"--format: must be html, png or text; got {format!r}", err=True)
        raise typer.Exit(2)
    conn = _history_or_exit(db, config)
    info = _run_or_exit(conn, run)
    summary = rep.text_summary(conn, info)  # type: ignore[arg-type]
    if format == "text":
        typer.echo(summary)
        return
    if format == "png":
        try:
            paths = rep.png_report(conn, info, Path(output or "."))  # type: ignore[arg-type]
        except ImportError:
            typer.echo("--format png needs matplotlib: pip install 'sentinel-monitor[report]'", err=True)
            raise typer.Exit(2) from None
        typer.echo("\n".join(str(p) for p in paths))
        return
    path = Path(output or f"sentinel-report-{safe_name(info.label, 100, keep='@')}.html")  # type: ignore[attr-defined]
    path.write_text(rep.html_report(conn, info), encoding="utf-8")  # type: ignore[arg-type]
    typer.echo(summary)
    typer.echo(f"report: {path}")


@app.command()
def compare(
    runs: list[str] = typer.Argument(..., help="Runs: RUN or JOB/RUN (the latest), RUN@N (the N-th), #ID."),
    target_loss: Optional[float] = typer.Option(None, "--target-loss", help="Defines 'steps to target'."),
    by: Optional[str] = typer.Option(None, "--by", help="Aggregate the runs sharing this tag's value."),
    csv_path: Optional[str] = typer.Option(None, "--csv", help="Also write the table as CSV here."),
    html_path: Optional[str] = typer.Option(None, "--html", help="Also write the table and loss curves as HTML."),
    db: Optional[str] = typer.Option(None, "--db", help=_DB_HELP),
    config: Optional[str] = typer.Option(None, envvar="SENTINEL_CONFIG", help="Sentinel config file."),
) -> None:
    """Compare runs in one table (final loss, steps to a target, mean gradient norm and update, peak memory,
    divergence, alerts); runs differing only by the seed tag aggregate as mean ± std."""
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from sentinel.history import compare as cmp

    conn = _history_or_exit(db, config)
    infos = [_run_or_exit(conn, name) for name in runs]
    table_rows = cmp.rows(conn, infos, target_loss, by)  # type: ignore[arg-type]
    title = "comparison" + (f" (target loss {target_loss:g})" if target_loss is not None else "")
    table = Table(title=title)
    for col in cmp.COLUMNS:
        table.add_column(col)
    for row in table_rows:
        table.add_row(*cmp.cells(row, target_loss))
    Console(width=220).print(table)
    if csv_path:
        Path(csv_path).write_text(cmp.to_csv(table_rows, target_loss), encoding="utf-8")
    if html_path:
        Path(html_path).write_text(cmp.to_html(conn, table_rows, target_loss), encoding="utf-8")  # type: ignore[arg-type]


alerts_app = typer.Typer(no_args_is_help=True, help="Alert delivery.")
rules_app = typer.Typer(no_args_is_help=True, help="The rule pack.")
app.add_typer(alerts_app, name="alerts")
app.add_typer(rules_app, name="rules")


@alerts_app.command("test")
def alerts_test(config: Optional[str] = typer.Option(None, envvar="SENTINEL_CONFIG", help="Sentinel config file.")) -> None:
    """Send a test message through every route; report each by route, index and scheme."""
    from sentinel.delivery.courier import test_routes
    from sentinel.delivery.routes import build_routes

    cfg, _ = _load_or_exit(config)
    routes = build_routes(cfg.notify, cfg.alertmanager)  # type: ignore[attr-defined]
    if not routes:
        typer.echo("no routes configured: warning and critical alerts go to stderr only"
                   if cfg.notify.console else  # type: ignore[attr-defined]
                   "no routes configured and notify.console is false: alerts go to the log only")
        raise typer.Exit(0)
    failed = 0
    for label, index, scheme, ok in test_routes(routes):
        typer.echo(f"route {label} #{index} ({scheme}://…): {'ok' if ok else 'FAILED'}")
        failed += not ok
    raise typer.Exit(1 if failed else 0)


@rules_app.command("export")
def rules_export(
    format: str = typer.Option("prometheus", "--format", help="prometheus: Prometheus alerting rules (YAML); "
                                                              "prometheus-job: the job-wide recording rules."),
    config: Optional[str] = typer.Option(None, help="Sentinel config file (its rule overrides export too)."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Write here instead of stdout."),
) -> None:
    """Export the rules PromQL can express, for a cluster's Prometheus and Alertmanager."""
    from sentinel.rules.promexport import export_prometheus
    from sentinel.rules.promjob import export_job_rules

    if format not in ("prometheus", "prometheus-job"):
        typer.echo(f"format: 'prometheus' or 'prometheus-job' (the job-wide recording rules); got {format!r}",
                   err=True)
        raise typer.Exit(2)
    _, pack = _load_or_exit(config)
    text = export_prometheus(pack) if format == "prometheus" else export_job_rules()  # type: ignore[arg-type]
    if output:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        typer.echo(text, nl=False)


dashboards_app = typer.Typer(no_args_is_help=True, help="Grafana dashboards: generate the JSON, provision a Grafana.")
app.add_typer(dashboards_app, name="dashboards")


@dashboards_app.command("generate")
def dashboards_generate(
    out: str = typer.Option("dashboards", help="Folder the JSON files are written to."),
    config: Optional[str] = typer.Option(None, help="Sentinel config file: its rule thresholds are drawn."),
) -> None:
    """Write the dashboards' JSON (grafana-foundation-sdk, Grafana 11.6 flavour) into OUT."""
    _, pack = _load_or_exit(config)
    try:
        from sentinel.dashboards import write

        paths = write(out, pack)  # type: ignore[arg-type]
    except ImportError:
        typer.echo("dashboards: grafana-foundation-sdk is not installed: "
                   "pip install 'sentinel-monitor[dashboards]'", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"wrote {len(paths)} dashboards: {', '.join(str(p) for p in paths)}")


@dashboards_app.command("provision")
def dashboards_provision(
    grafana_url: str = typer.Option(..., "--grafana-url", help="Grafana's base URL."),
    token_env: str = typer.Option("GRAFANA_TOKEN", "--token-env",
                                  help="Environment variable holding a service-account token."),
    folder: str = typer.Option("Sentinel", "--folder", help="Folder the dashboards go to."),
    prometheus_url: Optional[str] = typer.Option(
        None, "--prometheus-url", help="Also create or update the Prometheus datasource (uid sentinel-prometheus)."),
    source: Optional[str] = typer.Option(
        None, "--from", help="Folder of generated JSON files (default: build them now, as `generate` does)."),
) -> None:
    """Create the folder, optionally the datasource, and upsert every dashboard by uid."""
    import json
    import os
    from pathlib import Path

    from sentinel.dashboards.provision import ProvisionError, provision

    token = os.environ.get(token_env) or None
    if source is None:
        try:
            from sentinel.dashboards import build

            docs = build()
        except ImportError:
            typer.echo("dashboards: grafana-foundation-sdk is not installed: pass --from dashboards/ "
                       "(the committed JSON) or pip install 'sentinel-monitor[dashboards]'", err=True)
            raise typer.Exit(2) from None
    else:
        files = sorted(Path(source).glob("*.json"))
        if not files:
            typer.echo(f"dashboards: no dashboard JSON in {source}/ (run `sentinel dashboards generate`)",
                       err=True)
            raise typer.Exit(2)
        docs = {f.stem: json.loads(f.read_text(encoding="utf-8")) for f in files}
    try:
        report = provision(grafana_url, token, docs, folder=folder, prometheus_url=prometheus_url)
    except ProvisionError as exc:
        typer.echo(f"provision failed: {exc}", err=True)
        raise typer.Exit(2) from None
    for line in report.lines():
        typer.echo(line)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
