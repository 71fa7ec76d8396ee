"""The node agent's loop: every source on its own schedule, one writer, one API.

Rules:
1. Each scrape target, device reader and tailer runs as its own asyncio task; a dead, slow
   or garbage-spewing source only ever delays itself (its own timeout and backoff).
2. Parsing runs in a worker thread, so a large body never stalls the event loop.
3. Sources hand batches to a bounded queue (:class:`collector.writer.QueueSink`); when it is
   full the batch is dropped and counted (``ioe_rows_dropped_total{reason="queue_full"}``),
   never waited for. One writer thread is the only thing that touches the store.
4. A bad line costs that line only: the good samples of the scrape are kept, the refused ones
   are counted and logged once per scrape with the target and line, and stored in
   ``ingest_errors``: at most :data:`MAX_ERRORS_PER_SCRAPE` rows (one more counts the rest),
   and for a source that keeps sending bad lines at most once per :data:`ERRORS_EVERY_S`.
6. A target whose scrape is mostly garbage (its refused lines outnumber the samples kept) is
   down: ``up`` 0, with the share refused and the first problem as its error. Its good
   samples are still stored.
5. Health of every source is exported as ``ioe_target_up`` and friends on the sidecar's own
   ``/metrics`` after each attempt, and written to ``targets`` after each attempt whose health
   differs from the last row written (up, error, samples kept, lines refused, failures in a row)
   and otherwise at most every ``health_every_s`` (0: after every attempt; a collector-only
   agent on its own DuckDB file, which nothing reads while it runs,
   :data:`collector.agent.COLLECTOR_HEALTH_EVERY_S`).
   A stop writes each source's latest health not yet written, so the stored row after a clean
   stop is the last attempt's.
7. A ``prometheus_sources`` entry with ``follow: true`` is polled like a target (its own task,
   backoff and health row); a failed poll leaves its range to be asked for again
   (:class:`collector.sources.prometheus_api.Follower`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from collector.batch import Batch
from collector.errors import Problem
from collector.formats import Parsed
from collector.formats.scrape import ScrapeCache, parse_scrape, replay_scrape
from collector.rates import CounterRates
from collector.records import batch
from collector.selfmetrics import SelfMetrics
from collector.sink import Overloaded
from collector.sources.http_client import HttpClient
from collector.sources.http_scraper import Health, ScrapeError, fetch, next_delay
from collector.writer import QueueSink

if TYPE_CHECKING:  # the settings models are pydantic's: a collector runs on plain settings
    from ioeconf.settings import DeploymentSpec, PrometheusSourceSpec, Settings, TargetSpec

log = logging.getLogger(__name__)

MAX_ERRORS_PER_SCRAPE = 10
ERRORS_EVERY_S = 60.0


class Reader(Protocol):
    """A device reader (NVML, pydcgm, InfiniBand sysfs)."""

    name: str

    def available(self) -> tuple[bool, str]: ...

    def read(self, ts_ns: int) -> Parsed: ...


@dataclass
class SourceState:
    name: str
    kind: str
    url: str = ""
    host: str = ""
    health: Health = field(default_factory=Health)
    written: tuple[Any, ...] | None = None  # rule 5: the health last written to `targets`
    written_ns: int = 0  # and when
    unwritten: bool = False  # an attempt's health not written yet


class Sidecar:
    """Runs the sources of one node against a sink; see the module rules."""

    def __init__(
        self,
        settings: Settings,
        sink: QueueSink,
        metrics: SelfMetrics,
        *,
        readers: list[Reader] | None = None,
        clock: Callable[[], int] = time.time_ns,
        rng: random.Random | None = None,
        health_every_s: float = 0.0,
    ):
        self.settings = settings
        self.health_every_ns = int(health_every_s * 1e9)  # rule 5
        self.sink = sink
        self.metrics = metrics
        self.readers = readers or []
        self.clock = clock
        self.rng = rng or random.Random()
        self.states: dict[str, SourceState] = {}
        self._rates: dict[str, CounterRates] = {}
        self._caches: dict[str, ScrapeCache] = {}  # one per target (scrape rule 5)
        self._errors_at: dict[str, int] = {}  # when each source's problems were last stored (rule 4)
        self._stop = asyncio.Event()

    # -- lifecycle --------------------------------------------------------------------------
    async def run(self, extra: list[Callable[[], Any]] | None = None) -> None:
        """Run every source until :meth:`stop`; ``extra`` are more coroutine factories to run alongside."""
        self.write_deployments(self.settings.deployments)
        async with HttpClient() as client:
            tasks = [
                asyncio.create_task(self._target_loop(client, t), name=f"target:{t.name}")
                for t in self.settings.targets
            ]
            tasks += [
                asyncio.create_task(self._reader_loop(r), name=f"reader:{r.name}") for r in self.readers
            ]
            tasks += [
                asyncio.create_task(self._prometheus_loop(p), name=f"prometheus:{p.name}")
                for p in self.settings.prometheus_sources
                if p.follow
            ]
            tasks += [asyncio.create_task(make(), name="extra") for make in extra or []]
            await self._stop.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for state in self.states.values():  # rule 5: the latest health of each source
            if state.unwritten:
                self.sink.offer("targets", _health_frame(state, self.clock()))
                state.unwritten = False

    def stop(self) -> None:
        self._stop.set()

    async def pause(self, seconds: float) -> bool:
        """Sleep unless stopped first; True when the loop should go on.

        A deadline around the stop event's own wait (``asyncio.timeout``), not ``wait_for``: that
        wraps the wait in a new task every call, three or more a second on a node."""
        if self._stop.is_set():
            return False
        try:
            async with asyncio.timeout(max(seconds, 0.0)):
                await self._stop.wait()
        except TimeoutError:
            return True
        return False

    # -- scrape targets ---------------------------------------------------------------------
    async def _target_loop(self, client: HttpClient, spec: TargetSpec) -> None:
        state = self.states.setdefault(spec.name, SourceState(spec.name, spec.kind, spec.url, spec.host))
        while True:
            started = time.monotonic()
            await self.scrape_target(client, spec, state)
            delay = next_delay(spec.interval_s, state.health.consecutive_failures, self.rng)
            if not await self.pause(delay - (time.monotonic() - started)):
                return

    async def scrape_target(self, client: HttpClient, spec: TargetSpec, state: SourceState) -> None:
        """One scrape of one target: fetch, parse off-loop, rate counters, enqueue, record health."""
        ts_ns = self.clock()
        t0 = time.monotonic()
        try:
            text = await fetch(client, spec.name, spec.url, spec.timeout_s, spec.max_body_bytes)
            cache = self._caches.setdefault(spec.name, ScrapeCache())
            host = spec.host or self.settings.host
            # a body shaped like the last one replays in ~1 ms on the loop; anything else is
            # parsed in full off the loop, so a huge or broken body never stalls other targets
            parsed = replay_scrape(
                text, kind=spec.kind, ts_ns=ts_ns, host=host, source=spec.name, cache=cache
            )
            if parsed is None:
                parsed = await asyncio.to_thread(_parse_full, spec, text, ts_ns, host, cache)
        except ScrapeError as exc:
            self._record(state, ts_ns, time.monotonic() - t0, error=str(exc))
            return
        except Exception as exc:  # a parser bug must not kill the loop of this target
            log.exception("target %s: parsing failed", spec.name)
            self._record(state, ts_ns, time.monotonic() - t0, error=f"parse failed: {exc}")
            return
        parsed = self._with_rates(spec.name, parsed)
        stored = self._enqueue(parsed, spec.name)
        error = _garbage(parsed, stored)
        self._record(
            state, ts_ns, time.monotonic() - t0, samples=stored, error=error, problems=parsed.problems
        )

    def _with_rates(self, source: str, parsed: Parsed) -> Parsed:
        engine = parsed.batches.get("engine_samples")
        if engine is not None and len(engine):
            rates = self._rates.setdefault(source, CounterRates())
            parsed.batches["engine_samples"] = rates.apply(engine)
        return parsed

    # -- Prometheus-compatible APIs in follow mode ----------------------------------------------
    async def _prometheus_loop(self, spec: PrometheusSourceSpec) -> None:
        """Poll the newest range of one API every ``interval_s`` (prometheus_api.Follower rules);
        rows go through the same queue, health to ``targets`` under the source's name."""
        from collector.sources.prometheus_api import Follower, PromApi, PrometheusError, from_spec

        state = self.states.setdefault(spec.name, SourceState(spec.name, "prometheus", spec.url, spec.host))
        follower: Follower | None = None
        while True:
            ts_ns, t0 = self.clock(), time.monotonic()
            try:
                if follower is None:
                    endpoint, mapping = from_spec(spec)
                    follower = Follower(
                        PromApi(endpoint), mapping, self.sink, since_s=spec.since_s, lag_s=spec.lag_s
                    )
                progress = await asyncio.to_thread(follower.poll, ts_ns)
                stored = sum(progress.rows.values())
                self._record(state, ts_ns, time.monotonic() - t0, samples=stored)
            except (PrometheusError, Overloaded) as exc:  # the range is asked for again next time
                self._record(state, ts_ns, time.monotonic() - t0, error=str(exc)[:500])
            except Exception as exc:
                log.exception("prometheus source %s: poll failed", spec.name)
                self._record(state, ts_ns, time.monotonic() - t0, error=f"poll failed: {exc}"[:500])
            delay = next_delay(spec.interval_s, state.health.consecutive_failures, self.rng)
            if not await self.pause(delay - (time.monotonic() - t0)):
                return

    # -- device readers ---------------------------------------------------------------------
    async def _reader_loop(self, reader: Reader) -> None:
        state = self.states.setdefault(
            reader.name, SourceState(reader.name, "reader", host=self.settings.host)
        )
        ok, why = await asyncio.to_thread(reader.available)
        if not ok:  # absent, not down: recorded in `targets`, not exported as ioe_target_up 0
            log.warning("reader %s not available: %s; carrying on without it", reader.name, why)
            self._record(state, self.clock(), 0.0, error=f"unavailable: {why}", export=False)
            return
        interval = self.settings.readers.interval_s
        while True:
            ts_ns, t0 = self.clock(), time.monotonic()
            try:
                parsed = await asyncio.to_thread(reader.read, ts_ns)
                stored = self._enqueue(parsed, reader.name)
                self._record(state, ts_ns, time.monotonic() - t0, samples=stored, problems=parsed.problems)
            except Exception as exc:
                log.exception("reader %s failed", reader.name)
                self._record(state, ts_ns, time.monotonic() - t0, error=str(exc))
            if not await self.pause(interval - (time.monotonic() - t0)):
                return

    # -- shared -----------------------------------------------------------------------------
    def _enqueue(self, parsed: Parsed, source: str) -> int:
        rows = 0
        for table, rows_of_table in parsed.batches.items():
            if self.sink.offer(table, rows_of_table):
                rows += len(rows_of_table)
        self.report_problems(parsed.problems, source)
        self.metrics.queue_batches.set(self.sink.queue.qsize())
        return rows

    def report_problems(self, problems: list[Problem], source: str) -> None:
        """Rule 4: count refused input, and store it in ``ingest_errors`` (bounded, throttled)."""
        if not problems:
            return
        self.metrics.dropped("parse", len(problems))
        now = self.clock()
        if now - self._errors_at.get(source, -(1 << 62)) >= ERRORS_EVERY_S * 1e9:
            log.warning("%s: %d input problem(s) refused, first: %s", source, len(problems), problems[0])
            self._errors_at[source] = now
            self.sink.offer("ingest_errors", _problems_frame(_bounded(problems), source, now))

    def _record(
        self,
        state: SourceState,
        ts_ns: int,
        duration_s: float,
        *,
        samples: int = 0,
        error: str = "",
        problems: list[Problem] | None = None,
        export: bool = True,
    ) -> None:
        h = state.health
        h.scrapes += 1
        h.up = not error
        h.last_scrape_ns, h.last_duration_s, h.samples_last = ts_ns, duration_s, samples
        h.dropped_last = len(problems or [])
        if error:
            h.failures += 1
            h.consecutive_failures += 1
            if export and (h.consecutive_failures == 1 or h.consecutive_failures % 60 == 0):
                log.warning("%s down (%d in a row): %s", state.name, h.consecutive_failures, error)
        else:
            h.consecutive_failures = 0
        h.last_error = error
        if export:
            self._export(state)
        self._write_health(state, ts_ns)

    def _write_health(self, state: SourceState, ts_ns: int) -> None:
        """Rule 5: the health row of ``state`` to ``targets`` when it changed or is due, else kept
        as the one a stop writes."""
        h = state.health
        now = (h.up, h.last_error, h.samples_last, h.dropped_last, h.consecutive_failures)
        due = not self.health_every_ns or ts_ns - state.written_ns >= self.health_every_ns
        state.unwritten = not due and now == state.written
        if not state.unwritten:
            self.sink.offer("targets", _health_frame(state, self.clock()))
            state.written, state.written_ns = now, ts_ns

    def _export(self, state: SourceState) -> None:
        m = self.metrics
        m.target_up.labels(state.name, state.kind).set(1 if state.health.up else 0)
        m.scrape_duration.labels(state.name).set(state.health.last_duration_s)
        m.scrapes.labels(state.name).inc()
        if not state.health.up:
            m.scrape_failures.labels(state.name).inc()

    def write_deployments(self, specs: list[DeploymentSpec]) -> None:
        if specs:
            self.sink.offer("deployments", deployments_frame(specs, self.clock()))


