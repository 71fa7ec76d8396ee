"""The regression's fabric and clock axes with a span's final minutes from the GPU rollup
(analyzer.rolled_minutes rule 12) count the same link sample times and clock samples as the
telemetry holds, and sum the values within the rollup's rounding (rule 11).

Inputs, hand-built: four GPUs' NVLink transmit rates (fractional bytes/s from a seeded generator)
and SM clocks (whole MHz) for 30 minutes, GPU 0 at every second, GPU 1 every 7 s half a second
after the second (instants no other GPU has), GPU 2 from 400 s on, GPU 3 up to 1,200 s, and GPU
0's SM activity (not an axis: never counted); maintained at 1,800 s (minutes up to 1,680 s final),
read as written (recent points) and packed, in 60 s bins and in one bin for the whole window (as a
regression side off the span's bins is read). Expected, from the written rows themselves: per bin,
the number of distinct instants with a link value, the number of clock values, and the exact sums
of each."""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest

import analyzer.latency as latency
from analyzer.deployments import Deployment
from analyzer.regression_axes import _gpu_rows, _rolled_links
from collector.store import Store

NS = 1_000_000_000
BASE = 1_700_000_000 * NS // (3600 * NS) * (3600 * NS)  # an hour boundary, in the past
UUIDS = [f"GPU-{g}" for g in range(4)]
DEP = Deployment(name="d", gpu_uuids=tuple(UUIDS))
BOUND = 63 * 2.0**-53  # rule 11: |avg·n − Σx| ≤ (n + 2)·2⁻⁵³·Σ|x|, n ≤ 61 points in a minute
# each GPU's sample times, ns from BASE
TIMES = [
    [s * NS for s in range(1, 1801)],
    [s * NS + NS // 2 for s in range(3, 1801, 7)],
    [s * NS for s in range(400, 1801)],
    [s * NS for s in range(1, 1201)],
]


Written = list[tuple[int, str, float]]  # (ns from BASE, metric, value)


def _write(path: Path, packed: bool) -> tuple[Store, Written]:
    rng = np.random.default_rng(12)
    st = Store(path)
    written: Written = []
    for g, times in enumerate(TIMES):
        link = rng.uniform(1e9, 5e10, len(times))
        clock = rng.integers(1200, 1981, len(times)).astype(float)
        metrics = [("nvlink_tx_bytes_per_s", link), ("sm_clock_mhz", clock)]
        if g == 0:
            metrics.append(("sm_active_ratio", rng.uniform(0, 1, len(times))))
        rows = [
            {"ts_ns": BASE + t, "host": "h", "gpu": g, "uuid": UUIDS[g], "metric": m, "link": -1,
             "value": float(v), "source": "dcgm", "gpu_model": "H100", "pod": None, "namespace": None,
             "container": None, "mig_profile": None, "mig_instance": None}
            for m, vals in metrics for t, v in zip(times, vals, strict=True)
        ]  # fmt: skip
        st.write("gpu_samples", pl.DataFrame(rows))
        written += [(t, m, float(v)) for m, vals in metrics for t, v in zip(times, vals, strict=True)]
    st.maintain(now_ns=BASE + 1800 * NS)
    if packed:
        st.pack(now_ns=BASE + 2 * 3600 * NS)
    return st, written


@pytest.fixture(scope="module", params=[False, True], ids=["recent", "packed"])
def store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Store, Written]]:
    st, written = _write(tmp_path_factory.mktemp("links") / "s.duckdb", request.param)
    yield st, written
    st.close()


def _expected(
    written: Written, lo: int, hi: int, bin_s: int
) -> dict[int, tuple[Fraction, int, Fraction, int]]:
    """Per ``bin_s`` bin of ``(BASE + lo s, BASE + hi s]``: the link values' exact sum and their
    distinct instants, the clock values' exact sum and count, from the written rows."""
    out: dict[int, list[Fraction | int]] = {}
    instants: dict[int, set[int]] = {}
    for t, metric, value in written:
        if metric == "sm_active_ratio" or not lo * NS < t <= hi * NS:
            continue
        b = (t - lo * NS - 1) // (bin_s * NS)
        cell = out.setdefault(b, [Fraction(0), 0, Fraction(0), 0])
        if metric == "sm_clock_mhz":
            cell[2] += Fraction(value)
            cell[3] += 1
        else:
            cell[0] += Fraction(value)
            instants.setdefault(b, set()).add(t)
    return {b: (Fraction(c[0]), len(instants.get(b, ())), Fraction(c[2]), int(c[3])) for b, c in out.items()}


def _read(
    con: duckdb.DuckDBPyConnection, lo: int, hi: int, rolled: bool, bin_s: int = 60
) -> dict[int, tuple[float, int, float, int]]:
    was = latency.ROLLED_MIN_SERIES
    latency.ROLLED_MIN_SERIES = 0 if rolled else 10**9
    try:
        window = (BASE + lo * NS, BASE + hi * NS, bin_s * NS)
        assert (_rolled_links(con, DEP, window) is not None) == rolled
        got = _gpu_rows(con, DEP, *window, False)
    finally:
        latency.ROLLED_MIN_SERIES = was
    return {int(b): (ls or 0.0, int(lt or 0), cs or 0.0, int(cn or 0)) for b, ls, lt, cs, cn in got}


# (start, end, bin) in seconds: 60 s bins from a minute; the window's last minutes not final; one bin for the
# whole window (a side of the regression off the span's bins), from a minute and from inside one
@pytest.mark.parametrize(
    ("lo", "hi", "bin_s"),
    [(600, 1500, 60), (900, 1800, 60), (60, 1800, 60), (960, 1440, 60), (600, 1500, 900), (630, 1530, 900)],
)
def test_the_rolled_axes_count_what_was_written(
    store: tuple[Store, Written], lo: int, hi: int, bin_s: int
) -> None:
    st, written = store
    want = _expected(written, lo, hi, bin_s)
    with st.cursor() as con:
        for rolled in (False, True):
            got = _read(con, lo, hi, rolled, bin_s)
            assert got.keys() == want.keys()
            for b, (ls, lt, cs, cn) in want.items():
                assert (got[b][1], got[b][3]) == (lt, cn), b  # instants and clock values: exact
                for x, exact in ((got[b][0], ls), (got[b][2], cs)):
                    bound = 0 if not rolled else BOUND  # the points' exact sums, rounded once
                    assert abs(Fraction(x) - exact) <= max(bound * exact, abs(exact) * 2.0**-52), b
    assert any(lt > bin_s for _, lt, _, _ in want.values())  # GPU 1's own instants are counted


def test_the_rolled_axes_are_the_same_for_any_thread_count(tmp_path: Path) -> None:
    """Rule 11: the same rows, to the last bit, at DuckDB threads 1, 2 and 4."""
    _write(tmp_path / "s.duckdb", True)[0].close()
    runs = []
    for threads in (1, 2, 4, 2, 4):
        with duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True) as con:
            con.execute(f"SET threads = {threads}")
            runs.append(_read(con, 600, 1500, True))
    assert runs[0] and all(r == runs[0] for r in runs)
