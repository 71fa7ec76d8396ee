"""Fleet store benchmark: DuckLake (PostgreSQL catalog) against the embedded DuckDB store.

``.venv/bin/python -m bench.bench_lake [--batches 40] [--rows 5000] [--runs 5]``

1. Ingest: 4 writer processes (``tests/lake_writer.py``), each writing its own host's
   ``gpu_samples`` batches through :class:`collector.lake.LakeStore` (spool + batched commits
   every second). Aggregate rows/s = all rows / (last DONE - first READY); the peer is one
   process writing the same rows into an embedded :class:`collector.store.Store`.
2. Query: a fleet-wide envelope query over 64 GPUs (8 hosts x 8) x 24 h of per-minute
   rollups (10 metrics -> 921,600 ``gpu_samples_1m`` rows, plus TTFT buckets in
   ``histogram_buckets_1m``): per deployment and minute, mean SM-active and DRAM-active
   ratio and a p99 TTFT estimated from bucket increments. The same SQL runs on both stores;
   median of ``--runs`` warm runs, plus the first (cold) run.

Needs the PostgreSQL server binaries (see tests/pg.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from collector.lake import LakeConfig, LakeStore
from collector.records import TABLES
from collector.store import NS_PER_MIN, Store
from tests.lake_writer import batch_frame
from tests.pg import PgCluster, find_binaries

ROOT = Path(__file__).resolve().parent.parent
HOSTS = [f"node{i}" for i in range(8)]
METRICS = [
    "sm_active_ratio",
    "dram_active_ratio",
    "gr_engine_active_ratio",
    "tensor_active_ratio",
    "power_w",
    "temperature_c",
    "sm_clock_mhz",
    "fb_used_bytes",
    "pcie_tx_bytes_per_s",
    "nvlink_tx_bytes_per_s",
]
LE = [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, float("inf")]
MINUTES = 1440
T0 = 1_700_000_000 * 1_000_000_000 // NS_PER_MIN * NS_PER_MIN

ENVELOPE_SQL = f"""
WITH dep AS (
  SELECT name AS deployment, model, unnest(from_json(nodes, '["VARCHAR"]')) AS host FROM deployments
), util AS (
  SELECT d.deployment, g.minute_ns,
         avg(g.avg) FILTER (WHERE g.metric = 'sm_active_ratio') AS sm_active_ratio,
         avg(g.avg) FILTER (WHERE g.metric = 'dram_active_ratio') AS dram_active_ratio
  FROM gpu_samples_1m g JOIN dep d USING (host)
  WHERE g.minute_ns >= $lo AND g.minute_ns < $hi AND g.metric IN ('sm_active_ratio', 'dram_active_ratio')
  GROUP BY ALL
), b AS (
  SELECT d.deployment, h.minute_ns, h.le, sum(h.cumulative_count) AS c
  FROM histogram_buckets_1m h JOIN (SELECT DISTINCT deployment, model FROM dep) d USING (model)
  WHERE h.concept = 'ttft_seconds' AND h.minute_ns >= $lo - {NS_PER_MIN} AND h.minute_ns < $hi
  GROUP BY ALL
), inc AS (
  SELECT deployment, minute_ns, le,
         c - lag(c) OVER (PARTITION BY deployment, le ORDER BY minute_ns) AS n
  FROM b
), cum AS (
  SELECT *, max(n) OVER w AS total, lag(le) OVER w2 AS lo_le, lag(n) OVER w2 AS lo_n
  FROM inc WHERE n IS NOT NULL
  WINDOW w AS (PARTITION BY deployment, minute_ns), w2 AS (PARTITION BY deployment, minute_ns ORDER BY le)
), p99 AS (
  SELECT deployment, minute_ns,
         arg_min(coalesce(lo_le, 0) + (le - coalesce(lo_le, 0))
                 * (0.99 * total - coalesce(lo_n, 0)) / nullif(n - coalesce(lo_n, 0), 0), le)
           FILTER (WHERE n >= 0.99 * total AND isfinite(le)) AS ttft_p99_s
  FROM cum WHERE total > 0 GROUP BY ALL
)
SELECT u.deployment, u.minute_ns, u.sm_active_ratio, u.dram_active_ratio, p.ttft_p99_s
FROM util u LEFT JOIN p99 p USING (deployment, minute_ns)
ORDER BY u.deployment, u.minute_ns
"""


def _frame(table: str, data: dict[str, Any]) -> pl.DataFrame:
    """``data`` completed with ``table``'s other columns (NULL, or ''/-1 in the key)."""
    spec = TABLES[table]
    n = len(next(iter(data.values())))
    cols = {}
    for name, dtype in spec.polars_schema().items():
        default = ("" if dtype == pl.Utf8 else -1) if name in spec.key else None
        cols[name] = pl.Series(name, data[name] if name in data else [default] * n, dtype=dtype)
    return pl.DataFrame(cols)


