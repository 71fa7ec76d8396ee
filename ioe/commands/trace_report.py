"""``ioe trace-report DIR``: HTA-equivalent breakdowns of a folder of Kineto traces."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer

from analyzer import hta
from analyzer.collectives import instances, load_collectives, rank_waits
from collector.formats import IngestContext
from collector.ingest import ingest_paths
from collector.store import Store


def report(paths: list[Path], include_last_step: bool = False) -> dict[str, Any]:
    """Ingest ``paths`` into an in-memory store; breakdowns and arrival skew per trace set."""
    st = Store(":memory:")
    ingest = ingest_paths(st, paths, IngestContext(ts_ns=time.time_ns(), source="trace-report"))
    out: dict[str, Any] = {"problems": [str(p) for p in ingest.problems], "sets": {}}
    with st.cursor() as con:
        for trace_set in hta.trace_sets(con):
            tables = hta.breakdowns(con, trace_set, include_last_step)
            entry = {name: df.to_dicts() for name, df in tables.items()}
            waits = rank_waits(load_collectives(con, f"kineto:{trace_set}"))
            entry["arrival_skew"] = instances(waits).to_dicts() if waits.height else []
            out["sets"][trace_set] = entry
    st.close()
    return out


def trace_report(
    paths: list[Path] = typer.Argument(..., help="Trace folders (one set per folder) or files."),
    include_last_step: bool = typer.Option(False, "--include-last-step", help="Keep the last ProfilerStep."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Temporal breakdown, comm/comp overlap, kernel-type breakdown and arrival skew per rank."""
    try:
        result = report(paths, include_last_step)
    except FileNotFoundError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
        return
    for trace_set, entry in result["sets"].items():
        typer.echo(f"== {trace_set}")
        for row in entry.get("temporal_breakdown", []):
            typer.echo(
                f"  rank {row['rank']}: kernel {row['kernel_time(us)']} us, idle {row['idle_time_pctg']}%, "
                f"compute {row['compute_time_pctg']}%, non-compute {row['non_compute_time_pctg']}%"
            )
        for row in entry.get("comm_comp_overlap", []):
            typer.echo(f"  rank {row['rank']}: comm/comp overlap {row['comp_comm_overlap_pctg']}%")
    for p in result["problems"]:
        typer.echo(f"refused: {p}", err=True)
    if not result["sets"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("trace-report")(trace_report)
