"""A raw window read with its final minutes from the rollups (analyzer.latency rule 12,
analyzer.rolled_minutes) gives what the points alone give (rule 9).

Inputs: test_rollup_increases' hand-built counters and histogram (resets on and off minute
boundaries, points held back and written late and out of order, a series written backwards, one
that starts inside the windows, one with a gap longer than the look-back, a replay), maintained
once at the end; then points written late into the minutes the next pass would recompute and into
the minute not yet rolled up; a store maintenance never ran on; and the API tests' deployment
(``api_store``: hand-built telemetry in the KV-capacity zone) maintained, its report compared."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from api_store import END_NS, START_NS, build
from test_rollup_increases import MIN, _history, _write
from test_stored_increases import BASE, NS, _buckets, _counter

import analyzer.latency as latency
from analyzer.deployments import list_deployments
from analyzer.report import deployment_report
from analyzer.rolled_minutes import used_minutes
from analyzer.thresholds import Thresholds
from collector.store import Store

COUNTERS = ["generation_tokens_total", "prompt_tokens_total"]


@pytest.fixture(autouse=True)
def _any_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 12 on these few hand-built series (below ``ROLLED_MIN_SERIES`` it reads the points)."""
    monkeypatch.setattr(latency, "ROLLED_MIN_SERIES", 0)


@contextmanager
def _points_only() -> Iterator[None]:
    """Rule 9 alone: no minute read from the rollups."""
    used = latency._used_minutes
    latency._used_minutes = lambda *a: None  # type: ignore[assignment]
    try:
        yield
    finally:
        latency._used_minutes = used


def _reads(con: Any, **kw: Any) -> list[pl.DataFrame]:
    return [
        latency.counter_increases(con, concepts=COUNTERS, rollup=False, **kw),
        latency.bucket_increases(con, concepts=["ttft_seconds"], rollup=False, **kw),
    ]


def _compare(con: Any, **kw: Any) -> None:
    """The same rows and the same numbers, to the last bit: the hand-built counts are whole
    numbers, so the rollups' float sums of them are exact, as the points' exact sums are."""
    with _points_only():
        want = _reads(con, **kw)
    got = _reads(con, **kw)
    for a, b in zip(want, got, strict=True):
        assert a.height > 0
        assert a.to_dicts() == b.to_dicts()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    st = _write(tmp_path_factory.mktemp("hyb") / "s.duckdb")
    yield st
    st.close()


# (start, end) in seconds: on minutes, inside minutes, across each reset (1,500 s, 2,640 s, 3,060 s,
# 3,600 s), the start of series "b" (2,400 s), the packed hour's boundary, up to the newest minutes
WINDOWS = [
    (600, 1500), (1440, 2340), (1457, 2361), (2100, 3000), (2399, 3299), (2940, 3840),
    (3000, 3905), (3541, 4441), (4440, 5340), (4501, 5399), (60, 5400),
]  # fmt: skip


@pytest.mark.parametrize(("lo", "hi"), WINDOWS)
@pytest.mark.parametrize("bin_s", [None, 60.0, 120.0, 300.0])
def test_final_minutes_from_the_rollups_equal_the_points(
    store: Store, lo: int, hi: int, bin_s: float | None
) -> None:
    start, end = BASE + lo * NS, BASE + hi * NS
    with store.cursor() as cur:
        bin_ns = int(bin_s * NS) if bin_s else end - start
        used = latency._used_minutes(cur, "engine_samples", start, end, bin_ns)
        if bin_s is None or lo % 60 == 0:  # rule 2: minutes fit these bins
            assert used is not None and used[1] - used[0] >= 3 * MIN
        else:
            assert used is None
        _compare(cur, start_ns=start, end_ns=end, bin_s=bin_s)


def test_the_final_minutes_by_hand() -> None:
    """Watermark at 5,460 s: minutes up to 5,340 s are final. (1,457 s, 2,361 s] whole: minutes
    1,500-2,340 s; in 60 s bins nothing (the start is inside a minute); (1,440 s, 2,340 s] in
    60 s bins: 1,440-2,340 s; (4,440 s, 5,400 s]: up to 5,340 s, not the last two minutes."""
    mark = BASE + 5460 * NS
    at = lambda s: BASE + s * NS  # noqa: E731
    assert used_minutes(mark, at(1457), at(2361), at(2361) - at(1457)) == (at(1500), at(2340))
    assert used_minutes(mark, at(1457), at(2361), 60 * NS) is None
    assert used_minutes(mark, at(1440), at(2340), 60 * NS) == (at(1440), at(2340))
    assert used_minutes(mark, at(4440), at(5400), 960 * NS) == (at(4440), at(5340))
    assert used_minutes(mark, at(5280), at(5400), 120 * NS) is None  # too few final minutes
    assert used_minutes(0, at(1440), at(2340), 900 * NS) is None  # never maintained


