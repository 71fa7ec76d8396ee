"""Where a straggler's evidence is read besides its GPU's own counters, and the reading itself.

The rules are :mod:`analyzer.straggler_causes`' notes: gauges and counters (notes 1–2), the
hosts' InfiniBand/RoCE ports (note 5), the engine's step timing (note 5b), and kernel traces
(notes 12–13). Each reader returns evidence rows ``{metric, how, culprit, peers_median, ratio}``
(``own_history`` where the culprit's own earlier windows were read).
"""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import polars as pl

from analyzer import hta

Spans = list[tuple[int, int]]

IB_ERRORS = (
    "rx_errors",
    "symbol_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "rx_remote_physical_errors",
    "excessive_buffer_overrun_errors",
)
IB_CONGESTION = ("tx_wait", "tx_discards", "np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled")
ENGINE_STEP = ("batch_step_seconds", "itl_seconds")  # one observation per forward pass / step × request
ENGINE_BUSY = "forward_busy_seconds_total"  # SGLang: seconds the GPU runs forward passes
STEP_CONCEPTS = tuple(f"{f}_{x}" for f in ENGINE_STEP for x in ("sum", "count"))

# ---- reading the samples (notes 1–2) ------------------------------------------------------------


def in_spans(ts: np.ndarray, spans: Spans) -> np.ndarray:
    """Which samples lie inside the spans."""
    mask = np.zeros(ts.size, dtype=bool)
    for lo, hi in spans:
        mask |= (ts >= lo) & (ts < hi)
    return mask


def gauge_mean(ts: np.ndarray, v: np.ndarray, spans: Spans) -> float | None:
    """Rule 1."""
    sel = in_spans(ts, spans)
    return float(v[sel].mean()) if sel.any() else None


def counter_rise(ts: np.ndarray, v: np.ndarray, spans: Spans) -> float | None:
    """Rule 2 for one counter series sorted by time: Σ positive steps inside the spans, each span
    starting from the last sample before it; None when no span holds two samples to compare."""
    total, seen = 0.0, False
    for lo, hi in spans:
        inside = np.flatnonzero((ts >= lo) & (ts < hi))
        if inside.size == 0:
            continue
        start = inside[0] - 1 if inside[0] > 0 else inside[0]
        seq = v[start : inside[-1] + 1]
        if seq.size < 2:
            continue
        seen = True
        total += float(np.clip(np.diff(seq), 0.0, None).sum())
    return total if seen else None


def median_of(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.median(vals)) if vals else None


def row(
    metric: str, how: str, mine: float | None, peers: float | None, own: float | None = None
) -> dict[str, Any]:
    ratio = mine / peers if mine is not None and peers else None
    row = {"metric": metric, "how": how, "culprit": mine, "peers_median": peers, "ratio": ratio}
    if own is not None:
        row["own_history"] = own
    return row


def fabric_rows(
    con: duckdb.DuckDBPyConnection, host: str, others: list[str], spans: Spans
) -> list[dict[str, Any]]:
    """Rule 5: per IB/RoCE counter, the culprit host's rise (all ports) against the other hosts'."""
    if not others or not spans:
        return []
    lo, hi = min(s[0] for s in spans) - 3_600 * 10**9, max(s[1] for s in spans)
    got = con.execute(
        "SELECT host, device, port, metric, ts_ns, value FROM fabric_samples WHERE list_contains(?, metric) "
        "AND list_contains(?, host) AND ts_ns >= ? AND ts_ns < ? ORDER BY ts_ns",
        [[*IB_ERRORS, *IB_CONGESTION], [host, *others], lo, hi],
    ).to_arrow_table()
    df: pl.DataFrame = pl.from_arrow(got)  # type: ignore[assignment]
    per: dict[tuple[str, str], float] = {}
    for key, part in df.group_by(["host", "device", "port", "metric"], maintain_order=True):
        r = counter_rise(part["ts_ns"].to_numpy(), part["value"].to_numpy().astype(float), spans)
        if r is not None:
            k = (str(key[0]), str(key[3]))
            per[k] = per.get(k, 0.0) + r
    rows = []
    for m in (*IB_ERRORS, *IB_CONGESTION):
        if (host, m) in per:
            rows.append(row(f"ib_{m}", "rise", per[(host, m)], median_of([per.get((o, m)) for o in others])))
    return rows


def counter_share(ts: np.ndarray, v: np.ndarray, spans: Spans) -> tuple[float, float] | None:
    """Rule 2's rise of a seconds counter with the seconds it covers: (rise, elapsed)."""
    rise = counter_rise(ts, v, spans)
    if rise is None:
        return None
    elapsed = 0.0
    for lo, hi in spans:
        inside = np.flatnonzero((ts >= lo) & (ts < hi))
        if inside.size:
            elapsed += float(ts[inside[-1]] - ts[max(inside[0] - 1, 0)]) / 1e9
    return rise, elapsed


