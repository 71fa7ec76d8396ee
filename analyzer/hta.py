"""Per-rank GPU time breakdowns of Kineto traces, by Holistic Trace Analysis 0.5.0's rules.

Input: the ``kernel_events`` table (see :mod:`collector.formats.kineto` for the preprocessing),
read through a DuckDB connection. Output: polars frames shaped like HTA's answers, which they
equal to the microsecond (``tests/test_hta_parity.py``).

Rules (REFERENCE §4):

1. The kernels of a rank are its ``kernel_events`` with ``kept`` (default: kernels launched from
   the last ``ProfilerStep`` dropped) or ``kept_with_last`` (``include_last_step=True``).
2. ``merge(K)``: sort by start; a kernel starting strictly after the running maximum end opens
   a new interval, otherwise it extends the current one (touching intervals merge).
3. kernel_time = end of the last merged interval − start of the first (all kernels);
   idle = kernel_time − |merge(all)|; compute = |merge(COMPUTATION)|;
   non_compute = kernel_time − compute − idle. Percentages are ``round(100·x/kernel_time, 2)``.
4. Overlap % = 100·|merge(COMMUNICATION) ∩ merge(COMPUTATION)| / |merge(COMMUNICATION)|,
   rounded to 2 decimals (NaN when a rank has no communication).
5. Kernel-type breakdown: the time line is cut where any merged COMPUTATION / COMMUNICATION /
   MEMORY interval starts or ends; each piece is charged to the set of types running
   (``A overlapping B`` in that order), summed over ranks; percentage of the total, 1 decimal.
6. ``ncclDevKernel_*`` kernels are communication like ``ncclKernel_*`` (HTA's own straggler
   finder is the part that fails on them; these breakdowns do not).
"""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import polars as pl

TYPES = ("COMPUTATION", "COMMUNICATION", "MEMORY")


def load_kernels(
    con: duckdb.DuckDBPyConnection, trace_set: str | None = None, include_last_step: bool = False
) -> pl.DataFrame:
    """Kernels HTA would analyse (rule 1): ``rank, ts_us, dur_us, kernel_type``, by rank."""
    flag = "kept_with_last" if include_last_step else "kept"
    where = f"WHERE {flag}" + (" AND trace_set = ?" if trace_set is not None else "")
    params: list[Any] = [trace_set] if trace_set is not None else []
    sql = f"SELECT rank, ts_us, dur_us, kernel_type FROM kernel_events {where} ORDER BY rank, ts_us"
    return pl.from_arrow(con.execute(sql, params).to_arrow_table())  # type: ignore[return-value]


def kernels_of(
    events: pl.DataFrame, trace_set: str | None = None, include_last_step: bool = False
) -> pl.DataFrame:
    """:func:`load_kernels` over a ``kernel_events`` frame (a one-shot report needs no store)."""
    keep = pl.col("kept_with_last" if include_last_step else "kept")
    if trace_set is not None:
        keep = keep & (pl.col("trace_set") == trace_set)
    return events.filter(keep).select("rank", "ts_us", "dur_us", "kernel_type").sort(["rank", "ts_us"])


