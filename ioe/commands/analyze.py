"""``ioe analyze``: zones, evidence, Cp, headroom and p99 regressions per deployment.

``ioe analyze --store FILE [--deployment D] [--window 15m] [--at TIME] [--json]``, or
``--lake-dsn DSN [--lake-data PATH]`` (or ``--config`` naming ``store_backend: ducklake``) for the
DuckLake fleet store. The command is a typer group (``invoke_without_command``) so sub-commands
such as ``ioe analyze stragglers`` can be added beside the default report. It opens the store
read-only (a snapshot of a file while a running sidecar or ``ioe serve`` holds it; a lake attached
read-only: :func:`ioe.commands._common.read_connection`) and prints; the analysis itself is
:func:`analyzer.report.build_report` (the same objects the API serves).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import typer

from analyzer.deployments import find_deployment, list_deployments
from analyzer.report import build_report, latest_ns
from ioe.commands._common import epoch_ns, fail, read_connection

NS = 1_000_000_000
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

analyze_app = typer.Typer(help="Envelope zones, Cp, headroom and p99 regressions per deployment.")


def parse_duration(text: str) -> float:
    """``"15m"`` → 900.0; raises ``typer.BadParameter`` quoting the text otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise typer.BadParameter(f"window {text!r}: expected a positive number with s, m, h or d (e.g. 15m)")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def parse_time(text: str) -> int:
    """Unix seconds or ISO-8601 (UTC when no zone) → ns; one line quoting the text and exit 2 otherwise."""
    ns = epoch_ns(text)
    if ns is None:
        fail(f"ioe analyze: --at {text!r}: expected Unix seconds or an ISO-8601 time in 1970-2262")
    return ns


def _text(report: dict[str, Any]) -> str:
    lines = []
    for d in report["deployments"]:
        env, cp, room = d["envelope"], d["cp"], d["headroom"]
        name = d["deployment"]["name"]
        second = f", secondary {env['secondary']}" if env["secondary"] else ""
        lines.append(f"{name}: {env['primary']}{second} (confidence {env['confidence']:.2f})")
        for e in env["evidence"]:
            if e["verdict"] != "info":
                lines.append(f"  [{e['verdict']:>4}] {e['zone']:<13} {e['signal']:<30} {e['value']!s:<12} "
                             f"{e['compared_with']:<8} {e['note']}")  # fmt: skip
        cp_text = f"{cp['cp']:.1f} ({cp['cp_low']:.1f}-{cp['cp_high']:.1f})" if cp["cp"] else (
            f"not reached (> {cp['cp_lower_bound']})")  # fmt: skip
        lines.append(f"  Cp: {cp_text}; headroom: {json.dumps(room)}")
        reg = d["regression"]
        for m in reg["metrics"]:
            lines.append(f"  p99 {m['metric']}: {m['now_s']} s vs {m['baseline_s']} s ({m['verdict']})")
        for m in env["missing"]:
            lines.append(f"  missing: {m}")
    return "\n".join(lines)


@analyze_app.callback(invoke_without_command=True)
def analyze(
    ctx: typer.Context,
    store: Path | None = typer.Option(None, "--store", help="DuckDB store file."),
    deployment: str | None = typer.Option(None, "--deployment", help="Only this deployment."),
    window: str = typer.Option("15m", "--window", help="Window length (s, m, h, d)."),
    at: str | None = typer.Option(
        None, "--at", help="Window end: Unix seconds or ISO-8601 (default: latest)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    config: Path | None = typer.Option(
        None, "--config", help="Config file: its analysis: block, and its store when none is named."
    ),
    lake_dsn: str | None = typer.Option(None, "--lake-dsn", help="DuckLake catalog (libpq DSN) to read."),
    lake_data: str | None = typer.Option(
        None, "--lake-data", help="DuckLake data path (default: the catalog's)."
    ),
    sets: list[str] = typer.Option(
        [], "--set", help="An analysis setting, FIELD=VALUE (repeatable), e.g. --set bin_s=30."
    ),
    explain: bool = typer.Option(
        False, "--explain", help="Print the analysis settings in force and their origin."
    ),
) -> None:
    """Print each deployment's zone with its evidence, Cp, headroom and p99 regressions."""
    if ctx.invoked_subcommand is not None:
        return
    th, origins = _analysis(config, sets)
    if explain:
        for name, value in th.model_dump().items():
            typer.echo(f"{name} = {value}  ({origins[name]})")
        if store is None and not lake_dsn:
            return
    window_s = parse_duration(window)
    with read_connection("ioe analyze", store, config, lake_dsn, lake_data) as (con, _):
        report = _report(con, str(store or lake_dsn or config), deployment, window_s, at, th)
    typer.echo(json.dumps(report, indent=2, default=str) if as_json else _text(report))


def _report(
    con: Any, store: str, deployment: str | None, window_s: float, at: str | None, th: Any
) -> dict[str, Any]:
    end_ns = parse_time(at) if at else latest_ns(con)
    if end_ns is None:
        typer.echo(f"store {store}: no engine or GPU samples to analyze", err=True)
        raise typer.Exit(1)
    try:
        since = end_ns - int(window_s * NS)
        deps = [find_deployment(con, deployment, since)] if deployment else list_deployments(con, since)
    except KeyError as exc:
        fail(f"ioe analyze: {exc.args[0]}")
    return build_report(con, deps, end_ns, window_s, th)


def _analysis(config: Path | None, sets: list[str]) -> tuple[Any, dict[str, str]]:
    """The analysis settings (defaults < config < IOE_ANALYSIS__* < --set) and each one's origin;
    a bad name or value exits 2 with one line naming it."""
    from ioe.settings import SettingsError, analysis_origins, load_settings

    given: dict[str, Any] = {}
    for item in sets:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            typer.echo(f"--set {item!r}: expected FIELD=VALUE", err=True)
            raise typer.Exit(2)
        try:
            given[name.strip()] = json.loads(raw)
        except ValueError:
            given[name.strip()] = raw
    try:
        # --set merges over the config/env analysis block field by field
        settings = load_settings(config, args={"analysis": given} if given else None)
    except SettingsError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    return settings.thresholds(), analysis_origins(config, sets=given)


def register(app: typer.Typer) -> None:
    from ioe.commands.stragglers import stragglers_command

    analyze_app.command("stragglers")(stragglers_command)
    app.add_typer(analyze_app, name="analyze")