def rollup_frames() -> dict[str, list[pl.DataFrame]]:
    """64 GPUs x 24 h x 10 metrics of per-minute rollups, TTFT buckets and 2 deployments."""
    rng = np.random.default_rng(7)
    minutes = T0 + np.arange(MINUTES, dtype=np.int64) * NS_PER_MIN
    gpu: list[pl.DataFrame] = []
    for host in HOSTS:
        for g in range(8):
            for metric in METRICS:
                avg = rng.random(MINUTES)
                gpu.append(
                    _frame(
                        "gpu_samples_1m",
                        {
                            "minute_ns": minutes,
                            "host": [host] * MINUTES,
                            "gpu": [g] * MINUTES,
                            "uuid": [f"GPU-{host}-{g}"] * MINUTES,
                            "metric": [metric] * MINUTES,
                            "n": [60] * MINUTES,
                            "min": avg * 0.9,
                            "max": avg * 1.1,
                            "avg": avg,
                            "last": avg,
                        },
                    )
                )
    hist = [_buckets(rng, host, minutes) for host in HOSTS]
    deps = _frame(
        "deployments",
        {
            "name": ["dep-a", "dep-b"],
            "model": ["model-a", "model-b"],
            "nodes": [json.dumps(HOSTS[:4]), json.dumps(HOSTS[4:])],
        },
    )
    return {"gpu_samples_1m": gpu, "histogram_buckets_1m": hist, "deployments": [deps]}


def _buckets(rng: np.random.Generator, host: str, minutes: np.ndarray) -> pl.DataFrame:
    """Cumulative TTFT bucket counts of one engine (its model is its deployment's)."""
    per_min = rng.poisson([40, 60, 80, 50, 20, 8, 3, 1, 0], size=(MINUTES, len(LE) - 1 + 1)).cumsum(axis=1)
    counts = per_min.cumsum(axis=0).astype(float)  # counters grow over time
    n = MINUTES * len(LE)
    model = "model-a" if host in HOSTS[:4] else "model-b"
    return _frame(
        "histogram_buckets_1m",
        {
            "minute_ns": np.repeat(minutes, len(LE)),
            "source": [host] * n,
            "engine": ["vllm"] * n,
            "model": [model] * n,
            "concept": ["ttft_seconds"] * n,
            "le": np.tile(LE, MINUTES),
            "cumulative_count": counts.reshape(-1),
        },
    )


def load(store: Store | LakeStore, frames: dict[str, list[pl.DataFrame]]) -> None:
    for table, parts in frames.items():
        store.write(table, pl.concat(parts))
    if isinstance(store, LakeStore):
        store.flush()
        store.compact()


def query_latency(store: Store | LakeStore, runs: int) -> tuple[float, float, list[tuple[object, ...]]]:
    """(cold s, median warm s, result rows) of the envelope query."""
    params = {"lo": T0, "hi": T0 + MINUTES * NS_PER_MIN}
    times = []
    rows: list[tuple[object, ...]] = []
    for _ in range(runs + 1):
        with store.cursor() as cur:
            t = time.perf_counter()
            rows = cur.execute(ENVELOPE_SQL, params).fetchall()
            times.append(time.perf_counter() - t)
    return times[0], statistics.median(times[1:]), rows


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    """Rows equal up to float summation order."""
    return all(
        abs(x - y) <= 1e-9 * max(1.0, abs(x)) if isinstance(x, float) and isinstance(y, float) else x == y
        for x, y in zip(a, b, strict=True)
    )