def trace_sets(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The trace sets present in the store."""
    return [r[0] for r in con.execute("SELECT DISTINCT trace_set FROM kernel_events ORDER BY 1").fetchall()]


def merge_intervals(ts: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rule 2. ``(starts, ends)`` of the merged, sorted intervals of ``[ts, ts + dur)``."""
    if ts.size == 0:
        return ts.astype(np.int64), ts.astype(np.int64)
    order = np.argsort(ts, kind="stable")
    start, end = ts[order].astype(np.int64), (ts[order] + dur[order]).astype(np.int64)
    running = np.maximum.accumulate(end)
    new = np.empty(start.size, dtype=bool)
    new[0] = True
    new[1:] = start[1:] > running[:-1]
    group = np.cumsum(new) - 1
    starts = start[new]
    ends = np.full(starts.size, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(ends, group, end)
    return starts, ends


def busy(starts: np.ndarray, ends: np.ndarray) -> int:
    return int(ends.sum() - starts.sum())


def intersection(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Total length of the intersection of two sets of disjoint sorted intervals.

    ``|A ∩ B| = |A| + |B| − |A ∪ B|``, the union measured by merging both (exact in integers).
    """
    union = merge_intervals(np.concatenate([a[0], b[0]]), np.concatenate([a[1] - a[0], b[1] - b[0]]))
    return busy(*a) + busy(*b) - busy(*union)


def merged_by_type(rank_df: pl.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for ktype in TYPES:
        sub = rank_df.filter(pl.col("kernel_type") == ktype)
        out[ktype] = merge_intervals(sub["ts_us"].to_numpy(), sub["dur_us"].to_numpy())
    return out


def _pct(part: float, whole: float, digits: int) -> float:
    return float(np.round(100 * part / whole, digits)) if whole else float("nan")


def temporal_breakdown(kernels: pl.DataFrame) -> pl.DataFrame:
    """Rule 3, one row per rank (HTA ``get_temporal_breakdown`` columns)."""
    rows = []
    for (rank,), df in kernels.group_by(["rank"], maintain_order=True):
        starts, ends = merge_intervals(df["ts_us"].to_numpy(), df["dur_us"].to_numpy())
        if starts.size == 0:
            continue
        kernel_time = int(ends[-1] - starts[0])
        idle = kernel_time - busy(starts, ends)
        compute = busy(*merged_by_type(df)["COMPUTATION"])
        non_compute = kernel_time - compute - idle
        rows.append(
            {"rank": rank, "idle_time(us)": idle, "compute_time(us)": compute,
             "non_compute_time(us)": non_compute, "kernel_time(us)": kernel_time,
             "idle_time_pctg": _pct(idle, kernel_time, 2), "compute_time_pctg": _pct(compute, kernel_time, 2),
             "non_compute_time_pctg": _pct(non_compute, kernel_time, 2)}
        )  # fmt: skip
    return pl.DataFrame(rows).sort("rank") if rows else pl.DataFrame()


def comm_comp_overlap(kernels: pl.DataFrame) -> pl.DataFrame:
    """Rule 4, one row per rank, with the microsecond totals behind the percentage."""
    rows = []
    for (rank,), df in kernels.group_by(["rank"], maintain_order=True):
        merged = merged_by_type(df)
        comm = busy(*merged["COMMUNICATION"])
        both = intersection(merged["COMMUNICATION"], merged["COMPUTATION"])
        rows.append(
            {"rank": rank, "comm_busy(us)": comm, "comm_comp_overlap(us)": both,
             "comp_comm_overlap_pctg": _pct(both, comm, 2)}
        )  # fmt: skip
    return pl.DataFrame(rows).sort("rank") if rows else pl.DataFrame()


def per_rank_merged_busy(kernels: pl.DataFrame) -> pl.DataFrame:
    """Kernel count and merged busy µs per rank and kernel type (OTHER included)."""
    rows = []
    for (rank,), df in kernels.group_by(["rank"], maintain_order=True):
        for ktype in sorted((*TYPES, "OTHER")):
            sub = df.filter(pl.col("kernel_type") == ktype)
            total = busy(*merge_intervals(sub["ts_us"].to_numpy(), sub["dur_us"].to_numpy()))
            rows.append(
                {"rank": rank, "kernel_type": ktype, "n_kernels": sub.height, "merged_busy_us": total}
            )
    return pl.DataFrame(rows).sort("rank", maintain_order=True) if rows else pl.DataFrame()


def _type_label(mask: int) -> str:
    return " overlapping ".join(t for i, t in enumerate(TYPES) if mask & (1 << i))


def kernel_type_breakdown(kernels: pl.DataFrame) -> pl.DataFrame:
    """Rule 5 over all ranks: ``kernel_type, sum, percentage`` by descending sum (zero rows left out)."""
    totals: dict[str, int] = {}
    for _rank, df in kernels.group_by(["rank"], maintain_order=True):
        times, deltas = [], []
        for i, (s, e) in enumerate(merged_by_type(df).values()):
            times += [s, e]
            deltas += [np.full(s.size, 1 << i), np.full(e.size, -(1 << i))]
        t, d = np.concatenate(times), np.concatenate(deltas)
        order = np.argsort(t, kind="stable")
        t, running = t[order], np.cumsum(d[order])
        pieces = np.diff(t)
        for mask in np.unique(running[:-1]):
            if mask > 0:
                label = _type_label(int(mask))
                totals[label] = totals.get(label, 0) + int(pieces[running[:-1] == mask].sum())
    rows = sorted(((k, v) for k, v in totals.items() if v > 0), key=lambda kv: -kv[1])
    whole = sum(v for _k, v in rows)
    return pl.DataFrame(
        {"kernel_type": [k for k, _v in rows], "sum": [v for _k, v in rows],
         "percentage": [_pct(v, whole, 1) for _k, v in rows]},
        schema={"kernel_type": pl.Utf8, "sum": pl.Int64, "percentage": pl.Float64},
    )  # fmt: skip


def breakdowns(
    con: duckdb.DuckDBPyConnection, trace_set: str | None = None, include_last_step: bool = False
) -> dict[str, pl.DataFrame]:
    """Every breakdown of one trace set (or all of the store), keyed like HTA's reference files."""
    return breakdowns_of(load_kernels(con, trace_set, include_last_step))


def breakdowns_of(kernels: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """Every breakdown of the kernels of :func:`load_kernels` / :func:`kernels_of` (``{}`` for none)."""
    if kernels.height == 0:
        return {}
    return {
        "temporal_breakdown": temporal_breakdown(kernels),
        "comm_comp_overlap": comm_comp_overlap(kernels),
        "per_rank_merged_busy": per_rank_merged_busy(kernels),
        "kernel_type_breakdown": kernel_type_breakdown(kernels),
    }
