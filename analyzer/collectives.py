"""Time in collectives: arrival skew vs transfer, exposure, bandwidth vs capability, jitter.

Input: ``collective_records`` (NCCL Inspector or Kineto) and, for exposure, ``kernel_events``,
read through a DuckDB connection. Every function returns polars frames or plain dicts.

Rules (REFERENCE §3–4):

1. A collective *instance* is one ``(origin, comm_id, coll_sn)`` seen on ≥ 2 ranks
   (``coll_sn >= 0``; Prometheus aggregates with ``coll_sn = -1`` are not instances).
2. With start times (Inspector verbose, Kineto): ``a_r`` = start on rank r, ``L = max a_r``;
   the last to arrive is the culprit; ``wait_r = L − a_r``; ``transfer = median_r(stop_r) − L``.
3. Without start times (Inspector non-verbose), all ranks leave together, so the exec time,
   which includes waiting, carries the skew: ``wait_r = exec_r − min exec``, the culprit is the
   rank with the shortest exec time, ``transfer = min exec``.
4. Exposed time (kernel traces only) = |merge(comm) − merge(compute)| per rank: communication
   that no compute kernel hides; its share is of the rank's kernel time (HTA's step span).
5. busbw vs capability: the median achieved ``busbw_gbs`` over the capability, which is a number
   passed in or the best ``nccl_baselines`` busbw for the same op and GPU count at the nearest
   size at or above the median message (else the largest measured).
6. Jitter = p99 / p50 of per-record exec time (a widening gap is a network signal, §6).
7. Windows are ``floor(start / window)`` on the record's start (or dump) time in µs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import duckdb
import numpy as np
import polars as pl

from analyzer import hta

_COLS = (
    "origin, comm_id, coll_sn, rank, op, host, pid, n_ranks, msg_bytes, exec_us, busbw_gbs, start_us, stop_us"
)


def load_collectives(con: duckdb.DuckDBPyConnection, origin: str | None = None) -> pl.DataFrame:
    """``collective_records`` rows (one origin or all) with the columns the analyses use."""
    where, params = ("WHERE origin = ?", [origin]) if origin else ("", [])
    rel = con.execute(
        f"SELECT {_COLS}, coalesce(start_us, dump_ts_us) AS t_us FROM collective_records {where}", params
    )
    return pl.from_arrow(rel.to_arrow_table())  # type: ignore[return-value]


def _windowed(records: pl.DataFrame, window_us: float | None) -> pl.DataFrame:
    if window_us is None or "t_us" not in records.columns:
        return records.with_columns(pl.lit(0, dtype=pl.Int64).alias("window"))
    return records.with_columns((pl.col("t_us") // window_us).fill_null(0).cast(pl.Int64).alias("window"))


def rank_waits(records: pl.DataFrame) -> pl.DataFrame:
    """Rules 1–3: one row per (instance, rank) with ``wait_us`` and the instance's culprit.

    Input columns: ``origin, comm_id, coll_sn, rank, exec_us, start_us, stop_us``.
    Output adds ``last_rank, wait_us, skew_us, transfer_us, timed`` (timed = rule 2 was used).
    """
    key = ["origin", "comm_id", "coll_sn"]
    df = records.filter(pl.col("coll_sn") >= 0).with_columns(
        pl.len().over(key).alias("_n"), pl.col("start_us").is_not_null().all().over(key).alias("timed")
    )
    df = df.filter(pl.col("_n") >= 2)
    timed = df.filter(pl.col("timed")).with_columns(
        (pl.col("start_us").max().over(key) - pl.col("start_us")).alias("wait_us"),
        (pl.col("start_us").max() - pl.col("start_us").min()).over(key).alias("skew_us"),
        (pl.col("stop_us").median() - pl.col("start_us").max()).over(key).alias("transfer_us"),
        pl.col("rank").sort_by(["start_us", "rank"]).last().over(key).alias("last_rank"),
    )
    untimed = df.filter(~pl.col("timed")).with_columns(
        (pl.col("exec_us") - pl.col("exec_us").min().over(key)).alias("wait_us"),
        (pl.col("exec_us").max() - pl.col("exec_us").min()).over(key).alias("skew_us"),
        pl.col("exec_us").min().over(key).alias("transfer_us"),
        pl.col("rank").sort_by(["exec_us", "rank"]).first().over(key).alias("last_rank"),
    )
    return pl.concat([timed, untimed]).drop("_n")


def instances(waits: pl.DataFrame) -> pl.DataFrame:
    """One row per instance: ``n_ranks, last_rank, skew_us, xfer_us, sum_wait_rank_us``."""
    return (
        waits.group_by(["origin", "comm_id", "coll_sn"])
        .agg(
            pl.col("op").first(),
            pl.len().alias("n_ranks"),
            pl.col("last_rank").first(),
            pl.col("skew_us").first(),
            pl.col("transfer_us").first().alias("xfer_us"),
            pl.col("wait_us").sum().alias("sum_wait_rank_us"),
        )
        .sort(["origin", "comm_id", "coll_sn"])
    )


def exposed_time(kernels: pl.DataFrame) -> pl.DataFrame:
    """Rule 4 per rank: ``comm_us, exposed_us, kernel_time_us, exposed_share``."""
    rows = []
    for (rank,), df in kernels.group_by(["rank"], maintain_order=True):
        merged = hta.merged_by_type(df)
        comm = hta.busy(*merged["COMMUNICATION"])
        hidden = hta.intersection(merged["COMMUNICATION"], merged["COMPUTATION"])
        starts, ends = hta.merge_intervals(df["ts_us"].to_numpy(), df["dur_us"].to_numpy())
        span = int(ends[-1] - starts[0]) if starts.size else 0
        rows.append(
            {"rank": rank, "comm_us": comm, "exposed_us": comm - hidden, "kernel_time_us": span,
             "exposed_share": (comm - hidden) / span if span else None}
        )  # fmt: skip
    return pl.DataFrame(rows)


def capability_from_baselines(
    con: duckdb.DuckDBPyConnection, op: str, n_gpus: int, msg_bytes: float
) -> float | None:
    """Rule 5: the measured busbw (GB/s) for ``op`` on ``n_gpus`` GPUs nearest above ``msg_bytes``."""
    sql = """SELECT busbw_gbs FROM nccl_baselines
             WHERE lower(replace(op, '_', '')) = lower(replace(?, '_', '')) AND n_gpus = ?
             ORDER BY (size_bytes >= ?) DESC, CASE WHEN size_bytes >= ? THEN size_bytes ELSE -size_bytes END,
                      busbw_gbs DESC LIMIT 1"""
    row = con.execute(sql, [op, n_gpus, msg_bytes, msg_bytes]).fetchone()
    return float(row[0]) if row and row[0] is not None else None


def summary(records: pl.DataFrame, window_us: float | None = None) -> pl.DataFrame:
    """Per window/communicator/op: count, time, wait vs transfer split, sizes, busbw, jitter."""
    waits = _windowed(rank_waits(records), window_us)
    recs = _windowed(records, window_us)
    key = ["window", "origin", "comm_id", "op"]
    base = recs.group_by(key).agg(
        pl.len().alias("records"),
        pl.col("rank").n_unique().alias("ranks"),
        pl.col("exec_us").sum().alias("time_us"),
        pl.col("msg_bytes").median().alias("msg_bytes_p50"),
        pl.col("busbw_gbs").median().alias("busbw_gbs_p50"),
        pl.col("exec_us").quantile(0.5, "nearest").alias("exec_us_p50"),
        pl.col("exec_us").quantile(0.99, "nearest").alias("exec_us_p99"),
        pl.col("n_ranks").max().alias("n_ranks"),
    )
    split = waits.group_by(key).agg(
        pl.col("wait_us").sum().alias("wait_us"),
        pl.col("transfer_us").sum().alias("transfer_rank_us"),
    )
    out = base.join(split, on=key, how="left").with_columns(
        (pl.col("exec_us_p99") / pl.col("exec_us_p50")).alias("jitter_p99_p50"),
        (pl.col("wait_us") / pl.col("time_us")).alias("wait_share"),
    )
    return out.sort(key)


def _max(series: pl.Series) -> float | None:
    values = series.drop_nulls().to_numpy()
    return float(values.max()) if values.size else None


@dataclass
class NetworkEvidence:
    """Is the network in the critical path? (for the envelope analysis)."""

    exposed_share: float | None  # exposed collective µs / kernel time, worst rank (rule 4)
    comm_share: float | None  # collective kernel µs / kernel time, worst rank
    busbw_gbs_p50: float | None
    capability_gbs: float | None
    busbw_vs_capability: float | None  # rule 5
    jitter_p99_p50: float | None  # rule 6
    wait_share: float | None  # Σ wait / Σ collective time: skew, not the fabric
    records: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def network_evidence(
    con: duckdb.DuckDBPyConnection,
    origin: str | None = None,
    trace_set: str | None = None,
    capability_gbs: float | None = None,
) -> NetworkEvidence:
    """Exposed collective share, busbw vs capability and p99/p50 jitter for one origin (rules 4–6)."""
    records = load_collectives(con, origin)
    exposed = comm_share = None
    if trace_set is not None or (origin or "").startswith("kineto:"):
        kernels = hta.load_kernels(con, trace_set or (origin or "").removeprefix("kineto:"))
        if kernels.height:
            exp = exposed_time(kernels)
            exposed = _max(exp["exposed_share"])
            comm_share = _max(exp["comm_us"] / exp["kernel_time_us"])
    if records.height == 0:
        return NetworkEvidence(exposed, comm_share, None, capability_gbs, None, None, None, 0)
    busbw = records["busbw_gbs"].drop_nulls()
    p50 = float(busbw.median()) if busbw.len() else None  # type: ignore[arg-type]
    if capability_gbs is None and p50 is not None:
        op = records["op"].mode().first() or ""
        n = int(records["n_ranks"].max() or 0)  # type: ignore[arg-type]
        capability_gbs = capability_from_baselines(con, str(op), n, float(records["msg_bytes"].median() or 0))  # type: ignore[arg-type]
    exec_us = records["exec_us"].drop_nulls().to_numpy()
    jitter = float(np.quantile(exec_us, 0.99) / np.quantile(exec_us, 0.5)) if exec_us.size else None
    waits = rank_waits(records)
    total = float(records["exec_us"].sum())
    return NetworkEvidence(
        exposed_share=exposed,
        comm_share=comm_share,
        busbw_gbs_p50=p50,
        capability_gbs=capability_gbs,
        busbw_vs_capability=p50 / capability_gbs if p50 is not None and capability_gbs else None,
        jitter_p99_p50=jitter,
        wait_share=float(waits["wait_us"].sum()) / total if total else None,
        records=records.height,
    )
