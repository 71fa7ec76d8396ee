"""Store faults as the API meets them: 503 with ``Retry-After``, and an invalidated store reopened.

Rules:
  1. A *store fault* is an error of the store's file, not of the request: a DuckDB I/O or fatal
     error, a commit that could not write (``No space left on device``), a connection closed
     under a reopen, or :class:`collector.store.StoreError`. It answers 503 with ``Retry-After``
     (OTLP exporters retry 429/502/503/504, never 500); any other error stays a 500, in one line.
  2. A fault saying the database was *invalidated* (DuckDB does so when a checkpoint fails, e.g.
     on a full disk, and refuses every statement until the file is attached again) marks the
     store invalid. The monitor then reopens it (``store.reopen()``), at most once every
     :data:`REOPEN_EVERY_S`, from a health probe or the next request; committed rows are kept.
  3. ``/healthz`` answers 503 naming the fault while the store is invalid and the reopen fails, so
     a liveness probe restarts the process; 200 again once a reopen succeeded. It also looks at
     the store itself at most every :data:`CHECK_EVERY_S` (a store nobody writes to is checked
     too), never waiting more than :data:`PROBE_TIMEOUT_S`: a busy store is not a dead one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import duckdb

from collector.errors import first_line
from collector.store import StoreError

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
REOPEN_EVERY_S = 5.0
CHECK_EVERY_S = 5.0
PROBE_TIMEOUT_S = 2.0
MAX_PROBES = 2
_WRITE_FAILED = ("could not write", "no space left", "disk full", "i/o error", "input/output error")


# Errors of the request itself (its SQL, its values, a refused permission, a cancel): never store
# faults, whatever their text says (a query may well quote "invalidated" or "I/O error").
_REQUEST_ERRORS = (
    duckdb.ProgrammingError,  # parser, binder, catalog, syntax errors
    duckdb.ConversionException,
    duckdb.InvalidInputException,
    duckdb.ConstraintException,
    duckdb.NotImplementedException,
    duckdb.OutOfRangeException,
    duckdb.TypeMismatchException,
    duckdb.DependencyException,
    duckdb.PermissionException,
    duckdb.InterruptException,
)


def fault_kind(exc: BaseException | None) -> str | None:
    """Rule 1-2: ``"invalidated"``, ``"io"``, or ``None`` when ``exc`` is not a store fault."""
    if exc is None or isinstance(exc, _REQUEST_ERRORS):
        return None
    text = str(exc).lower()
    # DuckDB's three wordings: 'Database "x" has been invalidated because checkpointing failed',
    # 'The database has been invalidated', 'database has been invalidated because of a previous
    # fatal error'
    if isinstance(exc, duckdb.Error) and "has been invalidated" in text:
        return "invalidated"
    if isinstance(exc, duckdb.FatalException):
        return "invalidated"
    if isinstance(exc, duckdb.IOException | duckdb.ConnectionException | StoreError):
        return "io"
    if isinstance(exc, duckdb.Error) and any(w in text for w in _WRITE_FAILED):
        return "io"
    return None


class StoreFaults:
    """Rules 2-3 for one store: remembers an invalidation and reopens the store."""

    def __init__(self, store: Any, clock: Callable[[], float] = time.monotonic):
        self.store, self.clock = store, clock
        self.invalid: str | None = None
        self.faults = 0
        self._lock = threading.Lock()
        self._last_reopen = -REOPEN_EVERY_S
        self._last_check = -CHECK_EVERY_S
        self._checking = False
        self._reopening = False  # one reopen at a time, however long it takes
        self._probes = 0  # probe threads running (a stuck one is not joined: daemon threads)

    def seen(self, exc: BaseException | None) -> bool:
        """Record ``exc`` when it is a store fault (rule 1); ``True`` when it is one."""
        kind = fault_kind(exc)
        if kind is None:
            return False
        with self._lock:
            self.faults += 1
            if kind == "invalidated" and self.invalid is None:
                self.invalid = first_line(exc)  # type: ignore[arg-type]
                log.error("store invalidated: %s; reopening it", self.invalid)
        return True

    def recover(self) -> str | None:
        """Rule 2 (blocking): reopen an invalid store when due; the problem left, or ``None``."""
        with self._lock:
            if self.invalid is None:
                return None
            now = self.clock()
            if self._reopening or now - self._last_reopen < REOPEN_EVERY_S:
                return self.invalid
            self._last_reopen, self._reopening = now, True
        reopen = getattr(self.store, "reopen", None)
        try:
            if reopen is None:
                return self.invalid
            reopen()
        except (StoreError, duckdb.Error) as exc:
            with self._lock:
                cause = (self.invalid or "").split(" (reopen failed")[0]
                self.invalid = f"{cause} (reopen failed: {first_line(exc)})"
            return self.invalid
        finally:
            self._reopening = False
        with self._lock:
            log.warning("store reopened after: %s", self.invalid)
            self.invalid = None
        return None

    def check(self) -> None:
        """Rule 3 (blocking): touch the store's tables, recording a fault."""
        try:
            self.store.schema_version()
        except Exception as exc:  # any error: only store faults are recorded
            self.seen(exc)

    async def liveness(self) -> str | None:
        """Rule 3: the problem that should fail ``/healthz``, or ``None``."""
        if self.invalid is None and self.clock() - self._last_check >= CHECK_EVERY_S and not self._checking:
            self._last_check, self._checking = self.clock(), True
            try:
                await self._bounded(self.check)
            finally:
                self._checking = False
        if self.invalid is None:
            return None
        problem: str | None = await self._bounded(self.recover)
        return problem

    async def readiness(self) -> tuple[bool, Any]:
        """``(True, schema version)`` when the store answers within the probe timeout."""
        if self.invalid is not None:
            return False, self.invalid
        try:
            version = await asyncio.wait_for(self._run(self.store.schema_version), PROBE_TIMEOUT_S)
        except TimeoutError:
            return False, f"store did not answer within {PROBE_TIMEOUT_S:g} s"
        except Exception as exc:
            self.seen(exc)
            return False, first_line(exc)
        return True, version

    async def _bounded(self, fn: Callable[[], Any]) -> Any:
        try:
            return await asyncio.wait_for(self._run(fn), PROBE_TIMEOUT_S)
        except TimeoutError:
            return self.invalid

    def _run(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        """``fn`` on a thread of its own, not the server's shared pool, so a probe never queues
        behind queries; at most :data:`MAX_PROBES` at once (a store that hangs holds them)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        if self._probes >= MAX_PROBES:
            done.set_exception(TimeoutError())
            return done

        def settle(ok: bool, value: Any) -> None:
            self._probes -= 1
            if not done.done():
                done.set_result(value) if ok else done.set_exception(value)

        def work() -> None:
            try:
                value, ok = fn(), True
            except Exception as exc:
                value, ok = exc, False
            loop.call_soon_threadsafe(settle, ok, value)

        self._probes += 1
        threading.Thread(target=work, name="ioe-probe", daemon=True).start()
        return done