def test_late_points_not_yet_rolled_up_are_read_from_the_points(tmp_path: Path) -> None:
    """After the pass at 5,460 s, points arrive late for minutes 5,340-5,400 s (the two the next
    pass recomputes: not final) and for 5,400-5,460 s (the current minute), with a reset: the
    rollups do not hold them yet, the windows reading those minutes get them from the points."""
    with _write(tmp_path / "s.duckdb") as st:
        late: list[tuple[int, float | None]] = [
            (k, float(10 * (k - 5350))) for k in range(5351, 5460, 5)
        ]  # "a" resets at 5,351 s
        st.write("engine_samples", _counter("a", "generation_tokens_total", late))
        st.write("histogram_buckets", _buckets("h", [(k, float(k - 5000)) for k in range(5345, 5460, 10)]))
        with st.cursor() as cur:
            for lo, hi, bin_s in ((4500, 5400, None), (4560, 5460, 60.0), (4561, 5455, None)):
                start, end = BASE + lo * NS, BASE + hi * NS
                assert latency._used_minutes(cur, "engine_samples", start, end, end - start) is not None
                _compare(cur, start_ns=start, end_ns=end, bin_s=bin_s)


def test_a_store_never_maintained_reads_the_points(tmp_path: Path) -> None:
    with Store(tmp_path / "s.duckdb") as st:
        for table, rows in _history():
            st.write(table, rows)
        with st.cursor() as cur:
            start, end = BASE + 2400 * NS, BASE + 3300 * NS
            assert latency._used_minutes(cur, "engine_samples", start, end, end - start) is None
            _compare(cur, start_ns=start, end_ns=end, bin_s=60.0)


@pytest.fixture(scope="module")
def maintained() -> Iterator[Store]:
    st = build()
    st.maintain(now_ns=END_NS + 30 * NS)  # every minute of the window rolled up but the last two
    yield st
    st.close()


def _approx(b: Any) -> Any:
    return pytest.approx(b, rel=1e-9, abs=1e-12, nan_ok=True) if isinstance(b, float) else b


@pytest.mark.parametrize("shift_s", [0, 90])
def test_the_report_equals_the_points_only_report(maintained: Store, shift_s: int) -> None:
    """Zone, scores, confidence, evidence, latency quantiles and the regression: the same with the
    final minutes from the rollups as from the points (the window on a scrape and 90 s earlier)."""
    start, end = START_NS - shift_s * NS, END_NS - shift_s * NS
    with maintained.cursor() as cur:
        dep = list_deployments(cur)[0]
        assert latency._used_minutes(cur, "histogram_buckets", start, end, end - start) is not None
        got = deployment_report(cur, dep, start, end, Thresholds())
        with _points_only():
            ref = deployment_report(cur, dep, start, end, Thresholds())
    f, r = got["envelope"], ref["envelope"]
    assert f["primary"] == r["primary"] == "kv_capacity"
    for key in ("secondary", "label", "ambiguous", "missing", "confidence", "scores"):
        assert f[key] == r[key], key
    for e, g in zip(f["evidence"], r["evidence"], strict=True):
        assert (e["signal"], e["verdict"]) == (g["signal"], g["verdict"])
        assert e["value"] == _approx(g["value"]), e["signal"]
    fr, rr = got["regression"], ref["regression"]
    assert (fr["baseline_mode_used"], fr["change_point_ns"]) == (
        rr["baseline_mode_used"],
        rr["change_point_ns"],
    )
    for m, n in zip(fr["metrics"], rr["metrics"], strict=True):
        assert m["verdict"] == n["verdict"] and m["now_s"] is not None
        assert (m["now_s"], m["baseline_s"]) == (_approx(n["now_s"]), _approx(n["baseline_s"]))
    with maintained.cursor() as cur:
        kw = {"keys": None, "qs": (0.5, 0.9, 0.99)}
        q = latency.window_quantiles(cur, start, end, **kw)  # type: ignore[arg-type]
        with _points_only():
            qr = latency.window_quantiles(cur, start, end, **kw)  # type: ignore[arg-type]
    assert q.keys() == qr.keys() and q
    for c in q:
        for x in q[c]:
            a, b = q[c][x], qr[c][x]
            assert (a.value_s, a.observations) == (_approx(b.value_s), _approx(b.observations)), (c, x)
            assert (a.at_floor, a.capped) == (b.at_floor, b.capped)


