"""A small TTL cache with one computation per key at a time (single flight).

Rules:
  1. A value is served for ``ttl_s`` seconds after it was computed (clock injected).
  2. While a key is being computed, other callers of the same key wait for that result instead
     of computing it again: 50 clients asking for one envelope cost one analysis.
  3. An exception is not cached: every waiter gets it, the next caller computes afresh.
  4. At most ``max_entries`` keys are kept; the oldest is evicted first.
  5. Stale-while-revalidate: past ``ttl_s`` (and up to ``max_stale_s``) the old value is still
     served to every caller except the one that recomputes it, so a hot key never makes 50
     clients wait on one analysis; past ``max_stale_s`` callers wait for the fresh value.

  6. :meth:`TTLCache.peek` answers a fresh value without ever computing or waiting (the event
     loop's fast path); a miss is :data:`MISSING`, so a cached ``None`` stays distinguishable.
  7. :meth:`TTLCache.peek_stale` is rule 5 for the event loop: a stale value (up to
     ``max_stale_s``) is answered too, and exactly one caller per stale period is told to
     refresh the key (``claim``); it must call :meth:`TTLCache.refreshed` when done, whatever
     the outcome. Without this, every request for a stale key would queue on the thread pool
     behind its refresh.

One instance belongs to one app (``app.state.cache``): no module-level state.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

MISSING: Any = object()  # rule 6: what peek answers for an absent or stale key


class TTLCache:
    def __init__(
        self, ttl_s: float = 10.0, max_entries: int = 512, clock: Callable[[], float] = time.monotonic
    ):
        self.ttl_s = ttl_s
        self.max_stale_s = 6 * ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._values: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()
        self._locks: dict[Hashable, threading.Lock] = {}
        self._guard = threading.Lock()
        self._refreshing: set[Hashable] = set()
        self.computed = 0
        self.hits = 0

    def get(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """The cached value of ``key`` (rules 1-4), computing it with ``compute`` when stale."""
        got = self._fresh(key)
        if got is not None:
            return got[1]
        lock = self._key_lock(key)
        stale = self._fresh(key, self.max_stale_s)
        if stale is not None and not lock.acquire(blocking=False):
            return stale[1]  # rule 5: someone else is refreshing it
        if stale is None:
            lock.acquire()
        try:
            got = self._fresh(key)  # rule 2: another caller finished while we waited
            if got is not None:
                return got[1]
            value = compute()
            with self._guard:
                self.computed += 1
                self._values[key] = (self.clock(), value)
                self._values.move_to_end(key)
                while len(self._values) > self.max_entries:
                    old, _ = self._values.popitem(last=False)
                    self._locks.pop(old, None)
            return value
        finally:
            lock.release()

    def peek(self, key: Hashable) -> Any:
        """Rule 6: the value of ``key`` when fresh (within ``ttl_s``), else :data:`MISSING`."""
        got = self._fresh(key)
        return MISSING if got is None else got[1]

    def peek_stale(self, key: Hashable) -> tuple[Any, bool]:
        """Rule 7: ``(value or MISSING, claim)``; ``claim`` is True for the one caller to refresh."""
        with self._guard:
            got = self._values.get(key)
            age = None if got is None else self.clock() - got[0]
            if got is None or age is None or age >= self.max_stale_s:
                return MISSING, False
            self.hits += 1
            if age < self.ttl_s or key in self._refreshing:
                return got[1], False
            self._refreshing.add(key)
            return got[1], True

    def refreshed(self, key: Hashable) -> None:
        """Rule 7: the claimed refresh of ``key`` is over."""
        with self._guard:
            self._refreshing.discard(key)

    def _fresh(self, key: Hashable, age_s: float | None = None) -> tuple[float, Any] | None:
        with self._guard:
            got = self._values.get(key)
            if got is not None and self.clock() - got[0] < (self.ttl_s if age_s is None else age_s):
                self.hits += 1
                return got
            return None

    def _key_lock(self, key: Hashable) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def clear(self) -> None:
        with self._guard:
            self._values.clear()
