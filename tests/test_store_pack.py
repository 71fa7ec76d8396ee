"""Packed points (collector.series rules 4-6, Store.pack): closed hour slices move out of the
time-ordered ``T_recent`` into ``T_packed`` + ``T_times``, and every reader sees the same rows.

Inputs are hand-built: series named by index, values chosen so a lost, doubled or moved point
changes a count or a sum.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest
from killing import kill_during

from collector import compaction, series
from collector.records import TABLES, batch
from collector.store import PACK_GRACE_NS, SCHEMA_VERSION, STORAGE_VERSION, Retention, Store

NS = 1_000_000_000
HOUR = 3600 * NS
BASE = 1_700_000_000 * NS // HOUR * HOUR  # a slice boundary, in the past
FUTURE = 2_000_000_000 * NS // HOUR * HOUR  # one a close does not pack (2033)
RAW = [name for name, spec in TABLES.items() if spec.values]


def _gpu(hour: int, n_series: int = 20, step_s: int = 60, offset_s: int = 0, base: int = BASE) -> object:
    ts = [base + hour * HOUR + (offset_s + k * step_s) * NS for k in range(3600 // step_s)]
    return batch(
        "gpu_samples",
        {
            "ts_ns": [t for t in ts for _ in range(n_series)],
            "host": ["node0"] * (len(ts) * n_series),
            "uuid": [f"GPU-{s}" for _ in ts for s in range(n_series)],
            "metric": ["power_w"] * (len(ts) * n_series),
            "value": [float(s * 1000 + k) for k in range(len(ts)) for s in range(n_series)],
        },
    )


def _engine(hour: int) -> object:
    ts = [BASE + hour * HOUR + k * 30 * NS for k in range(120)]
    n = len(ts)
    return batch(
        "engine_samples",
        {
            "ts_ns": ts * 2,
            "source": ["vllm"] * 2 * n,
            "engine": ["vllm"] * 2 * n,
            "model": ["m"] * 2 * n,
            "concept": ["requests_running"] * n + ["prompt_tokens_total"] * n,
            "value": [float(k % 9) for k in range(n)] + [float(10 * k) for k in range(n)],
            "rate_per_s": [None] * n + [0.33] * n,
        },
    )


def _snapshot(store: Store) -> dict[str, list[tuple[object, ...]]]:
    with store.cursor() as cur:
        return {t: cur.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in RAW}


def _count(store: Store, table: str) -> int:
    with store.cursor() as cur:
        got = cur.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(got[0]) if got else 0


def test_packing_keeps_every_row_and_late_points_join_their_slice(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    for hour in range(3):
        store.write("gpu_samples", _gpu(hour))
        store.write("engine_samples", _engine(hour))
    before = _snapshot(store)
    # hour 2 is still open: it ends at BASE + 3 h, and is closed PACK_GRACE_NS later
    done = store.pack(BASE + 3 * HOUR + PACK_GRACE_NS - 1)
    assert done["packed_gpu_samples"] == 2 * 60 * 20 and done["packed_engine_samples"] == 2 * 240
    assert _snapshot(store) == before
    assert _count(store, "gpu_samples_recent") == 60 * 20
    # a late point of packed hour 0 and a replay of packed points
    late = _gpu(0, n_series=1, step_s=3600, offset_s=30)
    assert store.write("gpu_samples", late) == 1
    assert store.write("gpu_samples", _gpu(1)) == 0  # every key already stored (packed)
    after_late = _snapshot(store)
    assert len(after_late["gpu_samples"]) == len(before["gpu_samples"]) + 1
    done = store.pack(BASE + 4 * HOUR)  # hour 0 again (its late point) and hour 2
    assert done["packed_gpu_samples"] == 1 + 60 * 20
    assert _snapshot(store) == after_late
    assert _count(store, "gpu_samples_recent") == 0
    with store.cursor() as cur:
        times = cur.execute(
            "SELECT count(*), count(DISTINCT tix), count(DISTINCT ts_ns) FROM gpu_samples_times"
        )
        assert times.fetchone() == (3 * 60 + 1,) * 3  # one row per distinct timestamp
    store.close()
    with Store(tmp_path / "s.duckdb", read_only=True) as reader:
        assert _snapshot(reader) == after_late


def test_packed_runs_are_sorted_by_series_and_alternate_in_time(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    store.write("gpu_samples", _gpu(0, n_series=3))
    store.pack(BASE + 2 * HOUR)
    with store.cursor() as cur:
        rows = cur.execute("SELECT series_id, tix FROM gpu_samples_packed").fetchall()
    assert [s for s, _ in rows] == sorted(s for s, _ in rows)
    for sid in range(3):
        run = [t for s, t in rows if s == sid]
        assert run == sorted(run, reverse=sid % 2 == 1)
    store.close()


def test_a_slices_series_are_packed_in_their_places(tmp_path: Path) -> None:
    """collector.series rule 5's places: constant series first, then by the decimals their values
    need (most first), then by magnitude (smallest first), then by id; runs alternate direction
    by place; every point reads as before. Series 0-5 (ids in the order first written): 0 whole
    numbers 100-159; 1 always 0; 2 six decimals (0.123456 up); 3 always 2619; 4 two decimals
    (0.00-0.45); 5 whole numbers 10-16. Places: 1 and 3 (constant; 0 is the smaller), 2 (six
    decimals), 4 (two), 5 (whole, tens), 0 (whole, hundreds)."""
    values = [
        lambda k: float(100 + k),
        lambda k: 0.0,
        lambda k: 0.123456 + k * 1e-6,
        lambda k: 2619.0,
        lambda k: round(0.05 * (k % 10), 2),
        lambda k: float(10 + k % 7),
    ]
    ts = [BASE + k * 60 * NS for k in range(60)]
    rows = batch(
        "gpu_samples",
        {
            "ts_ns": [t for t in ts for _ in values],
            "host": ["node0"] * (60 * len(values)),
            "uuid": [f"GPU-{s}" for _ in ts for s in range(len(values))],
            "metric": ["m"] * (60 * len(values)),
            "value": [f(k) for k in range(60) for f in values],
        },
    )
    store = Store(tmp_path / "s.duckdb")
    store.write("gpu_samples", rows)
    before = _snapshot(store)
    store.pack(BASE + 2 * HOUR)
    assert _count(store, "gpu_samples_recent") == 0 and _snapshot(store) == before
    with store.cursor() as cur:
        ids = dict(cur.execute("SELECT uuid, series_id FROM gpu_samples_series").fetchall())
        packed = cur.execute("SELECT series_id, tix FROM gpu_samples_packed ORDER BY rowid").fetchall()
    store.close()
    places = [ids[f"GPU-{s}"] for s in (1, 3, 2, 4, 5, 0)]
    assert [s for s, _ in packed] == [s for s in places for _ in range(60)]
    for place, sid in enumerate(places):
        run = [t for s, t in packed if s == sid]
        assert run == sorted(run, reverse=place % 2 == 1)


def test_maintenance_packs_and_retention_deletes_from_both_forms(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    for hour in range(3):
        store.write("gpu_samples", _gpu(hour))
    now = BASE + 3 * HOUR + PACK_GRACE_NS
    done = store.maintain(now, Retention(raw_s=10 * 86400))
    assert done["packed_gpu_samples"] == 3 * 60 * 20
    assert _count(store, "gpu_samples_1m") == 3 * 60 * 20  # rollups read packed points too
    rolled = store.con.execute("SELECT sum(n), sum(avg) FROM gpu_samples_1m").fetchone()
    assert rolled == (3 * 60 * 20, 3 * sum(float(s * 1000 + k) for k in range(60) for s in range(20)))
    # keep the last 90 minutes: hour 0 and the first half of hour 1 go, from the packed form
    done = store.maintain(now, Retention(raw_s=(PACK_GRACE_NS + 90 * 60 * NS) / NS))
    assert done["deleted_gpu_samples"] == 60 * 20 + 30 * 20
    assert _count(store, "gpu_samples") == 90 * 20
    with store.cursor() as cur:
        orphan = cur.execute(
            "SELECT count(*) FROM gpu_samples_packed ANTI JOIN gpu_samples_times USING (tix)"
        )
        assert orphan.fetchone() == (0,)
    # the rollups written before are kept (their own retention)
    assert _count(store, "gpu_samples_1m") == 3 * 60 * 20
    store.close()


def test_closing_a_file_packs_its_closed_slices(tmp_path: Path) -> None:
    """``ioe ingest`` runs no maintenance: closing the store packs what it imported."""
    path = tmp_path / "s.duckdb"
    with Store(path) as store:
        store.write("gpu_samples", _gpu(0))
        before = _snapshot(store)
    with Store(path) as store:
        assert _count(store, "gpu_samples_recent") == 0
        assert _count(store, "gpu_samples_packed") == 60 * 20
        assert _snapshot(store) == before


def test_a_schema_3_file_keeps_its_points_and_gets_the_packed_layout(tmp_path: Path) -> None:
    """A file of the previous layout: ``gpu_samples_points`` a table, version 3 stamped."""
    path = tmp_path / "v3.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE ioe_schema (version INTEGER, applied_ns BIGINT)")
    con.execute("INSERT INTO ioe_schema VALUES (3, 0)")
    spec = TABLES["gpu_samples"]
    cols = ", ".join(f"{c} {t}" for c, t in spec.columns if c in spec.series_columns)
    con.execute(f"CREATE TABLE gpu_samples_series (series_id BIGINT PRIMARY KEY, {cols})")
    con.execute(
        "CREATE TABLE gpu_samples_points (ts_ns BIGINT NOT NULL, series_id BIGINT NOT NULL, value DOUBLE)"
    )
    con.execute(
        "INSERT INTO gpu_samples_series (series_id, host, uuid, metric) VALUES (0, 'n', 'G0', 'power_w')"
    )
    con.execute(f"INSERT INTO gpu_samples_points SELECT {BASE} + i * {NS}, 0, i FROM range(100) AS r(i)")
    con.close()
    with Store(path) as store:
        assert store.schema_version() == SCHEMA_VERSION
        kinds = dict(
            store.con.execute("SELECT table_name, table_type FROM information_schema.tables").fetchall()
        )
        assert kinds["gpu_samples_points"] == "VIEW" and kinds["gpu_samples_recent"] == "BASE TABLE"
        got = store.con.execute("SELECT count(*), sum(value), min(uuid) FROM gpu_samples").fetchone()
        assert got == (100, float(sum(range(100))), "G0")
    with Store(path) as store:  # packed at the close before
        assert _count(store, "gpu_samples_packed") == 100
        got = store.con.execute("SELECT count(*), sum(value), min(ts_ns) FROM gpu_samples").fetchone()
        assert got == (100, float(sum(range(100))), BASE)


def _rows_scanned(path: Path, sql: str, table: str, tmp: Path) -> int:
    """Rows DuckDB's scan of ``table`` read for ``sql`` (its own profiler)."""
    con = duckdb.connect(str(path), read_only=True)
    out = tmp / "profile.json"
    con.execute("PRAGMA enable_profiling='json'")
    con.execute(f"SET profiling_output='{out}'")
    con.execute(
        "PRAGMA custom_profiling_settings='"
        '{"OPERATOR_ROWS_SCANNED": "true", "OPERATOR_NAME": "true", "EXTRA_INFO": "true"}\''
    )
    con.execute(sql).fetchall()
    con.execute("PRAGMA disable_profiling")
    con.close()
    found: list[int] = []

    def walk(node: dict[str, Any]) -> None:
        info = node.get("extra_info") or {}
        if isinstance(info, dict) and str(info.get("Table", "")).endswith(table):
            found.append(int(node.get("operator_rows_scanned") or 0))
        for child in node.get("children") or []:
            walk(child)

    walk(json.loads(out.read_text()))
    assert found, f"no scan of {table} in the profile"
    return sum(found)


