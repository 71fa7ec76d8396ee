"""Kernel-trace import and trace-report vs HTA 0.5.0; 1M collective records attributed.

Run: ``.venv/bin/python -m bench.bench_traces [rounds]`` (default 5 rounds). HTA (PyPI
``HolisticTraceAnalysis==0.5.0``) is measured in the same run, interleaved with IOE round by
round so both see the same machine load; without HTA only IOE's times are printed. Every line
gives medians over the rounds and the ratio of the medians (the range of per-round ratios in
brackets); the load average is printed before and after.
"""

from __future__ import annotations

import functools
import logging
import os
import statistics
import sys
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


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def load_avg() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def hta_class() -> Any:
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return None
    logging.disable(logging.WARNING)
    return TraceAnalysis


def hta_report(cls: Any, trace_dir: Path) -> None:
    t = cls(trace_dir=str(trace_dir))
    t.get_comm_comp_overlap(visualize=False)
    t.get_temporal_breakdown(visualize=False)
    t.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)


def compare(label: str, ioe: Callable[[], Any], peer: Callable[[], Any] | None, rounds: int) -> None:
    """Interleaved rounds (IOE, then the peer); medians and the ratio of the medians."""
    ioe()  # warm-up: imports and first-call caches are not what is compared
    mine, theirs = [], []
    for _ in range(rounds):
        mine.append(timed(ioe))
        if peer is not None:
            theirs.append(timed(peer))
    line = f"{label}: IOE median {statistics.median(mine) * 1e3:.0f} ms"
    if theirs:
        ratios = [t / m for t, m in zip(theirs, mine, strict=True)]
        line += (
            f", HTA 0.5.0 median {statistics.median(theirs) * 1e3:.0f} ms, "
            f"ratio {statistics.median(theirs) / statistics.median(mine):.1f}x "
            f"[per round {min(ratios):.1f}-{max(ratios):.1f}x]"
        )
    print(line, flush=True)


def bench_import(cls: Any, rounds: int) -> None:
    path = DATA / "nccl_parser_config_1rank" / "nccl_data.json.gz"
    ctx = IngestContext(ts_ns=0)
    peer = (lambda: cls(trace_dir=str(path.parent))) if cls else None
    compare(f"import {path.name} (9.8 MB JSON) vs HTA parse", lambda: kineto.load(path, ctx), peer, rounds)


def bench_report(cls: Any, rounds: int) -> None:
    for name in SETS:
        peer = functools.partial(hta_report, cls, DATA / name) if cls else None
        compare(f"trace-report {name}", functools.partial(report, [DATA / name]), peer, rounds)


def bench_attribution(rounds: int) -> None:
    records = gen_coll(SCENARIOS["throttled"], n_ranks=8, n_windows=50, per_window=2500)
    st = Store(":memory:")
    st.write("collective_records", records)
    took, found_in_memory = [], []
    with st.cursor() as con:
        for _ in range(rounds):
            t = time.perf_counter()
            loaded = collectives.load_collectives(con, "inspector")
            found = stragglers.find_stragglers(loaded)
            took.append(time.perf_counter() - t)
            found_in_memory.append(timed(functools.partial(stragglers.find_stragglers, loaded)))
    print(
        f"attribution of {loaded.height:,} collective records (8 ranks x {loaded.height // 8:,}), "
        f"load + waits + blame + flags: median {statistics.median(took):.2f} s "
        f"[{min(took):.2f}-{max(took):.2f}]; find_stragglers on the in-memory frame: median "
        f"{statistics.median(found_in_memory):.2f} s; found ranks {[s.rank for s in found]}",
        flush=True,
    )


def main(rounds: int = 5) -> None:
    print(f"before: {load_avg()}; {os.cpu_count()} CPUs; {rounds} rounds", flush=True)
    cls = hta_class()
    bench_import(cls, rounds)
    bench_report(cls, rounds)
    bench_attribution(rounds)
    print(f"after: {load_avg()}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
