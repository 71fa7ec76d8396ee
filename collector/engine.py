"""DuckDB for the collector and the store: its engine module, without the ``duckdb`` package's
Python layer around it.

The ``duckdb`` package re-exports its C++ extension module ``_duckdb`` (``duckdb.connect is
_duckdb.connect``; the same connection and exception classes) and, at import, adds DB-API type
objects, value classes and its own version read through ``importlib.metadata``. The collector and
the store use none of those. A collector-only sidecar that imports ``_duckdb`` alone holds ~4 MB
less: peak 100.7 and 100.9 MB against 104.6 and 104.6 MB, two pairs side by side over 620 s
(bench/results/sidecar.md, round 14).

Rules:
  1. :data:`duckdb` is the extension module ``_duckdb`` where it is a top-level module of its
     own (as in the pinned DuckDB 1.5.5); elsewhere the ``duckdb`` package.
  2. A process that also imports the package (the API, the analyzer, the tests) gets the same
     objects either way, so an exception raised through one is caught through the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb
else:
    try:
        import _duckdb as duckdb
    except ImportError:  # rule 1: no separate extension module in this build
        import duckdb

__all__ = ["duckdb"]
