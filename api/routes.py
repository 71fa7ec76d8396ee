"""``/api/v1``: deployments, envelope, latency, request phases, GPU/fabric series, collectives,
stragglers, plan, targets, and read-only queries. Thin: validate (:mod:`api.params`), call :mod:`api.service`
through the app's TTL cache, serialize (:mod:`api.models`).

Rules:
  1. With a token configured, every route here needs it (:class:`api.auth.AuthGate`).
  2. Every analysis result is cached per (route, deployment, window, options) for
     ``app.state.cache.ttl_s`` seconds; concurrent identical requests share one computation.
  3. Non-finite floats (NaN, ±inf) from the analyzer are served as ``null`` (JSON has no NaN).
  4. Chart routes cache their validated, serialized body too, so a cache hit costs routing and a
     copy of bytes, not a validation pass over thousands of points.
  5. The envelope and latency routes answer on the event loop when the answer is already
     computed — the refresher's snapshot of the default window (:mod:`api.refresher`, with its
     ``Age``), else a fresh cached body — and send only misses to the thread pool.
  6. The default window ends at the newest sample: the refresher's latest cycle's end while it
     runs (so the overview, ``/metrics`` and the routes share its analyses), else the cached
     newest sample time.
  7. The envelope and the deployment list take any analysis setting as a query parameter for one
     request (:mod:`api.analysis_params`): validated over the server's settings, cached under its
     own key, never answered from the refresher's snapshot.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import duckdb
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from analyzer.report import latest_ns
from api import models, service
from api.analysis_params import Overrides, analysis_overrides, analysis_settings, merged
from api.cache import MISSING
from api.faults import fault_kind
from api.params import (
    AT_PATTERN,
    WINDOW_PATTERN,
    ParamError,
    check_name,
    parse_at,
    parse_window,
    unknown_deployment,
)
from api.query import run_query
from api.refresher import Cycle
from collector.readonly import ReadOnlyQueryError
from collector.records import TABLES

log = logging.getLogger("ioe.api")
NS = 1_000_000_000
STRAGGLER_SLICE_S = 10.0
DEFAULT_WINDOW, DEFAULT_POINTS = "15m", 120
DEFAULT_WINDOW_S = parse_window(DEFAULT_WINDOW)


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": models.Problem, "description": "A parameter is malformed; `detail.parameter` names it."},
    401: {"model": models.Problem, "description": "Bearer token missing or wrong (when one is configured)."},
    404: {"model": models.Problem, "description": "No such deployment; `detail.known` lists them."},
    422: {"model": models.Problem, "description": "Request does not validate."},
}
router = APIRouter(prefix="/api/v1", responses=_ERRORS)

NameParam = Annotated[
    str,
    Path(
        description="Deployment name (any characters but control characters, which name no deployment: "
        "404; `/` as is or `%2F`)",
        max_length=256,
    ),
]
WindowParam = Annotated[
    str, Query(description="Window length: whole number with s, m, h or d, up to 31d", pattern=WINDOW_PATTERN)
]
AtParam = Annotated[
    str | None,
    Query(description="Window end: Unix seconds or ISO-8601 (default: newest sample)", pattern=AT_PATTERN),
]
PointsParam = Annotated[int, Query(ge=10, le=2000, description="At most this many bins per series")]


@dataclass(frozen=True)
class Span:
    start_ns: int
    end_ns: int

    def window(self) -> dict[str, Any]:
        return {
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "seconds": (self.end_ns - self.start_ns) / NS,
        }


def cached(request: Request, key: tuple[Any, ...], fn: Callable[[duckdb.DuckDBPyConnection], Any]) -> Any:
    """Rule 2 and 3: ``fn(cursor)`` through the app's cache, NaN-free."""
    return cached_on(request.app, key, fn)


def cached_on(app: Any, key: tuple[Any, ...], fn: Callable[[duckdb.DuckDBPyConnection], Any]) -> Any:
    def compute() -> Any:
        with app.state.store.cursor() as cur:
            return finite(fn(cur))

    return app.state.cache.get(key, compute)


def as_json(
    request: Request, key: tuple[Any, ...], model: type[BaseModel], build: Callable[[], Any]
) -> Response:
    """Rule 4: the body validated against ``model`` once, cached as JSON bytes with the analysis."""
    body = request.app.state.cache.get(("json", *key), lambda: to_json(model, build()))
    return Response(body, media_type="application/json")


