"""Kernel-trace import and trace-report vs HTA 0.5.0; 1M collective records attributed.

Run: ``.venv/bin/python -m bench.bench_traces``. HTA (PyPI ``HolisticTraceAnalysis==0.5.0``) is
measured in the same run when importable; otherwise only IOE's absolute times are printed.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analyzer import collectives, stragglers
from collector.formats import IngestContext, kineto
from collector.store import Store
from ioe.commands.trace_report import report
from tests.gen_collectives import SCENARIOS
from tests.gen_collectives import collectives as gen_coll

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "kineto"
SETS = ("nccl_parser_config_1rank", "trace_filter_2rank", "synthetic_4rank_straggler")


def best_of(fn: Callable[[], Any], n: int = 3) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def hta_parse(trace_dir: Path) -> Callable[[], Any] | None:
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return None
    logging.disable(logging.WARNING)
    return lambda: TraceAnalysis(trace_dir=str(trace_dir))


def hta_report(trace_dir: Path) -> Callable[[], Any] | None:
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return None

    def run() -> None:
        t = TraceAnalysis(trace_dir=str(trace_dir))
        t.get_comm_comp_overlap(visualize=False)
        t.get_temporal_breakdown(visualize=False)
        t.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)

    return run


def bench_import() -> None:
    path = DATA / "nccl_parser_config_1rank" / "nccl_data.json.gz"
    ctx = IngestContext(ts_ns=0)
    ioe = best_of(lambda: kineto.load(path, ctx), 5)
    peer = hta_parse(path.parent)
    line = f"import {path.name} (9.8 MB JSON): IOE {ioe * 1e3:.0f} ms"
    if peer is not None:
        hta = best_of(peer, 3)
        line += f", HTA 0.5.0 parse {hta * 1e3:.0f} ms, ratio {hta / ioe:.1f}x"
    print(line)


def bench_report() -> None:
    for name in SETS:
        ioe = best_of(lambda name=name: report([DATA / name]), 3)
        peer = hta_report(DATA / name)
        line = f"trace-report {name}: IOE {ioe * 1e3:.0f} ms"
        if peer is not None:
            hta = best_of(peer, 3)
            line += f", HTA 0.5.0 {hta * 1e3:.0f} ms, ratio {hta / ioe:.1f}x"
        print(line)


def bench_attribution() -> None:
    records = gen_coll(SCENARIOS["throttled"], n_ranks=8, n_windows=50, per_window=2500)
    st = Store(":memory:")
    st.write("collective_records", records)
    with st.cursor() as con:
        t = time.perf_counter()
        loaded = collectives.load_collectives(con, "inspector")
        found = stragglers.find_stragglers(loaded)
        took = time.perf_counter() - t
    print(
        f"attribution of {loaded.height:,} collective records (8 ranks x {loaded.height // 8:,}): "
        f"{took:.2f} s (load + waits + blame + flags); found ranks {[s.rank for s in found]}"
    )
    times = [best_of(lambda: stragglers.find_stragglers(loaded), 1) for _ in range(3)]
    print(f"  find_stragglers on the in-memory frame: median {statistics.median(times):.2f} s")


if __name__ == "__main__":
    bench_import()
    bench_report()
    bench_attribution()
