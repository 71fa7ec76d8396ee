"""API latency under load: envelope and latency routes, 50 concurrent clients, 127.0.0.1.

Goal (issue 7): p99 < 100 ms for ``/envelope`` and ``/latency`` at 50 concurrent clients over a
store holding 24 h of one 8-GPU node at 1 Hz. The peer is the goal itself (ratio printed).

Store (SYNTHETIC, generated into a DuckDB file, vectorized; ``--store`` keeps and reuses it):
one declared deployment (2 vLLM engines, TP4 × DP2, 8 GPUs on one host), load following a day
curve, the 24 h ending at generation time (so ``ioe serve``'s retention keeps it); per second:
6 DCGM metrics × 8 GPUs, 9 engine gauges/counters × 2 engines, TTFT and ITL histograms (vLLM
buckets, lognormal) × 2 engines, and an 8-rank AllReduce every 10 s; then ``Store.maintain``
rolls complete minutes up.

Server: ``ioe serve --store FILE`` in a child process, as deployed: its refresher precomputes
the default window every 15 s and its store maintenance runs every 60 s, both during the load.
Client: this process, plain asyncio streams speaking HTTP/1.1 keep-alive (one connection per
client, ~10x cheaper per request than httpx, so the client does not starve the server). With
``--pin`` (default, where ``os.sched_setaffinity`` exists and there are ≥ 2 CPUs) the server
is pinned to all CPUs but the last and the client to the last one.

Phases, per route:
  1. ``cold``: ``--distinct`` sequential requests (one client), each for a different window end
     (``at``): a full analysis with nothing cached, the cost of a miss.
  2. ``default``: 50 concurrent clients for ``--seconds``, all for the default window (15 min
     ending at the newest sample): what pages and Prometheus ask; answered from the
     refresher's snapshot (``aged`` counts answers carrying its ``Age`` header).
  3. ``cached``: 50 clients for ``--seconds`` on another fixed window (10 min, explicit ``at``)
     after one warm-up: TTL-cache hits on the event loop, refreshed in the background every 10 s.

``cpu ms/req`` is the server's user+system CPU over the phase divided by its requests
(refresher and maintenance included).

Run: ``.venv/bin/python -m bench.bench_api [--seconds S] [--store FILE] [--no-pin] [--hours H]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from scipy.special import erf

from collector.records import frame
from collector.store import Store

NS = 1_000_000_000
GPUS, ENGINES, CLIENTS, GOAL_MS = 8, 2, 50, 100.0
ITL_LE = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, math.inf)
TTFT_LE = (0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, math.inf)
DEP = "llama70b"


def _cdf(le: float, median: np.ndarray, tail: float) -> np.ndarray:
    if math.isinf(le):
        return np.ones_like(median)
    sigma = math.log(tail) / 2.3263
    return 0.5 * (1.0 + erf(np.log(le / median) / (sigma * math.sqrt(2.0))))


def _load(ts_s: np.ndarray) -> np.ndarray:
    """Day curve 0..1 (low at night, high mid-day)."""
    return 0.5 - 0.5 * np.cos(2 * np.pi * ts_s / 86400.0)


def _gpu(ts: np.ndarray, x: np.ndarray, rng: np.random.Generator) -> object:
    series = {"sm_active_ratio": 0.3 + 0.3 * x, "tensor_active_ratio": 0.1 + 0.1 * x,
              "dram_active_ratio": 0.35 + 0.45 * x, "gpu_util_ratio": 0.9 + 0.05 * x,
              "sm_clock_mhz": np.full(len(x), 1980.0), "nvlink_tx_bytes_per_s": 2e9 + 3e9 * x}  # fmt: skip
    cols: dict[str, list] = {k: [] for k in ("ts_ns", "host", "gpu", "uuid", "metric", "value")}
    for g in range(GPUS):
        for metric, v in series.items():
            noisy = v * (1 + 0.02 * rng.standard_normal(len(v))) if metric.endswith("ratio") else v
            cols["ts_ns"].append(ts)
            cols["value"].append(noisy)
            cols["metric"].append(np.full(len(ts), metric, dtype=object))
            cols["gpu"].append(np.full(len(ts), g))
            cols["uuid"].append(np.full(len(ts), f"GPU-{DEP}-{g:02d}", dtype=object))
    n = sum(len(a) for a in cols["ts_ns"])
    out = {k: np.concatenate(v).tolist() for k, v in cols.items() if v}
    out["host"] = ["node0"] * n
    return frame("gpu_samples", out)


def _engine(ts: np.ndarray, x: np.ndarray, acc: dict[str, np.ndarray]) -> tuple[object, object]:
    running = 16 + 48 * x
    tok_s = 40.0 * running**0.85
    itl_med, ttft_med = 0.02 + 0.01 * x, 0.15 + 0.2 * x
    req_s = tok_s / 200.0
    rates = {"generation_tokens_total": tok_s, "prompt_tokens_total": tok_s, "preemptions_total": 0 * x,
             "itl_seconds_count": tok_s, "itl_seconds_sum": tok_s * itl_med * 1.1,
             "ttft_seconds_count": req_s, "ttft_seconds_sum": req_s * ttft_med * 1.2}  # fmt: skip
    gauges = {"requests_running": running, "requests_waiting": 0.1 * running, "kv_usage_ratio": 0.4 + 0.4 * x}
    eng: dict[str, list] = {k: [] for k in ("ts_ns", "source", "engine", "concept", "value", "rate_per_s")}
    hist: dict[str, list] = {
        k: [] for k in ("ts_ns", "source", "engine", "concept", "le", "cumulative_count")
    }
    for e in range(ENGINES):
        src = f"{DEP}-engine-{e}"
        for concept, v in {**gauges, **rates}.items():
            if concept in rates:
                key = f"{e}:{concept}"
                v = acc.get(key, 0.0) + np.cumsum(rates[concept])
                acc[key] = v[-1]
            _extend(eng, ts, src, e, concept, v, rate=rates.get(concept))
        for concept, les, n, med, tail in (("itl_seconds", ITL_LE, tok_s, itl_med, 1.8),
                                           ("ttft_seconds", TTFT_LE, req_s, ttft_med, 2.0)):  # fmt: skip
            for le in les:
                key = f"{e}:{concept}:{le}"
                c = acc.get(key, 0.0) + np.cumsum(n * _cdf(le, med, tail))
                acc[key] = c[-1]
                _extend(hist, ts, src, e, concept, np.round(c, 3), le=le)
    return frame("engine_samples", _flat(eng)), frame("histogram_buckets", _flat(hist))


def _extend(cols: dict[str, list], ts: np.ndarray, src: str, e: int, concept: str, v: np.ndarray,
            rate: np.ndarray | None = None, le: float | None = None) -> None:  # fmt: skip
    n = len(ts)
    cols["ts_ns"].append(ts)
    cols["source"].append(np.full(n, src, dtype=object))
    cols["engine"].append(np.full(n, str(e), dtype=object))
    cols["concept"].append(np.full(n, concept, dtype=object))
    if le is None:
        cols["value"].append(v)
        cols["rate_per_s"].append(rate if rate is not None else np.full(n, np.nan))
    else:
        cols["le"].append(np.full(n, le))
        cols["cumulative_count"].append(v)


def _flat(cols: dict[str, list]) -> dict[str, list]:
    out = {k: np.concatenate(v).tolist() for k, v in cols.items()}
    if "rate_per_s" in out:
        out["rate_per_s"] = [None if isinstance(r, float) and math.isnan(r) else r for r in out["rate_per_s"]]
    return out


def _deployment(t0_ns: int) -> object:
    spec = {"targets": [f"{DEP}-engine-{e}" for e in range(ENGINES)],
            "gpus": [f"GPU-{DEP}-{g:02d}" for g in range(GPUS)]}  # fmt: skip
    return frame("deployments", [{"name": DEP, "model": "llama-3.1-70b", "gpu_type": "h100_sxm", "tp": 4,
                                  "pp": 1, "dp": 2, "ep": 1, "roles": "{}", "nodes": '["node0"]',
                                  "fabric": "nvlink4", "engine": "vllm", "origin": "config",
                                  "spec": json.dumps(spec), "updated_ns": t0_ns}])  # fmt: skip


def _collectives(ts: np.ndarray, sn0: int, rng: np.random.Generator) -> object:
    n = len(ts)
    start = (ts / 1000.0)[:, None] + rng.normal(0, 20.0, size=(n, GPUS))
    stop = start.max(axis=1, keepdims=True) + 300.0
    ranks = np.tile(np.arange(GPUS), n)
    return frame("collective_records", {
        "origin": ["inspector"] * (n * GPUS), "comm_id": ["0xbench"] * (n * GPUS),
        "coll_sn": np.repeat(np.arange(sn0, sn0 + n), GPUS).tolist(), "rank": ranks.tolist(),
        "kind": ["coll"] * (n * GPUS), "n_ranks": [GPUS] * (n * GPUS), "host": ["node0"] * (n * GPUS),
        "op": ["AllReduce"] * (n * GPUS), "msg_bytes": [1 << 26] * (n * GPUS),
        "exec_us": (stop - start).ravel().tolist(), "busbw_gbs": [200.0] * (n * GPUS),
        "start_us": start.ravel().tolist(), "stop_us": np.broadcast_to(stop, start.shape).ravel().tolist(),
    })  # fmt: skip


def generate(path: Path, hours: float) -> dict[str, int]:
    """Write ``hours`` of 1 Hz telemetry ending now (minute-aligned) into a new store at ``path``,
    so the server's retention keeps all of it; returns row counts."""
    rng = np.random.default_rng(7)
    acc: dict[str, np.ndarray] = {}
    t0_ns = (time.time_ns() // (60 * NS) - int(hours * 60)) * 60 * NS
    with Store(path) as st:
        st.write("deployments", _deployment(t0_ns))
        for h in range(math.ceil(hours)):
            secs = np.arange(h * 3600 + 1, min((h + 1) * 3600, hours * 3600) + 1)
            ts = t0_ns + secs.astype(np.int64) * NS
            x = _load(secs.astype(float))
            st.write("gpu_samples", _gpu(ts, x, rng))
            eng, hist = _engine(ts, x, acc)
            st.write("engine_samples", eng)
            st.write("histogram_buckets", hist)
            st.write("collective_records", _collectives(ts[::10], h * 360, rng))  # one every 10 s
        st.maintain(now_ns=t0_ns + int(hours * 3600) * NS + 60 * NS)
        st.checkpoint()
        return st.counts()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """One HTTP/1.1 response: ``(status, carried an Age header)``; the body is read and dropped."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    fields = dict(line.split(b":", 1) for line in lines[1:] if b":" in line)
    fields = {k.strip().lower(): v.strip() for k, v in fields.items()}
    await reader.readexactly(int(fields.get(b"content-length", b"0")))
    return status, b"age" in fields


async def _client(port: int, path: str, until: float, limit: int, out: Result) -> None:
    """One keep-alive connection sending ``path`` until ``until`` (monotonic) or ``limit`` requests."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n\r\n".encode()
    try:
        while time.monotonic() < until and len(out.ms) < limit:
            t = time.perf_counter()
            writer.write(req)
            status, aged = await _read_response(reader)
            out.ms.append((time.perf_counter() - t) * 1e3)
            out.aged += aged
            if status != 200:
                raise RuntimeError(f"{path}: HTTP {status}")
    finally:
        writer.close()


class Result:
    def __init__(self) -> None:
        self.ms: list[float] = []
        self.aged = 0  # answers carrying ``Age``: served from the refresher's snapshot
        self.wall_s = 0.0


async def load(port: int, paths: list[str], seconds: float, limit: int) -> Result:
    """One client per path, all at once, for ``seconds`` or ``limit`` requests in all."""
    out, t = Result(), time.perf_counter()
    until = time.monotonic() + seconds
    await asyncio.gather(*(_client(port, p, until, limit, out) for p in paths))
    out.wall_s = time.perf_counter() - t
    return out


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(ms: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(ms), q))


