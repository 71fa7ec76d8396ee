"""When a source's health is written to ``targets`` (collector.sidecar rule 5).

A collector-only agent writes a source's health when it changes and otherwise every
``COLLECTOR_HEALTH_EVERY_S``; with the API (whose readers see ``targets``) after every attempt. A
stop writes what is not written yet. Inputs: a served body that is first good, then an HTTP 503,
then good again, scraped on a hand-moved clock; the expected rows follow from the rule alone.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from collector.agent import COLLECTOR_HEALTH_EVERY_S, Agent, health_every_s
from collector.selfmetrics import SelfMetrics
from collector.sidecar import Sidecar, SourceState
from collector.sources.http_client import HttpClient
from collector.store import Store
from collector.writer import QueueSink, WriterThread
from ioe.settings import TargetSpec, load_settings
from tests.httpfixtures import Route, serve

S = 10**9
GOOD = b'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a"} 40\n'


def _health_rows(sink: QueueSink) -> list[Any]:
    """The ``targets`` rows queued so far, taken off the queue (the rest put back in order)."""
    items = []
    while not sink.queue.empty():
        items.append(sink.queue.get_nowait())
    for item in items:
        sink.queue.put_nowait(item)
    return [rows for table, rows in items if table == "targets"]


def _scrapes(every_s: float, steps: list[tuple[int, int]]) -> tuple[QueueSink, list[int], SourceState]:
    """Scrape one target at each ``(seconds, HTTP status)`` of ``steps``; the sink, how many
    ``targets`` rows were queued after each scrape, and the target's state."""
    status = [200]
    route = Route(body=GOOD)
    srv = serve({"/metrics": route})
    now = [10**18]
    settings = load_settings(None, args={"host": "n0"})
    sink = QueueSink(1000)
    car = Sidecar(settings, sink, SelfMetrics(), clock=lambda: now[0], health_every_s=every_s)
    spec = TargetSpec(name="gpu", url=srv.url(), kind="dcgm")
    state = SourceState("gpu", "dcgm", srv.url())
    counts: list[int] = []

    async def run() -> None:
        async with HttpClient() as client:
            for at_s, code in steps:
                now[0] = 10**18 + at_s * S
                status[0] = route.status = code
                await car.scrape_target(client, spec, state)
                counts.append(len(_health_rows(sink)))

    try:
        asyncio.run(run())
    finally:
        srv.close()
    return sink, counts, state


def test_unchanged_health_is_written_when_due_and_every_change_at_once() -> None:
    # 0 s: the first row; 1-4 s unchanged: none; 5 s the target answers 503: a row (up and error
    # changed), 6 s still failing: a row (failures in a row changed); 7 s good again: a row; 8 s
    # unchanged: none; 307 s, 300 s after the last row: a row
    steps = [(0, 200), (1, 200), (2, 200), (3, 200), (4, 200)]
    steps += [(5, 503), (6, 503), (7, 200), (8, 200), (307, 200)]
    _, counts, state = _scrapes(300.0, steps)
    assert counts == [1, 1, 1, 1, 1, 2, 3, 4, 4, 5]
    assert state.health.scrapes == len(steps) and state.health.up


def test_with_the_api_every_attempt_is_written() -> None:
    _, counts, _ = _scrapes(0.0, [(0, 200), (1, 200), (2, 200)])
    assert counts == [1, 2, 3]


def test_a_stop_writes_the_latest_health_not_yet_written(tmp_path: Path) -> None:
    """Sidecar.run over a target scraped every 50 ms, stopped after ~0.6 s: the stored row is
    the last attempt's (its scrape count and time), though unchanged health was not due."""
    srv = serve({"/metrics": Route(body=GOOD)})
    settings = load_settings(
        None,
        args={
            "host": "n0",
            "targets": [{"name": "gpu", "url": srv.url(), "kind": "dcgm", "interval_s": 0.05}],
        },
    )
    sink, store = QueueSink(10_000), Store()
    car = Sidecar(settings, sink, SelfMetrics(), health_every_s=300.0)

    async def run_a_while() -> None:
        asyncio.get_running_loop().call_later(0.6, car.stop)
        await car.run()

    try:
        asyncio.run(run_a_while())
    finally:
        srv.close()
    rows = _health_rows(sink)
    health = car.states["gpu"].health
    assert health.scrapes >= 3 and len(rows) == 2  # the first attempt's, and the stop's
    writer = WriterThread(sink, store, flush_interval_s=0.05)
    writer.start()
    writer.stop()
    with store.cursor() as cur:
        got = cur.execute("SELECT target, up, last_scrape_ns, samples_last FROM targets").fetchall()
    assert got == [("gpu", True, health.last_scrape_ns, 1)]


def test_only_a_collector_on_its_own_file_waits_for_unchanged_health() -> None:
    """DuckLake is read by `ioe serve` while sidecars write it: health after every attempt there."""
    cases = {
        (False, "duckdb"): COLLECTOR_HEALTH_EVERY_S,
        (True, "duckdb"): 0.0,
        (False, "ducklake"): 0.0,
        (True, "ducklake"): 0.0,
    }
    for (api, backend), every in cases.items():
        settings = load_settings(None, args={"host": "n0", "api_enabled": api})
        settings = settings.model_copy(update={"store_backend": backend})
        assert health_every_s(settings) == every, (api, backend)


def test_a_collector_only_agent_writes_unchanged_health_every_five_minutes(tmp_path: Path) -> None:
    agents = [
        Agent(load_settings(None, args={"store_path": str(tmp_path / f"{api}.duckdb"), "api_enabled": api}))
        for api in (False, True)
    ]
    try:
        assert agents[0].sidecar.health_every_ns == int(COLLECTOR_HEALTH_EVERY_S * S) == 300 * S
        assert agents[1].sidecar.health_every_ns == 0
    finally:
        for agent in agents:  # never run: its writer thread was not started
            agent.store.close()
