"""``ioe stragglers``: straggler ranks by arrival skew, with the culprit GPU's evidence."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from analyzer.stragglers import Thresholds, analyze
from collector.store import Store, StoreError


def _mapping(spec: str) -> dict[int, tuple[str, int]]:
    """``0=hostA:0,1=hostA:1`` → {0: ("hostA", 0), 1: ("hostA", 1)}."""
    out: dict[int, tuple[str, int]] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        try:
            rank, where = item.split("=", 1)
            host, gpu = where.rsplit(":", 1)
            out[int(rank)] = (host, int(gpu))
        except ValueError as exc:
            raise typer.BadParameter(f"--rank-gpu: expected RANK=HOST:GPU, got {item!r}") from exc
    return out


def stragglers_command(
    store: Path = typer.Option(..., "--store", help="DuckDB store file."),
    origin: str = typer.Option("", "--origin", help="One collective origin (default: each on its own)."),
    window_s: float = typer.Option(10.0, "--window-s", help="Window length for persistence, seconds."),
    rank_gpu: str = typer.Option("", "--rank-gpu", help="Rank→GPU map: 0=hostA:0,1=hostA:1,..."),
    as_json: bool = typer.Option(False, "--json", help="Print the verdict as JSON."),
) -> None:
    """Find straggler ranks (arrival order tested per window with false-discovery control, persistent or
    intermittent) and name the likely cause from the GPU's telemetry."""
    if not store.exists():
        typer.echo(f"stragglers: no store at {store}", err=True)
        raise typer.Exit(2)
    try:
        with Store(store, read_only=True) as st, st.cursor() as con:
            result = analyze(con, origin or None, _mapping(rank_gpu), Thresholds(window_s=window_s))
    except StoreError as exc:
        typer.echo(f"stragglers: {exc}", err=True)
        raise typer.Exit(2) from exc
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
        return
    for o, found in result["origins"].items():
        typer.echo(f"{o}: {len(found)} straggler(s)")
        for s in found:
            slow = "" if s.get("slowness") is None else f"{s['slowness']:.1%} slower, "
            typer.echo(
                f"  rank {s['rank']} ({s['kind']}, {slow}{s['persistence']:.0%} of windows, "
                f"{s['blame_share']:.0%} of blame) on {s['host'] or '?'} gpu {s['gpu']}: {s['cause']}"
            )


def register(app: typer.Typer) -> None:
    app.command("stragglers")(stragglers_command)
