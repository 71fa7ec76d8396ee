"""``ioe backfill``: read a past range from a Prometheus, Thanos or Mimir HTTP API into a store.

``ioe backfill --prometheus URL --since 7d --store FILE [--until TIME] [--selector S ...]
[--step 15s] [--config F]``. Rows are built by the scrape mappers and written by the store, as
``ioe ingest`` writes captured files (:mod:`collector.sources.prometheus_api`).

Rules:
  1. The source is ``--prometheus URL`` with the options given here; without it, every
     ``prometheus_sources`` entry of ``--config`` is read. Options given here override that
     entry's fields (selectors, step, auth, TLS).
  2. ``--config``'s ``deployments`` are written to the store first, so the analyzer judges the
     backfilled rows under the declared layouts, as it would the sidecar's.
  3. The store's DuckDB buffer pool is capped (:data:`MEMORY_LIMIT`, or ``store_memory_limit``), so
     memory stays bounded however long the range: the reads are bounded by windows
     (prometheus_api rule 4) and the written rows are not kept cached. The windows' hours are
     written packed as they come (prometheus_api rule 5), so the close has nothing left to pack.
  4. A bad option or setting is one line and exit 2. A Prometheus that fails mid-way is one line
     naming the URL, the query and what was wrong, and exit 1; the rows written before stay
     (the summary says how many), and running the command again adds only what is missing.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import typer

from ioe.commands._common import epoch_ns, fail, settings_or_exit

COMMAND = "ioe backfill"
NS = 1_000_000_000
# DuckDB's buffer pool for the store being filled (``store_memory_limit`` overrides it). With DuckDB's
# default (80 % of RAM) the written blocks stay cached: 7 days of an 8-GPU node peaked at 461 MB
# resident (bench/results/promsrc.md); the rows go to disk either way.
MEMORY_LIMIT = "128MB"
# DuckDB worker threads of the store being filled. The reader is one Python thread and the
# Prometheus it reads often runs on the same host; a second DuckDB thread only added scheduling
# cost to each window's sort and insert (2 threads: 1.6x the CPU of 1 for the same rows on the
# project's 2-core box, bench/results/promsrc.md).
THREADS = 1
# WAL size that triggers a checkpoint in the store being filled (DuckDB's default; a collector's
# store uses 4MB). Each checkpoint rewrites the partly filled last row group of every table a
# window appended to: at 4MB that was every window's commit, ~10 % of the command's CPU; 16MB
# costs ~15 MB more resident (2 days of an 8-GPU node: bench/results/promsrc.md).
WAL_AUTOCHECKPOINT = "16MB"
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration_s(text: str, option: str) -> float:
    """``"7d"`` → 604800.0, ``"15s"`` → 15.0; one line and exit 2 otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|[smhdw]?)\s*", text)
    if not m or float(m.group(1)) <= 0:
        fail(f"{COMMAND}: {option} {text!r}: expected a positive number with ms, s, m, h, d or w (e.g. 7d)")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def time_ns(text: str, option: str) -> int:
    """Unix seconds or ISO-8601 (UTC when no zone) → ns; one line and exit 2 otherwise."""
    ns = epoch_ns(text)
    if ns is None:
        fail(f"{COMMAND}: {option} {text!r}: expected Unix seconds or an ISO-8601 time in 1970-2262")
    return ns


