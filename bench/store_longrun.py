"""An hour (or more) of one node's scrapes through the collector's store, without waiting for it.

The sidecar bench (``bench.bench_sidecar``) measures 75 s of a live process; DuckDB's memory only
settles after its buffer pool fills, which takes tens of minutes at 1 Hz. This replays the same
bodies (8-GPU dcgm-exporter, vLLM, SGLang; values moving) as fast as one thread can: each 1 Hz
cycle is parsed with the scrape cache into Batches, every 10 cycles written to a fresh store file
(as the sidecar's writer does at its default ``flush_interval_s`` of 10), every 60 cycles
maintained (rollups and retention, as at ``maintenance_interval_s`` 60). Timestamps advance 1 s
per cycle.

Reported every 600 cycles: resident and peak RSS of this process (which also holds the bodies:
~100 MB before the store opens), process CPU so far, and DuckDB's tagged memory.

Run: ``.venv/bin/python -m bench.store_longrun --cycles 3600 [--memory-limit 32MB] [--no-maintenance]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Literal

from bench import bench_sidecar
from collector.batch import Batch
from collector.formats.scrape import ScrapeCache, parse_scrape
from collector.store import Store

KINDS: dict[str, Literal["dcgm", "engine"]] = {"/dcgm": "dcgm", "/vllm": "engine", "/sglang": "engine"}
T0_NS = 1_800_000_000_000_000_000


def _status_mb(key: str) -> float:
    return bench_sidecar.status_kb(os.getpid(), key)[0] / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--cycles", type=int, default=3600, help="1 Hz cycles to replay (3600: one hour)")
    ap.add_argument("--memory-limit", default="", help="DuckDB memory_limit (default: DuckDB's own)")
    ap.add_argument("--no-maintenance", action="store_true", help="skip the per-minute maintenance")
    args = ap.parse_args()
    bodies = bench_sidecar.build_bodies()
    caches = {path: ScrapeCache() for path in bodies}
    store = Store(Path(tempfile.mkdtemp()) / "node.duckdb", threads=1, memory_limit=args.memory_limit or None)
    print(f"memory_limit {args.memory_limit or 'default'}: start RSS {_status_mb('VmRSS'):.1f} MB")
    pending: dict[str, list[Batch]] = {}
    cpu0 = time.process_time()
    for i in range(args.cycles):
        ts = T0_NS + 1_000_000_000 * i
        for path, variants in bodies.items():
            body = variants[i % len(variants)]
            parsed = parse_scrape(
                body, kind=KINDS[path], ts_ns=ts, host="n1", source=path, cache=caches[path]
            )
            for table, rows in parsed.batches.items():
                pending.setdefault(table, []).append(rows)
        if (i + 1) % 10 == 0:
            for table, parts in pending.items():
                store.write(table, Batch.concat(parts))
            pending = {}
        if (i + 1) % 60 == 0 and not args.no_maintenance:
            store.maintain(now_ns=ts)
        if (i + 1) % 600 == 0:
            tags = store.con.execute(
                "SELECT tag, round(memory_usage_bytes / 1e6, 1) FROM duckdb_memory() "
                "WHERE memory_usage_bytes > 1e6"
            ).fetchall()
            print(
                f"{i + 1:6d} cycles: RSS {_status_mb('VmRSS'):.1f} MB, peak {_status_mb('VmHWM'):.1f} MB, "
                f"CPU {time.process_time() - cpu0:.0f} s, DuckDB {dict(tags)}",
                flush=True,
            )
    store.close()


if __name__ == "__main__":
    main()
