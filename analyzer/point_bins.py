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
    table: str,
    values: str,
    lower: int,
    upper: int,
    bin_of: str,
    ids: tuple[int, int] | None = None,
    within: str | None = None,
) -> str:
    """A subquery: the points of ``table`` with ``lower < ts_ns <= upper`` (and ``series_id``
    between ``ids``, inclusive, where given, and ``within`` true where given), as rows
    ``series_id, bin, ts_ns, values...``.

    ``values``: the value columns, comma-separated; ``bin_of`` and ``within``: SQL expressions of
    ``ts_ns`` alone (literals only); ``lower``, ``upper`` and ``ids`` are written as literals."""
    cols = ", ".join(f"k.{c.strip()}" for c in values.split(","))
    window = f"ts_ns > {int(lower)} AND ts_ns <= {int(upper)}" + (f" AND ({within})" if within else "")
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
# could flip. Each addend is split into whole numbers: its integer part, then its fraction's
# first and next FRACTION_BITS bits (the fraction rounded to 2^-52, ~2e-16), each summed apart:
# sums of whole numbers are exact in a double while they stay under 2^53, so the same in any
# order (for totals under ~9e15 and under 2^(53-FRACTION_BITS) = 134 M addends a group), and
# the exact sums are combined once. Summing round(x * 10^12) as HUGEINTs was exact without
# those limits but cost 0.2 s of a 512-GPU report (5.6 M bucket points summed twice).
FRACTION_BITS = 26
EXACT_DIGITS = 12  # polars sums (exact_total): decimals of 38 digits, 12 after the point


def _only(expr: str, where: str | None) -> str:
    """``expr`` where ``where`` holds, else NULL (which sums and counts skip)."""
    return expr if where is None else f"CASE WHEN {where} THEN {expr} END"


def exact_sum(expr: str, where: str | None = None) -> str:
    """SQL: the sum of ``expr`` (over the rows where ``where`` holds), the same in any order."""
    x = _only(expr, where)
    q = 1 << FRACTION_BITS
    hi = f"(({x}) - floor({x})) * {q}"  # exact: a power of two times an exact difference
    return f"(sum(floor({x})) + (sum(floor({hi})) + sum(round(({hi} - floor({hi})) * {q})) / {q}) / {q})"


def exact_avg(expr: str, where: str | None = None) -> str:
    """SQL: the mean of ``expr`` (over the rows where ``where`` holds) from its :func:`exact_sum`
    (NULL where no value counts)."""
    return f"({exact_sum(expr, where)} / nullif(count({_only(expr, where)}), 0))"


def exact_total(values: pl.Expr) -> pl.Expr:
    """Polars: the sum of ``values`` (an aggregation), the same in any order.

    Polars' float sums are not reproducible either (a group's result changed in the last bits
    from one call to the next on the same frame); each value is rounded to 10^-EXACT_DIGITS as
    a 38-digit decimal, summed exactly, and turned back into a float (NaN counts as NULL)."""
    return values.cast(pl.Decimal(38, EXACT_DIGITS), strict=False).sum().cast(pl.Float64)


def exact_ratio(values: pl.Expr, counts: pl.Expr) -> pl.Expr:
    """Polars: :func:`exact_total` of ``values`` over the sum of ``counts`` (an aggregation; NULL
    where the counts sum to 0): a gauge's mean from per-series sums and counts."""
    n = counts.sum()
    return pl.when(n > 0).then(exact_total(values) / n)


def exact_mean(values: pl.Expr) -> pl.Expr:
    """Polars: the mean of ``values`` from :func:`exact_total` (NULL where none counts)."""
    counted = values.cast(pl.Decimal(38, EXACT_DIGITS), strict=False).count()
    return pl.when(counted > 0).then(exact_total(values) / counted)
