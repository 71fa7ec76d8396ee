"""Stored increases (collector.increases): each counter point keeps its reset-aware step, and a
window's increase summed from them equals the ``lag()`` statement it replaced.

Inputs are hand-built counters (no analyzer or simulator code): values chosen so a lost,
doubled or misplaced step changes a sum. The store is written the hard way — resets, a NULL
value, points arriving late (older than points already stored, some into a packed hour), a
replayed batch, a series that starts inside a window and one whose previous point lies before
the look-back — then every window and bin is read three ways: the wide views (``lag`` over the
series' descriptions, what a DuckLake store runs), the points with ``lag`` (schema 4) and the
points' stored increases summed (schema 5)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import analyzer.latency as latency
from collector.records import frame
from collector.store import SCHEMA_VERSION, Store

NS = 1_000_000_000
HOUR = 3600 * NS
BASE = 1_700_000_000 * NS // HOUR * HOUR  # a slice boundary, in the past
ENGINE = {
    "engine": "vllm",
    "model": "m",
    "dp_rank": 0,
    "tp_rank": 0,
    "pp_rank": 0,
    "ep_rank": 0,
    "labels": "{}",
}
LES = (0.1, 0.5, math.inf)


def _counter(source: str, concept: str, points: list[tuple[int, float | None]]) -> pl.DataFrame:
    rows = [
        {"ts_ns": BASE + s * NS, "source": source, "concept": concept, "value": v, **ENGINE}
        for s, v in points
    ]
    return frame("engine_samples", rows)


def _buckets(source: str, points: list[tuple[int, float]]) -> pl.DataFrame:
    """A TTFT histogram whose ``le`` buckets hold 20 %, 70 %, 100 % of the count."""
    rows = [
        {"ts_ns": BASE + s * NS, "source": source, "concept": "ttft_seconds", "le": le,
         "cumulative_count": float(round(n * share)), **ENGINE}
        for s, n in points
        for le, share in zip(LES, (0.2, 0.7, 1.0), strict=True)
    ]  # fmt: skip
    return frame("histogram_buckets", rows)


def _tokens(k: int) -> float | None:
    """Series "a": +10 a second, a reset to 0 at 1,500 s and at 4,000 s, NULL at 2,000 s."""
    if k == 2000:
        return None
    return float(10 * (k % 1500 if k < 4000 else k - 4000))


def history(
    tokens: Callable[[int], float | None], *, seed: int, c_reset: int, h_reset: int
) -> list[tuple[str, pl.DataFrame]]:
    """The writes, in the order a sidecar, a late source and a backfill would make them: series
    "a" (``tokens``) held back and written late, "b" backwards from inside the windows, "c" with a
    gap then a reset at ``c_reset`` s, the histogram "h" reset at ``h_reset`` s, and a replay."""
    rnd = random.Random(seed)
    a = [(k, tokens(k)) for k in range(0, 5400, 5)]
    b = [(k, float(3 * k)) for k in range(2400, 5400, 7)]  # starts inside the later windows
    c = [(0, 5.0), (100, 7.0), (3000, 9.0), (c_reset, 2.0), (c_reset + 5, 6.0)]
    h = [(k, float(k // 3 if k < h_reset else (k - h_reset) // 2)) for k in range(0, 5400, 10)]
    writes: list[tuple[str, pl.DataFrame]] = []
    for lo in range(0, 5400, 600):  # forward in time, 10 minutes a write, every third point held back
        keep = [p for i, p in enumerate(a) if lo <= p[0] < lo + 600 and i % 3]
        writes.append(("engine_samples", _counter("a", "generation_tokens_total", keep)))
        writes.append(
            ("histogram_buckets", _buckets("h", [p for p in h if lo <= p[0] < lo + 600 and p[0] % 40]))
        )
    late = [p for i, p in enumerate(a) if not i % 3]
    rnd.shuffle(late)
    for i in range(0, len(late), 97):  # the held-back points, late and out of order
        writes.append(("engine_samples", _counter("a", "generation_tokens_total", late[i : i + 97])))
    writes.append(("histogram_buckets", _buckets("h", [p for p in h if not p[0] % 40][::-1])))
    writes.append(("engine_samples", _counter("b", "generation_tokens_total", b[::-1])))  # backwards
    writes.append(("engine_samples", _counter("c", "prompt_tokens_total", c)))
    writes.append(("engine_samples", _counter("a", "generation_tokens_total", a[100:300])))  # a replay
    return writes


def _history() -> list[tuple[str, pl.DataFrame]]:
    """ "c" has a gap longer than the look-back before its reset."""
    return history(_tokens, seed=7, c_reset=3005, h_reset=2600)


@pytest.fixture(scope="module", params=["scrapes", "rows", "numpy"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """The history written as the store chooses (batches shaped as scrapes on that path), again
    with every batch on the per-row path, and again with every batch on the numpy path."""
    import collector.increases as increases

    many, scrapes = increases.MANY, increases.SCRAPES
    increases.MANY = 1 if request.param == "numpy" else many
    increases.SCRAPES = scrapes if request.param == "scrapes" else 0
    try:
        st = _written(tmp_path_factory.mktemp("incr") / "s.duckdb")
    finally:
        increases.MANY, increases.SCRAPES = many, scrapes
    yield st
    st.close()


def _written(path: Path) -> Store:
    writes = _history()
    assert len(writes) == 26
    return write_history(path, writes)


def write_history(path: Path, writes: list[tuple[str, pl.DataFrame]]) -> Store:
    """``writes`` (a :func:`history`) written to a store at ``path``: the first 14 writes, both
    hours packed, 6 more, then the rest by a writer reopened on its file, which knows each series'
    last point again. Returns that writer, open."""
    with Store(path) as st:
        for table, rows in writes[:14]:
            st.write(table, rows)
        st.pack(BASE + 3 * HOUR)  # both hours packed: later points land before packed ones
        for table, rows in writes[14:20]:
            st.write(table, rows)
    st = Store(path)
    for table, rows in writes[20:]:
        st.write(table, rows)
    return st


def _lag_steps(st: Store, table: str, col: str) -> list[tuple[Any, ...]]:
    """Each point's ``(series_id, ts_ns, stored increase, step from lag)`` (collector.increases rule 1)."""
    return st.con.execute(
        f"""SELECT series_id, ts_ns, increase,
                   CASE WHEN lag(ts_ns) OVER w IS NULL THEN NULL WHEN lag({col}) OVER w IS NULL THEN 0
                        WHEN {col} >= lag({col}) OVER w THEN {col} - lag({col}) OVER w ELSE {col} END
            FROM {table}_points WINDOW w AS (PARTITION BY series_id ORDER BY ts_ns) ORDER BY ALL"""
    ).fetchall()


