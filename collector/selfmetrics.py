"""The sidecar's own health and work counters, in a registry of their own (never the global one).

Series names are listed in ``docs/metrics.md`` ("Source health and self-metrics").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class SelfMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.target_up = Gauge(
            "ioe_target_up", "1 when the last scrape of the target succeeded.", ["target", "kind"], registry=r
        )
        self.scrape_duration = Gauge(
            "ioe_target_scrape_duration_seconds", "Duration of the last scrape.", ["target"], registry=r
        )
        self.scrapes = Counter("ioe_target_scrapes", "Scrapes attempted.", ["target"], registry=r)
        self.scrape_failures = Counter(
            "ioe_target_scrape_failures", "Scrapes that failed.", ["target"], registry=r
        )
        self.rows_stored = Counter(
            "ioe_rows_stored", "Rows newly written to the store.", ["table"], registry=r
        )
        self.rows_dropped = Counter(
            "ioe_rows_dropped", "Rows refused or lost, by reason.", ["reason"], registry=r
        )
        self.otlp_shed = Counter(
            "ioe_otlp_shed_requests",
            "OTLP exports refused with UNAVAILABLE at the receiver's in-flight cap (exporters retry them).",
            ["transport"],
            registry=r,
        )
        self.queue_batches = Gauge("ioe_queue_batches", "Batches waiting in the write queue.", registry=r)
        self.stored_by_table: dict[str, int] = {}

    def stored(self, table: str, rows: int) -> None:
        self.rows_stored.labels(table).inc(rows)
        self.stored_by_table[table] = self.stored_by_table.get(table, 0) + rows

    def watch_store(self, store: Any) -> None:
        """Also export the store's DuckDB memory by tag and this process's resident memory."""
        self.registry.register(_MemoryCollector(store))

    def dropped(self, reason: str, rows: int) -> None:
        if rows:
            self.rows_dropped.labels(reason).inc(rows)


class _MemoryCollector(Collector):
    """``ioe_store_memory_bytes{tag}`` (DuckDB's ``duckdb_memory()``, tags with bytes in use) and
    ``ioe_process_resident_memory_bytes`` / ``ioe_process_peak_resident_memory_bytes`` (VmRSS and
    VmHWM of ``/proc/self/status``), read when scraped. A store without ``duckdb_memory()`` (or
    a machine without /proc) exports nothing for that part."""

    def __init__(self, store: Any, status: Callable[[], str] = lambda: Path("/proc/self/status").read_text()):
        self._store = store
        self._status = status

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        duck = GaugeMetricFamily("ioe_store_memory_bytes", "DuckDB memory in use by tag.", labels=["tag"])
        try:
            with self._store.cursor() as cur:
                rows = cur.execute("SELECT tag, memory_usage_bytes FROM duckdb_memory()").fetchall()
        except Exception:
            rows = []
        for tag, used in rows:
            if used:
                duck.add_metric([str(tag)], float(used))
        yield duck
        try:
            status = dict(line.split(":", 1) for line in self._status().splitlines() if ":" in line)
        except OSError:
            return
        for key, name, text in (
            ("VmRSS", "ioe_process_resident_memory_bytes", "Resident memory of this process."),
            ("VmHWM", "ioe_process_peak_resident_memory_bytes", "Peak resident memory of this process."),
        ):
            if key in status:
                kib = float(status[key].split()[0])
                yield GaugeMetricFamily(name, text, value=kib * 1024)
