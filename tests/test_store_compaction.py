"""A closed store file rewritten without its free blocks (collector.compaction), new files in
DuckDB's compact metadata format (Store: STORAGE_VERSION), and the one-row ``ioe_state``
(collector.state).

Inputs are hand-built: series named by index, values chosen so a lost, doubled or moved point
changes a count or a sum.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest
from killing import kill_during

from collector import compaction
from collector.records import TABLES, batch
from collector.store import STORAGE_VERSION, Store

NS = 1_000_000_000
HOUR = 3600 * NS
BASE = 1_700_000_000 * NS // HOUR * HOUR  # a slice boundary, in the past
_SIZE = (
    "SELECT total_blocks, free_blocks FROM pragma_database_size() WHERE database_name = current_database()"
)
RAW = [name for name, spec in TABLES.items() if spec.values]


def _gpu(hour: int, n_series: int = 200, step_s: int = 5) -> object:
    ts = [BASE + hour * HOUR + k * step_s * NS for k in range(3600 // step_s)]
    return batch(
        "gpu_samples",
        {
            "ts_ns": [t for t in ts for _ in range(n_series)],
            "host": ["node0"] * (len(ts) * n_series),
            "uuid": [f"GPU-{s}" for _ in ts for s in range(n_series)],
            "metric": ["power_w"] * (len(ts) * n_series),
            "value": [float(s * 1000 + k % 97) + 0.25 for k in range(len(ts)) for s in range(n_series)],
        },
    )


def _rows(con: duckdb.DuckDBPyConnection) -> dict[str, list[tuple[object, ...]]]:
    """Every raw table's rows, and the packed points in the order they are stored."""
    got = {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in RAW}
    got["packed order"] = con.execute("SELECT series_id, tix FROM gpu_samples_packed").fetchall()
    return got