def test_every_stored_increase_is_the_step_from_the_previous_point(store: Store) -> None:
    for table, col in (("engine_samples", "value"), ("histogram_buckets", "cumulative_count")):
        rows = _lag_steps(store, table, col)
        assert len(rows) > 1000
        assert [r[:3] for r in rows] == [(*r[:2], r[3]) for r in rows]
    packed = store.con.execute("SELECT count(*), count(increase) FROM engine_samples_packed").fetchone()
    assert packed and packed[0] > 0 and packed[1] > 0  # the packed hour kept its increases
    stored = store.con.execute("SELECT count(*) FROM engine_samples").fetchone()
    assert stored == (len(range(0, 5400, 5)) + len(range(2400, 5400, 7)) + 5,)  # each point once


@contextmanager
def _path(kind: str) -> Iterator[None]:
    """Read through ``kind``: "wide" (lag over the views), "lag" (lag over the points), "sum"."""
    points, stored = latency._points_of, latency._stored_increases
    if kind == "wide":
        latency._points_of = lambda *a: False  # type: ignore[assignment]
    if kind == "lag":
        latency._stored_increases = lambda *a: False  # type: ignore[assignment]
    try:
        yield
    finally:
        latency._points_of, latency._stored_increases = points, stored


def _three(store: Store, fn: Callable[..., pl.DataFrame], **kw: Any) -> dict[str, pl.DataFrame]:
    out = {}
    with store.cursor() as cur:
        assert latency._stored_increases(cur, "engine_samples")
        for kind in ("wide", "lag", "sum"):
            with _path(kind):
                out[kind] = fn(cur, **kw)
    return out


