"""Inside one report the window's gauge bins (running requests, KV usage, SM and DRAM activity per
bin) are the last bins of Cp's history read first, where both read the same rows (crossover
``_gauge_bins``): the same frames as the window read alone, because a bin's means depend on the
samples inside it only.

Hand-built telemetry: ``five_hours`` of test_regression_sides (one engine every 5 s, two GPUs whose
SM and DRAM activity change every sample, rolled up). The history is the last 4 h; windows: the last
2 h (its bins are the history's last 120), 2 h ending 30 min before the end (bins inside), 2 h
starting 30 s off the history's bin edges (read alone), and 15 min (raw rows: read alone)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from polars.testing import assert_frame_equal
from test_regression_sides import END, five_hours

from analyzer.crossover import load_bins
from analyzer.deployments import list_deployments
from analyzer.latency import rollup_for, shared_reads
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
