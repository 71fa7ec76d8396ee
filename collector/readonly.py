"""Read-only SQL over a store: a connection that cannot write, attach, install, or reach files.

Rules (shared by ``ioe query`` and the API's ``/api/v1/query``, which runs on the serving
process's own store, locked the same way by :meth:`collector.store.Store.lock_down`):
  1. The database runs with external access disabled (``enable_external_access=false`` blocks
     file, glob and URL reads, ``ATTACH``, ``COPY``, ``INSTALL``/``LOAD`` and replacement scans),
     extension autoload and autoinstall off, and its configuration locked.
  2. Exactly one statement, of type SELECT.
  3. At most ``max_rows`` rows and ``max_bytes`` bytes of result come back: the result is read in
     small Arrow batches and refused as soon as its size passes the cap, so a query that builds
     huge values (``repeat('x', 10000000)``) is answered with an error, not a 1.5 GB body.
  4. The query is interrupted after ``timeout_s``, or as soon as the process's resident memory
     grows more than ``max_memory_bytes`` above what it was when the query started (sampled every
     :data:`WATCH_S` seconds while it runs).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import duckdb
import polars as pl

MAX_BYTES = 16 << 20  # rule 3: a result body larger than this is not an interactive answer
MAX_MEMORY_BYTES = 1 << 30  # rule 4: growth of the serving process allowed for one query
WATCH_S = 0.02
_BATCH_ROWS = 256


class ReadOnlyQueryError(ValueError):
    """The query was refused or failed; the message says why."""


def open_readonly(path: str | Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(
        str(path),
        read_only=True,
        config={
            "enable_external_access": False,
            "autoload_known_extensions": False,
            "autoinstall_known_extensions": False,
        },
    )
    con.execute("SET lock_configuration = true")
    return con


def run_readonly_query(
    path: str | Path, sql: str, *, max_rows: int = 10_000, timeout_s: float = 10.0, max_bytes: int = MAX_BYTES
) -> pl.DataFrame:
    """Run one statement read-only; at most ``max_rows`` rows, interrupted after ``timeout_s``."""
    text = statement_text(sql)
    try:
        con = open_readonly(path)
    except duckdb.Error as exc:
        raise ReadOnlyQueryError(f"cannot open store {path}: {exc}") from exc
    return run_on(con, text, max_rows=max_rows, timeout_s=timeout_s, max_bytes=max_bytes, close=True)


def statement_text(sql: str) -> str:
    """``sql`` without surrounding blanks and a trailing ``;``; an empty query is refused."""
    text = sql.strip().rstrip(";")
    if not text:
        raise ReadOnlyQueryError("empty query")
    return text


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _Watch:
    """Rule 4: interrupts ``con`` at the deadline or when resident memory grows past the cap."""

    def __init__(self, con: duckdb.DuckDBPyConnection, timeout_s: float, max_memory_bytes: int):
        self.con, self.timeout_s, self.cap = con, timeout_s, max_memory_bytes
        self.reason = ""
        self._done = threading.Event()
        self._base = _rss_bytes()
        self._thread = threading.Thread(target=self._run, name="ioe-query-watch", daemon=True)

    def __enter__(self) -> _Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        waited = 0.0
        while not self._done.wait(WATCH_S):
            waited += WATCH_S
            if waited >= self.timeout_s:
                self.reason = f"query exceeded its {self.timeout_s:g} s time limit"
            elif self._base and _rss_bytes() - self._base > self.cap:
                self.reason = f"query needed more than {self.cap >> 20} MiB of memory"
            if self.reason:
                self.con.interrupt()
                return


def run_on(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    *,
    max_rows: int,
    timeout_s: float,
    max_bytes: int = MAX_BYTES,
    max_memory_bytes: int = MAX_MEMORY_BYTES,
    close: bool = False,
) -> pl.DataFrame:
    """Rules 2-4 on ``con`` (a connection or cursor of a database locked as rule 1 says)."""
    watch = _Watch(con, timeout_s, max_memory_bytes)
    try:
        statements = con.extract_statements(sql)
        if len(statements) != 1:
            raise ReadOnlyQueryError(f"exactly one statement allowed, got {len(statements)}")
        if statements[0].type != duckdb.StatementType.SELECT:
            raise ReadOnlyQueryError(f"only SELECT queries are allowed, got {statements[0].type.name}")
        with watch:
            reader = con.sql(sql).limit(max_rows).to_arrow_reader(_BATCH_ROWS)
            batches, size = [], 0
            for batch in reader:
                size += batch.nbytes
                if size > max_bytes:
                    raise ReadOnlyQueryError(
                        f"result is larger than {max_bytes} bytes: select fewer rows or columns"
                    )
                batches.append(batch)
        import pyarrow as pa

        return pl.from_arrow(pa.Table.from_batches(batches, schema=reader.schema))  # type: ignore[return-value]
    except duckdb.InterruptException as exc:
        raise ReadOnlyQueryError(watch.reason or "query was interrupted") from exc
    except duckdb.Error as exc:
        raise ReadOnlyQueryError(str(exc).splitlines()[0]) from exc
    finally:
        if close:
            con.close()
