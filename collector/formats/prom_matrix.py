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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import repeat
from types import MappingProxyType
from typing import Any

from collector.batch import Batch
from collector.errors import Problem, quote
from collector.formats import Parsed
from collector.formats.dcgm import is_gpu_metric, to_gpu_samples
from collector.formats.engine import family_of, to_engine_samples
from collector.formats.exposition import Exposition, Sample

DROP_LABELS = ("job", "instance")
NS_PER_MS = 1_000_000


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
    """The points of the series of one (source, host), as exposition samples plus their times."""

    def __init__(self) -> None:
        self.samples: list[Sample] = []
        self.stamps: list[int] = []

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
        self.stamps.extend(round(float(t) * 1000) * NS_PER_MS for t in times)
        self.samples.extend(map(Sample._make, zip(repeat(name), repeat(labels), numbers, repeat(None))))
        return bad

    def rows(self, source: str, host: str) -> Parsed:
        """Both mappers over the group's samples; each row then gets its own sample's time."""
        exp = Exposition(samples=self.samples, source=source)
        gpu_trace: list[tuple[int, float, bool]] = []
        out = to_gpu_samples(exp, ts_ns=0, host=host, source=source, trace=gpu_trace)
        _restamp(out, "gpu_samples", gpu_trace, self.stamps)
        traces: dict[str, list[tuple[int, float, bool]]] = {}
        engine = to_engine_samples(exp, ts_ns=0, source=source, trace=traces)
        for table, trace in traces.items():
            _restamp(engine, table, trace, self.stamps)
        out.extend(engine)
        return out


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
