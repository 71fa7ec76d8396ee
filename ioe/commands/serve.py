"""``ioe serve``: the API and the page over a store."""

from __future__ import annotations

from pathlib import Path

import typer

from ioe.commands._common import exposure_or_exit, settings_or_exit


def serve(
    store: str | None = typer.Option(None, "--store", help="Store file (overrides store_path)."),
    config: Path | None = typer.Option(None, "--config", help="YAML or TOML config file."),
    port: int | None = typer.Option(None, "--port", help="Listen port."),
    host: str | None = typer.Option(None, "--listen", help="Listen address (default 127.0.0.1)."),
) -> None:
    """Serve the REST API, OTLP/HTTP ingest, /metrics of verdicts and the page over a store."""
    import uvicorn

    from api.app import REFRESH_S, create_app
    from collector.agent import open_store
    from collector.maintenance import Maintainer
    from collector.store import Retention

    settings = settings_or_exit(config, store_path=store, listen_port=port, listen_host=host)
    exposure_or_exit(settings)
    st = open_store(settings)
    app = create_app(settings, st, refresh_s=REFRESH_S)
    maintainer = Maintainer(st, settings.maintenance_interval_s,
                            Retention(settings.raw_retention_s, settings.rollup_retention_s))  # fmt: skip
    maintainer.start()
    typer.echo(
        f"ioe serve: store {settings.store_path} on http://{settings.listen_host}:{settings.listen_port}",
        err=True,
    )
    try:
        uvicorn.run(
            app,
            host=settings.listen_host,
            port=settings.listen_port,
            log_level="warning",
            access_log=False,  # one log record per request costs more than a cached answer
            timeout_graceful_shutdown=2,
        )
    finally:
        maintainer.stop()
        st.close()


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