def test_a_time_window_reads_only_the_packed_slices_it_overlaps(tmp_path: Path) -> None:
    """Four hours of 200 series every 5 s: 144,000 points a slice, more than a row group (122,880
    rows). A 15-minute window inside hour 2 reads at most the two row groups hour 2 spans."""
    path = tmp_path / "s.duckdb"
    store = Store(path)
    for hour in range(4):
        store.write("gpu_samples", _gpu(hour, n_series=200, step_s=5))
    store.pack(BASE + 5 * HOUR)
    store.close()
    # rewritten without the blocks packing freed, as a closed file with many is
    # (collector.compaction): the copy keeps the packed rows' order, so each row group still
    # holds one slice's tix range
    compaction.compact(path, STORAGE_VERSION)
    con = duckdb.connect(str(path), read_only=True)
    assert con.execute("SELECT free_blocks FROM pragma_database_size()").fetchone() == (0,)
    con.close()
    lo, hi = BASE + 2 * HOUR + 600 * NS, BASE + 2 * HOUR + 1500 * NS
    for sql in (
        f"SELECT count(*), sum(value) FROM gpu_samples_points WHERE ts_ns >= {lo} AND ts_ns < {hi}",
        f"SELECT count(*), sum(value) FROM gpu_samples "
        f"WHERE ts_ns >= {lo} AND ts_ns < {hi} AND uuid = 'GPU-3'",
    ):
        scanned = _rows_scanned(path, sql, "gpu_samples_packed", tmp_path)
        assert 0 < scanned <= 2 * 122_880 < 4 * 144_000
    con = duckdb.connect(str(path), read_only=True)
    got = con.execute(f"SELECT count(*) FROM gpu_samples WHERE ts_ns >= {lo} AND ts_ns < {hi}").fetchone()
    con.close()
    assert got == (180 * 200,)


