"""Realistic telemetry generators for the envelope tests and benchmark (SYNTHETIC, deterministic).

Each zone is a :class:`Profile`: how GPU activity, engine gauges and latency distributions move
as load ramps from ``running_lo`` to ``running_hi`` requests over the window. :func:`generate`
writes the store tables a sidecar would (``gpu_samples``, ``engine_samples`` with counter rates,
``histogram_buckets`` with vLLM's default buckets, ``collective_records``, ``nccl_baselines``,
``deployments``) through :func:`collector.records.frame` and ``Store.write``.

Latencies are lognormal: a histogram's bucket counts are ``n × CDF(le)`` of a lognormal with the
profile's median and ``p99/p50`` ratio, accumulated per sample as the engine's counters would be.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from collector.records import frame
from collector.store import Store

NS = 1_000_000_000
T0_NS = 1_767_225_600 * NS  # 2026-01-01T00:00:00Z
ITL_LE = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
          80.0, math.inf)  # fmt: skip
TTFT_LE = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
           40.0, 80.0, 160.0, 640.0, 2560.0, math.inf)  # fmt: skip
PHASE_LE = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
            480.0, 960.0, 1920.0, 7680.0, math.inf)  # fmt: skip
Z99 = 2.3263


@dataclass(frozen=True)
class Profile:
    """One zone's telemetry as a function of load fraction x ∈ [0, 1] (lo → hi)."""

    name: str
    running_lo: float  # per engine
    running_hi: float
    sm: tuple[float, float]
    tensor: tuple[float, float]
    dram: tuple[float, float]
    kv: tuple[float, float]
    waiting_ratio: float  # waiting / running
    preempt_per_s: float  # per engine
    itl_p50_s: tuple[float, float]
    itl_tail: tuple[float, float]  # p99/p50 at lo, hi
    ttft_p50_s: tuple[float, float]
    queue_share: float  # mean queue time / mean TTFT
    tok_elasticity: float  # generation tokens/s ∝ running^this
    tok_per_req_s: float  # tokens/s per running request at lo
    prompt_per_gen: float  # prompt tokens per generated token
    coll_share: float  # collective exec time / wall per rank
    busbw_gbs: float
    nnodes: int = 1


def _lerp(pair: tuple[float, float], x: float) -> float:
    return pair[0] + (pair[1] - pair[0]) * x


PROFILES: dict[str, Profile] = {
    "compute": Profile("compute", 8, 14, (0.85, 0.9), (0.62, 0.7), (0.35, 0.4), (0.4, 0.5), 0.05, 0.0,
                       (0.030, 0.036), (1.8, 1.9), (0.6, 0.8), 0.1, 0.9, 30.0, 8.0, 0.04, 380.0),
    "hbm_bandwidth": Profile("hbm_bandwidth", 32, 64, (0.55, 0.62), (0.18, 0.22), (0.72, 0.8), (0.55, 0.7),
                             0.02, 0.0, (0.020, 0.028), (1.6, 1.7), (0.15, 0.2), 0.1, 0.85, 45.0, 1.0,
                             0.05, 380.0),
    "kv_capacity": Profile("kv_capacity", 48, 52, (0.5, 0.52), (0.2, 0.2), (0.45, 0.47), (0.96, 0.98), 0.8,
                           0.5, (0.030, 0.032), (1.7, 1.8), (4.0, 5.0), 0.85, 0.2, 30.0, 1.0, 0.05, 380.0),
    "network": Profile("network", 8, 32, (0.3, 0.35), (0.08, 0.1), (0.22, 0.28), (0.3, 0.45), 0.05, 0.0,
                       (0.040, 0.060), (1.8, 4.5), (0.3, 0.5), 0.1, 0.3, 25.0, 1.0, 0.4, 18.0, nnodes=2),
    "headroom": Profile("headroom", 4, 6, (0.22, 0.25), (0.08, 0.1), (0.18, 0.2), (0.15, 0.2), 0.0, 0.0,
                        (0.012, 0.012), (1.5, 1.5), (0.08, 0.08), 0.1, 1.0, 60.0, 1.0, 0.03, 380.0),
    # decode-heavy and memory-bound, KV nearly full and starting to preempt: hbm first, kv second.
    "mixed": Profile("mixed", 40, 56, (0.58, 0.6), (0.2, 0.2), (0.74, 0.78), (0.93, 0.95), 0.15, 0.03,
                     (0.025, 0.03), (1.7, 1.8), (0.3, 0.35), 0.2, 0.8, 40.0, 1.0, 0.05, 380.0),
}  # fmt: skip


@dataclass(frozen=True)
class Layout:
    deployment: str = "llama70b"
    engines: int = 2
    gpus: int = 8
    hosts: tuple[str, ...] = ("node-a",)
    start_ns: int = T0_NS
    duration_s: int = 900
    step_s: int = 5
    with_dcgm: bool = True
    with_collectives: bool = True
    with_histograms: bool = True


