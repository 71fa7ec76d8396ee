"""A sidecar-like writer process for the lake tests and benchmark.

``python -m tests.lake_writer DSN DATA SPOOL HOST FIRST COUNT ROWS INTERVAL_S [PAUSE_S]``
writes batches ``FIRST .. FIRST+COUNT-1`` of ``ROWS`` gpu_samples rows for ``HOST`` through a
:class:`collector.lake.LakeStore` and prints ``ACK <batch>`` after each ``write`` returned
(the batch is then durable in the spool), pausing ``PAUSE_S`` between batches. ``COUNT`` 0
only flushes the spool. It prints ``READY <epoch s>`` once the store is open and
``DONE <rows new in the last flush> <epoch s>`` after ``close()``.

Rows are a pure function of (host, batch, row), so a test can recompute exactly what any set
of acknowledged batches must have put into the lake (see :func:`batch_frame`).
"""

from __future__ import annotations

import sys
import time

import polars as pl

from collector.lake import LakeConfig, LakeStore

METRIC = "sm_active_ratio"


def batch_frame(host: str, batch: int, rows: int) -> pl.DataFrame:
    """Rows of ``batch``: ts_ns = batch*rows + i (ns), value = (ts_ns mod 1000) / 1000."""
    ts = pl.int_range(batch * rows, (batch + 1) * rows, eager=True, dtype=pl.Int64)
    n = len(ts)
    return pl.DataFrame(
        {
            "ts_ns": ts,
            "host": [host] * n,
            "gpu": pl.Series([0] * n, dtype=pl.Int32),
            "uuid": [f"GPU-{host}"] * n,
            "metric": [METRIC] * n,
            "link": pl.Series([-1] * n, dtype=pl.Int32),
            "value": (ts % 1000).cast(pl.Float64) / 1000.0,
            "source": ["test"] * n,
            "gpu_model": ["H100"] * n,
            "pod": [""] * n,
            "namespace": [""] * n,
            "container": [""] * n,
            "mig_profile": [""] * n,
            "mig_instance": [""] * n,
        }
    )


def main(argv: list[str]) -> int:
    dsn, data, spool, host = argv[:4]
    first, count, rows = (int(x) for x in argv[4:7])
    interval = float(argv[7])
    pause = float(argv[8]) if len(argv) > 8 else 0.001
    store = LakeStore(LakeConfig(dsn, data, spool, commit_interval_s=interval, max_retries=8))
    print(f"READY {time.time():.6f}", flush=True)
    for batch in range(first, first + count):
        store.write("gpu_samples", batch_frame(host, batch, rows))
        print(f"ACK {batch}", flush=True)
        time.sleep(pause)
    new = store.flush()
    store.close()
    print(f"DONE {sum(new.values())} {time.time():.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
