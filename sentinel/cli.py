"""The ``sentinel`` command line."""

from __future__ import annotations

import logging
import sys
from typing import Optional

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


def _load_or_exit(path: str | None) -> tuple[object, object]:
    """Validate a config file; on error print ``dotted.key: message`` lines and exit 2."""
    from sentinel.config import load_config
    from sentinel.rules.config import ConfigError

    try:
        return load_config(path)
    except ConfigError as exc:
        for line in exc.problems:
            typer.echo(f"config error: {line}", err=True)
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
) -> None:
    """Run the engine standalone (a sidecar or a systemd unit) until SIGINT/SIGTERM."""
    from sentinel.daemon.daemon import Daemon, default_socket_path, serve_forever

    cfg, pack = _load_or_exit(config)
    path = socket_path or default_socket_path()
    d = Daemon(cfg, pack, listen, path)  # type: ignore[arg-type]
    typer.echo(f"sentinel daemon: export SENTINEL_SOCKET={path} SENTINEL_URL={d.url}")
    serve_forever(d)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    config: Optional[str] = typer.Option(None, help="Sentinel config file."),
    listen: str = typer.Option("127.0.0.1:9400", help="HOST:PORT of /metrics and the API."),
) -> None:
    """Run CMD (python, torchrun, ...) with zero-code instrumentation: sentinel run -- CMD ..."""
    from sentinel.run import run_command

    if not ctx.args:
        typer.echo("usage: sentinel run [--config FILE] [--listen HOST:PORT] -- CMD ...", err=True)
        raise typer.Exit(2)
    cfg, pack = _load_or_exit(config)
    raise typer.Exit(run_command(list(ctx.args), cfg, pack, listen))  # type: ignore[arg-type]


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
