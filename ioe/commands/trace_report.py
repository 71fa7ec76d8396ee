"""``ioe trace-report DIR``: HTA-equivalent breakdowns of a folder of Kineto traces.

A one-shot report needs no database: the parsed frames are kept in memory (a
:class:`collector.store.MemorySink`), de-duplicated on each table's natural key the way the
store's ``INSERT OR IGNORE`` would (first row wins), and analysed directly. ``ioe ingest``
followed by the store-backed analyses gives the same numbers.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    import polars as pl

    from collector.ingest import IngestReport


def parsed_frames(paths: list[Path]) -> tuple[dict[str, pl.DataFrame], IngestReport]:
    """Every file under ``paths`` parsed (format detection and refusals as ``ioe ingest``), one
    frame per table with natural-key duplicates dropped (first wins, like the store)."""
    # imported here: `ioe trace-report --help` and the other commands never load polars for it
    from collector.formats import IngestContext
    from collector.ingest import ingest_paths
    from collector.records import TABLES
    from collector.store import MemorySink

    sink = MemorySink()
    ctx = IngestContext(ts_ns=time.time_ns(), source="trace-report")
    report = ingest_paths(sink, paths, ctx)
    tables = {}
    for name in ("kernel_events", "collective_records"):
        df = sink.frame(name)
        if df.height:
            tables[name] = df.unique(subset=list(TABLES[name].key), keep="first", maintain_order=True)
    return tables, report


def report(paths: list[Path], include_last_step: bool = False) -> dict[str, Any]:
    """Breakdowns and arrival skew per trace set of the Kineto traces under ``paths``."""
    from analyzer import hta
    from analyzer.collectives import collectives_of, instances, rank_waits

    tables, ingest = parsed_frames(paths)
    out: dict[str, Any] = {"problems": [str(p) for p in ingest.problems], "sets": {}}
    events = tables.get("kernel_events")
    if events is None:
        return out
    records = tables.get("collective_records")
    for trace_set in sorted(events["trace_set"].unique().to_list()):
        kernels = hta.kernels_of(events, trace_set, include_last_step)
        entry = {name: df.to_dicts() for name, df in hta.breakdowns_of(kernels).items()}
        waits = rank_waits(collectives_of(records, f"kineto:{trace_set}")) if records is not None else None
        entry["arrival_skew"] = instances(waits).to_dicts() if waits is not None and waits.height else []
        out["sets"][trace_set] = entry
    return out


NULL_REASONS = {
    "comp_comm_overlap_pctg": "no communication kernel on this rank (every inference trace without TP)",
    "comm_comp_overlap(us)": "no communication kernel on this rank",
}


def strict(obj: Any, reasons: dict[str, str] | None = None) -> Any:
    """JSON has no NaN or Infinity: a non-finite number becomes ``null``, and the row it sits in
    gains ``null_reasons`` naming why (from :data:`NULL_REASONS`, else "not defined")."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        why: dict[str, str] = {}
        for key, value in obj.items():
            if isinstance(value, float) and not math.isfinite(value):
                out[key] = None
                why[key] = (reasons or NULL_REASONS).get(key, f"not defined ({value} in the computation)")
            else:
                out[key] = strict(value, reasons)
        if why:
            out["null_reasons"] = why
        return out
    if isinstance(obj, list | tuple):
        return [strict(v, reasons) for v in obj]
    return obj


def _pct(value: Any) -> str:
    return "n/a" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value}%"


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
        typer.echo(json.dumps(strict(result), indent=2, default=str, allow_nan=False))
        return
    for trace_set, entry in result["sets"].items():
        typer.echo(f"== {trace_set}")
        for row in entry.get("temporal_breakdown", []):
            typer.echo(
                f"  rank {row['rank']}: kernel {row['kernel_time(us)']} us, idle {row['idle_time_pctg']}%, "
                f"compute {row['compute_time_pctg']}%, non-compute {row['non_compute_time_pctg']}%"
            )
        for row in entry.get("comm_comp_overlap", []):
            typer.echo(f"  rank {row['rank']}: comm/comp overlap {_pct(row['comp_comm_overlap_pctg'])}")
        for line in skew_lines(entry.get("arrival_skew", [])):
            typer.echo(line)
    for p in result["problems"]:
        typer.echo(f"refused: {p}", err=True)
    if not result["sets"]:
        raise typer.Exit(1)


def skew_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Arrival skew in words: per communicator and op, how late the last rank arrives and who it is."""
    if not rows:
        return ["  arrival skew: no collective seen on two or more ranks"]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((str(row["comm_id"]), str(row["op"])), []).append(row)
    out = []
    for (comm, op), got in sorted(groups.items()):
        skews = sorted(float(r["skew_us"]) for r in got)
        last = [r["last_rank"] for r in got]
        top = max(set(last), key=last.count)
        median = skews[len(skews) // 2]
        out.append(
            f"  arrival skew, comm {comm} {op}: {len(got)} instances, median {median:g} us, "
            f"max {skews[-1]:g} us; last to arrive most often: rank {top} ({last.count(top)} of {len(got)})"
        )
    return out


def register(app: typer.Typer) -> None:
    app.command("trace-report")(trace_report)
