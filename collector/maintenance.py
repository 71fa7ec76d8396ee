"""Scheduled store maintenance for processes that own a store but run no sidecar (``ioe serve``).

Every ``interval_s`` the store rolls raw samples up into its per-minute tables and applies
retention (:meth:`collector.store.Store.maintain`; for DuckLake also file merging and snapshot
expiry). One maintainer per store: DuckLake's rollups are not safe from two processes at once.
A failed pass is logged and retried at the next interval; it never stops the caller.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from collector.store import Retention

log = logging.getLogger(__name__)

# seconds between passes when ``maintenance_interval_s`` is unset, here and in an agent with the API
# (a collector-only agent: collector.agent.COLLECTOR_MAINTENANCE_INTERVAL_S)
MAINTENANCE_INTERVAL_S = 60.0


class Maintainer(threading.Thread):
    def __init__(self, store: Any, interval_s: float, retention: Retention):
        super().__init__(name="ioe-maintenance", daemon=True)
        self.store, self.interval_s, self.retention = store, interval_s, retention
        self._halt = threading.Event()  # not ``_stop``: Thread.join() calls Thread._stop()

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            try:
                self.store.maintain(time.time_ns(), self.retention)
            except Exception:
                log.exception("store maintenance failed; retrying in %.0f s", self.interval_s)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)
