"""Rollup increases (collector.store rollup rules 1-2, analyzer.latency rule 11): each counter
rollup minute keeps the sum of its points' stored increases, and a long window's increase summed
from them equals the ``lag()`` over the minutes' last values it replaced, except where that lost
growth (a reset inside a minute).

Inputs are hand-built counters (no analyzer or simulator code), written the hard way: resets on
minute boundaries, points held back and written late and out of order, a packed hour written
into, a series written backwards, one that starts inside the windows, one with a gap longer than
the look-back, a replayed batch and a reopened writer."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from test_stored_increases import (
    BASE,
    ENGINE,
    NS,
    _counter,
    _same,
    assert_regrouped,
    history,
    write_history,
)

import analyzer.latency as latency
from collector.records import frame
from collector.store import SCHEMA_VERSION, Retention, Store

MIN = 60 * NS
END = BASE + 5460 * NS  # the maintenance pass after the history: every minute complete


def _tokens(k: int) -> float:
    """Series "a": +10 a second, reset to 0 at 1,500 s and at 3,600 s (each the first point of its
    minute, so the step between the minutes' last values is the minute's whole growth)."""
    return float(10 * (k if k < 1500 else k - 1500 if k < 3600 else k - 3600))


def _history() -> list[tuple[str, pl.DataFrame]]:
    """ "c" resets at 3,060 s and "h" at 2,640 s: each on a minute boundary."""
    return history(_tokens, seed=11, c_reset=3060, h_reset=2640)


def _write(path: Path, retention: Retention | None = None) -> Store:
    st = write_history(path, _history())
    st.maintain(now_ns=END, retention=retention)
    return st


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    st = _write(tmp_path_factory.mktemp("roll") / "s.duckdb")
    yield st
    st.close()


@contextmanager
def _lagged() -> Iterator[None]:
    """Read the rollups as before schema 6: ``lag`` over the minutes' last values (rule 6)."""
    sums = latency._rollup_sums
    latency._rollup_sums = lambda *a: False  # type: ignore[assignment]
    try:
        yield
    finally:
        latency._rollup_sums = sums


def _both(con: Any, fn: Callable[..., pl.DataFrame], **kw: Any) -> tuple[pl.DataFrame, pl.DataFrame]:
    assert latency._rollup_sums(con, "engine_samples")
    with _lagged():
        old = fn(con, rollup=True, **kw)
    return old, fn(con, rollup=True, **kw)


def test_each_minute_keeps_the_sum_of_its_point_increases(store: Store) -> None:
    for table, key in (("engine_samples", "source, concept"), ("histogram_buckets", "source, concept, le")):
        got = store.con.execute(
            f"""SELECT r.minute_ns, r.increase, p.inc FROM {table}_1m AS r JOIN (
                    SELECT ts_ns - ts_ns % {MIN} AS minute_ns, {key}, sum(increase) AS inc
                    FROM {table}_points JOIN {table}_series USING (series_id) GROUP BY ALL
                ) AS p USING (minute_ns, {key})"""
        ).fetchall()
        n = store.con.execute(f"SELECT count(*) FROM {table}_1m").fetchone()
        assert n and len(got) == n[0] > 80
        assert all(r[1] == r[2] or (r[1] is None and r[2] is None) for r in got)


# windows on minute boundaries (rollup rows are whole minutes): the whole history, each reset, the
# start of series "b", the gap and reset of "c", and the packed hour's boundary
WINDOWS = [(60, 5400), (1440, 1620), (1500, 2100), (2340, 2700), (2940, 3180), (3540, 3660), (0, 3600)]


@pytest.mark.parametrize(("lo", "hi"), WINDOWS)
@pytest.mark.parametrize("bin_s", [None, 60.0, 120.0, 300.0])
def test_summed_minutes_equal_the_lag_over_the_rollups(
    store: Store, lo: int, hi: int, bin_s: float | None
) -> None:
    kw = {"start_ns": BASE + lo * NS, "end_ns": BASE + hi * NS, "bin_s": bin_s}
    with store.cursor() as cur:
        old, new = _both(
            cur, latency.counter_increases, concepts=["generation_tokens_total", "prompt_tokens_total"], **kw
        )
        assert old.height > 0
        _same(old, new)
        old, new = _both(cur, latency.bucket_increases, concepts=["ttft_seconds"], **kw)
        assert old.height > 0
        _same(old, new)


