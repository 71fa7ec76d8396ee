"""p99 regressions: TTFT and ITL p99 against a baseline, the change point, and the axis that moved first.

Input: the store connection, a deployment, a window ``(start, end]``, Thresholds. Output: a
:class:`Regression` with one row per metric, the baseline actually used (and why, when it is not
the one asked for), and the axes compared before/after the change point, each with its change
point, and ``moved_first``.

Rules:
 1. Baseline modes (``regression_baseline``): ``day_before`` = the same window 24 h earlier;
    ``trailing_7d`` = the 7 days before the window start; ``previous_window`` = the window of the
    same length that ends where this one starts; ``reference`` = the pinned window
    ``(regression_reference_start_s, regression_reference_end_s]`` (Unix seconds).
 2. History and fallback: the deployment's history starts at its first engine sample. A
    baseline is usable when at least ``regression_baseline_min_coverage_ratio`` of its window lies
    at or after that start (a store younger than a day has no "day before"). Otherwise the next
    mode of :data:`FALLBACK` is tried: ``reference`` and ``trailing_7d`` → ``day_before`` →
    ``previous_window``. ``baseline_mode_used`` names the mode whose window was compared with and
    ``fallback_reason`` says which mode was asked for and why it could not serve; when no mode is
    usable the last one tried is reported, its metrics read "no data", and the reason says so.
    The history start is read only as far as this choice needs it (:func:`baseline_for`): a
    sample in the hour before the latest start that lets the asked mode serve settles it. Where
    the first sample itself is needed (:func:`history_start`), the store's first minute is read
    first: a sample of the deployment there, the earliest of them is its first (no sample of the
    store is older).
 3. p99s are bucket estimates merged over the deployment's engines (:mod:`analyzer.latency`). A
    metric regressed when p99 now ÷ p99 baseline ≥ ``regression_min_ratio``.
 4. Change point of a series: split it where the two sides' means differ most in least squares
    (one change point, each side ≥ 2 bins; on log values when the series is positive). The
    latency's is taken over the ``bin_s`` bins of the window-length span before the window plus
    the window (the first regressed metric's, TTFT before ITL); its time is the start of the
    first bin after the split.
 5. Axes (:mod:`analyzer.regression_axes`): load = arrival rate (spans, else request counters;
    never running requests, which rise *because* latency rose), context length = prompt tokens
    per request, KV pressure, fabric bytes, SM clocks, and straggler share. Each is compared as
    ``after ÷ before − 1``: with a latency change point, ``before`` = up to one window length
    before it within the span of rule 4 and ``after`` = from it to the window end; without one,
    the baseline window against the window. An axis moved when ``|change|`` ≥
    ``regression_axis_min_change_ratio``. The gauge axes (KV, fabric, clocks: sums and counts of
    samples) take a side that lies on whole bins of the span and reads the same rows as the span
    (raw points both, or both the per-minute rollups: latency rule 6) from those bins, the span
    being read once rather than once more per side (the window itself, and at 6 h and 24 h the day
    before, which is the span's first half).
 6. Each moved axis gets its own change point (rule 4 on its per-bin series over the span of
    rule 4) and ``lead_s`` = latency change point − axis change point (positive: the axis moved
    earlier).
 7. Moved first: among the moved axes whose change point is no later than the latency change
    point plus one bin (the same bin counts: inside a bin nothing can be ordered), the one with
    the earliest change point; equal change points go to the larger ``|change|``. Axes that
    moved later are consequences, not causes. Without a latency change point ``moved_first`` is
    None and the moved axes are only listed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import duckdb
import numpy as np

from analyzer.deployments import IN_TEXTS, Deployment, texts
from analyzer.latency import HISTOGRAMS, NS, binned_quantiles, reads_points, rollup_for, window_quantiles
from analyzer.regression_axes import AXES, GAUGE_AXES, UNITS, Parts, Sources, axis_parts, choose_sources
from analyzer.thresholds import Thresholds
from collector.series import recent_name, times_name

METRICS = ("ttft_seconds", "itl_seconds")
DAY_NS = 86400 * NS
FALLBACK = {"reference": "day_before", "trailing_7d": "day_before", "day_before": "previous_window"}


@dataclass
class Regression:
    deployment: str
    baseline: str  # the mode asked for (rule 1)
    baseline_window_ns: tuple[int, int]
    baseline_mode_used: str = ""
    fallback_reason: str | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    axes: list[dict[str, Any]] = field(default_factory=list)
    moved_first: str | None = None
    change_point_ns: int | None = None
    missing: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def baseline_window(start_ns: int, end_ns: int, kind: str, th: Thresholds | None = None) -> tuple[int, int]:
    """Rule 1."""
    if kind == "day_before":
        return start_ns - DAY_NS, end_ns - DAY_NS
    if kind == "previous_window":
        return 2 * start_ns - end_ns, start_ns
    if kind == "reference":
        if th is None or th.regression_reference_start_s is None or th.regression_reference_end_s is None:
            raise ValueError("regression_baseline 'reference' needs regression_reference_start_s and _end_s")
        return int(th.regression_reference_start_s * NS), int(th.regression_reference_end_s * NS)
    return start_ns - 7 * DAY_NS, start_ns


def history_start(con: duckdb.DuckDBPyConnection, dep: Deployment) -> int | None:
    """The first engine sample time of the deployment's sources (rule 2), or None when none.

    In the series layout the store's first minute is probed first (the earliest time of its
    recent points and of its packed points' timestamps, then the deployment's samples in the
    minute from it): a sample there is the first, as the store holds none older. 512 GPUs' hour:
    the probe 9-11 ms, the scan of every point 37-51 ms (medians of 9, load 1). Without one (the
    deployment started later than the store) every point is read."""
    sources = sorted({k.split("|", 1)[0] for k in dep.engine_keys})
    where = f"source {IN_TEXTS}"  # by source, not by the composed key: one plain column filter
    sql = f"SELECT min(ts_ns) FROM engine_samples WHERE {where}"
    if reads_points(con, "engine_samples"):  # the series' points alone, not every point joined to its series
        row = con.execute(
            f"SELECT least((SELECT min(ts_ns) FROM {recent_name('engine_samples')}),"
            f" (SELECT min(ts_ns) FROM {times_name('engine_samples')}))"
        ).fetchone()
        if row and row[0] is not None:
            first = _sample_in(con, dep, int(row[0]) - 1, int(row[0]) + FIRST_PROBE_NS, earliest=True)
            if first is not None:
                return first
        sql = (  # each series' first point, then the sources' series: a hash per point was 2-3x the cost
            f"WITH s AS (SELECT series_id FROM engine_samples_series WHERE {where}) "
            "SELECT min(t) FROM (SELECT series_id, min(ts_ns) AS t FROM engine_samples_points"
            " GROUP BY series_id) JOIN s USING (series_id)"
        )
    row = con.execute(sql, [texts(sources)]).fetchone()
    return int(row[0]) if row and row[0] is not None else None


PROBE_NS = 3600 * NS  # rule 2's probe: the hour before the latest history start that serves
FIRST_PROBE_NS = 60 * NS  # history_start's probe: the store's first minute


def baseline_for(
    con: duckdb.DuckDBPyConnection, dep: Deployment, start_ns: int, end_ns: int, th: Thresholds
) -> tuple[str, tuple[int, int], str | None]:
    """Rule 2 for ``dep``: :func:`pick_baseline` on its history start, read only as far as the
    choice needs it.

    The asked mode's baseline serves when the history starts no later than ``cutoff`` (its
    window's end less the share it must cover). A sample of the deployment in the hour up to
    ``cutoff`` settles that: the history starts at or before that sample, and an earlier start
    covers at least as much, so the same mode, window and (no) reason come out as from the
    first sample itself. Only without such a sample is the first sample read (a scan of every
    raw engine point: 40-90 ms on two days of two engines, against 3-8 ms for the probe's hour)."""
    b0, b1 = baseline_window(start_ns, end_ns, th.regression_baseline, th)
    cutoff = b1 - math.ceil(th.regression_baseline_min_coverage_ratio * max(b1 - b0, 1))
    seen = _sample_in(con, dep, cutoff - PROBE_NS, cutoff)
    if seen is not None:
        got = pick_baseline(seen, start_ns, end_ns, th)
        if got[0] == th.regression_baseline and got[2] is None:
            return got
    return pick_baseline(history_start(con, dep), start_ns, end_ns, th)


def _sample_in(
    con: duckdb.DuckDBPyConnection, dep: Deployment, lo: int, hi: int, *, earliest: bool = False
) -> int | None:
    """The latest (``earliest``: the earliest) engine sample time of ``dep``'s sources in ``(lo,
    hi]``, or None (rule 2's probes; the bounds as SQL literals)."""
    sources = sorted({k.split("|", 1)[0] for k in dep.engine_keys})
    where, span = f"source {IN_TEXTS}", f"ts_ns > {int(lo)} AND ts_ns <= {int(hi)}"
    agg = "min" if earliest else "max"
    sql = f"SELECT {agg}(ts_ns) FROM engine_samples WHERE {span} AND {where}"
    if reads_points(con, "engine_samples"):
        sql = (
            f"SELECT {agg}(ts_ns) FROM engine_samples_points WHERE {span} "
            f"AND series_id IN (SELECT series_id FROM engine_samples_series WHERE {where})"
        )
    row = con.execute(sql, [texts(sources)]).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def pick_baseline(
    first_ns: int | None, start_ns: int, end_ns: int, th: Thresholds
) -> tuple[str, tuple[int, int], str | None]:
    """Rule 2: ``(mode used, its window, fallback reason or None)``."""
    mode = th.regression_baseline
    reasons: list[str] = []
    while True:
        b0, b1 = baseline_window(start_ns, end_ns, mode, th)
        covered = 0.0 if first_ns is None else (b1 - max(b0, first_ns)) / max(b1 - b0, 1)
        if covered >= th.regression_baseline_min_coverage_ratio:
            return mode, (b0, b1), "; ".join(reasons) or None
        reasons.append(
            f"{mode} baseline {_span_text(b0, b1)} has {max(covered, 0.0):.0%} of its span in the "
            f"deployment's history (needs {th.regression_baseline_min_coverage_ratio:.0%})"
        )
        if mode not in FALLBACK:
            return mode, (b0, b1), "; ".join(reasons) + ": no baseline with enough history"
        mode = FALLBACK[mode]


def _span_text(b0: int, b1: int) -> str:
    return f"({b0 / NS:.0f}, {b1 / NS:.0f}] s"


def change_point(values: np.ndarray, log: bool = True) -> int | None:
    """Rule 4 on a series without gaps: index of the first element after the best split, or None."""
    v = np.log(values) if log else np.asarray(values, dtype=float)
    if len(v) < 4:
        return None
    costs = [
        np.sum((v[:k] - v[:k].mean()) ** 2) + np.sum((v[k:] - v[k:].mean()) ** 2)
        for k in range(2, len(v) - 1)
    ]
    return int(np.argmin(costs)) + 2


def series_change_time(starts: np.ndarray, values: np.ndarray) -> int | None:
    """Rule 4 on a binned series with gaps (NaN): the start time of the first bin after the split."""
    ok = np.isfinite(values)
    v, t = values[ok], starts[ok]
    k = change_point(v, log=bool(len(v)) and bool(np.all(v > 0)))
    return None if k is None else int(t[k])


def p99_regression(
    con: duckdb.DuckDBPyConnection,
    dep: Deployment,
    start_ns: int,
    end_ns: int,
    th: Thresholds | None = None,
) -> Regression:
    """Rules 1-7 for one deployment and window."""
    th = th or Thresholds()
    keys = list(dep.engine_keys)
    mode, (b0, b1), reason = baseline_for(con, dep, start_ns, end_ns, th)
    out = Regression(dep.name, th.regression_baseline, (b0, b1), mode, reason)
    # every histogram, as the envelope reads this window: inside one report it is read once (latency rule 8)
    now = window_quantiles(con, start_ns, end_ns, keys=keys, concepts=HISTOGRAMS, qs=(0.99,))
    base = window_quantiles(con, b0, b1, keys=keys, concepts=METRICS, qs=(0.99,))
    span0 = start_ns - (end_ns - start_ns)
    for m in METRICS:
        n, b = now.get(m, {}).get(0.99), base.get(m, {}).get(0.99)
        nv, bv = (n.value_s if n else None), (b.value_s if b else None)
        ratio = nv / bv if nv is not None and bv else None
        verdict = "no data" if ratio is None else ("regressed" if ratio >= th.regression_min_ratio else "ok")
        out.metrics.append({"metric": m, "now_s": nv, "baseline_s": bv, "ratio": ratio, "verdict": verdict,
                            "threshold": th.regression_min_ratio, "estimate": "bucket_interpolated",
                            "baseline_mode": mode,
                            "change_point_ns": _latency_change(con, keys, span0, end_ns, m, th)
                            if verdict == "regressed" else None})  # fmt: skip
    cp = next((r["change_point_ns"] for r in out.metrics if r["change_point_ns"]), None)
    out.change_point_ns = cp
    out.axes = _axes(con, dep, (span0, start_ns, end_ns), (b0, b1), cp, th)
    out.moved_first = moved_first(out.axes, cp, th.bin_s)
    return out


def _latency_change(
    con: duckdb.DuckDBPyConnection, keys: list[str], span0: int, end_ns: int, metric: str, th: Thresholds
) -> int | None:
    q = binned_quantiles(con, span0, end_ns, th.bin_s, keys=keys, concepts=[metric], qs=(0.99,)).sort("bin")
    q = q.drop_nulls("value_s")
    if q.height == 0:
        return None
    return series_change_time(q["bin_start_ns"].to_numpy(), q["value_s"].to_numpy())


def _axes(
    con: duckdb.DuckDBPyConnection,
    dep: Deployment,
    span: tuple[int, int, int],
    baseline: tuple[int, int],
    cp: int | None,
    th: Thresholds,
) -> list[dict[str, Any]]:
    """Rules 5-6: one row per axis."""
    span0, start_ns, end_ns = span
    window = end_ns - start_ns
    before, after = ((max(cp - window, span0), cp), (cp, end_ns)) if cp else (baseline, (start_ns, end_ns))
    bin_ns = max(int(th.bin_s * NS), 1)
    src = choose_sources(con, dep, (before, after), (start_ns, end_ns), span=(span0, end_ns, th.bin_s))
    grid = axis_parts(con, dep, span0, end_ns, th.bin_s, src)
    if cp:  # rule 5: both sides are whole bins of the span's grid
        k0, k1 = (before[0] - span0) // bin_ns, (cp - span0) // bin_ns
        sides = {a: (p.value(k0, k1), p.value(k1, len(p.num))) for a, p in grid.items()}
    else:
        got = [_side(con, dep, side, (span0, end_ns), grid, src, th.bin_s) for side in (before, after)]
        sides = {k: (got[0].get(k), got[1].get(k)) for k in AXES}
    starts = span0 + np.arange(max((len(p.num) for p in grid.values()), default=0)) * bin_ns
    return [_axis_row(axis, sides.get(axis, (None, None)), grid.get(axis), starts, cp, th) for axis in AXES]


def _side(
    con: duckdb.DuckDBPyConnection,
    dep: Deployment,
    side: tuple[int, int],
    span: tuple[int, int],
    grid: dict[str, Parts],
    src: Sources,
    bin_s: float,
) -> dict[str, float | None]:
    """Rule 5 without a change point: each axis's value over ``side``. The gauge axes' sums and
    counts add up over the span's bins, so where the side lies on whole bins of the span and reads
    the same rows as the span (raw points both, or both the rollups' minutes: latency rule 6) they
    come from the span's bins; the rest is read over the side alone."""
    (lo, hi), (s0, s1) = side, span
    bin_ns = max(int(bin_s * NS), 1)
    fits = s0 <= lo < hi <= s1 and (lo - s0) % bin_ns == 0 and (hi - s0) % bin_ns == 0
    fits = fits and rollup_for(con, lo, hi, (hi - lo) / NS) == rollup_for(con, s0, s1, bin_s)
    alone = axis_parts(con, dep, lo, hi, (hi - lo) / NS, src, gauges=not fits)
    out = {k: p.value(0, 1) for k, p in alone.items()}
    if fits:
        k0, k1 = (lo - s0) // bin_ns, (hi - s0) // bin_ns
        out.update({k: grid[k].value(k0, k1) for k in GAUGE_AXES if k in grid})
    return out


def _axis_row(
    axis: str,
    sides: tuple[float | None, float | None],
    parts: Parts | None,
    starts: np.ndarray,
    cp: int | None,
    th: Thresholds,
) -> dict[str, Any]:
    x, y = sides
    change = (y / x - 1.0) if x and y is not None else None
    moved = change is not None and abs(change) >= th.regression_axis_min_change_ratio
    at = series_change_time(starts[: len(parts.num)], parts.per_bin()) if moved and parts else None
    return {"axis": axis, "unit": UNITS[axis], "source": parts.source if parts else None, "before": x,
            "after": y, "change_ratio": change, "moved": moved,
            "threshold": th.regression_axis_min_change_ratio, "change_point_ns": at,
            "lead_s": (cp - at) / NS if cp and at is not None else None}  # fmt: skip


def moved_first(axes: list[dict[str, Any]], cp: int | None, bin_s: float) -> str | None:
    """Rule 7."""
    if cp is None:
        return None
    limit = cp + int(bin_s * NS)
    lead = [
        a for a in axes if a["moved"] and a["change_point_ns"] is not None and a["change_point_ns"] <= limit
    ]
    if not lead:
        return None
    return str(min(lead, key=lambda a: (a["change_point_ns"], -abs(a["change_ratio"])))["axis"])