def _same(a: pl.DataFrame, b: pl.DataFrame) -> None:
    value = a.columns[-1]
    assert a.columns == b.columns
    assert a.drop(value).to_dicts() == b.drop(value).to_dicts()
    assert a[value].to_list() == pytest.approx(b[value].to_list(), rel=1e-12, abs=1e-9, nan_ok=True)


# window edges: on a point, just after one, across the gap of series "c", the resets, the NULL, the
# late points, the first hour (packed) and its boundary, the start of series "b"
WINDOWS = [(0, 5400), (1500, 2000), (1495, 2005), (2000, 2400), (2401, 3599), (3590, 3610), (2990, 3020)]


@pytest.mark.parametrize(("lo", "hi"), WINDOWS)
@pytest.mark.parametrize("bin_s", [None, 30.0, 60.0])
def test_summed_increases_equal_the_lag_statement(
    store: Store, lo: int, hi: int, bin_s: float | None
) -> None:
    kw = {"start_ns": BASE + lo * NS, "end_ns": BASE + hi * NS, "bin_s": bin_s}
    got = _three(
        store, latency.counter_increases, concepts=["generation_tokens_total", "prompt_tokens_total"], **kw
    )
    assert got["wide"].height > 0
    _same(got["wide"], got["lag"])
    _same(got["wide"], got["sum"])
    hist = _three(store, latency.bucket_increases, concepts=["ttft_seconds"], **kw)
    assert hist["wide"].height > 0
    _same(hist["wide"], hist["lag"])
    _same(hist["wide"], hist["sum"])


def test_a_window_increase_by_hand(store: Store) -> None:
    """(1,490 s, 1,600 s] of series "a": from 14,900 to 14,950 (+50), the reset to 0 at 1,500 s
    (counts 0), then +10 a second to 1,000 at 1,600 s: 1,050. Series "c": its only point in the
    window's 120 s look-back is none, and none inside: nothing."""
    got = latency.counter_increases(
        store.con, BASE + 1490 * NS, BASE + 1600 * NS, ["generation_tokens_total"], keys=["a|vllm|0"]
    )
    assert got["increase"].to_list() == [1050.0]
    # (2,990 s, 3,020 s] of "c": 9 at 3,000 s follows 7 at 100 s, outside the look-back (counts 0);
    # the reset to 2 counts 2, then +4: 6
    got = latency.counter_increases(
        store.con, BASE + 2990 * NS, BASE + 3020 * NS, ["prompt_tokens_total"], keys=["c|vllm|0"]
    )
    assert got["increase"].to_list() == [6.0]


def test_a_schema_4_file_gets_its_increases_on_open(tmp_path: Path) -> None:
    """A file written before the column (made here by removing it) reads through ``lag`` opened
    read-only, and gets every point's step when opened for writing; both read the same."""
    path = tmp_path / "s.duckdb"
    with Store(path) as st:
        for table, rows in _history():
            st.write(table, rows)
        st.pack(BASE + 3 * HOUR)
        for t in ("engine_samples", "histogram_buckets"):
            st.con.execute(f"DROP VIEW {t}_points")
            st.con.execute(f"ALTER TABLE {t}_recent DROP COLUMN increase")
            st.con.execute(f"ALTER TABLE {t}_packed DROP COLUMN increase")
            st.con.execute(
                f"CREATE VIEW {t}_points AS SELECT * FROM {t}_recent UNION ALL "
                f"SELECT t.ts_ns, p.* EXCLUDE (tix) FROM {t}_packed AS p JOIN {t}_times AS t USING (tix)"
            )
        st.con.execute(f"UPDATE ioe_schema SET version = {SCHEMA_VERSION - 1}")
    kw = {"start_ns": BASE + 1495 * NS, "end_ns": BASE + 3610 * NS, "bin_s": 60.0}
    concepts = ["generation_tokens_total"]
    ro = Store(path, read_only=True)
    assert ro.schema_version() == SCHEMA_VERSION - 1
    with ro.cursor() as cur:
        assert not latency._stored_increases(cur, "engine_samples")
        before = latency.counter_increases(cur, concepts=concepts, **kw)
    ro.close()
    with Store(path) as st:
        assert st.schema_version() == SCHEMA_VERSION
        for table, col in (("engine_samples", "value"), ("histogram_buckets", "cumulative_count")):
            rows = _lag_steps(st, table, col)
            assert [r[:3] for r in rows] == [(*r[:2], r[3]) for r in rows]
        after = latency.counter_increases(st.con, concepts=concepts, **kw)
        assert latency._stored_increases(st.con, "engine_samples")
    assert before.height > 0
    _same(before, after)


