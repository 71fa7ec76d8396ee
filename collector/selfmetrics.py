"""The sidecar's own health and work counters, in a registry of their own (never the global one).

Series names are listed in ``docs/metrics.md`` ("Source health and self-metrics").
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


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
        self.queue_batches = Gauge("ioe_queue_batches", "Batches waiting in the write queue.", registry=r)
        self.stored_by_table: dict[str, int] = {}

    def stored(self, table: str, rows: int) -> None:
        self.rows_stored.labels(table).inc(rows)
        self.stored_by_table[table] = self.stored_by_table.get(table, 0) + rows

    def dropped(self, reason: str, rows: int) -> None:
        if rows:
            self.rows_dropped.labels(reason).inc(rows)
