"""``ioe ingest`` (captured files → store) and ``ioe query`` (read-only SQL over a store)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from collector.formats import IngestContext
from collector.ingest import check_target, ingest_paths
from collector.readonly import ReadOnlyQueryError, run_on, statement_text
from collector.store import Store, StoreError
from ioe.commands._common import read_connection


def ingest(
    paths: list[Path] = typer.Argument(..., help="Files or directories to import."),
    store: Path = typer.Option(..., "--store", help="DuckDB store file (created if missing)."),
    host: str = typer.Option("", "--host", help="Host name for inputs that do not carry one."),
    ts: float = typer.Option(
        0.0,
        "--ts",
        help="Capture time (Unix seconds) for inputs without timestamps (default: each file's mtime).",
    ),
    target: str = typer.Option(
        "",
        "--target",
        help="Every file is a capture of this one scrape target (a folder of periodic scrapes): "
        "its series are named by it, not by each file's path.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    progress: bool | None = typer.Option(
        None,
        "--progress/--no-progress",
        help="Progress bar on stderr (default: on a terminal, once an import runs over 2 s).",
    ),
) -> None:
    """Import captured files (format detected from content) and print rows stored per table."""
    from ioe.progress import IngestProgress

    ctx = IngestContext(
        ts_ns=int(ts * 1e9) if ts else 0, host=host, source="ingest", ts_given=bool(ts), target=target
    )
    try:
        check_target(paths, ctx)
        bar = IngestProgress(paths, forced=progress)
        try:
            with Store(store) as st:
                report = ingest_paths(st, paths, ctx, progress=bar if bar.enabled else None)
        finally:
            bar.close()
    except (FileNotFoundError, StoreError, ValueError) as exc:
        typer.echo(f"ioe ingest: {exc}", err=True)
        raise typer.Exit(2) from exc
    out = {
        "rows": dict(report.rows),
        "files": dict(report.files),
        "problems": [str(p) for p in report.problems],
        "problems_not_listed": report.problems_not_listed,
        "unrecognized": report.unrecognized,
        "unrecognized_why": report.reasons,
    }
    if as_json:
        typer.echo(json.dumps(out, indent=2))
    else:
        for table, n in sorted(report.rows.items()):
            typer.echo(f"{table:24s} {n:>10d} rows")
        for fmt, n in sorted(report.files.items()):
            typer.echo(f"format {fmt:17s} {n:>10d} files")
        for p in report.problems:
            typer.echo(f"refused: {p}", err=True)
        if report.problems_not_listed:
            typer.echo(f"refused: {report.problems_not_listed:,} more problem(s) not listed", err=True)
        for u in report.unrecognized:
            typer.echo(f"unrecognized: {u}: {report.reasons.get(u, '')}", err=True)
    if not report.files:
        raise typer.Exit(1)


def query(
    sql: str = typer.Argument(..., help="One read-only SQL statement."),
    store: Path | None = typer.Option(None, "--store", help="DuckDB store file."),
    fmt: str = typer.Option("csv", "--format", help="csv or json"),
    limit: int = typer.Option(10_000, "--limit", help="Most rows returned."),
    config: Path | None = typer.Option(
        None, "--config", help="Config file naming the store (e.g. a DuckLake)."
    ),
    lake_dsn: str | None = typer.Option(None, "--lake-dsn", help="DuckLake catalog (libpq DSN) to read."),
    lake_data: str | None = typer.Option(
        None, "--lake-data", help="DuckLake data path (default: the catalog's)."
    ),
) -> None:
    """Run read-only SQL over a store and print the result as CSV or JSON."""
    if fmt not in ("csv", "json"):
        raise typer.BadParameter("--format must be csv or json")
    try:
        # a live writer's store file: a snapshot; a DuckLake: attached read-only
        with read_connection("ioe query", store, config, lake_dsn, lake_data) as (con, lake):
            if lake:  # the catalog is reachable from this connection: the API's checked statements
                from api.query import run_query

                result = run_query(con, sql, max_rows=limit, timeout_s=10.0)
            else:
                result = run_on(con, statement_text(sql), max_rows=limit, timeout_s=10.0)
    except ReadOnlyQueryError as exc:
        typer.echo(f"query refused: {exc}", err=True)
        raise typer.Exit(2) from exc
    if fmt == "json":
        typer.echo(json.dumps(result.to_dicts(), default=str))
    else:
        result.write_csv(sys.stdout)


def register(app: typer.Typer) -> None:
    app.command("ingest")(ingest)
    app.command("query")(query)
