"""Straggler ranks: every rank that makes its peers wait, tested over time, and why.

Input: ``collective_records`` of one communicator (NCCL Inspector, Kineto), grouped into instances
by :func:`analyzer.collectives.rank_waits` (the same collective, same ``coll_sn``, on every rank).
The causes are read from the culprit GPU's telemetry (:mod:`analyzer.straggler_causes`).

Rule for "straggler" (defaults in :class:`Thresholds`):

1. Arrival: ``x_r`` = the rank's start time when the instance has start times; otherwise
   ``−exec_r`` (all ranks leave together, so the shortest kernel arrived last). A rank's
   lateness is ``x_r − x_ref``, where ``x_ref`` is the median of the instance's arrivals
   (with two ranks: the other rank's arrival).
2. Slowness (the effect size) is lateness over the peers' compute time between collectives.
   With the previous instance on the same rank (``coll_sn − 1``, start and stop known), the
   compute segment is ``c_r = start_r − previous stop_r`` and slowness = ``c_r / c_ref − 1``
   (``c_ref``: median of the instance's segments; with two ranks the other's). Without it the
   segment is estimated from the period: ``P`` = first quartile over consecutive records of
   Δ(instance time) / Δ``coll_sn`` (time per call while busy), peers' segment
   ``P − transfer − wait_ref``, slowness = lateness / that.
3. Test (no threshold on one window): per instance a rank's arrival order, tied ranks
   averaged, scaled to ``u ∈ [0, 1]`` (0 first, 1 last). A rank no different from its peers
   has ``E[u] = 1/2`` and ``Var[u] = (n+1) / (12 (n−1))`` in every instance, independently, so
   over ``k`` instances ``z = Σ(u − 1/2) / √ΣVar`` is standard normal; p = P(Z ≥ z).
4. Windows of ``window_s`` on each instance's earliest start (else its dump time); a window is
   evaluated when it holds ≥ ``min_instances`` instances. Every (rank, window) is tested
   (rule 3), and every rank over the whole span (pooled). False discoveries are controlled with
   Benjamini–Hochberg at ``fdr_q``, across all ranks × windows and, separately, across ranks.
5. A (rank, window) is slow when its test is a discovery and its median lateness is
   ≥ ``late_sd_min`` × the window's arrival spread (1.4826 × MAD of every rank's lateness in
   it: a rank last by chance is late by little) and its median slowness ≥ ``window_slow_min``
   (0 by default: collectives sampled far apart make the compute segment look long). A rank is
   slow over the span when its pooled test is a discovery and the median of its window
   slownesses is ≥ ``slow_min`` (consistent slowness of 5 % is found although each window
   alone may be too short to show it); then every window with z > 0 and slowness
   ≥ ``window_slow_min`` counts as slow too.
6. Every rank with a slow window is named: several ranks at once. ``persistent`` when it was
   slow in ≥ ``persistent_min`` of the evaluated windows, else ``intermittent``; the windows
   and their contiguous episodes are reported.
7. With two ranks the test says only which rank the other waits for (a rank that is merely
   fast would look the same): the rank is named only when its telemetry backs it, against its
   peer or its own history (a cause other than ``unexplained``, rules of
   :mod:`analyzer.straggler_causes`).

Blame (reported, no longer a gate): per instance the last rank is charged the sum of the
others' waits; ``blame_share`` is its part of all blame of the communicator.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import duckdb
import numpy as np
import polars as pl

from analyzer import straggler_causes as causes
from analyzer.collectives import (
    group_extreme,
    group_median,
    instance_ids,
    load_collectives,
    rank_waits,
    values_of,
)
from analyzer.straggler_causes import rank_gpus

__all__ = [
    "Straggler",
    "Thresholds",
    "analyze",
    "blame_by_window",
    "find_stragglers",
    "judge",
    "rank_gpus",
    "root_cause",
]


@dataclass(frozen=True)
class Thresholds:
    """The numbers behind the rules (module notes 1–7 and :mod:`analyzer.straggler_causes`)."""

    window_s: float = 10.0
    min_instances: int = 3
    fdr_q: float = 0.05
    slow_min: float = 0.04
    window_slow_min: float = 0.0
    late_sd_min: float = 0.5
    persistent_min: float = 0.5
    clock_ratio_max: float = 0.97
    temp_delta_c: float = 10.0
    power_limit_ratio_max: float = 0.97
    util_gap_min: float = 0.03
    compute_ratio_min: float = 1.04
    congestion_ratio: float = 2.0


@dataclass
class Straggler:
    """One named rank: how slow, when, how sure, and (when asked) its cause with evidence."""

    rank: int
    kind: str  # 'persistent' | 'intermittent'
    persistence: float
    windows_flagged: int
    windows_evaluated: int
    blame_us: float
    blame_share: float
    flagged_windows: list[int] = field(default_factory=list)
    cause: str = ""
    evidence: list[dict[str, Any]] = field(default_factory=list)
    host: str = ""
    gpu: int = -1
    mapping: str = ""  # 'given' | 'assumed: local rank order on host'
    comm_id: str = ""
    n_ranks: int = 0
    slowness: float = 0.0  # median over its slow windows (0.07 = 7 % slower than its peers)
    lateness_us: float = 0.0  # median arrival after the reference, over its slow windows
    z: float = 0.0  # pooled test statistic (rule 3)
    q_value: float = 1.0  # smallest BH-adjusted p of its discoveries (rule 4)
    episodes: list[dict[str, Any]] = field(default_factory=list)  # contiguous slow windows
    causes: list[dict[str, Any]] = field(default_factory=list)  # every cause that fits
    backed: bool = True  # rule 7: False until the telemetry backs a two-rank verdict
    window_s: float = 10.0
    evaluated_span: list[int] = field(default_factory=list)  # first and last evaluated window


# ---- rules 1–2: per row arrival order, lateness, slowness -----------------------------------------


def _positions(ids: np.ndarray, x: np.ndarray, ok: np.ndarray, cnt: np.ndarray) -> np.ndarray:
    """Rule 3's ``u`` per row (NaN where the row has no arrival): mid-rank of ``x`` in its
    instance over ``count − 1``."""
    u = np.full(x.size, np.nan)
    idx = np.flatnonzero(ok)
    if idx.size == 0:
        return u
    o = idx[np.lexsort((x[idx], ids[idx]))]
    g, xv = ids[o], x[o]
    m = o.size
    new_g = np.empty(m, dtype=bool)
    new_g[0] = True
    new_g[1:] = g[1:] != g[:-1]
    g_first = np.flatnonzero(new_g)
    g_start = np.repeat(g_first, np.diff(np.append(g_first, m)))
    new_run = new_g.copy()
    new_run[1:] |= xv[1:] != xv[:-1]
    r_first = np.flatnonzero(new_run)
    r_len = np.diff(np.append(r_first, m))
    run = np.cumsum(new_run) - 1
    mid = r_first[run] + (r_len[run] - 1) / 2.0 - g_start
    k = cnt[g]
    with np.errstate(invalid="ignore", divide="ignore"):
        u[o] = np.where(k >= 2, mid / np.maximum(k - 1, 1), np.nan)
    return u


def _reference(med: np.ndarray, values: np.ndarray, cnt: np.ndarray) -> np.ndarray:
    """Rule 1's reference per row: the instance median, or with two ranks the other's value."""
    return np.where(cnt == 2, 2.0 * med - values, med)


def _segments(df: pl.DataFrame, start: np.ndarray, s_ok: np.ndarray) -> np.ndarray:
    """Rule 2: ``start − previous stop`` on the same rank when the previous row is ``coll_sn − 1``."""
    stop, stop_ok = values_of(df["stop_us"])
    rank = df["rank"].cast(pl.Int64).to_numpy()
    sn = df["coll_sn"].cast(pl.Int64).to_numpy()
    o = np.lexsort((sn, rank))
    c = np.full(start.size, np.nan)
    if o.size < 2:
        return c
    cur, prev = o[1:], o[:-1]
    ok = (rank[cur] == rank[prev]) & (sn[cur] == sn[prev] + 1) & s_ok[cur] & stop_ok[prev]
    c[cur[ok]] = start[cur[ok]] - stop[prev[ok]]
    c[c <= 0] = np.nan
    return c


def _period(ids: np.ndarray, n: int, sn: np.ndarray, t_inst: np.ndarray) -> float:
    """Rule 2's ``P``: first quartile of Δt / Δcoll_sn over consecutive instances."""
    inst_sn = np.zeros(n)
    inst_sn[ids] = sn
    ok = np.isfinite(t_inst)
    o = np.argsort(inst_sn[ok], kind="stable")
    s, t = inst_sn[ok][o], t_inst[ok][o]
    ds, dt = np.diff(s), np.diff(t)
    per = dt[(ds > 0) & (dt > 0)] / ds[(ds > 0) & (dt > 0)]
    return float(np.percentile(per, 25)) if per.size else math.nan