_PACKER = """
import sys
from collector.store import Store
store = Store(sys.argv[1], threads=1)
print("packing", flush=True)
store.pack(int(sys.argv[2]))
print("packed", flush=True)
store.close()
"""


@pytest.mark.parametrize("delay_s", [0.05, 0.8, 2.0])
def test_a_kill_during_packing_loses_no_point(tmp_path: Path, delay_s: float) -> None:
    """SIGKILL at some moment of packing a slice of 1.2 M points: reopened, the store holds every
    point exactly once, in one form or the other (rule 2 of Store.pack)."""
    path = tmp_path / "s.duckdb"
    with Store(path) as store:
        for part in range(6):  # in the future of the close: nothing is packed yet
            store.write("gpu_samples", _gpu(0, n_series=1000, step_s=18, offset_s=3 * part, base=FUTURE))
        expected = store.con.execute(
            "SELECT count(*), sum(value), sum(ts_ns % 1000003) FROM gpu_samples"
        ).fetchone()
    assert expected is not None and expected[0] == 6 * 200 * 1000
    kill_during(_PACKER, [str(path), str(FUTURE + 2 * HOUR)], b"packing", delay_s)
    with Store(path, read_only=True) as reader:
        got = reader.con.execute(
            "SELECT count(*), sum(value), sum(ts_ns % 1000003) FROM gpu_samples"
        ).fetchone()
        dupes = reader.con.execute(
            "SELECT count(*) FROM "
            "(SELECT ts_ns, series_id FROM gpu_samples_points GROUP BY ALL HAVING count(*) > 1)"
        ).fetchone()
    assert got == expected and dupes == (0,)


