"""``ioe plan``: ranked parallel layouts for a model, GPU budget, topology and workload."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from analyzer import catalog, modelcfg, perf, planner
from collector.store import Store
from ioe.commands._common import readable_store


def _from_store(store: Path, deployment: str, ttft: float, tpot: float) -> tuple[Any, Any, dict[str, Any]]:
    """The deployment's workload, current layout, declaration (model, GPU, fabric, nodes, engine,
    precision) and measured median TTFT / ITL."""
    # a store a running sidecar holds is read from a snapshot; a corrupt one is one line and exit 2
    with readable_store("ioe plan", store) as path, Store(path, read_only=True) as st, st.cursor() as cur:
        work = planner.workload_from_store(cur, deployment, ttft, tpot)
        layout, info = planner.current_layout(cur, deployment)
        ctx = planner.deployment_context(cur, deployment)
        m_ttft, m_itl, _ = planner.measured_latency(cur, deployment)
    return work, layout, {**info, **ctx, "ttft_s": m_ttft, "itl_s": m_itl}


def plan(
    model: str = typer.Option("", "--model", help="Shipped model name or config.json path."),
    gpu: str = typer.Option("", "--gpu"),
    gpus: int = typer.Option(0, "--gpus", min=0, help="GPU budget (default: the current layout's)."),
    nodes: int = typer.Option(1, "--nodes", min=1),
    fabric: str = typer.Option("ib_ndr", "--fabric", help="Inter-node fabric."),
    isl: int = typer.Option(1024, "--isl", min=1),
    osl: int = typer.Option(256, "--osl", min=1),
    ttft_slo: float = typer.Option(2.0, "--ttft-slo", help="Seconds."),
    tpot_slo: float = typer.Option(0.05, "--tpot-slo", help="Seconds."),
    backend: str = typer.Option("vllm", "--backend"),
    precision: str = typer.Option("bf16", "--precision"),
    deployment: str = typer.Option("", "--deployment", help="Plan for this deployment's measured workload."),
    store: Path | None = typer.Option(None, "--store"),
    top: int = typer.Option(8, "--top", min=1),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Rank TP/PP/DP/EP/attention-DP and P/D layouts by goodput per GPU within the SLOs."""
    work = planner.Workload(isl, osl, ttft_slo, tpot_slo)
    baseline_layout = None
    info: dict[str, Any] = {}
    backend, precision = backend.lower(), precision.lower()
    try:
        if deployment:
            if store is None:
                raise ValueError("--deployment needs --store")
            work, baseline_layout, info = _from_store(store, deployment, ttft_slo, tpot_slo)
            model, gpu = model or info["model"], gpu or info["gpu"]
            fabric = info["fabric"] or fabric
            gpus = gpus or baseline_layout.gpus
            nodes = max(nodes, int(info["nodes"]))
            precision = info["precision"] or precision
            backend = info["engine"] if info["engine"] in perf.EFFICIENCY else backend
        prob = planner.Problem(modelcfg.load(model), catalog.gpu(gpu or "h100_sxm"), gpus or 8, nodes,
                               catalog.fabric(fabric), backend, precision)  # fmt: skip
        if baseline_layout is not None:
            fix = planner.fit_correction(prob, baseline_layout, work, info["ttft_s"], info["itl_s"])
            prob = replace(prob, correction=fix)
        ranked = planner.search(prob, work)
    except (ValueError, KeyError) as exc:
        typer.echo(f"plan refused: {str(exc).strip(chr(34))}", err=True)
        raise typer.Exit(2) from exc
    out: dict[str, Any] = {"model": prob.model.name, "gpu": prob.gpu.name, "gpus": prob.gpus, "nodes": nodes,
                           "fabric": prob.fabric.name, "backend": prob.backend, "precision": prob.precision,
                           "workload": work.__dict__,
                           "correction": {"tpot_factor": prob.correction.tpot_factor,
                                          "ttft_factor": prob.correction.ttft_factor,
                                          "evidence": list(prob.correction.evidence)},
                           "candidates": [c.as_dict() for c in ranked[:top]]}  # fmt: skip
    if baseline_layout is not None:
        base = planner.evaluate(prob, baseline_layout, work)
        out["baseline"] = base.as_dict()
        out["change"] = planner.compare(base, ranked[0])
    if as_json:
        typer.echo(json.dumps(out, indent=2, default=str, allow_nan=False))
        return
    for line in prob.correction.evidence:
        typer.echo(f"correction: {line}")
    for i, c in enumerate(ranked[:top], 1):
        d = c.as_dict()
        if c.infeasible:
            typer.echo(f"{i}. {c.name}: infeasible: {c.infeasible}")
        else:
            typer.echo(f"{i}. {c.name}: {d['goodput_tok_s_per_gpu']} tok/s/GPU, TTFT {d['ttft_ms']} ms, "
                       f"TPOT {d['tpot_ms']} ms, wall {c.wall}")  # fmt: skip
        for r in c.reasons:
            typer.echo(f"     - {r}")
    if "change" in out:
        typer.echo(out["change"])


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