def to_json(model: type[BaseModel], value: Any) -> bytes:
    return model.model_validate(value).model_dump_json().encode()


def finite(obj: Any) -> Any:
    """Rule 3, recursively over dicts, lists and tuples."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def span(request: Request, window: WindowParam = DEFAULT_WINDOW, at: AtParam = None) -> Span:
    seconds = parse_window(window)
    end_ns = parse_at(at)
    if end_ns is None:
        end_ns = default_end(request.app)
    return Span(end_ns - int(seconds * NS), end_ns)


def default_end(app: Any) -> int:
    """Rule 6."""
    refresher = getattr(app.state, "refresher", None)
    end = refresher.end_ns() if refresher is not None else None
    if end is None:
        end = cached_on(app, ("latest",), latest_ns)
    return end if end is not None else time.time_ns()


SpanDep = Annotated[Span, Depends(span)]


def deployment(request: Request, name: NameParam) -> Any:
    check_name(name)
    deps = cached(request, ("deployments",), service.deployments)
    for d in deps:
        if d.name == name:
            return d
    raise unknown_deployment(name, [d.name for d in deps])


DepDep = Annotated[Any, Depends(deployment)]
SettingsDep = Annotated[Overrides, Depends(analysis_overrides)]


@router.get("/deployments", response_model=models.DeploymentList, summary="Deployments at a glance")
def list_deployments(request: Request, s: SpanDep, given: SettingsDep) -> dict[str, Any]:
    """Every deployment (declared, then inferred) with its zone, p99s, KV headroom, Cp and stragglers.

    Any analysis setting may be given as a query parameter for this request (:mod:`api.analysis_params`)."""
    deps = cached(request, ("deployments",), service.deployments)
    return {"window": s.window(), "deployments": [_row(request, d, s, given) for d in deps]}


def _row(request: Request, dep: Any, s: Span, given: Overrides = ()) -> dict[str, Any]:
    try:
        env = envelope_of(request.app, dep, s, given)
        strag = _stragglers(request, dep, s, STRAGGLER_SLICE_S)
    except (duckdb.Error, ValueError, KeyError) as exc:  # one broken deployment must not hide the rest
        return {"deployment": dep.summary(), "glance": {"error": str(exc).splitlines()[0]}}
    p99 = {m["metric"]: m["now_s"] for m in env["regression"]["metrics"]}
    glance = {"zone": env["envelope"]["primary"], "secondary": env["envelope"]["secondary"],
              "confidence": env["envelope"]["confidence"], "ttft_p99_s": p99.get("ttft_seconds"),
              "itl_p99_s": p99.get("itl_seconds"), "kv_sequences_left": env["headroom"]["kv_sequences_left"],
              "cp": env["cp"]["cp"], "stragglers": len(strag["stragglers"])}  # fmt: skip
    return {"deployment": dep.summary(), "glance": glance}


def envelope_of(app: Any, dep: Any, s: Span, given: Overrides = ()) -> dict[str, Any]:
    """The envelope report (shared by the route, the overview and ``/metrics``): the refresher's
    when it holds this span and the request sets no analysis setting (rule 6), else cached under
    the settings' own key."""
    refresher = getattr(app.state, "refresher", None)
    snap = refresher.get(("envelope", dep.name)) if refresher is not None and not given else None
    if snap is not None and snap.value["window"]["start_ns"] == s.start_ns and snap.end_ns == s.end_ns:
        return snap.value  # type: ignore[no-any-return]
    th = merged(analysis_settings(app), given)
    return cached_on(
        app,
        ("envelope", dep.name, s, given),
        lambda c: {
            **service.envelope(c, dep, s.start_ns, s.end_ns, th),
            "settings_from_request": [k for k, _ in given],
        },
    )  # type: ignore[no-any-return]


def stragglers_of(app: Any, dep: Any, s: Span, slice_s: float) -> dict[str, Any]:
    return cached_on(app, ("stragglers", dep.name, s, slice_s),  # type: ignore[no-any-return]
                     lambda c: service.stragglers(c, dep, s.start_ns, s.end_ns, slice_s))  # fmt: skip


def _envelope(request: Request, dep: Any, s: Span, given: Overrides = ()) -> dict[str, Any]:
    return envelope_of(request.app, dep, s, given)


