"""Verdicts precomputed on a schedule, so the default window never waits on an analysis.

Rules:
  1. One background thread asks ``jobs()`` for the work of a cycle — the default window's end
     and one ``(key, render)`` pair per deployment and route — and runs every ``render()``,
     keeping its serialized body and its analysis as a :class:`Snapshot`. Between cycles it
     waits :meth:`Refresher.pause_s`: ``interval_s`` from the end of the previous cycle, or
     longer when that cycle took more than ``max_share`` of cycle plus wait —
     ``last_cycle_s × (1 − max_share) / max_share`` — so the thread is busy at most
     ``max_share`` of the wall clock (default 0.1: a tenth of a core for its own thread) however
     many deployments and GPUs there are; a slow cycle spaces the next ones out instead of
     running back to back (a 6 s cycle is followed by 54 s of rest, not 15 s).
  2. A render that raises is logged with its key and error and skipped: the other keys still
     refresh, and the key's previous snapshot ages out under rule 3 (the route then computes
     it on request and reports the error as it would without a refresher).
  3. A snapshot is served while its age is at most ``max_age_s`` (default 4 × ``interval_s``,
     4 × the pause when rule 1 has lengthened it); older ones are as good as absent (the
     refresher is stuck or the analysis keeps failing).
  4. A served snapshot states its age: ``Age`` (whole seconds since it was computed) and
     ``Cache-Control: max-age=<interval_s>`` headers, and the body's own ``computed_at_s``.
  5. The thread runs between :meth:`Refresher.start` and :meth:`Refresher.stop` (the app's
     lifespan); ``stop`` wakes it and joins it. Without ``start`` nothing runs: requests use the
     TTL cache as before.

One instance belongs to one app (``app.state.refresher``): no module-level state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Response

log = logging.getLogger("ioe.api.refresher")

Render = Callable[[], tuple[bytes, Any]]  # (validated JSON body, the analysis it came from)


@dataclass(frozen=True)
class Cycle:
    """What one refresh cycle computes (rule 1)."""

    end_ns: int
    work: Iterable[tuple[Hashable, Render]] = field(default_factory=list)


@dataclass(frozen=True)
class Snapshot:
    body: bytes
    value: Any
    end_ns: int
    computed_at_s: float  # wall clock (stated to clients)
    computed_mono_s: float  # monotonic (ages)


class Refresher:
    def __init__(
        self,
        jobs: Callable[[], Cycle],
        interval_s: float,
        max_age_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_share: float = 0.1,
    ):
        if interval_s <= 0:
            raise ValueError(f"refresh interval must be positive seconds, got {interval_s!r}")
        if not 0 < max_share <= 1:
            raise ValueError(f"refresher share must be in (0, 1], got {max_share!r}")
        self.jobs = jobs
        self.interval_s = interval_s
        self.max_share = max_share
        self._max_age_s = max_age_s
        self.clock = clock
        self.cycles = 0
        self.failures = 0
        self.last_cycle_s = 0.0
        self._snaps: dict[Hashable, Snapshot] = {}
        self._end_ns: tuple[float, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh_once(self) -> None:
        """One cycle of rule 1 (rule 2 for failing renders)."""
        t0 = self.clock()
        cycle = self.jobs()
        self._end_ns = (t0, cycle.end_ns)
        for key, render in cycle.work:
            if self._stop.is_set():
                break
            try:
                body, value = render()
            except Exception as exc:  # rule 2: one broken analysis must not stop the others
                self.failures += 1
                log.warning("refresh of %r failed: %s", key, str(exc).splitlines()[0] if str(exc) else exc)
                continue
            self._snaps[key] = Snapshot(body, value, cycle.end_ns, time.time(), self.clock())
        self.cycles += 1
        self.last_cycle_s = self.clock() - t0

    def pause_s(self) -> float:
        """Rule 1: the wait after the last cycle."""
        return max(self.interval_s, self.last_cycle_s * (1 - self.max_share) / self.max_share)

    @property
    def max_age_s(self) -> float:
        """Rule 3: how old a snapshot may be and still be served."""
        if self._max_age_s is not None:
            return self._max_age_s
        return 4 * self.pause_s()

    def get(self, key: Hashable) -> Snapshot | None:
        """Rule 3: the key's snapshot while it is young enough, else ``None``."""
        snap = self._snaps.get(key)
        if snap is None or self.clock() - snap.computed_mono_s > self.max_age_s:
            return None
        return snap

    def end_ns(self) -> int | None:
        """The default window's end of the latest cycle while young enough (rule 3), else ``None``."""
        got = self._end_ns
        if got is None or self.clock() - got[0] > self.max_age_s:
            return None
        return got[1]

    def response(self, snap: Snapshot) -> Response:
        """Rule 4: the body as served, with its age."""
        age = max(int(self.clock() - snap.computed_mono_s), 0)
        headers = {"Age": str(age), "Cache-Control": f"max-age={int(self.interval_s)}"}
        return Response(snap.body, media_type="application/json", headers=headers)

    def start(self) -> None:
        """Rule 5."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="ioe-api-refresher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh_once()
            except Exception as exc:  # jobs() itself failed (store unreadable): retry next cycle
                self.failures += 1
                log.warning("refresh cycle failed: %s", exc)
            self._stop.wait(self.pause_s())
