"""Run every benchmark in turn (``make bench``); each prints its figures and the peer's, with the ratio.

Results that were recorded are in ``bench/results/*.md`` and summarized in ``BENCHMARKS.md``.
Each module is also runnable alone: ``python -m bench.<name>``.
"""

from __future__ import annotations

import subprocess
import sys

MODULES = (
    "bench.bench_parse",
    "bench.bench_sidecar",
    "bench.store_longrun",
    "bench.duckdb_append_memory",
    "bench.bench_otlp",
    "bench.bench_traces",
    "bench.bench_stragglers",
    "bench.bench_envelope",
    "bench.calibration",
    "bench.bench_planner",
    "bench.bench_api",
    "bench.bench_lake",
    "bench.bench_import_memory",
    "bench.bench_promsrc",
)


def main() -> int:
    failed = []
    for name in MODULES:
        print(f"\n=== {name} ===", flush=True)
        if subprocess.run([sys.executable, "-m", name], check=False).returncode != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