def row_stats(waits: pl.DataFrame, window_us: float) -> dict[str, np.ndarray]:
    """Rules 1–2 for one communicator's :func:`rank_waits` rows: ``rank, window, u, var, late,
    slow`` per row (NaN where unknown)."""
    ids, n = instance_ids(waits)
    timed = waits["timed"].to_numpy()
    start, s_ok = values_of(waits["start_us"])
    ex, e_ok = values_of(waits["exec_us"])
    x = np.where(timed, start, -ex)
    ok = np.where(timed, s_ok, e_ok)
    cnt = np.bincount(ids[ok], minlength=n)
    u = _positions(ids, x, ok, cnt)
    k = cnt[ids].astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        var = np.where(k >= 2, (k + 1) / (12.0 * (k - 1)), np.nan)
    med = group_median(ids, n, x, ok)[ids]
    xref = _reference(med, x, cnt[ids])
    late = np.where(ok, x - xref, np.nan)
    # rule 2, measured segments
    c = _segments(waits, start, s_ok & timed)
    c_ok = np.isfinite(c)
    full = np.bincount(ids[c_ok], minlength=n) == cnt
    cref = _reference(group_median(ids, n, np.nan_to_num(c), c_ok)[ids], c, cnt[ids])
    with np.errstate(invalid="ignore", divide="ignore"):
        slow_a = np.where(c_ok & full[ids] & (cref > 0), c / cref - 1.0, np.nan)
    # rule 2, estimated from the period
    cols = [c for c in ("start_us", "t_us") if c in waits.columns]
    t_src, t_ok = values_of(waits.select(pl.coalesce(cols)).to_series())
    first = group_extreme(ids, n, t_src, t_ok, np.minimum)
    last_start = group_extreme(ids, n, start, s_ok & timed, np.maximum)
    t_inst = np.where(np.isfinite(last_start), last_start, first)
    period = _period(ids, n, waits["coll_sn"].cast(pl.Float64).to_numpy(), t_inst)
    xmax = group_extreme(ids, n, x, ok, np.maximum)[ids]
    transfer, tr_ok = values_of(waits["transfer_us"])
    base = period - np.where(tr_ok, transfer, 0.0) - (xmax - xref)
    with np.errstate(invalid="ignore", divide="ignore"):
        slow_b = np.where(base > 0, late / base, np.nan)
    slow = np.where(np.isfinite(slow_a), slow_a, slow_b)
    window = (np.nan_to_num(first, nan=0.0) // window_us).astype(np.int64)[ids]
    return {"rank": waits["rank"].cast(pl.Int64).to_numpy(), "window": window, "u": u, "var": var,
            "late": late, "slow": slow, "inst": ids, "n_inst": np.array([n])}  # fmt: skip


# ---- rules 3–6: tests, false-discovery control, naming -------------------------------------------


def _p_upper(z: np.ndarray) -> np.ndarray:
    """P(Z ≥ z) for a standard normal Z."""
    return np.array([0.5 * math.erfc(v / math.sqrt(2.0)) for v in z.tolist()])


def bh_adjust(p: np.ndarray) -> np.ndarray:
    """Benjamini–Hochberg adjusted p-values (q-values) in the input order."""
    m = p.size
    if m == 0:
        return p
    o = np.argsort(p)
    q = p[o] * m / np.arange(1, m + 1)
    q = np.minimum.accumulate(q[::-1])[::-1]
    out = np.empty(m)
    out[o] = np.minimum(q, 1.0)
    return out


def window_tests(rows: dict[str, np.ndarray], th: Thresholds) -> pl.DataFrame:
    """Rules 3–5 per (rank, window): ``k, z, p, q, slowness, slow`` for evaluated windows."""
    ok = np.isfinite(rows["u"])
    frame = pl.DataFrame({
        "rank": rows["rank"][ok], "window": rows["window"][ok], "inst": rows["inst"][ok],
        "du": rows["u"][ok] - 0.5, "var": rows["var"][ok],
        "slow": pl.Series(rows["slow"][ok], nan_to_null=True),
        "late": pl.Series(rows["late"][ok], nan_to_null=True),
    })  # fmt: skip
    per_window = frame.group_by("window").agg(pl.col("inst").n_unique().alias("instances"))
    evaluated = per_window.filter(pl.col("instances") >= th.min_instances)["window"]
    med = pl.col("late").median().over("window")
    out = (
        frame.filter(pl.col("window").is_in(evaluated.implode()))
        .with_columns((1.4826 * (pl.col("late") - med).abs().median().over("window")).alias("spread"))
        .group_by(["rank", "window"])
        .agg(
            pl.len().alias("k"), pl.col("du").sum(), pl.col("var").sum(), pl.col("slow").median(),
            pl.col("late").median().alias("late_us"), pl.col("spread").first(),
        )
        .sort(["rank", "window"])
    )  # fmt: skip
    z = (out["du"] / out["var"].sqrt()).fill_nan(0.0).to_numpy()
    p = _p_upper(z)
    return out.with_columns(
        pl.Series("z", z), pl.Series("p", p), pl.Series("q", bh_adjust(p)),
        pl.col("slow").fill_null(0.0).alias("slowness"),
        (pl.col("late_us") / pl.col("spread")).fill_nan(0.0).fill_null(0.0).alias("late_sd"),
    ).drop("slow").with_columns(
        (
            (pl.col("q") <= th.fdr_q)
            & (pl.col("slowness") >= th.window_slow_min)
            & ((pl.col("late_sd") >= th.late_sd_min) | (pl.col("spread") == 0))
        ).alias("slow")
    )  # fmt: skip


def rank_tests(win: pl.DataFrame, th: Thresholds) -> pl.DataFrame:
    """Rule 4–5 pooled per rank over its evaluated windows: ``z, q, slowness, slow_overall``."""
    per = (
        win.group_by("rank")
        .agg(pl.col("du").sum(), pl.col("var").sum(), pl.col("slowness").median(), pl.len().alias("windows"))
        .sort("rank")
    )
    z = (per["du"] / per["var"].sqrt()).fill_nan(0.0).to_numpy()
    q = bh_adjust(_p_upper(z))
    return per.with_columns(pl.Series("z", z), pl.Series("q", q)).with_columns(
        ((pl.col("q") <= th.fdr_q) & (pl.col("slowness") >= th.slow_min)).alias("slow_overall")
    )


def episodes(windows: list[int], window_s: float) -> list[dict[str, Any]]:
    """Contiguous runs of slow windows as ``{start_ns, end_ns, windows}``."""
    out: list[dict[str, Any]] = []
    for w in sorted(windows):
        if out and out[-1]["last"] == w - 1:
            out[-1]["last"] = w
        else:
            out.append({"first": w, "last": w})
    ns = int(window_s * 1e9)
    return [
        {"start_ns": e["first"] * ns, "end_ns": (e["last"] + 1) * ns, "windows": e["last"] - e["first"] + 1}
        for e in out
    ]


def _blame(waits: pl.DataFrame) -> dict[int, float]:
    """Σ of the others' waits charged to each instance's last rank."""
    ids, n = instance_ids(waits)
    w, ok = values_of(waits["wait_us"])
    per_inst = np.bincount(ids[ok], weights=w[ok], minlength=n)
    culprit = np.zeros(n, dtype=np.int64)
    culprit[ids] = waits["last_rank"].cast(pl.Int64).to_numpy()
    ranks = np.unique(culprit)
    return {int(r): float(per_inst[culprit == r].sum()) for r in ranks}


def _named(
    win: pl.DataFrame, ranks: pl.DataFrame, th: Thresholds
) -> dict[int, tuple[list[int], dict[str, Any]]]:
    """Rules 5–6: rank → (its slow windows, its pooled row)."""
    pooled = {int(r["rank"]): r for r in ranks.to_dicts()}
    out = {}
    for (rank,), df in win.group_by(["rank"], maintain_order=True):
        r = int(rank)  # type: ignore[call-overload]
        slow = set(df.filter(pl.col("slow"))["window"].to_list())
        if pooled[r]["slow_overall"]:
            extra = df.filter((pl.col("slowness") >= th.window_slow_min) & (pl.col("z") > 0))
            slow |= set(extra["window"].to_list())
        if slow:
            out[r] = (sorted(slow), pooled[r])
    return out


def _one_comm(part: pl.DataFrame, th: Thresholds) -> list[Straggler]:
    waits = rank_waits(part)
    if waits.height == 0:
        return []
    rows = row_stats(waits, th.window_s * 1e6)
    win = window_tests(rows, th)
    if win.height == 0:
        return []
    ranks = rank_tests(win, th)
    evaluated = win["window"].n_unique()
    n_ranks = int(part["rank"].n_unique())
    blame = _blame(waits)
    total = sum(blame.values()) or 1.0
    found = []
    for rank, (slow, pooled) in _named(win, ranks, th).items():
        mine = win.filter((pl.col("rank") == rank) & pl.col("window").is_in(slow))
        q = min([float(pooled["q"]), *mine.filter(pl.col("slow"))["q"].to_list()])
        found.append(Straggler(
            rank=rank, kind="persistent" if len(slow) / evaluated >= th.persistent_min else "intermittent",
            persistence=len(slow) / evaluated, windows_flagged=len(slow), windows_evaluated=evaluated,
            blame_us=blame.get(rank, 0.0), blame_share=blame.get(rank, 0.0) / total, flagged_windows=slow,
            comm_id=str(part["comm_id"][0]), n_ranks=n_ranks,
            slowness=float(np.median(mine["slowness"].to_numpy())),
            lateness_us=float(np.median(mine["late_us"].to_numpy())),
            z=float(pooled["z"]), q_value=q, episodes=episodes(slow, th.window_s), backed=n_ranks > 2,
            window_s=th.window_s, evaluated_span=[int(win["window"].min()), int(win["window"].max())],  # type: ignore[arg-type]
        ))  # fmt: skip
    return sorted(found, key=lambda s: (-s.slowness, s.rank))


def find_stragglers(records: pl.DataFrame, th: Thresholds | None = None) -> list[Straggler]:
    """Rules 1–6 over ``collective_records`` rows (each communicator judged on its own)."""
    th = th or Thresholds()
    if records.height == 0:
        return []
    out: list[Straggler] = []
    for _, part in records.group_by(["origin", "comm_id"], maintain_order=True):
        out += _one_comm(part, th)
    return out


def blame_by_window(waits: pl.DataFrame, window_us: float) -> pl.DataFrame:
    """One row per (window, rank): ``blame_us, waited_us, share, instances`` (the heat map).

    An instance's window is that of its earliest start (``start_us``, else ``t_us``).
    """
    ids, n = instance_ids(waits)
    t = waits.select(pl.coalesce([c for c in ("start_us", "t_us") if c in waits.columns])).to_series()
    first = pl.Series(group_extreme(ids, n, *values_of(t), np.minimum)[ids], nan_to_null=True)
    w = waits.with_columns(
        pl.Series("_g", ids), (first.fill_null(0) // window_us).cast(pl.Int64).alias("window")
    )
    inst = w.group_by("_g").agg(
        pl.col("window").first(),
        pl.col("last_rank").first().alias("rank"),
        pl.col("wait_us").sum().alias("blame_us"),
    )
    caused = inst.group_by(["window", "rank"]).agg(pl.col("blame_us").sum())
    waited = w.group_by(["window", "rank"]).agg(pl.col("wait_us").sum().alias("waited_us"))
    n_inst = inst.group_by("window").agg(pl.len().alias("instances"))
    out = waited.join(caused, on=["window", "rank"], how="left").with_columns(
        pl.col("blame_us").fill_null(0.0)
    )
    out = out.join(n_inst, on="window").with_columns(
        (pl.col("blame_us") / pl.col("blame_us").sum().over("window")).fill_nan(0.0).alias("share")
    )
    return out.sort(["window", "rank"])


# ---- rule 7 and the causes --------------------------------------------------------------------------


def root_cause(
    con: duckdb.DuckDBPyConnection,
    s: Straggler,
    origin: str | None = None,
    mapping: dict[int, tuple[str, int]] | None = None,
    th: Thresholds | None = None,
) -> Straggler:
    """Fill ``cause``, ``causes``, ``evidence``, ``host``/``gpu`` of ``s`` in place; with two
    ranks ``backed`` says whether the telemetry backs the verdict (rule 7)."""
    th = th or Thresholds()
    gpus, how = rank_gpus(con, origin, mapping, s.comm_id or None)
    s.mapping = how
    if s.rank not in gpus:
        s.cause = "unexplained: rank not mapped to a GPU"
        s.backed = s.n_ranks > 2
        return s
    s.host, s.gpu = gpus[s.rank]
    peers = [g for r, g in gpus.items() if r != s.rank]
    span_ns = th.window_s * 1e9
    slow = [(int(w * span_ns), int((w + 1) * span_ns)) for w in s.flagged_windows]
    first, last = s.evaluated_span or [min(s.flagged_windows, default=0), max(s.flagged_windows, default=0)]
    rest = sorted(set(range(first, last + 1)) - set(s.flagged_windows))
    history = [(e["start_ns"], e["end_ns"]) for e in episodes(rest, th.window_s)]
    verdict = causes.explain(con, (s.host, s.gpu), peers, slow, history, origin, s.rank, th)
    s.cause, s.causes, s.evidence = verdict.cause, verdict.causes, verdict.evidence
    s.backed = s.n_ranks > 2 or verdict.cause != "unexplained"
    return s


def judge(
    con: duckdb.DuckDBPyConnection,
    records: pl.DataFrame,
    origin: str | None,
    mapping: dict[int, tuple[str, int]] | None = None,
    th: Thresholds | None = None,
) -> list[dict[str, Any]]:
    """Rules 1–7 with causes over one origin's records: the named ranks as dicts, most slow first."""
    th = th or Thresholds()
    out = []
    for s in find_stragglers(records, th):
        root_cause(con, s, origin, mapping, th)
        if s.backed:
            out.append(asdict(s))
    return out


def analyze(
    con: duckdb.DuckDBPyConnection,
    origin: str | None = None,
    mapping: dict[int, tuple[str, int]] | None = None,
    th: Thresholds | None = None,
    comm_ids: list[str] | None = None,
) -> dict[str, Any]:
    """Stragglers of one origin (or every origin) with causes, as a dict.

    Each communicator is judged on its own (its ranks are numbered within it and its peers are
    the GPUs it spans); ``comm_ids`` restricts the analysis to some (one deployment's).
    """
    th = th or Thresholds()
    origins = (
        [origin]
        if origin
        else [r[0] for r in con.execute("SELECT DISTINCT origin FROM collective_records").fetchall()]
    )
    result: dict[str, Any] = {"thresholds": asdict(th), "origins": {}}
    for o in sorted(origins):
        records = load_collectives(con, o)
        if comm_ids is not None:
            records = records.filter(pl.col("comm_id").is_in(comm_ids))
        found = judge(con, records, o, mapping, th)
        result["origins"][o] = sorted(found, key=lambda f: (-f["slowness"], -f["blame_us"]))
    return result