def cpu_split(pin: bool) -> tuple[set[int] | None, set[int] | None]:
    """Server and client CPU sets: the client gets the last usable CPU, the server the others."""
    if not pin or not hasattr(os, "sched_getaffinity"):
        return None, None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return set(cpus[:-1]), {cpus[-1]}


def serve(store: Path, port: int, cpus: set[int] | None) -> subprocess.Popen[bytes]:
    """``ioe serve`` (with its refresher) on 127.0.0.1, pinned to ``cpus`` before exec."""
    ioe = Path(sys.executable).with_name("ioe")
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    proc = subprocess.Popen([str(ioe), "serve", "--store", str(store), "--port", str(port)], preexec_fn=pin)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("ioe serve did not become ready in 60 s")


def open_store(path: Path, hours: float) -> int:
    """Generate the store at ``path`` unless a file is already there (then it is reused as is);
    returns its newest sample time (s), the default window's end."""
    if path.exists():
        print(f"store: reused {path}")
    else:
        t = time.perf_counter()
        generate(path, hours)
        print(f"store: generated in {time.perf_counter() - t:.0f} s")
    with Store(path) as st:
        counts = st.counts()
        with st.cursor() as cur:
            row = cur.execute("SELECT max(ts_ns), min(ts_ns) FROM engine_samples").fetchone()
    if not row or row[0] is None or (row[0] - row[1]) / NS < hours * 3600 - 60:
        raise RuntimeError(f"{path} does not hold {hours:g} h of raw engine samples (retention ran?)")
    print(f"store: {counts['gpu_samples']:,} gpu_samples, {counts['engine_samples']:,} engine, "
          f"{counts['histogram_buckets']:,} buckets, {counts['collective_records']:,} collective rows, "
          f"{path.stat().st_size / 2**20:.0f} MiB")  # fmt: skip
    return int(row[0] // NS)


def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(args.store) if args.store else Path(tmp) / "bench.duckdb"
        end_s = open_store(store, args.hours)
        server_cpus, client_cpus = cpu_split(args.pin)
        print(f"cpus: server {sorted(server_cpus or [])} client {sorted(client_cpus or [])} (empty: not "
              f"pinned); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
        port = 20000 + os.getpid() % 20000
        proc = serve(store, port, server_cpus)
        if client_cpus:
            os.sched_setaffinity(0, client_cpus)
        try:
            _phases(port, proc.pid, end_s, args)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _phases(port: int, pid: int, end_s: int, args: argparse.Namespace) -> None:
    print(f"{'phase':<9} {'route':<9} {'reqs':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>8} {'req/s':>6} "
          f"{'cpu ms/req':>10} {'aged':>6} {'p99/goal':>8}")  # fmt: skip
    for route in ("envelope", "latency"):
        path = f"/api/v1/deployments/{DEP}/{route}"
        cold = [f"{path}?window=15m&at={end_s - 3600 - 7 * i}" for i in range(args.distinct)]
        cpu = _cpu_s(pid)
        runs = [asyncio.run(load(port, [p], 600, 1)) for p in cold]
        _row("cold", route, runs, _cpu_s(pid) - cpu)
        other = f"{path}?window=10m&at={end_s - 60}"
        asyncio.run(load(port, [other], 600, 1))  # warm-up: first analysis of that window
        for phase, p in (("default", path), ("cached", other)):
            cpu = _cpu_s(pid)
            runs = [asyncio.run(load(port, [p] * CLIENTS, args.seconds, args.requests))]
            _row(phase, route, runs, _cpu_s(pid) - cpu)


def _row(phase: str, route: str, runs: list[Result], server_cpu_s: float) -> None:
    ms = [m for r in runs for m in r.ms]
    wall = sum(r.wall_s for r in runs)
    p99 = _pct(ms, 99)
    print(f"{phase:<9} {route:<9} {len(ms):>6} {_pct(ms, 50):>7.1f} {p99:>7.1f} {max(ms):>8.1f} "
          f"{len(ms) / wall:>6.0f} {server_cpu_s * 1e3 / len(ms):>10.2f} {sum(r.aged for r in runs):>6} "
          f"{p99 / GOAL_MS:>8.2f}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=35.0, help="length of each 50-client phase")
    ap.add_argument("--requests", type=int, default=1_000_000, help="cap on requests per 50-client phase")
    ap.add_argument("--distinct", type=int, default=3, help="cold requests per route (distinct windows)")
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--store", help="store file: reused when it exists, else generated there and kept")
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="do not pin server and client CPUs")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
