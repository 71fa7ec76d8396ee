"""Inside one report the window's gauge bins (running requests, KV usage, SM and DRAM activity per
bin) are the last bins of Cp's history read first, where both read the same rows (crossover
``_gauge_bins``): the same frames as the window read alone, because a bin's means depend on the
samples inside it only.

Hand-built telemetry: ``five_hours`` of test_regression_sides (one engine every 5 s, two GPUs whose
SM and DRAM activity change every sample, rolled up). The history is the last 4 h; windows: the last
2 h (its bins are the history's last 120), 2 h ending 30 min before the end (bins inside), 2 h
starting 30 s off the history's bin edges (read alone), and 15 min (raw rows: read alone). And the
per-bin quantiles (``binned_quantiles``, built as columns) equal each bin's ``Quantile``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from polars.testing import assert_frame_equal
from test_regression_sides import END, five_hours

from analyzer.crossover import load_bins
from analyzer.deployments import list_deployments
from analyzer.latency import (
    binned_quantiles,
    bucket_increases,
    quantiles_from_increases,
    rollup_for,
    shared_reads,
    table_sql,
)
from analyzer.thresholds import Thresholds
from collector.store import Store

NS = 1_000_000_000
HOUR = 3600 * NS


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    st = five_hours()
    yield st
    st.close()


@pytest.mark.parametrize(
    ("start", "end"),
    [(END - 2 * HOUR, END), (END - 150 * 60 * NS, END - 30 * 60 * NS), (END - 2 * HOUR + 30 * NS, END),
     (END - 900 * NS, END)],
)  # fmt: skip
def test_the_window_bins_equal_the_window_read_alone(store: Store, start: int, end: int) -> None:
    th = Thresholds(bin_s=60.0)
    with store.cursor() as cur:
        dep = list_deployments(cur)[0]
        alone = load_bins(cur, dep, start, end, th)
        with shared_reads():
            history = load_bins(
                cur, dep, END - 4 * HOUR, END, th, rollup=rollup_for(cur, END - 4 * HOUR, END)
            )
            got = load_bins(cur, dep, start, end, th)
    assert history.height == 240 and alone.height == -(-(end - start) // (60 * NS))
    assert alone["sm"].null_count() == alone["running"].null_count() == 0
    assert_frame_equal(got, alone)


@pytest.mark.parametrize(("window_s", "bin_s"), [(900, 60.0), (2 * 3600, 60.0), (2 * 3600, 600.0)])
def test_binned_quantiles_rows_are_the_quantiles_of_each_bin(
    store: Store, window_s: int, bin_s: float
) -> None:
    """``binned_quantiles`` builds its columns at once: the same rows as each bin's ``Quantile``
    (``quantiles_from_increases`` over the same increases), and the same frame when asked again
    inside one report (latency rule 8)."""
    start, qs = END - window_s * NS, (0.5, 0.99)
    with store.cursor() as cur:
        dep = list_deployments(cur)[0]
        keys = list(dep.engine_keys)
        inc = bucket_increases(cur, start, END, keys=keys, concepts=["ttft_seconds"], bin_s=bin_s)
        got = binned_quantiles(cur, start, END, bin_s, keys=keys, concepts=["ttft_seconds"], qs=qs)
        with shared_reads():
            first = binned_quantiles(cur, start, END, bin_s, keys=keys, concepts=["ttft_seconds"], qs=qs)
            again = binned_quantiles(cur, start, END, bin_s, keys=keys, concepts=["ttft_seconds"], qs=qs)
    want = [
        (c, b, start + int(b * bin_s * NS), x.q, x.value_s, x.observations)
        for (c, b), xs in quantiles_from_increases(inc, qs).items()
        for x in xs
    ]
    assert got.height == len(want) == 2 * -(-window_s // int(bin_s))
    assert got.rows() == want
    assert again is first and first.rows() == want


@pytest.mark.parametrize("name", ["histogram_buckets", "engine_samples", "engine_gauges", "gpu_samples"])
@pytest.mark.parametrize(
    ("lo", "hi"),
    [(END - 2 * HOUR, END), (END - HOUR - 30 * NS, END - 59 * NS), (END - 90 * NS, END + 60 * NS)],
)
def test_rollup_rows_bounded_on_their_minutes_are_the_rows_of_the_window(
    store: Store, name: str, lo: int, hi: int
) -> None:
    """``table_sql(..., within=(lo, hi))`` bounds the rollup on ``minute_ns`` (what its zone maps
    prune): the rows stamped in ``(lo, hi]`` are the same as with the stamp filtered alone, whole
    minutes or not."""
    with store.cursor() as cur:

        def rows(within: tuple[int, int] | None) -> list[tuple[object, ...]]:
            sql = f"SELECT * FROM {table_sql(name, True, within)} WHERE ts_ns > {lo} AND ts_ns <= {hi}"
            return sorted(cur.execute(sql).fetchall(), key=repr)

        want = rows(None)
        assert want and rows((lo, hi)) == want


@pytest.mark.parametrize("rollup", [True, False])
def test_a_history_read_for_tokens_alone_equals_the_shared_read(store: Store, rollup: bool) -> None:
    """``load_bins(..., shared=False)`` (Cp's history under a shorter window: its counters read
    for tokens alone) gives the same bins as the report's shared read of every counter, and as
    the bins read outside a report."""
    th = Thresholds(bin_s=60.0)
    lo, hi = END - 4 * HOUR, END
    with store.cursor() as cur:
        dep = list_deployments(cur)[0]
        alone = load_bins(cur, dep, lo, hi, th, rollup=rollup)
        with shared_reads():
            own = load_bins(cur, dep, lo, hi, th, rollup=rollup, shared=False)
        with shared_reads():
            every = load_bins(cur, dep, lo, hi, th, rollup=rollup)
    assert alone["tokens_per_s"].null_count() < alone.height
    assert_frame_equal(own, alone)
    assert_frame_equal(every, alone)