def test_a_report_reads_every_counter_of_the_minutes_once(store: Store) -> None:
    """Inside ``shared_reads`` the rollup counters of every concept are summed once and each call
    gets the same rows as alone."""
    start, end = BASE + 1440 * NS, BASE + 5400 * NS
    calls = [["generation_tokens_total"], ["prompt_tokens_total", "generation_tokens_total"]]
    alone = [latency.counter_increases(store.con, start, end, c, bin_s=300.0, rollup=True) for c in calls]
    with latency.shared_reads():
        shared = [
            latency.counter_increases(store.con, start, end, c, bin_s=300.0, rollup=True) for c in calls
        ]
    for a, b in zip(alone, shared, strict=True):
        assert a.height > 0
        _same(a, b)


def _reset_inside_a_minute(path: Path) -> Store:
    """Series "x", a point every 10 s at 5, 15, … s: +10 a step from 0 at 5 s to 70 at 75 s, a reset
    to 5 at 85 s (inside the minute 60-120 s), then +10 a step to 45 at 125 s; the same counts as
    a one-bucket histogram."""
    values = [0, 10, 20, 30, 40, 50, 60, 70, 5, 15, 25, 35, 45]
    points = [(5 + 10 * i, float(v)) for i, v in enumerate(values)]
    st = Store(path)
    st.write("engine_samples", _counter("x", "generation_tokens_total", points))
    rows = [
        {"ts_ns": BASE + s * NS, "source": "x", "concept": "ttft_seconds", "le": math.inf,
         "cumulative_count": v, **ENGINE}
        for s, v in points
    ]  # fmt: skip
    st.write("histogram_buckets", frame("histogram_buckets", rows))
    st.maintain(now_ns=BASE + 180 * NS)
    return st


def test_a_reset_inside_a_minute_keeps_the_growth_before_it(tmp_path: Path) -> None:
    """(60 s, 180 s]: the minutes 60-120 s and 120-180 s. The points grow 50 → 60 → 70 (+20), reset
    to 5 (+5), grow to 35 (+30) and to 45 at 125 s (+10): 65, as the raw points say. ``lag`` over the
    minutes' last values saw 50 → 35 (a reset: +35) → 45 (+10): 45, the 20 before the reset lost."""
    with _reset_inside_a_minute(tmp_path / "s.duckdb") as st:
        kw = {"start_ns": BASE + 60 * NS, "end_ns": BASE + 180 * NS}
        old, new = _both(st.con, latency.counter_increases, concepts=["generation_tokens_total"], **kw)
        raw = latency.counter_increases(st.con, concepts=["generation_tokens_total"], rollup=False, **kw)
        assert (old["increase"].to_list(), new["increase"].to_list()) == ([45.0], [65.0])
        assert raw["increase"].to_list() == [65.0]
        old, new = _both(st.con, latency.bucket_increases, concepts=["ttft_seconds"], **kw)
        assert (old["count"].to_list(), new["count"].to_list()) == ([45.0], [65.0])