def backfill(
    store: Path = typer.Option(..., "--store", help="DuckDB store file (created if missing)."),
    prometheus: str | None = typer.Option(
        None, "--prometheus", help="Base URL of the Prometheus-compatible API (the path before /api/v1)."
    ),
    since: str = typer.Option("1h", "--since", help="Start this long before --until (s, m, h, d, w)."),
    until: str | None = typer.Option(None, "--until", help="End: Unix seconds or ISO-8601 (default now)."),
    selector: list[str] = typer.Option(
        [], "--selector", help="Series selector, repeatable (default: DCGM and engine metric names)."
    ),
    step: str | None = typer.Option(None, "--step", help="Resolution of the query (default 15s)."),
    config: Path | None = typer.Option(
        None, "--config", help="Config file: deployments and prometheus_sources."
    ),
    bearer_token_file: str | None = typer.Option(None, "--bearer-token-file", help="File holding a token."),
    basic_user: str | None = typer.Option(None, "--basic-user", help="HTTP basic auth user."),
    basic_password_file: str | None = typer.Option(None, "--basic-password-file", help="File holding it."),
    ca_file: str | None = typer.Option(None, "--ca-file", help="CA bundle that signed the server's cert."),
    insecure: bool = typer.Option(False, "--insecure-skip-verify", help="Do not verify the TLS certificate."),
    header: list[str] = typer.Option([], "--header", help="Extra request header NAME:VALUE, repeatable."),
    host: str | None = typer.Option(None, "--host", help="Host for GPU series that name none."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Read series of a past range from Prometheus/Thanos/Mimir into the store."""
    end_ns = time_ns(until, "--until") if until else time.time_ns()
    start_ns = end_ns - int(duration_s(since, "--since") * NS)
    given = _given(
        selector, step, bearer_token_file, basic_user, basic_password_file, ca_file, insecure, header, host
    )
    settings = settings_or_exit(config)
    specs = _specs(settings, prometheus, given)
    summary = _run(store, settings, specs, start_ns, end_ns)
    _print(summary, as_json)
    if summary["error"]:
        raise typer.Exit(1)


def _given(
    selector: list[str],
    step: str | None,
    token_file: str | None,
    user: str | None,
    password_file: str | None,
    ca_file: str | None,
    insecure: bool,
    header: list[str],
    host: str | None,
) -> dict[str, Any]:
    """Rule 1: the fields the options set (only those given)."""
    out: dict[str, Any] = {
        "selectors": selector or None,
        "step_s": duration_s(step, "--step") if step else None,
        "bearer_token_file": token_file,
        "basic_user": user,
        "basic_password_file": password_file,
        "ca_file": ca_file,
        "tls_verify": False if insecure else None,
        "host": host,
    }
    if header:
        pairs = [h.partition(":") for h in header]
        bad = [h for h, (k, sep, _) in zip(header, pairs, strict=True) if not sep or not k.strip()]
        if bad:
            fail(f"{COMMAND}: --header {bad[0]!r}: expected NAME:VALUE")
        out["headers"] = {k.strip(): v.strip() for k, _, v in pairs}
    return {k: v for k, v in out.items() if v is not None}


def _specs(settings: Any, url: str | None, given: dict[str, Any]) -> list[Any]:
    """Rule 1: the sources to read, validated like every setting."""
    from pydantic import ValidationError

    from ioeconf.settings import PrometheusSourceSpec

    if url:
        bases = [{"url": url}]
    else:
        bases = [s.model_dump() for s in settings.prometheus_sources]
        if not bases:
            fail(f"{COMMAND}: give --prometheus URL, or a --config with prometheus_sources")
    try:
        return [PrometheusSourceSpec.model_validate({**base, **given}) for base in bases]
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"])
        fail(f"{COMMAND}: invalid source setting {field}: {err['msg']} (got {err.get('input')!r})")


def _run(store: Path, settings: Any, specs: list[Any], start_ns: int, end_ns: int) -> dict[str, Any]:
    """Rules 2-4: deployments, then each source in turn; a failure ends the run, rows kept."""
    from collector.sidecar import deployments_frame
    from collector.sources.prometheus_api import Progress, PromApi, PrometheusError, backfill, from_spec
    from collector.store import Store, StoreError
    from ioe.commands._common import store_problem

    t0 = time.monotonic()
    out: dict[str, Any] = {"store": str(store), "start_ns": start_ns, "end_ns": end_ns, "sources": []}
    out["error"] = ""
    try:
        st = Store(
            store,
            threads=THREADS,
            memory_limit=settings.store_memory_limit or MEMORY_LIMIT,
            wal_autocheckpoint=WAL_AUTOCHECKPOINT,
        )
    except Exception as exc:
        fail(f"{COMMAND}: {store_problem(store, exc)}")
    with st:
        if settings.deployments:
            st.write("deployments", deployments_frame(settings.deployments, time.time_ns()))
        for spec in specs:
            progress = Progress()
            try:
                endpoint, mapping = from_spec(spec)
                backfill(PromApi(endpoint), mapping, st, start_ns, end_ns, progress=progress)
            except (PrometheusError, StoreError) as exc:
                out["error"] = str(exc)
            out["sources"].append(_source_summary(spec, progress))
            if out["error"]:
                break
    out["seconds"] = round(time.monotonic() - t0, 3)
    return out


def _source_summary(spec: Any, p: Any) -> dict[str, Any]:
    return {
        "name": spec.name,
        "url": spec.url,
        "rows": dict(p.rows),
        "requests": p.requests,
        "series": p.series,
        "refused": p.problems,
        "sources": sorted(p.sources),
    }


def _print(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        for s in summary["sources"]:
            typer.echo(f"{s['name']} {s['url']}: {s['requests']} requests, {s['series']} series pieces, "
                       f"{len(s['sources'])} targets, {s['refused']} refused sample(s)")  # fmt: skip
            for table, n in sorted(s["rows"].items()):
                typer.echo(f"  {table:24s} {n:>10d} rows")
        typer.echo(f"{summary['seconds']:.1f} s")
    if summary["error"]:
        kept = sum(sum(s["rows"].values()) for s in summary["sources"])
        typer.echo(f"{COMMAND}: {summary['error']} ({kept:,} rows written before it are kept)", err=True)


def register(app: typer.Typer) -> None:
    app.command("backfill")(backfill)
