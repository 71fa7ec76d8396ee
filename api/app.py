"""The FastAPI application: health, OTLP/HTTP ingest, REST and ``/metrics``.

``create_app`` takes the store to read and the sink to write through (the sidecar passes its
bounded queue; ``ioe serve`` passes the store itself), so the API never opens files itself.
Routers live in their own modules and are included here.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from collector.sink import Sink
from collector.store import Store
from ioe.settings import Settings


def create_app(settings: Settings, store: Store, sink: Sink | None = None, **state: Any) -> FastAPI:
    app = FastAPI(title="IOE", version="1", description="Inference Operating Envelope analyzer")
    app.state.settings = settings
    app.state.store = store
    app.state.sink = sink if sink is not None else store
    for key, value in state.items():
        setattr(app.state, key, value)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    def readyz() -> dict[str, Any]:
        return {"status": "ready", "schema_version": store.schema_version()}

    @app.get("/metrics", tags=["metrics"], include_in_schema=False)
    def metrics() -> Response:
        registries = getattr(app.state, "registries", [])
        body = b"".join(generate_latest(r) for r in registries)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    _include_routers(app)
    return app


def _include_routers(app: FastAPI) -> None:
    """Routers added by other modules; each is optional until its module lands."""
    import importlib

    for name in ("api.otlp",):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        app.include_router(module.router)