def _step(df: pl.DataFrame, spans: Spans) -> float | None:
    """Note 5b's mean step: the first family with observations (per forward pass, else per step)."""
    rise: dict[str, float] = {}
    for (concept,), part in df.group_by(["concept"]):
        for _, one in part.group_by(
            ["source", "engine", "dp_rank", "tp_rank", "pp_rank", "ep_rank", "labels"]
        ):
            got = counter_rise(one["ts_ns"].to_numpy(), one["value"].to_numpy().astype(float), spans)
            rise[str(concept)] = rise.get(str(concept), 0.0) + (got or 0.0)
    for fam in ENGINE_STEP:
        if rise.get(f"{fam}_count", 0.0) > 0:
            return rise.get(f"{fam}_sum", 0.0) / rise[f"{fam}_count"]
    return None


def _busy(df: pl.DataFrame, spans: Spans) -> float | None:
    """Note 5b's forward-busy share: per scheduler Σ over its categories' rises / the seconds
    covered; the mean over schedulers."""
    shares = []
    for _, sched in df.group_by(["source", "engine", "dp_rank", "tp_rank", "pp_rank", "ep_rank"]):
        busy, elapsed = 0.0, 0.0
        for _, one in sched.group_by(["labels"]):
            got = counter_share(one["ts_ns"].to_numpy(), one["value"].to_numpy().astype(float), spans)
            if got:
                busy, elapsed = busy + got[0], max(elapsed, got[1])
        if elapsed > 0:
            shares.append(busy / elapsed)
    return float(np.mean(shares)) if shares else None


def _units(df: pl.DataFrame, host: str, rank: int, others: list[str]) -> tuple[str, Any, list[Any]]:
    """Note 5b: (column, the culprit's key, the peers' keys) for one figure's series."""
    ranks = set(df["tp_rank"].to_list())
    if rank in ranks and -1 not in ranks and len(ranks) > 1:  # every scheduler exports its own
        return "tp_rank", rank, sorted(ranks - {rank})
    return "host", host, others


def load_engine_samples(con: duckdb.DuckDBPyConnection, hosts: list[str], lo: int, hi: int) -> pl.DataFrame:
    """The engine series rule 5b reads, of the engines scraped on ``hosts``, in ``[lo, hi)``."""
    got = con.execute(
        "SELECT t.host, e.source, e.engine, e.dp_rank, e.tp_rank, e.pp_rank, e.ep_rank, e.labels, e.concept, "
        "e.ts_ns, e.value FROM engine_samples e JOIN targets t ON t.target = e.source "
        "WHERE list_contains(?, e.concept) AND list_contains(?, t.host) AND e.ts_ns >= ? AND e.ts_ns < ? "
        "ORDER BY e.ts_ns",
        [[*STEP_CONCEPTS, ENGINE_BUSY], hosts, lo, hi],
    ).to_arrow_table()
    return pl.from_arrow(got)  # type: ignore[return-value]


def engine_rows(
    df: pl.DataFrame, host: str, rank: int, others: list[str], spans: Spans, history: Spans
) -> list[dict[str, Any]]:
    """Rule 5b over :func:`load_engine_samples`: the culprit's engine step time (and SGLang's
    forward-busy share) in its slow windows, against its own history and its peers' in the same
    windows."""
    if df.height == 0:
        return []
    rows = []
    for metric, concepts, figure in (
        ("engine_step_s", list(STEP_CONCEPTS), _step),
        ("engine_forward_busy_ratio", [ENGINE_BUSY], _busy),
    ):
        part = df.filter(pl.col("concept").is_in(concepts))
        if part.height == 0:
            continue
        col, me, peer_keys = _units(part, host, rank, others)
        mine = part.filter(pl.col(col) == me)
        value = figure(mine, spans)
        if value is not None:
            peers = median_of([figure(part.filter(pl.col(col) == k), spans) for k in peer_keys])
            rows.append(row(metric, "mean", value, peers, figure(mine, history) if history else None))
    return rows


# ---- kernel traces --------------------------------------------------------------------------------


def kernel_rows(con: duckdb.DuckDBPyConnection, origin: str | None, rank: int) -> list[dict[str, Any]]:
    """Compute-kernel mean time and idle share of the rank's kernel time, vs its peers (Kineto)."""
    if not origin or not origin.startswith("kineto:"):
        return []
    kernels = hta.load_kernels(con, origin.removeprefix("kineto:"))
    if kernels.height == 0:
        return []
    comp, idle = {}, {}
    for (r,), df in kernels.group_by(["rank"], maintain_order=True):
        c = df.filter(pl.col("kernel_type") == "COMPUTATION")["dur_us"]
        if c.len():
            comp[int(r)] = float(c.mean())  # type: ignore[arg-type]
        starts, ends = hta.merge_intervals(df["ts_us"].to_numpy(), df["dur_us"].to_numpy())
        span = float(ends[-1] - starts[0]) if starts.size else 0.0
        if span > 0:
            idle[int(r)] = 1.0 - hta.busy(starts, ends) / span
    rows = []
    for name, vals in (("compute_kernel_time_ratio", comp), ("gpu_idle_share", idle)):
        peers = [v for k, v in vals.items() if k != rank]
        if rank not in vals or not peers:
            continue
        med = float(np.median(peers))
        if name == "compute_kernel_time_ratio":
            ratio = vals[rank] / med if med else None
            rows.append(
                {"metric": name, "how": "mean", "culprit": ratio, "peers_median": 1.0, "ratio": ratio}
            )
        else:
            rows.append(row(name, "share", vals[rank], med))
    return rows
