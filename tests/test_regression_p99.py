"""p99 regression vs the same window a day earlier: ratio, change point, and the axis that moved."""

from __future__ import annotations

from dataclasses import replace

import pytest
from gen_telemetry import NS, PROFILES, T0_NS, Layout, Profile, generate

from analyzer.deployments import list_deployments
from analyzer.regression import change_point, p99_regression
from analyzer.thresholds import Thresholds
from collector.store import Store

DAY = 86400 * NS


def test_change_point_finds_the_step() -> None:
    import numpy as np

    assert change_point(np.array([1.0, 1.1, 0.9, 1.0, 3.0, 3.1, 2.9])) == 4
    assert change_point(np.array([1.0, 2.0])) is None


def test_itl_regression_found_with_time_and_load_axis() -> None:
    base = PROFILES["hbm_bandwidth"]
    worse = replace(base, itl_p50_s=(0.05, 0.06), running_lo=64, running_hi=72)
    st = Store(":memory:")
    generate(st, base, Layout(start_ns=T0_NS))  # yesterday
    generate(st, base, Layout(start_ns=T0_NS + DAY - 900 * NS))  # today, before the change
    generate(st, worse, Layout(start_ns=T0_NS + DAY))  # today, after: counters restart (a reset)
    start, end = T0_NS + DAY, T0_NS + DAY + 900 * NS
    with st.cursor() as con:
        dep = list_deployments(con)[0]
        reg = p99_regression(con, dep, start, end, Thresholds())
    itl = next(m for m in reg.metrics if m["metric"] == "itl_seconds")
    assert itl["verdict"] == "regressed" and itl["ratio"] >= 1.8
    assert itl["baseline_s"] == pytest.approx(0.06, rel=0.35)
    assert abs(itl["change_point_ns"] - start) <= 60 * NS
    axes = {a["axis"]: a for a in reg.axes}
    # load is the arrival rate: the generator's requests/s = tokens/s ÷ 200, tokens/s =
    # tok_per_req_s × running_lo × (running/running_lo)^elasticity, averaged over each side's ramp
    assert axes["load"]["moved"] and axes["load"]["source"] == "ttft_seconds_count"
    assert axes["load"]["change_ratio"] == pytest.approx(_rate(worse) / _rate(base) - 1, rel=0.02)
    assert not axes["clocks"]["moved"] and not axes["context_length"]["moved"]
    assert next(m for m in reg.metrics if m["metric"] == "ttft_seconds")["verdict"] == "ok"
    assert (
        reg.moved_first == "load" and reg.baseline_mode_used == "day_before" and reg.fallback_reason is None
    )


def _rate(p: Profile) -> float:
    """Mean requests/s of one engine over a profile's ramp (as tests/gen_telemetry.py writes them)."""
    import numpy as np

    running = np.linspace(p.running_lo, p.running_hi, 180)
    return float(np.mean(p.tok_per_req_s * p.running_lo * (running / p.running_lo) ** p.tok_elasticity / 200))
