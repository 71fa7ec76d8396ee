"""Rewriting a store file without its free blocks (run by :meth:`collector.store.Store.close`).

DuckDB never shrinks a file: a block freed by a delete stays in it, free, until a later write
reuses it (only free blocks at the very end are cut off). A store frees many at once when it
packs an hour: the hour was first written in time order to ``T_recent`` (and checkpointed
there), then written again packed, and the time-ordered blocks were freed. On an hour of 8 GPUs
half the file was free blocks (17 of 34 blocks of 256 KiB; ``bench/results/density.md``). A
long-running store reuses them for the next hour, so it keeps about one hour of them; a store
that is closed (``ioe ingest``, a stopped sidecar) keeps them for good unless it is rewritten.

Rules:

1. Only a file whose last close left no write-ahead log is rewritten (every committed row is
   then in the file), and only while no other process has it open: the old file is attached
   read-only, which holds a lock no writer can take, from before the copy until after the
   rename.
2. The copy is DuckDB's own ``COPY FROM DATABASE`` of the schema (every table and view) into
   ``<file>.compact``, with the old file's block size and :data:`collector.store.STORAGE_VERSION`,
   then each table's rows, in their order, except a table of :data:`ROW_ORDERS` (rule 5).
   Before it replaces anything, each table's row count is compared with the old file's, the
   new file is checkpointed and closed (no ``.wal`` may remain), and its bytes are synced to disk.
3. The new file replaces the old with one ``rename`` (atomic on POSIX), then the folder is
   synced. A crash before the rename leaves the old file as it was (and a ``<file>.compact``
   that the next rewrite deletes first); after it, the new file is complete. No step writes
   to the old file.
4. A rewrite that fails (a full disk, a lock held by another process) deletes its partial copy
   and leaves the old file in place; the caller logs it: the store is only larger.
5. The GPU rollup's rows are copied in the order :data:`ROW_ORDERS` gives when there are at most
   :data:`ORDERED_ROWS` of them (the sort then fits the rewrite's memory; more are copied in their
   order): the rows whose series varied in their minute first, by minute and then by value, the
   rows of a series constant in its minute (``min = max``) last, by value, then minute. DuckDB
   stores these DOUBLE columns as runs (RLE: 8 bytes a value and 2 a count), so each run of equal
   values costs ~10 bytes a column: the constant rows of a value (the zeros of eight error
   counters on every GPU, every minute) become one run instead of one a minute and field, and
   equal values of one minute sit side by side. One hour of 8 GPUs' rollups (12,200 rows):
   272,888 bytes in insertion order, over one block of 256 KiB; 252,176 in this order
   (``bench/results/density.md``).
   Varying rows come first because DuckDB judges ALP from the column's first vectors: constant
   rows first made it choose ALP, and that took 405,448 bytes. Only the physical order changes:
   every reader's SQL orders or groups what it reads.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collector.engine import duckdb
from collector.errors import first_line

SUFFIX = ".compact"
# Rule 5: the row order a table is copied in (the rollup key columns last make it total).
ROW_ORDERS = {
    "gpu_samples_1m": "min = max, CASE WHEN min = max THEN min END, minute_ns, min, max, avg, last, "
    "host, uuid, metric, link, gpu, n",
}
# Rule 5: the most rows a table is sorted with. Sorting the rollup's rows (13 columns, three of
# them text) under the rewrite's 32MB: 61,000 rows (5 hours of 8 GPUs) fit, 97,600 did not.
ORDERED_ROWS = 49_152


@dataclass(frozen=True)
class Compacted:
    """What a rewrite did: bytes of the file before and after, and the seconds it took."""

    bytes_before: int
    bytes_after: int
    seconds: float


class CompactionError(RuntimeError):
    """The file could not be rewritten; the old one is in place, unchanged."""


def compact(path: str | Path, storage_version: str, config: dict[str, Any] | None = None) -> Compacted:
    """Rewrite ``path`` without its free blocks (rules 1-4); raises :class:`CompactionError`.

    ``config``: DuckDB settings of the copying connection (threads, memory_limit)."""
    path = Path(path)
    tmp = Path(f"{path}{SUFFIX}")
    if Path(f"{path}.wal").exists():  # rule 1
        raise CompactionError(f"store {path}: not rewritten: it has a write-ahead log")
    before, start = path.stat().st_size, time.perf_counter()
    settings = {"autoload_known_extensions": False, "autoinstall_known_extensions": False, **(config or {})}
    settings["temp_directory"] = f"{path}.tmp"
    con = duckdb.connect(":memory:", config=settings)
    try:
        _remove(tmp)  # rule 3: a crash's leftover
        con.execute(f"ATTACH {_literal(path)} AS old (READ_ONLY)")
        got = con.execute(
            "SELECT block_size FROM pragma_database_size() WHERE database_name = 'old'"
        ).fetchone()
        block = int(got[0]) if got else 0
        con.execute(
            f"ATTACH {_literal(tmp)} AS new (BLOCK_SIZE {block}, STORAGE_VERSION {_literal(storage_version)})"
        )
        con.execute("COPY FROM DATABASE old TO new (SCHEMA)")
        _copy_rows(con)
        _check_counts(con, path)
        con.execute("CHECKPOINT new")
        con.execute("DETACH new")
        if Path(f"{tmp}.wal").exists():
            raise CompactionError(f"store {path}: the rewritten copy kept a write-ahead log")
        _sync(tmp)
        os.replace(tmp, path)  # rule 3, while the old file's lock is still held (rule 1)
        _sync(path.parent)
    except (duckdb.Error, OSError, CompactionError) as exc:
        con.close()
        with contextlib.suppress(OSError):
            _remove(tmp)
        if isinstance(exc, CompactionError):
            raise
        raise CompactionError(f"store {path}: not rewritten ({first_line(exc)})") from exc
    con.close()
    return Compacted(before, path.stat().st_size, time.perf_counter() - start)


def _copy_rows(con: duckdb.DuckDBPyConnection) -> None:
    """Rules 2 and 5: every table's rows from ``old`` into ``new``, in their order or in the
    table's :data:`ROW_ORDERS`."""
    tables = con.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = 'old' ORDER BY ALL"
    ).fetchall()
    for schema, table in tables:
        name = f'"{schema}"."{table}"'
        order = ROW_ORDERS.get(table) if schema == "main" else None
        got = con.execute(f"SELECT count(*) FROM old.{name}").fetchone() if order else None
        if order is None or got is None or int(got[0]) > ORDERED_ROWS:
            con.execute(f"INSERT INTO new.{name} SELECT * FROM old.{name}")
        else:
            con.execute(f"INSERT INTO new.{name} SELECT * FROM old.{name} ORDER BY {order}")


def _check_counts(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Rule 2: every table of the copy holds as many rows as the old file's."""
    tables = con.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = 'old' ORDER BY ALL"
    ).fetchall()
    for schema, table in tables:
        name = f'"{schema}"."{table}"'
        old = con.execute(f"SELECT count(*) FROM old.{name}").fetchone()
        new = con.execute(f"SELECT count(*) FROM new.{name}").fetchone()
        if old != new:
            raise CompactionError(f"store {path}: not rewritten: {table} copied {new} rows of {old}")


def _sync(path: Path) -> None:
    """``fsync`` a file or a folder."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_leftover(path: str | Path) -> None:
    """Rule 3: delete the partial copy a crash left beside ``path`` (call it only while holding
    the store's write lock: no rewrite of ``path`` can then be running)."""
    _remove(Path(f"{path}{SUFFIX}"))


def _remove(tmp: Path) -> None:
    for leftover in (tmp, Path(f"{tmp}.wal")):
        leftover.unlink(missing_ok=True)


def _literal(value: str | Path) -> str:
    return "'" + str(value).replace("'", "''") + "'"
