"""The sidecar's write path: a bounded queue in front of the store, drained by one thread.

Sources never block on the store. ``QueueSink.write`` enqueues a batch and returns at once;
when the queue is full it raises :class:`collector.sink.Overloaded` (receivers answer
"retry later") or, through :meth:`QueueSink.offer`, drops the batch and counts it (scrapers).
The writer thread coalesces what is queued per table and inserts each table once per flush.

Rules:

1. A flush writes each table's queued batches as one insert. When that insert fails on the
   data (a value that does not fit its column, a NULL key: anything but an I/O or memory
   failure of the store), the batches are written one by one, and a batch that still fails is
   halved until the rows it cannot take are found: those rows alone are dropped, counted
   (``on_error``) and described in ``ingest_errors`` naming the table, the row's source and
   the store's reason. One bad row never costs another target's rows, nor the rest of its own.
2. The search is bounded: after :data:`MAX_ISOLATION_WRITES` failed writes in one flush the
   parts not yet resolved are dropped whole (counted, logged).
3. A source that must know when its rows are committed (the Inspector tailer saves its read
   offsets only then) queues a callback with :meth:`QueueSink.after_commit` behind its
   batches. The writer calls it with True after the flush that wrote everything queued before
   it, or with False when a store failure (I/O, memory) dropped rows of that flush, so the
   source reads those bytes again.
4. A flush comes every ``flush_interval_s``, and sooner once half the queue's capacity is
   waiting, so a long interval never lets the queue fill and drop batches on a node with many
   targets. Between flushes the writer sleeps: a queued batch does not wake it (a wake per batch
   made every scrape hand the interpreter over to the writer thread and back). A clean stop
   (:meth:`WriterThread.stop`) flushes everything queued before it; a crash loses what was
   queued and not yet flushed (at most ``flush_interval_s`` of rows).
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
_ACK = "__ack__"
MAX_ISOLATION_WRITES = 256


def store_failure(exc: BaseException) -> bool:
    """Rule 1: the store itself failed (I/O, memory, a closed or invalidated database), so the
    rows may be fine and are not searched for a bad one."""
    import duckdb

    failures = (
        MemoryError,
        OSError,
        duckdb.IOException,
        duckdb.OutOfMemoryException,
        duckdb.FatalException,
        duckdb.InternalException,
        duckdb.TransactionException,
        duckdb.ConnectionException,
    )
    text = str(exc)
    return isinstance(exc, failures) or "invalidated" in text or "read-only" in text


class QueueSink:
    """Bounded batch queue; ``write`` raises ``Overloaded`` when full, ``offer`` drops and counts."""

    def __init__(self, max_batches: int, on_drop: Callable[[str, int], None] | None = None):
        self.queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=max_batches)
        self._on_drop = on_drop or (lambda table, rows: None)
        # rule 4: the writer sleeps until its flush is due, woken early only by this (half the
        # queue's capacity waiting, a flush asked for, a stop), never once per batch queued
        self.wake = threading.Event()
        self.half = max(1, max_batches // 2) if max_batches > 0 else 1 << 62

    def write(self, table: str, batch: Batch | pl.DataFrame | pa.Table) -> int:
        rows = _framed(batch)
        self._put((table, rows))
        return len(rows)

    def after_commit(self, callback: Callable[[bool], None]) -> None:
        """Rule 3: call ``callback(committed)`` once everything queued so far went to the store;
        raises ``Overloaded`` when the queue is full (the caller then waits for a later one)."""
        self._put((_ACK, callback))

    def _put(self, item: tuple[str, Any]) -> None:
        """``item`` queued, or ``Overloaded`` when the queue is full; the writer woken once half
        the queue's capacity is waiting (rule 4)."""
        try:
            self.queue.put_nowait(item)
        except queue.Full as exc:
            raise Overloaded(f"write queue full ({self.queue.maxsize} batches)") from exc
        if self.queue.qsize() >= self.half:
            self.wake.set()

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
        after_flush: Callable[[], None] | None = None,
    ):
        """``after_flush``: called on this thread after each flush that wrote rows (the agent hands
        freed memory back to the system there)."""
        super().__init__(name="ioe-writer", daemon=True)
        self.source = source
        self.store = store
        self.flush_interval_s = flush_interval_s
        self._on_stored = on_stored or (lambda t, n: None)
        self._on_error = on_error or (lambda t, n, e: None)
        self._after_flush = after_flush
        self._stopping = threading.Event()
        self._flushed = threading.Event()

    def flush_now(self, timeout: float = 10.0) -> bool:
        """Ask for an immediate flush of everything queued so far; True once it is in the store."""
        self._flushed.clear()
        try:
            self.source.queue.put(_FLUSH, timeout=timeout)
        except queue.Full:
            return False
        self.source.wake.set()
        return self._flushed.wait(timeout)

    def run(self) -> None:
        source = self.source
        while not self._stopping.is_set():
            if source.queue.qsize() < source.half:  # rule 4: sleep until due or woken
                source.wake.wait(self.flush_interval_s)
            source.wake.clear()
            pending, flush_asked, acks = self._collect(time.monotonic())
            self._acknowledge(acks, self._flush(pending))
            if pending and self._after_flush is not None:
                del pending  # the flush's rows are garbage now, before the callback runs
                self._call_after_flush()
            if flush_asked:
                self._flushed.set()
        while True:  # rule 4: everything queued before the stop, half a queue at a time
            pending, _, acks = self._collect(time.monotonic())
            self._acknowledge(acks, self._flush(pending))
            if not pending and not acks and self.source.queue.empty():
                break
        self._flushed.set()

    def _call_after_flush(self) -> None:
        try:
            if self._after_flush is not None:
                self._after_flush()
        except Exception:
            log.exception("after-flush callback failed")

    @staticmethod
    def _acknowledge(acks: list[Callable[[bool], None]], committed: bool) -> None:
        for ack in acks:  # rule 3
            try:
                ack(committed)
            except Exception:
                log.exception("commit callback failed")

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        with contextlib.suppress(queue.Full):  # a full queue wakes the thread anyway
            self.source.queue.put_nowait(_STOP)
        self.source.wake.set()
        self.join(timeout)

    def _collect(self, deadline: float) -> tuple[dict[str, list[Any]], bool, list[Callable[[bool], None]]]:
        """Batches queued until ``deadline`` (or a flush request), by table, and the commit
        callbacks queued behind them."""
        pending: dict[str, list[Any]] = defaultdict(list)
        acks: list[Callable[[bool], None]] = []
        room = self.source.half  # rule 4: a flush at most half the queue's capacity
        collected = 0
        while True:
            if collected >= room:
                return pending, False, acks
            remaining = deadline - time.monotonic()
            try:
                if remaining > 0:
                    item = self.source.queue.get(timeout=remaining)
                else:
                    item = self.source.queue.get_nowait()
            except queue.Empty:
                return pending, False, acks
            table, frame = item
            if item == _FLUSH:
                return pending, True, acks
            if table == _ACK:
                acks.append(frame)
            elif frame is not None:
                pending[table].append(frame)
                collected += 1
            elif self._stopping.is_set():  # the stop sentinel: flush what was collected now
                return pending, False, acks

    def _flush(self, pending: dict[str, list[Any]]) -> bool:
        """Write every table's batches (rule 1); False when the store failed and rows were lost."""
        budget = [MAX_ISOLATION_WRITES]
        committed = True
        rejected: list[Rejected] = []
        for table, frames in pending.items():
            # Batches stay a Batch; a receiver's frames beside a scraper's batches become one frame
            try:
                batch = concat_rows(frames, how="vertical_relaxed")
                self._on_stored(table, self.store.write(table, batch))
                continue
            except Exception as exc:  # one bad batch must not stop the writer
                if store_failure(exc):
                    n = sum(map(len, frames))
                    log.exception("store write to %s failed (%d rows dropped)", table, n)
                    self._on_error(table, n, exc)
                    committed = False
                    continue
                log.warning("store write to %s refused its data (%s); isolating the bad rows", table, exc)
            for frame in frames:
                committed &= self._isolate(table, frame, budget, rejected)
        if rejected:
            self._record_rejected(rejected)
        return committed

    def _isolate(self, table: str, rows: Any, budget: list[int], rejected: list[Rejected]) -> bool:
        return isolate(self.store, table, rows, budget, rejected, self._on_stored, self._on_error)

    def _record_rejected(self, rejected: list[Rejected]) -> None:
        try:
            self.store.write("ingest_errors", rejected_rows(rejected, time.time_ns()))
        except Exception:
            log.exception("could not record %d refused part(s) in ingest_errors", len(rejected))


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


