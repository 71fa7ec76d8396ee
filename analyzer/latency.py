"""Latency quantiles from engine histogram buckets, over any window and per time bin.

Input: ``histogram_buckets`` rows (cumulative count per ``le`` in seconds, per engine series).
Output: bucket-estimated quantiles (:class:`Quantile`) and per-bin quantile frames.

Rules:
 1. The count of observations in a window is the *increase* of each bucket's cumulative count
    between the window's ends, taken per series: the sum of positive steps between consecutive
    samples, and, after a drop (a counter reset: the engine restarted), the new value itself.
    The base is the last sample before the window start (looked back ``lookback_s``), so a
    window loses nothing to its first scrape.
 2. Series of one deployment are merged by adding their increases per ``le`` (engines of one
    deployment share a bucket layout; a mixed layout would merge bounds that do not line up).
 3. A quantile is interpolated linearly inside the bucket that holds rank ``q × total``, as
    Prometheus ``histogram_quantile`` does: the lower bound of the first bucket is 0; a rank in
    the ``+Inf`` bucket returns the highest finite bound (``capped``: the true value is larger).
 4. Every result is a bucket estimate (``estimate = "bucket_interpolated"``); when it lies in the
    first bucket it is flagged ``at_floor``: vLLM's request-phase histograms (queue, prefill,
    decode, e2e) start at 0.3 s, so a fast deployment's quantile from them reads ≤ 0.3 s.
 6. Long spans read the per-minute rollups (``*_1m``, kept by ``Store.maintain``) instead of raw
    rows (``rollup=True``): the last cumulative count per minute gives the same increases at
    minute resolution, so history over days stays cheap. Left to the functions here
    (``rollup=None``), the choice is :func:`rollup_for`: a window longer than
    :data:`ROLLUP_AFTER_S` (1 h) whose bins, if any, are whole minutes reads the rollups when the
    store holds rollup rows in it; the page's 15-minute and 1-hour windows read raw rows, its 6 h
    and 24 h windows 1,440 rows a series a day instead of 86,400 at 1 Hz. What a rollup read
    gives up: a reset inside a minute loses that minute's growth before the reset, and the
    newest minutes not yet rolled up (under a minute plus the maintenance interval: 60 s with
    the API, 300 s in a collector-only sidecar unless set) are left out — at most 2 minutes of
    a window with the API, 6 of a collector-only store's: 1.7 % of the page's 6 h window, 0.4 %
    of its 24 h one.
 5. Means come from ``<hist>_sum`` / ``<hist>_count`` counters in ``engine_samples`` with the same
    reset-aware increase (rule 1), and are exact, not estimates.
 7. Where the raw tables are in the series layout (a store file or a writable store:
    :mod:`collector.series`), increases are taken on the points table, one ``lag`` partition per
    integer ``series_id`` (a series is exactly one cumulative counter), and only the selected
    series' descriptions are joined back; the wide views (a DuckLake store, an old file opened
    read-only) are read as before. Both give the same rows.
 8. Inside :func:`shared_reads` (one report), an increase statement asked again with the same
    connection, window, series, concepts, bins, look-back and source answers from its first
    run: a report reads its window's histograms for the envelope and again for the regression,
    and a 24 h window's 60 s bins for the envelope's ramp test and again for Cp. The catalog
    (which relations rules 7, 9 and 11 may read) and the per-bin quantiles of the same bins are
    asked once as well.
 9. Where the points also keep each point's increase (a store file at schema 5:
    :mod:`collector.increases`), a window's increase is a plain sum of the stored increases of its
    points, per series and bin, with no ``lag`` (no sort): each series' first point in the read
    range (look-back included) counts 0, as its ``lag`` had no previous point (rule 5 there).
    The same rows as rule 7's statement, up to the order floats are added in.
 10. Inside :func:`shared_reads`, a statement of rule 9 or 11 whose window starts where an earlier
    one's does, ends no later and is cut in bins that the earlier one's bins divide (the whole
    15-minute window after its 60 s bins) is regrouped from the earlier result, not read again:
    the same points, the same first point of each series (the read range starts at the same
    look-back), so the same sums (a 24 h window's whole-window rollup sums come from its 60 s
    bins, which the load curve read first). Inside :func:`shared_reads` rule 9 reads every concept of the
    table for the selected engines at once and each call keeps its own concepts: the envelope's
    ITL per minute and every histogram over the window are one read of the window's points.
 11. Where the counter rollups keep each minute's increase (schema 6: the sum of the minute's
    stored point increases, collector.store rollup rule 2), a long window's increase is a plain
    sum of them per ``concept`` (and ``le``) and bin, with no ``lag`` (no sort), and rule 6's
    loss goes: a reset inside a minute keeps that minute's growth before it. As with rule 9,
    each series' first minute in the read range (look-back included) counts 0, as its ``lag``
    over the minutes' last values had no previous row; only series with no minute in the
    look-back have one inside the window, taken back out of its bin. Otherwise the same rows as
    rule 6's ``lag`` statement: a minute's summed steps add up to the step between its last
    value and the previous minute's.
 12. Where rule 9 applies and the counter rollups keep each minute's increase (rule 11), the
    whole minutes of the window that maintenance has finished with (*final*: ending at least two
    minutes before the store's rollup watermark, as each pass recomputes the last two) are read
    from the rollups, one row a series and minute; the look-back, the partial minutes at the
    window's edges and the minutes not final are read from the points, in the same statement.
    Only where the rollup minutes fit the bins (the whole window, or whole-minute bins from a
    start on a minute) and the read range has a point before the window (else retention may
    have cut the minutes' points: the points alone are read). Rule 9's sums but for rounding (a
    rollup minute's increase is the store's float sum of its points, rule 9 sums the points
    exactly), except for a point stored after its minute was final (a backfill of old data into
    a store maintained past it): the rollup does not hold it. :mod:`analyzer.rolled_minutes`
    states the statement's rules. Only for selections of at least :data:`ROLLED_MIN_SERIES`
    series (below, its fixed cost is more than the points it saves). 15 of a 512-GPU window's 17
    minutes of bucket points (with its look-back) are one rollup row a series: its 60 s bucket
    read took 0.10-0.13 s instead of 0.30-0.62 s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import duckdb
import numpy as np
import polars as pl

from analyzer.deployments import ENGINE_KEY_SQL, IN_TEXTS, texts
from analyzer.point_bins import binned_points, exact_sum, exact_total
from analyzer.rolled_minutes import summed_with_minutes, used_minutes, watermark

HISTOGRAMS = (
    "ttft_seconds",
    "itl_seconds",
    "tpot_seconds",
    "e2e_seconds",
    "queue_seconds",
    "prefill_seconds",
    "decode_seconds",
)
REQUEST_PHASE_FLOOR_S = 0.3  # vLLM request-phase histograms' first bucket (REFERENCE §2)
NS = 1_000_000_000


@dataclass(frozen=True)
class Quantile:
    """One bucket-estimated quantile of one histogram over one window."""

    metric: str
    q: float
    value_s: float | None
    observations: float
    first_bucket_s: float | None
    at_floor: bool
    capped: bool
    estimate: str = "bucket_interpolated"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def histogram_quantile(les: Sequence[float], cumulative: Sequence[float], q: float) -> float | None:
    """Rule 3 on one histogram: ``les`` ascending (last may be +inf), ``cumulative`` counts.

    ``[0.1, 0.5, inf], [2, 8, 10], 0.5`` → rank 5 lies in (0.1, 0.5] → 0.1 + 0.4 × 3/6 = 0.3.
    Returns None when the histogram holds no observation or ``q`` is outside [0, 1].
    """
    if not 0.0 <= q <= 1.0 or not les:
        return None
    cum = np.maximum.accumulate(np.asarray(cumulative, dtype=float))
    total = float(cum[-1])
    if total <= 0:
        return None
    rank = q * total
    b = int(np.searchsorted(cum, rank, side="left"))
    b = min(b, len(les) - 1)
    if math.isinf(les[b]):
        return float(les[b - 1]) if b > 0 else None
    lower = 0.0 if b == 0 else float(les[b - 1])
    below = 0.0 if b == 0 else float(cum[b - 1])
    in_bucket = float(cum[b]) - below
    if in_bucket <= 0:
        return float(les[b])
    return lower + (float(les[b]) - lower) * (rank - below) / in_bucket


def quantile_of(metric: str, les: Sequence[float], cum: Sequence[float], q: float) -> Quantile:
    """Rule 3 + rule 4 flags for one merged histogram."""
    value = histogram_quantile(les, cum, q)
    finite = [x for x in les if not math.isinf(x)]
    first = finite[0] if finite else None
    top = finite[-1] if finite else None
    return Quantile(
        metric=metric,
        q=q,
        value_s=value,
        observations=float(max(cum, default=0.0)),
        first_bucket_s=first,
        at_floor=value is not None and first is not None and value <= first,
        capped=value is not None and top is not None and value >= top and q > 0 and _in_inf(les, cum, q),
    )


def _in_inf(les: Sequence[float], cum: Sequence[float], q: float) -> bool:
    finite_total = max((c for le, c in zip(les, cum, strict=True) if not math.isinf(le)), default=0.0)
    return q * max(cum, default=0.0) > finite_total


_MINUTE_END = "minute_ns + 60000000000 AS ts_ns"
_ENGINE_COLS = "source, engine, model, dp_rank, tp_rank, pp_rank, ep_rank, concept, labels"
_ROLLUPS = {
    "histogram_buckets": (
        f"(SELECT {_MINUTE_END}, {_ENGINE_COLS}, le, cumulative_count FROM histogram_buckets_1m)"
    ),
    "engine_samples": f"(SELECT {_MINUTE_END}, {_ENGINE_COLS}, last AS value FROM engine_samples_1m)",
    "engine_gauges": f"(SELECT {_MINUTE_END}, {_ENGINE_COLS}, avg AS value FROM engine_samples_1m)",
    "gpu_samples": f"(SELECT {_MINUTE_END}, host, uuid, metric, avg AS value FROM gpu_samples_1m)",
}


ROLLUP_AFTER_S = 3600.0  # rule 6


def rollup_for(
    con: duckdb.DuckDBPyConnection, start_ns: int, end_ns: int, bin_s: float | None = None
) -> bool:
    """Rule 6: whether ``(start_ns, end_ns]`` (in ``bin_s`` bins, or whole) reads the rollups."""
    if end_ns - start_ns <= ROLLUP_AFTER_S * NS or (bin_s is not None and bin_s % 60):
        return False
    return _shared((id(con), "rollup_rows", start_ns, end_ns), lambda: _rollup_rows(con, start_ns, end_ns))


def _rollup_rows(con: duckdb.DuckDBPyConnection, start_ns: int, end_ns: int) -> bool:
    """Whether the rollups hold a minute in ``[start_ns, end_ns)`` (asked once per report and
    window, rule 8; the numbers as SQL literals, as in :func:`_summed_minutes`)."""
    row = con.execute(
        "SELECT EXISTS (SELECT 1 FROM engine_samples_1m "
        f"WHERE minute_ns >= {int(start_ns)} AND minute_ns < {int(end_ns)})"
    ).fetchone()
    return bool(row and row[0])


def table_sql(name: str, rollup: bool, within: tuple[int, int] | None = None) -> str:
    """Rule 6: the raw table, or its per-minute rollup shaped like it (a minute's rows stamped at its end).

    ``engine_gauges`` is ``engine_samples`` read for gauges (the minute's mean, not its last value).
    ``within`` = ``(lo, hi)``: the rollup's minutes stamped in ``(lo, hi]`` only, bounded on
    ``minute_ns`` itself, which the rollup tables' zone maps prune (a filter on the stamp, an
    expression, reads every row group: a day's SM/DRAM bins of a week's rollups 40 ms, 10 ms bounded).
    The caller still filters the stamp: the same rows.
    """
    if rollup:
        sql = _ROLLUPS[name]
        if within is not None:
            lo, hi = (int(x) - 60 * NS for x in within)
            sql = f"{sql[:-1]} WHERE minute_ns > {lo} AND minute_ns <= {hi})"
        return f"{sql} AS {name.replace('engine_gauges', 'engine_samples')}"
    return name.replace("engine_gauges", "engine_samples")


_SHARED: ContextVar[dict[tuple[Any, ...], Any] | None] = ContextVar("ioe_shared_reads", default=None)
_T = TypeVar("_T")


@contextmanager
def shared_reads() -> Iterator[None]:
    """Rule 8: repeated increase statements inside the block run once (this thread or task only)."""
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def in_shared_reads() -> bool:
    """Whether this thread or task is inside :func:`shared_reads` (rule 8)."""
    return _SHARED.get() is not None


def report_memo(name: str) -> dict[Any, Any] | None:
    """This report's memo of the reads called ``name`` (rule 8, for reads made outside this
    module), or None outside :func:`shared_reads`."""
    memo = _SHARED.get()
    return None if memo is None else memo.setdefault(("memo", name), {})


def _shared(key: tuple[Any, ...], run: Callable[[], _T]) -> _T:
    memo = _SHARED.get()
    if memo is None:
        return run()
    if key not in memo:
        memo[key] = run()
    return memo[key]


def _binned(
    series: tuple[Any, ...], start_ns: int, end_ns: int, bin_ns: int, run: Callable[[], pl.DataFrame]
) -> pl.DataFrame:
    """Rule 10: stored increases of ``series`` (connection, table, filters, window start and
    look-back) over ``(start, end]`` in ``bin_ns`` bins, from this report's memo when a result
    with finer bins that divide these, from the same start to the same or a later end, is
    there (bins ``k`` of width ``b`` regroup as ``k·b // bin_ns``); else ``run()``, kept."""
    memo = _SHARED.get()
    if memo is None:
        return run()
    known: dict[tuple[int, int], pl.DataFrame] = memo.setdefault(("binned", *series), {})
    regrouped: dict[tuple[int, int], pl.DataFrame] = memo.setdefault(("regrouped", *series), {})
    got = known.get((end_ns, bin_ns))
    if got is None:
        got = regrouped.get((end_ns, bin_ns))
    if got is not None:
        return got
    for (end, b), finer in known.items():  # regrouped from what was read, each regrouping kept
        if end >= end_ns and bin_ns % b == 0 and (end_ns - start_ns) % b == 0:
            got = regrouped[(end_ns, bin_ns)] = _coarser(finer, b, bin_ns, (end_ns - start_ns) // b)
            return got
    got = known[(end_ns, bin_ns)] = run()
    return got


def _coarser(finer: pl.DataFrame, b: int, bin_ns: int, bins: int) -> pl.DataFrame:
    """Rule 10's regrouping: the first ``bins`` bins of width ``b`` summed into bins of
    ``bin_ns``, a sum of NULLs staying NULL (as SQL's)."""
    value = finer.columns[-1]
    keys = [c for c in finer.columns[:-1] if c != "bin"]
    x = pl.col(value)
    return (  # one lazy query: each eager step is a query of its own (~0.4 ms each under load)
        finer.lazy()
        .filter(pl.col("bin") < bins)
        .with_columns((pl.col("bin") * b // bin_ns).cast(pl.Int64).alias("bin"))
        .group_by([keys[0], "bin", *keys[1:]], maintain_order=True)
        .agg(pl.when(x.is_null().all()).then(None).otherwise(exact_total(x)).alias(value))
        .sort([keys[0], "bin", *keys[1:]])
        .collect()
    )


def _key_filter(keys: Sequence[str] | None) -> tuple[str, list[Any]]:
    if keys is None:
        return "", []
    return f" AND {ENGINE_KEY_SQL} {IN_TEXTS}", [texts(keys)]


def _catalog(con: duckdb.DuckDBPyConnection) -> dict[str, frozenset[str]]:
    """The columns of this store's points relations and rollups (``*_points``, ``*_1m``), by
    relation: what rules 7, 9 and 11 ask of the catalog, read in one statement, once per report
    (rule 8). A catalog statement costs 4-8 ms here; a report asked ten of them."""

    def read() -> dict[str, frozenset[str]]:
        rows = con.execute(
            "SELECT table_name, list(column_name) FROM information_schema.columns "
            "WHERE table_catalog = current_database() "
            "AND (suffix(table_name, '_points') OR suffix(table_name, '_1m')) GROUP BY table_name"
        ).fetchall()
        return {str(t): frozenset(cols) for t, cols in rows}

    return _shared((id(con), "catalog"), read)


def _points_of(con: duckdb.DuckDBPyConnection, table: str, rollup: bool) -> bool:
    """Rule 7: whether ``table`` is read from its points table here (series layout, raw rows)."""
    return not rollup and f"{table}_points" in _catalog(con)


def reads_points(con: duckdb.DuckDBPyConnection, table: str, rollup: bool = False) -> bool:
    """Rule 7's choice for any raw read of ``table``: its points table (and ``{table}_series``)
    rather than the wide view, asked once per report."""
    return _points_of(con, table, rollup)


def per_series_means(table: str) -> str:
    """The points of ``table`` in ``(lower, upper]`` summed per series, to be joined to the few
    series a report selects: ``series_id, v, n``, a gauge's mean over a group of series being
    ``sum(v) / sum(n)`` (``v`` and ``sum(v)`` as :func:`analyzer.point_bins.exact_sum`).
    Joining each point to its series first (the view ``{table}`` joins
    every point to its text columns) cost a hash probe a point: 0.38 s against 0.21 s for the
    window means of 512 GPUs' engines. (Per time bin the view's plan was the faster one.)

    Parameters: lower ts, upper ts."""
    return (
        f"(SELECT series_id, {exact_sum('value')} AS v, count(value) AS n FROM {table}_points "
        "WHERE ts_ns > ? AND ts_ns <= ? GROUP BY series_id)"
    )


def _stored_increases(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    """Rule 9: whether the points of ``table`` keep each point's increase here (asked once per
    report: rule 8; a catalog query costs ~30 ms on a busy machine)."""

    return "increase" in _catalog(con).get(f"{table}_points", ())


def _summed_increases(
    table: str,
    described: str,
    where: str,
    name: str,
    window: tuple[int, int, int, int],
    ids: tuple[int, int],
    every_concept: bool = False,
) -> str:
    """Rule 9's statement: ``[described..., bin, name]`` summed from the points' stored increases.

    The points of the read range (look-back and window) are read once and summed by series and
    bin (``p``): window bins from 0, look-back bins negative (bins counted from a start ``m``
    bins before the window's, so every dividend is positive and ``//`` floors). The first point
    of a series in the read range counts 0: for a series with a point in the look-back that point
    is before the window, so nothing is taken out; for the others (``fresh``: a series that
    started inside the window or came back after a gap, usually none) their first point in the
    window (``f``) is taken back out of its bin, ``coalesce(sum, 0) - coalesce(first, 0)``: what
    adding 0 for it and the stored increases of the others gave, NULLs included (the first point
    makes that bin's sum non-NULL).

    The points are summed before they are matched to the selected series (``ser``), bounded only
    by the selection's lowest and highest ``series_id``: matching 5.6 M points of a 512-GPU
    window to their series one by one cost more than summing them, and where the points are
    packed by series (``collector.series``) every read of a packed hour scans all of it, so the
    look-back is read in the same pass (a second read cost as much as the window's). Packed
    points take their bin from their timestamp (:func:`analyzer.point_bins.binned_points`).

    ``window`` = (start ts, upper ts, bin width, lower ts) and ``ids`` = the selection's lowest and
    highest ``series_id`` (:func:`_series_range`) are SQL literals (a bound integer costs DuckDB's
    Python client a search for pandas, ~1.5 ms under load). Parameters: the ``where`` filter's
    (concepts unless ``every_concept``, keys)."""
    start, end, bin_ns, lower = (int(x) for x in window)
    m = -(-(start - lower) // bin_ns) + 1  # look-back bins: every dividend below is positive
    bin_of = f"CAST((ts_ns - {start - m * bin_ns} - 1) // {bin_ns} AS BIGINT) - {m}"
    points = binned_points(table, "increase", lower, end, bin_of, ids)
    concept = "true" if every_concept else f"concept {IN_TEXTS}"
    cols = described.split(", ")
    out = ", ".join([cols[0], "bin", *cols[1:]])
    # exact integer sums (analyzer.point_bins.exact_sum): the same in any order DuckDB adds them
    total = exact_sum(
        "CASE WHEN f.series_id IS NULL THEN p.inc ELSE coalesce(p.inc, 0) - coalesce(f.inc0, 0) END"
    )
    return f"""
        WITH ser AS (
            SELECT series_id, {described} FROM {table}_series WHERE {concept}{where}
        ), p AS MATERIALIZED (
            SELECT series_id, bin, {exact_sum("increase")} AS inc FROM {points} GROUP BY series_id, bin
        ), fresh AS (
            SELECT series_id FROM ser
            ANTI JOIN (SELECT series_id FROM p GROUP BY series_id HAVING min(bin) < 0) USING (series_id)
        ), f AS (
            SELECT series_id, CAST((min(ts_ns) - {start} - 1) // {bin_ns} AS BIGINT) AS bin,
                   arg_min_null(increase, ts_ns) AS inc0
            FROM {table}_points
            WHERE series_id IN (SELECT series_id FROM fresh) AND ts_ns > {start} AND ts_ns <= {end}
            GROUP BY series_id
        )
        SELECT {out}, {total} AS {name}
        FROM p LEFT JOIN f USING (series_id, bin) JOIN ser USING (series_id) WHERE p.bin >= 0
        GROUP BY ALL ORDER BY {out}"""


def _series_range(
    con: duckdb.DuckDBPyConnection, table: str, where: str, filters: list[Any], every_concept: bool
) -> tuple[int, int, int]:
    """The lowest and highest ``series_id`` of rule 9's selection and its number of series
    (-1, -1, 0 when it is empty), asked once per report (rule 8)."""
    concept = "true" if every_concept else f"concept {IN_TEXTS}"
    sql = f"SELECT min(series_id), max(series_id), count(*) FROM {table}_series WHERE {concept}{where}"
    row = _shared((id(con), sql, *filters), lambda: con.execute(sql, filters).fetchone())
    return (-1, -1, 0) if not row or row[0] is None else (int(row[0]), int(row[1]), int(row[2]))


def _rollup_sums(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    """Rule 11: whether the rollup of ``table`` keeps each minute's increase here (asked once per
    report: rule 8)."""
    return "increase" in _catalog(con).get(f"{table}_1m", ())


def _summed_minutes(
    table: str,
    described: str,
    where: str,
    name: str,
    window: tuple[int, int, int, int],
    every_concept: bool = False,
) -> str:
    """Rule 11's statement: ``[described..., bin, name]`` summed from the rollup's minute increases
    over ``window`` (start, end, bin width, look-back lower bound, in ns: as rule 9's).

    ``r``: the rollup rows of the read range, each stamped at its minute's end. ``b``: the
    window's sums per ``described`` and bin, one hash aggregate. ``f``: each series' first row
    in the read range (series: the rollup's key, NULLs matching NULLs as in ``GROUP BY``); those
    inside the window (the series had no minute in the look-back) are taken back out of their
    bin (``g``), ``coalesce(sum, 0) - coalesce(first, 0)``, what counting 0 for them gave. Rows
    come unordered (:func:`_ordered` sorts them). The window's numbers are SQL literals: a bound
    integer parameter costs DuckDB's Python client ~1.5 ms (it looks for pandas), 12 ms a
    statement here.

    Parameters in order: the ``where`` filter's (concepts unless ``every_concept``, keys)."""
    start, end, bin_ns, lower = (int(x) for x in window)
    concept = "true" if every_concept else f"concept {IN_TEXTS}"
    key = f"{_WIDE_KEY}, model, le" if table == "histogram_buckets" else f"{_WIDE_KEY}, model"
    cols = described.split(", ")
    out = ", ".join([cols[0], "bin", *cols[1:]])
    minute = 60 * NS
    total = "CASE WHEN g.bin IS NULL THEN b.inc ELSE coalesce(b.inc, 0) - coalesce(g.inc0, 0) END"
    return f"""
        WITH r AS (
            SELECT minute_ns + {minute} AS ts_ns, {key}, increase FROM {table}_1m
            WHERE {concept}{where} AND minute_ns > {lower - minute} AND minute_ns <= {end - minute}
        ), b AS (
            SELECT {described}, CAST((ts_ns - {start} - 1) // {bin_ns} AS BIGINT) AS bin,
                   {exact_sum("increase")} AS inc
            FROM r WHERE ts_ns > {start} GROUP BY ALL
        ), f AS (
            SELECT {key}, min(ts_ns) AS t0, arg_min_null(increase, ts_ns) AS inc0 FROM r GROUP BY ALL
        ), g AS (
            SELECT {described}, CAST((t0 - {start} - 1) // {bin_ns} AS BIGINT) AS bin,
                   {exact_sum("inc0")} AS inc0
            FROM f WHERE t0 > {start} GROUP BY ALL
        )
        SELECT {out}, {total} AS {name}
        FROM b LEFT JOIN g USING ({described}, bin)"""


def _ordered(rows: pl.DataFrame) -> pl.DataFrame:
    """Rule 11's rows in the order of the ``lag`` statement's ``ORDER BY`` (sorted here: DuckDB's
    sort of a day's 60 s bins cost more than the aggregate)."""
    return rows.sort(rows.columns[:-1])


def _series_increases(table: str, value: str, described: str, where: str) -> str:
    """Rule 7's statement: increases per point of the selected series, with ``described`` columns.

    Parameters in order: the ``where`` filter's (concepts, keys), lower ts, upper ts."""
    return f"""
        WITH ser AS (
            SELECT series_id, {described} FROM {table}_series
            WHERE concept {IN_TEXTS}{where}
        ), p AS (
            SELECT series_id, ts_ns, {value} AS c,
                   lag({value}) OVER (PARTITION BY series_id ORDER BY ts_ns) AS prev
            FROM {table}_points
            WHERE ts_ns > ? AND ts_ns <= ? AND series_id IN (SELECT series_id FROM ser)
        )
        SELECT ser.*, p.ts_ns, p.c, p.prev FROM p JOIN ser USING (series_id)"""


_WIDE_KEY = "source, engine, dp_rank, tp_rank, pp_rank, ep_rank, labels, concept"


def _wide_increases(table: str, value: str, described: str, key: str, where: str) -> str:
    """Rule 1 on a wide relation (a DuckLake store, an old file read-only, or the rollups): the
    same rows as :func:`_series_increases`, with each distinct ``key`` (a series: NULLs match
    NULLs, as ``PARTITION BY`` groups them) numbered once and one ``lag`` partition per number.
    Partitioning 124 k rollup rows by the number instead of by the nine text columns took 196 ms
    instead of 699 ms (24 h of two engines' histograms).

    Parameters in order: the ``where`` filter's (concepts, keys), lower ts, upper ts."""
    match = " AND ".join(f"r.{c} IS NOT DISTINCT FROM k.{c}" for c in key.split(", "))
    return f"""
        WITH r AS (
            SELECT ts_ns, {key}, {value} AS c FROM {table}
            WHERE concept {IN_TEXTS}{where} AND ts_ns > ? AND ts_ns <= ?
        ), k AS (
            SELECT *, row_number() OVER () AS sid FROM (SELECT DISTINCT {key} FROM r)
        )
        SELECT {", ".join(f"r.{c}" for c in described.split(", "))}, r.ts_ns, r.c,
               lag(r.c) OVER (PARTITION BY k.sid ORDER BY r.ts_ns) AS prev
        FROM r JOIN k ON {match}"""


def _summed_points(
    con: duckdb.DuckDBPyConnection,
    table: str,
    described: str,
    column: str,
    concepts: Sequence[str],
    where: str,
    params: list[Any],
    window: tuple[int, int, int, int],
    shared: bool = True,
) -> pl.DataFrame:
    """Rule 9 on ``table``: the stored increases of ``window`` (start, end, bin, look-back
    start) summed per ``described`` and bin into ``column``. Inside :func:`shared_reads` (rule
    10) every concept is summed once per window and each caller keeps its own concepts, unless
    not ``shared``."""
    start_ns, end_ns, bin_ns, lower = window
    every = shared and in_shared_reads()
    args = [*([] if every else [texts(concepts)]), *params]
    ids = _series_range(con, table, where, args, every)
    stored = (table, described, where, column)
    if not every:
        return _run_summed(con, stored, window, ids, every, args)
    series = (id(con), table, *params, start_ns, lower)
    run = lambda: _run_summed(con, stored, window, ids, every, args)  # noqa: E731
    got = _binned(series, start_ns, end_ns, bin_ns, run)
    return got.filter(pl.col("concept").is_in(list(concepts)))


def _run_summed(
    con: duckdb.DuckDBPyConnection,
    stored: tuple[str, str, str, str],
    window: tuple[int, int, int, int],
    ids: tuple[int, int, int],
    every: bool,
    args: list[Any],
) -> pl.DataFrame:
    """Rule 9's sums of ``stored`` = (table, described, where, name) over ``window``, with the
    window's final minutes read from the rollups where it has some and the selection is large
    enough to gain (rule 12, :data:`ROLLED_MIN_SERIES`); the points alone where the rollups
    cannot be trusted for it (no point before the window). ``ids``: the selection's lowest and
    highest ``series_id`` and its number of series (:func:`_series_range`)."""
    table, described, where, name = stored
    lo, hi, n = ids
    used = _used_minutes(con, table, window[0], window[1], window[2]) if n >= ROLLED_MIN_SERIES else None
    if used is not None:
        concept = "true" if every else f"concept {IN_TEXTS}"
        sql = summed_with_minutes(table, described, concept, where, name, window, (lo, hi), used)
        got = con.execute(sql, args + args).pl()
        if got.height and got["looked_back"][0]:  # else read again from the points (rule 4 there)
            return got.drop("looked_back")
    return con.execute(_summed_increases(table, described, where, name, window, (lo, hi), every), args).pl()


# rule 12 on selections of at least this many series: the statement's fixed cost (the look-back
# and the edges read apart, the rollup rows matched to the selection) is more than the points it
# saves below (both reads of a 15-minute window in 60 s bins: 8 GPUs' 86 bucket and 24 engine
# series 0.059-0.069 s against 0.047-0.052 s from the points; 64 GPUs' 688 and 192 series 0.077
# against 0.081 s; 512 GPUs' 5,504 and 1,536 series 2-3x faster)
ROLLED_MIN_SERIES = 1_000


def rollup_columns(con: duckdb.DuckDBPyConnection, table: str) -> frozenset[str]:
    """The columns of the rollup of ``table`` here (empty where none; asked once per report: rule 8)."""
    return _catalog(con).get(f"{table}_1m", frozenset())


def rollup_watermark(con: duckdb.DuckDBPyConnection) -> int:
    """The store's rollup watermark (analyzer.rolled_minutes rule 1), read once per report (rule 8)."""
    return _shared((id(con), "rollup_watermark"), lambda: watermark(con))


def _used_minutes(
    con: duckdb.DuckDBPyConnection, table: str, start_ns: int, end_ns: int, bin_ns: int
) -> tuple[int, int] | None:
    """Rule 12: the final minutes of ``(start, end]`` read from the rollup of ``table``, if any
    (the watermark and whether the rollup keeps increases asked once per report: rule 8)."""
    if not _rollup_sums(con, table):
        return None
    return used_minutes(rollup_watermark(con), start_ns, end_ns, bin_ns)


def bucket_increases(
    con: duckdb.DuckDBPyConnection,
    start_ns: int,
    end_ns: int,
    *,
    keys: Sequence[str] | None = None,
    concepts: Sequence[str] = HISTOGRAMS,
    bin_s: float | None = None,
    lookback_s: float = 120.0,
    rollup: bool | None = None,
) -> pl.DataFrame:
    """Rules 1-2: ``[concept, bin, le, count]`` increases in (start, end], merged over series.

    ``bin`` is 0 for the whole window, else ``(ts − start − 1) // bin`` (bin k spans
    ``(start + k·bin, start + (k+1)·bin]``). ``rollup=None``: rule 6's choice. Inside
    :func:`shared_reads`, stored increases are summed for every concept at once (rule 10).
    """
    rollup = rollup_for(con, start_ns, end_ns, bin_s) if rollup is None else rollup
    where, params = _key_filter(keys)
    bin_ns = int(bin_s * NS) if bin_s else max(end_ns - start_ns, 1)
    lower = start_ns - int(lookback_s * NS)
    if _points_of(con, "histogram_buckets", rollup) and _stored_increases(con, "histogram_buckets"):  # rule 9
        window = (start_ns, end_ns, bin_ns, lower)
        described = "concept, le"
        return _summed_points(con, "histogram_buckets", described, "count", concepts, where, params, window)
    if rollup and _rollup_sums(con, "histogram_buckets"):  # rule 11
        window = (start_ns, end_ns, bin_ns, lower)
        sql = _summed_minutes("histogram_buckets", "concept, le", where, "count", window)
        args = [texts(concepts), *params]
        series = (id(con), "histogram_buckets_1m", texts(concepts), *params, start_ns, lower)
        return _binned(series, start_ns, end_ns, bin_ns, lambda: _ordered(con.execute(sql, args).pl()))
    if _points_of(con, "histogram_buckets", rollup):  # rule 7
        inner = _series_increases("histogram_buckets", "cumulative_count", "concept, le", where)
    else:
        table = table_sql("histogram_buckets", rollup)
        inner = _wide_increases(table, "cumulative_count", "concept, le", f"{_WIDE_KEY}, le", where)
    sql = f"""
        SELECT concept, CAST((ts_ns - ? - 1) // ? AS BIGINT) AS bin, le,
               {_INCREASE} AS count
        FROM ({inner}) WHERE ts_ns > ? GROUP BY ALL ORDER BY concept, bin, le"""
    args = [start_ns, bin_ns, texts(concepts), *params, lower, end_ns, start_ns]
    return _shared((id(con), sql, *args), lambda: con.execute(sql, args).pl())


# rule 1's increase of each point summed exactly (analyzer.point_bins.exact_sum): the same in any order
_INCREASE = exact_sum("CASE WHEN prev IS NULL THEN 0 WHEN c >= prev THEN c - prev ELSE c END")


def quantiles_from_increases(inc: pl.DataFrame, qs: Sequence[float]) -> dict[tuple[str, int], list[Quantile]]:
    """Rule 3 on every ``(concept, bin)`` group of :func:`bucket_increases` output."""
    return {
        (c, b): [Quantile(c, q, *f) for q, f in zip(qs, fields, strict=True)]
        for c, b, fields in _groups(inc, qs)
    }


def _groups(inc: pl.DataFrame, qs: Sequence[float]) -> list[tuple[str, int, list[tuple[Any, ...]]]]:
    """Rule 3 on every ``(concept, bin)`` group of :func:`bucket_increases` output: ``(concept,
    bin, [the fields of its Quantile after metric and q, for each q])``, in concept and bin order.

    Every group at once with numpy (:func:`_grouped_quantiles`: a day of 60 s bins is ~3,000
    groups, 0.7 s one at a time); a group holding a NULL or NaN count is taken one at a time by
    :func:`quantile_of`, which says what each field means."""
    if inc.is_empty():
        return []
    inc = inc.sort(["concept", "bin", "le"])
    new = (pl.col("bin") != pl.col("bin").shift(1)) | (pl.col("concept") != pl.col("concept").shift(1))
    new_group = inc.select(new.fill_null(True)).to_series().to_numpy()
    edges = [0, *np.flatnonzero(new_group[1:]).__add__(1).tolist()]
    ends = [*edges[1:], inc.height]
    grid = _grouped_quantiles(inc["le"].to_numpy(), inc["count"].to_numpy(), edges, ends, qs)
    first = inc.select(pl.col("concept", "bin").gather(edges))
    concepts, bins = first["concept"].to_list(), first["bin"].to_list()
    out: list[tuple[str, int, list[tuple[Any, ...]]]] = []
    for g, (a, b) in enumerate(zip(edges, ends, strict=True)):
        c, fields = str(concepts[g]), grid[g]
        if fields is None:  # list slices: no per-group frames
            les, counts = inc["le"][a:b].to_list(), inc["count"][a:b].to_list()
            fields = [_fields(quantile_of(c, les, counts, q)) for q in qs]
        out.append((c, int(bins[g]), fields))
    return out


def _fields(x: Quantile) -> tuple[Any, ...]:
    return (x.value_s, x.observations, x.first_bucket_s, x.at_floor, x.capped)


def _grouped_quantiles(
    les: np.ndarray, counts: np.ndarray, edges: list[int], ends: list[int], qs: Sequence[float]
) -> list[list[tuple[Any, ...]] | None]:
    """:func:`quantile_of`'s fields after ``metric, q`` for every group ``[edges[g], ends[g])`` of
    ``les`` (ascending in each group) and ``counts``, and each ``q``; None for a group with a
    NaN count (NULL: the caller takes it one at a time). The groups are laid out as rows of a
    grid padded at the end, so each rule is one array operation."""
    n_groups, width = len(edges), max(b - a for a, b in zip(edges, ends, strict=True))
    start = np.asarray(edges)
    size = np.asarray(ends) - start
    col = np.arange(width)
    valid = col[None, :] < size[:, None]
    idx = np.where(valid, start[:, None] + col[None, :], 0)
    le = np.where(valid, les.astype(float)[idx], np.inf)
    raw = np.where(valid, counts.astype(float)[idx], -np.inf)
    cum = np.maximum.accumulate(raw, axis=1)
    last = size - 1
    rows = np.arange(n_groups)
    total = cum[rows, last]
    observations = raw.max(axis=1)
    finite = np.isfinite(le) & valid
    has_finite = finite.any(axis=1)
    first = np.where(has_finite, le[rows, np.argmax(finite, axis=1)], np.nan)
    top = np.where(has_finite, le[rows, width - 1 - np.argmax(finite[:, ::-1], axis=1)], np.nan)
    finite_total = np.where(has_finite, np.where(finite, raw, -np.inf).max(axis=1), 0.0)
    searched = np.where(valid, cum, np.inf)
    columns: list[list[Any]] = []
    for q in qs:
        rank = q * total
        b = np.minimum((searched < rank[:, None]).sum(axis=1), last)
        le_b, cum_b = le[rows, b], cum[rows, b]
        prev = np.maximum(b - 1, 0)
        lower = np.where(b == 0, 0.0, le[rows, prev])
        below = np.where(b == 0, 0.0, cum[rows, prev])
        in_bucket = cum_b - below
        with np.errstate(divide="ignore", invalid="ignore"):
            inside = lower + (le_b - lower) * (rank - below) / in_bucket
        value = np.where(in_bucket <= 0, le_b, inside)
        value = np.where(np.isinf(le_b), np.where(b > 0, lower, np.nan), value)
        none = (total <= 0) | (np.isinf(le_b) & (b == 0)) | (not 0.0 <= q <= 1.0)
        floor = ~none & has_finite & (value <= first)
        capped = ~none & has_finite & (value >= top) & (q > 0) & (q * observations > finite_total)
        values = [None if n else v for v, n in zip(value.tolist(), none.tolist(), strict=True)]
        columns.append(list(zip(values, floor.tolist(), capped.tolist(), strict=True)))
    seen = observations.tolist()
    firsts = [f if h else None for f, h in zip(first.tolist(), has_finite.tolist(), strict=True)]
    bad = np.asarray(np.isnan(raw).any(axis=1), dtype=bool).tolist()
    return [
        None if bad[g] else [(v, seen[g], firsts[g], fl, cp) for v, fl, cp in (col[g] for col in columns)]
        for g in range(n_groups)
    ]


def window_quantiles(
    con: duckdb.DuckDBPyConnection,
    start_ns: int,
    end_ns: int,
    *,
    keys: Sequence[str] | None = None,
    concepts: Sequence[str] = HISTOGRAMS,
    qs: Sequence[float] = (0.5, 0.9, 0.99),
    lookback_s: float = 120.0,
    rollup: bool | None = None,
) -> dict[str, dict[float, Quantile]]:
    """``{concept: {q: Quantile}}`` over the whole window (only concepts with data; rule 6 for
    ``rollup=None``)."""
    inc = bucket_increases(
        con, start_ns, end_ns, keys=keys, concepts=concepts, lookback_s=lookback_s, rollup=rollup
    )
    got = quantiles_from_increases(inc, qs)
    return {c: {x.q: x for x in qlist} for (c, _), qlist in got.items()}


def binned_quantiles(
    con: duckdb.DuckDBPyConnection,
    start_ns: int,
    end_ns: int,
    bin_s: float,
    *,
    keys: Sequence[str] | None = None,
    concepts: Sequence[str] = HISTOGRAMS,
    qs: Sequence[float] = (0.5, 0.99),
    lookback_s: float = 120.0,
    rollup: bool | None = None,
) -> pl.DataFrame:
    """``[concept, bin, bin_start_ns, q, value_s, observations]``: one row per bin and quantile.
    Inside :func:`shared_reads` (rule 8) asked again with the same arguments, the first answer
    (a 24 h window's 60 s ITL bins are the envelope's and Cp's history's)."""
    selection = (None if keys is None else tuple(keys), tuple(concepts), tuple(qs))
    return _shared(
        (id(con), "binned_quantiles", start_ns, end_ns, bin_s, *selection, lookback_s, rollup),
        lambda: _binned_quantiles(con, start_ns, end_ns, bin_s, keys, concepts, qs, lookback_s, rollup),
    )


def _binned_quantiles(
    con: duckdb.DuckDBPyConnection,
    start_ns: int,
    end_ns: int,
    bin_s: float,
    keys: Sequence[str] | None,
    concepts: Sequence[str],
    qs: Sequence[float],
    lookback_s: float,
    rollup: bool | None,
) -> pl.DataFrame:
    inc = bucket_increases(
        con, start_ns, end_ns, keys=keys, concepts=concepts, bin_s=bin_s, lookback_s=lookback_s, rollup=rollup
    )
    got = _groups(inc, qs)  # the columns built at once: ~3,000 Quantile objects a day of bins cost 45 ms
    rows = {
        "concept": [c for c, _, _ in got for _ in qs],
        "bin": [b for _, b, _ in got for _ in qs],
        "bin_start_ns": [start_ns + int(b * bin_s * NS) for _, b, _ in got for _ in qs],
        "q": [q for _ in got for q in qs],
        "value_s": [f[0] for _, _, fields in got for f in fields],
        "observations": [f[1] for _, _, fields in got for f in fields],
    }
    schema = {
        "concept": pl.Utf8,
        "bin": pl.Int64,
        "bin_start_ns": pl.Int64,
        "q": pl.Float64,
        "value_s": pl.Float64,
        "observations": pl.Float64,
    }
    return pl.DataFrame(rows, schema=schema)


def counter_increases(
    con: duckdb.DuckDBPyConnection,
    start_ns: int,
    end_ns: int,
    concepts: Sequence[str],
    *,
    keys: Sequence[str] | None = None,
    bin_s: float | None = None,
    lookback_s: float = 120.0,
    rollup: bool | None = None,
    shared: bool = True,
) -> pl.DataFrame:
    """Rule 1 on ``engine_samples`` counters: ``[concept, bin, increase]`` summed over series
    (rule 6 for ``rollup=None``). Inside :func:`shared_reads` (rule 8), stored increases (rule 9)
    are summed for every concept of the window at once and each call takes its concepts from
    that: a report asks for a window's counters five times, a few concepts each time. With
    ``shared=False`` only ``concepts`` are summed: a read no other call of the report shares (Cp's
    history under a shorter window: a day of one counter's minutes 20 ms, of all twelve 45 ms)."""
    every = shared and in_shared_reads()
    rollup = rollup_for(con, start_ns, end_ns, bin_s) if rollup is None else rollup
    where, params = _key_filter(keys)
    bin_ns = int(bin_s * NS) if bin_s else max(end_ns - start_ns, 1)
    lower = start_ns - int(lookback_s * NS)
    if _points_of(con, "engine_samples", rollup) and _stored_increases(con, "engine_samples"):  # rule 9
        window = (start_ns, end_ns, bin_ns, lower)
        return _summed_points(
            con, "engine_samples", "concept", "increase", concepts, where, params, window, every
        )
    if rollup and _rollup_sums(con, "engine_samples"):  # rule 11, every concept at once as rule 9
        window = (start_ns, end_ns, bin_ns, lower)
        sql = _summed_minutes("engine_samples", "concept", where, "increase", window, every_concept=every)
        args = [*([] if every else [texts(concepts)]), *params]
        if not every:
            return _ordered(con.execute(sql, args).pl())
        series = (id(con), "engine_samples_1m", *params, start_ns, lower)
        got = _binned(series, start_ns, end_ns, bin_ns, lambda: _ordered(con.execute(sql, args).pl()))
        return got.filter(pl.col("concept").is_in(list(concepts)))
    if _points_of(con, "engine_samples", rollup):  # rule 7
        inner = _series_increases("engine_samples", "value", "concept", where)
    else:
        inner = _wide_increases(table_sql("engine_samples", rollup), "value", "concept", _WIDE_KEY, where)
    sql = f"""
        SELECT concept, CAST((ts_ns - ? - 1) // ? AS BIGINT) AS bin,
               {_INCREASE} AS increase
        FROM ({inner}) WHERE ts_ns > ? GROUP BY ALL ORDER BY concept, bin"""
    args = [start_ns, bin_ns, texts(concepts), *params, lower, end_ns, start_ns]
    return _shared((id(con), sql, *args), lambda: con.execute(sql, args).pl())


def window_means(
    con: duckdb.DuckDBPyConnection,
    start_ns: int,
    end_ns: int,
    *,
    keys: Sequence[str] | None = None,
    concepts: Sequence[str] = HISTOGRAMS,
    lookback_s: float = 120.0,
    rollup: bool | None = None,
) -> dict[str, float]:
    """Rule 5: ``{concept: mean seconds}`` from ``_sum``/``_count`` increases (exact means; rule 6
    for ``rollup=None``)."""
    names = [f"{c}_{part}" for c in concepts for part in ("sum", "count")]
    inc = counter_increases(con, start_ns, end_ns, names, keys=keys, lookback_s=lookback_s, rollup=rollup)
    got = dict(zip(inc["concept"].to_list(), inc["increase"].to_list(), strict=True))
    out: dict[str, float] = {}
    for c in concepts:
        s, n = got.get(f"{c}_sum"), got.get(f"{c}_count")
        if s is not None and n:
            out[c] = float(s) / float(n)
    return out
