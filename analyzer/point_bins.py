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
