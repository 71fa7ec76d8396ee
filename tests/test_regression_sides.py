"""Regression rule 5: the gauge axes' sides taken from the span's bins equal each side read alone,
whether the span and the sides read raw points or the per-minute rollups (latency rule 6).

Hand-built telemetry: ``build`` of test_regression_axes (one engine scraped every 5 s: KV usage
0.4, then 0.7 in the last phase) for 5 hours, plus two GPUs on the deployment's node with an SM
clock, NVLink bytes/s, SM and DRAM activity that change every sample (so a side's mean depends on
exactly which samples it holds), rolled up by the store's maintenance. Windows: 2 h (span 4 h and
sides of 2 h: all read the rollups), 15 min (all raw), and 1 h (span 2 h on the rollups, sides of
1 h raw: read alone)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_regression_axes import SOURCE, T0, Phase, build

from analyzer.deployments import list_deployments
from analyzer.latency import rollup_for, shared_reads
from analyzer.regression import p99_regression
from analyzer.regression_axes import GAUGE_AXES, _span_counts, _span_rows, axis_parts, choose_sources
from analyzer.thresholds import Thresholds
from collector.records import frame
from collector.store import Store

NS = 1_000_000_000
HOURS = 5
END = T0 + HOURS * 3600 * NS


def _gpu_rows() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for k in range(1, HOURS * 720 + 1):
        t = T0 + k * 5 * NS
        for g in (0, 1):
            ident = {"ts_ns": t, "host": "node-a", "gpu": g, "uuid": f"GPU-{g}", "link": -1}
            rows.append({**ident, "metric": "sm_clock_mhz", "value": 1400.0 + (k * 7 + g * 13) % 390})
            rows.append({**ident, "metric": "nvlink_tx_bytes_per_s", "value": 1e9 * (1 + (k * 3 + g) % 11)})
            rows.append({**ident, "metric": "sm_active_ratio", "value": 0.3 + ((k + g) % 7) / 10})
            rows.append({**ident, "metric": "dram_active_ratio", "value": 0.2 + ((k * 5 + g) % 9) / 20})
    return rows


def _tokens() -> list[dict[str, object]]:
    """The engine's generated tokens: +50 every 5 s, the engine restarting (count from 0) at 2.5 h."""
    ident = {
        "source": SOURCE,
        "engine": "0",
        "model": "llama8b",
        "dp_rank": -1,
        "concept": "generation_tokens_total",
    }
    return [
        {
            **ident,
            "ts_ns": T0 + k * 5 * NS,
            "value": 50.0 * (k if k <= 1800 else k - 1800),
            "rate_per_s": 10.0,
        }
        for k in range(1, HOURS * 720 + 1)
    ]


def five_hours() -> Store:
    """The store described above (with the engine's generated tokens), rolled up."""
    st = build([Phase(3 * 3600), Phase(HOURS * 3600 - 3 * 3600, kv=0.7)])
    st.write("gpu_samples", frame("gpu_samples", _gpu_rows()))
    st.write("engine_samples", frame("engine_samples", _tokens()))
    st.maintain(now_ns=END + 60 * NS)
    return st


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    st = five_hours()
    yield st
    st.close()


@pytest.mark.parametrize(("window_s", "rollups"), [(7200, True), (900, False), (3600, None)])
def test_the_gauge_sides_equal_each_side_read_alone(
    store: Store, window_s: int, rollups: bool | None
) -> None:
    th = Thresholds(bin_s=60.0, regression_baseline="previous_window")
    start = END - window_s * NS
    before, after = (start - window_s * NS, start), (start, END)
    with store.cursor() as cur:
        dep = list_deployments(cur)[0]
        with shared_reads():
            span_rollup = rollup_for(cur, start - window_s * NS, END, th.bin_s)
            side_rollup = rollup_for(cur, *after, window_s)
            got = p99_regression(cur, dep, start, END, th)
        src = choose_sources(cur, dep, (before, after), (start, END))
        alone = [axis_parts(cur, dep, lo, hi, (hi - lo) / NS, src) for lo, hi in (before, after)]
    assert got.change_point_ns is None and got.baseline_mode_used == "previous_window"
    if rollups is None:  # the span on the rollups, the sides on raw points: each side read alone
        assert span_rollup and not side_rollup
    else:
        assert span_rollup == side_rollup == rollups
    rows = {a["axis"]: a for a in got.axes}
    assert all(k in alone[0] and k in alone[1] for k in GAUGE_AXES)  # KV usage, NVLink bytes, SM clocks
    for k in GAUGE_AXES:
        assert rows[k]["before"] == pytest.approx(alone[0][k].value(0, 1), rel=1e-12), k
        assert rows[k]["after"] == pytest.approx(alone[1][k].value(0, 1), rel=1e-12), k


def test_the_sides_span_counts_equal_each_side_read_alone() -> None:
    """Rule 5's source choice counts each side's request spans in one read: the same counts as
    the spans of each side read alone (``_span_rows``, summed over its bins), overlapping sides
    included. Hand-built spans: one vLLM request span per arrival, 10 requests/s for 20 min."""
    st = build([Phase(600), Phase(600, lam=20.0, isl=3000.0)], spans=True)
    sides = ((T0, T0 + 600 * NS), (T0 + 300 * NS, T0 + 1200 * NS), (T0 - 60 * NS, T0 + 1 * NS))
    with st.cursor() as cur:
        dep = list_deployments(cur)[0]
        got = _span_counts(cur, dep, sides)
        alone = []
        for lo, hi in sides:
            rows = _span_rows(cur, dep, lo, hi, 60 * NS)
            alone.append((sum(r[1] for r in rows), sum(r[3] for r in rows)))
    assert got == alone and got[0][0] > 0 and got[1][0] > got[0][0]