Rejected = tuple[str, Any, str]  # (table, rows, the store's reason)


def isolate(
    store: Sink,
    table: str,
    rows: Any,
    budget: list[int],
    rejected: list[Rejected],
    on_stored: Callable[[str, int], None],
    on_error: Callable[[str, int, Exception], None],
) -> bool:
    """Rules 1-2: store what of ``rows`` the store takes, halving a part it refuses on its
    data; the rows it refuses alone go to ``rejected``. False when the store itself failed
    (nothing more is tried); ``budget[0]`` counts down the failed writes still allowed."""
    stack = [rows]
    while stack:
        part = stack.pop()
        try:
            on_stored(table, store.write(table, part))
            continue
        except Exception as exc:
            if store_failure(exc):
                log.exception("store write to %s failed (%d rows dropped)", table, len(part))
                on_error(table, len(part), exc)
                return False
            budget[0] -= 1
            reason = str(exc)
        if len(part) == 1 or budget[0] <= 0:
            if budget[0] <= 0:
                log.warning("%s: gave up isolating bad rows; %d rows dropped", table, len(part))
            on_error(table, len(part), ValueError(reason))
            rejected.append((table, part, reason))
            continue
        half = len(part) // 2
        stack += [_slice(part, half, len(part)), _slice(part, 0, half)]
    return True


