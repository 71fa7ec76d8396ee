"""Per-second rates of cumulative counters, from one scrape to the next.

:class:`CounterRates` is the only stateful piece between a scrape and the store: parsers
stay pure and leave ``rate_per_s`` NULL; a scraper keeps one ``CounterRates`` per target and
passes every batch through :meth:`CounterRates.apply` before writing it.

Rules:

1. A row is a counter when its table says so: in ``engine_samples`` the concept ends in
   ``_total``, ``_sum`` or ``_count``; in ``fabric_samples`` every row is a counter. Other
   rows keep ``rate_per_s`` NULL.
2. A series is the table's natural key without ``ts_ns``. Its rate is
   ``(value - previous value) / (ts - previous ts)`` in per-second units.
3. NULL on the first sample of a series (nothing to compare with).
4. A value lower than the previous one is a counter reset (process restart): the rate is NULL,
   because the increase since the restart is unknown (the counter may have been reset at any
   time in the interval), and the new value becomes the reference. This matches the
   ``engine_samples.rate_per_s`` contract in :mod:`collector.records`.
5. A row not newer than the series' last one (a replayed or out-of-order scrape) gets NULL
   and does not move the reference.
6. State is bounded: at most ``max_series`` series are remembered; past that the least
   recently updated is forgotten (its next sample is a "first" one again).
7. A scraper's replayed scrapes (``collector.formats.scrape`` rule 6) share their identity
   lists from scrape to scrape (Batch rule 3). A batch whose series columns are the very lists
   of the batch before, at one ``ts_ns`` newer than that batch's, with no NULL value, takes
   each counter row's previous point from that batch by position, without a lookup per row;
   what it would have remembered is written to the per-series state only when another batch
   needs it. The rates and the state are the same as rules 1-6 give row by row.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from itertools import pairwise
from typing import TYPE_CHECKING, Any, overload

from collector.batch import Batch
from collector.records import TABLES

if TYPE_CHECKING:
    import polars as pl

_COUNTER_SUFFIXES = ("_total", "_sum", "_count")


class CounterRates:
    """Remembers the last (ts_ns, value) of each counter series and fills ``rate_per_s``."""

    def __init__(self, *, max_series: int = 100_000) -> None:
        self.max_series = max_series
        self._last: OrderedDict[tuple[Any, ...], tuple[int, float]] = OrderedDict()
        self._shape: _Shape | None = None  # rule 7: the last Batch's series columns and counters
        self._pending: tuple[int, list[Any]] | None = None  # rule 7: its ts and values, not in _last
        self._previous: tuple[int, list[Any]] = (0, [])  # rule 7: the last batch's ts and values

    def __len__(self) -> int:
        self._settle()
        return len(self._last)

    @overload
    def apply(self, batch: Batch, *, table: str = ...) -> Batch: ...
    @overload
    def apply(self, batch: pl.DataFrame, *, table: str = ...) -> pl.DataFrame: ...

    def apply(self, batch: Batch | pl.DataFrame, *, table: str = "engine_samples") -> Batch | pl.DataFrame:
        """``batch`` with ``rate_per_s`` set for its counter rows (rules 1-5), in ts order."""
        if isinstance(batch, Batch):
            return self._apply_batch(batch, table)
        import polars as pl

        self._settle()
        if batch.height == 0:
            return batch
        batch = batch.sort("ts_ns", maintain_order=True)
        keys = batch.select(_series_columns(table)).rows()
        rates = self._rates(table, keys, batch["ts_ns"].to_list(), batch["value"].to_list())
        return batch.with_columns(pl.Series("rate_per_s", rates, dtype=pl.Float64))

    def _apply_batch(self, batch: Batch, table: str) -> Batch:
        if batch.height == 0:
            return batch
        stamps, values = batch["ts_ns"], batch["value"]
        ts = stamps[0]
        one_ts = stamps.count(ts) == len(stamps)
        columns = [batch[c] for c in _series_columns(table)]
        shape = self._shape
        if one_ts and shape is not None and shape.same(table, columns) and None not in values:
            rates = self._replayed(shape, ts, values)
            if rates is not None:
                return batch.with_column("rate_per_s", rates)
        self._settle()
        if not one_ts and any(a > b for a, b in pairwise(stamps)):  # one scrape: one ts, sorted
            batch = batch.take(sorted(range(batch.height), key=stamps.__getitem__))
            columns = [batch[c] for c in _series_columns(table)]
        keys = list(zip(*columns, strict=True))
        rates = self._rates(table, keys, batch["ts_ns"], batch["value"])
        self._shape = self._pending = None
        values = batch["value"]
        if one_ts and None not in values and len(set(keys)) == len(keys):
            key_cols = _series_columns(table)
            counters = [i for i, key in enumerate(keys) if _is_counter(table, key, key_cols)]
            last = self._last
            if all(last.get((table, *keys[i])) == (ts, values[i]) for i in counters):  # each remembered
                self._shape = _Shape(table, columns, keys, counters)
                self._previous = (ts, values)
        return batch.with_column("rate_per_s", rates)

    def _replayed(self, shape: _Shape, ts: int, values: list[Any]) -> list[Any] | None:
        """Rule 7: the rates of a batch of ``shape`` at ``ts``, or None when a row is not newer."""
        before_ts, before = self._previous
        if ts <= before_ts:
            return None
        seconds = (ts - before_ts) / 1e9
        rates: list[Any] = [None] * len(values)
        for i in shape.counters:  # rules 3-4 as _rate has them, the same arithmetic
            value, previous = values[i], before[i]
            rates[i] = None if value < previous else (value - previous) / seconds
        self._previous = (ts, values)
        self._pending = (ts, values)
        return rates

    def _settle(self) -> None:
        """Rule 7: write what the batches replayed since the last lookup would have remembered."""
        pending, shape = self._pending, self._shape
        if pending is None or shape is None:
            return
        ts, values = pending
        for i in shape.counters:
            self._remember((shape.table, *shape.keys[i]), ts, values[i])
        self._pending = None

    def _rates(
        self, table: str, keys: list[tuple[Any, ...]], stamps: list[int], values: list[Any]
    ) -> list[Any]:
        key_cols = _series_columns(table)
        return [
            self._rate(table, key, ts, value) if _is_counter(table, key, key_cols) else None
            for key, ts, value in zip(keys, stamps, values, strict=True)
        ]

    def _rate(self, table: str, key: tuple[Any, ...], ts_ns: int, value: float | None) -> float | None:
        if value is None:
            return None
        series = (table, *key)
        previous = self._last.get(series)
        if previous is not None and ts_ns <= previous[0]:
            return None  # rule 5
        self._remember(series, ts_ns, value)
        if previous is None or value < previous[1]:
            return None  # rules 3 and 4
        return (value - previous[1]) / ((ts_ns - previous[0]) / 1e9)

    def _remember(self, series: tuple[Any, ...], ts_ns: int, value: float) -> None:
        self._last[series] = (ts_ns, value)
        self._last.move_to_end(series)
        while len(self._last) > self.max_series:
            self._last.popitem(last=False)  # rule 6


class _Shape:
    """Rule 7: a batch's series columns (the lists themselves), its series and counter rows."""

    __slots__ = ("columns", "counters", "keys", "table")

    def __init__(
        self, table: str, columns: list[list[Any]], keys: list[tuple[Any, ...]], counters: list[int]
    ):
        self.table, self.columns, self.keys, self.counters = table, columns, keys, counters

    def same(self, table: str, columns: list[list[Any]]) -> bool:
        return table == self.table and all(map(operator.is_, columns, self.columns))


def _series_columns(table: str) -> list[str]:
    """Rule 2: a series is the table's natural key without ``ts_ns``."""
    return [c for c in TABLES[table].key if c != "ts_ns"]


def _is_counter(table: str, key: tuple[Any, ...], key_cols: list[str]) -> bool:
    """Rule 1."""
    if table == "fabric_samples":
        return True
    if table == "engine_samples":
        return str(key[key_cols.index("concept")]).endswith(_COUNTER_SUFFIXES)
    return False
