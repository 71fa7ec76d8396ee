"""Counter and histogram increases on the series layout's points equal those on the wide views.

The wide-view statement is the reference (it is what a DuckLake store and an old file run); the
points statement must give the same rows on the same data, including counter resets and a
deployment's key filter."""

from __future__ import annotations

import pytest
from api_store import END_NS, START_NS, build

import analyzer.latency as latency
from collector.records import frame
from collector.store import Store

NS = 1_000_000_000


@pytest.fixture(scope="module")
def store() -> Store:
    st = build()
    # a counter that resets (an engine restart) inside the window, on a series of its own
    rows = [
        {
            "ts_ns": START_NS + i * 10 * NS,
            "source": "restarted",
            "engine": "vllm",
            "model": "m",
            "dp_rank": 0,
            "tp_rank": 0,
            "pp_rank": 0,
            "ep_rank": 0,
            "concept": "prompt_tokens",
            "labels": "{}",
            "value": float(v),
        }
        for i, v in enumerate([100, 200, 300, 40, 90, 150])
    ]
    st.write("engine_samples", frame("engine_samples", rows))
    return st


def _same(a: object, b: object) -> bool:
    """Same rows; values equal up to float summation order (DuckDB adds in parallel, in any order)."""
    import polars as pl

    assert isinstance(a, pl.DataFrame) and isinstance(b, pl.DataFrame)
    value = a.columns[-1]
    keys = a.columns[:-1]
    if a.select(keys).to_dicts() != b.select(keys).to_dicts():
        return False
    return a[value].to_list() == pytest.approx(b[value].to_list(), rel=1e-12, abs=1e-9)


def _both(fn: object, store: Store, **kw: object) -> tuple[object, object]:
    out = []
    with store.cursor() as cur:
        assert latency._points_of(cur, "histogram_buckets", False)  # this store is in the series layout
        for wide in (True, False):
            original = latency._points_of
            if wide:
                latency._points_of = lambda *a: False  # type: ignore[assignment]
            try:
                out.append(fn(cur, **kw))  # type: ignore[operator]
            finally:
                latency._points_of = original
    return out[0], out[1]


@pytest.mark.parametrize("bin_s", [None, 60.0])
def test_bucket_increases_match(store: Store, bin_s: float | None) -> None:
    wide, points = _both(latency.bucket_increases, store, start_ns=START_NS, end_ns=END_NS, bin_s=bin_s)
    assert wide.height > 0 and _same(wide, points)  # type: ignore[attr-defined]


def test_counter_increases_match_with_a_reset_and_a_key_filter(store: Store) -> None:
    concepts = ["prompt_tokens", "ttft_seconds_count", "ttft_seconds_sum"]
    wide, points = _both(
        latency.counter_increases,
        store,
        start_ns=START_NS - 60 * NS,
        end_ns=END_NS,
        concepts=concepts,
        bin_s=30.0,
    )
    assert wide.height > 0 and _same(wide, points)  # type: ignore[attr-defined]
    only, _ = _both(
        latency.counter_increases,
        store,
        start_ns=START_NS - 60 * NS,
        end_ns=END_NS,
        concepts=["prompt_tokens"],
        keys=["restarted|vllm|0"],
    )
    # 100→200→300 then a reset to 40 (counts 40), →90, →150: 100 + 100 + 40 + 50 + 60
    assert only["increase"].to_list() == [350.0]  # type: ignore[index]


def test_deployment_listing_reads_the_series_not_the_store(store: Store) -> None:
    """Same deployments from the series tables as from a scan of the wide views, whole store or since."""
    import analyzer.deployments as deployments

    with store.cursor() as cur:
        for since in (0, END_NS - 300 * NS, END_NS + NS):
            got = deployments.list_deployments(cur, since)
            original = deployments.has_points
            deployments.has_points = lambda *a: False  # type: ignore[assignment]
            try:
                wide = deployments.list_deployments(cur, since)
            finally:
                deployments.has_points = original
            assert got == wide
    assert deployments.list_deployments(store.con, 0)  # the fixture's deployment is listed


# The statement every reader ran before the series layout (one ``lag`` partition per nine text
# columns over the wide view), kept here as the reference both current paths must reproduce.
_REFERENCE = """
    WITH s AS (
        SELECT concept, ts_ns, {le} value_col AS c,
               lag(value_col) OVER (PARTITION BY source, engine, dp_rank, tp_rank, pp_rank, ep_rank,
                                    labels, concept {le_key} ORDER BY ts_ns) AS prev
        FROM {table} WHERE ts_ns > ? AND ts_ns <= ? AND list_contains(?, concept))
    SELECT concept, CAST((ts_ns - ? - 1) // ? AS BIGINT) AS bin, {le}
           sum(CASE WHEN prev IS NULL THEN 0 WHEN c >= prev THEN c - prev ELSE c END) AS {out}
    FROM s WHERE ts_ns > ? GROUP BY ALL ORDER BY ALL"""


@pytest.mark.parametrize("bin_s", [None, 30.0])
def test_both_paths_equal_the_nine_column_reference(store: Store, bin_s: float | None) -> None:
    """Old SQL against new: the reference statement above against the points path (integer series
    ids) and the wide path (series numbered once), on counters with a reset and on histograms."""
    start, end = START_NS - 60 * NS, END_NS
    bin_ns = int(bin_s * NS) if bin_s else end - start
    cases = (
        (
            "engine_samples",
            "value",
            "increase",
            ["prompt_tokens", "ttft_seconds_count"],
            latency.counter_increases,
        ),
        (
            "histogram_buckets",
            "cumulative_count",
            "count",
            list(latency.HISTOGRAMS),
            latency.bucket_increases,
        ),
    )
    for table, col, out, concepts, fn in cases:
        le = "le," if table == "histogram_buckets" else ""
        sql = _REFERENCE.format(le=le, le_key=", le" if le else "", table=table, out=out).replace(
            "value_col", col
        )
        with store.cursor() as cur:
            ref = cur.execute(sql, [start - 120 * NS, end, concepts, start, bin_ns, start]).pl()
        kw = {"start_ns": start, "end_ns": end, "concepts": concepts, "bin_s": bin_s}
        wide, points = _both(fn, store, **kw)
        assert ref.height > 0
        assert _same(ref, points) and _same(ref, wide)  # type: ignore[arg-type]


@pytest.mark.parametrize("bin_s", [30.0, 900.0])
def test_regression_gauges_read_the_same_from_points_and_views(store: Store, bin_s: float) -> None:
    """The regression's KV, fabric and clock axes (``regression_axes._gauges``) per bin: the
    points of the chosen series against the wide views."""
    import analyzer.regression_axes as axes
    from analyzer.deployments import list_deployments

    bin_ns = int(bin_s * NS)
    n = (END_NS - START_NS) // bin_ns
    with store.cursor() as cur:
        dep = list_deployments(cur)[0]
        points = axes._gauges(cur, dep, START_NS, END_NS, bin_ns, n)
        original = axes.has_points
        axes.has_points = lambda *a: False  # type: ignore[assignment]
        try:
            wide = axes._gauges(cur, dep, START_NS, END_NS, bin_ns, n)
        finally:
            axes.has_points = original
    assert set(points) == set(wide) == {"kv_pressure", "fabric_bytes", "clocks"}
    for axis, got in points.items():
        assert got.source == wide[axis].source
        assert got.num.tolist() == pytest.approx(wide[axis].num.tolist(), rel=1e-12)
        assert got.den.tolist() == wide[axis].den.tolist()
