"""One report, read the fast way and the reference way, gives the same answers.

The fast way is what ``deployment_report`` runs on a store file: stored increases summed in one
pass over window and look-back (latency rule 9), every histogram of a window read once and
regrouped (rule 10), window means of gauges summed per series before the deployment's series are
picked, the regression's gauge axes on both sides taken from the span's bins. The reference is
the same report through the wide views (``lag()`` over each series' description, each gauge
read per window: what a DuckLake store runs), and, for the regression's sides, ``axis_parts``
over each side alone (the statement the report ran before).

Input: the API tests' store (``api_store``: hand-built telemetry of one TP4 × DP2 deployment in
the KV-capacity zone, a throttled straggler, request spans), its default 15-minute window, and
the same window 90 s earlier (so the counters' look-back and the previous window do not start
on a scrape)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from api_store import END_NS, START_NS, build

import analyzer.crossover as crossover
import analyzer.envelope as envelope
import analyzer.latency as latency
import analyzer.regression_axes as axes
from analyzer.deployments import list_deployments
from analyzer.regression_axes import GAUGE_AXES, axis_parts, choose_sources
from analyzer.report import deployment_report
from analyzer.thresholds import Thresholds
from collector.store import Store

NS = 1_000_000_000


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    st = build()
    yield st
    st.close()


@contextmanager
def _wide() -> Iterator[None]:
    """Every raw read through the wide views (the points tables unused)."""
    points, has = latency._points_of, axes.has_points
    latency._points_of = lambda *a: False  # type: ignore[assignment]
    axes.has_points = lambda *a: False  # type: ignore[assignment]
    try:
        yield
    finally:
        latency._points_of, axes.has_points = points, has


def _approx(b: Any) -> Any:
    """``b`` compared up to float summation order (DuckDB adds in parallel, in any order)."""
    return pytest.approx(b, rel=1e-9, abs=1e-12, nan_ok=True) if isinstance(b, float) else b


@pytest.mark.parametrize("shift_s", [0, 90])
def test_the_report_equals_the_wide_views_report(store: Store, shift_s: int) -> None:
    start, end = START_NS - shift_s * NS, END_NS - shift_s * NS
    with store.cursor() as cur:
        assert latency._stored_increases(cur, "histogram_buckets")  # the fast path is the one tested
        dep = list_deployments(cur)[0]
        fast = deployment_report(cur, dep, start, end, Thresholds())
        with _wide():
            ref = deployment_report(cur, dep, start, end, Thresholds())
    f, r = fast["envelope"], ref["envelope"]
    assert f["primary"] == r["primary"] == "kv_capacity"
    for key in ("secondary", "label", "ambiguous", "missing", "confidence", "scores"):
        assert f[key] == r[key], key
    assert [(e["signal"], e["verdict"]) for e in f["evidence"]] == [
        (e["signal"], e["verdict"]) for e in r["evidence"]
    ]
    for e, g in zip(f["evidence"], r["evidence"], strict=True):
        assert e["value"] == _approx(g["value"]), e["signal"]
    assert fast["headroom"] == ref["headroom"]
    fr, rr = fast["regression"], ref["regression"]
    assert (fr["baseline_mode_used"], fr["moved_first"], fr["change_point_ns"]) == (
        rr["baseline_mode_used"], rr["moved_first"], rr["change_point_ns"],
    )  # fmt: skip
    for m, n in zip(fr["metrics"], rr["metrics"], strict=True):
        assert m["verdict"] == n["verdict"] and m["now_s"] is not None
        assert (m["now_s"], m["baseline_s"]) == (_approx(n["now_s"]), _approx(n["baseline_s"]))
    for a, b in zip(fr["axes"], rr["axes"], strict=True):
        assert (a["axis"], a["moved"], a["source"]) == (b["axis"], b["moved"], b["source"])
        for side in ("before", "after", "change_ratio"):
            assert a[side] == _approx(b[side]), (a["axis"], side)


def test_the_regression_sides_of_the_gauges_equal_each_side_read_alone(store: Store) -> None:
    """Without a latency change point the sides are the previous window and the window: the
    span's bins summed over each equal ``axis_parts`` over that side alone."""
    th = Thresholds()
    with store.cursor() as cur:
        dep = list_deployments(cur)[0]
        got = deployment_report(cur, dep, START_NS, END_NS, th)["regression"]
        assert got["change_point_ns"] is None and got["baseline_mode_used"] == "previous_window"
        before, after = (2 * START_NS - END_NS, START_NS), (START_NS, END_NS)
        src = choose_sources(cur, dep, (before, after), (START_NS, END_NS))
        alone = [axis_parts(cur, dep, lo, hi, (hi - lo) / NS, src) for lo, hi in (before, after)]
    rows = {a["axis"]: a for a in got["axes"]}
    judged = [k for k in GAUGE_AXES if k in alone[1]]
    assert judged == list(GAUGE_AXES)  # the store has KV usage, NVLink bytes and SM clocks
    for k in judged:
        assert rows[k]["after"] == pytest.approx(alone[1][k].value(0, 1), rel=1e-12)
        want = alone[0][k].value(0, 1) if k in alone[0] else None
        assert rows[k]["before"] == (want if want is None else pytest.approx(want, rel=1e-12))


