"""``ioe simulate``: synthetic nodes that speak every input format IOE reads."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import typer
import yaml


def simulate(
    config: Path | None = typer.Option(
        None, "--config", help="YAML list of deployments (default: the demo set)."
    ),
    port: int = typer.Option(0, "--port", help="Port on 127.0.0.1 for the /metrics endpoints (0: any free)."),
    otlp_endpoint: str = typer.Option("", "--otlp-endpoint", help="OTLP/HTTP traces URL to send spans to."),
    inspector_dir: str = typer.Option("", "--inspector-dir", help="Directory for NCCL Inspector JSONL logs."),
    duration: float = typer.Option(0.0, "--duration", help="Stop after this many seconds (0: until Ctrl-C)."),
    sidecar_config: Path | None = typer.Option(
        None, "--write-sidecar-config", help="Write an `ioe sidecar` config for these endpoints here."
    ),
) -> None:
    """Serve simulated dcgm-exporter and vLLM endpoints; send spans; write NCCL Inspector logs."""
    from simulate.node import Simulation
    from simulate.spec import demo_deployments, load_deployments

    try:
        deployments = (
            load_deployments(str(config)) if config else demo_deployments(surge_at_s=(duration or 600.0) / 2)
        )
    except (OSError, ValueError, yaml.YAMLError) as exc:
        typer.echo(f"simulate: {exc}", err=True)
        raise typer.Exit(2) from exc
    sim = Simulation(deployments, port=port, otlp_endpoint=otlp_endpoint, inspector_dir=inspector_dir)
    sim.start()
    if sidecar_config:
        cfg = {
            "targets": sim.targets(),
            "deployments": sim.deployment_specs(),
            "nccl_inspector_dir": inspector_dir,
        }
        sidecar_config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    for t in sim.targets():
        typer.echo(f"{t['kind']:6s} {t['url']}")
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    deadline = time.monotonic() + duration if duration else None
    while not stop.wait(0.5):
        if deadline is not None and time.monotonic() >= deadline:
            break
    sim.stop()


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)
