"""The GPU gauge reads with a window's final minutes from the rollup (analyzer.rolled_minutes
rules 7-11) give what the points alone give, but for the rollup's rounding (rule 11).

Inputs, hand-built: four GPUs' SM activity (fractional values drawn from a seeded generator)
and framebuffer bytes (whole numbers) for 30 minutes: GPU 0 at 1 Hz, GPU 1 every 7 s (off the
minute boundaries), GPU 2 from 400 s on and changing its pod label at 900 s (two series of one
rollup key, rule 8), GPU 3 at 1 Hz up to 1,200 s exactly (its last point the first instant of a
minute); maintained at 1,800 s (watermark 1,800 s: minutes up to 1,680 s final). Expected: the
same bins and counts as the points alone; a bin's sum within the rule-11 bound of the points'."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pytest

import analyzer.latency as latency
from analyzer.crossover import _KEPT, _series_bins, rolled_gauges
from analyzer.deployments import texts
from collector.store import Retention, Store

NS = 1_000_000_000
BASE = 1_700_000_000 * NS // (3600 * NS) * (3600 * NS)  # an hour boundary, in the past
UUIDS = [f"GPU-{g}" for g in range(4)]
# |avg·n − Σx| ≤ (n + 2)·2⁻⁵³·Σ|x| (rule 11), n ≤ 61 points in a 60 s bin's minute: positive values
BOUND = 63 * 2.0**-53


def _gpu_rows(g: int, seconds: list[int], rng: np.random.Generator) -> pl.DataFrame:
    sm = rng.uniform(0.05, 0.95, len(seconds))
    fb = rng.integers(10**9, 8 * 10**10, len(seconds)).astype(float)
    pods = ["p0" if g != 2 or s < 900 else "p1" for s in seconds]
    rows = [
        {"ts_ns": BASE + s * NS, "host": "h", "gpu": g, "uuid": UUIDS[g], "metric": m, "link": -1,
         "value": float(v), "source": "dcgm", "gpu_model": "H100", "pod": pod, "namespace": None,
         "container": None, "mig_profile": None, "mig_instance": None}
        for m, vals in (("sm_active_ratio", sm), ("fb_used_bytes", fb))
        for s, v, pod in zip(seconds, vals, pods, strict=True)
    ]  # fmt: skip
    return pl.DataFrame(rows)


def _write(path: Path, maintain: bool = True, retention: Retention | None = None) -> Store:
    rng = np.random.default_rng(24)
    st = Store(path)
    spans = [range(1, 1801), range(3, 1801, 7), range(400, 1801), range(1, 1201)]
    for g, span in enumerate(spans):
        st.write("gpu_samples", _gpu_rows(g, list(span), rng))
    if maintain:
        st.maintain(now_ns=BASE + 1800 * NS, retention=retention)
    return st


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    st = _write(tmp_path_factory.mktemp("gauges") / "s.duckdb")
    yield st
    st.close()


def _bins(con: duckdb.DuckDBPyConnection, start: int, end: int, bin_ns: int, rolled: bool) -> pl.DataFrame:
    """``_series_bins`` with rule 7 forced on (any selection) or off (the points alone)."""
    latency_min = latency.ROLLED_MIN_SERIES
    latency.ROLLED_MIN_SERIES = 0 if rolled else 10**9
    try:
        return _series_bins(con, "gpu", texts(UUIDS), start, end, bin_ns)
    finally:
        latency.ROLLED_MIN_SERIES = latency_min


def _per_gpu(frame: pl.DataFrame) -> dict[tuple[str, str, int], tuple[Fraction, int]]:
    """Each GPU, metric and bin's sum (exact, over its series: rule 8 splits a key otherwise) and count."""
    out: dict[tuple[str, str, int], tuple[Fraction, int]] = {}
    for uuid, metric, b, v, n in frame.select("uuid", "metric", "bin", "v", "n").iter_rows():
        s, c = out.get((uuid, metric, b), (Fraction(0), 0))
        out[(uuid, metric, b)] = (s + (Fraction(v) if v is not None else 0), c + n)
    return out


def _compare(con: duckdb.DuckDBPyConnection, start: int, end: int, bin_ns: int) -> float:
    """Rolled against points-only: the same keys and counts, sums within :data:`BOUND` (whole
    numbers too: the stored mean is their sum divided, rounded); returns the largest relative
    difference."""
    want, got = (
        _per_gpu(_bins(con, start, end, bin_ns, False)),
        _per_gpu(_bins(con, start, end, bin_ns, True)),
    )
    assert want and want.keys() == got.keys()
    worst = 0.0
    for k, (v, n) in want.items():
        assert got[k][1] == n, k
        worst = max(worst, float(abs(got[k][0] - v) / v))
    assert worst <= BOUND
    return worst


