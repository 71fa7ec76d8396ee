"""A collector-only agent's store sheds DuckDB's cache at each checkpoint (Store.checkpoint).

DuckDB keeps the blocks it read from the file, and those a checkpoint wrote, cached until its
buffer pool's cap needs the room; a collector's resident memory then creeps up towards that cap
between passes. These tests read a store's points back (as a pass's rollups do), so that the
pool holds the file's blocks, and look at DuckDB's own account of its memory (``duckdb_memory()``).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from collector.agent import COLLECTOR_MEMORY_LIMIT, open_store
from collector.records import frame
from collector.store import Store
from ioe.settings import Settings

N = 400_000  # points: ~3 MB of file blocks once read back


def _fill(store: Store) -> None:
    base = 1_700_000_000_000_000_000
    rows = frame(
        "gpu_samples",
        {
            "ts_ns": [base + (i // 50) * 1_000_000_000 for i in range(N)],
            "host": ["n0"] * N,
            "uuid": [f"GPU-{i % 8}" for i in range(N)],
            "metric": [f"m{i % 50}" for i in range(N)],
            "value": [float(i % 977) * 0.5 for i in range(N)],
        },
    )
    store.write("gpu_samples", rows)
    store.checkpoint()
    with store.cursor() as cur:  # the points read back: their blocks now sit in the pool
        cur.execute("SELECT sum(value), max(ts_ns), count(DISTINCT series_id) FROM gpu_samples_recent")
        cur.fetchall()


def _cached(store: Store) -> int:
    with store.cursor() as cur:
        got = cur.execute(
            "SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory() WHERE tag = 'BASE_TABLE'"
        ).fetchone()
    return int(got[0]) if got else 0


def _cap(store: Store) -> str:
    got = store.con.execute("SELECT current_setting('memory_limit')").fetchone()
    assert got is not None
    return str(got[0])


def test_a_shedding_store_lets_go_of_the_blocks_it_read_and_keeps_its_cap(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb", threads=1, memory_limit="32MB", sheds_cache=True)
    try:
        _fill(store)
        before = _cached(store)
        assert before >= 2 << 20  # the premise: the read left megabytes of the file cached
        for _ in range(3):  # the cap goes back to what was configured, every time, exactly
            store.checkpoint()
            assert _cap(store) == "30.5 MiB"
        after = _cached(store)
        assert after < before / 2, (before, after)
        # and the rows are all there, read from the file again
        with store.cursor() as cur:
            assert cur.execute("SELECT count(*) FROM gpu_samples_recent").fetchone() == (N,)
    finally:
        store.close()


def test_a_store_that_does_not_shed_keeps_its_cache_and_its_lock(tmp_path: Path) -> None:
    store = Store(tmp_path / "k.duckdb", threads=1, memory_limit="32MB")
    try:
        _fill(store)
        before = _cached(store)
        store.checkpoint()
        assert _cached(store) >= before * 0.9
        with store.cursor() as cur, pytest.raises(duckdb.Error, match="locked"):
            cur.execute("SET memory_limit = '1GB'")
    finally:
        store.close()


def test_a_shedding_store_still_refuses_everything_outside_its_file(tmp_path: Path) -> None:
    """Its configuration is not locked (the cap must move), but external access stays off."""
    secret = tmp_path / "s.csv"
    secret.write_text("a\n1\n")
    store = Store(tmp_path / "x.duckdb", threads=1, memory_limit="32MB", sheds_cache=True)
    try:
        with store.cursor() as cur:
            for sql in (f"SELECT * FROM '{secret}'", f"SELECT * FROM read_csv('{secret}')", "INSTALL httpfs"):
                with pytest.raises(duckdb.Error):
                    cur.execute(sql).fetchall()
    finally:
        store.close()


def test_only_a_collector_only_agent_sheds(tmp_path: Path) -> None:
    """With the API, the analysis queries reuse the cache and the SQL route needs the lock."""
    for api in (False, True):
        settings = Settings(store_path=str(tmp_path / f"{api}.duckdb"), api_enabled=api)
        store = open_store(settings, threads=1)
        try:
            assert store.sheds_cache is (not api)
        finally:
            store.close()
    assert COLLECTOR_MEMORY_LIMIT == "32MB"
