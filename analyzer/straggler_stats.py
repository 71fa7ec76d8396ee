"""The numbers behind :mod:`analyzer.stragglers` rules 1–4, as instance × rank matrices.

One communicator's ``collective_records`` become matrices with one row per instance (``coll_sn``
≥ 0, seen on ≥ 2 ranks, rows in ``coll_sn`` order) and one column per rank, NaN where a rank has
no record. Every per-instance step (median, order, previous instance) is then an operation along
an axis, and every per-(rank, window) sum or median works on contiguous slices of instances: 1M
records take a fraction of a second, with no group-by over string keys.

Shapes: input rows ``coll_sn, rank, start_us, stop_us, exec_us, t_us``; output
:class:`Arrivals` (instance × rank) and :func:`window_table` (one row per evaluated rank × window).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

MAX_PAIRWISE_RANKS = 32  # above this, arrival order comes from a double argsort (ties broken by rank)


def _dense(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct keys, index of each key among them)."""
    lo, hi = int(keys.min()), int(keys.max())
    if hi - lo <= 4 * keys.size + 1024:
        present = np.zeros(hi - lo + 1, dtype=bool)
        present[keys - lo] = True
        return np.flatnonzero(present) + lo, (np.cumsum(present) - 1)[keys - lo]
    uniq, inv = np.unique(keys, return_inverse=True)
    return uniq, inv.ravel()


def _matrix(rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int], s: pl.Series) -> np.ndarray:
    m = np.full(shape, np.nan, order="F")  # column-major: reductions across ranks run per column
    m[rows, cols] = s.cast(pl.Float64).fill_null(np.nan).to_numpy()
    return m


@dataclass
class Arrivals:
    """Rules 1–3 per instance × rank (NaN where unknown) and per instance."""

    ranks: np.ndarray  # column → rank number
    window: np.ndarray  # per instance
    u: np.ndarray  # arrival order in [0, 1]
    var: np.ndarray  # its variance under "no different from the peers"
    late: np.ndarray  # µs after the reference arrival
    slow: np.ndarray  # slowness (0.07 = 7 % longer compute than the reference)
    blame: dict[int, float]  # Σ of the others' waits charged to each instance's last rank
    segment: np.ndarray | None = None  # rule 2's measured compute segment c_r, µs (NaN: unknown)


