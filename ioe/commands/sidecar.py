"""``ioe sidecar``: the node agent."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from ioe.settings import SettingsError, load_settings


def sidecar(
    config: Path | None = typer.Option(None, "--config", help="YAML or TOML config file."),
    store: str | None = typer.Option(None, "--store", help="Store file (overrides store_path)."),
    port: int | None = typer.Option(None, "--port", help="Listen port for health, /metrics and OTLP/HTTP."),
    host: str | None = typer.Option(None, "--listen", help="Listen address (default 127.0.0.1)."),
) -> None:
    """Scrape GPU and engine metrics, read devices and NCCL logs, receive spans; write the store."""
    from collector.agent import Agent

    try:
        settings = load_settings(config, args={"store_path": store, "listen_port": port, "listen_host": host})
    except SettingsError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    agent = Agent(settings)
    typer.echo(
        f"ioe sidecar: {len(settings.targets)} target(s), store {settings.store_path}, "
        f"listening on http://{settings.listen_host}:{settings.listen_port}",
        err=True,
    )
    asyncio.run(agent.run())


def register(app: typer.Typer) -> None:
    app.command("sidecar")(sidecar)