def ready_answer(
    request: Request, route: str, name: str, window: str, at: str | None, *extra: Any
) -> Response | None:
    """Rule 5: the already computed answer, or ``None`` (a miss: compute in the thread pool).

    Never computes and never waits; parameters are parsed (and refused) as the slow path would.
    A stale cached body is answered too, and its refresh runs in the background (cache rule 7)."""
    check_name(name)
    seconds, end_ns = parse_window(window), parse_at(at)
    app = request.app
    refresher = getattr(app.state, "refresher", None)
    if refresher is not None and end_ns is None and seconds == DEFAULT_WINDOW_S and extra == _DEFAULTS[route]:
        snap = refresher.get((route, name))
        if snap is not None:
            return refresher.response(snap)  # type: ignore[no-any-return]
    if end_ns is None:
        end_ns = refresher.end_ns() if refresher is not None else None
        end_ns = app.state.cache.peek(("latest",)) if end_ns is None else end_ns
        if end_ns is MISSING or end_ns is None:
            return None
    s = Span(end_ns - int(seconds * NS), end_ns)
    key = ("json", route, name, s, *extra)
    body, claim = app.state.cache.peek_stale(key)
    if claim:
        slow = _envelope_route if route == "envelope" else _latency_route
        _in_background(app, key, lambda: slow(request, name, window, at, *extra))
    return None if body is MISSING else Response(body, media_type="application/json")


def _in_background(app: Any, key: tuple[Any, ...], refresh: Callable[[], Any]) -> None:
    """Cache rule 7: ``refresh`` in the thread pool, not awaited; the claim is released after."""

    async def run() -> None:
        try:
            await run_in_threadpool(refresh)
        except Exception as exc:  # the next caller that computes it gets the error itself
            log.info("background refresh of %r failed: %s", key[:3], exc)
        finally:
            app.state.cache.refreshed(key)

    task = asyncio.get_running_loop().create_task(run())
    app.state.tasks.add(task)  # a reference until done: the loop keeps only weak ones
    task.add_done_callback(app.state.tasks.discard)


_DEFAULTS: dict[str, tuple[Any, ...]] = {"envelope": ((),), "latency": (DEFAULT_POINTS,)}


@router.get("/deployments/{name:path}/envelope", response_model=models.Envelope, summary="Envelope verdict")
async def envelope(
    request: Request,
    name: NameParam,
    given: SettingsDep,
    window: WindowParam = DEFAULT_WINDOW,
    at: AtParam = None,
) -> Response:
    """Zone with every signal as evidence, Cp (24 h history), headroom per axis, p99 regressions.

    The default window (15 min ending at the newest sample) is precomputed on a schedule when the
    server runs a refresher: such answers carry ``Age`` and ``Cache-Control: max-age`` headers.
    Any analysis setting may be given as a query parameter (``?bin_s=30``): such a request is
    computed under the server's settings with those fields replaced, never read from the snapshot;
    ``settings`` in the answer holds every value in force."""
    got = ready_answer(request, "envelope", name, window, at, given)
    if got is not None:
        return got
    return await run_in_threadpool(_envelope_route, request, name, window, at, given)


def _envelope_route(
    request: Request, name: str, window: str, at: str | None, given: Overrides = ()
) -> Response:
    dep, s = deployment(request, name), span(request, window, at)
    return as_json(
        request, ("envelope", dep.name, s, given), models.Envelope, lambda: _envelope(request, dep, s, given)
    )


@router.get("/deployments/{name:path}/latency", response_model=models.Latency, summary="Latency quantiles")
async def latency(
    request: Request,
    name: NameParam,
    window: WindowParam = DEFAULT_WINDOW,
    at: AtParam = None,
    points: PointsParam = DEFAULT_POINTS,
) -> Response:
    """Quantiles of every engine histogram over the window and TTFT/ITL p50/p99 per bin.

    All values are **bucket estimates** (linear interpolation inside the histogram bucket).
    Default-window answers may be precomputed (``Age`` header), as for the envelope."""
    got = ready_answer(request, "latency", name, window, at, points)
    if got is not None:
        return got
    return await run_in_threadpool(_latency_route, request, name, window, at, points)


def _latency_route(request: Request, name: str, window: str, at: str | None, points: int) -> Response:
    dep, s = deployment(request, name), span(request, window, at)
    key = ("latency", dep.name, s, points)

    def build() -> dict[str, Any]:
        got = cached(request, key, lambda c: service.latency(c, dep, s.start_ns, s.end_ns, points))
        return latency_body(dep, s, got)

    return as_json(request, key, models.Latency, build)


