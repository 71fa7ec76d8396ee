"""The sidecar's own health and work counters, in a registry of their own (never a global one).

Series names are listed in ``docs/metrics.md`` ("Source health and self-metrics").

Rules:

1. Counters and gauges with fixed label names, as prometheus_client's ``Counter`` and ``Gauge``
   are used here (``.labels(*values)``, ``.inc(n)``, ``.set(v)``); a counter's sample is its name
   plus ``_total``. Updates from any thread are safe (one lock per family).
2. :meth:`Registry.exposition` renders the Prometheus text format 0.0.4 itself: ``# HELP`` and
   ``# TYPE`` lines, label pairs sorted by name with ``\\``, ``"`` and newlines escaped, values as
   Python prints floats (``1.0``, ``1e-05``) or ``+Inf``, ``-Inf``, ``NaN``.
   :meth:`Registry.collect` yields metric families with prometheus_client's attributes (``name``,
   ``documentation``, ``type``, ``samples`` of ``name, labels, value, timestamp``), so the API's
   ``generate_latest`` renders the same registry.
3. prometheus_client is not imported: it imports ``ssl`` at load (4.6 MB resident with OpenSSL)
   and is 3 MB itself, of the 100 MB a collector-only sidecar is allowed (issue 24).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, Protocol

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None
    exemplar: Any = None
    native_histogram: Any = None


class Family:
    """One metric family as collected (rule 2)."""

    def __init__(self, name: str, documentation: str, kind: str, samples: list[Sample] | None = None):
        self.name, self.documentation, self.type = name, documentation, kind
        self.unit = ""
        self.samples = samples or []

    def add(self, labels: dict[str, str], value: float) -> None:
        suffix = "_total" if self.type == "counter" else ""
        self.samples.append(Sample(self.name + suffix, labels, float(value)))


class Collector(Protocol):
    def collect(self) -> Iterable[Family]: ...


class _Child:
    """One labelled series of a family."""

    __slots__ = ("_family", "_key")

    def __init__(self, family: _Metric, key: tuple[str, ...]):
        self._family, self._key = family, key

    def inc(self, amount: float = 1.0) -> None:
        self._family.add(self._key, amount)

    def set(self, value: float) -> None:
        self._family.put(self._key, value)


class _Metric:
    """A counter or gauge family with fixed label names (rule 1)."""

    kind = ""

    def __init__(self, name: str, documentation: str, labelnames: Iterable[str] = (), *, registry: Registry):
        self.name, self.documentation = name, documentation
        self.labelnames = tuple(labelnames)
        self._values: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def labels(self, *values: Any) -> _Child:
        if len(values) != len(self.labelnames):
            want = len(self.labelnames)
            raise ValueError(f"{self.name}: {want} label value(s) expected, got {len(values)}")
        key = tuple(str(v) for v in values)
        with self._lock:
            self._values.setdefault(key, 0.0)
        return _Child(self, key)

    def add(self, key: tuple[str, ...], amount: float) -> None:
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def put(self, key: tuple[str, ...], value: float) -> None:
        with self._lock:
            self._values[key] = float(value)

    def collect(self) -> Iterator[Family]:
        family = Family(self.name, self.documentation, self.kind)
        with self._lock:
            values = list(self._values.items())
        if not self.labelnames and not values:
            values = [((), 0.0)]
        for key, value in values:
            family.add(dict(zip(self.labelnames, key, strict=True)), value)
        yield family


class Counter(_Metric):
    kind = "counter"

    def inc(self, amount: float = 1.0) -> None:
        self.add((), amount)

    def add(self, key: tuple[str, ...], amount: float) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: a counter only goes up (got {amount})")
        super().add(key, amount)


class Gauge(_Metric):
    kind = "gauge"

    def set(self, value: float) -> None:
        self.put((), value)


class Registry:
    """The families and collectors of one process part (rule 2)."""

    def __init__(self) -> None:
        self._collectors: list[Collector] = []

    def register(self, collector: Collector) -> None:
        self._collectors.append(collector)

    def collect(self) -> Iterator[Family]:
        for collector in self._collectors:
            yield from collector.collect()

    def exposition(self) -> bytes:
        """Rule 2: the text format 0.0.4."""
        out: list[str] = []
        for family in self.collect():
            name = family.name + ("_total" if family.type == "counter" else "")
            doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
            out.append(f"# HELP {name} {doc}\n# TYPE {name} {family.type}\n")
            out += [_line(s) for s in family.samples]
        return "".join(out).encode()


def _line(sample: Sample) -> str:
    pairs = ",".join(f'{k}="{_escaped(v)}"' for k, v in sorted(sample.labels.items()))
    labels = f"{{{pairs}}}" if pairs else ""
    return f"{sample.name}{labels} {go_float(sample.value)}\n"


def _escaped(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def go_float(value: float) -> str:
    """A value as the exposition format writes it: ``repr`` of the float (``3.0``, ``1e-05``), and
    ``+Inf``, ``-Inf``, ``NaN`` for the three that Python spells otherwise."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class SelfMetrics:
    def __init__(self) -> None:
        self.registry = Registry()
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


class _MemoryCollector:
    """``ioe_store_memory_bytes{tag}`` (DuckDB's ``duckdb_memory()``, tags with bytes in use) and
    ``ioe_process_resident_memory_bytes`` / ``ioe_process_peak_resident_memory_bytes`` (VmRSS and
    VmHWM of ``/proc/self/status``), read when scraped. A store without ``duckdb_memory()`` (or
    a machine without /proc) exports nothing for that part."""

    def __init__(self, store: Any, status: Callable[[], str] = lambda: Path("/proc/self/status").read_text()):
        self._store = store
        self._status = status

    def collect(self) -> Iterator[Family]:
        duck = Family("ioe_store_memory_bytes", "DuckDB memory in use by tag.", "gauge")
        try:
            with self._store.cursor() as cur:
                rows = cur.execute("SELECT tag, memory_usage_bytes FROM duckdb_memory()").fetchall()
        except Exception:
            rows = []
        for tag, used in rows:
            if used:
                duck.add({"tag": str(tag)}, float(used))
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
                family = Family(name, text, "gauge")
                family.add({}, kib * 1024)
                yield family