def bad_lines(problems: list[Problem]) -> int:
    """Lines refused, counting the exposition parser's "N more bad lines not listed"."""
    total = 0
    for p in problems:
        head = p.message.split(" ", 1)[0]
        total += int(head) if p.message.endswith("(rule 7)") and head.isdigit() else 1
    return total


def _garbage(parsed: Parsed, stored: int) -> str:
    """Rule 6: the error of a scrape whose refused lines outnumber its samples, else ''."""
    bad = bad_lines(parsed.problems)
    if not bad or bad <= stored:
        return ""
    return f"mostly garbage: {bad} line(s) refused, {stored} sample(s) kept; first: {parsed.problems[0]}"[
        :500
    ]


def _bounded(problems: list[Problem]) -> list[Problem]:
    """Rule 4: the first problems of a scrape, and one that counts the rest."""
    if len(problems) <= MAX_ERRORS_PER_SCRAPE:
        return problems
    rest = bad_lines(problems[MAX_ERRORS_PER_SCRAPE - 1 :])
    return [*problems[: MAX_ERRORS_PER_SCRAPE - 1], Problem("scrape", f"{rest} more problem(s) not stored")]


def _parse_full(spec: TargetSpec, body: bytes, ts_ns: int, host: str, cache: ScrapeCache) -> Parsed:
    return parse_scrape(body, kind=spec.kind, ts_ns=ts_ns, host=host, source=spec.name, cache=cache)


