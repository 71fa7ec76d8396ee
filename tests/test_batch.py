"""The collector's polars-free batch: built like a frame, read by DuckDB through the Arrow C stream,
and the same rows a polars frame gives wherever both paths exist."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl
import pytest

from collector.batch import Batch
from collector.formats.scrape import ScrapeCache, parse_scrape
from collector.rates import CounterRates
from collector.records import batch, frame
from collector.store import BLOCK_SIZE, Store, StoreError
from tests.conftest import DATA


def _scan(rows: Batch) -> list[tuple[object, ...]]:
    _stream = rows.__arrow_c_stream__()
    return duckdb.connect().execute("SELECT * FROM _stream").fetchall()


def test_batch_fills_key_defaults_and_nulls_like_frame() -> None:
    rows = batch("gpu_samples", [{"ts_ns": 1, "value": 2.5, "host": "x"}, {"ts_ns": 2, "gpu": 3}])
    assert rows.columns == frame("gpu_samples", {"ts_ns": [1]}).columns
    assert rows["uuid"] == ["", ""] and rows["link"] == [-1, -1]  # key columns: '' / -1
    assert rows["pod"] == [None, None] and rows["host"] == ["x", None]
    assert rows.to_polars().equals(
        frame("gpu_samples", [{"ts_ns": 1, "value": 2.5, "host": "x"}, {"ts_ns": 2, "gpu": 3}])
    )
    with pytest.raises(KeyError, match="unknown columns \\['bogus'\\]"):
        batch("gpu_samples", {"bogus": [1]})
    with pytest.raises(ValueError, match="shorter"):
        batch("gpu_samples", {"ts_ns": [1, 2], "value": [1.0]})


def test_arrow_export_keeps_types_nulls_and_values() -> None:
    rows = batch(
        "engine_samples",
        {
            "ts_ns": [10, 20, 30],
            "concept": ["a_total", "b", "c"],
            "dp_rank": [0, None, 2],  # a NULL in an integer column: the per-item path
            "value": [1, 2.5, None],  # an int in a DOUBLE column becomes 1.0
        },
    )
    got = _scan(rows)
    assert [r[0] for r in got] == [10, 20, 30]
    assert [r[4] for r in got] == [0, None, 2]
    assert [r[10] for r in got] == [1.0, 2.5, None] and isinstance(got[0][10], float)
    assert [r[1] for r in got] == ["", "", ""]  # source: key default


def test_arrow_export_names_the_column_that_does_not_fit() -> None:
    rows = batch("engine_samples", {"ts_ns": [1, "x"], "value": [1.0, 2.0]})
    with pytest.raises(TypeError, match=r"engine_samples\.ts_ns: values do not fit BIGINT"):
        rows.__arrow_c_stream__()
    with pytest.raises(TypeError, match=r"gpu_samples\.gpu"):
        batch("gpu_samples", {"gpu": [1.5]}).__arrow_c_stream__()  # 1.5 is not an index


def test_concat_with_column_and_take_share_nothing_they_change() -> None:
    a = batch("fabric_samples", {"ts_ns": [1, 2], "value": [1.0, 2.0]})
    b = batch("fabric_samples", {"ts_ns": [3], "value": [3.0]})
    both = Batch.concat([a, b])
    assert both.height == 3 and both["ts_ns"] == [1, 2, 3]
    rated = both.with_column("rate_per_s", [None, 1.0, 1.0])
    assert both["rate_per_s"] == [None, None, None] and rated["value"] is both["value"]
    assert rated.take([2, 0])["ts_ns"] == [3, 1]
    with pytest.raises(ValueError, match="does not match"):
        Batch.concat([a, batch("gpu_samples", {"ts_ns": [1]})])
    with pytest.raises(ValueError, match="3 rows"):
        both.with_column("value", [1.0])


def test_runs_survive_only_what_keeps_each_run_one_series(tmp_path: Path) -> None:
    """Batch rule 5, and the store's series lookup once a run gives the ids a lookup per row gives
    (a series new in the middle of the batch included)."""
    rows = batch(
        "gpu_samples",
        {
            "ts_ns": [1, 2, 3, 1, 2, 1],
            "host": ["h"] * 6,
            "uuid": ["G0", "G0", "G0", "G1", "G1", "G2"],
            "metric": ["m"] * 6,
            "value": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        },
    )
    rows.runs = [3, 2, 1]
    assert rows.with_column("value", [0.0] * 6).runs == [3, 2, 1]
    assert rows.with_column("ts_ns", [9] * 6).runs == [3, 2, 1]
    assert rows.with_column("uuid", ["x"] * 6).runs is None and rows.take([0, 1]).runs is None
    assert Batch.concat([rows, rows]).runs == [3, 2, 1, 3, 2, 1]
    assert Batch.concat([rows, rows.take([0])]).runs is None
    with Store(tmp_path / "a.duckdb") as a, Store(tmp_path / "b.duckdb") as b:
        a.write("gpu_samples", rows.take([0]))  # G0 known before, G1 and G2 new
        b.write("gpu_samples", rows.take([0]))
        plain = rows.take(range(6))
        assert plain.runs is None
        assert a.write("gpu_samples", rows) == b.write("gpu_samples", plain) == 5
        got = "SELECT ts_ns, uuid, value, series_id "
        got += "FROM gpu_samples_points JOIN gpu_samples_series USING (series_id)"
        assert sorted(a.con.execute(got).fetchall()) == sorted(b.con.execute(got).fetchall())


def test_store_writes_batches_idempotently_and_refuses_another_table(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    rows = batch(
        "gpu_samples", {"ts_ns": [1, 2], "host": ["h", "h"], "metric": ["power_w"] * 2, "value": [300, 310.5]}
    )
    assert store.write("gpu_samples", rows) == 2
    assert store.write("gpu_samples", rows) == 0  # a replayed batch stores nothing
    got = store.con.execute("SELECT ts_ns, value FROM gpu_samples ORDER BY ts_ns").fetchall()
    assert got == [(1, 300.0), (2, 310.5)]
    with pytest.raises(StoreError, match="a batch of 'gpu_samples' cannot go into 'engine_samples'"):
        store.write("engine_samples", rows)


def test_new_store_files_use_small_blocks_and_old_ones_keep_theirs(tmp_path: Path) -> None:
    old = tmp_path / "old.duckdb"
    duckdb.connect(str(old)).execute("CREATE TABLE t (a INTEGER)").close()  # DuckDB's default blocks
    for path, expected in ((tmp_path / "new.duckdb", BLOCK_SIZE), (old, 256 * 1024)):
        store = Store(path)
        size = store.con.execute("SELECT block_size FROM pragma_database_size()").fetchone()
        assert size == (expected,)
        store.close()


def test_replayed_scrape_batches_equal_a_cold_parse_and_rates_match_polars() -> None:
    body = (DATA / "engine" / "vllm_0.33.0_dp2.prom").read_bytes()
    cache = ScrapeCache()
    first = parse_scrape(body, kind="engine", ts_ns=1_000_000_000, source="v", cache=cache)
    # +10 prompt tokens on each DP rank
    bumped = body.replace(b'Llama-3.1-8B-Instruct"} 25600.0', b'Llama-3.1-8B-Instruct"} 25610.0')
    second = parse_scrape(bumped, kind="engine", ts_ns=3_000_000_000, source="v", cache=cache)
    assert cache.replay is not None and isinstance(second.batches["engine_samples"], Batch)
    cold = parse_scrape(bumped, kind="engine", ts_ns=3_000_000_000, source="v")
    for table in cold.batches:
        assert second.tables[table].equals(cold.tables[table])
    by_batch, by_frame = CounterRates(), CounterRates()
    for parsed in (first, second):
        rated = by_batch.apply(parsed.batches["engine_samples"])
        expected = by_frame.apply(parsed.tables["engine_samples"])
        assert rated.to_polars().equals(expected)
    rated_rows = zip(rated["concept"], rated["rate_per_s"], strict=True)
    prompt = [r for concept, r in rated_rows if concept == "prompt_tokens_total"]
    assert prompt == [5.0, 5.0]  # +10 tokens over 2 s on each DP rank


def test_sidecar_path_modules_do_not_import_polars() -> None:
    code = (
        "import sys, collector.agent, collector.health, collector.sidecar, collector.store, "
        "collector.sources.nvml, collector.sources.pydcgm, collector.sources.infiniband; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'polars', 'pyarrow', 'numpy', 'pandas'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert pl.__name__ == "polars"  # the test process itself may use polars freely