def _scrape_rows(k: int, points: dict[str, float | None]) -> list[dict[str, Any]]:
    return [
        {"ts_ns": BASE + k * NS + i, "source": s, "concept": "generation_tokens_total", "value": v, **ENGINE}
        for i, (s, v) in enumerate(points.items())
    ]


@contextmanager
def _taken(path: list[bool]) -> Iterator[None]:
    """Records whether each call of ``LastPoints._in_scrapes`` took its batch."""
    from collector.increases import LastPoints

    in_scrapes = LastPoints._in_scrapes

    def spy(self: LastPoints, *a: Any) -> Any:
        got = in_scrapes(self, *a)
        path.append(got is not None)
        return got

    LastPoints._in_scrapes = spy  # type: ignore[method-assign]
    try:
        yield
    finally:
        LastPoints._in_scrapes = in_scrapes  # type: ignore[method-assign]


def test_a_sidecars_scrapes_take_the_one_point_per_series_path(tmp_path: Path) -> None:
    """One point per series a write, each newer than the last (the sidecar's scrapes): the
    increases come from the remembered last points, across a reset, a NULL and a reopen."""
    taken: list[bool] = []
    with _taken(taken):
        path = tmp_path / "s.duckdb"
        st = Store(path)
        for k in range(60):
            if k == 30:
                st.close()
                st = Store(path)
            points = {"x": float(k * 7 % 100), "y": None if k == 20 else float(k), "z": float(k // 2)}
            st.write("engine_samples", frame("engine_samples", _scrape_rows(k, points)))
        rows = _lag_steps(st, "engine_samples", "value")
        assert len(rows) == 180 and [r[:3] for r in rows] == [(*r[:2], r[3]) for r in rows]
        st.close()
    assert taken.count(True) >= 59  # every write (the first after the reopen once its points are loaded)


def test_a_flush_of_several_scrapes_takes_the_scrapes_path(tmp_path: Path) -> None:
    """The writer's flush: ten scrapes of two targets one after the other in one batch, the
    targets' order changing, a series missing from some scrapes and new in the middle, a reset
    and a NULL. Each stored step must equal ``lag()``'s (a step taken across the wrong point, or
    one lost at a scrape boundary, changes it), and no flush may need numpy."""
    taken: list[bool] = []
    with _taken(taken):
        st = Store(tmp_path / "s.duckdb")
        for flush in range(6):
            parts = []
            for k in range(flush * 10, flush * 10 + 10):
                first = {"x": float(k * 7 % 100), "y": None if k == 23 else float(k)}
                second = {"z": float(k // 2)} | ({"w": float(3 * k)} if k >= 15 and k % 4 else {})
                scrapes = [first, second] if k % 3 else [second, first]
                parts += [r for p in scrapes for r in _scrape_rows(k, p)]
            st.write("engine_samples", frame("engine_samples", parts))
        rows = _lag_steps(st, "engine_samples", "value")
        assert len(rows) == 60 * 3 + sum(1 for k in range(15, 60) if k % 4)
        assert [r[:3] for r in rows] == [(*r[:2], r[3]) for r in rows]
        st.close()
    assert taken and all(taken)  # neither the per-row path nor numpy


def test_a_flush_of_one_targets_scrapes_takes_each_step_by_position(tmp_path: Path) -> None:
    """One target's scrapes back to back in each flush (the same series run after run, taken by
    position from the run before): across a reset, NULLs (two in a row, one at a flush's edge)
    and flushes, each stored step equals ``lag()``'s."""
    taken: list[bool] = []
    with _taken(taken):
        st = Store(tmp_path / "s.duckdb")
        for flush in range(4):
            parts = []
            for k in range(flush * 10, flush * 10 + 10):
                points = {"x": float(k * 7 % 100), "y": None if k in (13, 14, 19, 20) else float(k)}
                parts += _scrape_rows(k, points | {"z": float(k // 2)})
            st.write("engine_samples", frame("engine_samples", parts))
        rows = _lag_steps(st, "engine_samples", "value")
        assert len(rows) == 40 * 3 and [r[:3] for r in rows] == [(*r[:2], r[3]) for r in rows]
        st.close()
    assert taken and all(taken)


@pytest.mark.parametrize("keys", [None, ["a|vllm|0", "c|vllm|0"]])
def test_a_report_sums_every_counter_once_and_each_call_takes_its_own(store: Store, keys: Any) -> None:
    """Inside ``shared_reads`` every concept of the window is summed once; each call gets the
    same rows as alone."""
    start, end = BASE + 2990 * NS, BASE + 3610 * NS
    calls = [
        ["generation_tokens_total"],
        ["prompt_tokens_total"],
        ["prompt_tokens_total", "generation_tokens_total"],
    ]
    alone = [latency.counter_increases(store.con, start, end, c, keys=keys, bin_s=60.0) for c in calls]
    with latency.shared_reads():
        shared = [latency.counter_increases(store.con, start, end, c, keys=keys, bin_s=60.0) for c in calls]
    for a, b in zip(alone, shared, strict=True):
        assert a.height > 0
        _same(a, b)


def test_a_report_regroups_finer_bins_it_has_already_summed(store: Store) -> None:
    """Rule 10 of analyzer.latency: after 60 s bins of (start, end], the whole window and a
    shorter window from the same start come from those bins, equal to reading them alone."""
    start = BASE + 2990 * NS
    asks = [
        (start + 1200 * NS, 60.0),
        (start + 1200 * NS, None),
        (start + 600 * NS, None),
        (start + 600 * NS, 120.0),
    ]
    assert_regrouped(store, start, asks)


def assert_regrouped(store: Store, start: int, asks: list[tuple[int, float | None]], **kw: Any) -> None:
    """Each ``(end, bin_s)`` window from ``start``, read one after another inside one report
    (latency rule 8), equals the same window read alone, for buckets and counters (``kw``: the
    readers' other arguments)."""
    for fn, concepts in (
        (latency.bucket_increases, {"concepts": ["ttft_seconds"]}),
        (latency.counter_increases, {"concepts": ["generation_tokens_total", "prompt_tokens_total"]}),
    ):
        alone = [fn(store.con, start, end, bin_s=b, **concepts, **kw) for end, b in asks]
        with latency.shared_reads():
            shared = [fn(store.con, start, end, bin_s=b, **concepts, **kw) for end, b in asks]
        for a, b in zip(alone, shared, strict=True):
            assert a.height > 0
            _same(a, b)


def test_a_backfill_of_closed_slices_packs_points_with_their_increases(tmp_path: Path) -> None:
    """``Store.write_closed`` forward in time packs each batch at once (fresh slices); a batch
    written after them into the past is late and repaired. Every stored step is the lag step."""
    with Store(tmp_path / "s.duckdb") as st:
        for hour in range(3):  # forward: each batch in slices holding no point yet
            pts = [
                (k, float(10 * k if k < 5000 else k - 5000))
                for k in range(hour * 3600, (hour + 1) * 3600, 15)
            ]
            st.write_closed("engine_samples", _counter("a", "generation_tokens_total", pts))
        packed = st.con.execute("SELECT count(*), count(increase) FROM engine_samples_packed").fetchone()
        assert packed == (720, 719)  # straight into the packed form, only the first point unknown
        early = [(k, float(k)) for k in range(-3600 + 7, 0, 15)]
        st.write_closed("engine_samples", _counter("a", "generation_tokens_total", early[::-1]))
        rows = _lag_steps(st, "engine_samples", "value")
        assert len(rows) == 720 + len(early)
        assert [r[:3] for r in rows] == [(*r[:2], r[3]) for r in rows]
