"""``ioe sidecar``: the node agent.

Rules:
  1. Its ports (health/API/OTLP-HTTP, and OTLP/gRPC when enabled) are checked before it starts:
     one in use is one line on stderr and exit 2, not a traceback.
  2. A store it cannot open (held by another process, corrupt, truncated) is one line and exit 2.
     A missing store file is created: the sidecar is the store's writer.
  3. Ctrl-C (SIGINT) and SIGTERM stop it gracefully (the agent's own handlers); a Ctrl-C before
     they are installed exits 0 without a traceback.

The body is :func:`ioe.sidecar.run`; the entry point starts ``ioe sidecar`` there without typer
when the options allow (:mod:`ioe.sidecar` rule 1).
"""

from __future__ import annotations

from pathlib import Path

import typer

from ioe.commands._common import settings_or_exit
from ioe.sidecar import run


def sidecar(
    config: Path | None = typer.Option(None, "--config", help="YAML or TOML config file."),
    store: str | None = typer.Option(None, "--store", help="Store file (overrides store_path)."),
    port: int | None = typer.Option(None, "--port", help="Listen port for health, /metrics and OTLP/HTTP."),
    host: str | None = typer.Option(None, "--listen", help="Listen address (default 127.0.0.1)."),
) -> None:
    """Scrape GPU and engine metrics, read devices and NCCL logs, receive spans; write the store."""
    settings = settings_or_exit(config, store_path=store, listen_port=port, listen_host=host)
    try:
        run(settings)
    except SystemExit as exc:  # Ctrl-C before the agent's handlers, as typer's own exit
        raise typer.Exit(exc.code if isinstance(exc.code, int) else 1) from None


def register(app: typer.Typer) -> None:
    app.command("sidecar")(sidecar)
