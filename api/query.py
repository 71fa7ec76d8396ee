"""Read-only SQL over the store the server already holds open.

The serving process owns the store's one DuckDB database (DuckDB refuses a second, differently
configured connection to the same file in one process), so a query runs on a *cursor* of that
database and the statement itself is checked before it runs, on DuckDB's own parse tree
(``json_serialize_sql``), never on the text:

  1. Exactly one statement, of type SELECT: INSERT/UPDATE/DELETE/CREATE/ATTACH/DETACH/COPY/
     INSTALL/LOAD/SET/PRAGMA/CALL/EXPORT are other statement types and are refused.
  2. Every table reference is a store table (:data:`collector.records.TABLES`) or a CTE in
     scope, without a catalog and with no schema other than ``main``: a quoted file name
     (``FROM '/etc/passwd'``, DuckDB's replacement scan), another attached database, a Python
     variable, ``ioe_state`` are refused.
  3. Table functions are refused except the pure generators :data:`ALLOWED_TABLE_FUNCTIONS`
     (``read_csv``, ``read_text``, ``glob``, ``query``, ``duckdb_settings``, ``checkpoint`` …);
     so are :data:`DENIED_FUNCTIONS` (settings, variables, sequences, SQL-from-JSON).
  4. Any parse-tree node kind outside the known set (``SHOW``/``SUMMARIZE``, ``PIVOT`` …) is
     refused rather than guessed at.
  5. The query is interrupted after ``timeout_s`` and at most ``max_rows`` rows come back.

Checks 2-4 make file, network and database access unreachable from SQL; check 1 makes writes,
``ATTACH`` and ``INSTALL`` unreachable. The file-backed, separate-connection variant used by the
CLI is :mod:`ioe.readonly`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import duckdb
import polars as pl

from collector.records import TABLES
from ioe.readonly import ReadOnlyQueryError, run_on

ALLOWED_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})
DENIED_FUNCTIONS = frozenset(
    {"current_setting", "getvariable", "nextval", "currval", "json_deserialize_sql", "setseed"}
)
_REF_KINDS = frozenset({"BASE_TABLE", "JOIN", "SUBQUERY", "EMPTY", "EXPRESSION_LIST", "TABLE_FUNCTION"})
_NODE_KINDS = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})


def parse_tree(con: duckdb.DuckDBPyConnection, sql: str) -> dict[str, Any]:
    """DuckDB's JSON parse tree of ``sql``; refused when DuckDB cannot serialize it (rule 4)."""
    row = con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
    tree = json.loads(row[0]) if row else {"error": True}
    if tree.get("error"):
        raise ReadOnlyQueryError(f"query refused: {tree.get('error_message', 'not a plain SELECT')}")
    return tree


def check_tree(tree: dict[str, Any]) -> None:
    """Rules 2-4 over the parse tree; raises :class:`ReadOnlyQueryError` naming what was found."""
    for stmt in tree.get("statements", []):
        _walk(stmt.get("node", {}), frozenset())


def _walk(obj: Any, ctes: frozenset[str]) -> None:
    if isinstance(obj, list):
        for item in obj:
            _walk(item, ctes)
        return
    if not isinstance(obj, dict):
        return
    ctes = ctes | frozenset(_cte_names(obj))
    _check_node(obj, ctes)
    for value in obj.values():
        _walk(value, ctes)


def _cte_names(node: dict[str, Any]) -> Iterator[str]:
    for entry in (node.get("cte_map") or {}).get("map", []):
        yield str(entry.get("key", "")).lower()


def _check_node(node: dict[str, Any], ctes: frozenset[str]) -> None:
    kind = node.get("type")
    is_ref = "table_name" in node or kind == "TABLE_FUNCTION" or "cte_map" in node
    if is_ref and kind not in _REF_KINDS and kind not in _NODE_KINDS:
        raise ReadOnlyQueryError(f"query refused: {kind} is not allowed")
    if kind == "BASE_TABLE":
        _check_table(node, ctes)
    elif kind == "TABLE_FUNCTION":
        name = str((node.get("function") or {}).get("function_name", "")).lower()
        if name not in ALLOWED_TABLE_FUNCTIONS:
            raise ReadOnlyQueryError(f"query refused: table function {name}() is not allowed")
    elif node.get("class") == "FUNCTION" and str(node.get("function_name", "")).lower() in DENIED_FUNCTIONS:
        raise ReadOnlyQueryError(f"query refused: function {node['function_name']}() is not allowed")


def _check_table(node: dict[str, Any], ctes: frozenset[str]) -> None:
    name = str(node.get("table_name", ""))
    catalog, schema = node.get("catalog_name") or "", (node.get("schema_name") or "").lower()
    if catalog or schema not in ("", "main"):
        raise ReadOnlyQueryError(f"query refused: {catalog or schema}.{name} is outside the store")
    if name.lower() in ctes and not schema:
        return
    if name not in TABLES:
        raise ReadOnlyQueryError(
            f"query refused: {name!r} is not a store table (tables: {', '.join(sorted(TABLES))})"
        )


def run_query(con: duckdb.DuckDBPyConnection, sql: str, *, max_rows: int, timeout_s: float) -> pl.DataFrame:
    """Rules 1-5 on a cursor of the open store."""
    text = sql.strip().rstrip(";").strip()
    if not text:
        raise ReadOnlyQueryError("empty query")
    try:
        statements = con.extract_statements(text)
    except duckdb.Error as exc:
        raise ReadOnlyQueryError(str(exc).splitlines()[0]) from exc
    if len(statements) != 1:
        raise ReadOnlyQueryError(f"exactly one statement allowed, got {len(statements)}")
    if statements[0].type != duckdb.StatementType.SELECT:
        raise ReadOnlyQueryError(f"only SELECT queries are allowed, got {statements[0].type.name}")
    check_tree(parse_tree(con, text))
    return run_on(con, text, max_rows=max_rows, timeout_s=timeout_s)
