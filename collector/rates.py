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
"""

from __future__ import annotations

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

    def __len__(self) -> int:
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

        if batch.height == 0:
            return batch
        batch = batch.sort("ts_ns", maintain_order=True)
        keys = batch.select(_series_columns(table)).rows()
        rates = self._rates(table, keys, batch["ts_ns"].to_list(), batch["value"].to_list())
        return batch.with_columns(pl.Series("rate_per_s", rates, dtype=pl.Float64))

    def _apply_batch(self, batch: Batch, table: str) -> Batch:
        if batch.height == 0:
            return batch
        stamps = batch["ts_ns"]
        if any(a > b for a, b in pairwise(stamps)):  # one scrape has one ts: already sorted
            batch = batch.take(sorted(range(batch.height), key=stamps.__getitem__))
        keys = list(zip(*(batch[c] for c in _series_columns(table)), strict=True))
        rates = self._rates(table, keys, batch["ts_ns"], batch["value"])
        return batch.with_column("rate_per_s", rates)

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
