"""What one :class:`collector.sources.nvml.NvmlReader` read costs, call by call (run on a GPU machine).

Run: ``python -m bench.nvml_read_cost [--reads 100] [--interval 0.05]``. Every ``pynvml`` function
the reader calls is wrapped with a timer; the reader then reads ``--reads`` times. Printed: the
wall time of a whole read (median, p90, max) and, per NVML function, calls per read and the
median and total time it took — so the cost of the sidecar's NVML source can be budgeted and the
expensive call named. Wall time, not CPU time: NVML calls wait on the driver.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections import defaultdict
from typing import Any


def _timed(fn: Any, name: str, spent: dict[str, list[float]]) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name].append(time.perf_counter() - t0)

    return wrapper


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reads", type=int, default=100)
    ap.add_argument("--interval", type=float, default=0.05, help="seconds between reads")
    args = ap.parse_args(argv)
    import pynvml

    from collector.sources.nvml import NvmlReader

    spent: dict[str, list[float]] = defaultdict(list)
    for name in dir(pynvml):
        if (
            name.startswith("nvml")
            and callable(getattr(pynvml, name))
            and name not in ("nvmlInit", "nvmlShutdown")
        ):
            setattr(pynvml, name, _timed(getattr(pynvml, name), name, spent))
    reader = NvmlReader(pynvml, host="bench")
    print("reader:", reader.available())
    reader.read(time.time_ns())  # first read: starts NVML, takes the first GPM sample
    spent.clear()
    whole: list[float] = []
    for _ in range(args.reads):
        t0 = time.perf_counter()
        parsed = reader.read(time.time_ns())
        whole.append(time.perf_counter() - t0)
        time.sleep(args.interval)
    rows = sum(df.height for df in parsed.tables.values())
    q = statistics.quantiles(whole, n=10)
    print(f"read: median {statistics.median(whole) * 1e3:.2f} ms, p90 {q[-1] * 1e3:.2f} ms, "
          f"max {max(whole) * 1e3:.2f} ms over {args.reads} reads; {rows} rows per read")  # fmt: skip
    print(f"{'function':48} {'calls/read':>10} {'median ms':>10} {'ms/read':>9}")
    for name, times in sorted(spent.items(), key=lambda kv: -sum(kv[1])):
        print(f"{name:48} {len(times) / args.reads:10.1f} {statistics.median(times) * 1e3:10.3f} "
              f"{sum(times) / args.reads * 1e3:9.3f}")  # fmt: skip
    reader.close()


if __name__ == "__main__":
    main(sys.argv[1:])
