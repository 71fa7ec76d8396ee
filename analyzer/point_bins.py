"""A raw window's points with their time bin, read from the two forms a store file keeps them in.

A store file keeps a raw table's points recent (``T_recent``: ``ts_ns, series_id, values``) and
packed (``T_packed``: ``series_id, tix, values``, each timestamp once in ``T_times``), read as one
through the view ``T_points`` (:mod:`collector.series`). A binned read through the view computes
each point's bin from its ``ts_ns``: one division a point, 5.6 M of them in a 15-minute window of
512 GPUs' histogram buckets. Here the packed points take their bin from their timestamp's row of
``T_times`` (one division a timestamp: 1,020 in that window), joined by ``tix`` as the view
joins them; recent points compute it as before. The same rows as the view filtered to the window
with the bin computed per point. Summing the window's bucket increases by series and 60 s bin
took 0.111 s instead of 0.172 s (512 GPUs, medians of 9, load 2-3).
"""

from __future__ import annotations

import polars as pl

from collector.series import packed_name, recent_name, times_name


def binned_points(
    table: str, values: str, lower: int, upper: int, bin_of: str, ids: tuple[int, int] | None = None
) -> str:
    """A subquery: the points of ``table`` with ``lower < ts_ns <= upper`` (and ``series_id``
    between ``ids``, inclusive, where given), as rows ``series_id, bin, ts_ns, values...``.

    ``values``: the value columns, comma-separated; ``bin_of``: an SQL expression of ``ts_ns``
    alone (literals only); ``lower``, ``upper`` and ``ids`` are written as literals."""
    cols = ", ".join(f"k.{c.strip()}" for c in values.split(","))
    window = f"ts_ns > {int(lower)} AND ts_ns <= {int(upper)}"
    recent = packed = ""
    if ids:
        lo, hi = (int(x) for x in ids)
        recent, packed = f" AND series_id BETWEEN {lo} AND {hi}", f" WHERE k.series_id BETWEEN {lo} AND {hi}"
    return f"""(
            SELECT series_id, {bin_of} AS bin, ts_ns, {values} FROM {recent_name(table)}
            WHERE {window}{recent}
            UNION ALL
            SELECT k.series_id, t.bin, t.ts_ns, {cols} FROM {packed_name(table)} AS k
            JOIN (SELECT tix, ts_ns, {bin_of} AS bin FROM {times_name(table)} WHERE {window}) AS t
            USING (tix){packed}
        )"""


# Sums of doubles are not reproducible in DuckDB: its threads add partial sums in an order that
# varies run to run and with the thread count, so the last bits of a sum vary, and a verdict
# that compares fitted numbers with a threshold (the Cp hinge fit, the argmin over its grid)
# could flip. Each addend is rounded to a multiple of 10^-EXACT_DIGITS and summed as a HUGEINT:
# integer sums are exact, so the same in any order (values up to ~10^26; a NaN or infinite
# value, which has no integer, counts as NULL).
EXACT_DIGITS = 12


def exact_sum(expr: str) -> str:
    """SQL: the exact sum of ``expr`` in units of 10^-EXACT_DIGITS (a HUGEINT; :func:`exact_double`
    turns it back)."""
    return f"sum(TRY_CAST(round(({expr}) * 1e{EXACT_DIGITS}) AS HUGEINT))"


def exact_double(expr: str) -> str:
    """SQL: an :func:`exact_sum` (or a sum of them) as a DOUBLE."""
    return f"(CAST({expr} AS DOUBLE) / 1e{EXACT_DIGITS})"


def exact_avg(expr: str) -> str:
    """SQL: the mean of ``expr`` from its :func:`exact_sum` (NULL where no value counts)."""
    counted = f"count(TRY_CAST(round(({expr}) * 1e{EXACT_DIGITS}) AS HUGEINT))"
    return f"({exact_double(exact_sum(expr))} / nullif({counted}, 0))"


def exact_total(values: pl.Expr) -> pl.Expr:
    """Polars: the sum of ``values`` (an aggregation) as :func:`exact_sum` makes it in SQL.

    Polars' float sums are not reproducible either (a group's result changed in the last bits
    from one call to the next on the same frame); each value is rounded to 10^-EXACT_DIGITS as
    a 38-digit decimal, summed exactly, and turned back into a float (NaN counts as NULL)."""
    return values.cast(pl.Decimal(38, EXACT_DIGITS), strict=False).sum().cast(pl.Float64)


def exact_mean(values: pl.Expr) -> pl.Expr:
    """Polars: the mean of ``values`` from :func:`exact_total` (NULL where none counts)."""
    counted = values.cast(pl.Decimal(38, EXACT_DIGITS), strict=False).count()
    return pl.when(counted > 0).then(exact_total(values) / counted)
