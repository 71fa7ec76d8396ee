"""The sidecar's store-write cost per 1 Hz cycle, this checkout against another, alternating.

Workload: ``bench.bench_sidecar``'s bodies (8 × H100 dcgm-exporter, vLLM dp2 and SGLang
fixtures with growing counters and buckets), parsed once per cycle as the sidecar parses them
(``parse_scrape`` with a per-target cache), then written with ``Store.write`` one table at a
time as the writer thread's flush does, into a fresh store file. Timed: the CPU time
(``time.process_time``) of the writes alone, per cycle, over ``--cycles`` cycles after
``--warmup``; parsing is not timed. Each checkout runs in its own child process
(``PYTHONPATH``), the two alternating, ``--rounds`` rounds; medians per cycle.

``--flush N`` joins N cycles into one write per table, as the sidecar's writer does over its
``flush_interval_s`` (10 s by default), each target's scrape stamped at its own time.

Run: ``.venv/bin/python -m bench.bench_store_write --peer /work/main [--rounds 3] [--cycles 600]
[--flush 10]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
NS = 1_000_000_000
T0 = 1_767_225_600 * NS


def child(cycles: int, warmup: int, flush: int = 1) -> dict[str, float]:
    """One checkout's run (in this process): CPU µs of the store writes per cycle. ``flush``:
    cycles joined into one write per table, as the sidecar's writer joins the scrapes queued over
    its ``flush_interval_s`` (each target's scrape at its own time, as a sidecar stamps them)."""
    from bench.bench_sidecar import ENGINE, dcgm_body, engine_body
    from collector.formats.scrape import ScrapeCache, parse_scrape
    from collector.store import Store

    rng = random.Random(7)
    targets: dict[str, tuple[Any, Callable[[int], bytes]]] = {
        "dcgm": ("dcgm", lambda k: dcgm_body(k, rng)),
        "vllm": ("engine", lambda k: engine_body(ENGINE / "vllm_0.33.0_dp2.prom", k, rng)),
        "sglang": ("engine", lambda k: engine_body(ENGINE / "sglang_0.5.23.prom", k, rng)),
    }
    caches = {name: ScrapeCache() for name in targets}
    spent: list[float] = []
    rows = 0
    with tempfile.TemporaryDirectory() as d:
        st = Store(Path(d) / "s.duckdb", threads=1, memory_limit="32MB")
        batches: dict[str, list] = {}  # type: ignore[type-arg]
        for k in range(warmup + cycles):
            ts = T0 + k * NS
            for j, (name, (kind, body)) in enumerate(targets.items()):
                stamp = ts + j * 1000 if flush > 1 else ts
                got = parse_scrape(
                    body(k), kind=kind, ts_ns=stamp, host="node0", source=name, cache=caches[name]
                )
                for table, b in got.batches.items():
                    batches.setdefault(table, []).append(b)
            from collector.batch import concat_rows

            if (k + 1) % flush:
                continue
            t = time.process_time()
            for table, parts in batches.items():
                n = st.write(table, concat_rows(parts))
                rows += n if k >= warmup else 0
            batches = {}
            if k >= warmup:
                spent.append((time.process_time() - t) / flush)
        st.close()
    return {"cpu_us_per_cycle": statistics.median(spent) * 1e6, "mean_us": statistics.mean(spent) * 1e6,
            "rows_per_cycle": rows / cycles}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", type=Path, help="the other checkout (e.g. /work/main)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cycles", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--flush", type=int, default=1, help="cycles per write (the sidecar: flush_interval_s)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.cycles, args.warmup, args.flush)))
        return
    runs: dict[str, list[dict[str, float]]] = {"this": [], "peer": []}
    load = [os.getloadavg()]
    for _ in range(args.rounds):
        for label, root in (("peer", args.peer), ("this", HERE)):
            if root is None:
                continue
            env = {**os.environ, "PYTHONPATH": str(root)}
            cmd = [sys.executable, str(HERE / "bench" / "bench_store_write.py"), "--child", "--cycles",
                   str(args.cycles), "--warmup", str(args.warmup), "--flush", str(args.flush)]  # fmt: skip
            out = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, check=True)
            runs[label].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(label, runs[label][-1], flush=True)
    load.append(os.getloadavg())
    for label, got in runs.items():
        if got:
            xs = [g["cpu_us_per_cycle"] for g in got]
            print(f"{label}: median {statistics.median(xs):.0f} µs/cycle ({min(xs):.0f}-{max(xs):.0f}), "
                  f"{got[0]['rows_per_cycle']:.0f} rows/cycle")  # fmt: skip
    print(f"load average before {load[0]}, after {load[1]}")


if __name__ == "__main__":
    main()