def rejected_rows(rejected: list[Rejected], now_ns: int) -> Batch:
    """Rule 1: one ``ingest_errors`` row per refused part, naming table, source and reason."""
    from collector.records import batch as make_batch

    rows = [(table, source_of(part), len(part), reason) for table, part, reason in rejected]
    return make_batch(
        "ingest_errors",
        {
            "ts_ns": [now_ns + i for i in range(len(rows))],
            "source": [source for _, source, _, _ in rows],
            "location": [f"store write to {table}" for table, _, _, _ in rows],
            "message": [f"{n} row(s) refused by the store: {reason[:300]}" for _, _, n, reason in rows],
        },
    )


def _slice(rows: Any, lo: int, hi: int) -> Any:
    """Rows ``lo..hi`` of a Batch or polars frame."""
    if isinstance(rows, Batch):
        return rows.take(range(lo, hi))
    return rows.slice(lo, hi - lo)


def source_of(rows: Any) -> str:
    """Where refused rows came from: their first ``source``, ``host`` or ``target`` value."""
    columns = rows.columns
    for name in ("source", "host", "target", "comm_id"):
        if name in columns:
            values = rows[name] if isinstance(rows, Batch) else rows.get_column(name).to_list()
            if values and values[0]:
                return str(values[0])
    return ""


def _framed(batch: Batch | pl.DataFrame | pa.Table) -> Batch | pl.DataFrame:
    """What the queue holds: a Batch as it is, anything else as a polars frame."""
    if isinstance(batch, Batch):
        return batch
    import polars as pl

    return batch if isinstance(batch, pl.DataFrame) else pl.DataFrame(pl.from_arrow(batch))
