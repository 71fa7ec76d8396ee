"""collector.engine: DuckDB's extension module stands in for the package, with the same objects."""

from __future__ import annotations

import subprocess
import sys

import duckdb

from collector import engine


def test_engine_is_the_extension_module_with_the_package_objects() -> None:
    # rule 1: the extension module itself; rule 2: what the package re-exports is the same object
    assert engine.duckdb is sys.modules["_duckdb"]
    assert engine.duckdb.connect is duckdb.connect
    assert engine.duckdb.Error is duckdb.Error
    assert engine.duckdb.DuckDBPyConnection is duckdb.DuckDBPyConnection
    con = engine.duckdb.connect(":memory:")
    try:
        con.execute("SELECT * FROM no_such_table")
    except duckdb.CatalogException as exc:  # raised through one, caught through the other
        assert "no_such_table" in str(exc)
    else:
        raise AssertionError("no error for a missing table")
    finally:
        con.close()


def test_store_loads_without_the_duckdb_package() -> None:
    code = (
        "import sys; from collector.store import Store; s = Store(':memory:', threads=1); "
        "s.close(); print('duckdb' in sys.modules, 'importlib.metadata' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
