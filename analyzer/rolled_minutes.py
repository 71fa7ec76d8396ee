"""Raw-window increases with their final minutes read from the rollups (analyzer.latency rule 12).

A raw window's increase (analyzer.latency rule 9) sums the stored increase of every point of the
window and its look-back. Where the store's per-minute counter rollups keep each minute's increase
(the sum of that minute's stored point increases, collector.store rollup rule 2), the whole minutes
inside the window that maintenance has finished with are read from them, one row a series and
minute instead of one a point (60 at 1 Hz); only the look-back, the partial minutes at the window's
edges and the minutes not yet final are read from the points. Every sum is exact
(:func:`analyzer.point_bins.exact_sum`): the same in any order DuckDB adds them.

Rules:

1. A minute ``[m, m + 60 s)`` is *final* when it ends at least two minutes before the store's
   rollup watermark (``ioe_state.rollup_watermark_ns``: the end of the last maintenance pass):
   each pass recomputes from two minutes before the previous watermark, so a late point of a
   minute in the last two is still added at the next pass, and a final minute is never rolled up
   again. A store that maintenance never ran on (watermark 0) has no final minute and is read as
   before. A point stored after its minute became final (a backfill of old data into a store
   maintained past it, or a replay more than two minutes late) is in the raw points and not in
   the rollup, nor is the increase the store then repairs on the point after it: this rule
   counts them out, as the rollup reads of long windows (analyzer.latency rule 11) do.
2. The minutes read from the rollups (``used``) are the final ones with ``m ≥ start`` and
   ``m + 60 s ≤ end + 1 ns`` (the window is ``(start, end]``), when every one of them lies in one
   bin but for its first instant: bins that are the whole window, or whole minutes from a start
   on a minute. Otherwise (60 s bins from a start inside a minute), or with fewer than
   :data:`MIN_USED` of them, nothing is used.
3. A point at the first instant of a used minute that is a bin edge (``ts = m``, ``m − start`` a
   multiple of the bin) belongs to the bin before it, the rollup to the bin after: it is read from
   the points too, counted in its own bin and taken out of the next one.
4. The rollup's minutes are complete only where retention kept every raw point of them: a raw
   point at or before the first used minute shows that (retention deletes the oldest points first,
   the same instant for every series). The statement says whether the selection's look-back
   holds one (``looked_back``); where none, the caller reads the window from the points alone.
5. Each series' first point in the read range counts 0 (analyzer.latency rule 9): fresh series
   (no point in the look-back) have their first point in the window taken back out of its bin,
   read from the points as before. A bin is NULL only where every point in it has a NULL increase
   and no fresh series starts in it.
6. So the sums are rule 9's but for rounding: a rollup minute's increase is the store's float sum
   of its points' (rounded once when it was rolled up, in the order the store added them), rule
   9 sums the points exactly. Both are fixed by the store's contents, so a report is the same on
   every run and thread count; against the points alone a bin moves in its last bits (a few
   units in the last place where a minute mixes increases of very different sizes: 5.8e-16 of a
   one-minute bin in tests/test_rolled_minutes.py; none where the counts are whole numbers).

Gauges (:func:`analyzer.crossover._series_bins`: the GPU gauge reads of the load bins and of the
envelope's window means, a sum and a count of the values per series and bin):

7. The used minutes, as rules 1-2 decide them (the same watermark, the same fit to the bins), are
   read from the GPU rollup ``gpu_samples_1m`` as each minute's sum ``avg · n`` and count ``n``;
   the partial minutes at the window's edges and the minutes not final from the points; a point
   at a used minute's first instant on a bin edge as rule 3 (its value and count taken out of
   the next bin). Only for selections of at least ``analyzer.latency.ROLLED_MIN_SERIES`` series.
8. The rollup keeps a row per ``host, uuid, metric, link`` (:data:`GAUGE_ROLLUPS`), not per
   series: the read sums each key (its rows under its first selected series, the lowest
   ``series_id``), not each series. Where several series share a key (their other labels
   changed), their bins are one row (the reads sum each GPU and metric over its series).
9. The rollup's minutes are complete only where retention kept their points: the store must
   hold a point in the minute before the first used minute's first instant (any series:
   retention deletes the oldest points first), else the points alone are read.
10. The rollup's ``n`` counts the points, its ``avg`` only those with a value: where a point of
    the used minutes has a NULL value, the points alone are read.
11. So the sums are the points' but for rounding: the stored ``avg`` is the store's float sum of
    the minute's values (in the order it added them), divided by ``n``, and ``avg · n`` rounds
    once more: ``|avg · n − Σx| ≤ (n + 2) · 2⁻⁵³ · Σ|x|``, 6.9e-15 of the minute's sum at 60
    points a minute (measured: 4.9e-16 of a 60 s bin at most in tests/test_rolled_gauges.py,
    7.4e-16 on 512 GPUs' 15 minutes). The
    avg is a fixed number of the store, and the sums are exact, so a report is the same on every
    run and thread count. A point stored after its minute became final is not in the rollup:
    counted out (rule 1); a store never maintained (watermark 0) reads the points alone.
12. The regression's fabric and clock axes (:func:`analyzer.regression_axes._gpu_rows`: per bin
    the NVLink/PCIe values' sum and the number of their sample times, the SM clocks' sum and
    count, over a deployment's GPUs) read the used minutes as rule 7 does, under rules 8-11,
    summed per class rather than per series (:func:`link_clock_with_minutes`). A rollup row
    counts a key's points, not the instants its points share with other keys', so the link
    sample times are counted from the points: each instant in the window with a link point
    once, read by series and timestamp without their values.
"""