def _blocks(path: Path) -> tuple[int, int, str]:
    """(total blocks, free blocks, storage version) of a closed file."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        got = con.execute(_SIZE).fetchone()
        tags = con.execute(
            "SELECT tags FROM duckdb_databases() WHERE database_name = current_database()"
        ).fetchone()
    finally:
        con.close()
    assert got is not None and tags is not None
    return int(got[0]), int(got[1]), str(tags[0].get("storage_version"))


def _store_with_free_blocks(path: Path, hours: int = 2) -> dict[str, list[tuple[object, ...]]]:
    """``hours`` of 200 series every 5 s written in time order, checkpointed, then packed: the
    time-ordered blocks are freed (as the sidecar's hour is). Returns the rows before the close."""
    store = Store(path)
    for hour in range(hours):
        store.write("gpu_samples", _gpu(hour))
    store.checkpoint()
    store.pack(BASE + (hours + 1) * HOUR)
    store.maintain(BASE + (hours + 1) * HOUR)
    store.checkpoint()
    got = store.con.execute(_SIZE).fetchone()
    assert got is not None and got[1] >= 0.25 * got[0]  # the close will rewrite it
    with store.cursor() as cur:
        before = _rows(cur)
    store.close()
    return before


def test_a_new_store_file_holds_only_its_catalog_in_one_block(tmp_path: Path) -> None:
    """An empty store: every table and view, ``ioe_schema`` and ``ioe_state`` one row each
    (stored as constants), in one 256 KiB block of metadata (the v1.0.0 format took three)."""
    path = tmp_path / "s.duckdb"
    Store(path).close()
    assert _blocks(path) == (1, 0, f"{STORAGE_VERSION}+")
    assert path.stat().st_size == 3 * 4096 + 256 * 1024


def test_a_closed_store_is_rewritten_without_free_blocks_and_reads_the_same(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    before = _store_with_free_blocks(path)
    assert _blocks(path)[1] == 0
    assert not Path(f"{path}{compaction.SUFFIX}").exists() and not Path(f"{path}.wal").exists()
    with Store(path) as store, store.cursor() as cur:  # writable: the schema and state as they were
        assert _rows(cur) == before
        assert store._state("rollup_watermark_ns") == BASE + 3 * HOUR
        store.write("gpu_samples", _gpu(5, n_series=3, step_s=600))  # and it takes writes
    with Store(path, read_only=True) as reader, reader.cursor() as cur:
        after = _rows(cur)
    assert after["gpu_samples"] == sorted(before["gpu_samples"] + _rows_of(_gpu(5, n_series=3, step_s=600)))


def _rows_of(rows: object) -> list[tuple[object, ...]]:
    store = Store(threads=1)
    store.write("gpu_samples", rows)
    got = store.con.execute("SELECT * FROM gpu_samples ORDER BY ALL").fetchall()
    store.close()
    return got


def test_a_file_with_few_free_blocks_is_not_rewritten(tmp_path: Path) -> None:
    """A store of three packed hours, then a session that adds a few recent points: its close
    leaves far under a quarter of the blocks free, and the file is closed in place."""
    path = tmp_path / "s.duckdb"
    with Store(path) as store:
        for hour in range(3):
            store.write_closed("gpu_samples", _gpu(hour))
    inode = path.stat().st_ino
    with Store(path) as store:  # points of 2034: recent, not packed at this close
        store.write("gpu_samples", _gpu(100_000, n_series=3, step_s=600))
    assert path.stat().st_ino == inode  # written in place, never copied
    total, free, _ = _blocks(path)
    assert free < 0.25 * total


def test_an_old_format_file_is_upgraded_by_the_rewrite(tmp_path: Path) -> None:
    """A file made in DuckDB's v1.0.0 format (as stores were before) with free blocks: the rewrite
    writes the compact format, and the rows are those of the old file."""
    path = tmp_path / "s.duckdb"
    con = duckdb.connect()
    con.execute(f"ATTACH '{path}' AS d (BLOCK_SIZE 262144)")  # DuckDB's default format
    con.close()
    assert _blocks(path)[2] == "v1.0.0+"
    before = _store_with_free_blocks(path, hours=2)
    assert _blocks(path)[1:] == (0, f"{STORAGE_VERSION}+")
    with Store(path, read_only=True) as reader, reader.cursor() as cur:
        assert _rows(cur) == before


def test_a_failed_rewrite_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    """The copy cannot be created (a folder holds its name): the old file is untouched and the
    store reads as before. A file with a write-ahead log is not rewritten at all."""
    path = tmp_path / "s.duckdb"
    with Store(path) as store:
        store.write("gpu_samples", _gpu(0, n_series=20, step_s=60))
    with Store(path, read_only=True) as reader, reader.cursor() as cur:
        before = _rows(cur)
    blocked = Path(f"{path}{compaction.SUFFIX}")
    blocked.mkdir()
    (blocked / "keep").write_text("x")
    data = path.read_bytes()
    with pytest.raises(compaction.CompactionError, match="not rewritten"):
        compaction.compact(path, STORAGE_VERSION)
    assert path.read_bytes() == data
    Path(f"{path}.wal").write_bytes(b"")
    with pytest.raises(compaction.CompactionError, match="write-ahead log"):
        compaction.compact(path, STORAGE_VERSION)
    Path(f"{path}.wal").unlink()
    with Store(path, read_only=True) as reader, reader.cursor() as cur:
        assert _rows(cur) == before


_COMPACTOR = """
import sys
from collector import compaction
from collector.store import STORAGE_VERSION
print("compacting", flush=True)
while True:
    compaction.compact(sys.argv[1], STORAGE_VERSION, {"threads": 1})
"""


@pytest.mark.parametrize("delay_s", [0.02, 0.15, 0.4])
def test_a_kill_during_a_rewrite_keeps_a_whole_store(tmp_path: Path, delay_s: float) -> None:
    """SIGKILL at some moment of rewriting (again and again, so the kill lands in the copy, the
    sync or the rename): the file at the store's path is a whole store with every row, and
    opening it for writing deletes a partial copy left beside it."""
    path = tmp_path / "s.duckdb"
    before = _store_with_free_blocks(path, hours=2)
    kill_during(_COMPACTOR, [str(path)], b"compacting", delay_s)
    with Store(path, read_only=True) as reader, reader.cursor() as cur:
        assert _rows(cur) == before
    with Store(path) as store, store.cursor() as cur:
        assert _rows(cur) == before
    assert not Path(f"{path}{compaction.SUFFIX}").exists()


def test_state_rows_of_an_older_file_become_the_one_row(tmp_path: Path) -> None:
    """collector.state rule 3: ``(key, value)`` rows, as files before kept them, are read as
    they were; a key never set reads 0; a new key gets its column."""
    path = tmp_path / "s.duckdb"
    Store(path).close()
    con = duckdb.connect(str(path))
    con.execute("DROP TABLE ioe_state")
    con.execute("CREATE TABLE ioe_state (key VARCHAR NOT NULL, value BIGINT)")
    con.execute("INSERT INTO ioe_state VALUES ('rollup_watermark_ns', 120), ('series_pruned_ns', 7)")
    con.close()
    with Store(path) as store:
        assert store._state("rollup_watermark_ns") == 120 and store._state("series_pruned_ns") == 7
        assert store._state("never_set_ns") == 0
        store._set_state("never_set_ns", 5)
        store._set_state("rollup_watermark_ns", 180)
    with Store(path) as store:
        got = store.con.execute("SELECT * FROM ioe_state").fetchall()
        assert store._state("never_set_ns") == 5 and store._state("rollup_watermark_ns") == 180
    assert got == [(180, 7, 5)]


def test_the_rewrite_stores_the_gpu_rollup_varying_minutes_first_and_constants_by_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """collector.compaction rule 5: the rewritten file holds the same rollup rows, stored with
    the minutes in which a series varied first (by minute), then the rows of series constant in
    their minute, by value, then minute; a table of more rows than ORDERED_ROWS is copied in its
    order. GPU-0 rises every 10 s; GPU-1 and GPU-3 stay 0, GPU-2 stays 5; three whole minutes are
    rolled up."""
    path = tmp_path / "s.duckdb"
    ts = [BASE + k * 10 * NS for k in range(18)]
    level = {0: None, 1: 0.0, 2: 5.0, 3: 0.0}
    rows = batch(
        "gpu_samples",
        {
            "ts_ns": [t for t in ts for _ in level],
            "host": ["node0"] * (len(ts) * len(level)),
            "uuid": [f"GPU-{s}" for _ in ts for s in level],
            "metric": ["power_w"] * (len(ts) * len(level)),
            "value": [float(k) if v is None else v for k in range(len(ts)) for v in level.values()],
        },
    )
    with Store(path) as store:
        store.write("gpu_samples", rows)
        store.maintain(BASE + 3 * 60 * NS)
        with store.cursor() as cur:
            before = cur.execute("SELECT * FROM gpu_samples_1m ORDER BY ALL").fetchall()
            inserted = cur.execute("SELECT uuid, minute_ns FROM gpu_samples_1m ORDER BY rowid").fetchall()
    assert len(before) == 12
    shutil.copyfile(path, tmp_path / "more.duckdb")
    compaction.compact(path, STORAGE_VERSION)
    con = duckdb.connect(str(path), read_only=True)
    try:
        after = con.execute("SELECT * FROM gpu_samples_1m ORDER BY ALL").fetchall()
        stored = con.execute("SELECT uuid, minute_ns, min FROM gpu_samples_1m ORDER BY rowid").fetchall()
    finally:
        con.close()
    assert after == before
    minutes = [BASE + m * 60 * NS for m in range(3)]
    assert stored == [
        *[("GPU-0", m, float(6 * i)) for i, m in enumerate(minutes)],
        *[(u, m, 0.0) for m in minutes for u in ("GPU-1", "GPU-3")],
        *[("GPU-2", m, 5.0) for m in minutes],
    ]
    # more rows than the rewrite sorts (ORDERED_ROWS): copied in their order
    monkeypatch.setattr(compaction, "ORDERED_ROWS", 11)
    compaction.compact(tmp_path / "more.duckdb", STORAGE_VERSION)
    con = duckdb.connect(str(tmp_path / "more.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT uuid, minute_ns FROM gpu_samples_1m ORDER BY rowid").fetchall() == inserted
    finally:
        con.close()