@pytest.mark.parametrize("shift_s", [0, 90])
def test_the_gpu_means_from_the_load_bins_equal_their_own_read(store: Store, shift_s: int) -> None:
    """Inside one report the envelope's GPU means of the window, from the window's start or any
    later bin boundary (a ramp's judged start), come from the load bins' per-series GPU sums
    (crossover._series_bins): they equal the means read alone and through the wide views, and
    the load bins' SM/DRAM columns equal the wide views' per-bin means."""
    th = Thresholds()
    start, end = START_NS - shift_s * NS, END_NS - shift_s * NS
    bin_ns = int(th.bin_s * NS)
    with store.cursor() as cur:
        dep = list_deployments(cur)[0]
        alone = {k: envelope._gpu_means(cur, dep, start + k * bin_ns, end) for k in (0, 1, 5)}
        with _wide():
            wide = {k: envelope._gpu_means(cur, dep, start + k * bin_ns, end) for k in (0, 1, 5)}
            wide_bins = crossover._gpu_bins(cur, dep, start, end, bin_ns, False)
        with latency.shared_reads():
            bins = crossover._gpu_bins(cur, dep, start, end, bin_ns, False)
            assert crossover.gpu_window_sums(cur, dep, start + bin_ns, end) is not None  # kept
            assert crossover.gpu_window_sums(cur, dep, start + bin_ns // 2, end) is None  # no boundary
            kept = {k: envelope._gpu_means(cur, dep, start + k * bin_ns, end) for k in (0, 1, 5)}
    for k in (0, 1, 5):
        assert alone[k] and set(kept[k]) == set(alone[k]) == set(wide[k]), k
        for m in alone[k]:
            assert kept[k][m] == _approx(alone[k][m]), (k, m)
            assert alone[k][m] == _approx(wide[k][m]), (k, m)
    assert bins.sort("bin")["bin"].to_list() == wide_bins.sort("bin")["bin"].to_list()
    for col in ("sm", "dram"):
        for a, b in zip(bins.sort("bin")[col].to_list(), wide_bins.sort("bin")[col].to_list(), strict=True):
            assert a == _approx(b), col


@pytest.mark.parametrize("shift_s", [0, 90])
def test_the_engine_window_from_the_load_bins_equals_its_own_read(store: Store, shift_s: int) -> None:
    """The same for the engines' gauges: the envelope's window means of requests running/waiting
    and KV usage from the load bins' per-series sums equal them read alone and through the wide
    views, and the load bins' running/KV columns equal the wide views' per-bin values."""
    th = Thresholds()
    start, end = START_NS - shift_s * NS, END_NS - shift_s * NS
    bin_ns = int(th.bin_s * NS)
    with store.cursor() as cur:
        dep = list_deployments(cur)[0]
        keys = list(dep.engine_keys)
        alone = {k: envelope._engine_window(cur, keys, start + k * bin_ns, end, th) for k in (0, 1, 5)}
        with _wide():
            wide = {k: envelope._engine_window(cur, keys, start + k * bin_ns, end, th) for k in (0, 1, 5)}
            wide_bins = crossover._running_bins(cur, keys, start, end, bin_ns, False)
        with latency.shared_reads():
            bins = crossover._running_bins(cur, keys, start, end, bin_ns, False)
            assert crossover.engine_window_sums(cur, keys, start + 5 * bin_ns, end) is not None  # kept
            kept = {k: envelope._engine_window(cur, keys, start + k * bin_ns, end, th) for k in (0, 1, 5)}
    for k in (0, 1, 5):
        assert "requests_running" in alone[k] and set(kept[k]) == set(alone[k]) == set(wide[k]), k
        for m in alone[k]:
            assert kept[k][m] == _approx(alone[k][m]), (k, m)
            assert alone[k][m] == _approx(wide[k][m]), (k, m)
    got, want = bins.sort("bin"), wide_bins.sort("bin")
    assert got["bin"].to_list() == want["bin"].to_list()
    for col in ("running", "kv"):
        for a, b in zip(got[col].to_list(), want[col].to_list(), strict=True):
            assert a == _approx(b), col


def test_the_kept_gpu_sums_hold_every_metric_the_envelope_means() -> None:
    """The load bins keep only the GPU metrics a report reads from them (crossover.GPU_KEPT): the
    envelope's window means take theirs from the kept sums, so each of its metrics must be kept."""
    assert set(envelope.GPU_METRICS) <= set(crossover.GPU_KEPT)
    assert {"sm_active_ratio", "dram_active_ratio"} <= set(crossover.GPU_KEPT)  # the load bins' own