from __future__ import annotations

import duckdb

from analyzer.point_bins import binned_points, exact_sum
from collector import state
from collector.series import packed_name, recent_name, times_name

MIN_NS = 60_000_000_000
FINAL_BEHIND_NS = 2 * MIN_NS  # rule 1: the minutes every maintenance pass recomputes
MIN_USED = 3  # rule 2: fewer used minutes than this read the points alone (too little to gain)


def watermark(con: duckdb.DuckDBPyConnection) -> int:
    """The store's rollup watermark (0 when never set or no state table), in either form of
    ``ioe_state`` (:func:`collector.state.read`)."""
    return state.read(con, "rollup_watermark_ns")


def used_minutes(mark_ns: int, start_ns: int, end_ns: int, bin_ns: int) -> tuple[int, int] | None:
    """Rules 1-2: ``[a, b)``, the minutes of ``(start, end]`` in ``bin_ns`` bins read from the
    rollups, given the watermark; None when fewer than :data:`MIN_USED`."""
    whole = bin_ns >= end_ns - start_ns
    if not whole and (bin_ns % MIN_NS or start_ns % MIN_NS):
        return None
    a = -(-start_ns // MIN_NS) * MIN_NS
    b = min((end_ns + 1) // MIN_NS * MIN_NS, (mark_ns - FINAL_BEHIND_NS) // MIN_NS * MIN_NS)
    if mark_ns <= 0 or b - a < MIN_USED * MIN_NS:
        return None
    return a, b


def _outside_used(start: int, bin_ns: int, used: tuple[int, int]) -> str:
    """The points a statement with used minutes ``[a, b)`` reads (an SQL filter of ``ts_ns``):
    those after ``start`` outside the used minutes, and each used minute's first instant that is
    a bin edge (rule 3)."""
    a, b = used
    firsts = [str(t) for t in range(a, b, MIN_NS) if (t - start) % bin_ns == 0]
    within = f"ts_ns > {start} AND (ts_ns < {a} OR ts_ns >= {b})"
    return within + (f" OR ts_ns IN ({', '.join(firsts)})" if firsts else "")


def summed_with_minutes(
    table: str,
    described: str,
    concept: str,
    where: str,
    name: str,
    window: tuple[int, int, int, int],
    ids: tuple[int, int],
    used: tuple[int, int],
) -> str:
    """Rules 2-5's statement: ``[described..., bin, name, looked_back]`` (``looked_back``: rule
    4's answer, the same in every row; no row where the selection has no point and no rollup row).

    ``e``: the window's points outside the used minutes, and those at a used minute's first
    instant on a bin edge (``edge``: rule 3; the window's start may be one, in the look-back's
    bin -1), packed points binned by their timestamp (:func:`analyzer.point_bins.binned_points`,
    the minutes left out there, on the timestamps). ``seen``: the series with a point in the
    look-back, whose sums no bin needs (rule 9 asks only which series have one); where the
    window's start is an edge (``a`` = start), its points are in ``e`` (bin -1) and the rest of
    the look-back is read before it, ``(lower, start)``: the start instant opens a time chunk
    of the packed points when the start is on one, and reading it with the look-back read a
    second chunk (512 GPUs, the look-back's scan 2.4 M -> 0.7 M rows; the four rule-12 reads of
    a report 7-27 % less CPU, medians of 15, load 3-4). ``v``: each of
    those points in its bin (from 0), the edge points again, negated, in the next bin, and the
    fresh series' first points (``f``) negated in theirs, each row then given its series'
    ``described`` columns: summed by ``described`` and bin at once, not by series first (the
    edge points made 77 k one-point groups of a 512-GPU window's 60 s bins, and the look-back's
    660 k points were summed for nothing: that bucket read took 0.33-0.49 s summing the read
    range by series and bin, 0.10-0.12 s so, load 2.3-3). ``r``: the used minutes' rollup rows
    summed by ``described`` and bin (a minute's bin is that of its second instant). ``window`` =
    (start, end, bin width, look-back lower bound) and ``used`` = ``[a, b)`` are SQL literals;
    ``ids`` as rule 9's. Parameters: the ``where`` filter's (``concept`` and keys), twice: for
    the series, then for the rollup rows."""
    start, end, bin_ns, lower = (int(x) for x in window)
    a, b = (int(x) for x in used)
    m = -(-(start - lower) // bin_ns) + 1  # look-back bins: every dividend below is positive
    bin_of = f"CAST((ts_ns - {start - m * bin_ns} - 1) // {bin_ns} AS BIGINT) - {m}"
    points = binned_points(table, "increase", lower, end, bin_of, ids, _outside_used(start, bin_ns, (a, b)))
    cols = described.split(", ")
    out = ", ".join([cols[0], "bin", *cols[1:]])
    if a == start:  # the start instant is an edge point, in e (bin -1): the look-back's rest is read
        before = binned_points(table, "increase", lower, start - 1, "0", ids)
        seen = f"SELECT series_id FROM {before} UNION SELECT series_id FROM e WHERE bin < 0"
    else:
        seen = f"SELECT DISTINCT series_id FROM {binned_points(table, 'increase', lower, start, '0', ids)}"
    return f"""
        WITH ser AS (
            SELECT series_id, {described} FROM {table}_series WHERE {concept}{where}
        ), e AS MATERIALIZED (
            SELECT series_id, bin, ts_ns >= {a} AND ts_ns < {b} AS edge, increase FROM {points}
        ), seen AS MATERIALIZED (
            {seen}
        ), fresh AS (
            SELECT series_id FROM ser ANTI JOIN seen USING (series_id)
        ), f AS (
            SELECT series_id, CAST((min(ts_ns) - {start} - 1) // {bin_ns} AS BIGINT) AS bin,
                   arg_min_null(increase, ts_ns) AS inc0
            FROM {table}_points
            WHERE series_id IN (SELECT series_id FROM fresh) AND ts_ns > {start} AND ts_ns <= {end}
            GROUP BY series_id
        ), v AS (
            SELECT series_id, bin, increase AS inc FROM e WHERE bin >= 0
            UNION ALL SELECT series_id, bin + 1, -increase FROM e WHERE edge
            UNION ALL SELECT series_id, bin, -coalesce(inc0, 0) FROM f
        ), r AS (
            SELECT {described}, CAST((minute_ns - {start}) // {bin_ns} AS BIGINT) AS bin,
                   {exact_sum("increase")} AS inc
            FROM {table}_1m WHERE {concept}{where} AND minute_ns >= {a} AND minute_ns < {b}
            GROUP BY ALL
        )
        SELECT *, (SELECT count(*) > 0 FROM seen) AS looked_back FROM (
            SELECT {out}, {exact_sum("inc")} AS {name} FROM (
                SELECT {", ".join(f"ser.{c}" for c in cols)}, v.bin, v.inc FROM v JOIN ser USING (series_id)
                UNION ALL SELECT * FROM r
            ) GROUP BY {out}
        ) ORDER BY {out}"""


# Gauges: a window's whole final minutes from the GPU rollup's per-minute means (rules 7-11).
GAUGE_ROLLUPS = {"gpu_samples": "host, uuid, metric, link"}  # the rollup's key: columns of the series


def gauge_check_sql(table: str, used: tuple[int, int]) -> str:
    """Rules 9-10's question, ``[points_before, nulls]``: whether ``table`` holds a point in the
    minute before the first used minute's first instant (``(a − 60 s, a]``), and whether any point
    in the used minutes ``[a, b)`` has a NULL value. Both read with their filter on the points'
    columns (the NULL test skips every row group whose statistics say it has none: 3-7 ms at 512
    GPUs)."""
    a, b = (int(x) for x in used)
    before = binned_points(table, "value", a - MIN_NS, a, "0")
    during = binned_points(table, "value", a - 1, b - 1, "0")
    return f"SELECT EXISTS (SELECT 1 FROM {before}), EXISTS (SELECT 1 FROM {during} WHERE value IS NULL)"


def gauge_sums_with_minutes(
    table: str, described: str, where: str, window: tuple[int, int, int], used: tuple[int, int]
) -> str:
    """Rules 7-8's statement: ``[described..., bin, v, n]`` a series and bin (``v`` the sum of the
    values, NULL where none counts; ``n`` their count), bins of ``bin`` from ``start`` as
    :func:`analyzer.crossover._series_bins`' (``window`` = (start, end, bin), ``used`` = ``[a,
    b)``, SQL literals; ``described``: columns of the rollup's key).

    ``p``: the window's points outside the used minutes, and those at a used minute's first
    instant on a bin edge (``edge``: rule 3, the window's start among them, in bin -1), of the
    selected series, under their key's first series (``lead``, rule 8). ``x``: each of them in
    its bin (from 0), value ``x``, count ``c`` (0 for a NULL value) and points ``k`` 1; each
    edge point again, negated (``c`` and ``k`` −1), in the next bin; the used minutes' rollup
    rows, ``avg · n`` and ``n``, under their key's first series. Summed by that series and bin
    with :func:`analyzer.point_bins.exact_sum`; a bin is a row where it has a point (``k``), as
    from the points. Parameters: the ``where`` filter's, twice (the series, the rollup rows)."""
    start, _, bin_ns = (int(x) for x in window)
    a, b = (int(x) for x in used)
    key = GAUGE_ROLLUPS[table]
    points = _gauge_points(table, window, used)
    out = ", ".join(f"s.{c.strip()}" for c in described.split(","))
    return f"""
        WITH s AS MATERIALIZED (
            SELECT series_id, {key}, min(series_id) OVER (PARTITION BY {key}) AS lead
            FROM {table}_series WHERE {where}
        ), p AS MATERIALIZED (
            SELECT s.lead AS series_id, bin, ts_ns >= {a} AND ts_ns < {b} AS edge, value
            FROM {points} JOIN s USING (series_id)
        ), x AS (
            SELECT series_id, bin, value AS x, CAST(value IS NOT NULL AS BIGINT) AS c, 1 AS k
            FROM p WHERE bin >= 0
            UNION ALL
            SELECT series_id, bin + 1, -value, -CAST(value IS NOT NULL AS BIGINT), -1 FROM p WHERE edge
            UNION ALL
            SELECT r.lead, CAST((minute_ns - {start}) // {bin_ns} AS BIGINT), avg * n, n, n
            FROM {table}_1m JOIN (SELECT DISTINCT {key}, lead FROM s) AS r USING ({key})
            WHERE {where} AND minute_ns >= {a} AND minute_ns < {b}
        )
        SELECT {out}, bin, v, n FROM (
            SELECT series_id, bin, CASE WHEN sum(c) > 0 THEN {exact_sum("x")} END AS v, sum(c) AS n
            FROM x GROUP BY series_id, bin HAVING sum(k) > 0
        ) JOIN s USING (series_id) ORDER BY series_id, bin"""


def _gauge_points(table: str, window: tuple[int, int, int], used: tuple[int, int]) -> str:
    """The points of ``table`` in ``(start - 1, end]`` that rules 7 and 12 read (outside the used
    minutes, and the edge points: rule 3), each in its bin of ``bin`` from ``start`` (the start
    instant in bin -1); ``window`` = (start, end, bin), ``used`` = ``[a, b)``."""
    start, end, bin_ns = (int(x) for x in window)
    a, b = (int(x) for x in used)
    bin_of = (
        f"CAST((ts_ns - {start - bin_ns + 1}) // {bin_ns} AS BIGINT) - 1"  # positive dividends: // truncates
    )
    return binned_points(table, "value", start - 1, end, bin_of, None, _outside_used(start, bin_ns, (a, b)))


def link_clock_with_minutes(
    where: str, link: str, window: tuple[int, int, int], used: tuple[int, int], tix: tuple[int, int]
) -> str:
    """Rule 12's statement: ``[b, link sum, link sample times, clock sum, clock count]`` per bin of
    ``gpu_samples``' series selected by ``where`` (``link``: the SQL test of a link metric, the
    others are clocks), bins of ``bin`` from ``start`` (``window`` = (start, end, bin), ``used``
    = ``[a, b)``, SQL literals).

    ``p``, ``x``: as :func:`gauge_sums_with_minutes`' (the points outside the used minutes and
    the edge points, the used minutes' rollup rows as ``avg · n`` and ``n``), by class (``l``)
    instead of by series; ``sums``: exact sums per bin and class. ``t``: the window's instants
    with a point of a link series, from the recent points' timestamps and the packed points'
    ``tix`` (those between ``tix``, inclusive: the window's, as SQL literals, a range filter
    the scan prunes with; the join to the timestamps keeps the window's), each instant once;
    ``d``: their number per bin. Parameters: the ``where`` filter's, twice (the series, the
    rollup rows)."""
    start, end, bin_ns = (int(x) for x in window)
    a, b = (int(x) for x in used)
    t0, t1 = (int(x) for x in tix)
    points = _gauge_points("gpu_samples", window, used)
    span = f"ts_ns > {start} AND ts_ns <= {end}"
    links = "series_id IN (SELECT series_id FROM s WHERE l)"
    return f"""
        WITH s AS MATERIALIZED (
            SELECT series_id, {link} AS l FROM gpu_samples_series WHERE {where}
        ), p AS MATERIALIZED (
            SELECT s.l, bin, ts_ns >= {a} AND ts_ns < {b} AS edge, value
            FROM {points} JOIN s USING (series_id)
        ), x AS (
            SELECT l, bin, value AS x, CAST(value IS NOT NULL AS BIGINT) AS c FROM p WHERE bin >= 0
            UNION ALL SELECT l, bin + 1, -value, -CAST(value IS NOT NULL AS BIGINT) FROM p WHERE edge
            UNION ALL
            SELECT {link}, CAST((minute_ns - {start}) // {bin_ns} AS BIGINT), avg * n, n FROM gpu_samples_1m
            WHERE {where} AND minute_ns >= {a} AND minute_ns < {b}
        ), sums AS (
            SELECT bin, {exact_sum("x", "l")} AS ls, {exact_sum("x", "NOT l")} AS cs,
                   sum(c) FILTER (WHERE NOT l) AS cn
            FROM x GROUP BY bin
        ), t AS (
            SELECT ts_ns FROM {recent_name("gpu_samples")} WHERE {span} AND {links}
            UNION
            SELECT ts_ns FROM {times_name("gpu_samples")} JOIN (
                SELECT tix FROM {packed_name("gpu_samples")} WHERE {links} AND tix BETWEEN {t0} AND {t1}
                GROUP BY tix
            ) USING (tix) WHERE {span}
        ), d AS (
            SELECT CAST((ts_ns - {start} - 1) // {bin_ns} AS BIGINT) AS bin, count(*) AS lt FROM t GROUP BY 1
        )
        SELECT bin AS b, ls, lt, cs, cn FROM sums FULL JOIN d USING (bin) ORDER BY bin"""
