"""The FastAPI application: health, OTLP/HTTP ingest, REST, ``/metrics`` and the page.

``create_app`` takes the store to read and the sink to write through (the sidecar passes its
bounded queue; ``ioe serve`` passes the store itself), so the API never opens files itself.
Routers live in their own modules and are included here.

Rules:
  1. ``/healthz`` answers while the process runs; ``/readyz`` once the store answers.
  2. ``/metrics`` renders every registry in ``app.state.registries`` (the sidecar's self-metrics)
     followed by the verdicts registry (:mod:`api.verdicts`), which this function appends.
  3. Request bodies above ``max_body_bytes`` get 413 (:mod:`api.limits`); the OTLP receiver
     caps its decompressed body itself (``settings.otlp.max_body_bytes``).
  4. With a token configured every route needs it but ``/healthz``, ``/readyz``, ``/metrics``
     and ``/login`` (:mod:`api.auth`, the outermost middleware).
  5. With ``refresh_s`` (``ioe serve`` passes :data:`REFRESH_S`) the default window's envelope and
     latency are precomputed every ``refresh_s`` seconds (:mod:`api.refresher`), from the app's
     startup to its shutdown (the lifespan), and answered before routing (:mod:`api.fastpath`);
     without it every answer is computed on request (or cached).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from api.auth import AuthGate
from api.auth import router as auth_router
from api.cache import TTLCache
from api.fastpath import SnapshotFastPath
from api.limits import BodyLimit
from api.refresher import Refresher
from api.verdicts import VerdictCollector
from collector.sink import Sink
from collector.store import Store
from ioe.settings import Settings

MAX_BODY_BYTES = 1 << 20  # REST bodies are small JSON documents (queries)
CACHE_TTL_S = 10.0
VERDICT_WINDOW_S = 900.0
REFRESH_S = 15.0  # rule 5: the default window's verdicts are at most this old (plus one analysis)
_ROUTERS = ("api.otlp", "api.routes", "api.page")


def create_app(
    settings: Settings, store: Store, sink: Sink | None = None, refresh_s: float | None = None, **state: Any
) -> FastAPI:
    about = "Inference Operating Envelope analyzer"
    app = FastAPI(title="IOE", version="1", description=about, lifespan=_lifespan)
    app.state.settings = settings
    app.state.store = store
    app.state.sink = sink if sink is not None else store
    app.state.registries = []
    app.state.cache = TTLCache(ttl_s=CACHE_TTL_S)
    app.state.refresher = None
    app.state.tasks = set()  # background refreshes of stale cached bodies (api.routes)
    for key, value in state.items():
        setattr(app.state, key, value)
    if refresh_s is not None:
        from api.routes import DEFAULT_POINTS, DEFAULT_WINDOW_S, refresh_cycle

        app.state.refresher = Refresher(lambda: refresh_cycle(app), interval_s=refresh_s)
        fast = {"state": app.state, "window_s": DEFAULT_WINDOW_S, "points": DEFAULT_POINTS}
        app.add_middleware(SnapshotFastPath, **fast)  # type: ignore[arg-type]
    app.state.registries = [*app.state.registries, verdict_registry(app)]
    app.add_middleware(BodyLimit, max_bytes=getattr(app.state, "max_body_bytes", MAX_BODY_BYTES),  # type: ignore[arg-type]
                       own_limits=("/v1/traces",))  # fmt: skip
    app.add_middleware(AuthGate, token=settings.token)  # type: ignore[arg-type]  # rule 4: outermost

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    def readyz() -> dict[str, Any]:
        return {"status": "ready", "schema_version": store.schema_version()}

    @app.get("/metrics", tags=["metrics"], include_in_schema=False)
    def metrics() -> Response:
        body = b"".join(generate_latest(r) for r in app.state.registries)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    app.include_router(auth_router)
    _include_routers(app)
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Rule 5: the refresher runs while the app serves."""
    refresher = app.state.refresher
    if refresher is not None:
        refresher.start()
    try:
        yield
    finally:
        if refresher is not None:
            refresher.stop()


def verdict_registry(app: FastAPI) -> CollectorRegistry:
    """Rule 2: a registry holding the :class:`VerdictCollector` over this app's store and cache.

    The window is the last :data:`VERDICT_WINDOW_S` before the newest sample, the overview's
    default, so a scrape and the page share cached analyses.
    """
    from api import routes, service

    def analysis() -> list[tuple[Any, dict[str, Any], dict[str, Any], float]]:
        end = routes.default_end(app)
        span = routes.Span(end - int(VERDICT_WINDOW_S * 1e9), end)
        out = []
        for dep in routes.cached_on(app, ("deployments",), service.deployments):
            env = routes.envelope_of(app, dep, span)
            strag = routes.stragglers_of(app, dep, span, routes.STRAGGLER_SLICE_S)
            out.append((dep, env, strag, env.get("computed_at_s", time.time())))
        return out

    registry = CollectorRegistry(auto_describe=False)
    registry.register(VerdictCollector(analysis))
    return registry


def _include_routers(app: FastAPI) -> None:
    """Routers added by other modules; each is optional until its module lands."""
    for name in _ROUTERS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        app.include_router(module.router)
