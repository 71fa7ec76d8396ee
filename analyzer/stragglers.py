"""Straggler ranks by arrival skew, and why: the culprit GPU's telemetry against its peers.

Blame (REFERENCE §4): in each collective instance the last rank to arrive is charged the sum of
the others' waits (:func:`analyzer.collectives.rank_waits`). Per-rank kernel duration alone is
never used: the straggler shows the *shortest* NCCL kernel.

Rule for "straggler" (defaults in :class:`Thresholds`):

1. Windows of ``window_s`` on the collectives' start times; a window is evaluated when it holds
   ≥ ``min_instances`` instances and some wait.
2. ``share_r`` = blame of rank r / blame of all ranks in the window (ranks never last get 0).
3. Robust z-score: ``z_r = (share_r − median(share)) / max(1.4826·MAD(share), mad_floor)``.
4. A rank is flagged in a window when ``z_r ≥ z_min`` and ``share_r ≥ share_min`` (it carries at
   least half the window's blame: with 8 balanced ranks a 25-instance window's top share is ~0.35).
   With 2 ranks the z-score cannot reach ``z_min``: two ranks cannot name a straggler.
5. persistence = flagged windows / evaluated windows. ``persistent`` when ≥ ``persistent_min``,
   else ``transient`` (flagged at least once). Nothing is reported for a rank never flagged.

Root cause (:func:`root_cause`), same window(s), culprit GPU vs the median of its peers' GPUs:

6. ``xid_last`` non-zero → ``gpu_xid``; ECC error counters rising → ``ecc_errors``.
7. SM clock < ``clock_ratio_max`` × peers, or a throttle mask / violation counter rising on the
   culprit only → ``gpu_throttled`` (``thermal`` when the culprit is ≥ ``temp_delta_c`` hotter,
   ``power`` when a power violation rises).
8. PCIe replay or NVLink error counters rising on the culprit only → ``slow_link``.
9. Compute kernels (Kineto) ≥ ``compute_ratio_min`` × peers' mean time → ``slow_compute``.
10. Otherwise ``unexplained`` (host side: input, CPU contention, launch delay).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import duckdb
import numpy as np
import polars as pl

from analyzer.collectives import group_extreme, instance_ids, load_collectives, rank_waits, values_of


@dataclass(frozen=True)
class Thresholds:
    """The numbers behind the rule (module notes 1–10)."""

    window_s: float = 10.0
    min_instances: int = 3
    z_min: float = 3.5
    mad_floor: float = 0.02
    share_min: float = 0.5
    persistent_min: float = 0.5
    clock_ratio_max: float = 0.9
    temp_delta_c: float = 10.0
    compute_ratio_min: float = 1.1


@dataclass
class Straggler:
    """One flagged rank with its persistence and (when asked) its root cause."""

    rank: int
    kind: str  # 'persistent' | 'transient'
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


def _with_window(waits: pl.DataFrame, window_us: float) -> pl.DataFrame:
    """Adds ``_g`` (the instance id) and ``window``: that of the instance's earliest start
    (``start_us``, else ``t_us``; 0 when it has none)."""
    ids, n = instance_ids(waits)
    t = waits.select(pl.coalesce([c for c in ("start_us", "t_us") if c in waits.columns])).to_series()
    first = pl.Series(group_extreme(ids, n, *values_of(t), np.minimum)[ids], nan_to_null=True)
    return waits.with_columns(
        pl.Series("_g", ids), (first.fill_null(0) // window_us).cast(pl.Int64).alias("window")
    )


def blame_by_window(waits: pl.DataFrame, window_us: float) -> pl.DataFrame:
    """Rules 1–2. One row per (window, rank): ``blame_us, waited_us, share, instances``.

    An instance's window is that of its earliest start (``start_us``, else ``t_us``); instances
    are grouped by :func:`analyzer.collectives.instance_ids` (integers, not the string key).
    """
    w = _with_window(waits, window_us)
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


def flag(blame: pl.DataFrame, th: Thresholds) -> pl.DataFrame:
    """Rules 3–4 over :func:`blame_by_window`'s frame: adds ``z`` and ``flagged``."""
    evaluated = blame.filter(
        (pl.col("instances") >= th.min_instances) & (pl.col("blame_us").sum().over("window") > 0)
    )
    med = pl.col("share").median().over("window")
    mad = (pl.col("share") - med).abs().median().over("window")
    scale = pl.max_horizontal(1.4826 * mad, pl.lit(th.mad_floor))
    return evaluated.with_columns(((pl.col("share") - med) / scale).alias("z")).with_columns(
        ((pl.col("z") >= th.z_min) & (pl.col("share") >= th.share_min)).alias("flagged")
    )


