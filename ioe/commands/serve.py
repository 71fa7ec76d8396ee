"""``ioe serve``: the API and the page over a store.

Rules:
  1. The listening socket is bound before anything else, so a port in use is one line on stderr
     and exit 2 (:func:`ioe.commands._common.bind_or_exit`), not uvicorn's tracebacks.
  2. A store file that does not exist is an error (exit 2) unless ``--create`` asks for a new one:
     a mistyped ``--store`` must not serve an empty store. A store another process holds, a
     corrupt or a truncated file is one line and exit 2 too.
  3. Ctrl-C (SIGINT) or SIGTERM stops the server gracefully and exits 0, without a traceback.
  4. The server closes connections that send headers or a body too slowly, and caps
     connections (:func:`api.limits.server_options`).
"""

from __future__ import annotations

import signal
import socket
from pathlib import Path
from typing import Any

import typer

from ioe.commands._common import bind_or_exit, exposure_or_exit, open_store_or_exit, settings_or_exit

COMMAND = "ioe serve"


class _Stopped(BaseException):
    """SIGTERM, re-raised by uvicorn once it has shut down (rule 3)."""


def serve(
    store: str | None = typer.Option(None, "--store", help="Store file (overrides store_path)."),
    config: Path | None = typer.Option(None, "--config", help="YAML or TOML config file."),
    port: int | None = typer.Option(None, "--port", help="Listen port."),
    host: str | None = typer.Option(None, "--listen", help="Listen address (default 127.0.0.1)."),
    create: bool = typer.Option(False, "--create", help="Create the store file when it does not exist."),
) -> None:
    """Serve the REST API, OTLP/HTTP ingest, /metrics of verdicts and the page over a store."""
    try:
        _serve(store, config, port, host, create)
    except (KeyboardInterrupt, _Stopped):  # rule 3: a stop asked for is not an error
        raise typer.Exit(0) from None


def _serve(store: str | None, config: Path | None, port: int | None, host: str | None, create: bool) -> None:
    settings = settings_or_exit(config, store_path=store, listen_port=port, listen_host=host)
    exposure_or_exit(settings)
    sock = bind_or_exit(COMMAND, settings.listen_host, settings.listen_port)  # rule 1
    if sock is None:  # not reached: bind_or_exit keeps the socket by default
        return
    try:
        st = open_store_or_exit(COMMAND, settings, create=create)  # rule 2
        _run(settings, st, sock)
    finally:
        sock.close()


def _run(settings: Any, st: Any, sock: socket.socket) -> None:
    import uvicorn

    from api.app import REFRESH_S, create_app
    from api.limits import server_options
    from collector.maintenance import MAINTENANCE_INTERVAL_S, Maintainer
    from collector.store import Retention

    app = create_app(settings, st, refresh_s=REFRESH_S)
    maintainer = Maintainer(st, settings.maintenance_interval_s or MAINTENANCE_INTERVAL_S,
                            Retention(settings.raw_retention_s, settings.rollup_retention_s))  # fmt: skip
    maintainer.start()
    port = sock.getsockname()[1]  # the port bound (the one asked for, or any free one for 0)
    typer.echo(f"{COMMAND}: store {settings.store_path} on http://{settings.listen_host}:{port}", err=True)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=settings.listen_host,
            port=port,
            log_level="warning",
            access_log=False,  # one log record per request costs more than a cached answer
            timeout_graceful_shutdown=2,
            **server_options(),
        )
    )
    signal.signal(signal.SIGTERM, _raise_stopped)  # uvicorn restores it and re-raises SIGTERM after
    try:
        server.run(sockets=[sock])
    finally:
        maintainer.stop()
        st.close()


def _raise_stopped(signum: int, frame: object) -> None:
    raise _Stopped()


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
