"""The FastAPI application: health, OTLP/HTTP ingest, REST, ``/metrics`` and the page.

``create_app`` takes the store to read and the sink to write through (the sidecar passes its
bounded queue; ``ioe serve`` passes the store itself), so the API never opens files itself.
Routers live in their own modules and are included here.

Rules:
  1. ``/healthz`` answers 200 while the process runs and its store is usable (503 while an
     invalidated store cannot be reopened); ``/readyz`` once the store answers (rule 7).
  2. ``/metrics`` renders every registry in ``app.state.registries`` (the sidecar's self-metrics)
     followed by the shed-requests counter and the verdicts registry (:mod:`api.verdicts`), which
     this function appends.
  3. Request bodies above ``max_body_bytes`` get 413 (:mod:`api.limits`); the OTLP receiver
     caps its decompressed body itself (``settings.otlp.max_body_bytes``).
  4. With a token configured every route needs it but ``/healthz``, ``/readyz``, ``/metrics``
     and ``/login`` (:mod:`api.auth`, the outermost middleware).
  5. With ``refresh_s`` (``ioe serve`` passes :data:`REFRESH_S`) the default window's envelope and
     latency are precomputed every ``refresh_s`` seconds (:mod:`api.refresher`), from the app's
     startup to its shutdown (the lifespan), and answered before routing (:mod:`api.fastpath`);
     without it every answer is computed on request (or cached).
  6. At most :data:`API_IN_FLIGHT` ``/api/v1`` requests, of them :data:`QUERIES_IN_FLIGHT` SQL
     queries, and :data:`OTLP_IN_FLIGHT` OTLP exports are served at once; past a cap the answer
     is 429 (503 for OTLP, which exporters retry) with ``Retry-After``, counted in
     ``ioe_api_shed_requests_total`` (:mod:`api.limits`). Precomputed answers are not counted.
     OTLP exports are decoded and written on threads of their own, not the pool analyses and
     queries share.
  7. ``/healthz`` and ``/readyz`` run on the event loop, their store probes on their own threads
     with a timeout, so no number of slow queries delays them; a store fault answers 503 with
     ``Retry-After`` and an invalidated store is reopened (:mod:`api.faults`).
  8. A body that is not JSON (or nests too deeply to parse) is a 400; a JSON body that does not
     validate is a 422.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import duckdb
from anyio import CapacityLimiter
from fastapi import FastAPI, Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.auth import AuthGate
from api.auth import router as auth_router
from api.cache import TTLCache
from api.fastpath import SnapshotFastPath
from api.faults import RETRY_AFTER_S, StoreFaults
from api.limits import Admission, BodyLimit, InFlight, ShedCounter
from api.refresher import Refresher
from api.verdicts import VerdictCollector
from collector.errors import first_line
from collector.sink import Sink
from collector.store import Store, StoreError
from ioeconf.settings import Settings

MAX_BODY_BYTES = 1 << 20  # REST bodies are small JSON documents (queries)
CACHE_TTL_S = 10.0
VERDICT_WINDOW_S = 900.0
REFRESH_S = 15.0  # rule 5: the default window's verdicts are at most this old (plus one analysis)
_ROUTERS = ("api.otlp", "api.routes", "api.page")
API_IN_FLIGHT = 64  # rule 6: beyond the shared pool's 40 threads, requests queue up to this many
QUERIES_IN_FLIGHT = 4  # each may run 30 s on every core
OTLP_IN_FLIGHT = 16  # each holds up to otlp.max_body_bytes of body while it is decoded


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
    app.state.faults = StoreFaults(store)
    app.state.shed = ShedCounter()
    app.state.otlp_in_flight = InFlight(OTLP_IN_FLIGHT)
    app.state.otlp_threads = CapacityLimiter(OTLP_IN_FLIGHT)  # its own threads: never behind queries
    for key, value in state.items():
        setattr(app.state, key, value)
    caps = {"/api/v1/query": ("query", InFlight(getattr(app.state, "queries_in_flight", QUERIES_IN_FLIGHT))),
            "/api/v1/": ("api", InFlight(getattr(app.state, "api_in_flight", API_IN_FLIGHT)))}  # fmt: skip
    app.add_middleware(Admission, caps=caps, shed=app.state.shed)  # type: ignore[arg-type]  # rule 6
    if refresh_s is not None:
        from api.routes import DEFAULT_POINTS, DEFAULT_WINDOW_S, refresh_cycle

        app.state.refresher = Refresher(lambda: refresh_cycle(app), interval_s=refresh_s)
        fast = {"state": app.state, "window_s": DEFAULT_WINDOW_S, "points": DEFAULT_POINTS}
        app.add_middleware(SnapshotFastPath, **fast)  # type: ignore[arg-type]
    app.state.registries = [*app.state.registries, app.state.shed.registry, verdict_registry(app)]
    app.add_middleware(BodyLimit, max_bytes=getattr(app.state, "max_body_bytes", MAX_BODY_BYTES),  # type: ignore[arg-type]
                       own_limits=("/v1/traces",))  # fmt: skip
    app.add_middleware(AuthGate, token=settings.token)  # type: ignore[arg-type]  # rule 4: outermost

    faults: StoreFaults = app.state.faults

    @app.get("/healthz", tags=["health"])
    async def healthz() -> Response:
        """Rule 7: 200 while the process runs and its store is usable; 503 naming the fault."""
        problem = await faults.liveness()
        if problem is None:
            return _json(200, {"status": "ok"})
        return _json(503, {"status": "store invalidated", "reason": problem}, retry=True)

    @app.get("/readyz", tags=["health"])
    async def readyz() -> Response:
        ok, got = await faults.readiness()
        if ok:
            return _json(200, {"status": "ready", "schema_version": got})
        return _json(503, {"status": "not ready", "reason": got}, retry=True)

    @app.get("/metrics", tags=["metrics"], include_in_schema=False)
    def metrics() -> Response:
        body = b"".join(generate_latest(r) for r in app.state.registries)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    app.include_router(auth_router)
    _include_routers(app)
    _error_handlers(app)
    return app


def _json(status: int, body: Any, retry: bool = False) -> Response:
    """A JSON answer; ``ensure_ascii`` so a lone surrogate quoted from a request still encodes."""
    headers = {"Retry-After": str(RETRY_AFTER_S)} if retry else None
    return Response(json.dumps(body, default=str), status, headers, media_type="application/json")


def _error_handlers(app: FastAPI) -> None:
    """Rules 7-8."""

    async def store_error(request: Request, exc: Exception) -> Response:
        if app.state.faults.seen(exc):
            message = f"store unavailable, retry later: {first_line(exc)}"
            return _json(503, {"detail": {"parameter": "store", "message": message}}, retry=True)
        return _json(500, {"detail": {"parameter": "store", "message": first_line(exc)}})

    async def invalid(request: Request, exc: Exception) -> Response:
        errors = exc.errors() if isinstance(exc, RequestValidationError) else []
        bad = [e for e in errors if e.get("type") == "json_invalid"]
        if bad:
            message = f"body is not JSON: {bad[0].get('ctx', {}).get('error', 'cannot be parsed')}"
            return _json(400, {"detail": {"parameter": "body", "message": message}})
        return _json(422, {"detail": errors})

    async def http_error(request: Request, exc: Exception) -> Response:
        # FastAPI's own 400 for a body it cannot parse (bad encoding, nesting past the recursion
        # limit) says only that; name the parameter like every other 4xx
        if isinstance(exc, StarletteHTTPException) and exc.status_code == 400 and isinstance(exc.detail, str):
            message = f"body cannot be parsed (not JSON, or nested too deeply): {exc.detail}"
            return _json(400, {"detail": {"parameter": "body", "message": message}})
        return await http_exception_handler(request, exc)  # type: ignore[arg-type]

    app.add_exception_handler(duckdb.Error, store_error)
    app.add_exception_handler(StoreError, store_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)


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

    def analysis() -> list[tuple[Any, dict[str, Any], dict[str, Any], float, dict[str, Any]]]:
        end = routes.default_end(app)
        span = routes.Span(end - int(VERDICT_WINDOW_S * 1e9), end)
        out = []
        for dep in routes.cached_on(app, ("deployments",), service.deployments):
            env = routes.envelope_of(app, dep, span)
            strag = routes.stragglers_of(app, dep, span, routes.STRAGGLER_SLICE_S)
            phases = routes.phases_of(app, dep, span)
            out.append((dep, env, strag, env.get("computed_at_s", time.time()), phases))
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
