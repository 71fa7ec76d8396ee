"""p99 regressions: TTFT and ITL p99 against a baseline, the change point, and the axis that moved.

Input: the store connection, a deployment, a window, Thresholds, and an optional injected straggler
callable (``analyzer.stragglers``). Output: a :class:`Regression` with one row per metric and the
axes compared before/after the change point.

Rules:
 1. Baseline window (``regression_baseline``): ``day_before`` = the same window 24 h earlier;
    ``trailing_7d`` = the 7 days before the window start; ``previous_window`` = the window of the
    same length that ends where this one starts. p99s are bucket estimates merged over the
    deployment's engines (see :mod:`analyzer.latency`).
 2. A metric regressed when p99 now ÷ p99 baseline ≥ ``regression_min_ratio``.
 3. Change point: over the baseline-length span before the window plus the window, split the
    per-bin log p99 series where the two means differ most in least squares (one change point,
    each side ≥ 2 bins); its time is the start of the first bin after the split.
 4. Axes, each compared as after ÷ before around the change point (baseline vs window when none):
    load (requests running), context length (prompt tokens per request), KV pressure (KV usage),
    fabric bytes (NVLink + PCIe bytes/s), clocks (SM clock); an axis moved when it changed by at
    least ``regression_axis_min_change_ratio``. A straggler comes from the injected callable only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import duckdb
import numpy as np

from analyzer.deployments import ENGINE_KEY_SQL, Deployment
from analyzer.latency import NS, binned_quantiles, counter_increases, window_quantiles
from analyzer.thresholds import Thresholds

Straggler = Callable[[duckdb.DuckDBPyConnection, Deployment, int, int], Mapping[str, Any] | None]
METRICS = ("ttft_seconds", "itl_seconds")
DAY_NS = 86400 * NS


@dataclass
class Regression:
    deployment: str
    baseline: str
    baseline_window_ns: tuple[int, int]
    metrics: list[dict[str, Any]] = field(default_factory=list)
    axes: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def baseline_window(start_ns: int, end_ns: int, kind: str) -> tuple[int, int]:
    """Rule 1."""
    if kind == "day_before":
        return start_ns - DAY_NS, end_ns - DAY_NS
    if kind == "previous_window":
        return 2 * start_ns - end_ns, start_ns
    return start_ns - 7 * DAY_NS, start_ns


def change_point(values: np.ndarray) -> int | None:
    """Rule 3 on a series: index of the first element after the best split, or None."""
    v = np.log(values[np.isfinite(values) & (values > 0)])
    if len(v) < 4:
        return None
    costs = [
        np.sum((v[:k] - v[:k].mean()) ** 2) + np.sum((v[k:] - v[k:].mean()) ** 2)
        for k in range(2, len(v) - 1)
    ]
    return int(np.argmin(costs)) + 2


def p99_regression(
    con: duckdb.DuckDBPyConnection,
    dep: Deployment,
    start_ns: int,
    end_ns: int,
    th: Thresholds | None = None,
    *,
    straggler: Straggler | None = None,
) -> Regression:
    """Rules 1-4 for one deployment and window."""
    th = th or Thresholds()
    keys = list(dep.engine_keys)
    b0, b1 = baseline_window(start_ns, end_ns, th.regression_baseline)
    out = Regression(dep.name, th.regression_baseline, (b0, b1))
    now = window_quantiles(con, start_ns, end_ns, keys=keys, concepts=METRICS, qs=(0.99,))
    base = window_quantiles(con, b0, b1, keys=keys, concepts=METRICS, qs=(0.99,))
    for m in METRICS:
        n, b = now.get(m, {}).get(0.99), base.get(m, {}).get(0.99)
        nv, bv = (n.value_s if n else None), (b.value_s if b else None)
        ratio = nv / bv if nv is not None and bv else None
        verdict = "no data" if ratio is None else ("regressed" if ratio >= th.regression_min_ratio else "ok")
        out.metrics.append({"metric": m, "now_s": nv, "baseline_s": bv, "ratio": ratio, "verdict": verdict,
                            "threshold": th.regression_min_ratio, "estimate": "bucket_interpolated",
                            "change_point_ns": _change_time(con, keys, start_ns, end_ns, m, th)
                            if verdict == "regressed" else None})  # fmt: skip
    cp = next((r["change_point_ns"] for r in out.metrics if r["change_point_ns"]), None)
    before, after = ((cp - (end_ns - start_ns), cp), (cp, end_ns)) if cp else ((b0, b1), (start_ns, end_ns))
    out.axes = _axes(con, dep, before, after, th)
    if straggler is None:
        out.missing.append("stragglers not wired in: straggler axis not judged")
    else:
        got = straggler(con, dep, *after)
        out.axes.append({"axis": "straggler", "moved": bool(got), "detail": dict(got or {})})
    return out


def _change_time(
    con: duckdb.DuckDBPyConnection, keys: list[str], start_ns: int, end_ns: int, metric: str, th: Thresholds
) -> int | None:
    span0 = start_ns - (end_ns - start_ns)
    q = binned_quantiles(con, span0, end_ns, th.bin_s, keys=keys, concepts=[metric], qs=(0.99,)).sort("bin")
    q = q.drop_nulls("value_s")
    k = change_point(q["value_s"].to_numpy())
    return None if k is None else int(q["bin_start_ns"][k])


def _axes(
    con: duckdb.DuckDBPyConnection,
    dep: Deployment,
    before: tuple[int, int],
    after: tuple[int, int],
    th: Thresholds,
) -> list[dict[str, Any]]:
    a, b = _axis_values(con, dep, *before), _axis_values(con, dep, *after)
    rows = []
    for axis in ("load", "context_length", "kv_pressure", "fabric_bytes", "clocks"):
        x, y = a.get(axis), b.get(axis)
        change = (y / x - 1.0) if x and y is not None else None
        moved = change is not None and abs(change) >= th.regression_axis_min_change_ratio
        rows.append({"axis": axis, "before": x, "after": y, "change_ratio": change, "moved": moved,
                     "threshold": th.regression_axis_min_change_ratio})  # fmt: skip
    return rows


def _axis_values(
    con: duckdb.DuckDBPyConnection, dep: Deployment, start_ns: int, end_ns: int
) -> dict[str, float]:
    keys = list(dep.engine_keys)
    out: dict[str, float] = {}
    rows = con.execute(
        f"""SELECT concept, sum(v), avg(v) FROM (
                SELECT concept, {ENGINE_KEY_SQL} AS k, avg(value) AS v FROM engine_samples
                WHERE ts_ns > ? AND ts_ns <= ? AND list_contains(?, {ENGINE_KEY_SQL})
                  AND concept IN ('requests_running', 'kv_usage_ratio') GROUP BY ALL) GROUP BY concept""",
        [start_ns, end_ns, keys],
    ).fetchall()
    for concept, total, mean in rows:  # running adds up over engines; KV usage is a mean ratio
        out["load" if concept == "requests_running" else "kv_pressure"] = float(
            total if concept == "requests_running" else mean
        )
    inc = counter_increases(con, start_ns, end_ns, ["prompt_tokens_total", "ttft_seconds_count"], keys=keys)
    got = dict(zip(inc["concept"].to_list(), inc["increase"].to_list(), strict=True))
    if got.get("ttft_seconds_count"):
        out["context_length"] = float(got.get("prompt_tokens_total", 0.0)) / float(got["ttft_seconds_count"])
    gpu = con.execute(
        """SELECT sum(value) FILTER (WHERE metric LIKE 'nvlink_%' OR metric LIKE 'pcie_%')
                      / count(DISTINCT ts_ns),
                  avg(value) FILTER (WHERE metric = 'sm_clock_mhz')
           FROM gpu_samples WHERE ts_ns > ? AND ts_ns <= ? AND list_contains(?, uuid)""",
        [start_ns, end_ns, list(dep.gpu_uuids)],
    ).fetchone()
    if gpu and gpu[0] is not None:
        out["fabric_bytes"] = float(gpu[0])
    if gpu and gpu[1] is not None:
        out["clocks"] = float(gpu[1])
    return out
