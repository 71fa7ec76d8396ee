"""Benchmark: the front door (``deployment_report``) as the fleet grows and as windows lengthen.

Run: ``.venv/bin/python -m bench.bench_envelope_scale [--dir /tmp/ioe_scale] [--rounds 5] [--keep]``.

Stores (made once with :func:`bench.bench_envelope.generate`, 1 Hz, 8 GPUs a node, one engine
per 4 GPUs of one declared deployment): 8, 64 and 512 GPUs × 1 h, and 8 GPUs × 7 days written
day by day with the store's maintenance (rollups; raw rows kept 2 days, as by default).

Timed, on one long-lived read-only connection per store (as ``ioe serve`` holds), garbage
collector on, ``--rounds`` rounds alternating the analysis and its peer, medians and ranges:

* the report over the default 15-minute window of each 1 h store (goal: < 1 s at 512 GPUs, and
  64 → 512 GPUs at most 8× the time);
* every window the page offers (15 min, 1 h, 6 h, 24 h) on the 7-day store (goal: each < 1 s);
* the peer: a plain scan of the same raw rows (every point of the three raw tables in the
  window and its 120 s look-back), and the 1 s budget;
* the deployment listing (``list_deployments`` as ``/api/v1/deployments`` calls it);
* with ``--lag``, the same report reading increases with ``lag()`` over the points and the
  rollups (the statements before the points and the rollups kept their increase,
  ``collector.increases``, ``analyzer.latency`` rule 11), alternating in the same rounds.

The stores are deleted at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import analyzer.latency as latency
from analyzer.deployments import list_deployments
from analyzer.report import deployment_report
from analyzer.thresholds import Thresholds
from bench.bench_envelope import NS, T0, generate
from collector.readonly import open_readonly

BUDGET_S = 1.0
WINDOWS = {"15m": 900, "1h": 3600, "6h": 6 * 3600, "24h": 86400}  # the page's window choices
LOOKBACK_S = 120
RAW = ("gpu_samples_points", "engine_samples_points", "histogram_buckets_points")
RESULTS = Path(__file__).resolve().parent / "results" / "envelope_scale.json"


def make(path: Path, gpus: int, hours: float) -> float:
    """Generate the store unless it exists; seconds taken (0 when it existed)."""
    if path.exists():
        return 0.0
    t = time.perf_counter()
    counts = generate(  # chunks of ~1 M GPU rows: a 512-GPU hour in one chunk held 10 GB
        path,
        hours,
        gpus=gpus,
        engines=max(gpus // 4, 1),
        chunk_s=max(300, 3600 * 8 // gpus),
        maintain_s=86400 if hours > 24 else 0,
    )
    took = time.perf_counter() - t
    print(f"generated {path.name}: {counts} in {took:.0f} s, {path.stat().st_size / 1e6:.0f} MB", flush=True)
    return took


def plain_scan(con: Any, start_ns: int, end_ns: int) -> int:
    """The peer: read every raw point of the window (and its look-back) once."""
    lo = start_ns - LOOKBACK_S * NS
    n = 0
    for table in RAW:
        col = "cumulative_count" if table.startswith("histogram") else "value"
        row = con.execute(
            f"SELECT count(*), sum({col}) FROM {table} WHERE ts_ns > ? AND ts_ns <= ?", [lo, end_ns]
        ).fetchone()
        n += int(row[0]) if row else 0
    return n


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def lagged(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` run with the increases read by ``lag()`` over the points and over the per-minute
    rollups (``--lag``)."""

    def run() -> Any:
        stored, sums = latency._stored_increases, latency._rollup_sums
        latency._stored_increases = lambda *a: False  # type: ignore[assignment]
        latency._rollup_sums = lambda *a: False  # type: ignore[assignment]
        try:
            return fn()
        finally:
            latency._stored_increases, latency._rollup_sums = stored, sums

    return run


