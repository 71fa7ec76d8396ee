"""``ioe demo``: the main job on an embedded default (see :mod:`ioe.demo`)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import typer


def demo(
    duration: float = typer.Option(
        0.0, "--duration", help="Stop after this many seconds (0: run until Ctrl-C)."
    ),
    warmup: float = typer.Option(60.0, "--warmup", help="Seconds of telemetry to collect before the report."),
    port: int = typer.Option(0, "--port", help="Port for the API and page on 127.0.0.1 (0: any free)."),
    workdir: Path | None = typer.Option(
        None, "--workdir", help="Where the store and logs go (default: temp)."
    ),
    report_json: Path | None = typer.Option(
        None, "--report-json", help="Also write the report as JSON here."
    ),
) -> None:
    """Simulated deployments in different zones, the sidecar, the store, the analysis and the page."""
    from ioe.demo import run_demo

    if duration and duration < warmup:
        warmup = duration
    if workdir:
        workdir.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(run_demo(duration_s=duration or float("inf"), warmup_s=warmup, port=port,
                                  workdir=workdir, echo=typer.echo))  # fmt: skip
    if report_json:
        report_json.write_text(json.dumps(report, indent=2, default=str))


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
