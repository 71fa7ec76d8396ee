"""``ioe sidecar``'s body, and its start without typer or pydantic for a collector-only agent.

A collector-only sidecar (``api_enabled: false``) has a budget of 100 MB peak resident (issue 24:
over 10 minutes); typer and pydantic's settings models would be ~12 MB of that and it needs
neither once started (bench/results/sidecar.md). So :func:`main` is the entry point's way in for
``ioe sidecar``.

Rules:
  1. ``ioe sidecar`` with nothing but ``--config``, ``--store``, ``--port`` and ``--listen`` (each
     ``--opt VALUE`` or ``--opt=VALUE``; the last one given counts, as in click) is parsed here.
     Anything else — help, an unknown option, a missing value, a port that is not an integer — is
     handed to typer, so help and usage errors are the command's own.
  2. The settings are validated by ``load_settings`` in a child process
     (:func:`ioeconf.plain.validated`): the same checks and the same one-line error, exit 2. A
     collector-only agent runs on :class:`ioeconf.plain.PlainSettings`, with DuckDB's allocator
     returning freed memory at once (:data:`COLLECTOR_JEMALLOC`, unless ``DUCKDB_JE_MALLOC_CONF``
     is set); with the API on, the settings are loaded again in this process (the API takes the
     models and imports pydantic anyway).
  3. :func:`run` is the command for both ways in (``ioe.commands.sidecar``'s rules): ports checked
     first, a store that cannot be opened is one line and exit 2, Ctrl-C and SIGTERM stop it.
  4. A collector-only agent that scrapes no ``https://`` URL and runs no OTLP/gRPC receiver does
     not load Python's ``ssl`` (OpenSSL: 4.6 MB resident, imported by asyncio and ``http.client``
     only if present): :func:`without_tls`.
  5. A collector-only agent's threads (event loop, writer, health server, maintenance) share one
     glibc malloc arena (:func:`one_malloc_arena`, unless ``MALLOC_ARENA_MAX`` is set in the
     environment): glibc otherwise gives each thread that allocates its own arena, whose freed
     pages stay resident apart from the others'.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, cast

from ioe.entry import configure_logging

if TYPE_CHECKING:
    from collector.agent import Frontend
    from ioe.settings import Settings

COMMAND = "ioe sidecar"
# DuckDB's own jemalloc (read once, when the library loads): freed pages go back to the system at
# once. With jemalloc's decay (DuckDB sets 1 s), a collector's RSS kept what each maintenance pass
# and checkpoint freed: 135-140 MB after 3 minutes of the bench's node replayed in process, 108-115
# MB with this and a checkpoint after each pass (collector.agent.Agent._maintain), same total CPU.
COLLECTOR_JEMALLOC = "dirty_decay_ms:0,muzzy_decay_ms:0"
# glibc's mallopt parameter for the most arenas (M_ARENA_MAX in malloc.h). With one arena the
# bench's collector (8 GPUs + 2 engines at 1 Hz) ran with 3.6-3.9 MB less resident after 165 s and a
# peak 1.8 MB lower, at the same CPU (side by side, bench/results/sidecar.md round 9).
M_ARENA_MAX = -8
_OPTIONS = {"--config": "config", "--store": "store_path", "--port": "listen_port", "--listen": "listen_host"}


def parse(args: list[str]) -> dict[str, Any] | None:
    """Rule 1: the options given (``config`` and the settings they override), or None for typer."""
    got: dict[str, Any] = {}
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name not in _OPTIONS:
            return None
        if not eq:
            if i + 1 >= len(args) or args[i + 1].startswith("-"):
                return None
            value = args[i + 1]
            i += 1
        if name == "--port":
            try:
                got[_OPTIONS[name]] = int(value)
            except ValueError:
                return None
        else:
            got[_OPTIONS[name]] = value
        i += 1
    return got


def main(args: list[str]) -> None:
    """Rules 1-2: ``ioe sidecar ARGS`` (``args`` after the command name)."""
    given = parse(args)
    if given is None:
        from ioe.cli import main as typer_main

        typer_main()
        return
    configure_logging()
    from ioeconf.plain import PlainSettings, SettingsError, validated

    config = given.pop("config", None)
    try:
        dump = validated(config, given)
    except SettingsError as exc:
        print(str(exc), file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    if dump["api_enabled"]:
        from ioe.commands._common import settings_or_exit

        settings = _exits(lambda: settings_or_exit(config, **given))
    else:
        settings = cast("Settings", PlainSettings(dump))
        if "_duckdb" not in sys.modules:  # not loaded yet: this process's first DuckDB
            os.environ.setdefault("DUCKDB_JE_MALLOC_CONF", COLLECTOR_JEMALLOC)
        if not needs_tls(settings):
            without_tls()
        one_malloc_arena()
    _exits(lambda: run(settings))


def needs_tls(settings: Settings) -> bool:
    """Rule 4: whether a collector-only agent may need Python's ``ssl``: an ``https://`` target or
    Prometheus source, or the OTLP/gRPC receiver (its server library is not checked here)."""
    urls = [t.url for t in settings.targets] + [p.url for p in settings.prometheus_sources]
    return bool(settings.otlp.grpc_port) or any(u.startswith("https:") for u in urls)


def without_tls() -> None:
    """Rule 4: ``import ssl`` fails from here on in this process (a ``None`` in ``sys.modules`` is
    Python's way to say a module is absent), unless it was imported already. asyncio,
    ``http.client`` and ``http.server`` import it only if they can and run without it."""
    if "ssl" not in sys.modules:
        sys.modules["ssl"] = None  # type: ignore[assignment]


def one_malloc_arena() -> bool:
    """Rule 5: glibc's malloc keeps one arena for every thread started from here on; False where
    ``MALLOC_ARENA_MAX`` is set (glibc read it at start) or the C library has no ``mallopt``
    that takes it (not glibc)."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_ARENA_MAX, 1))


def _exits(work: Any) -> Any:
    """``work()``; the shared helpers end a command with typer's ``Exit`` (click's, a
    RuntimeError carrying ``exit_code``), which outside typer becomes that exit status."""
    try:
        return work()
    except RuntimeError as exc:
        code = getattr(exc, "exit_code", None)
        if not isinstance(code, int):
            raise
        raise SystemExit(code) from None


def run(settings: Settings) -> None:
    """Rule 3: the sidecar on ``settings`` until SIGINT or SIGTERM."""
    import asyncio

    from collector.agent import Agent
    from collector.engine import duckdb
    from collector.store import StoreError
    from ioe.commands._common import bind_or_exit, exposure_or_exit, fail, store_problem

    exposure_or_exit(settings)
    if settings.listen_port:  # port 0: any free port, never taken
        bind_or_exit(COMMAND, settings.listen_host, settings.listen_port, keep=False)
    if settings.otlp.grpc_port:
        bind_or_exit(COMMAND, settings.listen_host, settings.otlp.grpc_port, keep=False)
    try:
        agent = Agent(settings, frontend=_api_frontend() if settings.api_enabled else None)
    except (StoreError, duckdb.Error) as exc:
        fail(f"{COMMAND}: {store_problem(settings.store_path, exc)}")
    print(
        f"{COMMAND}: {len(settings.targets)} target(s), store {settings.store_path}, "
        f"listening on http://{settings.listen_host}:{settings.listen_port}",
        file=sys.stderr,
        flush=True,
    )
    try:
        asyncio.run(agent.run())
    except KeyboardInterrupt:  # before the agent's own handlers are installed
        raise SystemExit(0) from None


def _api_frontend() -> Frontend:
    """The API (``api_enabled: true``); imported only then, so a collector-only agent never loads
    the web stack."""
    from api.agent import serve_api

    return serve_api
