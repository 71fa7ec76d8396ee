"""Read-only SQL over the store the server already holds open.

The serving process owns the store's one DuckDB database (DuckDB refuses a second, differently
configured connection to the same file in one process), so a query runs on a *cursor* of that
database. The database itself is locked down once the store is open (no file, URL or glob reads,
no ``ATTACH``/``COPY``/``INSTALL``, no extension autoload, configuration locked:
:meth:`collector.store.Store.lock_down`), and the statement is checked before it runs, on
DuckDB's own parse tree (``json_serialize_sql``), never on the text:

  1. Exactly one statement, of type SELECT: INSERT/UPDATE/DELETE/CREATE/ATTACH/DETACH/COPY/
     INSTALL/LOAD/SET/PRAGMA/CALL/EXPORT are other statement types and are refused.
  2. Every table reference is a store table (:data:`collector.records.TABLES`) or a CTE *in
     scope*, without a catalog and with no schema other than ``main``. A CTE is in scope in the
     main query and in the CTEs declared after it, never in its own body (except as the
     recursive reference of a ``WITH RECURSIVE … UNION``): ``WITH "/x.csv" AS (SELECT * FROM
     '/x.csv') …`` names a file inside its own body and is refused. Table and CTE names are plain
     identifiers (letters, digits, ``_``): a quoted file name, URL or glob never passes.
  3. Table functions are refused except the pure generators :data:`ALLOWED_TABLE_FUNCTIONS`, and
     ``range``/``generate_series`` only with constant bounds producing at most
     :data:`MAX_GENERATED_ROWS` rows; :data:`DENIED_FUNCTIONS` (settings, variables, sequences,
     SQL-from-JSON, and functions that build one huge value from a small query: ``repeat``,
     padding, ``printf``/``format`` widths, list resizing, ``bar``) are refused.
  4. Any parse-tree node kind outside the known set (``SHOW``/``SUMMARIZE``, ``PIVOT`` …) is
     refused rather than guessed at.
  5. The query is interrupted after ``timeout_s`` or when it grows the process's memory past a
     cap, and at most ``max_rows`` rows and ``max_bytes`` bytes come back (:func:`collector.readonly.run_on`).

The file-backed, separate-connection variant used by the CLI is :mod:`collector.readonly`.
"""

from __future__ import annotations

import json
import re
from typing import Any

import duckdb
import polars as pl

from collector.readonly import MAX_BYTES, ReadOnlyQueryError, run_on
from collector.records import TABLES

ALLOWED_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})
DENIED_FUNCTIONS = frozenset(
    {
        "current_setting",
        "getvariable",
        "nextval",
        "currval",
        "json_deserialize_sql",
        "setseed",
        # rule 3: a few bytes of SQL that build gigabytes (repeat('x', 10000000) over 150 rows
        # made a 1.5 GB answer; DuckDB materializes a whole vector of such values at once)
        "repeat",
        "lpad",
        "rpad",
        "printf",
        "format",
        "list_resize",
        "array_resize",
        "bar",
    }
)
GENERATORS = frozenset({"range", "generate_series"})
MAX_GENERATED_ROWS = 10_000_000
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
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
    if obj.get("type") == "RECURSIVE_CTE_NODE":  # its own name, for the recursive reference
        ctes = ctes | {_cte_name(str(obj.get("cte_name", "")))}
    _check_node(obj, ctes)
    entries = (obj.get("cte_map") or {}).get("map", [])
    for entry in entries:  # rule 2: each CTE sees the outer scope and the CTEs before it
        _walk(entry.get("value"), ctes)
        ctes = ctes | {_cte_name(str(entry.get("key", "")))}
    for key, value in obj.items():
        if key != "cte_map":
            _walk(value, ctes)


def _cte_name(name: str) -> str:
    if not _IDENTIFIER.fullmatch(name):
        raise ReadOnlyQueryError(f"query refused: CTE name {name!r} is not a plain identifier")
    return name.lower()


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
        if name in GENERATORS:
            _check_generator(name, node.get("function") or {})
    elif node.get("class") == "FUNCTION" and str(node.get("function_name", "")).lower() in DENIED_FUNCTIONS:
        raise ReadOnlyQueryError(f"query refused: function {node['function_name']}() is not allowed")


def _check_generator(name: str, call: dict[str, Any]) -> None:
    """Rule 3: ``range``/``generate_series`` with constant integer bounds and a bounded count."""
    args = []
    for child in call.get("children", []):
        value = child.get("value") if child.get("class") == "CONSTANT" else None
        if not isinstance(value, dict) or not isinstance(value.get("value"), int):
            raise ReadOnlyQueryError(f"query refused: {name}() takes constant integer bounds here")
        args.append(int(value["value"]))
    if len(args) == 1:
        start, stop, step = 0, args[0], 1
    elif len(args) in (2, 3):
        start, stop, step = args[0], args[1], args[2] if len(args) == 3 else 1
    else:
        raise ReadOnlyQueryError(f"query refused: {name}() takes one to three bounds")
    inclusive = 1 if name == "generate_series" else 0  # range() stops before its end
    rows = 0 if step == 0 else max(0, -(-(stop - start + inclusive * step) // step))
    if step == 0 or rows > MAX_GENERATED_ROWS:
        raise ReadOnlyQueryError(f"query refused: {name}() may generate at most {MAX_GENERATED_ROWS} rows")


def _check_table(node: dict[str, Any], ctes: frozenset[str]) -> None:
    name = str(node.get("table_name", ""))
    if not _IDENTIFIER.fullmatch(name):
        raise ReadOnlyQueryError(f"query refused: {name!r} is not a store table name")
    catalog, schema = node.get("catalog_name") or "", (node.get("schema_name") or "").lower()
    if catalog or schema not in ("", "main"):
        raise ReadOnlyQueryError(f"query refused: {catalog or schema}.{name} is outside the store")
    if name.lower() in ctes and not schema:
        return
    if name not in TABLES:
        raise ReadOnlyQueryError(
            f"query refused: {name!r} is not a store table (tables: {', '.join(sorted(TABLES))})"
        )


def run_query(
    con: duckdb.DuckDBPyConnection, sql: str, *, max_rows: int, timeout_s: float, max_bytes: int = MAX_BYTES
) -> pl.DataFrame:
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
    return run_on(con, text, max_rows=max_rows, timeout_s=timeout_s, max_bytes=max_bytes)