def _health_frame(state: SourceState, now: int) -> Batch:
    h = state.health
    return batch(
        "targets",
        {
            "target": [state.name],
            "kind": [state.kind],
            "url": [state.url],
            "host": [state.host],
            "up": [h.up],
            "last_scrape_ns": [h.last_scrape_ns],
            "last_duration_s": [h.last_duration_s],
            "last_error": [h.last_error],
            "samples_last": [h.samples_last],
            "dropped_last": [h.dropped_last],
            "consecutive_failures": [h.consecutive_failures],
            "updated_ns": [now],
        },
    )


def _problems_frame(problems: list[Problem], source: str, now: int) -> Batch:
    return batch(
        "ingest_errors",
        {
            "ts_ns": [now + i for i in range(len(problems))],
            "source": [source] * len(problems),
            "location": [p.location for p in problems],
            "message": [p.message for p in problems],
        },
    )


def deployments_frame(specs: list[DeploymentSpec], now: int) -> Batch:
    """The ``deployments`` rows for declared deployments (origin ``config``)."""
    return batch(
        "deployments",
        {
            "name": [d.name for d in specs],
            "model": [d.model for d in specs],
            "gpu_type": [d.gpu_type for d in specs],
            "tp": [d.tp for d in specs],
            "pp": [d.pp for d in specs],
            "dp": [d.dp for d in specs],
            "ep": [d.ep for d in specs],
            "roles": [json.dumps(d.roles, sort_keys=True) for d in specs],
            "nodes": [json.dumps(d.nodes) for d in specs],
            "fabric": [d.fabric for d in specs],
            "engine": [d.engine for d in specs],
            "origin": ["config"] * len(specs),
            "spec": [d.model_dump_json() for d in specs],
            "updated_ns": [now] * len(specs),
        },
    )
