"""``ioe sidecar``: the node agent."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from ioe.commands._common import exposure_or_exit, settings_or_exit


def sidecar(
    config: Path | None = typer.Option(None, "--config", help="YAML or TOML config file."),
    store: str | None = typer.Option(None, "--store", help="Store file (overrides store_path)."),
    port: int | None = typer.Option(None, "--port", help="Listen port for health, /metrics and OTLP/HTTP."),
    host: str | None = typer.Option(None, "--listen", help="Listen address (default 127.0.0.1)."),
) -> None:
    """Scrape GPU and engine metrics, read devices and NCCL logs, receive spans; write the store."""
    from collector.agent import Agent
    from collector.store import StoreError

    settings = settings_or_exit(config, store_path=store, listen_port=port, listen_host=host)
    exposure_or_exit(settings)
    try:
        agent = Agent(settings)
    except StoreError as exc:  # a locked, truncated or corrupt store: one line, not a traceback
        typer.echo(f"ioe sidecar: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(
        f"ioe sidecar: {len(settings.targets)} target(s), store {settings.store_path}, "
        f"listening on http://{settings.listen_host}:{settings.listen_port}",
        err=True,
    )
    asyncio.run(agent.run())


def register(app: typer.Typer) -> None:
    app.command("sidecar")(sidecar)
