"""The ``sentinel`` command line."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Optional, TypeVar

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Sentinel: a runtime training-health monitor for PyTorch.")


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at INFO.")) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


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


@app.command("check-config")
def check_config(path: str = typer.Argument(..., help="The YAML config file.")) -> None:
    """Validate a config file and print the effective rules."""
    _, pack = _load_or_exit(path)
    enabled = [r.name for r in pack.enabled()]  # type: ignore[attr-defined]
    typer.echo(f"ok: {len(enabled)} rules enabled: {', '.join(enabled)}")


@app.command()
def daemon(
    config: Optional[str] = typer.Option(None, help="Sentinel config file."),
    listen: str = typer.Option("127.0.0.1:9400", help="HOST:PORT of /metrics and the API."),
    socket_path: Optional[str] = typer.Option(None, "--socket", help="Unix socket for frames."),
    web_config: Optional[str] = typer.Option(None, "--web.config.file", help=_WEB_HELP),
) -> None:
    """Run the engine standalone (a sidecar or a systemd unit) until SIGINT/SIGTERM."""
    from sentinel.daemon.daemon import Daemon, default_socket_path, serve_forever

    cfg, pack = _load_or_exit(config, web_config)
    path = socket_path or default_socket_path()
    d = _start_or_exit(lambda: Daemon(cfg, pack, listen, path))  # type: ignore[arg-type]
    serve_forever(d, ready=lambda: typer.echo(f"sentinel daemon: export SENTINEL_SOCKET={path} SENTINEL_URL={d.url}"))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    config: Optional[str] = typer.Option(None, help="Sentinel config file."),
    listen: str = typer.Option("127.0.0.1:9400", help="HOST:PORT of /metrics and the API."),
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
    cfg, pack = _load_or_exit(config, web_config)
    raise typer.Exit(_start_or_exit(lambda: run_command(list(ctx.args), cfg, pack, listen,  # type: ignore[arg-type]
                                                        tags)))


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


alerts_app = typer.Typer(no_args_is_help=True, help="Alert delivery.")
rules_app = typer.Typer(no_args_is_help=True, help="The rule pack.")
app.add_typer(alerts_app, name="alerts")
app.add_typer(rules_app, name="rules")


@alerts_app.command("test")
def alerts_test(config: Optional[str] = typer.Option(None, help="Sentinel config file.")) -> None:
    """Send a test message through every route; report each by route, index and scheme."""
    from sentinel.delivery.courier import test_routes
    from sentinel.delivery.routes import build_routes

    cfg, _ = _load_or_exit(config)
    routes = build_routes(cfg.notify, cfg.alertmanager)  # type: ignore[attr-defined]
    if not routes:
        typer.echo("no routes configured: alerts go to the console (the log) only")
        raise typer.Exit(0)
    failed = 0
    for label, index, scheme, ok in test_routes(routes):
        typer.echo(f"route {label} #{index} ({scheme}://…): {'ok' if ok else 'FAILED'}")
        failed += not ok
    raise typer.Exit(1 if failed else 0)


@rules_app.command("export")
def rules_export(
    format: str = typer.Option("prometheus", "--format", help="prometheus: Prometheus alerting rules (YAML)."),
    config: Optional[str] = typer.Option(None, help="Sentinel config file (its rule overrides export too)."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Write here instead of stdout."),
) -> None:
    """Export the rules PromQL can express, for a cluster's Prometheus and Alertmanager."""
    from sentinel.rules.promexport import export_prometheus

    if format != "prometheus":
        typer.echo(f"format: only 'prometheus' is supported; got {format!r}", err=True)
        raise typer.Exit(2)
    _, pack = _load_or_exit(config)
    text = export_prometheus(pack)  # type: ignore[arg-type]
    if output:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        typer.echo(text, nl=False)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
