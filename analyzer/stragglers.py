"""Straggler ranks: every rank that makes its peers wait, tested over time, and why.

Input: ``collective_records`` of one communicator (NCCL Inspector, Kineto), grouped into instances
(the same ``coll_sn`` ≥ 0 on ≥ 2 ranks, as in :mod:`analyzer.collectives`); the arithmetic is in
:mod:`analyzer.straggler_stats`, the causes are read from the culprit GPU's telemetry by
:mod:`analyzer.straggler_causes`.

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
   over ``k`` instances ``z = Σ(u − 1/2) / √ΣVar`` is standard normal; p = P(Z ≥ z). (Ties
   make the true variance smaller, so the test is then conservative.)
4. Windows of ``window_s`` on each instance's earliest start (else its dump time); a window is
   evaluated when it holds ≥ ``min_instances`` instances. Every (rank, window) is tested
   (rule 3), and every rank over the whole span (pooled). False discoveries are controlled with
   Benjamini–Hochberg at ``fdr_q``, across all ranks × windows and, separately, across ranks.
5. A (rank, window) is slow when its test is a discovery and its median lateness is
   ≥ ``late_sd_min`` × the window's jitter (the median over ranks of 1.4826 × the MAD of each
   rank's own lateness: a rank last by chance is late by a fraction of it), and its median
   slowness ≥ ``window_slow_min`` (0 by default: records sampled far apart make the compute
   segment look long). A rank is slow over the span when its pooled test is a discovery and
   the median of its window slownesses is ≥ ``slow_min`` (consistent slowness of 5 % is found
   although each window alone may be too short to show it); then every window with z > 0 and
   slowness ≥ ``window_slow_min`` counts as slow too.
6. Every rank with a slow window is named: several ranks at once. ``persistent`` when it was
   slow in ≥ ``persistent_min`` of the evaluated windows, else ``intermittent``; the windows
   and their contiguous episodes are reported.
7. With two ranks the test says only which rank the other waits for (a rank that is merely
   fast would look the same): the waited-for rank is named only when its own evidence backs it
   (``backed_by``, rules of :mod:`analyzer.straggler_backing`): its telemetry against its peer
   or its own history (a cause other than ``unexplained``, :mod:`analyzer.straggler_causes`),
   its compute segments against its own earlier windows while the peer's did not shrink, or its
   compute segments against the performance model's expected segment (``expected_us`` per
   communicator) while its peer runs at the model's pace. A pair where neither holds names
   nobody.

Blame (reported, no longer a gate): per instance the last rank is charged the sum of the
others' waits; ``blame_share`` is its part of all blame of the communicator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import duckdb
import numpy as np
import polars as pl

from analyzer import straggler_backing as backing
from analyzer import straggler_causes as causes
from analyzer import straggler_stats as stats
from analyzer.collectives import (
    group_extreme,
    instance_ids,
    values_of,
)
from analyzer.point_bins import exact_total
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
    late_sd_min: float = 1.0
    persistent_min: float = 0.5
    clock_ratio_max: float = 0.97
    temp_delta_c: float = 10.0
    power_limit_ratio_max: float = 0.97
    util_gap_min: float = 0.03
    compute_ratio_min: float = 1.04
    congestion_ratio: float = 2.0
    model_tolerance: float = 0.15


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
    slowness: float | None = None  # median over its slow windows (0.07 = 7 % slower); None: unknown
    lateness_us: float = 0.0  # median arrival after the reference, over its slow windows
    z: float = 0.0  # pooled test statistic (rule 3)
    q_value: float = 1.0  # smallest BH-adjusted p of its discoveries (rule 4)
    episodes: list[dict[str, Any]] = field(default_factory=list)  # contiguous slow windows
    causes: list[dict[str, Any]] = field(default_factory=list)  # every cause that fits
    backed: bool = True  # rule 7: False until its own evidence backs a two-rank verdict
    backed_by: list[str] = field(default_factory=list)  # rule 7: telemetry | own_timing | model
    pair_timing: backing.PairTiming | None = None  # rule 7's segment figures (two ranks only)
    window_s: float = 10.0
    evaluated_span: list[int] = field(default_factory=list)  # first and last evaluated window


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


def window_tests(a: stats.Arrivals, th: Thresholds) -> pl.DataFrame:
    """Rules 3–5 per evaluated (rank, window): ``k, z, p, q, slowness, late_sd, slow``."""
    out = stats.window_table(a, th.min_instances)
    z = (out["du"] / out["var"].sqrt()).fill_nan(0.0).to_numpy()
    p = _p_upper(z)
    late_sd = (out["late_us"] / out["spread"]).fill_nan(0.0).to_numpy()
    return out.with_columns(
        pl.Series("z", z), pl.Series("p", p), pl.Series("q", bh_adjust(p)), pl.Series("late_sd", late_sd)
    ).with_columns(
        (
            (pl.col("q") <= th.fdr_q)
            & (pl.col("slowness").fill_null(0.0) >= th.window_slow_min)
            & ((pl.col("late_sd") >= th.late_sd_min) | ((pl.col("spread") == 0) & (pl.col("late_us") > 0)))
        ).alias("slow")
    )


def rank_tests(win: pl.DataFrame, th: Thresholds) -> pl.DataFrame:
    """Rule 4–5 pooled per rank over its evaluated windows: ``z, q, slowness, slow_overall``."""
    per = (
        win.group_by("rank")
        .agg(
            exact_total(pl.col("du")),
            exact_total(pl.col("var")),
            pl.col("slowness").median(),
            pl.len().alias("windows"),
        )
        .sort("rank")
    )
    z = (per["du"] / per["var"].sqrt()).fill_nan(0.0).to_numpy()
    q = bh_adjust(_p_upper(z))
    return per.with_columns(pl.Series("z", z), pl.Series("q", q)).with_columns(
        ((pl.col("q") <= th.fdr_q) & (pl.col("slowness").fill_null(0.0) >= th.slow_min)).alias("slow_overall")
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
            extra = df.filter((pl.col("slowness").fill_null(0.0) >= th.window_slow_min) & (pl.col("z") > 0))
            slow |= set(extra["window"].to_list())
        if slow:
            out[r] = (sorted(slow), pooled[r])
    return out


def _median_or_none(s: pl.Series) -> float | None:
    vals = s.drop_nulls()
    return float(vals.median()) if vals.len() else None  # type: ignore[arg-type]


def _one_comm(part: pl.DataFrame, th: Thresholds, comm_id: str) -> list[Straggler]:
    arr = stats.arrivals(part, th.window_s * 1e6)
    if arr is None:
        return []
    win = window_tests(arr, th)
    if win.height == 0:
        return []
    ranks = rank_tests(win, th)
    evaluated = win["window"].n_unique()
    n_ranks = int(arr.ranks.size)
    blame = arr.blame
    total = sum(blame.values()) or 1.0
    found = []
    evaluated_windows = sorted(win["window"].unique().to_list())
    for rank, (slow, pooled) in _named(win, ranks, th).items():
        mine = win.filter((pl.col("rank") == rank) & pl.col("window").is_in(slow))
        pair = None
        if n_ranks == 2 and arr.segment is not None:
            col = int(np.flatnonzero(arr.ranks == rank)[0])
            pair = backing.pair_timing(arr.segment, arr.window, col, slow, evaluated_windows)
        q = min([float(pooled["q"]), *mine.filter(pl.col("slow"))["q"].to_list()])
        found.append(Straggler(
            rank=rank, kind="persistent" if len(slow) / evaluated >= th.persistent_min else "intermittent",
            persistence=len(slow) / evaluated, windows_flagged=len(slow), windows_evaluated=evaluated,
            blame_us=blame.get(rank, 0.0), blame_share=blame.get(rank, 0.0) / total, flagged_windows=slow,
            comm_id=comm_id, n_ranks=n_ranks,
            slowness=_median_or_none(mine["slowness"]),
            lateness_us=float(np.median(mine["late_us"].to_numpy())),
            z=float(pooled["z"]), q_value=q, episodes=episodes(slow, th.window_s), backed=n_ranks > 2,
            window_s=th.window_s, evaluated_span=[int(win["window"].min()), int(win["window"].max())],  # type: ignore[arg-type]
            pair_timing=pair,
        ))  # fmt: skip
    return sorted(found, key=lambda s: (-(s.slowness or 0.0), s.rank))


def find_stragglers(records: pl.DataFrame, th: Thresholds | None = None) -> list[Straggler]:
    """Rules 1–6 over ``collective_records`` rows (each communicator judged on its own)."""
    th = th or Thresholds()
    if records.height == 0:
        return []
    if records["origin"].n_unique() == 1 and records["comm_id"].n_unique() == 1:
        return _one_comm(records, th, str(records["comm_id"][0]))  # one communicator: no copy
    out: list[Straggler] = []
    for (_, comm), part in records.group_by(["origin", "comm_id"], maintain_order=True):
        out += _one_comm(part, th, str(comm))
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
        exact_total(pl.col("wait_us")).alias("blame_us"),
    )
    caused = inst.group_by(["window", "rank"]).agg(exact_total(pl.col("blame_us")))
    waited = w.group_by(["window", "rank"]).agg(exact_total(pl.col("wait_us")).alias("waited_us"))
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
    gpus_of_comm: tuple[dict[int, tuple[str, int]], str] | None = None,
    cache: dict[Any, Any] | None = None,
    expected_us: float | None = None,
) -> Straggler:
    """Fill ``cause``, ``causes``, ``evidence``, ``host``/``gpu`` of ``s`` in place; with two
    ranks ``backed`` and ``backed_by`` say whether its own evidence backs the verdict (rule 7).
    ``gpus_of_comm``: :func:`rank_gpus` of the communicator when the caller has it already;
    ``cache``: telemetry already read for the communicator's GPUs (filled here);
    ``expected_us``: the performance model's compute segment for the communicator."""
    th = th or Thresholds()
    gpus, how = gpus_of_comm or rank_gpus(con, origin, mapping, s.comm_id or None)
    s.mapping = how
    if s.rank not in gpus:
        s.cause = "unexplained: rank not mapped to a GPU"
        return _back(s, expected_us, th)
    s.host, s.gpu = gpus[s.rank]
    peers = [g for r, g in gpus.items() if r != s.rank]
    span_ns = th.window_s * 1e9
    slow = [(int(w * span_ns), int((w + 1) * span_ns)) for w in s.flagged_windows]
    first, last = s.evaluated_span or [min(s.flagged_windows, default=0), max(s.flagged_windows, default=0)]
    rest = sorted(set(range(first, last + 1)) - set(s.flagged_windows))
    history = [(e["start_ns"], e["end_ns"]) for e in episodes(rest, th.window_s)]
    verdict = causes.explain(con, (s.host, s.gpu), peers, slow, history, origin, s.rank, th, cache)
    s.cause, s.causes, s.evidence = verdict.cause, verdict.causes, verdict.evidence
    return _back(s, expected_us, th)