def nan_median(m: np.ndarray, axis: int = 1) -> np.ndarray:
    """Median along ``axis`` ignoring NaN (NaN where all are): a sort, not numpy's per-row loop."""
    if not np.isnan(m).any():
        return np.asarray(np.median(m, axis=axis))
    s = np.sort(m, axis=axis)  # NaN sorts last
    cnt = (~np.isnan(m)).sum(axis=axis)
    lo, hi = np.maximum((cnt - 1) // 2, 0), np.maximum(cnt // 2, 0)
    if axis == 1:
        rows = np.arange(m.shape[0])
        a, b = s[rows, lo], s[rows, hi]
    else:
        cols = np.arange(m.shape[1])
        a, b = s[lo, cols], s[hi, cols]
    return np.where(cnt > 0, a + (b - a) * 0.5, np.nan)


def rsum(m: np.ndarray) -> np.ndarray:
    """Σ over ranks per instance."""
    return np.asarray(np.add.reduce(np.asfortranarray(m), axis=1))


def rmax(m: np.ndarray) -> np.ndarray:
    """Max over ranks per instance ignoring NaN (NaN when all are)."""
    return np.asarray(np.fmax.reduce(np.asfortranarray(m), axis=1))


def rmin(m: np.ndarray) -> np.ndarray:
    """Min over ranks per instance ignoring NaN (NaN when all are)."""
    return np.asarray(np.fmin.reduce(np.asfortranarray(m), axis=1))


@contextmanager
def _quiet() -> Iterator[None]:
    """Silences numpy's "All-NaN slice" / "Mean of empty slice" warnings (NaN is the answer)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _order(x: np.ndarray, ok: np.ndarray, cnt: np.ndarray) -> np.ndarray:
    """Rule 3's ``u``: each rank's mid-rank among the instance's arrivals over ``count − 1``."""
    r = x.shape[1]
    if r <= MAX_PAIRWISE_RANKS:  # pairwise over columns: ties get the mid-rank
        cols = [np.ascontiguousarray(x[:, j]) for j in range(r)]
        mid = np.empty(x.shape, order="F")
        for i in range(r):
            below = np.zeros(x.shape[0])
            ties = np.zeros(x.shape[0])
            for j in range(r):
                if j != i:
                    below += cols[i] > cols[j]
                    ties += cols[i] == cols[j]
            mid[:, i] = below + ties / 2.0
    else:
        filled = np.where(ok, x, np.inf)
        mid = np.argsort(np.argsort(filled, axis=1, kind="stable"), axis=1).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(ok & (cnt[:, None] >= 2), mid / np.maximum(cnt[:, None] - 1, 1), np.nan)


def _reference(med: np.ndarray, m: np.ndarray, cnt: np.ndarray) -> np.ndarray:
    """Rule 1's reference: the instance median, or with two ranks the other rank's value."""
    return np.where(cnt[:, None] == 2, 2.0 * med[:, None] - m, med[:, None])


def _period(sn: np.ndarray, t: np.ndarray) -> float:
    """Rule 2's ``P``: first quartile of Δt / Δcoll_sn over consecutive instances."""
    ok = np.isfinite(t)
    ds, dt = np.diff(sn[ok].astype(float)), np.diff(t[ok])
    good = (ds > 0) & (dt > 0)
    return float(np.percentile(dt[good] / ds[good], 25)) if good.any() else math.nan


def arrivals(part: pl.DataFrame, window_us: float) -> Arrivals | None:
    """Rules 1–3 over one communicator's records; None when no instance has two ranks."""
    df = part if part["coll_sn"].min() >= 0 else part.filter(pl.col("coll_sn") >= 0)  # type: ignore[operator]
    if df.height == 0:
        return None
    sn_raw = df["coll_sn"].cast(pl.Int64).to_numpy()
    sn_all, inst = _dense(sn_raw)
    multi = np.bincount(inst)[inst] >= 2  # rows of single-rank instances never make a matrix row
    if not multi.any():
        return None
    if not multi.all():
        df = df.filter(pl.Series(multi))
        sn_all, inst = _dense(sn_raw[multi])
    ranks, col = _dense(df["rank"].cast(pl.Int64).to_numpy())
    shape = (sn_all.size, ranks.size)
    start, stop, ex = (_matrix(inst, col, shape, df[c]) for c in ("start_us", "stop_us", "exec_us"))
    t = _matrix(inst, col, shape, df["t_us"] if "t_us" in df.columns else df["start_us"])
    present = np.zeros(shape, dtype=bool, order="F")
    present[inst, col] = True
    keep = rsum(present) >= 2
    if not keep.any():
        return None
    sn = sn_all
    if not keep.all():
        sn = sn_all[keep]
        start, stop, ex, t, present = (np.asfortranarray(m[keep]) for m in (start, stop, ex, t, present))
    timed = rsum(present & ~np.isnan(start)) == rsum(present)
    x = np.where(timed[:, None], start, -ex)
    ok = present & ~np.isnan(x)
    x = np.where(ok, x, np.nan)
    cnt = rsum(ok)
    med = nan_median(x)
    xref = _reference(med, x, cnt)
    late = x - xref
    u = _order(x, ok, cnt)
    with np.errstate(invalid="ignore", divide="ignore"):
        var = np.where(ok & (cnt[:, None] >= 2), (cnt[:, None] + 1) / (12.0 * (cnt[:, None] - 1)), np.nan)
    slow, seg = _slowness(sn, timed, start, stop, ex, t, x, xref, late, cnt)
    first = rmin(np.where(np.isnan(start), t, start))
    window = (np.nan_to_num(first, nan=0.0) // window_us).astype(np.int64)
    xmax = rmax(x)
    per_inst = rsum(np.nan_to_num(xmax[:, None] - x))
    last = np.argmax(np.where(ok, x, -np.inf), axis=1)
    blame = np.bincount(last, weights=per_inst, minlength=ranks.size)
    blamed = {int(r): float(b) for r, b in zip(ranks, blame, strict=True)}
    return Arrivals(ranks, window, u, var, late, slow, blamed, seg)


def _slowness(
    sn: Any, timed: Any, start: Any, stop: Any, ex: Any, t: Any, x: Any, xref: Any, late: Any, cnt: Any
) -> tuple[np.ndarray, np.ndarray]:
    """Rule 2: measured segments where the previous instance is ``coll_sn − 1``, else the period;
    returns (slowness, measured segments in µs)."""
    c = np.full(start.shape, np.nan, order="F")
    prev = np.flatnonzero(np.diff(sn) == 1) + 1
    c[prev] = start[prev] - stop[prev - 1]
    c[c <= 0] = np.nan
    full = rsum(~np.isnan(c)) == cnt
    cref = _reference(nan_median(c), c, cnt)
    with np.errstate(invalid="ignore", divide="ignore"):
        measured = np.where(full[:, None] & (cref > 0), c / cref - 1.0, np.nan)
    t_inst = np.where(timed, rmax(start), rmin(t))
    period = _period(sn, t_inst)
    transfer = np.where(timed, nan_median(stop) - rmax(start), rmin(ex))
    base = period - np.nan_to_num(transfer)[:, None] - (rmax(x)[:, None] - xref)
    with np.errstate(invalid="ignore", divide="ignore"):
        estimated = np.where(base > 0, late / base, np.nan)
    return np.where(np.isfinite(measured), measured, estimated), c


def _slice_median(m: np.ndarray) -> np.ndarray:
    return nan_median(m, axis=0)


def window_table(a: Arrivals, min_instances: int) -> pl.DataFrame:
    """Rule 3's sums and rule 5's medians per (rank, window) over the evaluated windows:
    ``rank, window, k, du, var, slowness, late_us, spread``."""
    in_order = bool((np.diff(a.window) >= 0).all())  # instances by coll_sn are usually in time order
    order = np.arange(a.window.size) if in_order else np.argsort(a.window, kind="stable")
    w = a.window[order]
    late_m, slow_m, u_m, var_m = (
        m if in_order else np.asfortranarray(m[order]) for m in (a.late, a.slow, a.u, a.var)
    )
    starts = np.flatnonzero(np.r_[True, w[1:] != w[:-1]])
    sizes = np.diff(np.r_[starts, w.size])
    ok = ~np.isnan(u_m)
    k = np.add.reduceat(ok.astype(np.int64), starts, axis=0)
    du = np.add.reduceat(np.nan_to_num(u_m - 0.5), starts, axis=0)
    var = np.add.reduceat(np.nan_to_num(var_m), starts, axis=0)
    slow, late, mad = (np.full(k.shape, np.nan) for _ in range(3))
    for i, (s, n) in enumerate(zip(starts.tolist(), sizes.tolist(), strict=True)):
        if n < min_instances:
            continue
        block = late_m[s : s + n]
        slow[i] = _slice_median(slow_m[s : s + n])
        late[i] = _slice_median(block)
        mad[i] = 1.4826 * _slice_median(np.abs(block - late[i]))
    spread = nan_median(mad, axis=1)
    keep = (sizes >= min_instances)[:, None] & (k > 0)
    wi, ri = np.nonzero(keep)
    return pl.DataFrame({
        "rank": a.ranks[ri], "window": w[starts][wi], "k": k[wi, ri], "du": du[wi, ri], "var": var[wi, ri],
        "slowness": pl.Series(slow[wi, ri], nan_to_null=True),  # null: no compute segment known
        "late_us": pl.Series(late[wi, ri], nan_to_null=True).fill_null(0.0),
        "spread": pl.Series(spread[wi], nan_to_null=True).fill_null(0.0),
    }).sort(["rank", "window"])  # fmt: skip
