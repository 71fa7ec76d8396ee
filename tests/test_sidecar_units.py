"""Units of the sidecar: backoff schedule, bounded queue, writer thread, scrape deadlines."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from collector.records import frame
from collector.sink import Overloaded
from collector.sources.http_client import HttpClient
from collector.sources.http_scraper import MAX_BACKOFF_S, ScrapeError, fetch, next_delay
from collector.store import Store
from collector.writer import QueueSink, WriterThread
from tests.httpfixtures import Route, serve


def test_backoff_doubles_with_jitter_and_caps() -> None:
    rng = random.Random(7)
    assert next_delay(1.0, 0, rng) == 1.0
    for k, base in ((1, 2.0), (3, 8.0), (10, MAX_BACKOFF_S)):
        d = next_delay(1.0, k, rng)
        assert 0.8 * base <= d <= 1.2 * base


def _rows(n: int, start: int = 0):
    return frame(
        "gpu_samples",
        {
            "ts_ns": list(range(start, start + n)),
            "host": ["h"] * n,
            "uuid": ["u"] * n,
            "metric": ["power_w"] * n,
            "value": [1.0] * n,
        },
    )


def test_full_queue_refuses_and_counts() -> None:
    dropped: list[int] = []
    q = QueueSink(2, on_drop=lambda t, n: dropped.append(n))
    assert q.write("gpu_samples", _rows(3)) == 3
    assert q.offer("gpu_samples", _rows(3))
    with pytest.raises(Overloaded, match="queue full"):
        q.write("gpu_samples", _rows(1))
    assert not q.offer("gpu_samples", _rows(5))
    assert dropped == [5]


def test_writer_coalesces_and_drains_on_stop() -> None:
    store = Store()
    q = QueueSink(100)
    stored: list[int] = []
    w = WriterThread(q, store, flush_interval_s=0.05, on_stored=lambda t, n: stored.append(n))
    w.start()
    for i in range(10):
        q.write("gpu_samples", _rows(5, start=i * 5))
    w.stop()
    assert store.count("gpu_samples") == 50
    assert sum(stored) == 50


def test_writer_survives_a_bad_batch() -> None:
    store = Store()
    q = QueueSink(10)
    errors: list[str] = []
    w = WriterThread(q, store, flush_interval_s=0.05, on_error=lambda t, n, e: errors.append(t))
    w.start()
    q.write("no_such_table", _rows(1))
    q.write("gpu_samples", _rows(2))
    w.stop()
    assert errors == ["no_such_table"]
    assert store.count("gpu_samples") == 2


def test_fetch_deadline_body_cap_and_status() -> None:
    srv = serve(
        {
            "/hang": Route(b"x", hang_s=10),
            "/big": Route(b"a" * 10_000),
            "/err": Route(b"nope", status=500),
            "/ok": Route(b"up 1\n"),
            "/latin": Route(b"caf\xe9 1\n"),
        }
    )

    async def go() -> None:
        async with HttpClient() as c:
            assert await fetch(c, "ok", srv.url("/ok"), 2, 1000) == b"up 1\n"
            # undecodable bytes are the parser's business (they cost their line only), not the fetcher's
            assert await fetch(c, "latin", srv.url("/latin"), 2, 1000) == b"caf\xe9 1\n"
            with pytest.raises(ScrapeError, match=r"within 0\.5 s"):
                await fetch(c, "hang", srv.url("/hang"), 0.5, 1000)
            with pytest.raises(ScrapeError, match="exceeds 1000 bytes"):
                await fetch(c, "big", srv.url("/big"), 2, 1000)
            with pytest.raises(ScrapeError, match="HTTP 500"):
                await fetch(c, "err", srv.url("/err"), 2, 1000)

    try:
        asyncio.run(go())
        assert all(h.get("Accept") == "text/plain; version=0.0.4" for _, h in srv.requests)
    finally:
        srv.close()


def test_flush_now_puts_queued_rows_in_the_store() -> None:
    store = Store()
    q = QueueSink(100)
    w = WriterThread(q, store, flush_interval_s=30.0)  # would not flush on its own for 30 s
    w.start()
    q.write("gpu_samples", _rows(4))
    assert w.flush_now(timeout=5)
    assert store.count("gpu_samples") == 4
    w.stop()


def test_writer_flushes_at_half_the_queue_without_waiting_for_its_interval() -> None:
    """Writer rule 4: a long flush interval never lets the queue fill up and drop batches."""
    store = Store()
    q = QueueSink(8)
    flushed: list[int] = []
    w = WriterThread(q, store, flush_interval_s=60.0, on_stored=lambda t, n: flushed.append(n))
    w.start()
    for i in range(4):  # half of 8 batches: a flush without waiting for the 60 s
        q.write("gpu_samples", _rows(5, start=i * 5))
    deadline = time.monotonic() + 10
    while store.count("gpu_samples") < 20 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert store.count("gpu_samples") == 20 and flushed == [20]
    w.stop()


def test_stop_flushes_everything_queued_half_a_queue_at_a_time() -> None:
    """Writer rule 4: a clean stop loses nothing that was accepted, however long the interval."""
    store = Store()
    q = QueueSink(10)
    w = WriterThread(q, store, flush_interval_s=60.0)
    for i in range(9):  # queued before the thread runs: more than half the queue at once
        q.write("gpu_samples", _rows(3, start=i * 3))
    w.start()
    w.stop()
    assert store.count("gpu_samples") == 27 and q.queue.empty()


def test_after_flush_runs_once_per_flush_that_wrote_rows() -> None:
    """The agent trims malloc's free pages there (collector.agent.trim_malloc); a failing callback
    costs no rows."""
    from collector.agent import trim_malloc

    store = Store()
    q = QueueSink(100)
    calls: list[int] = []

    def after() -> None:
        calls.append(store.count("gpu_samples"))  # the flush's rows are in the store by then
        trim_malloc()
        raise RuntimeError("a callback that fails")

    w = WriterThread(q, store, flush_interval_s=0.05, after_flush=after)
    w.start()
    q.write("gpu_samples", _rows(3))
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)  # empty flushes meanwhile: no call
    q.write("gpu_samples", _rows(2, start=10))
    w.stop()
    assert calls == [3, 5] and store.count("gpu_samples") == 5
