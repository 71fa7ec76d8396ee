"""Packed slices sorted by time chunk (collector.series rules 5-7): a large slice's rows go chunk
after chunk, so a window reads the chunks it overlaps; a small slice stays one chunk; a file
packed before (whole-slice series runs) is packed again when opened for writing; every reader
sees the same rows and the same report.

Inputs are hand-built (values chosen so a lost, doubled or moved point changes a count or a sum)
or the API tests' store (``api_store``: hand-built telemetry of one deployment).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest
from api_store import END_NS, START_NS, build
from test_store_pack import _rows_scanned

from analyzer.deployments import list_deployments
from analyzer.point_bins import binned_points
from analyzer.report import deployment_report
from analyzer.thresholds import Thresholds
from collector import series
from collector.batch import Batch
from collector.records import TABLES, batch
from collector.store import SCHEMA_VERSION, Store

NS = 1_000_000_000
HOUR = 3600 * NS
BASE = 1_700_000_000 * NS // HOUR * HOUR  # a slice boundary, in the past
RAW = [name for name, spec in TABLES.items() if spec.values]


def _hour(n_series: int, step_s: int, part: int = 0, parts: int = 1) -> Batch:
    """One hour of ``n_series`` power series, a point every ``step_s`` (value = series * 1e4 +
    the point's index in the hour), or its ``part``-th of ``parts`` equal time spans."""
    k = np.arange(3600 // step_s, dtype=np.int64)
    k = k[part * len(k) // parts : (part + 1) * len(k) // parts]
    sid = np.tile(np.arange(n_series, dtype=np.int64), len(k))
    ts = np.repeat(BASE + k * step_s * NS, n_series)
    return batch(
        "gpu_samples",
        {
            "ts_ns": ts,
            "host": ["node0"] * len(ts),
            "uuid": [f"GPU-{i}" for i in sid.tolist()],
            "metric": ["power_w"] * len(ts),
            "value": (sid * 10_000 + np.repeat(k, n_series)).astype(np.float64),
        },
    )


def _snapshot(store: Store) -> dict[str, list[tuple[object, ...]]]:
    with store.cursor() as cur:
        return {t: cur.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in RAW}


def _chunks_in_row_order(con: duckdb.DuckDBPyConnection, chunk_ns: int) -> list[int]:
    """The chunk of each packed GPU row, in the order the rows are stored (rowid)."""
    rows = con.execute(
        f"SELECT t.ts_ns // {chunk_ns} FROM gpu_samples_packed AS p JOIN gpu_samples_times AS t "
        "USING (tix) ORDER BY p.rowid"
    ).fetchall()
    return [int(r[0]) for r in rows]


def test_a_large_slice_is_packed_in_5_minute_chunks_and_a_window_reads_its_chunks(tmp_path: Path) -> None:
    """1,000 series a second for an hour (a backfill): 3.6 M points, 300,000 a 5-minute chunk
    (over CHUNK_ROWS, about 2.4 row groups), stored chunk after chunk, series by series inside a
    chunk. A 15-minute window (three chunks) reads at most its chunks' rows and the two row
    groups its ends share with neighbours, well under half the hour (whole-hour series runs
    read all of it), and counts and sums exactly its points."""
    path = tmp_path / "s.duckdb"
    with Store(path) as store:
        assert store.write_closed("gpu_samples", _hour(1000, 1)) == 3_600_000
    con = duckdb.connect(str(path), read_only=True)
    order = _chunks_in_row_order(con, min(series.CHUNKS_NS))
    assert order == sorted(order) and len(set(order)) == 12
    first = con.execute("SELECT series_id FROM gpu_samples_packed ORDER BY rowid LIMIT 1000").fetchall()
    assert [s for (s,) in first] == [i // 300 for i in range(1000)]  # one run a series and chunk
    lo, hi = BASE + 1800 * NS, BASE + 2700 * NS
    sql = f"SELECT count(*), sum(value) FROM gpu_samples_points WHERE ts_ns >= {lo} AND ts_ns < {hi}"
    got = con.execute(sql).fetchone()
    con.close()
    scanned = _rows_scanned(path, sql, "gpu_samples_packed", tmp_path)
    assert 900_000 <= scanned <= 900_000 + 2 * 122_880 < 3_600_000 // 2
    assert got == (900_000, float(sum(s * 10_000 * 900 + sum(range(1800, 2700)) for s in range(1000))))


def test_a_pass_packs_as_a_backfill_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same hour appended as a collector writes it, then packed by a pass (the live path),
    and written packed at once: the same rows, stored in the same chunk order. (CHUNK_ROWS
    lowered: 100 series a second are 30,000 points a 5-minute chunk.)"""
    monkeypatch.setattr(series, "CHUNK_ROWS", 10_000)
    closed, live = Store(tmp_path / "closed.duckdb"), Store(tmp_path / "live.duckdb")
    assert closed.write_closed("gpu_samples", _hour(100, 1)) == 360_000
    for part in range(4):  # in time order
        live.write("gpu_samples", _hour(100, 1, part, 4))
    assert live.pack(BASE + 2 * HOUR)["packed_gpu_samples"] == 360_000
    assert _snapshot(closed) == _snapshot(live)
    stored = []
    for store in (closed, live):
        with store.cursor() as cur:
            stored.append(
                cur.execute("SELECT series_id, tix FROM gpu_samples_packed ORDER BY rowid").fetchall()
            )
        order = _chunks_in_row_order(store.con, min(series.CHUNKS_NS))
        assert order == sorted(order) and len(set(order)) == 12
        store.close()
    assert stored[0] == stored[1]


def test_a_small_slice_stays_one_chunk_of_series_runs(tmp_path: Path) -> None:
    """200 series every 5 s (144,000 points, under 12 × and 4 × CHUNK_ROWS): one run a series
    over the whole hour, as before chunks (the density of one node's store is unchanged)."""
    store = Store(tmp_path / "s.duckdb")
    store.write_closed("gpu_samples", _hour(200, 5))
    with store.cursor() as cur:
        rows = cur.execute("SELECT series_id FROM gpu_samples_packed ORDER BY rowid").fetchall()
    assert [r[0] for r in rows] == [i // 720 for i in range(144_000)]
    store.close()


def test_a_file_packed_in_whole_slice_runs_is_packed_in_chunks_when_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule 7: a schema-6 file (its packed hour stored series by series over the whole hour, as
    packing did then, and a late point waiting in T_recent), opened for writing: migrated to
    schema 7, its rows sorted by chunk, none lost or moved, the late point in its slice.
    Read-only it is read as it is. (CHUNK_ROWS lowered: 100 series a second are 30,000 points a
    5-minute chunk.)"""
    monkeypatch.setattr(series, "CHUNK_ROWS", 10_000)
    path = tmp_path / "v6.duckdb"
    with Store(path) as store:
        store.write_closed("gpu_samples", _hour(100, 1))
    con = duckdb.connect(str(path))
    con.execute(  # the schema-6 order: series, then time, over the whole slice
        "CREATE TEMP TABLE old AS SELECT * FROM gpu_samples_packed ORDER BY series_id, "
        "CASE WHEN series_id % 2 = 0 THEN tix ELSE -tix END"
    )
    con.execute("DELETE FROM gpu_samples_packed")
    con.execute("INSERT INTO gpu_samples_packed SELECT * FROM old")
    con.execute(f"INSERT INTO gpu_samples_recent VALUES ({BASE + 7 * NS + NS // 2}, 5, 0.5)")
    con.execute(f"UPDATE ioe_schema SET version = {SCHEMA_VERSION - 1}")
    con.close()
    with Store(path, read_only=True) as reader:
        assert reader.schema_version() == SCHEMA_VERSION - 1
        before = _snapshot(reader)
        assert len(before["gpu_samples"]) == 360_001
        order = _chunks_in_row_order(reader.con, min(series.CHUNKS_NS))
        assert order != sorted(order)
    with Store(path) as store:
        assert store.schema_version() == SCHEMA_VERSION
        assert _snapshot(store) == before
        order = _chunks_in_row_order(store.con, min(series.CHUNKS_NS))
        assert order == sorted(order) and len(order) == 360_001 and len(set(order)) == 12
        assert store.con.execute("SELECT count(*) FROM gpu_samples_recent").fetchone() == (0,)


def test_a_small_slice_of_an_older_file_is_left_as_it_is_when_opened(tmp_path: Path) -> None:
    """Rule 7: a schema-6 file whose packed hour is under any chunk's points (200 series every
    5 s: 144,000) is stored in rule 5's order already; opening it for writing stamps schema 7
    without packing the slice again (the late point stays recent for the next pass) and every
    row reads the same."""
    path = tmp_path / "v6.duckdb"
    with Store(path) as store:
        store.write_closed("gpu_samples", _hour(200, 5))
    con = duckdb.connect(str(path))
    con.execute(f"INSERT INTO gpu_samples_recent VALUES ({BASE + 7 * NS + NS // 2}, 5, 0.5)")
    con.execute(f"UPDATE ioe_schema SET version = {SCHEMA_VERSION - 1}")
    con.close()
    with Store(path, read_only=True) as reader:
        before = _snapshot(reader)
    assert len(before["gpu_samples"]) == 144_001 < series.chunked_points()
    with Store(path) as store:
        assert store.schema_version() == SCHEMA_VERSION
        assert _snapshot(store) == before
        assert store.con.execute("SELECT count(*) FROM gpu_samples_recent").fetchone() == (1,)


@pytest.fixture(scope="module")
def reports() -> tuple[dict[str, object], dict[str, object]]:
    """The API store's report read from its time-ordered points (T_recent), then again once every
    slice is packed in 5-minute chunks (CHUNK_ROWS lowered so its small hours are chunked)."""
    st = build()
    th = Thresholds()
    with st.cursor() as cur:
        dep = list_deployments(cur)[0]
        before = deployment_report(cur, dep, START_NS, END_NS, th)
    keep = series.CHUNK_ROWS
    series.CHUNK_ROWS = 1
    try:
        packed = st.pack(END_NS + 2 * HOUR)
    finally:
        series.CHUNK_ROWS = keep
    assert packed["packed_histogram_buckets"] > 0 and packed["packed_gpu_samples"] > 0
    with st.cursor() as cur:
        assert cur.execute("SELECT count(*) FROM histogram_buckets_recent").fetchone() == (0,)
        after = deployment_report(cur, dep, START_NS, END_NS, th)
    st.close()
    return before, after


def test_the_report_over_chunked_slices_equals_the_report_over_recent_points(
    reports: tuple[dict[str, object], dict[str, object]],
) -> None:
    """The same rows read through another physical order: the same report, up to the order
    DuckDB adds floats in."""
    before, after = reports

    def rounded(x: object) -> object:
        if isinstance(x, float):
            return round(x, 9)
        if isinstance(x, dict):
            return {k: rounded(v) for k, v in x.items()}
        if isinstance(x, list):
            return [rounded(v) for v in x]
        return x

    assert rounded(after) == rounded(before)


def test_binned_points_are_the_views_points_with_their_bins(tmp_path: Path) -> None:
    """analyzer.point_bins: packed points (bins from T_times) and recent ones (a late point of a
    packed timestamp and one of a new time) are the rows the view T_points gives the same window,
    with the bin computed per point."""
    store = Store(tmp_path / "s.duckdb")
    store.write_closed("gpu_samples", _hour(50, 10))
    late = {"host": ["node0"] * 2, "metric": ["power_w"] * 2, "value": [0.25, 0.5]}
    late |= {"ts_ns": [BASE + 600 * NS, BASE + 605 * NS], "uuid": ["GPU-60", "GPU-3"]}
    assert store.write("gpu_samples", batch("gpu_samples", late)) == 2  # into T_recent
    lo, hi, width = BASE + 290 * NS, BASE + 1500 * NS, 60 * NS
    bin_of = f"({-lo - 1} + ts_ns) // {width}"
    for ids in (None, (3, 60)):
        where = "" if ids is None else f" AND series_id BETWEEN {ids[0]} AND {ids[1]}"
        want = store.con.execute(
            f"SELECT series_id, {bin_of}, ts_ns, value FROM gpu_samples_points "
            f"WHERE ts_ns > {lo} AND ts_ns <= {hi}{where} ORDER BY ALL"
        ).fetchall()
        got = store.con.execute(
            f"SELECT * FROM {binned_points('gpu_samples', 'value', lo, hi, bin_of, ids)} ORDER BY ALL"
        )
        assert got.fetchall() == want and len(want) > 100
        assert (50, 5, BASE + 600 * NS, 0.25) in want and any(r[2] == BASE + 605 * NS for r in want)
    store.close()
