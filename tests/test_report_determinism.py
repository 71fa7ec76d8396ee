"""One store file gives one report: bit for bit the same JSON on every run and for any number of
DuckDB threads.

DuckDB sums doubles in parallel, each thread a part of the rows, and adds the parts in whatever
order the threads finish; polars' float sums also changed in the last bits from one call to the
next. The report's fits compare such sums with thresholds (Cp's hinge fit picks the least squared
error on a grid), so a last-bit change could turn a verdict. The analyzer sums exactly
(``analyzer.point_bins.exact_sum``/``exact_total``), which no order changes; the window's final
minutes come from the rollups (``analyzer.latency`` rule 12, and for the GPU gauges
``analyzer.rolled_minutes`` rules 7 and 12), summed exactly as well.

Input: the benchmark's generated telemetry (``bench.bench_envelope.generate``: 16 GPUs and 4
engines at 1 Hz for an hour, with rollups), large enough that every raw table the report sums
spans more than one DuckDB row group (122,880 rows), so its aggregates do run in parallel. This
test judges no verdict, only that the same input gives the same output."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

import analyzer.latency as latency
from analyzer.crossover import _KEPT, rolled_gauges
from analyzer.deployments import list_deployments, texts
from analyzer.regression_axes import _rolled_links
from analyzer.report import deployment_report
from analyzer.thresholds import Thresholds
from bench.bench_envelope import NS, T0, generate

MINUTES = 60
ROW_GROUP = 122_880


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("det") / "store.duckdb"
    counts = generate(path, MINUTES / 60, gpus=16, engines=4, chunk_s=600)
    assert all(counts[t] > ROW_GROUP for t in ("gpu_samples", "engine_samples", "histogram_buckets")), counts
    return path


def _report(path: Path, threads: int) -> str:
    con = duckdb.connect(str(path), read_only=True)
    try:
        con.execute(f"SET threads = {int(threads)}")
        end = T0 + MINUTES * 60 * NS
        dep = list_deployments(con, end - 900 * NS)[0]
        report = deployment_report(con, dep, end - 900 * NS, end, Thresholds())
    finally:
        con.close()
    return json.dumps(report, sort_keys=True, default=str)


@pytest.mark.parametrize("rolled", [False, True])
def test_report_is_identical_for_any_thread_count_and_run(
    store: Path, rolled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the store is read (its 172 bucket series read from the points: latency rule 12 is for
    larger selections), and with the window's final minutes from the rollups (rule 12 in play)."""
    if rolled:
        monkeypatch.setattr(latency, "ROLLED_MIN_SERIES", 0)
        with duckdb.connect(str(store), read_only=True) as con:
            end = T0 + MINUTES * 60 * NS
            assert latency._used_minutes(con, "histogram_buckets", end - 900 * NS, end, 60 * NS) is not None
            # and the GPU gauge reads' (analyzer.rolled_minutes rule 7)
            got = con.execute("SELECT DISTINCT uuid FROM gpu_samples_series").fetchall()
            uuids = texts([r[0] for r in got])
            table, _, where = _KEPT["gpu"]
            assert rolled_gauges(con, table, where, uuids, (end - 900 * NS, end, 60 * NS)) is not None
            # and the regression's link and clock axes over its span (rule 12 there)
            dep = list_deployments(con, end - 900 * NS)[0]
            assert _rolled_links(con, dep, (end - 1800 * NS, end, 60 * NS)) is not None
    one = _report(store, 1)
    assert '"cp"' in one and '"regression"' in one
    runs = [_report(store, t) for t in (4, 4, 1, 4, 2, 4)]
    for i, got in enumerate(runs):
        if got != one:
            a, b = json.loads(one), json.loads(got)
            diff = sorted(k for k in a if a[k] != b.get(k))
            pytest.fail(f"run {i + 1} differs from the single-threaded report in {diff}")


def _rolled(path: Path, threads: int) -> list[list[dict[str, object]]]:
    """The window's bucket and counter increases in 60 s bins with the final minutes from the
    rollups (analyzer.latency rule 12), at ``threads`` DuckDB threads."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        con.execute(f"SET threads = {int(threads)}")
        end = T0 + MINUTES * 60 * NS
        lo = end - 900 * NS
        counters = ["generation_tokens_total", "ttft_seconds_sum"]
        return [
            latency.bucket_increases(con, lo, end, bin_s=60.0, rollup=False).to_dicts(),
            latency.counter_increases(con, lo, end, counters, bin_s=60.0, rollup=False).to_dicts(),
        ]
    finally:
        con.close()


def test_the_rolled_minute_reads_are_identical_for_any_thread_count(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(latency, "ROLLED_MIN_SERIES", 0)
    one = _rolled(store, 1)
    assert all(one)
    for threads in (4, 2, 4):
        assert _rolled(store, threads) == one
