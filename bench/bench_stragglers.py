"""Straggler analysis over 1M collective records (issue 19: under 2 s).

Run: ``python -m bench.bench_stragglers [rounds]`` (default 5). The workload is an 8-rank
communicator with 125,000 all-reduce instances (1,000,000 ``collective_records`` rows, Inspector
verbose: start and stop per rank), one rank 6 % slow throughout and another 40 % slow in a tenth
of the windows, written into an in-memory store with 8 GPUs' telemetry at 1 Hz. Each round times
:func:`analyzer.stragglers.analyze` (load from DuckDB, waits, tests, causes) and
:func:`analyzer.stragglers.find_stragglers` on the loaded frame, with the garbage collector on
(as a real process runs). Medians and ranges over the rounds; the load average before and after.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np
import polars as pl

from analyzer import collectives, stragglers
from collector.records import frame
from collector.store import Store

T0_US = 1_800_000_000_000_000.0
RANKS = 8


def timeline(instances: int = 125_000, seed: int = 5) -> pl.DataFrame:
    """Every rank computes ~2 ms (1 % jitter) after its previous all-reduce ended; all leave
    300 µs after the last arrival. Rank 3 is 6 % slow always, rank 6 40 % slow in every tenth
    block of 5,000 steps."""
    rng = np.random.default_rng(seed)
    dur = 2000.0 * (1 + 0.01 * rng.standard_normal((instances, RANKS)))
    dur[:, 3] *= 1.06
    block = (np.arange(instances) // 5000) % 10 == 7
    dur[block, 6] *= 1.4
    start = np.empty_like(dur)
    stop = np.empty_like(dur)
    free = np.full(RANKS, T0_US)
    for i in range(instances):  # each step starts when the previous one ended on that rank
        start[i] = free + dur[i]
        stop[i] = start[i].max() + 300.0
        free = stop[i]
    n = instances * RANKS
    cols = {
        "origin": ["inspector"] * n,
        "comm_id": ["0xbench"] * n,
        "kind": ["coll"] * n,
        "op": ["AllReduce"] * n,
        "coll_sn": np.repeat(np.arange(instances), RANKS).tolist(),
        "rank": np.tile(np.arange(RANKS), instances).tolist(),
        "host": ["node0"] * n,
        "n_ranks": [RANKS] * n,
        "msg_bytes": [1 << 24] * n,
        "start_us": start.ravel().tolist(),
        "stop_us": stop.ravel().tolist(),
        "exec_us": (stop - start).ravel().tolist(),
    }
    return frame("collective_records", cols)


def telemetry(seconds: int) -> pl.DataFrame:
    t = np.arange(seconds, dtype=float)
    cols: dict[str, list] = {k: [] for k in ("ts_ns", "host", "gpu", "uuid", "metric", "value")}
    for gpu in range(RANKS):
        clock, limit = (1850.0, 620.0) if gpu == 3 else (1980.0, 700.0)
        for metric, value in (("sm_clock_mhz", clock), ("gpu_util_ratio", 0.99), ("power_w", 640.0),
                              ("power_limit_w", limit)):  # fmt: skip
            cols["ts_ns"] += (T0_US * 1000 + t * 1e9).astype(np.int64).tolist()
            cols["value"] += [value] * t.size
            for k, v in (("host", "node0"), ("gpu", gpu), ("uuid", f"GPU-{gpu}"), ("metric", metric)):
                cols[k] += [v] * t.size
    return frame("gpu_samples", cols)


def main(rounds: int = 5) -> None:
    print(
        f"before: load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs",
        flush=True,
    )
    records = timeline()
    st = Store(":memory:")
    st.write("collective_records", records)
    st.write("gpu_samples", telemetry(int((records["stop_us"].max() - T0_US) / 1e6) + 2))  # type: ignore[operator]
    full, mem = [], []
    with st.cursor() as con:
        stragglers.analyze(con, "inspector")  # warm-up: imports and first-call caches
        for _ in range(rounds):
            t = time.perf_counter()
            got = stragglers.analyze(con, "inspector")["origins"]["inspector"]
            full.append(time.perf_counter() - t)
            loaded = collectives.load_collectives(con, "inspector")
            t = time.perf_counter()
            stragglers.find_stragglers(loaded)
            mem.append(time.perf_counter() - t)
    named = [(s["rank"], s["kind"], s["cause"], round(s["slowness"], 3)) for s in got]
    print(
        f"straggler analysis of {records.height:,} collective records: analyze (load + tests + causes) "
        f"median {statistics.median(full):.2f} s [{min(full):.2f}-{max(full):.2f}]; find_stragglers on "
        f"the loaded frame median {statistics.median(mem):.2f} s [{min(mem):.2f}-{max(mem):.2f}]; "
        f"GC on; named {named}",
        flush=True,
    )
    print(f"after: load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
