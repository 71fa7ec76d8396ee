"""The sidecar's write path: a bounded queue in front of the store, drained by one thread.

Sources never block on the store. ``QueueSink.write`` enqueues a batch and returns at once;
when the queue is full it raises :class:`collector.sink.Overloaded` (receivers answer
"retry later") or, through :meth:`QueueSink.offer`, drops the batch and counts it (scrapers).
The writer thread coalesces what is queued per table and inserts each table once per flush.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from collector.batch import Batch, concat_rows
from collector.sink import Overloaded, Sink

if TYPE_CHECKING:
    import polars as pl
    import pyarrow as pa

log = logging.getLogger(__name__)

_STOP = ("", None)
_FLUSH = ("__flush__", None)


class QueueSink:
    """Bounded batch queue; ``write`` raises ``Overloaded`` when full, ``offer`` drops and counts."""

    def __init__(self, max_batches: int, on_drop: Callable[[str, int], None] | None = None):
        self.queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=max_batches)
        self._on_drop = on_drop or (lambda table, rows: None)

    def write(self, table: str, batch: Batch | pl.DataFrame | pa.Table) -> int:
        rows = _framed(batch)
        try:
            self.queue.put_nowait((table, rows))
        except queue.Full as exc:
            raise Overloaded(f"write queue full ({self.queue.maxsize} batches)") from exc
        return len(rows)

    def offer(self, table: str, batch: Batch | pl.DataFrame) -> bool:
        """Enqueue or drop (counted); never raises for a full queue."""
        try:
            self.write(table, batch)
        except Overloaded:
            self._on_drop(table, len(batch))
            return False
        return True


class WriterThread(threading.Thread):
    """Drains a :class:`QueueSink` into the store every ``flush_interval_s``."""

    def __init__(
        self,
        source: QueueSink,
        store: Sink,
        *,
        flush_interval_s: float = 1.0,
        on_stored: Callable[[str, int], None] | None = None,
        on_error: Callable[[str, int, Exception], None] | None = None,
    ):
        super().__init__(name="ioe-writer", daemon=True)
        self.source = source
        self.store = store
        self.flush_interval_s = flush_interval_s
        self._on_stored = on_stored or (lambda t, n: None)
        self._on_error = on_error or (lambda t, n, e: None)
        self._stopping = threading.Event()
        self._flushed = threading.Event()

    def flush_now(self, timeout: float = 10.0) -> bool:
        """Ask for an immediate flush of everything queued so far; True once it is in the store."""
        self._flushed.clear()
        try:
            self.source.queue.put(_FLUSH, timeout=timeout)
        except queue.Full:
            return False
        return self._flushed.wait(timeout)

    def run(self) -> None:
        while not self._stopping.is_set():
            deadline = time.monotonic() + self.flush_interval_s
            pending, flush_asked = self._collect(deadline)
            self._flush(pending)
            if flush_asked:
                self._flushed.set()
        self._flush(self._collect(time.monotonic())[0])
        self._flushed.set()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        with contextlib.suppress(queue.Full):  # a full queue wakes the thread anyway
            self.source.queue.put_nowait(_STOP)
        self.join(timeout)

    def _collect(self, deadline: float) -> tuple[dict[str, list[Any]], bool]:
        """Batches queued until ``deadline`` (or a flush request), by table."""
        pending: dict[str, list[Any]] = defaultdict(list)
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining > 0:
                    item = self.source.queue.get(timeout=remaining)
                else:
                    item = self.source.queue.get_nowait()
            except queue.Empty:
                return pending, False
            table, frame = item
            if item == _FLUSH:
                return pending, True
            if frame is not None:  # None is the stop sentinel: it only wakes the thread
                pending[table].append(frame)

    def _flush(self, pending: dict[str, list[Any]]) -> None:
        for table, frames in pending.items():
            # Batches stay a Batch; a receiver's frames beside a scraper's batches become one frame
            batch = concat_rows(frames, how="vertical_relaxed")
            try:
                self._on_stored(table, self.store.write(table, batch))
            except Exception as exc:  # one bad batch must not stop the writer
                log.exception("store write to %s failed (%d rows dropped)", table, len(batch))
                self._on_error(table, len(batch), exc)


class DirectSink:
    """Writes straight to the store before the caller answers, for receivers whose clients retry.

    An OTLP exporter that got a 200 never sends those spans again, so a span is acknowledged
    only once it is committed in the store. At most ``max_concurrent`` writes run at once; a
    request that cannot start one within ``wait_s`` gets :class:`Overloaded` (the receiver
    answers "retry later").
    """

    def __init__(
        self,
        store: Sink,
        *,
        max_concurrent: int = 4,
        wait_s: float = 0.5,
        on_stored: Callable[[str, int], None] | None = None,
    ):
        self.store = store
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self.wait_s = wait_s
        self._on_stored = on_stored or (lambda t, n: None)

    def write(self, table: str, batch: Batch | pl.DataFrame | pa.Table) -> int:
        if not self._slots.acquire(timeout=self.wait_s):
            raise Overloaded(f"store busy: no write slot within {self.wait_s:g} s")
        try:
            rows = self.store.write(table, batch)
        finally:
            self._slots.release()
        self._on_stored(table, rows)
        return rows


def _framed(batch: Batch | pl.DataFrame | pa.Table) -> Batch | pl.DataFrame:
    """What the queue holds: a Batch as it is, anything else as a polars frame."""
    if isinstance(batch, Batch):
        return batch
    import polars as pl

    return batch if isinstance(batch, pl.DataFrame) else pl.DataFrame(pl.from_arrow(batch))