# (start, end, bin) in seconds: 60 s bins from a minute; 120 and 300 s bins; the whole window; GPU 3's
# end (1,200 s) inside; the window's last minutes not final; a start inside a minute (whole only)
WINDOWS = [
    (600, 1500, 60), (600, 1500, 120), (600, 1500, 300), (600, 1500, 900), (960, 1440, 60),
    (900, 1800, 60), (630, 1530, 900), (60, 1800, 60),
]  # fmt: skip


@pytest.mark.parametrize(("lo", "hi", "bin_s"), WINDOWS)
def test_rolled_minutes_equal_the_points_within_the_bound(store: Store, lo: int, hi: int, bin_s: int) -> None:
    start, end, bin_ns = BASE + lo * NS, BASE + hi * NS, bin_s * NS
    with store.cursor() as cur:
        table, _, where = _KEPT["gpu"]
        latency.ROLLED_MIN_SERIES, was = 0, latency.ROLLED_MIN_SERIES
        try:
            used = rolled_gauges(cur, table, where, texts(UUIDS), (start, end, bin_ns))
        finally:
            latency.ROLLED_MIN_SERIES = was
        assert used is not None and used[1] - used[0] >= 3 * 60 * NS
        _compare(cur, start, end, bin_ns)


def test_the_rounding_moves_only_the_last_bits(store: Store) -> None:
    """Rule 11's measured figure: the sums of 60 s bins move by a few units in the last place at
    most (4.9e-16 of a bin here), not by the bound's 7e-15."""
    with store.cursor() as cur:
        worst = _compare(cur, BASE + 600 * NS, BASE + 1500 * NS, 60 * NS)
    assert 0 < worst < 1e-15


def test_a_start_inside_a_minute_in_60s_bins_reads_the_points(store: Store) -> None:
    with store.cursor() as cur:
        table, _, where = _KEPT["gpu"]
        start = BASE + 630 * NS
        assert rolled_gauges(cur, table, where, texts(UUIDS), (start, start + 900 * NS, 60 * NS)) is None


def _used(cur: duckdb.DuckDBPyConnection, lo: int = 600, hi: int = 1500) -> tuple[int, int] | None:
    table, _, where = _KEPT["gpu"]
    return rolled_gauges(cur, table, where, texts(UUIDS), (BASE + lo * NS, BASE + hi * NS, 60 * NS))


def test_the_threshold(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 7: only selections of at least ROLLED_MIN_SERIES series (here 10: 4 GPUs × 2 metrics
    and GPU 2's second pod, both metrics)."""
    with store.cursor() as cur:
        monkeypatch.setattr(latency, "ROLLED_MIN_SERIES", 10)
        assert _used(cur) is not None
        monkeypatch.setattr(latency, "ROLLED_MIN_SERIES", 11)
        assert _used(cur) is None


def test_a_null_value_in_the_used_minutes_reads_the_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule 10: the rollup's n counts a NULL value its avg leaves out."""
    monkeypatch.setattr(latency, "ROLLED_MIN_SERIES", 0)
    with _write(tmp_path / "s.duckdb", maintain=False) as st:
        row = _gpu_rows(0, [1000], np.random.default_rng(1)).with_columns(
            pl.lit(None, dtype=pl.Float64).alias("value"), pl.col("ts_ns") + NS // 2
        )
        st.write("gpu_samples", row)
        st.maintain(now_ns=BASE + 1800 * NS)
        with st.cursor() as cur:
            assert _used(cur) is None
            assert _used(cur, 1200, 1680) is not None  # a window without it


def test_a_store_never_maintained_reads_the_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(latency, "ROLLED_MIN_SERIES", 0)
    with _write(tmp_path / "s.duckdb", maintain=False) as st, st.cursor() as cur:
        assert _used(cur) is None


def test_minutes_whose_points_retention_deleted_read_the_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule 9: raw points before 900 s deleted, their rollups kept: a window from 600 s reads the
    points alone; one from 960 s (a point kept in the minute before) the rollup."""
    monkeypatch.setattr(latency, "ROLLED_MIN_SERIES", 0)
    with _write(tmp_path / "s.duckdb", retention=Retention(raw_s=900)) as st, st.cursor() as cur:
        assert _used(cur) is None
        assert _used(cur, 960, 1500) is not None
        _compare(cur, BASE + 960 * NS, BASE + 1500 * NS, 60 * NS)


def test_the_rolled_reads_are_the_same_for_any_thread_count(tmp_path: Path) -> None:
    """Rule 11: the same bins, to the last bit, at DuckDB threads 1, 2 and 4."""
    _write(tmp_path / "s.duckdb").close()
    start, end = BASE + 600 * NS, BASE + 1500 * NS
    runs = []
    for threads in (1, 2, 4, 2, 4):
        with duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True) as con:
            con.execute(f"SET threads = {threads}")
            runs.append(_bins(con, start, end, 60 * NS, True).to_dicts())
    assert runs[0] and all(r == runs[0] for r in runs)