def find_stragglers(records: pl.DataFrame, th: Thresholds | None = None) -> list[Straggler]:
    """Rule 5 over ``collective_records`` rows of one deployment / origin."""
    th = th or Thresholds()
    waits = rank_waits(records)
    if waits.height == 0:
        return []
    flagged = flag(blame_by_window(waits, th.window_s * 1e6), th)
    evaluated = flagged["window"].n_unique()
    total = float(flagged["blame_us"].sum()) or 1.0
    out = []
    for (rank,), df in flagged.filter(pl.col("flagged")).group_by(["rank"], maintain_order=True):
        mine = flagged.filter(pl.col("rank") == rank)
        persistence = df.height / evaluated
        out.append(
            Straggler(
                rank=int(rank), kind="persistent" if persistence >= th.persistent_min else "transient",
                persistence=persistence, windows_flagged=df.height, windows_evaluated=evaluated,
                blame_us=float(mine["blame_us"].sum()), blame_share=float(mine["blame_us"].sum()) / total,
                flagged_windows=sorted(df["window"].to_list()),
            )
        )  # fmt: skip
    return sorted(out, key=lambda s: -s.blame_us)


# ---- root cause ---------------------------------------------------------------------------------

# (label, SQL LIKE pattern on gpu_samples.metric, how: 'avg' gauge | 'rise' counter | 'last' code)
TELEMETRY = (
    ("sm_clock_mhz", "sm_clock_mhz", "avg"),
    ("gpu_temp_c", "gpu_temp_c", "avg"),
    ("power_w", "power_w", "avg"),
    ("throttle_mask", "%throttle%mask", "last"),
    ("power_violation_s", "power_violation%", "rise"),
    ("thermal_violation_s", "thermal_violation%", "rise"),
    ("xid_last", "xid%last", "last"),
    ("ecc_errors", "ecc%", "rise"),
    ("pcie_replay_total", "pcie_replay%", "rise"),
    ("nvlink_errors", "nvlink%error%", "rise"),
)


def rank_gpus(
    con: duckdb.DuckDBPyConnection,
    origin: str | None,
    mapping: dict[int, tuple[str, int]] | None = None,
    comm_id: str | None = None,
) -> tuple[dict[int, tuple[str, int]], str]:
    """rank → (host, gpu) within one communicator (ranks are numbered per communicator).

    Given ``mapping`` wins; else the ranks of the communicator on a host take its GPUs in rank order.
    """
    if mapping:
        return dict(mapping), "given"
    conds = [c for c, v in (("origin = ?", origin), ("comm_id = ?", comm_id)) if v]
    params = [v for v in (origin, comm_id) if v]
    where = f"WHERE {' AND '.join(conds)}" if conds else ""
    rows = con.execute(
        f"SELECT rank, mode(coalesce(host, '')) FROM collective_records {where} GROUP BY rank ORDER BY rank",
        params,
    ).fetchall()
    out: dict[int, tuple[str, int]] = {}
    per_host: dict[str, int] = {}
    for rank, host in rows:
        out[int(rank)] = (host, per_host.get(host, 0))
        per_host[host] = per_host.get(host, 0) + 1
    return out, "assumed: local rank order on host"


def _gpu_stats(con: duckdb.DuckDBPyConnection, lo_ns: float | None, hi_ns: float | None) -> pl.DataFrame:
    """Per (host, gpu, label): the value the rule compares (avg / rise / last non-zero)."""
    parts = []
    for label, pattern, how in TELEMETRY:
        agg = {"avg": "avg(value)", "rise": "max(value) - min(value)", "last": "max(value)"}[how]
        span = "" if lo_ns is None else f" AND ts_ns >= {int(lo_ns)} AND ts_ns < {int(hi_ns or 0)}"
        parts.append(
            f"SELECT host, gpu, '{label}' AS label, {agg} AS value FROM gpu_samples "
            f"WHERE metric LIKE '{pattern}'{span} GROUP BY host, gpu"
        )
    return pl.from_arrow(con.execute(" UNION ALL ".join(parts)).to_arrow_table())  # type: ignore[return-value]


def evidence_table(
    stats: pl.DataFrame, culprit: tuple[str, int], peers: list[tuple[str, int]]
) -> list[dict[str, Any]]:
    """One row per telemetry label: culprit value, peers' median, ratio."""
    rows = []
    for (label,), df in stats.group_by(["label"], maintain_order=True):
        mine = df.filter((pl.col("host") == culprit[0]) & (pl.col("gpu") == culprit[1]))["value"]
        keys = [f"{h}|{g}" for h, g in peers]
        others = df.filter((pl.col("host") + "|" + pl.col("gpu").cast(pl.Utf8)).is_in(keys))["value"]
        if mine.len() == 0 or mine[0] is None:
            continue
        peer = float(np.median(others.drop_nulls().to_numpy())) if others.drop_nulls().len() else None
        value = float(mine[0])
        rows.append({"metric": label, "culprit": value, "peers_median": peer,
                     "ratio": value / peer if peer else None})  # fmt: skip
    return rows


