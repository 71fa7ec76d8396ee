"""A Prometheus range-query answer (``resultType: matrix``) -> the scrape tables.

The series a Prometheus, Thanos or Mimir holds were scraped from the same dcgm-exporter and
engine ``/metrics`` IOE reads itself, so each point is handed to the scrape mappers
(:func:`collector.formats.dcgm.to_gpu_samples`, :func:`collector.formats.engine.to_engine_samples`)
as the exposition sample it was: one metric name, one label mapping, one value. Every unit
conversion, concept name and refusal is theirs; this module only reshapes.

Input shape (one element of ``data.result``)::

    {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0", "job": "dcgm", "instance": "n0:9400"},
     "values": [[1700000000, "42"], [1700000015, "43"], ...]}

Output: ``gpu_samples``, ``engine_samples`` and ``histogram_buckets`` rows, as a scrape of that
target at each point's time would give.

Rules:

1. ``__name__`` is the sample name; the labels in ``drop_labels`` (default ``job``, ``instance``:
   the ones Prometheus adds to every series of a target) are removed before mapping, so an
   engine series' ``labels`` JSON is the one a direct scrape stores.
2. ``source`` of a series is the value of its ``source_label`` (default ``instance``: the
   target Prometheus scraped), prefixed with ``prefix`` when given; a series without that
   label has source ``prefix`` (or ``prometheus``). The host of GPU rows without their own
   ``Hostname``/``hostname`` label is the series' ``host_label`` value (default ``host``), else
   ``default_host``.
3. A point's time is its evaluation time, kept to the millisecond (Prometheus' resolution) as
   exact integer nanoseconds. Counters and histogram buckets are the raw cumulative values
   Prometheus returns at each step, stored like scraped ones, so increases and quantiles are
   computed from them as from scrapes.
4. Values are Prometheus' strings (``"1.5"``, ``"NaN"``, ``"+Inf"``); one that is not a number
   is a Problem naming the series; the mappers then drop non-finite ones as they do for scrapes.
5. A series whose name neither mapper knows gives no row (as in a scrape body).
6. Each series is mapped once, from a sample of value 0.0 (which every mapper stores), and its
   rows are that row repeated over the series' points with each point's value × the mapper's
   scale. A series with a value the mappers could treat otherwise — negative, non-finite, a
   DCGM blank sentinel (≥ 1e14), a KV usage over 1.5 — or a label set they refuse is mapped
   point by point instead, so the rows and problems are always exactly the mappers'.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from itertools import repeat
from operator import mul
from types import MappingProxyType
from typing import Any

from collector.batch import Batch
from collector.errors import Problem, quote
from collector.formats import Parsed
from collector.formats.dcgm import BLANK_MIN, is_gpu_metric, to_gpu_samples
from collector.formats.engine import _KV_MAX as KV_MAX  # its rule 5: a KV usage above is refused
from collector.formats.engine import family_of, to_engine_samples
from collector.formats.exposition import Exposition, Sample
from collector.formats.scrape import VALUE_COLUMN

DROP_LABELS = ("job", "instance")
NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


def maps(name: str, labels: Mapping[str, str]) -> bool:
    """Rule 5: a series one of the scrape mappers stores (the mappers' own tests, not a copy)."""
    return is_gpu_metric(name) or family_of(name, labels) is not None


def parse_matrix(
    result: Iterable[Mapping[str, Any]],
    *,
    drop_labels: Iterable[str] = DROP_LABELS,
    source_label: str = "instance",
    host_label: str = "host",
    default_host: str = "",
    prefix: str = "",
) -> Parsed:
    """The scrape tables of a matrix answer (see the module rules)."""
    drop = frozenset(drop_labels) | {"__name__"}
    groups: dict[tuple[str, str], _Group] = {}
    problems: list[Problem] = []
    for series in result:
        metric = series.get("metric") or {}
        name = str(metric.get("__name__", ""))
        raw_labels = {str(k): str(v) for k, v in metric.items() if k not in drop}
        labels = MappingProxyType(raw_labels)
        if not name or not maps(name, labels):
            continue
        source = source_of(metric, source_label, prefix)
        host = str(metric.get(host_label, "")) or default_host
        group = groups.setdefault((source, host), _Group())
        bad = group.add(name, labels, series.get("values") or [])
        if bad:
            problems.append(Problem(_where(name, raw_labels), f"value {quote(bad)} is not a number (rule 4)"))
    out = Parsed(problems=problems)
    for (source, host), group in groups.items():
        out.extend(group.rows(source, host))
    return out


def source_of(metric: Mapping[str, Any], label: str, prefix: str) -> str:
    """Rule 2."""
    value = str(metric.get(label, ""))
    if prefix and value:
        return f"{prefix}:{value}"
    return value or prefix or "prometheus"


def _where(name: str, labels: Mapping[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"[:240]


class _Group:
    """The series of one (source, host): each one label mapping, its points' times and values."""

    def __init__(self) -> None:
        self.series: list[tuple[str, Mapping[str, str], list[int], list[float]]] = []

    def add(self, name: str, labels: Mapping[str, str], values: list[list[Any]]) -> str:
        """Append one series' points; returns the first value that is not a number, else ''."""
        if not values:
            return ""
        times, texts = zip(*values, strict=True)
        bad = ""
        try:
            numbers = list(map(float, texts))
        except (TypeError, ValueError):
            maybe, bad = _numbers(texts)
            keep = [i for i, v in enumerate(maybe) if v is not None]
            times = tuple(times[i] for i in keep)
            numbers = [v for v in maybe if v is not None]
        # rule 3: whole milliseconds, exact in integer ns (a float product would not be)
        if set(map(type, times)) == {int}:  # whole-second steps: JSON integers
            stamps = list(map(NS_PER_S.__mul__, times))
        else:
            stamps = [round(float(t) * 1000) * NS_PER_MS for t in times]
        if numbers:
            self.series.append((name, labels, stamps, numbers))
        return bad

    def rows(self, source: str, host: str) -> Parsed:
        """Rule 6: each series mapped once, its rows repeated over its points; the series a
        value could make the mappers treat differently are mapped point by point instead."""
        first = [Sample(name, labels, 0.0, None) for name, labels, _, _ in self.series]
        mapped, traces = _mapped(first, source, host)
        if mapped.problems:  # a label the mappers refuse: they say so, point by point
            return self.point_by_point(range(len(self.series)), source, host)
        slow = sorted(
            {i for table, trace in traces.items() for i, f, kv in trace if not self.plain(table, i, f, kv)}
        )
        out = Parsed()
        for table, trace in traces.items():
            rows = mapped.batches.get(table)
            if rows is not None and trace:
                out.add(table, self.repeated(table, rows, trace, set(slow)))
        if slow:
            out.extend(self.point_by_point(slow, source, host))
        return out

    def plain(self, table: str, i: int, factor: float, kv: bool) -> bool:
        """Rule 6: every value of series ``i`` is one the mappers store as they stored 0.0."""
        values = self.series[i][3]
        low, high = min(values), max(values)
        if not (low >= 0.0 and math.isfinite(high)) or not all(map(math.isfinite, values)):
            return False
        if table == "gpu_samples":
            return high < BLANK_MIN
        return not kv or high * factor <= KV_MAX

    def repeated(self, table: str, rows: Any, trace: list[tuple[int, float, bool]], slow: set[int]) -> Batch:
        """The rows of the first points, each repeated over its series' points with their values."""
        value_column = VALUE_COLUMN[table]
        data: dict[str, list[Any]] = {c: [] for c in rows.columns}
        runs = []  # Batch rule 5: one run per series
        for r, (i, factor, _) in enumerate(trace):
            if i in slow:
                continue
            _, _, stamps, values = self.series[i]
            n = len(stamps)
            runs.append(n)
            for column, out in data.items():
                if column == "ts_ns":
                    out.extend(stamps)
                elif column == value_column:
                    out.extend(values if factor == 1.0 else map(mul, values, repeat(factor)))
                else:
                    out.extend(repeat(rows[column][r], n))
        return Batch(table, data, len(data["ts_ns"]), runs=runs)

    def point_by_point(self, which: Iterable[int], source: str, host: str) -> Parsed:
        """The mappers over every point of the series ``which``; each row gets its own time."""
        samples: list[Sample] = []
        stamps: list[int] = []
        for i in which:
            name, labels, times, values = self.series[i]
            samples.extend(map(Sample._make, zip(repeat(name), repeat(labels), values, repeat(None))))
            stamps.extend(times)
        out, traces = _mapped(samples, source, host)
        for table, trace in traces.items():
            _restamp(out, table, trace, stamps)
        return out


def _mapped(
    samples: list[Sample], source: str, host: str
) -> tuple[Parsed, dict[str, list[tuple[int, float, bool]]]]:
    """Both scrape mappers over ``samples``, with each table's trace (row -> sample index)."""
    exp = Exposition(samples=samples, source=source)
    traces: dict[str, list[tuple[int, float, bool]]] = {"gpu_samples": []}
    out = to_gpu_samples(exp, ts_ns=0, host=host, source=source, trace=traces["gpu_samples"])
    out.extend(to_engine_samples(exp, ts_ns=0, source=source, trace=traces))
    return out, traces


def _restamp(parsed: Parsed, table: str, trace: list[tuple[int, float, bool]], stamps: list[int]) -> None:
    """Rule 3: the ``ts_ns`` of each row from the sample it was built from (the trace's index)."""
    rows = parsed.batches.get(table)
    if rows is None or not isinstance(rows, Batch):
        return
    parsed.batches[table] = rows.with_column("ts_ns", [stamps[i] for i, _, _ in trace])


def _numbers(texts: Iterable[Any]) -> tuple[list[float | None], str]:
    """Rule 4 the slow way: each text's number or None, and the first bad text."""
    out: list[float | None] = []
    bad = ""
    for text in texts:
        try:
            out.append(float(text))
        except (TypeError, ValueError):
            out.append(None)
            bad = bad or str(text)
    return out, bad