def _write_buckets(store: Store, n: int) -> tuple[object, ...]:
    """An hour of ``n`` histogram bucket series at 1 Hz from BASE, 360 scrapes a write; returns
    the count and sum every packing must keep."""
    for part in range(10):
        ks = range(part * 360, (part + 1) * 360)
        rows = {
            "ts_ns": [BASE + k * NS for k in ks for _ in range(n)],
            "source": ["vllm"] * (360 * n),
            "engine": ["vllm"] * (360 * n),
            "model": ["m"] * (360 * n),
            "concept": [f"c{s // 20}" for _ in ks for s in range(n)],
            "le": [float(s % 20) for _ in ks for s in range(n)],
            "cumulative_count": [float(k * (s % 20)) for k in ks for s in range(n)],
        }
        store.write("histogram_buckets", batch("histogram_buckets", rows))
    got = store.con.execute("SELECT count(*), sum(cumulative_count) FROM histogram_buckets").fetchone()
    assert got is not None and got[0] == 3600 * n
    return got


def _packed_rows(store: Store, table: str) -> tuple[object, ...]:
    """The packed rows of ``table`` and their times, by their place in the table (``rowid``)."""
    got = store.con.execute(
        f"SELECT count(*), sum(hash(rowid, series_id, tix, cumulative_count, increase)), "
        f"(SELECT sum(hash(rowid, tix, ts_ns)) FROM {table}_times) FROM {table}_packed"
    ).fetchone()
    assert got is not None
    return got


