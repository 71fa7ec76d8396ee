"""Whole-deployment reports over a store connection: the objects the CLI, the API and the demo share.

* :func:`build_report` — per deployment: zone verdict with evidence, Cp, headroom, p99 regression.
  Collective evidence comes from :mod:`analyzer.collectives` over the deployment's own
  communicators; the expected latency from :mod:`analyzer.perf` for its model, GPU and layout.
* :func:`plan_for_deployment` — the planner over the deployment's measured workload, with its
  current layout as the baseline and what the best change buys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import duckdb

from analyzer import catalog, modelcfg, perf, planner, stragglers
from analyzer.capacity import Layout
from analyzer.deployments import ENGINE_KEY_SQL, IN_TEXTS, Deployment, has_points, texts
from analyzer.envelope import analyze_deployment
from analyzer.latency import shared_reads
from analyzer.regression import p99_regression
from analyzer.straggler_backing import expected_segment_us
from analyzer.thresholds import Thresholds

NS = 1_000_000_000


def latest_ns(con: duckdb.DuckDBPyConnection) -> int | None:
    """The newest engine or GPU sample time in the store, or None when it holds neither.

    In the series layout the points tables are read (every point has its series, so their newest
    time is the view's, without joining every point to its series: 1.5-16 ms instead of
    72-155 ms on an hour of 64 GPUs, and it grew with the store)."""
    engine, gpu = (f"{t}_points" if has_points(con, t) else t for t in ("engine_samples", "gpu_samples"))
    row = con.execute(
        f"SELECT greatest(coalesce((SELECT max(ts_ns) FROM {engine}), 0),"
        f" coalesce((SELECT max(ts_ns) FROM {gpu}), 0))"
    ).fetchone()
    return int(row[0]) if row and row[0] else None


def expected_latency_for(dep: Deployment) -> Any:
    """An ``ExpectedLatency`` callable for the envelope, or None when model or GPU is unknown.

    The model gets the deployment's own layout, GPU, node size and inter-node fabric, at the
    measured running requests per replica and prompt length; ``itl_single_domain_s`` is the same
    batch with the whole group inside one NVLink domain (what the layout would cost without the
    network)."""
    try:
        model = modelcfg.load(dep.model)
        gpu = catalog.gpu(dep.gpu_type or "h100_sxm")
        inter = catalog.fabric(dep.fabric or "ib_ndr")
    except (KeyError, ValueError, OSError):
        return None
    layout = Layout(tp=dep.tp, pp=dep.pp, dp=1, ep=dep.ep)
    real = perf.Topology.for_gpu(gpu, inter)
    one_domain = perf.Topology(
        gpus_per_node=max(layout.gpus_per_replica, dep.ep, gpu.domain_gpus), inter_node=inter
    )
    replicas = max(dep.dp, 1)

    def expected(_dep: Deployment, load: Mapping[str, float]) -> Mapping[str, float] | None:
        running = max(1, round((load.get("running") or 1) / replicas))
        isl = max(1, round(load.get("prompt_tokens_per_request") or 1024))
        try:
            est = perf.expected_latency(model, gpu, layout, running, isl, 256, topo=real)
            alone = perf.expected_latency(model, gpu, layout, running, isl, 256, topo=one_domain)
        except (ValueError, ZeroDivisionError):
            return None
        return {"itl_s": est.tpot_s, "ttft_s": est.ttft_s, "itl_single_domain_s": alone.tpot_s}

    return expected


def expected_segments_for(
    con: duckdb.DuckDBPyConnection, dep: Deployment, start_ns: int, end_ns: int
) -> dict[str, float]:
    """Communicator → the model's compute segment between two TP all-reduces, µs (stragglers
    rule 7 backs a two-rank verdict with it), for a TP2 deployment whose model and GPU are known.

    The decode step is modelled at the mean ``requests_running`` per engine in the window (1 when
    none is scraped) and a mean context of 1,152 tokens (a 1,024-token prompt plus half of 256
    output tokens, the same defaults as :func:`expected_latency_for`)."""
    if dep.tp != 2 or not dep.comm_ids:
        return {}
    try:
        model, gpu = modelcfg.load(dep.model), catalog.gpu(dep.gpu_type or "h100_sxm")
    except (KeyError, ValueError, OSError):
        return {}
    row = con.execute(
        "SELECT avg(value) FROM engine_samples WHERE concept = 'requests_running' "
        "AND ts_ns > ? AND ts_ns <= ? "
        f"AND {ENGINE_KEY_SQL} {IN_TEXTS}",
        [start_ns, end_ns, texts(dep.engine_keys)],
    ).fetchone()
    running = max(1, round(row[0])) if row and row[0] else 1
    layout = Layout(tp=dep.tp, pp=dep.pp, dp=1, ep=dep.ep)
    try:
        seg = expected_segment_us(model, gpu, layout, running, 1024 + 256 / 2)["segment_us"]
    except (ValueError, ZeroDivisionError):
        return {}
    return dict.fromkeys(dep.comm_ids, seg)


def straggler_in(
    con: duckdb.DuckDBPyConnection, dep: Deployment, start_ns: int, end_ns: int
) -> Mapping[str, Any] | None:
    """The worst straggler on ``dep``'s communicators (the regression's straggler axis), or None."""
    if not dep.comm_ids:
        return None
    expected = expected_segments_for(con, dep, start_ns, end_ns)
    found = stragglers.analyze(con, comm_ids=list(dep.comm_ids), expected_us=expected)
    worst = [s for ranks in found["origins"].values() for s in ranks]
    if not worst:
        return None
    top = max(worst, key=lambda s: s["blame_us"])
    return {k: top[k] for k in ("rank", "host", "gpu", "kind", "cause", "blame_us")}


def deployment_report(
    con: duckdb.DuckDBPyConnection,
    dep: Deployment,
    start_ns: int,
    end_ns: int,
    th: Thresholds | None = None,
    *,
    history_s: float = 86400.0,
) -> dict[str, Any]:
    """The one front door: a deployment's zone verdict with evidence, Cp, headroom and p99
    regression over ``(start_ns, end_ns]`` under the analysis settings ``th``. Every surface (the
    CLI, the demo, the API, the page, ``/metrics`` and the refresher) reads verdicts through it, so
    one store, window and settings give one answer everywhere."""
    th = th or Thresholds()
    with shared_reads():  # the envelope and the regression read the same window's increases once
        report = analyze_deployment(
            con, dep, start_ns, end_ns, th, history_s=history_s, expected_latency=expected_latency_for(dep)
        )
        report["regression"] = p99_regression(con, dep, start_ns, end_ns, th).as_dict()
    report["settings"] = th.model_dump()
    return report


def build_report(
    con: duckdb.DuckDBPyConnection,
    deps: list[Deployment],
    end_ns: int,
    window_s: float,
    th: Thresholds | None = None,
) -> dict[str, Any]:
    """The JSON document of ``ioe analyze --json`` (the API serves the same objects)."""
    th = th or Thresholds()
    start_ns = end_ns - int(window_s * NS)
    out = [deployment_report(con, dep, start_ns, end_ns, th) for dep in deps]
    return {"window": {"start_ns": start_ns, "end_ns": end_ns, "seconds": window_s}, "deployments": out}


def plan_for_deployment(
    con: duckdb.DuckDBPyConnection,
    deployment: str,
    *,
    ttft_slo_s: float = 2.0,
    tpot_slo_s: float = 0.05,
    backend: str = "vllm",
    precision: str = "bf16",
    top: int = 5,
) -> dict[str, Any]:
    """Ranked layouts for ``deployment``'s measured workload, its current layout as the baseline."""
    work = planner.workload_from_store(con, deployment, ttft_slo_s, tpot_slo_s)
    layout, info = planner.current_layout(con, deployment)
    nodes = _node_count(con, deployment)
    prob = planner.Problem(
        modelcfg.load(info["model"]), catalog.gpu(info["gpu"] or "h100_sxm"), layout.gpus, nodes,
        catalog.fabric(info["fabric"] or "ib_ndr"), backend, precision,
    )  # fmt: skip
    ranked = planner.search(prob, work)
    base = planner.evaluate(prob, layout, work)
    return {
        "deployment": deployment,
        "problem": {
            "model": prob.model.name,
            "gpu": prob.gpu.name,
            "gpus": prob.gpus,
            "nodes": prob.nodes,
            "fabric": prob.fabric.name,
        },
        "workload": asdict(work),
        "baseline": base.as_dict(),
        "candidates": [c.as_dict() for c in ranked[:top]],
        "verdict": planner.compare(base, ranked[0]) if ranked else "no layout meets the SLOs",
    }


def _node_count(con: duckdb.DuckDBPyConnection, deployment: str) -> int:
    row = con.execute(
        "SELECT json_array_length(nodes) FROM deployments WHERE name = ?", [deployment]
    ).fetchone()
    return max(int(row[0] or 1), 1) if row else 1