def _back(s: Straggler, expected_us: float | None, th: Thresholds) -> Straggler:
    """Rule 7 for a two-rank communicator (more ranks need no backing)."""
    if s.n_ranks > 2:
        s.backed = True
        return s
    s.backed_by, rows = backing.backing(s.cause, s.pair_timing, expected_us, th)
    s.evidence = [*s.evidence, *rows]
    s.backed = bool(s.backed_by)
    return s


def _judged(
    con: duckdb.DuckDBPyConnection,
    found: list[Straggler],
    origin: str | None,
    mapping: dict[int, tuple[str, int]] | None,
    th: Thresholds,
    expected_us: Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    out = []
    per_comm: dict[str, tuple[dict[int, tuple[str, int]], str]] = {}
    telemetry: dict[Any, Any] = {}
    for s in found:
        if s.comm_id not in per_comm:  # one scan of the communicator's records for all its ranks
            per_comm[s.comm_id] = rank_gpus(con, origin, mapping, s.comm_id or None)
        expected = (expected_us or {}).get(s.comm_id)
        root_cause(con, s, origin, mapping, th, per_comm[s.comm_id], telemetry, expected)
        if s.backed:
            out.append(asdict(s))
    return out


def judge(
    con: duckdb.DuckDBPyConnection,
    records: pl.DataFrame,
    origin: str | None,
    mapping: dict[int, tuple[str, int]] | None = None,
    th: Thresholds | None = None,
    expected_us: Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    """Rules 1–7 with causes over one origin's records: the named ranks as dicts
    (``expected_us``: communicator → the model's compute segment, rule 7)."""
    th = th or Thresholds()
    return _judged(con, find_stragglers(records, th), origin, mapping, th, expected_us)


def load_comm(con: duckdb.DuckDBPyConnection, origin: str, comm_id: str) -> pl.DataFrame:
    """The numeric columns rules 1–3 read, for one communicator (no string column per row)."""
    rel = con.execute(
        "SELECT coll_sn, rank, start_us, stop_us, exec_us, coalesce(start_us, dump_ts_us) AS t_us "
        "FROM collective_records WHERE origin = ? AND comm_id = ?",
        [origin, comm_id],
    )
    return pl.from_arrow(rel.to_arrow_table())  # type: ignore[return-value]


def analyze(
    con: duckdb.DuckDBPyConnection,
    origin: str | None = None,
    mapping: dict[int, tuple[str, int]] | None = None,
    th: Thresholds | None = None,
    comm_ids: list[str] | None = None,
    expected_us: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Stragglers of one origin (or every origin) with causes, as a dict.

    Each communicator is judged on its own (its ranks are numbered within it and its peers are
    the GPUs it spans); ``comm_ids`` restricts the analysis to some (one deployment's);
    ``expected_us``: communicator → the performance model's compute segment (rule 7).
    """
    th = th or Thresholds()
    origins = (
        [origin]
        if origin
        else [r[0] for r in con.execute("SELECT DISTINCT origin FROM collective_records").fetchall()]
    )
    result: dict[str, Any] = {"thresholds": asdict(th), "origins": {}}
    for o in sorted(origins):
        comms = [r[0] for r in con.execute(
            "SELECT DISTINCT comm_id FROM collective_records WHERE origin = ? ORDER BY 1", [o]
        ).fetchall()]  # fmt: skip
        found: list[Straggler] = []
        for comm in comms:
            if comm_ids is None or comm in comm_ids:
                found += _one_comm(load_comm(con, o, comm), th, str(comm))
        judged = _judged(con, found, o, mapping, th, expected_us)
        result["origins"][o] = sorted(judged, key=lambda f: (-(f["slowness"] or 0.0), -f["blame_us"]))
    return result
