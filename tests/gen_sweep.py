"""A load sweep past saturation, for the envelope page (SYNTHETIC, deterministic, hand-built).

One declared deployment ``sweep70b``: 2 vLLM engines (TP4 × DP2, 8 H100s) whose running requests
ramp geometrically from 4 to 64 per engine over 30 minutes of 5 s scrapes. The engine model is
written down here, not taken from the analyzer or the simulator:

- below ``SATURATION`` running requests per engine every request decodes at ``TOK_PER_REQ_S``
  tokens/s (throughput grows in proportion to load, ITL flat at 1/``TOK_PER_REQ_S`` = 25 ms);
- past it the engine's token rate barely grows (∝ running^0.1), so ITL = running / tokens/s rises
  almost in proportion to load.

So the curve has one knee, at 2 × ``SATURATION`` = 48 running requests for the deployment, in
throughput (Cp) and in ITL p99 (the latency knee) alike. Counters carry ``rate_per_s`` as the
collector stores them: NULL on each series' first sample (the warm-up bin).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
from gen_telemetry import ITL_LE, PROFILES, TTFT_LE, Layout, _gpu_frame, lognormal_cdf

from collector.records import frame
from collector.store import Store

NS = 1_000_000_000
DEPLOYMENT = "sweep70b"
ENGINES = 2
SATURATION = 24.0  # running requests per engine where the token rate stops scaling
TOK_PER_REQ_S = 40.0
RUNNING = (4.0, 64.0)  # per engine, geometric ramp
DURATION_S, STEP_S = 1800, 5
ITL_TAIL = 1.8  # p99/p50
KNEE_RUNNING = ENGINES * SATURATION


def tokens_per_s(running: float) -> float:
    """One engine's generation rate at ``running`` requests (the model above)."""
    if running <= SATURATION:
        return TOK_PER_REQ_S * running
    return TOK_PER_REQ_S * SATURATION * (running / SATURATION) ** 0.1


def build(path: str, start_ns: int) -> dict[str, int]:
    """Write the sweep into a new store file at ``path``; returns rows written per table."""
    st = Store(path)
    try:
        lay = replace(Layout(), deployment=DEPLOYMENT, engines=ENGINES, hosts=("node0",), start_ns=start_ns,
                      duration_s=DURATION_S, step_s=STEP_S, with_collectives=False)  # fmt: skip
        ts = start_ns + np.arange(1, DURATION_S // STEP_S + 1, dtype=np.int64) * STEP_S * NS
        x = np.linspace(0.0, 1.0, len(ts))
        out = {"deployments": st.write("deployments", _deployment(lay))}
        rng = np.random.default_rng(11)
        out["gpu_samples"] = st.write("gpu_samples", _gpu_frame(PROFILES["hbm_bandwidth"], lay, ts, x, rng))
        eng, hist = _engines(ts, x)
        out["engine_samples"] = st.write("engine_samples", eng)
        out["histogram_buckets"] = st.write("histogram_buckets", hist)
        st.checkpoint()
        return out
    finally:
        st.close()


def _deployment(lay: Layout) -> Any:
    spec = {"targets": [f"{DEPLOYMENT}-engine-{e}" for e in range(ENGINES)],
            "gpus": [f"GPU-{DEPLOYMENT}-{i:02d}" for i in range(lay.gpus)]}  # fmt: skip
    return frame("deployments", [{
        "name": DEPLOYMENT, "model": "meta-llama/Llama-3.1-70B-Instruct", "gpu_type": "h100_sxm",
        "tp": lay.gpus // ENGINES, "pp": 1, "dp": ENGINES, "ep": 1, "roles": "{}",
        "nodes": json.dumps(list(lay.hosts)), "fabric": "nvlink4", "engine": "vllm", "origin": "config",
        "spec": json.dumps(spec), "updated_ns": lay.start_ns,
    }])  # fmt: skip


def _engines(ts: np.ndarray, x: np.ndarray) -> tuple[Any, Any]:
    eng: list[dict[str, Any]] = []
    hist: list[dict[str, Any]] = []
    lo, hi = RUNNING
    for e in range(ENGINES):
        ident = {"source": f"{DEPLOYMENT}-engine-{e}", "engine": str(e), "model": "llama70b", "dp_rank": -1}
        acc: dict[str, float] = {}
        for i, (t, xi) in enumerate(zip(ts.tolist(), x.tolist(), strict=True)):
            running = lo * (hi / lo) ** xi
            tok_s = tokens_per_s(running)
            itl_med = running / tok_s  # seconds between a request's tokens
            req_s = tok_s / 200.0
            ttft_med = 0.15 + 0.02 * max(running - SATURATION, 0.0)  # queueing past saturation
            eng.append(
                {**ident, "ts_ns": t, "concept": "requests_running", "value": running, "rate_per_s": None}
            )
            for concept, rate in (("generation_tokens_total", tok_s), ("itl_seconds_count", tok_s),
                                  ("ttft_seconds_count", req_s)):  # fmt: skip
                acc[concept] = acc.get(concept, 0.0) + rate * STEP_S
                eng.append({**ident, "ts_ns": t, "concept": concept, "value": acc[concept],
                            "rate_per_s": None if i == 0 else rate})  # fmt: skip
            dists = (
                ("itl_seconds", ITL_LE, tok_s * STEP_S, itl_med, ITL_TAIL),
                ("ttft_seconds", TTFT_LE, req_s * STEP_S, ttft_med, 2.0),
            )
            for concept, les, n, med, tail in dists:
                for le in les:
                    key = f"{concept}:{le}"
                    acc[key] = acc.get(key, 0.0) + n * lognormal_cdf(le, med, tail)
                    hist.append({**ident, "ts_ns": t, "concept": concept, "le": le,
                                 "cumulative_count": round(acc[key], 3)})  # fmt: skip
    return frame("engine_samples", eng), frame("histogram_buckets", hist)


def expected_itl_p99_s(running_total: float) -> float:
    """ITL p99 at a deployment load (both engines equal): the lognormal's p99."""
    r = running_total / ENGINES
    return r / tokens_per_s(r) * ITL_TAIL