def latency_body(dep: Any, s: Span, got: dict[str, Any]) -> dict[str, Any]:
    note = "bucket estimates: quantiles interpolated inside histogram buckets, not exact"
    return {"deployment": dep.name, "window": s.window(), "note": note, **got}


def refresh_cycle(app: Any) -> Cycle:
    """The refresher's work (rule 6): every deployment's default-window envelope and latency."""
    with app.state.store.cursor() as cur:
        end_ns = latest_ns(cur) or time.time_ns()
        deps = service.deployments(cur)
    s = Span(end_ns - int(DEFAULT_WINDOW_S * NS), end_ns)

    def run(dep: Any, route: str) -> tuple[bytes, Any]:
        with app.state.store.cursor() as cur:
            if route == "envelope":
                value = finite(service.envelope(cur, dep, s.start_ns, s.end_ns, analysis_settings(app)))
                return to_json(models.Envelope, value), value
            got = finite(service.latency(cur, dep, s.start_ns, s.end_ns, DEFAULT_POINTS))
            return to_json(models.Latency, latency_body(dep, s, got)), got

    work = [((r, d.name), lambda d=d, r=r: run(d, r)) for d in deps for r in ("envelope", "latency")]
    return Cycle(end_ns, work)


def phases_of(app: Any, dep: Any, s: Span) -> dict[str, Any]:
    """The request-phase report (shared by the route and ``/metrics``), cached."""
    return cached_on(app, ("phases", dep.name, s),  # type: ignore[no-any-return]
                     lambda c: service.phases(c, dep, s.start_ns, s.end_ns))  # fmt: skip


@router.get("/deployments/{name:path}/phases", response_model=models.Phases, summary="Request phases")
def phases(request: Request, dep: DepDep, s: SpanDep) -> Response:
    """Queue, prefill, KV-transfer, decode and end-to-end times per request, and what TTFT is made of.

    With request spans (OTLP) every quantile is **exact** over the observed requests and TTFT is
    decomposed into the mean of each part and its share; without enough spans the engine's
    request-phase histograms stand in, labelled **bucket estimates** (no decomposition then)."""

    def build() -> dict[str, Any]:
        return {"deployment": dep.name, "window": s.window(), **phases_of(request.app, dep, s)}

    return as_json(request, ("phases", dep.name, s), models.Phases, build)


@router.get("/deployments/{name:path}/gpu", response_model=models.GpuSeries, summary="GPU activity series")
def gpu(request: Request, dep: DepDep, s: SpanDep, points: PointsParam = 120) -> Response:
    """SM, tensor and DRAM activity and GPU utilization, downsampled to ``points`` bins."""

    def build() -> dict[str, Any]:
        got = cached(request, ("gpu", dep.name, s, points),
                     lambda c: service.gpu_series(c, dep, s.start_ns, s.end_ns, points))  # fmt: skip
        return {"deployment": dep.name, "window": s.window(), **got}

    return as_json(request, ("gpu", dep.name, s, points), models.GpuSeries, build)


@router.get("/deployments/{name:path}/fabric", response_model=models.FabricSeries, summary="Fabric series")
def fabric(request: Request, dep: DepDep, s: SpanDep, points: PointsParam = 120) -> Response:
    """NVLink/PCIe bytes/s per GPU and InfiniBand/RoCE bytes/s per node, downsampled."""

    def build() -> dict[str, Any]:
        got = cached(request, ("fabric", dep.name, s, points),
                     lambda c: service.fabric_series(c, dep, s.start_ns, s.end_ns, points))  # fmt: skip
        return {"deployment": dep.name, "window": s.window(), **got}

    return as_json(request, ("fabric", dep.name, s, points), models.FabricSeries, build)


@router.get("/deployments/{name:path}/collectives", response_model=models.Collectives, summary="Collectives")
def collectives(request: Request, dep: DepDep, s: SpanDep) -> dict[str, Any]:
    """Per communicator and op: time, wait (arrival skew) vs transfer, busbw, p99/p50 jitter."""
    got = cached(request, ("collectives", dep.name, s),
                 lambda c: service.collectives(c, dep, s.start_ns, s.end_ns))  # fmt: skip
    return {"deployment": dep.name, "window": s.window(), **got}


