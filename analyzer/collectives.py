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


def collectives_of(records: pl.DataFrame, origin: str | None = None) -> pl.DataFrame:
    """:func:`load_collectives` over a ``collective_records`` frame (a one-shot report needs no store)."""
    df = records if origin is None else records.filter(pl.col("origin") == origin)
    return df.select(
        *(c.strip() for c in _COLS.split(",")), pl.coalesce("start_us", "dump_ts_us").alias("t_us")
    )


def _windowed(records: pl.DataFrame, window_us: float | None) -> pl.DataFrame:
    if window_us is None or "t_us" not in records.columns:
        return records.with_columns(pl.lit(0, dtype=pl.Int64).alias("window"))
    return records.with_columns((pl.col("t_us") // window_us).fill_null(0).cast(pl.Int64).alias("window"))


KEY = ["origin", "comm_id", "coll_sn"]
_NONE = (
    np.nan
)  # "no value" in the numpy helpers, null in the frames (inputs are JSON / DuckDB numbers: never NaN)


def _dense(keys: np.ndarray) -> np.ndarray:
    """Dense ids ``0..n-1`` for non-negative int keys: a lookup table when the range is small."""
    lo, hi = int(keys.min()), int(keys.max())
    if hi - lo <= 4 * keys.size + 1024:
        present = np.zeros(hi - lo + 1, dtype=bool)
        present[keys - lo] = True
        return (np.cumsum(present) - 1)[keys - lo]
    return np.unique(keys, return_inverse=True)[1].astype(np.int64)


def instance_ids(df: pl.DataFrame) -> tuple[np.ndarray, int]:
    """Rule 1's grouping as numbers: the dense id ``0..n-1`` of each row's instance, and ``n``.

    ``(origin, comm_id)`` pairs are numbered by a hash group-by (few distinct), then combined with
    ``coll_sn`` (≥ 0) into one integer; rows share an id exactly when they share the instance key.
    """
    if df.height == 0:
        return np.zeros(0, dtype=np.int64), 0
    pairs = df.select(KEY[:2]).with_row_index("_i").group_by(KEY[:2]).agg("_i").with_row_index("_p")
    pair = np.empty(df.height, dtype=np.int64)
    flat = pairs.select("_p", "_i").explode("_i")
    pair[flat["_i"].to_numpy()] = flat["_p"].to_numpy()
    sn = df["coll_sn"].cast(pl.Int64).to_numpy()
    span = int(sn.max()) + 1
    if pairs.height * span < 2**62:
        ids = _dense(pair * span + sn)
    else:  # sequence numbers too large to pack: sort-based numbering
        ids = _dense(np.unique(np.stack([pair, sn], axis=1), axis=0, return_inverse=True)[1].ravel())
    return ids, int(ids.max()) + 1


def values_of(s: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """``(float values, valid)`` of a column; null rows get 0 and ``valid = False``."""
    return s.fill_null(0).cast(pl.Float64).to_numpy(), s.is_not_null().to_numpy()


def group_extreme(ids: np.ndarray, n: int, values: np.ndarray, valid: np.ndarray, fn: np.ufunc) -> np.ndarray:
    """Per-group ``np.maximum`` / ``np.minimum`` of the valid values; NaN for a group with none."""
    out = np.full(n, -np.inf if fn is np.maximum else np.inf)
    if valid.all():
        fn.at(out, ids, values)
        return out
    fn.at(out, ids[valid], values[valid])
    return np.where(np.bincount(ids[valid], minlength=n) > 0, out, _NONE)


def group_median(ids: np.ndarray, n: int, values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Per-group median of the valid values as polars computes it (bit-equal to ``Expr.median``):
    the middle value, or ``lo + (hi − lo) · 0.5`` of the two middle ones; NaN for a group with none."""
    g, v = ids[valid], values[valid]
    if v.size == 0:
        return np.full(n, _NONE)
    v = v[np.lexsort((v, g))]
    counts = np.bincount(g, minlength=n)
    first = np.cumsum(counts) - counts
    has = counts > 0
    lo = v[np.where(has, first + (counts - 1) // 2, 0)]
    hi = v[np.where(has, first + counts // 2, 0)]
    return np.where(has, lo + (hi - lo) * 0.5, _NONE)


def _culprits(
    ids: np.ndarray, n: int, rank: np.ndarray, timed: np.ndarray, cols: dict[str, Any]
) -> np.ndarray:
    """Rules 2–3 per instance: timed, the latest start (ties: highest rank); untimed, the shortest
    exec time (ties: lowest rank; a null exec time sorts first, as in ``sort_by``)."""
    (s, s_ok), (e, e_ok) = cols["start_us"], cols["exec_us"]
    late = s_ok & (s == cols["_smax"][ids])
    last_t = np.full(n, np.iinfo(np.int64).min)
    np.maximum.at(last_t, ids[late], rank[late])
    e_null = np.bincount(ids[~e_ok], minlength=n) > 0
    short = np.where(e_null[ids], ~e_ok, e_ok & (e == cols["_emin"][ids]))
    last_u = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(last_u, ids[short], rank[short])
    return np.where(timed, last_t, last_u)


def _wait_columns(ids: np.ndarray, n: int, df: pl.DataFrame) -> dict[str, np.ndarray]:
    """Rules 2–3 as row-level arrays: ``timed, wait_us, skew_us, transfer_us, last_rank`` (NaN = null)."""
    cols: dict[str, Any] = {c: values_of(df[c]) for c in ("start_us", "exec_us", "stop_us")}
    (s, s_ok), (e, e_ok), (stop, stop_ok) = cols["start_us"], cols["exec_us"], cols["stop_us"]
    timed = np.bincount(ids[~s_ok], minlength=n) == 0
    smax, smin = group_extreme(ids, n, s, s_ok, np.maximum), group_extreme(ids, n, s, s_ok, np.minimum)
    emin, emax = group_extreme(ids, n, e, e_ok, np.minimum), group_extreme(ids, n, e, e_ok, np.maximum)
    cols.update(_smax=smax, _emin=emin)
    last = _culprits(ids, n, df["rank"].cast(pl.Int64).to_numpy(), timed, cols)
    row_timed = timed[ids]
    with np.errstate(invalid="ignore"):
        wait = np.where(row_timed, smax[ids] - s, np.where(e_ok, e - emin[ids], _NONE))
        skew = np.where(timed, smax - smin, emax - emin)
        transfer = np.where(timed, group_median(ids, n, stop, stop_ok) - smax, emin)
    return {"timed": row_timed, "wait_us": wait, "skew_us": skew[ids], "transfer_us": transfer[ids],
            "last_rank": last[ids]}  # fmt: skip


def rank_waits(records: pl.DataFrame) -> pl.DataFrame:
    """Rules 1–3: one row per (instance, rank) with ``wait_us`` and the instance's culprit.

    Input columns: ``origin, comm_id, coll_sn, rank, exec_us, start_us, stop_us``.
    Output adds ``timed, wait_us, skew_us, transfer_us, last_rank`` (timed = rule 2 was used);
    rows of timed instances first, each part in input order. Instances are reduced with numpy
    over dense integer ids (no per-row window over the string key): 1M rows in well under 1 s.
    """
    df = records.filter(pl.col("coll_sn") >= 0)
    ids, n = instance_ids(df)
    keep = np.bincount(ids, minlength=n)[ids] >= 2
    df, ids = df.filter(pl.Series(keep)), ids[keep]
    new = _wait_columns(ids, n, df)
    out = df.with_columns(
        pl.Series("timed", new["timed"], dtype=pl.Boolean),
        *(
            pl.Series(c, new[c], dtype=pl.Float64, nan_to_null=True)
            for c in ("wait_us", "skew_us", "transfer_us")
        ),
        pl.Series("last_rank", new["last_rank"]).cast(records.schema["rank"]),
    )
    timed = pl.col("timed")
    return pl.concat([out.filter(timed), out.filter(~timed)])


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