def lognormal_cdf(le: float, median: float, tail: float) -> float:
    """P(X ≤ le) for a lognormal with ``median`` and ``p99/p50 = tail``."""
    if math.isinf(le):
        return 1.0
    sigma = max(math.log(tail) / Z99, 1e-6)
    return 0.5 * (1.0 + math.erf(math.log(le / median) / (sigma * math.sqrt(2.0))))


def _lognormal_mean(median: float, tail: float) -> float:
    sigma = max(math.log(tail) / Z99, 1e-6)
    return median * math.exp(sigma * sigma / 2.0)


def generate(
    store: Store, profile: Profile | str, layout: Layout | None = None, seed: int = 7
) -> dict[str, int]:
    """Write one deployment's telemetry for ``profile``; returns rows written per table."""
    p = PROFILES[profile] if isinstance(profile, str) else profile
    lay = layout or Layout()
    rng = np.random.default_rng(seed)
    ts = lay.start_ns + np.arange(1, lay.duration_s // lay.step_s + 1, dtype=np.int64) * lay.step_s * NS
    x = np.linspace(0.0, 1.0, len(ts))
    out = {"deployments": store.write("deployments", _deployment(lay, p))}
    if lay.with_dcgm:
        out["gpu_samples"] = store.write("gpu_samples", _gpu_frame(p, lay, ts, x, rng))
    eng, hist = _engine_frames(p, lay, ts, x)
    out["engine_samples"] = store.write("engine_samples", eng)
    if lay.with_histograms:
        out["histogram_buckets"] = store.write("histogram_buckets", hist)
    if lay.with_collectives:
        out["collective_records"] = store.write("collective_records", _collectives(p, lay, ts))
        out["nccl_baselines"] = store.write("nccl_baselines", _baseline(p, lay))
    return out


def gpu_uuids(lay: Layout) -> list[str]:
    return [f"GPU-{lay.deployment}-{i:02d}" for i in range(lay.gpus)]


def _deployment(lay: Layout, p: Profile) -> Any:
    spec = {"targets": [f"{lay.deployment}-engine-{e}" for e in range(lay.engines)], "gpus": gpu_uuids(lay)}
    return frame("deployments", [{
        "name": lay.deployment, "model": "meta-llama/Llama-3.1-70B-Instruct", "gpu_type": "h100_sxm",
        "tp": lay.gpus // lay.engines, "pp": 1, "dp": lay.engines, "ep": 1, "roles": "{}",
        "nodes": json.dumps(list(lay.hosts)), "fabric": "infiniband" if p.nnodes > 1 else "nvlink4",
        "engine": "vllm", "origin": "config", "spec": json.dumps(spec), "updated_ns": lay.start_ns,
    }])  # fmt: skip


def _gpu_frame(p: Profile, lay: Layout, ts: np.ndarray, x: np.ndarray, rng: np.random.Generator) -> Any:
    series = {
        "sm_active_ratio": np.interp(x, [0, 1], p.sm),
        "tensor_active_ratio": np.interp(x, [0, 1], p.tensor),
        "dram_active_ratio": np.interp(x, [0, 1], p.dram),
        "gpu_util_ratio": np.full(len(x), 0.98 if p.sm[0] > 0.4 else 0.7),
        "fb_used_bytes": np.interp(x, [0, 1], p.kv) * 40e9 + 38e9,
        "power_w": 300 + 350 * np.interp(x, [0, 1], p.sm),
        "sm_clock_mhz": np.full(len(x), 1980.0),
        "nvlink_tx_bytes_per_s": np.full(len(x), 50e9 * p.coll_share),
    }
    cols: dict[str, list[Any]] = {
        k: [] for k in ("ts_ns", "host", "gpu", "uuid", "metric", "value", "source")
    }
    for g, uuid in enumerate(gpu_uuids(lay)):
        host = lay.hosts[g * len(lay.hosts) // lay.gpus]
        for metric, vals in series.items():
            noisy = vals * (1 + 0.02 * rng.standard_normal(len(vals))) if metric.endswith("ratio") else vals
            cols["ts_ns"] += ts.tolist()
            cols["value"] += np.clip(noisy, 0, None if not metric.endswith("ratio") else 1).tolist()
            for k, v in (("host", host), ("gpu", g), ("uuid", uuid), ("metric", metric), ("source", "dcgm")):
                cols[k] += [v] * len(ts)
    return frame("gpu_samples", cols)


def _engine_frames(p: Profile, lay: Layout, ts: np.ndarray, x: np.ndarray) -> tuple[Any, Any]:
    eng: list[dict[str, Any]] = []
    hist: list[dict[str, Any]] = []
    for e in range(lay.engines):
        acc: dict[str, float] = {}
        ident = {
            "source": f"{lay.deployment}-engine-{e}",
            "engine": str(e),
            "model": "llama70b",
            "dp_rank": -1,
        }
        for t, xi in zip(ts.tolist(), x.tolist(), strict=True):
            for concept, value, rate in _engine_step(p, lay, xi, acc):
                eng.append({**ident, "ts_ns": t, "concept": concept, "value": value, "rate_per_s": rate})
            for concept, le, c in _hist_step(p, lay, xi, acc):
                hist.append({**ident, "ts_ns": t, "concept": concept, "le": le, "cumulative_count": c})
    return frame("engine_samples", eng), frame("histogram_buckets", hist)


def _engine_step(p: Profile, lay: Layout, x: float, acc: dict[str, float]) -> list[tuple[str, float, Any]]:
    running = _lerp((p.running_lo, p.running_hi), x)
    tok_s = p.tok_per_req_s * p.running_lo * (running / p.running_lo) ** p.tok_elasticity
    ttft_med = _lerp(p.ttft_p50_s, x)
    itl_med, itl_tail = _lerp(p.itl_p50_s, x), _lerp(p.itl_tail, x)
    req_s = tok_s / 200.0  # 200 generated tokens per request
    rates = {
        "preemptions_total": p.preempt_per_s,
        "prompt_tokens_total": tok_s * p.prompt_per_gen,
        "generation_tokens_total": tok_s,
        "itl_seconds_count": tok_s,
        "itl_seconds_sum": tok_s * _lognormal_mean(itl_med, itl_tail),
        "ttft_seconds_count": req_s,
        "ttft_seconds_sum": req_s * _lognormal_mean(ttft_med, 2.0),
        "queue_seconds_count": req_s,
        "queue_seconds_sum": req_s * _lognormal_mean(ttft_med, 2.0) * p.queue_share,
    }
    rows: list[tuple[str, float, Any]] = [
        ("requests_running", running, None),
        ("requests_waiting", running * p.waiting_ratio, None),
        ("kv_usage_ratio", _lerp(p.kv, x), None),
    ]
    for concept, rate in rates.items():
        acc[concept] = acc.get(concept, 0.0) + rate * lay.step_s
        rows.append((concept, acc[concept], rate))
    acc["_req_s"], acc["_itl"], acc["_ttft"] = req_s, itl_med, ttft_med
    acc["_tail"], acc["_tok_s"] = itl_tail, tok_s
    return rows


def _hist_step(p: Profile, lay: Layout, x: float, acc: dict[str, float]) -> list[tuple[str, float, float]]:
    dists = {
        "itl_seconds": (ITL_LE, acc["_tok_s"], acc["_itl"], acc["_tail"]),
        "ttft_seconds": (TTFT_LE, acc["_req_s"], acc["_ttft"], 2.0),
        "queue_seconds": (PHASE_LE, acc["_req_s"], max(acc["_ttft"] * p.queue_share, 1e-3), 2.0),
    }
    rows = []
    for concept, (les, rate, med, tail) in dists.items():
        n = rate * lay.step_s
        for le in les:
            key = f"h:{concept}:{le}"
            acc[key] = acc.get(key, 0.0) + n * lognormal_cdf(le, med, tail)
            rows.append((concept, le, round(acc[key], 3)))
    return rows


def _collectives(p: Profile, lay: Layout, ts: np.ndarray) -> Any:
    """One AllReduce per rank per sample step whose exec time is ``coll_share`` of the step."""
    exec_us = p.coll_share * lay.step_s * 1e6
    msg = int(p.busbw_gbs * 1e9 * exec_us / 1e6 * lay.gpus / (2 * (lay.gpus - 1)))
    cols: dict[str, list[Any]] = {k: [] for k in ("origin", "comm_id", "coll_sn", "rank", "kind", "comm_name",
                                                  "n_ranks", "nnodes", "host", "op", "msg_bytes", "exec_us",
                                                  "busbw_gbs", "start_us", "stop_us")}  # fmt: skip
    for r in range(lay.gpus):
        for sn, t in enumerate(ts.tolist()):
            start = t / 1000 - lay.step_s * 1e6 + 1.0
            row = ("inspector", "0xcomm01", sn, r, "coll", "tp", lay.gpus, p.nnodes,
                   lay.hosts[r * len(lay.hosts) // lay.gpus], "AllReduce", msg, exec_us, p.busbw_gbs,
                   start, start + exec_us)  # fmt: skip
            for k, v in zip(cols, row, strict=True):
                cols[k].append(v)
    return frame("collective_records", cols)


def _baseline(p: Profile, lay: Layout) -> Any:
    cap = 45.0 if p.nnodes > 1 else 380.0
    return frame("nccl_baselines", [{
        "source": "all_reduce_perf", "host": lay.hosts[0], "op": "all_reduce", "n_gpus": lay.gpus,
        "size_bytes": 1 << 30, "count": (1 << 30) // 2, "dtype": "bfloat16", "redop": "sum", "root": -1,
        "in_place": False, "time_us": 5000.0, "algbw_gbs": cap * 8 / 14, "busbw_gbs": cap, "wrong": 0,
        "ts_ns": lay.start_ns,
    }])  # fmt: skip


def store_for(zone: str, **layout: Any) -> tuple[Store, Layout]:
    """An in-memory store holding ``zone``'s telemetry (layout fields overridable)."""
    lay = replace(Layout(), **layout)
    st = Store(":memory:")
    generate(st, zone, lay)
    return st, lay