def _stragglers(request: Request, dep: Any, s: Span, slice_s: float) -> dict[str, Any]:
    return stragglers_of(request.app, dep, s, slice_s)


@router.get(
    "/deployments/{name:path}/stragglers", response_model=models.Stragglers, summary="Straggler ranks"
)
def stragglers(
    request: Request,
    dep: DepDep,
    s: SpanDep,
    slice_s: Annotated[
        float, Query(ge=1, le=3600, description="Persistence slice, seconds")
    ] = STRAGGLER_SLICE_S,
) -> Response:
    """Slow ranks (arrival order tested per window, false discoveries controlled; persistent or
    intermittent) with causes from their telemetry, and the rank × time blame heat map."""

    def build() -> dict[str, Any]:
        return {"deployment": dep.name, "window": s.window(), **_stragglers(request, dep, s, slice_s)}

    return as_json(request, ("stragglers", dep.name, s, slice_s), models.Stragglers, build)


@router.get("/deployments/{name:path}/plan", response_model=models.Plan, summary="Re-parallelization plan")
def plan(
    request: Request,
    dep: DepDep,
    ttft_slo_s: Annotated[float, Query(gt=0, le=600)] = 2.0,
    tpot_slo_s: Annotated[float, Query(gt=0, le=10)] = 0.05,
    top: Annotated[int, Query(ge=1, le=50)] = 8,
) -> dict[str, Any]:
    """Ranked layouts for the deployment's model, GPUs and measured workload vs its current layout."""
    try:
        got = cached(request, ("plan", dep.name, ttft_slo_s, tpot_slo_s, top),
                     lambda c: service.plan(c, dep, ttft_slo_s, tpot_slo_s, top))  # fmt: skip
    except (ValueError, KeyError) as exc:
        raise ParamError("name", f"cannot plan: {str(exc).strip(chr(34))}", status=422) from exc
    return {"deployment": dep.name, **got}


# Last of the deployment routes: ``{name:path}`` would also match ``<name>/envelope`` and the like.
@router.get("/deployments/{name:path}", response_model=models.DeploymentDetail, summary="One deployment")
def deployment_detail(request: Request, dep: DepDep) -> dict[str, Any]:
    """Layout, owned sources (engine series, GPUs, communicators), SLOs and the sources' health."""
    sources = cached(request, ("sources", dep.name), lambda c: service.sources_health(c, dep))
    return {"deployment": dep.summary(), "engine_keys": list(dep.engine_keys),
            "gpu_uuids": list(dep.gpu_uuids), "comm_ids": list(dep.comm_ids),
            "slo": {"ttft_s": dep.ttft_slo_s, "itl_s": dep.itl_slo_s}, "sources": sources}  # fmt: skip


@router.get("/targets", response_model=models.TargetList, summary="Sources' health")
def targets(request: Request) -> dict[str, Any]:
    """Every scrape target or source with its latest health (the ``targets`` table)."""
    return {"targets": cached(request, ("targets",), lambda c: service.targets(c))}


@router.get("/tables", response_model=list[models.TableInfo], summary="Store tables for queries")
def tables() -> list[dict[str, Any]]:
    """The tables a query may read, with their columns' types and natural keys."""
    return [
        {"name": t.name, "doc": t.doc, "columns": dict(t.columns), "key": list(t.key)}
        for t in TABLES.values()
    ]


@router.post("/query", response_model=models.QueryResult, summary="Read-only SQL query")
def query(request: Request, body: models.QueryRequest) -> dict[str, Any]:
    """One SELECT over the store's tables; no writes, files, attachments or extensions; time/row limited."""
    try:
        with request.app.state.store.cursor() as cur:
            df = run_query(cur, body.sql, max_rows=body.max_rows, timeout_s=body.timeout_s)
    except ReadOnlyQueryError as exc:
        if fault_kind(exc.__cause__) is not None:  # the store failed, not the query: 503 (api.faults)
            raise exc.__cause__ from exc  # type: ignore[misc]
        raise HTTPException(400, detail={"parameter": "sql", "message": str(exc)}) from exc
    rows = [finite(list(r)) for r in df.iter_rows()]
    return {"columns": df.columns, "types": [str(t) for t in df.dtypes], "rows": rows,
            "truncated": df.height >= body.max_rows}  # fmt: skip
