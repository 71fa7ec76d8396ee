"""The store file's maintenance state (``ioe_state``): named BIGINT watermarks.

Rules:

1. The state is one row, one column per key (``rollup_watermark_ns``, ``series_pruned_ns``, ...).
   DuckDB stores each column of a one-row table as a constant in the table's metadata, with no
   data block; as ``(key, value)`` rows it took a 256 KiB block of its own (0.36 bytes a sample
   of an hour of 8 GPUs, ``bench/results/density.md``).
2. A key never set reads 0; setting a new key adds its column (keys are the store's own
   constant names, lower-case identifiers).
3. A file made before keeps its state as ``(key, value)`` rows: they become the one row when the
   file is opened for writing, in one transaction (:func:`ensure`).

The DuckLake store keeps ``(key, value)`` rows (``collector.lake``): a lake has no blocks.
"""

from __future__ import annotations

import re

from collector.engine import duckdb

TABLE = "ioe_state"
KEYS = ("rollup_watermark_ns", "series_pruned_ns")
_KEY = re.compile(r"^[a-z][a-z0-9_]*$")


def columns(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The columns of ``ioe_state`` in the store's catalog (none when it does not exist)."""
    rows = con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_catalog = current_database() "
        f"AND table_schema = current_schema() AND table_name = '{TABLE}' ORDER BY ordinal_position"
    ).fetchall()
    return [str(r[0]) for r in rows]


def ensure(con: duckdb.DuckDBPyConnection) -> None:
    """``ioe_state`` as one row (rule 1), created or converted from ``(key, value)`` rows (rule 3)."""
    have = columns(con)
    if have and "key" not in have:
        return
    old: dict[str, int] = {}
    if have:
        old = {str(k): int(v) for k, v in con.execute(f"SELECT key, value FROM {TABLE}").fetchall()}
    keys = [*KEYS, *(k for k in old if k not in KEYS and _KEY.match(k))]
    con.execute("BEGIN TRANSACTION")
    try:
        if have:
            con.execute(f"DROP TABLE {TABLE}")
        con.execute(f"CREATE TABLE {TABLE} ({', '.join(f'{k} BIGINT' for k in keys)})")
        con.execute(f"INSERT INTO {TABLE} VALUES ({', '.join(str(int(old.get(k, 0))) for k in keys)})")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def read(con: duckdb.DuckDBPyConnection, key: str) -> int:
    """Rule 2: the value of ``key``, 0 when never set or where there is no ``ioe_state`` (a
    database no store wrote). Read in either form: the one row (rule 1) or ``(key, value)`` rows
    (rule 3: an older file read without being opened for writing, a DuckLake catalog)."""
    try:
        cur = con.execute(f"SELECT * FROM {TABLE}")
    except duckdb.CatalogException:
        return 0
    rows = cur.fetchall()
    names = [str(d[0]) for d in cur.description or []]
    got = None
    if key in names:
        got = rows[0][names.index(key)] if rows else None
    elif names[:2] == ["key", "value"]:
        got = next((v for k, v in rows if k == key), None)
    return int(got) if got is not None else 0


def write(con: duckdb.DuckDBPyConnection, key: str, value: int) -> None:
    """Rule 2: ``key`` set to ``value`` (its column added first when new)."""
    name = _checked(key)
    if name not in columns(con):
        con.execute(f"ALTER TABLE {TABLE} ADD COLUMN {name} BIGINT DEFAULT 0")
    con.execute(f"UPDATE {TABLE} SET {name} = {int(value)}")


def _checked(key: str) -> str:
    if not _KEY.match(key):
        raise ValueError(f"state key {key!r} is not a lower-case identifier")
    return key