def measure(con: Any, end_ns: int, window_s: int, rounds: int, lag: bool = False) -> dict[str, Any]:
    """Alternating rounds of the report and the plain scan over ``(end - window, end]`` (and the
    report with ``lag()`` increases when ``lag``)."""
    start_ns = end_ns - window_s * NS
    dep = list_deployments(con, end_ns - 900 * NS)[0]
    th = Thresholds()
    report = deployment_report(con, dep, start_ns, end_ns, th)  # warm-up (catalog, caches)
    rows = plain_scan(con, start_ns, end_ns)
    ioe, peer, old = [], [], []
    for _ in range(rounds):
        ioe.append(timed(lambda: deployment_report(con, dep, start_ns, end_ns, th)))
        peer.append(timed(lambda: plain_scan(con, start_ns, end_ns)))
        if lag:
            old.append(timed(lagged(lambda: deployment_report(con, dep, start_ns, end_ns, th))))
    listing = [timed(lambda: list_deployments(con)) for _ in range(rounds)]
    got = {
        "gpus": dep.n_gpus,
        "engines": len(dep.engine_keys),
        "window_s": window_s,
        "zone": report["envelope"]["primary"],
        "raw_rows": rows,
        "report_s": stats(ioe),
        "scan_s": stats(peer),
        "listing_s": stats(listing),
    }
    if old:
        got["lag_report_s"] = stats(old)
    return got


def stats(xs: list[float]) -> dict[str, float]:
    return {"median": float(np.median(xs)), "min": min(xs), "max": max(xs), "n": len(xs)}


def line(label: str, m: dict[str, Any]) -> str:
    r, s, ls = m["report_s"], m["scan_s"], m["listing_s"]
    old = m.get("lag_report_s")
    lag = f"; with lag() {old['median']:.3f} s ({old['min']:.3f}-{old['max']:.3f})" if old else ""
    return (
        f"{label}: report median {r['median']:.3f} s ({r['min']:.3f}-{r['max']:.3f}), "
        f"plain scan of {m['raw_rows']:,} rows {s['median']:.3f} s ({s['min']:.3f}-{s['max']:.3f}), "
        f"report/budget {r['median'] / BUDGET_S:.2f}, "
        f"report/scan {r['median'] / max(s['median'], 1e-9):.1f}; "
        f"listing {ls['median'] * 1e3:.1f} ms; zone {m['zone']}{lag}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/ioe_scale")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="8,64,512")
    ap.add_argument("--days", type=float, default=7.0, help="the long store's length (0: skip it)")
    ap.add_argument("--keep", action="store_true", help="keep the generated stores")
    ap.add_argument("--lag", action="store_true", help="also time the report with lag() increases")
    args = ap.parse_args()
    gc.enable()
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"load_before": os.getloadavg(), "fleet": {}, "week": {}}
    try:
        for gpus in [int(g) for g in args.sizes.split(",") if g]:
            path = root / f"g{gpus}_1h.duckdb"
            make(path, gpus, 1.0)
            con = open_readonly(path)
            m = measure(con, T0 + 3600 * NS, WINDOWS["15m"], args.rounds, args.lag)
            con.close()
            out["fleet"][gpus] = m
            print(line(f"{gpus} GPUs x 1 h, 15 min window", m), flush=True)
        if args.days > 0:
            path = root / f"g8_{args.days:g}d.duckdb"
            make(path, 8, args.days * 24)
            con = open_readonly(path)
            end_ns = T0 + int(args.days * 86400) * NS
            for name, seconds in WINDOWS.items():
                m = measure(con, end_ns, seconds, args.rounds, args.lag)
                out["week"][name] = m
                print(line(f"8 GPUs x {args.days:g} d, {name} window", m), flush=True)
            con.close()
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    out["load_after"] = os.getloadavg()
    fleet = out["fleet"]
    if 64 in fleet and 512 in fleet:
        growth = fleet[512]["report_s"]["median"] / fleet[64]["report_s"]["median"]
        scan = fleet[512]["scan_s"]["median"] / fleet[64]["scan_s"]["median"]
        out["growth_64_512"] = {"report": growth, "scan": scan}
        print(f"64 -> 512 GPUs: report {growth:.1f}x the time (goal <= 8x), plain scan {scan:.1f}x")
    print(f"load average before {out['load_before']}, after {out['load_after']}")
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