def test_an_hour_is_packed_under_a_collectors_memory_cap(tmp_path: Path) -> None:
    """The collector-only sidecar caps DuckDB at 32MB; an hour of one node's histogram buckets
    (~2.9 M points) is larger. Here 720,000 points (under collector.series.chunked_points: one
    chunk, one transaction) under a 22MB cap: the sort spills, nothing is held aside in memory,
    and every point is kept. (16MB held this sort until the points kept their increase, 8 more
    bytes a point in the sort: it then failed at 16MB and passed at 18MB; with the series' places
    (collector.series rule 5: one more join) it fails at 20MB and passes at 21MB.)"""
    store = Store(tmp_path / "s.duckdb", threads=1, memory_limit="22MB")
    expected = _write_buckets(store, 200)
    assert store.pack(BASE + 2 * HOUR)["packed_histogram_buckets"] == 3600 * 200
    assert (
        store.con.execute("SELECT count(*), sum(cumulative_count) FROM histogram_buckets").fetchone()
        == expected
    )
    assert _count(store, "histogram_buckets_recent") == 0
    store.close()


def test_a_larger_hour_is_packed_a_chunk_a_transaction_under_the_cap(tmp_path: Path) -> None:
    """Store.pack rule 2: 1.08 M points (300 series; over chunked_points, so 15-minute chunks)
    do not fit one transaction under a 22MB cap (the premise, checked on a copy), and pack a
    chunk a transaction: every point kept, the rows and their order (rowid) and the times the
    same as one transaction writes with room (collector.series.pack_statements). An hour of
    5.76 M points failed at once under the collector's 32MB, in the checkpoint of its commit,
    which invalidates the database; a chunk at a time it packed in 6 s."""
    capped = Store(tmp_path / "capped.duckdb", threads=1, memory_limit="22MB")
    expected = _write_buckets(capped, 300)
    capped.checkpoint()
    premise = Store(tmp_path / "premise.duckdb", threads=1, memory_limit="22MB")
    _write_buckets(premise, 300)
    spec = TABLES["histogram_buckets"]
    with pytest.raises(duckdb.OutOfMemoryException):
        premise._transaction(series.pack_statements(spec, BASE, BASE + HOUR))
    premise.close()

    assert capped.pack(BASE + 2 * HOUR)["packed_histogram_buckets"] == 3600 * 300
    got = capped.con.execute("SELECT count(*), sum(cumulative_count) FROM histogram_buckets").fetchone()
    assert got == expected and _count(capped, "histogram_buckets_recent") == 0
    roomy = Store(tmp_path / "roomy.duckdb", threads=1)
    _write_buckets(roomy, 300)
    roomy._transaction(series.pack_statements(spec, BASE, BASE + HOUR))
    assert _packed_rows(capped, "histogram_buckets") == _packed_rows(roomy, "histogram_buckets")
    capped.close()
    roomy.close()


def _runs(rows: Any) -> Any:
    """``rows`` (time-major, as ``_gpu`` builds them) reordered series-major, with their runs
    (Batch rule 5): one run per series, as a backfill's matrix answer gives them."""
    sids = rows["uuid"]
    order = sorted(range(rows.height), key=lambda i: (int(sids[i].split("-")[1]), rows["ts_ns"][i]))
    taken = rows.take(order)
    taken.runs = [sids.count(u) for u in dict.fromkeys(taken["uuid"])]
    return taken


