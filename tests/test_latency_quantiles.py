"""Bucket quantiles: Prometheus interpolation, reset-aware window increases, floor/cap flags."""

from __future__ import annotations

import math

import pytest

from analyzer.latency import bucket_increases, histogram_quantile, quantile_of, window_means, window_quantiles
from collector.records import frame
from collector.store import Store

NS = 1_000_000_000
LE = [0.1, 0.5, 1.0, math.inf]


@pytest.mark.parametrize(
    ("cum", "q", "want"),
    [
        ([2, 8, 10, 10], 0.5, 0.1 + 0.4 * 3 / 6),  # rank 5 inside (0.1, 0.5]
        ([10, 10, 10, 10], 0.99, 0.099),  # first bucket: lower bound 0
        ([0, 0, 5, 10], 0.9, 1.0),  # rank in +Inf: highest finite bound
        ([0, 0, 0, 0], 0.5, None),  # no observations
        ([2, 1, 10, 10], 0.5, 0.5 + 0.5 * 3 / 8),  # non-monotonic input repaired like Prometheus
    ],
)
def test_histogram_quantile_matches_prometheus_rules(cum: list[float], q: float, want: float | None) -> None:
    got = histogram_quantile(LE, cum, q)
    assert got == pytest.approx(want) if want is not None else got is None


def test_flags_floor_and_cap() -> None:
    floor = quantile_of("queue_seconds", [0.3, 0.5, math.inf], [100, 100, 100], 0.99)
    assert floor.value_s == pytest.approx(0.297) and floor.at_floor and floor.first_bucket_s == 0.3
    capped = quantile_of("ttft_seconds", LE, [0, 0, 5, 10], 0.99)
    assert capped.value_s == 1.0 and capped.capped and capped.estimate == "bucket_interpolated"


def _hist_rows(samples: list[tuple[int, list[float]]], source: str = "e0") -> object:
    rows = [
        {"ts_ns": t * NS, "source": source, "engine": "0", "dp_rank": -1, "concept": "itl_seconds", "le": le,
         "cumulative_count": c}
        for t, counts in samples
        for le, c in zip(LE, counts, strict=True)
    ]  # fmt: skip
    return frame("histogram_buckets", rows)


def test_window_increase_is_reset_aware_and_uses_base_before_start() -> None:
    st = Store(":memory:")
    # t=100 is the base before the window; the engine restarts between t=120 and t=130.
    st.write("histogram_buckets", _hist_rows([(100, [10, 10, 10, 10]), (110, [10, 30, 30, 30]),
                                              (120, [10, 40, 40, 40]), (130, [0, 5, 5, 5])]))  # fmt: skip
    with st.cursor() as con:
        inc = bucket_increases(con, 105 * NS, 130 * NS, concepts=["itl_seconds"], lookback_s=10)
        got = window_quantiles(con, 105 * NS, 130 * NS, concepts=["itl_seconds"], lookback_s=10)
    # increases: (30-10)+(40-30)+5 = 35 per finite bucket above 0.1; first bucket 0.
    assert inc.sort("le")["count"].to_list() == [0.0, 35.0, 35.0, 35.0]
    p50 = got["itl_seconds"][0.5]
    assert p50.observations == 35.0
    assert p50.value_s == pytest.approx(0.1 + 0.4 * 17.5 / 35)


def test_series_merge_and_exact_means() -> None:
    st = Store(":memory:")
    st.write("histogram_buckets", _hist_rows([(0, [0, 0, 0, 0]), (10, [10, 10, 10, 10])], "e0"))
    st.write("histogram_buckets", _hist_rows([(0, [0, 0, 0, 0]), (10, [0, 0, 30, 30])], "e1"))
    counters = [
        {"ts_ns": t * NS, "source": "e0", "engine": "0", "dp_rank": -1, "concept": c, "value": v}
        for t, c, v in [(0, "itl_seconds_sum", 0.0), (10, "itl_seconds_sum", 6.0),
                        (0, "itl_seconds_count", 0.0), (10, "itl_seconds_count", 40.0)]
    ]  # fmt: skip
    st.write("engine_samples", frame("engine_samples", counters))
    with st.cursor() as con:
        q = window_quantiles(con, 0, 10 * NS, concepts=["itl_seconds"], qs=(0.25, 0.5))["itl_seconds"]
        means = window_means(con, 0, 10 * NS, concepts=["itl_seconds"])
        only_e1 = window_quantiles(con, 0, 10 * NS, keys=["e1|0|-1"], concepts=["itl_seconds"])
    assert q[0.25].value_s == pytest.approx(0.1)  # 10 of 40 in the first bucket (both engines merged)
    assert q[0.5].value_s == pytest.approx(0.5 + 0.5 * 10 / 30)
    assert means["itl_seconds"] == pytest.approx(0.15)
    assert only_e1["itl_seconds"][0.5].observations == 30.0
