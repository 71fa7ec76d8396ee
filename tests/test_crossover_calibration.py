"""Cp and overload judgement on real measured TTFT/TPOT vs concurrency (aiconfigurator silicon set)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from conftest import DATA

from analyzer.crossover import fit_cp, judge_load_points

KEY = ["backend", "backend_version", "system", "model_path", "tp_size", "pp_size", "isl", "osl", "precision"]


def _series() -> list[pl.DataFrame]:
    d = pl.read_csv(DATA / "silicon" / "dense_calibration.csv").filter(pl.col("mode") == "agg")
    e2e_s = (pl.col("silicon_ttft_ms") + pl.col("osl") * pl.col("silicon_tpot_ms")) / 1000
    d = d.with_columns(
        thr_per_gpu=pl.col("batch_size") * pl.col("osl") / e2e_s / (pl.col("tp_size") * pl.col("pp_size")),
        n=pl.col("batch_size").n_unique().over(KEY),
    ).filter(pl.col("n") >= 4)
    return [g for _, g in d.sort("batch_size").group_by(KEY, maintain_order=True)]


SERIES = _series()


def _elasticity(g: pl.DataFrame, lo: float, hi: float) -> float:
    """Measured log-log throughput growth between the points nearest ``lo`` and ``hi``."""
    c, t = g["batch_size"].to_numpy(), g["thr_per_gpu"].to_numpy()
    i, j = int(np.argmin(abs(np.log(c / lo)))), int(np.argmin(abs(np.log(c / hi))))
    return float(np.log(t[j] / t[i]) / np.log(c[j] / c[i])) if c[j] != c[i] else 0.0


def test_calibration_set_has_the_series_we_expect() -> None:
    assert len(SERIES) == 92
    assert sum(g.height for g in SERIES) >= 440


@pytest.mark.parametrize("g", SERIES, ids=lambda g: "-".join(str(g[k][0]) for k in KEY[::2]))
def test_cp_sits_where_throughput_per_gpu_stops_growing(g: pl.DataFrame) -> None:
    fit = fit_cp(g["batch_size"].to_list(), g["thr_per_gpu"].to_list(), g["silicon_ttft_ms"].to_list())
    c = g["batch_size"].to_numpy()
    top = float(c.max())
    if fit.reached:
        assert fit.cp is not None and fit.cp_low is not None and fit.cp_high is not None
        assert fit.cp_low <= fit.cp <= fit.cp_high and c.min() < fit.cp < top
        # past Cp, doubling concurrency buys under ~41 % more throughput per GPU; before it, more
        after = _elasticity(g, float(c[c >= fit.cp].min()), top)
        before = _elasticity(g, float(c.min()), float(c[c <= fit.cp].max()))
        assert after < 0.5 and before > after
    else:
        assert fit.cp_lower_bound == top
        assert _elasticity(g, float(c[-3]), top) >= 0.3  # still scaling over the last two steps


def test_most_series_reach_their_knee_in_the_measured_range() -> None:
    reached = [fit_cp(g["batch_size"].to_list(), g["thr_per_gpu"].to_list()).reached for g in SERIES]
    assert 0.6 <= sum(reached) / len(reached) <= 0.95


def test_exploding_ttft_points_are_queue_bound_not_compute() -> None:
    exploding = 0
    for g in SERIES:
        judged = judge_load_points(
            g["batch_size"].to_list(),
            (g["silicon_ttft_ms"] / 1000).to_list(),
            (g["silicon_tpot_ms"] / 1000).to_list(),
        )
        c, ttft = g["batch_size"].to_numpy(), g["silicon_ttft_ms"].to_numpy()
        for i in range(1, len(c)):
            if c[i] > c[i - 1] and c[i] <= 2 * c[i - 1] and ttft[i] >= 3 * ttft[i - 1]:
                exploding += 1
                point = judged[i]  # same order: both sorted by concurrency, stable
                assert point["zone"] == "kv_capacity", point
                assert point["queue_share_est"] >= 0.3
    assert exploding >= 5
