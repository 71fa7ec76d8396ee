"""Wiring of the node agent (``ioe sidecar``): store, write queue, sources, API and maintenance.

Start-up order: open the store (the only writer), start the writer thread, start the API
(health, self-metrics, OTLP/HTTP), the optional OTLP/gRPC receiver, then every source. On
stop the order reverses and the queue is drained into the store before it is closed, so a
clean shutdown loses nothing that was accepted.

The server on the listen port is passed in: ``frontend`` (the caller's, e.g. :func:`api.agent.serve_api`,
which ``ioe sidecar`` and ``ioe demo`` pass when ``api_enabled`` is true) is entered around the
sources' run. Without one the agent serves :class:`collector.health.HealthServer` (``/healthz``,
``/readyz``, ``/metrics`` only) and neither the web stack (FastAPI, uvicorn, pydantic's API
models) nor the analysis refresher is imported: a collector-only agent. The collector itself
never imports the API (tests/test_import_direction.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from collector.health import HealthServer
from collector.maintenance import MAINTENANCE_INTERVAL_S
from collector.selfmetrics import SelfMetrics
from collector.sidecar import Reader, Sidecar
from collector.store import Retention, Store
from collector.writer import DirectSink, QueueSink, WriterThread

if TYPE_CHECKING:  # the settings models are pydantic's: a collector runs on plain settings
    from ioeconf.settings import Settings

log = logging.getLogger(__name__)


# DuckDB buffer pool of a collector-only sidecar (``store_memory_limit``). Round 5 (series layout,
# DuckDB's default row groups): one hour of the bench's node (8 GPUs + 2 engines at 1 Hz) replayed
# in process (``bench.store_longrun``) ran with DuckDB using 6-12 MB at 32MB; at 16MB a rollup
# query found the pool full even after a checkpoint. Round 4's 16MB cap with 16,384-row groups ran
# out of memory within the first 600 cycles of the same replay. bench/results/sidecar.md.
COLLECTOR_MEMORY_LIMIT = "32MB"
# Seconds between a collector-only agent's maintenance passes when ``maintenance_interval_s`` is
# unset. Each pass rolls up again the two minutes before the last pass's end (store rollup rule 1)
# and is followed by a checkpoint, so passes every minute roll each minute up three times. The
# bench's node replayed in process (parse, flush every 10 s, maintain + checkpoint; 900-1,800
# cycles): 60 s passes cost 3.3 ms of CPU per 1 Hz cycle (maintain 1.75, checkpoint 1.55), 300 s
# passes 0.8 (the checkpoints the WAL then triggers cost the writes ~0.5-0.9 ms of it back); the
# memory each pass adds for a moment is about the same (10-13 MB). Rollups are then up to 5
# minutes behind: the raw points are there for any reader meanwhile. bench/results/sidecar.md.
COLLECTOR_MAINTENANCE_INTERVAL_S = 300.0

# Seconds between the writer's flushes when ``flush_interval_s`` is unset: with the API, whose
# readers see rows once flushed, and for a collector-only agent, which nothing reads meanwhile. Each
# flush appends each table once; part of its cost is per statement (the commit, the lookups), so
# 30 s flushes cost the bench's node (8 GPUs + 2 engines at 1 Hz, replayed in process) ~0.5-0.9 ms
# of CPU a second less than 10 s ones, ~20-30 % of the writes; 60 s saved nothing more. The queue
# then holds up to 30 s of scrapes (~3 MB for that node); a crash loses what it holds, a clean stop
# flushes it. bench/results/sidecar.md, round 9.
FLUSH_INTERVAL_S = 10.0
COLLECTOR_FLUSH_INTERVAL_S = 30.0

# Seconds between a collector-only agent's writes of a source's unchanged health to `targets`
# (collector.sidecar rule 5): nothing reads its DuckDB file while it runs (the file is locked), and
# a stop writes the latest. On DuckLake, which `ioe serve` reads while sidecars write, every attempt.
# Written after every attempt, one node's three targets cost a statement a flush (INSERT OR REPLACE
# through the key's index: 7-9 ms of CPU) and a health row a scrape: ~0.5 ms of CPU a second, 5 %
# of the bench's collector (py-spy, bench/results/sidecar.md round 11).
COLLECTOR_HEALTH_EVERY_S = 300.0

# glibc's malloc_trim, called by a collector-only agent after each flush and maintenance pass: the
# freed pages of Python's larger objects (a flush's joined columns, a pass's results) go back to the
# system instead of staying resident until reused. Side by side over 320 s with one pass (load ~1):
# peak 96.7 -> 94.6 MB, resident at the end 94.5 -> 91.1 MB, CPU 0.90 vs 0.93 % (within the spread of
# two alike sidecars). bench/results/sidecar.md, round 9.
_LIBC: Any = None


def trim_malloc() -> None:
    """Hand glibc's free heap pages back to the system; nothing where the C library has no
    ``malloc_trim`` (not glibc)."""
    global _LIBC
    if _LIBC is None:
        try:
            import ctypes

            _LIBC = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC(0)


# What serves the listen port while the sources run: called with the agent once it runs, entered
# before the sources start and left after they stop (the API: api.agent.serve_api).
Frontend = Callable[["Agent"], AbstractAsyncContextManager[Any]]


def open_store(settings: Settings, *, threads: int | None = None) -> Any:
    """The store chosen by ``settings.store_backend``: an embedded DuckDB file or DuckLake."""
    if settings.store_backend == "ducklake":
        from collector.lake import open_store as open_lake

        return open_lake(settings)
    limit = settings.store_memory_limit or (None if settings.api_enabled else COLLECTOR_MEMORY_LIMIT)
    return Store(settings.store_path, threads=threads, memory_limit=limit)


def maintenance_interval_s(settings: Settings) -> float:
    """``maintenance_interval_s`` as set, else :data:`COLLECTOR_MAINTENANCE_INTERVAL_S` for a
    collector-only agent and :data:`collector.maintenance.MAINTENANCE_INTERVAL_S` with the API."""
    if settings.maintenance_interval_s:
        return float(settings.maintenance_interval_s)
    return MAINTENANCE_INTERVAL_S if settings.api_enabled else COLLECTOR_MAINTENANCE_INTERVAL_S


def flush_interval_s(settings: Settings) -> float:
    """``flush_interval_s`` as set, else :data:`COLLECTOR_FLUSH_INTERVAL_S` for a collector-only
    agent and :data:`FLUSH_INTERVAL_S` with the API."""
    if settings.flush_interval_s:
        return float(settings.flush_interval_s)
    return FLUSH_INTERVAL_S if settings.api_enabled else COLLECTOR_FLUSH_INTERVAL_S


def health_every_s(settings: Settings) -> float:
    """collector.sidecar rule 5's ``health_every_s``: :data:`COLLECTOR_HEALTH_EVERY_S` for a
    collector-only agent on its own DuckDB file, else 0 (every attempt: the API, or a DuckLake
    store that other processes read while it runs)."""
    alone = not settings.api_enabled and settings.store_backend != "ducklake"
    return COLLECTOR_HEALTH_EVERY_S if alone else 0.0


def build_readers(settings: Settings) -> list[Reader]:
    """The device readers enabled in settings; each reports for itself whether it can run here."""
    readers: list[Reader] = []
    r = settings.readers
    if r.nvml:
        from collector.sources.nvml import NvmlReader

        readers.append(NvmlReader(host=settings.host))
    if r.dcgm:
        from collector.sources.pydcgm import DcgmReader

        readers.append(DcgmReader(host=settings.host))
    if r.infiniband:
        from collector.sources.infiniband import InfinibandReader

        readers.append(InfinibandReader(root=r.sysfs_infiniband, host=settings.host))
    return readers


class Agent:
    """Owns every moving part of one sidecar process."""

    def __init__(
        self, settings: Settings, *, readers: list[Reader] | None = None, frontend: Frontend | None = None
    ):
        self.settings = settings
        self.frontend = frontend
        self.metrics = SelfMetrics()
        self.store = open_store(settings, threads=1)  # small batched inserts: one thread is cheapest
        self.metrics.watch_store(self.store)
        self.queue = QueueSink(settings.queue_max_batches, on_drop=self._dropped)
        self.writer = WriterThread(
            self.queue,
            self.store,
            flush_interval_s=flush_interval_s(settings),
            on_stored=self.metrics.stored,
            on_error=lambda t, n, e: self.metrics.dropped("write_error", n),
            after_flush=None if settings.api_enabled else trim_malloc,
        )
        self.sidecar = Sidecar(
            settings,
            self.queue,
            self.metrics,
            readers=build_readers(settings) if readers is None else readers,
            health_every_s=health_every_s(settings),
        )
        # receivers acknowledge only what is committed (their clients retry what was not)
        self.direct = DirectSink(self.store, on_stored=self.metrics.stored)
        self._grpc: Any = None

    def _dropped(self, table: str, rows: int) -> None:
        self.metrics.dropped("queue_full", rows)

    async def run(self, *, install_signals: bool = True) -> None:
        self.writer.start()
        if install_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.sidecar.stop)
        self._start_grpc()
        front = self._health() if self.frontend is None else self.frontend(self)
        try:
            async with front:
                await self.sidecar.run(extra=self._extra_loops())
        finally:
            self.close()

    @contextlib.asynccontextmanager
    async def _health(self) -> AsyncIterator[None]:
        health = HealthServer(
            self.settings.listen_host,
            self.settings.listen_port,
            [self.metrics.registry],
            self.store.schema_version,
        )
        health.start()
        try:
            yield
        finally:
            await asyncio.to_thread(health.stop)

    def _extra_loops(self) -> list[Callable[[], Any]]:
        # On DuckLake many sidecars share one store and rollups are not safe from two processes at
        # once: `ioe serve` is the one maintainer there (collector.maintenance).
        loops: list[Callable[[], Any]] = (
            [] if self.settings.store_backend == "ducklake" else [self._maintenance_loop]
        )
        if self.settings.nccl_inspector_dir:
            loops.append(self._inspector_loop)
        return loops

    def _start_grpc(self) -> None:
        if self.settings.otlp.grpc_port:
            from collector.sources.otlp_grpc import start_grpc_receiver

            self._grpc = start_grpc_receiver(
                self.direct,
                host=self.settings.listen_host,
                port=self.settings.otlp.grpc_port,
                max_message_bytes=self.settings.otlp.max_body_bytes,
                token=self.settings.token,
                on_shed=lambda: self.metrics.otlp_shed.labels("grpc").inc(),
            )

    async def _maintenance_loop(self) -> None:
        retention = Retention(self.settings.raw_retention_s, self.settings.rollup_retention_s)
        while await self.sidecar.pause(maintenance_interval_s(self.settings)):
            try:
                await asyncio.to_thread(self._maintain, retention)
            except Exception:
                log.exception("store maintenance failed; will retry next interval")

    def _maintain(self, retention: Retention) -> None:
        """One maintenance pass; a collector-only agent then checkpoints, which hands the pass's
        rewritten rollup rows and the rows appended since the last checkpoint to the file:
        DuckDB's in-memory tables fall from ~26-28 MB (its 32 MB cap) to ~4 MB, and with
        :data:`ioe.sidecar.COLLECTOR_JEMALLOC` the memory goes back to the system (an hour of the
        bench's node replayed in process: 135-140 MB resident after 3 minutes without either,
        108-115 MB with both; the same total CPU, the checkpoints the WAL would trigger anyway).
        Then glibc's free pages go back too (:func:`trim_malloc`)."""
        self.store.maintain(time.time_ns(), retention)
        if not self.settings.api_enabled:
            self.store.checkpoint()
            trim_malloc()

    async def _inspector_loop(self) -> None:
        from pathlib import Path

        from collector.sources.tailer import InspectorTailer

        directory = Path(self.settings.nccl_inspector_dir)
        state = Path(self.settings.store_path).with_suffix(".inspector-offsets.json")
        tailer = InspectorTailer(directory, state, self.queue)
        while await self.sidecar.pause(self.settings.readers.interval_s):
            try:
                report = await asyncio.to_thread(tailer.poll)
                self.sidecar.report_problems(report.problems, "nccl-inspector")
            except Exception:
                log.exception("NCCL Inspector tailer failed on %s; will retry", directory)

    def close(self) -> None:
        if self._grpc is not None:
            self._grpc.stop()
        self.writer.stop()
        self.store.close()