def ingest_lake(pg: PgCluster, work: Path, batches: int, rows: int) -> tuple[float, int]:
    """Aggregate rows/s of 4 writer processes into a fresh lake; returns (rows/s, rows)."""
    dsn = pg.create_db("ingest")
    procs = []
    for host in HOSTS[:4]:
        args = [
            dsn,
            str(work / "ingest"),
            str(work / f"spool-{host}"),
            host,
            "0",
            str(batches),
            str(rows),
            "1.0",
            "0",
        ]
        cmd = [sys.executable, "-m", "tests.lake_writer", *args]
        procs.append(
            subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    starts, ends = [], []
    for p in procs:
        out, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"writer failed: {err[-2000:]}")
        lines = out.splitlines()
        starts.append(float(next(x for x in lines if x.startswith("READY")).split()[1]))
        ends.append(float(lines[-1].split()[2]))
    total = 4 * batches * rows
    with LakeStore(LakeConfig(dsn, str(work / "ingest"), str(work / "spool-check"), background=False)) as st:
        if st.count("gpu_samples") != total:
            raise RuntimeError(f"lake holds {st.count('gpu_samples')} rows, expected {total}")
    return total / (max(ends) - min(starts)), total


def ingest_embedded(work: Path, batches: int, rows: int) -> float:
    """Rows/s of one process writing the same 4 hosts' batches into an embedded Store."""
    frames = [batch_frame(h, b, rows) for h in HOSTS[:4] for b in range(batches)]
    with Store(work / "ingest.duckdb") as st:
        t = time.perf_counter()
        for f in frames:
            st.write("gpu_samples", f)
        elapsed = time.perf_counter() - t
    return len(frames) * rows / elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    bindir = find_binaries()
    if bindir is None:
        print("PostgreSQL server binaries not found (initdb, pg_ctl, postgres)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ioe-bench-lake-") as tmp, PgCluster(bindir) as pg:
        work = Path(tmp)
        lake_rps, total = ingest_lake(pg, work, args.batches, args.rows)
        emb_rps = ingest_embedded(work, args.batches, args.rows)
        print(f"ingest: {total} rows; 4 lake writers {lake_rps:,.0f} rows/s in all")
        print(f"ingest: embedded store, 1 process {emb_rps:,.0f} rows/s")
        print(f"ingest ratio lake/embedded: {lake_rps / emb_rps:.2f}")
        frames = rollup_frames()
        n_gpu = sum(f.height for f in frames["gpu_samples_1m"])
        with Store(work / "fleet.duckdb") as emb:
            load(emb, frames)
            e_cold, e_warm, e_rows = query_latency(emb, args.runs)
        cfg = LakeConfig(
            pg.create_db("fleet"), str(work / "fleet"), str(work / "spool-fleet"), background=False
        )
        with LakeStore(cfg) as lake:
            t = time.perf_counter()
            load(lake, frames)
            print(f"lake load of {n_gpu} gpu_samples_1m rows + buckets: {time.perf_counter() - t:.1f} s")
            l_cold, l_warm, l_rows = query_latency(lake, args.runs)
        if len(l_rows) != len(e_rows) or not _same(l_rows[100], e_rows[100]):
            raise RuntimeError(f"the stores disagree: lake {len(l_rows)} rows, embedded {len(e_rows)}")
        p99 = [float(r[4]) for r in e_rows if isinstance(r[4], (int, float))]
        print(f"envelope query, 64 GPUs x 24 h ({n_gpu} rollup rows) -> {len(e_rows)} rows")
        print(f"  sample row {e_rows[100]}")
        print(f"  p99 TTFT present in {len(p99)} rows, median {statistics.median(p99):.3f} s")
        print(f"  embedded: cold {e_cold * 1e3:.0f} ms, warm median {e_warm * 1e3:.0f} ms")
        print(f"  lake:     cold {l_cold * 1e3:.0f} ms, warm median {l_warm * 1e3:.0f} ms")
        print(f"  ratio lake/embedded (warm): {l_warm / e_warm:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
