"""Read-only SQL over a store: a connection that cannot write, attach, install, or reach files.

The query runs on a separate read-only DuckDB connection with external access disabled
(``enable_external_access=false`` blocks ``read_csv``/``ATTACH``/``COPY``/``INSTALL``) and
the configuration locked, under a time limit and a row limit. Only one statement is accepted.
"""

from __future__ import annotations

import threading
from pathlib import Path

import duckdb
import polars as pl


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
    path: str | Path, sql: str, *, max_rows: int = 10_000, timeout_s: float = 10.0
) -> pl.DataFrame:
    """Run one statement read-only; at most ``max_rows`` rows, interrupted after ``timeout_s``."""
    text = sql.strip().rstrip(";")
    if not text:
        raise ReadOnlyQueryError("empty query")
    try:
        con = open_readonly(path)
    except duckdb.Error as exc:
        raise ReadOnlyQueryError(f"cannot open store {path}: {exc}") from exc
    return run_on(con, text, max_rows=max_rows, timeout_s=timeout_s, close=True)


def run_on(
    con: duckdb.DuckDBPyConnection, sql: str, *, max_rows: int, timeout_s: float, close: bool = False
) -> pl.DataFrame:
    timer = threading.Timer(timeout_s, con.interrupt)
    timer.start()
    try:
        statements = con.extract_statements(sql)
        if len(statements) != 1:
            raise ReadOnlyQueryError(f"exactly one statement allowed, got {len(statements)}")
        if statements[0].type != duckdb.StatementType.SELECT:
            raise ReadOnlyQueryError(f"only SELECT queries are allowed, got {statements[0].type.name}")
        rel = con.sql(sql)
        return rel.limit(max_rows).pl()
    except duckdb.InterruptException as exc:
        raise ReadOnlyQueryError(f"query exceeded its {timeout_s:g} s time limit") from exc
    except duckdb.Error as exc:
        raise ReadOnlyQueryError(str(exc).splitlines()[0]) from exc
    finally:
        timer.cancel()
        if close:
            con.close()
