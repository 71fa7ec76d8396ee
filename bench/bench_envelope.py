"""Benchmark: analysis of one deployment over 24 h of 1 Hz data from 8 GPUs and 2 engines.

Run: ``.venv/bin/python -m bench.bench_envelope [--store PATH] [--hours 24]``. The telemetry is
generated once into a DuckDB file (vectorized, the network-critical profile of
``tests/gen_telemetry.py`` with a daily load cycle); only the analysis is timed: the 15-minute
envelope verdict, Cp over the whole history in 60 s bins, headroom, and the p99 regression
(baseline: the same window a day earlier). The goal (the "peer") is the 1 s budget of the issue.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from gen_telemetry import ITL_LE, NS, PROFILES, TTFT_LE, Z99

from analyzer.deployments import list_deployments
from analyzer.report import deployment_report
from analyzer.thresholds import Thresholds
from collector.readonly import open_readonly
from collector.records import frame
from collector.store import Store

BUDGET_S = 1.0
T0 = 1_767_225_600 * NS


def _cdf(le: float, med: np.ndarray, tail: np.ndarray) -> np.ndarray:
    if math.isinf(le):
        return np.ones_like(med)
    sigma = np.maximum(np.log(tail) / Z99, 1e-6)
    erf = np.vectorize(math.erf, otypes=[float])  # scipy is not a dependency
    return np.asarray(0.5 * (1 + erf(np.log(le / med) / (sigma * math.sqrt(2)))))


def generate(
    path: Path, hours: float, *, gpus: int = 8, engines: int = 2, chunk_s: int = 3600, maintain_s: int = 0
) -> dict[str, int]:
    """Write ``hours`` of 1 Hz telemetry (``gpus`` GPUs, 8 a node, and ``engines`` engines of one
    declared deployment) into ``path``; rows per table.

    Rows are made and written ``chunk_s`` at a time in time order (counters carried across
    chunks), so a week fits in memory. ``maintain_s`` > 0 runs the store's maintenance (rollups,
    default retention: raw rows kept 2 days) every ``maintain_s`` of data time, as a sidecar
    would; 0 runs it once at the end."""
    p, n = PROFILES["network"], int(hours * 3600)
    counts: dict[str, int] = {}
    carry: dict[str, float] = {}
    with Store(path) as st:
        from gen_telemetry import Layout, _deployment

        hosts = tuple(_host(g) for g in range(0, gpus, 8))
        counts["deployments"] = st.write(
            "deployments", _deployment(Layout(engines=engines, gpus=gpus, hosts=hosts), p)
        )
        for a in range(0, n, chunk_s):
            idx = np.arange(a, min(a + chunk_s, n))
            ts = T0 + (idx + 1).astype(np.int64) * NS
            x = 0.5 - 0.5 * np.cos(idx / 86400 * 2 * math.pi)  # one load cycle per day
            eng, hist = _engine(p, ts, x, engines, carry)
            for table, parts in (
                ("gpu_samples", list(_gpu(p, ts, x, gpus))),
                ("engine_samples", eng),
                ("histogram_buckets", hist),
            ):
                counts[table] = counts.get(table, 0) + _write_in_time_order(st, table, parts)
            end = int(ts[-1])
            if maintain_s and (end - T0) // NS % maintain_s < chunk_s:
                st.maintain(now_ns=end + 60 * NS)
                st.checkpoint()
        st.maintain(now_ns=T0 + (n + 60) * NS)  # the sidecar keeps the per-minute rollups
        st.checkpoint()
    return counts


def _host(g: int) -> str:
    return "node-a" if g < 8 else f"node-{g // 8:03d}"


def _write_in_time_order(st: Store, table: str, parts: list[pl.DataFrame]) -> int:
    """Write as a sidecar does: one scrape after another (rows clustered by time)."""
    whole = pl.concat(parts).sort("ts_ns", maintain_order=True)
    return sum(st.write(table, whole.slice(i, 1_000_000)) for i in range(0, whole.height, 1_000_000))


def _gpu(p, ts, x, gpus):  # type: ignore[no-untyped-def]
    series = {"sm_active_ratio": p.sm, "tensor_active_ratio": p.tensor, "dram_active_ratio": p.dram}
    consts = {"sm_clock_mhz": 1980.0, "power_w": 450.0, "nvlink_tx_bytes_per_s": 2e10, "fb_used_bytes": 7e10}
    values = {m: pair[0] + (pair[1] - pair[0]) * x for m, pair in series.items()}
    values.update({m: np.full(len(ts), v) for m, v in consts.items()})
    for g in range(gpus):
        for metric, v in values.items():
            yield frame(
                "gpu_samples",
                {
                    "ts_ns": ts,
                    "host": [_host(g)] * len(ts),
                    "gpu": [g % 8] * len(ts),
                    "uuid": [f"GPU-llama70b-{g:02d}"] * len(ts),
                    "metric": [metric] * len(ts),
                    "value": v,
                    "source": ["dcgm"] * len(ts),
                },
            )


def _engine(p, ts, x, engines, carry):  # type: ignore[no-untyped-def]
    """Engine samples and histogram buckets of ``engines`` alike engines; ``carry`` holds each
    cumulative series' last (unrounded) value and is updated."""
    running = p.running_lo + (p.running_hi - p.running_lo) * x
    tok = p.tok_per_req_s * p.running_lo * (running / p.running_lo) ** p.tok_elasticity
    itl_med = p.itl_p50_s[0] + (p.itl_p50_s[1] - p.itl_p50_s[0]) * x
    tail = p.itl_tail[0] + (p.itl_tail[1] - p.itl_tail[0]) * x
    ttft = p.ttft_p50_s[0] + (p.ttft_p50_s[1] - p.ttft_p50_s[0]) * x
    gauges = {
        "requests_running": running,
        "requests_waiting": running * p.waiting_ratio,
        "kv_usage_ratio": 0.4 + 0 * x,
    }
    counters = {
        "generation_tokens_total": tok,
        "prompt_tokens_total": tok,
        "preemptions_total": 0 * x,
        "itl_seconds_sum": tok * itl_med,
        "itl_seconds_count": tok,
        "ttft_seconds_sum": tok / 200 * ttft,
        "ttft_seconds_count": tok / 200,
        "queue_seconds_sum": tok / 200 * ttft * 0.1,
        "queue_seconds_count": tok / 200,
    }
    totals = {}  # every engine reads alike: each cumulative series is computed once
    for concept, r in counters.items():
        totals[concept] = carry.get(concept, 0.0) + np.cumsum(r)
        carry[concept] = float(totals[concept][-1])
    buckets = []
    for concept, les, rate, med, tl in (
        ("itl_seconds", ITL_LE, tok, itl_med, tail),
        ("ttft_seconds", TTFT_LE, tok / 200, ttft, 2.0 + 0 * x),
    ):
        for le in les:
            key = f"{concept}:{le}"
            raw = carry.get(key, 0.0) + np.cumsum(rate * _cdf(le, med, tl))
            carry[key] = float(raw[-1])
            buckets.append((concept, le, np.round(raw, 3)))
    eng, hist = [], []
    for e in range(engines):
        ident = {
            "source": [f"llama70b-engine-{e}"] * len(ts),
            "engine": [str(e)] * len(ts),
            "dp_rank": [-1] * len(ts),
        }
        for concept, v in gauges.items():
            eng.append(
                frame("engine_samples", {**ident, "ts_ns": ts, "concept": [concept] * len(ts), "value": v})
            )
        for concept, r in counters.items():
            eng.append(
                frame(
                    "engine_samples",
                    {
                        **ident,
                        "ts_ns": ts,
                        "concept": [concept] * len(ts),
                        "value": totals[concept],
                        "rate_per_s": r,
                    },
                )
            )
        for concept, le, cum in buckets:
            hist.append(
                frame(
                    "histogram_buckets",
                    {
                        **ident,
                        "ts_ns": ts,
                        "concept": [concept] * len(ts),
                        "le": [le] * len(ts),
                        "cumulative_count": cum,
                    },
                )
            )
    return eng, hist


