"""The store: idempotent column-wise writes, migrations, rollups and retention."""

from __future__ import annotations

import duckdb
import pytest

from collector.records import TABLES, frame
from collector.store import NS_PER_MIN, SCHEMA_VERSION, Retention, Store, StoreError

MIN = NS_PER_MIN


def _gpu(ts: list[int], values: list[float], metric: str = "power_w", uuid: str = "GPU-a") -> object:
    n = len(ts)
    return frame(
        "gpu_samples",
        {
            "ts_ns": ts,
            "host": ["n1"] * n,
            "gpu": [0] * n,
            "uuid": [uuid] * n,
            "metric": [metric] * n,
            "value": values,
            "source": ["dcgm"] * n,
        },
    )


def test_replayed_batch_inserts_nothing_new() -> None:
    st = Store()
    batch = _gpu([1, 2, 3], [10.0, 20.0, 30.0])
    assert st.write("gpu_samples", batch) == 3
    assert st.write("gpu_samples", batch) == 0
    assert st.count("gpu_samples") == 3


def test_key_columns_default_to_sentinels_not_null() -> None:
    f = _gpu([1], [1.0])
    assert f["link"].to_list() == [-1]
    assert f["pod"].to_list() == [None]


def test_targets_keep_latest_state() -> None:
    st = Store()
    for up in (True, False):
        st.write("targets", frame("targets", {"target": ["t1"], "kind": ["dcgm"], "up": [up]}))
    with st.cursor() as cur:
        assert cur.execute("SELECT up FROM targets").fetchall() == [(False,)]


def test_targets_keep_the_last_row_of_a_batch_per_key() -> None:
    """A writer's flush holds many health rows of one target: the newest is the state kept (DuckDB's
    ``INSERT OR REPLACE`` alone keeps the first of a key seen twice in one statement)."""
    from collector.batch import Batch
    from collector.records import batch

    rows = {"target": ["t1", "t2", "t1", "t1"], "kind": ["dcgm"] * 4, "up": [True, True, True, False]}
    rows["last_scrape_ns"] = [1, 1, 2, 3]
    for made in (batch("targets", rows), frame("targets", rows)):
        st = Store()
        assert isinstance(made, Batch) or hasattr(made, "height")
        st.write("targets", made)  # type: ignore[arg-type]
        with st.cursor() as cur:
            got = cur.execute("SELECT target, up, last_scrape_ns FROM targets ORDER BY target").fetchall()
        assert got == [("t1", False, 3), ("t2", True, 1)]


def test_unknown_table_and_missing_columns_are_refused() -> None:
    st = Store()
    with pytest.raises(StoreError, match="no table 'nope'"):
        st.write("nope", _gpu([1], [1.0]))  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="unknown columns"):
        frame("gpu_samples", {"bogus": [1]})


def test_rollup_then_retention() -> None:
    st = Store()
    ts = [5 * MIN + 1, 5 * MIN + 30_000_000_000, 6 * MIN + 1]
    st.write("gpu_samples", _gpu(ts, [1.0, 3.0, 7.0]))
    st.maintain(now_ns=7 * MIN, retention=Retention(raw_s=30, rollup_s=3600))
    with st.cursor() as cur:
        rows = cur.execute(
            "SELECT minute_ns, n, min, max, avg, last FROM gpu_samples_1m ORDER BY minute_ns"
        ).fetchall()
    assert rows == [(5 * MIN, 2, 1.0, 3.0, 2.0, 3.0), (6 * MIN, 1, 7.0, 7.0, 7.0, 7.0)]
    # raw older than 30 s before "now" (7 min) is gone; the rollups stay
    assert st.count("gpu_samples") == 0
    assert st.count("gpu_samples_1m") == 2


def test_late_sample_is_folded_into_its_minute() -> None:
    st = Store()
    st.write("gpu_samples", _gpu([5 * MIN + 1], [1.0]))
    st.maintain(now_ns=6 * MIN + 5)
    st.write("gpu_samples", _gpu([5 * MIN + 2], [5.0]))
    st.maintain(now_ns=6 * MIN + 10)
    with st.cursor() as cur:
        assert cur.execute("SELECT n, max FROM gpu_samples_1m").fetchall() == [(2, 5.0)]


def test_new_file_is_stamped_and_reopens(tmp_path) -> None:
    path = tmp_path / "s.duckdb"
    with Store(path) as st:
        st.write("gpu_samples", _gpu([1], [1.0]))
        assert st.schema_version() == SCHEMA_VERSION
    with Store(path) as st:
        assert st.count("gpu_samples") == 1
        assert set(st.counts()) == set(TABLES)


def test_newer_schema_is_refused(tmp_path) -> None:
    path = tmp_path / "s.duckdb"
    Store(path).close()
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO ioe_schema VALUES (?, 0)", [SCHEMA_VERSION + 1])
    con.close()
    with pytest.raises(StoreError, match="newer than this IOE"):
        Store(path)


def test_read_only_store_refuses_writes(tmp_path) -> None:
    path = tmp_path / "s.duckdb"
    Store(path).close()
    with Store(path, read_only=True) as st, pytest.raises(StoreError, match="read-only"):
        st.write("gpu_samples", _gpu([1], [1.0]))
