"""``ioe sidecar``: the node agent.

Rules:
  1. Its ports (health/API/OTLP-HTTP, and OTLP/gRPC when enabled) are checked before it starts:
     one in use is one line on stderr and exit 2, not a traceback.
  2. A store it cannot open (held by another process, corrupt, truncated) is one line and exit 2.
     A missing store file is created: the sidecar is the store's writer.
  3. Ctrl-C (SIGINT) and SIGTERM stop it gracefully (the agent's own handlers); a Ctrl-C before
     they are installed exits 0 without a traceback.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ioe.commands._common import bind_or_exit, exposure_or_exit, fail, settings_or_exit, store_problem

if TYPE_CHECKING:
    from collector.agent import Frontend

COMMAND = "ioe sidecar"


def sidecar(
    config: Path | None = typer.Option(None, "--config", help="YAML or TOML config file."),
    store: str | None = typer.Option(None, "--store", help="Store file (overrides store_path)."),
    port: int | None = typer.Option(None, "--port", help="Listen port for health, /metrics and OTLP/HTTP."),
    host: str | None = typer.Option(None, "--listen", help="Listen address (default 127.0.0.1)."),
) -> None:
    """Scrape GPU and engine metrics, read devices and NCCL logs, receive spans; write the store."""
    import duckdb

    from collector.agent import Agent
    from collector.store import StoreError

    settings = settings_or_exit(config, store_path=store, listen_port=port, listen_host=host)
    exposure_or_exit(settings)
    if settings.listen_port:  # rule 1 (port 0: any free port, never taken)
        bind_or_exit(COMMAND, settings.listen_host, settings.listen_port, keep=False)
    if settings.otlp.grpc_port:
        bind_or_exit(COMMAND, settings.listen_host, settings.otlp.grpc_port, keep=False)
    try:
        agent = Agent(settings, frontend=_api_frontend() if settings.api_enabled else None)
    except (StoreError, duckdb.Error) as exc:  # rule 2
        fail(f"{COMMAND}: {store_problem(settings.store_path, exc)}")
    typer.echo(
        f"{COMMAND}: {len(settings.targets)} target(s), store {settings.store_path}, "
        f"listening on http://{settings.listen_host}:{settings.listen_port}",
        err=True,
    )
    try:
        asyncio.run(agent.run())
    except KeyboardInterrupt:  # rule 3
        raise typer.Exit(0) from None


def _api_frontend() -> Frontend:
    """The API (``api_enabled: true``); imported only then, so a collector-only agent never loads
    the web stack."""
    from api.agent import serve_api

    return serve_api


def register(app: typer.Typer) -> None:
    app.command("sidecar")(sidecar)