def analyze_once(con: Any, end_ns: int) -> tuple[float, dict[str, Any]]:
    """One full analysis (deployments, envelope, Cp over 24 h, headroom, regression), timed."""
    t0 = time.perf_counter()
    dep = list_deployments(con, end_ns - 900 * NS)[0]
    th = Thresholds()
    # the front door every surface uses (envelope with the latency model, Cp, headroom, regression)
    report = deployment_report(con, dep, end_ns - 900 * NS, end_ns, th)
    return time.perf_counter() - t0, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default="/tmp/ioe_bench_envelope.duckdb")
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    path = Path(args.store)
    if not path.exists():
        t = time.perf_counter()
        counts = generate(path, args.hours)
        print(
            f"generated {counts} in {time.perf_counter() - t:.1f} s -> {path} "
            f"({path.stat().st_size / 1e6:.0f} MB)"
        )
    end_ns = T0 + int(args.hours * 3600) * NS
    fresh = []  # a new read-only connection each time, as `ioe analyze` does
    for _ in range(args.repeat):
        con = open_readonly(path)
        took, report = analyze_once(con, end_ns)
        fresh.append(took)
        con.close()
    con = open_readonly(path)  # one long-lived connection, as `ioe serve` holds
    analyze_once(con, end_ns)
    warm = [analyze_once(con, end_ns)[0] for _ in range(args.repeat)]
    con.close()
    env, cp = report["envelope"], report["cp"]
    print(
        f"zone={env['primary']} secondary={env['secondary']} confidence={env['confidence']} "
        f"cp={cp['cp']} ({cp['cp_low']}-{cp['cp_high']}) reached={cp['reached']} bins={cp['points']}"
    )
    for label, times in (("fresh connection", fresh), ("open connection", warm)):
        median = float(np.median(times))
        print(
            f"analysis ({label}): best {min(times):.3f} s, median {median:.3f} s over {args.repeat} runs; "
            f"budget {BUDGET_S:.1f} s -> median/budget {median / BUDGET_S:.2f}"
        )


if __name__ == "__main__":
    main()