def test_closed_slices_are_written_packed_and_read_as_written(tmp_path: Path) -> None:
    """Store.write_closed rules 1-3: two fresh hours go straight to the packed form (nothing in
    T_recent), sorted like a pass packs them; a batch reaching into a slice with points goes
    the ordinary way; replays add nothing; every reader sees what a plain write gives."""
    plain = Store(tmp_path / "plain.duckdb")
    closed = Store(tmp_path / "closed.duckdb")
    # hours 0-1 in one batch (a backfill window of two slices), series-major with runs
    two = _runs(_gpu(0, n_series=3))
    two = type(two).concat([two, _runs(_gpu(1, n_series=3))])
    assert plain.write("gpu_samples", _gpu(0, n_series=3)) == 60 * 3
    assert plain.write("gpu_samples", _gpu(1, n_series=3)) == 60 * 3
    assert closed.write_closed("gpu_samples", two) == 2 * 60 * 3
    assert _count(closed, "gpu_samples_recent") == 0 and _count(closed, "gpu_samples_packed") == 2 * 60 * 3
    with closed.cursor() as cur:
        rows = cur.execute("SELECT series_id, tix FROM gpu_samples_packed").fetchall()
        times = cur.execute(
            "SELECT count(*), count(DISTINCT tix), min(tix) FROM gpu_samples_times"
        ).fetchone()
    assert times == (120, 120, 0)
    for hour in range(2):  # each slice sorted by series, even series rising in time, odd falling
        part = [(s, t) for s, t in rows if hour * 60 <= t < (hour + 1) * 60]
        assert part == rows[hour * 180 : (hour + 1) * 180]
        assert [s for s, _ in part] == sorted(s for s, _ in part)
        for sid in range(3):
            run = [t for s, t in part if s == sid]
            assert run == sorted(run, reverse=sid % 2 == 1)
    # rule 2: a late point of hour 1 and a replay of hour 0 take the ordinary path
    late = _gpu(1, n_series=1, step_s=3600, offset_s=30)
    for store in (plain, closed):
        assert store.write_closed("gpu_samples", late) == 1
        assert store.write_closed("gpu_samples", _gpu(0, n_series=3)) == 0
    assert _count(closed, "gpu_samples_recent") == 1
    # the next hour is fresh again: packed; then the pass packs hour 1 with its late point
    assert closed.write_closed("gpu_samples", _runs(_gpu(2, n_series=3))) == 60 * 3
    assert plain.write("gpu_samples", _gpu(2, n_series=3)) == 60 * 3
    assert _snapshot(closed) == _snapshot(plain)
    assert closed.pack(BASE + 4 * HOUR)["packed_gpu_samples"] == 1
    assert _count(closed, "gpu_samples_recent") == 0
    assert _snapshot(closed) == _snapshot(plain)
    plain.close()
    closed.close()
    with Store(tmp_path / "closed.duckdb", read_only=True) as a, Store(tmp_path / "plain.duckdb") as b:
        assert _snapshot(a) == _snapshot(b)


def test_closed_rows_repeating_a_key_are_stored_once(tmp_path: Path) -> None:
    """Store._insert_unindexed rule 1 holds on the packed path: two rows of one series and time
    (two Prometheus series that map to one store series) are one point."""
    store = Store(tmp_path / "s.duckdb")
    rows = _gpu(0, n_series=2)
    doubled = type(rows).concat([rows, rows])
    assert store.write_closed("gpu_samples", doubled) == 60 * 2
    assert _count(store, "gpu_samples") == 60 * 2 and _count(store, "gpu_samples_recent") == 0
    store.close()


def test_a_closed_write_that_fails_part_way_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Store.write_closed rule 1: one transaction. A statement failing after the packed rows are
    inserted leaves neither packed rows nor times; the same write then goes through whole."""
    from collector import series

    real = series.packed_insert_statements
    monkeypatch.setattr(
        series, "packed_insert_statements", lambda spec, src: [*real(spec, src), "SELECT error('disk full')"]
    )
    store = Store(tmp_path / "s.duckdb")
    with pytest.raises(duckdb.Error, match="disk full"):
        store.write_closed("gpu_samples", _gpu(0, n_series=2))
    for table in ("gpu_samples", "gpu_samples_packed", "gpu_samples_times"):
        assert _count(store, table) == 0
    monkeypatch.setattr(series, "packed_insert_statements", real)
    assert store.write_closed("gpu_samples", _gpu(0, n_series=2)) == 60 * 2
    assert _count(store, "gpu_samples_packed") == 60 * 2 and _count(store, "gpu_samples_times") == 60
    store.close()