def test_the_minutes_are_read_from_the_rollups(tmp_path: Path) -> None:
    """The rollups are really read: with every rollup increase made 1,000 larger, a window of 15
    final minutes reads 15,000 more per series than the points say (so the tests above compare
    two different reads)."""
    with _write(tmp_path / "t.duckdb") as st:
        st.con.execute("UPDATE engine_samples_1m SET increase = increase + 1000")
        with st.cursor() as cur:
            kw: dict[str, Any] = {"start_ns": BASE + 3600 * NS, "end_ns": BASE + 4500 * NS}
            with _points_only():
                want = latency.counter_increases(cur, concepts=COUNTERS, rollup=False, **kw)
            got = latency.counter_increases(cur, concepts=COUNTERS, rollup=False, **kw)
    w = dict(zip(want["concept"].to_list(), want["increase"].to_list(), strict=True))
    g = dict(zip(got["concept"].to_list(), got["increase"].to_list(), strict=True))
    # "a" and "b" count generation tokens: 15 minutes each, 2 series
    assert g["generation_tokens_total"] == pytest.approx(w["generation_tokens_total"] + 2 * 15 * 1000)


def test_minutes_whose_points_retention_deleted_read_the_points(tmp_path: Path) -> None:
    """Raw points before 1,800 s deleted by retention, their rollups kept: a window whose look-back
    has no point (rule 4) reads the points alone, as the points-only read does."""
    from collector.store import Retention

    with _write(tmp_path / "s.duckdb", Retention(raw_s=(5460 - 1800))) as st, st.cursor() as cur:
        start, end = BASE + 1500 * NS, BASE + 2400 * NS
        assert latency._used_minutes(cur, "engine_samples", start, end, end - start) is not None
        _compare(cur, start_ns=start, end_ns=end)


def _fractional(path: Path) -> Store:
    """Two counters with fractional steps, reset every 100 s, for 40 minutes at 1 Hz: "f" by 0.1 a
    second, "g" by 1e9/3 (plus 0.37 × (k mod 7) each); maintained at 2,460 s (minutes up to
    2,280 s final). A minute with a reset sums increases of very different sizes (the reset's
    small value among steps of 3e8), so the store's float sum of the minute rounds where the
    points' exact sum does not."""
    st = Store(path)
    for src, step in (("f", 0.1), ("g", 1e9 / 3)):
        pts = [(k, (k % 100) * step + 0.37 * (k % 7)) for k in range(0, 2400)]
        st.write("engine_samples", _counter(src, "generation_tokens_total", pts))
    st.maintain(now_ns=BASE + 2460 * NS)
    return st


def test_fractional_counts_move_only_in_the_last_bits(tmp_path: Path) -> None:
    """Rule 6 of analyzer.rolled_minutes: with fractional counts a minute's rollup increase is
    rounded once, so a bin read from the final minutes may differ from the points' exact sum in
    the last bits: here 11 of the 15 one-minute bins, by at most 5.8e-16 of the bin (under 3
    units in the last place; bound 2e-15), the whole window not at all. Every read gives the same
    numbers (they come from the stored rollup rows and exact sums)."""
    with _fractional(tmp_path / "f.duckdb") as st, st.cursor() as cur:
        kw: dict[str, Any] = {"start_ns": BASE + 1200 * NS, "end_ns": BASE + 2100 * NS}
        assert latency._used_minutes(cur, "engine_samples", kw["start_ns"], kw["end_ns"], 900 * NS)
        moved = 0
        for bin_s in (None, 60.0):
            with _points_only():
                want = latency.counter_increases(cur, concepts=COUNTERS[:1], rollup=False, bin_s=bin_s, **kw)
            got = [
                latency.counter_increases(cur, concepts=COUNTERS[:1], rollup=False, bin_s=bin_s, **kw)
                for _ in range(2)
            ]
            assert got[0].to_dicts() == got[1].to_dicts()
            assert got[0].drop("increase").to_dicts() == want.drop("increase").to_dicts()
            for x, y in zip(got[0]["increase"].to_list(), want["increase"].to_list(), strict=True):
                assert abs(x - y) <= 2e-15 * abs(y), (bin_s, x, y)
                moved += x != y
        assert moved > 0  # the rounding this test is about does happen


def test_a_small_selection_reads_the_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Below ``ROLLED_MIN_SERIES`` selected series the window is read from the points alone (the
    rule's fixed cost is more than the points it saves): with every rollup increase made 1,000
    larger, the three counter series ("a", "b", "c") read what the points say under a threshold
    of 4 and the inflated minutes under one of 3."""
    with _write(tmp_path / "t.duckdb") as st:
        st.con.execute("UPDATE engine_samples_1m SET increase = increase + 1000")
        with st.cursor() as cur:
            kw: dict[str, Any] = {"start_ns": BASE + 3600 * NS, "end_ns": BASE + 4500 * NS, "rollup": False}
            with _points_only():
                want = latency.counter_increases(cur, concepts=COUNTERS, **kw).to_dicts()
            monkeypatch.setattr(latency, "ROLLED_MIN_SERIES", 4)
            small = latency.counter_increases(cur, concepts=COUNTERS, **kw).to_dicts()
            monkeypatch.setattr(latency, "ROLLED_MIN_SERIES", 3)
            large = latency.counter_increases(cur, concepts=COUNTERS, **kw).to_dicts()
    assert small == want
    assert large != want