def compute_ratio(con: duckdb.DuckDBPyConnection, origin: str | None, rank: int) -> float | None:
    """Mean compute-kernel time of ``rank`` over the median of its peers' means (Kineto only)."""
    if not origin or not origin.startswith("kineto:"):
        return None
    rows = con.execute(
        "SELECT rank, avg(dur_us) FROM kernel_events WHERE trace_set = ? AND kernel_type = 'COMPUTATION' "
        "GROUP BY rank",
        [origin.removeprefix("kineto:")],
    ).fetchall()
    means = {int(r): float(m) for r, m in rows}
    peers = [m for r, m in means.items() if r != rank]
    if rank not in means or not peers:
        return None
    return means[rank] / float(np.median(peers))


def classify(evidence: list[dict[str, Any]], compute: float | None, th: Thresholds) -> str:
    """Rules 6–10 over the evidence table."""
    ev = {r["metric"]: r for r in evidence}

    def rises(label: str) -> bool:
        row = ev.get(label)
        return bool(row and row["culprit"] > 0 and row["culprit"] > (row["peers_median"] or 0))

    if ev.get("xid_last") and ev["xid_last"]["culprit"] > 0:
        return "gpu_xid"
    if rises("ecc_errors"):
        return "ecc_errors"
    clock = ev.get("sm_clock_mhz")
    slow_clock = bool(clock and clock["ratio"] is not None and clock["ratio"] < th.clock_ratio_max)
    if slow_clock or rises("throttle_mask") or rises("power_violation_s") or rises("thermal_violation_s"):
        temp = ev.get("gpu_temp_c")
        hot = (
            temp
            and temp["peers_median"] is not None
            and temp["culprit"] - temp["peers_median"] >= th.temp_delta_c
        )
        if hot or rises("thermal_violation_s"):
            return "gpu_throttled: thermal"
        return "gpu_throttled: power" if rises("power_violation_s") else "gpu_throttled"
    if rises("pcie_replay_total") or rises("nvlink_errors"):
        return "slow_link"
    if compute is not None and compute >= th.compute_ratio_min:
        return "slow_compute"
    return "unexplained"


def root_cause(
    con: duckdb.DuckDBPyConnection,
    s: Straggler,
    origin: str | None = None,
    mapping: dict[int, tuple[str, int]] | None = None,
    th: Thresholds | None = None,
) -> Straggler:
    """Fill ``cause``, ``evidence``, ``host``/``gpu`` of ``s`` (rules 6–10), in place."""
    th = th or Thresholds()
    gpus, how = rank_gpus(con, origin, mapping, s.comm_id or None)
    if s.rank not in gpus:
        s.cause, s.mapping = "unexplained: rank not mapped to a GPU", how
        return s
    s.host, s.gpu = gpus[s.rank]
    s.mapping = how
    peers = [g for r, g in gpus.items() if r != s.rank]
    window_ns = th.window_s * 1e9
    lo = min(s.flagged_windows) * window_ns if s.flagged_windows else None
    hi = (max(s.flagged_windows) + 1) * window_ns if s.flagged_windows else None
    stats = _gpu_stats(con, lo, hi)
    if stats.height == 0:  # no telemetry in the window: fall back to all of it
        stats = _gpu_stats(con, None, None)
    s.evidence = evidence_table(stats, (s.host, s.gpu), peers)
    compute = compute_ratio(con, origin, s.rank)
    if compute is not None:
        s.evidence.append({"metric": "compute_kernel_time_ratio", "culprit": compute, "peers_median": 1.0,
                           "ratio": compute})  # fmt: skip
    s.cause = classify(s.evidence, compute, th)
    return s


def analyze(
    con: duckdb.DuckDBPyConnection,
    origin: str | None = None,
    mapping: dict[int, tuple[str, int]] | None = None,
    th: Thresholds | None = None,
    comm_ids: list[str] | None = None,
) -> dict[str, Any]:
    """Stragglers of one origin (or every origin) with root causes, as a dict.

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
        found: list[dict[str, Any]] = []
        for (comm,), part in records.group_by(["comm_id"], maintain_order=True):
            if comm_ids is not None and comm not in comm_ids:
                continue
            for s in find_stragglers(part, th):
                s.comm_id = str(comm)
                found.append(asdict(root_cause(con, s, o, mapping, th)))
        result["origins"][o] = sorted(found, key=lambda f: -f["blame_us"])
    return result