def test_late_points_land_in_their_minutes_rollup(tmp_path: Path) -> None:
    """A sidecar's passes: minutes 0-4 rolled up, then points of minute 3 arrive late (within the
    two minutes each pass recomputes) with minute 5's; the next pass puts them in minute 3's row
    (count and increase) and leaves minutes 0-2 as they were."""
    with Store(tmp_path / "s.duckdb") as st:
        on_time = [(s, float(s)) for s in range(0, 300, 10) if not 200 <= s < 240]
        st.write("engine_samples", _counter("a", "generation_tokens_total", on_time))
        st.maintain(now_ns=BASE + 300 * NS + 1)
        first = st.con.execute("SELECT * FROM engine_samples_1m ORDER BY minute_ns").fetchall()
        assert [r[10] for r in first] == [6, 6, 6, 2, 6]  # n: minute 3 has 2 of its 6 points
        st.write(
            "engine_samples",
            _counter("a", "generation_tokens_total", [(s, float(s)) for s in range(200, 240, 10)]),
        )
        st.write(
            "engine_samples",
            _counter("a", "generation_tokens_total", [(s, float(s)) for s in range(300, 360, 10)]),
        )
        st.maintain(now_ns=BASE + 360 * NS + 1)
        got = st.con.execute(
            "SELECT minute_ns, n, increase FROM engine_samples_1m ORDER BY minute_ns"
        ).fetchall()
        again = st.con.execute("SELECT * FROM engine_samples_1m ORDER BY minute_ns").fetchall()
    assert again[:3] == first[:3]  # minutes 0-2: the same rows
    assert [(m - BASE) // MIN for m, _, _ in got] == [0, 1, 2, 3, 4, 5]
    # +10 a step; the first point (0 s) has no previous one: minute 0 holds 5 steps
    assert [(n, inc) for _, n, inc in got] == [
        (6, 50.0),
        (6, 60.0),
        (6, 60.0),
        (6, 60.0),
        (6, 60.0),
        (6, 60.0),
    ]


def test_a_schema_5_file_gets_its_rollup_increases_on_open(tmp_path: Path) -> None:
    """A file whose rollups have no increase (made here by removing it), with the raw points of
    its first half hour deleted by retention: read-only it reads ``lag`` over the rollups; opened
    for writing, the minutes without raw points get the step between minutes, the others the sum
    of their points' increases; both read the same."""
    path = tmp_path / "s.duckdb"
    with _write(path, Retention(raw_s=(5460 - 1800))) as st:
        gone = st.con.execute("SELECT min(ts_ns) FROM engine_samples_points").fetchone()
        assert gone and gone[0] >= BASE + 1800 * NS  # retention deleted the first half hour
        for t in ("engine_samples_1m", "histogram_buckets_1m"):
            st.con.execute(f"ALTER TABLE {t} DROP COLUMN increase")
        st.con.execute("UPDATE ioe_schema SET version = 5")  # before the rollups kept increases
    kw = {"start_ns": BASE + 60 * NS, "end_ns": BASE + 5400 * NS, "bin_s": 300.0}
    ro = Store(path, read_only=True)
    with ro.cursor() as cur:
        assert not latency._rollup_sums(cur, "engine_samples")
        before = [
            latency.counter_increases(
                cur, concepts=["generation_tokens_total", "prompt_tokens_total"], rollup=True, **kw
            ),
            latency.bucket_increases(cur, concepts=["ttft_seconds"], rollup=True, **kw),
        ]
    ro.close()
    with Store(path) as st:
        assert st.schema_version() == SCHEMA_VERSION
        after = [
            latency.counter_increases(
                st.con, concepts=["generation_tokens_total", "prompt_tokens_total"], rollup=True, **kw
            ),
            latency.bucket_increases(st.con, concepts=["ttft_seconds"], rollup=True, **kw),
        ]
        assert latency._rollup_sums(st.con, "engine_samples")
    for a, b in zip(before, after, strict=True):
        assert a.height > 0
        _same(a, b)


def _reads(con: Any, kw: dict[str, Any]) -> list[pl.DataFrame]:
    counters = ["generation_tokens_total", "prompt_tokens_total"]
    return [
        latency.counter_increases(con, concepts=counters, rollup=True, **kw),
        latency.bucket_increases(con, concepts=["ttft_seconds"], rollup=True, **kw),
    ]


def test_a_report_regroups_the_minutes_it_has_already_summed(store: Store) -> None:
    """analyzer.latency rule 10 for rule 11: after 60 s bins of (start, end], the whole window and
    a shorter one from the same start come from those bins, equal to reading them alone."""
    start = BASE + 1440 * NS
    asks = [
        (BASE + 5400 * NS, 60.0),
        (BASE + 5400 * NS, None),
        (BASE + 3600 * NS, None),
        (BASE + 3600 * NS, 300.0),
    ]
    assert_regrouped(store, start, asks, rollup=True)


def test_every_bins_quantiles_at_once_equal_one_bin_at_a_time() -> None:
    """analyzer.latency.quantiles_from_increases takes every (concept, bin) group at once with
    numpy; each Quantile must equal :func:`analyzer.latency.quantile_of` on that group alone.
    Random bucket layouts (with and without +Inf, an +Inf-only one), counts that stall, drop to
    0, go a hair below 0 (float noise of a corrected sum), rows shuffled, q outside [0, 1]."""
    rnd = random.Random(5)
    qs = (0.0, 0.5, 0.9, 0.99, 1.0, 1.5)
    for trial in range(60):
        rows = []
        for concept in ("itl_seconds", "ttft_seconds"):
            les = sorted(rnd.sample([0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.0, 5.0], rnd.randint(1, 6)))
            les = [math.inf] if trial % 20 == 0 else les + [math.inf] * (rnd.random() < 0.8)
            for b in range(rnd.randint(1, 20)):
                c = 0.0
                for le in les:
                    c = (
                        max(0.0, c + rnd.choice([0, 0, 1, 2.5, 7]))
                        if rnd.random() < 0.9
                        else rnd.choice([0.0, -1e-12])
                    )
                    rows.append({"concept": concept, "bin": b, "le": le, "count": c})
        inc = pl.DataFrame(rows).sample(fraction=1.0, shuffle=True, seed=trial)
        got = latency.quantiles_from_increases(inc, qs)
        for (concept, b), quantiles in got.items():
            one = inc.filter((pl.col("concept") == concept) & (pl.col("bin") == b)).sort("le")
            les, counts = one["le"].to_list(), one["count"].to_list()
            assert quantiles == [latency.quantile_of(concept, les, counts, q) for q in qs]
        assert len(got) == inc.select("concept", "bin").unique().height
