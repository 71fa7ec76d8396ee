"""The reset-aware increase of every counter point, stored beside its value.

A window's counter increase (tokens generated, requests, a histogram bucket's observations) is
the sum of the steps between consecutive points of each series, a drop counting as a reset.
Taken at read time that needs every series' points in time order — a sort of the window
(DuckDB's ``lag()``), 20-30× a scan of the same rows (``bench/results/envelope_scale.md``). So
the store writes each point's step as it writes the point: the points of a raw table with a
``Table.counter`` (``engine_samples``: ``value``; ``histogram_buckets``: ``cumulative_count``)
carry an ``increase`` column, and a window's increase is a plain ``SUM``.

Rules:

1. A point's ``increase`` is its step from the previous point of its series in time order
   (:func:`step`): ``c − prev`` when ``c ≥ prev``, else ``c`` (a reset: the counter restarted
   from 0); 0 when the previous point's value is NULL; NULL when its own value is NULL and the
   previous one is not. These are exactly the cases of the read-time statement it replaces
   (``CASE WHEN prev IS NULL THEN 0 WHEN c >= prev THEN c - prev ELSE c END``), NaN included
   (DuckDB orders NaN above every number; either way the step is NaN or ``c``).
2. The first point of a series has no previous point: its ``increase`` is NULL ("unknown"),
   never read (rule 5).
3. The store's writer keeps the newest point (``ts_ns``, value) of each series in memory
   (:class:`LastPoints`, loaded from the file for series it has not seen since it opened), so a
   batch newer than every stored point of its series — a sidecar's scrapes, an ingest or
   backfill written forward in time — gets its increases in one pass over the batch.
4. A batch with a point older than the newest stored point of its series (a late sample, a
   backfill written backwards) changes the previous point of stored points: the batch is
   inserted, then the increases of its late series from their first batch point to the first
   stored point after their last batch point are computed again from the stored points and
   updated where they differ (recent and packed), in the same transaction
   (:func:`repair_statements`). This costs a scan of the late series' points; a writer that
   writes each series forward in time never pays it.
5. Readers (``analyzer.latency``) read the window ``(start, end]`` and its look-back
   ``(lower, start]``: a point in ``(start, end]`` counts its stored increase unless it is the
   first point of its series in ``(lower, end]`` (its previous point, if any, is at or before
   ``lower``), which counts 0. That is exactly what ``lag()`` over ``(lower, end]`` gave: a
   point whose previous point is inside the read range has the same step either way; the first
   one read had no ``prev``. Retention deletes whole old points only, so a stored step is never
   read with its previous point missing from inside the range.
6. A file without the column (schema 4 and older) gets it on open for writing, every stored
   point's step computed at once (:func:`fill_statements`); opened read-only it is read with
   ``lag()`` as before.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from collector.records import INCREASE, Table, points_name
from collector.series import SLICE_NS, packed_name, recent_name, times_name

if TYPE_CHECKING:
    import duckdb

# What :meth:`LastPoints.increases` hands to :meth:`LastPoints.commit`: ``(series_id, (ts_ns,
# value))`` pairs, each newer than its series' last stored point.
Newest = Iterable[tuple[int, tuple[int, Any]]]

SCRAPES = 256  # scrapes in one batch up to which LastPoints._in_scrapes takes it
MANY = 2000  # rows from which a batch's increases are computed with numpy (LastPoints._many)
# Rule 1 in SQL over ``c`` (the value), ``prev`` and ``prev_ts`` (the previous point's value and
# time, NULL for a series' first point: rule 2).
STEP_SQL = (
    "CASE WHEN prev_ts IS NULL THEN NULL WHEN prev IS NULL THEN 0 WHEN c >= prev THEN c - prev ELSE c END"
)


def steps_sql(relation: str, columns: str, value: str, time: str, key: str, where: str = "") -> str:
    """``SELECT columns, c, prev, prev_ts, inc`` over ``relation`` (filtered by ``where``): each
    row's value ``c`` = ``value``, the previous row of its series (``PARTITION BY key ORDER BY
    time``) and ``inc``, its step by rule 1 (:data:`STEP_SQL`, NULL for a series' first row)."""
    return (
        f"SELECT *, {STEP_SQL} AS inc FROM (SELECT {columns}, {value} AS c, lag({value}) OVER w AS prev, "
        f"lag({time}) OVER w AS prev_ts FROM {relation}{f' WHERE {where}' if where else ''} "
        f"WINDOW w AS (PARTITION BY {key} ORDER BY {time}))"
    )


def step(c: Any, prev: Any) -> Any:
    """Rule 1 for a point of value ``c`` whose previous point holds ``prev``."""
    if prev is None:
        return 0.0
    if c is None:
        return None
    return c - prev if c >= prev else c


class LastPoints:
    """Rule 3: the newest stored point ``(ts_ns, value)`` of each series of one counter table.

    Only the store's writer uses it, under the store's lock. ``None`` for a series with no
    stored point. Entries change only through :meth:`commit`, after the write that stored them."""

    def __init__(self, spec: Table):
        self.spec = spec
        self._last: dict[int, tuple[int, Any] | None] = {}

    def forget(self) -> None:
        """Drop what is known (series were pruned: their ids may be given again)."""
        self._last.clear()

    def increases(
        self,
        cur: duckdb.DuckDBPyConnection,
        ids: Sequence[int],
        ts: Sequence[int],
        values: Sequence[Any],
        first_new: int,
    ) -> tuple[list[Any], dict[int, tuple[int, int]], Newest]:
        """Rules 1-4 for one batch: the increase of each row, the late series (``{series_id:
        (first, last ts_ns of its batch rows)}``, rule 4) and the newest points to
        :meth:`commit` once the batch is stored. ``first_new``: series ids from it on were
        created for this batch (no stored point)."""
        fast = self._in_scrapes(ids, ts, values, first_new)
        if fast is not None:
            return fast
        unknown = {s for s in set(ids) if s < first_new and s not in self._last}
        if unknown:
            self._load(cur, unknown)
            fast = self._in_scrapes(ids, ts, values, first_new)
            if fast is not None:
                return fast
        if len(ts) >= MANY:
            return self._many(ids, ts, values, first_new)
        n = len(ts)
        ordered = all(ts[i] <= ts[i + 1] for i in range(n - 1))
        order = range(n) if ordered else sorted(range(n), key=ts.__getitem__)
        out: list[Any] = [None] * n
        newest: dict[int, tuple[int, Any]] = {}
        given: dict[int, Any] = {}  # the increase of the batch's newest row of each series
        late: dict[int, tuple[int, int]] = {}
        last = self._last
        for i in order:
            sid, t, v = ids[i], ts[i], values[i]
            got = newest.get(sid) if sid in newest else None if sid >= first_new else last.get(sid)
            if got is None:  # rule 2
                newest[sid], given[sid] = (t, v), None
                continue
            pt, pv = got
            if t > pt:
                out[i] = given[sid] = step(v, pv)
                newest[sid] = (t, v)
            elif t == pt:  # the same key again: a replay (not stored) or a duplicate in the batch
                out[i] = given.get(sid)
            else:  # rule 4
                lo, hi = late.get(sid, (t, t))
                late[sid] = (min(lo, t), max(hi, t))
        return out, late, newest.items()

    def _in_scrapes(
        self, ids: Sequence[int], ts: Sequence[int], values: Sequence[Any], first_new: int
    ) -> tuple[list[Any], dict[int, tuple[int, int]], Newest] | None:
        """The sidecar's batch: the scrapes of one flush one after the other, each one point per
        series, every point newer than its series' previous point (the stored one, or the one in
        an earlier scrape of the batch). List comprehensions per scrape, no per-row call and no
        numpy (an 11 MB import a collector never needs otherwise); None for any other batch.

        A scrape is the run of rows up to the next row of its first series; a run that holds a
        series twice is cut before the repeat. More than :data:`SCRAPES` runs (a batch of few
        series and many points: an ingest's, a backfill's) is left to the other paths."""
        n, last = len(ids), self._last
        runs = 0
        newest: dict[int, tuple[int, Any]] = {}
        out: list[Any] = []
        before: Sequence[int] = ()
        before_t: Sequence[int] = ()
        before_v: Sequence[Any] = ()
        a = 0
        while a < n:
            runs += 1
            if runs > SCRAPES:
                return None
            try:
                b = ids.index(ids[a], a + 1)
            except ValueError:
                b = n
            sids = ids[a:b]
            if len(set(sids)) != len(sids):
                b = a + _first_repeat(sids)
                sids = ids[a:b]
            t, v = ts[a:b], values[a:b]
            if sids == before:  # the same series as the scrape before (the common case): by position
                prev_t, prev_v = before_t, before_v
            else:
                # the run before is written to ``newest`` only now: runs of the same series in a
                # row would each overwrite the same keys
                newest.update(zip(before, zip(before_t, before_v, strict=True), strict=True))
                got: list[Any] = list(map(newest.get, sids)) if newest else list(map(last.get, sids))
                if None in got:
                    got = [_previous(s, newest, last, first_new) for s in sids]
                    if any(g is _UNLOADED for g in got):
                        return None
                prev_t, prev_v = [p[0] for p in got], [p[1] for p in got]
            if not all(map(operator.lt, prev_t, t)):
                return None
            steps = _steps(v, prev_v)
            out += steps if steps is not None else _by_rule(v, prev_v)
            before, before_t, before_v = sids, t, v
            a = b
        newest.update(zip(before, zip(before_t, before_v, strict=True), strict=True))
        return out, {}, newest.items()

    def _many(
        self, ids: Sequence[int], ts: Sequence[int], values: Sequence[Any], first_new: int
    ) -> tuple[list[Any], dict[int, tuple[int, int]], Newest]:
        """Rules 1-4 for a large batch (an ingest's or a backfill's), with numpy: the rows sorted
        by series and time, each row's previous point the row before it in its series, or for a
        series' first row its stored last point. A series whose first batch row is not newer
        than its stored last point is late (rule 4: its batch range is computed again after the
        insert, so its rows' increases here do not matter)."""
        import numpy as np

        sid, t = np.asarray(ids, dtype=np.int64), np.asarray(ts, dtype=np.int64)
        x = np.asarray(values, dtype=np.float64)  # None -> NaN; which were None is kept apart
        null = np.zeros(len(x), dtype=bool)
        nan = np.flatnonzero(np.isnan(x)).tolist()
        null[nan] = [values[i] is None for i in nan]
        order = np.lexsort((t, sid))
        s, t, x, null = sid[order], t[order], x[order], null[order]
        first = np.ones(len(s), dtype=bool)
        first[1:] = s[1:] != s[:-1]
        starts = np.flatnonzero(first)
        ends = np.r_[starts[1:], len(s)] - 1
        prev_x = np.r_[np.nan, x[:-1]]
        prev_null = np.r_[True, null[:-1]]
        none = np.zeros(len(s), dtype=bool)  # rows with no previous point (rule 2)
        late: dict[int, tuple[int, int]] = {}
        newest: dict[int, tuple[int, Any]] = {}
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):  # once per series
            series = int(s[a])
            got = None if series >= first_new else self._last.get(series)
            if got is None:
                none[a] = True
            elif t[a] <= got[0]:
                late[series] = (int(t[a]), int(t[b]))
            else:
                prev_x[a], prev_null[a] = (np.nan, True) if got[1] is None else (got[1], False)
            if got is None or t[b] > got[0]:
                newest[series] = (int(t[b]), None if null[b] else float(x[b]))
        with np.errstate(invalid="ignore"):
            inc = np.where(prev_null, 0.0, np.where(x >= prev_x, x - prev_x, x))
        missing = none | (null & ~prev_null)  # NULL: no previous point, or a NULL value after a value
        got_back = np.empty(len(s), dtype=np.float64)
        got_back[order] = inc
        gone = np.zeros(len(s), dtype=bool)
        gone[order] = missing
        out: list[Any] = got_back.tolist()
        for i in np.flatnonzero(gone).tolist():
            out[i] = None
        return out, late, newest.items()

    def commit(self, newest: Newest) -> None:
        """Rule 3: the batch was stored; ``newest`` (from :meth:`increases`: only points newer
        than their series' last one) is now the last point."""
        self._last.update(newest)

    def _load(self, cur: duckdb.DuckDBPyConnection, unknown: set[int]) -> None:
        """The newest stored point of each series of ``unknown``: looked for in the newest two
        slices first (a writer reopened on its own file finds every live series there), then
        everywhere for the rest."""
        if not unknown:
            return
        points, c = points_name(self.spec.name), self.spec.counter
        recent = f"(SELECT max(ts_ns) FROM {points}) - {2 * SLICE_NS}"
        for bound in (f" AND ts_ns >= {recent}", ""):
            ids = ", ".join(str(int(s)) for s in sorted(unknown))
            rows = cur.execute(
                f"SELECT series_id, max(ts_ns), arg_max_null({c}, ts_ns) FROM {points} "
                f"WHERE series_id IN ({ids}){bound} GROUP BY series_id"
            ).fetchall()
            for sid, t, v in rows:
                self._last[int(sid)] = (int(t), v)
                unknown.discard(int(sid))
            if not unknown:
                return
        for sid in unknown:  # no stored point (retention deleted them all)
            self._last[sid] = None


# what :func:`_previous` gives for a series with no previous point (rule 2), and for one whose
# stored last point is not loaded yet
_FIRST: Any = object()
_NO_POINT = (-(1 << 63), _FIRST)
_UNLOADED = (-(1 << 63), None)


def _previous(
    sid: int, newest: dict[int, tuple[int, Any]], last: dict[int, tuple[int, Any] | None], first_new: int
) -> tuple[int, Any]:
    """The previous point of series ``sid``: its newest point earlier in the batch, else its stored
    last point; :data:`_NO_POINT` when it has none, :data:`_UNLOADED` when that is not known yet."""
    got = newest.get(sid)
    if got is not None:
        return got
    if sid >= first_new:
        return _NO_POINT
    if sid not in last:
        return _UNLOADED
    return last[sid] or _NO_POINT


def _by_rule(values: Sequence[Any], previous: Sequence[Any]) -> list[Any]:
    """Rules 1-2 row by row: no increase for a series' first point (``_FIRST``), 0 after a NULL
    value, none for a NULL value, else the step, or the new value after a reset."""
    return [
        None if p is _FIRST else 0.0 if p is None else None if c is None else c - p if c >= p else c
        for c, p in zip(values, previous, strict=True)
    ]


def _steps(values: Sequence[Any], previous: Sequence[Any]) -> list[Any] | None:
    """Rule 1's increase of each numeric row, ``values - previous`` where that is not negative
    (one subtraction per row in C) and :func:`step` only on the rows where it is (a reset,
    a gauge that fell, a NaN): the same numbers as :func:`_by_rule`, about half its CPU on a flush
    of the bench's node. None where a row holds a NULL or the first-point marker (:func:`_by_rule`
    then)."""
    try:
        steps = list(map(operator.sub, values, previous))
    except TypeError:
        return None
    if all(map(_NOT_NEGATIVE, steps)):
        return steps
    return [d if d >= 0 else step(c, p) for d, c, p in zip(steps, values, previous, strict=True)]


_NOT_NEGATIVE = (0.0).__le__  # 0.0 <= step: not negative, not NaN


def _first_repeat(ids: Sequence[int]) -> int:
    """The position of the first id that occurs earlier in ``ids`` (``len(ids)`` when none)."""
    seen: set[int] = set()
    for i, s in enumerate(ids):
        if s in seen:
            return i
        seen.add(s)
    return len(ids)


def _apply_statements(spec: Table) -> list[str]:
    """Write the steps of ``_fix (series_id, ts_ns, inc)`` into both point forms where they differ."""
    t = spec.name
    return [
        f"UPDATE {recent_name(t)} AS r SET {INCREASE} = f.inc FROM _fix AS f "
        f"WHERE r.series_id = f.series_id AND r.ts_ns = f.ts_ns AND r.{INCREASE} IS DISTINCT FROM f.inc",
        f"UPDATE {packed_name(t)} AS p SET {INCREASE} = f.inc "
        f"FROM _fix AS f JOIN {times_name(t)} AS x ON x.ts_ns = f.ts_ns "
        f"WHERE p.series_id = f.series_id AND p.tix = x.tix AND p.{INCREASE} IS DISTINCT FROM f.inc",
        "DROP TABLE _fix",
    ]


def fill_statements(spec: Table) -> list[str]:
    """Rule 6: the step of every stored point (run in the transaction that added the column)."""
    c = spec.counter
    steps = steps_sql(points_name(spec.name), "series_id, ts_ns", c, "ts_ns", "series_id")
    return [
        f"CREATE OR REPLACE TEMP TABLE _fix AS SELECT series_id, ts_ns, inc FROM ({steps})",
        *_apply_statements(spec),
    ]


def repair_statements(spec: Table, late: dict[int, tuple[int, int]]) -> list[str]:
    """Rule 4: the steps of the late series' points from each one's first batch point ``lo`` to
    the first point after its last batch point ``hi``, computed again (run in the transaction
    that inserted the batch, after the insert)."""
    c, points = spec.counter, points_name(spec.name)
    spans = ", ".join(f"({int(s)}, {int(lo)}, {int(hi)})" for s, (lo, hi) in sorted(late.items()))
    return [
        f"CREATE OR REPLACE TEMP TABLE _late AS SELECT * FROM (VALUES {spans}) AS v(series_id, lo, hi)",
        f"""CREATE OR REPLACE TEMP TABLE _fix AS
            WITH b AS (
                SELECT l.series_id, l.lo, l.hi,
                       max(p.ts_ns) FILTER (WHERE p.ts_ns < l.lo) AS a,
                       min(p.ts_ns) FILTER (WHERE p.ts_ns > l.hi) AS z
                FROM {points} AS p JOIN _late AS l USING (series_id) GROUP BY ALL
            ), s AS (
                SELECT p.series_id, p.ts_ns, b.lo, p.{c} AS c,
                       lag(p.{c}) OVER w AS prev, lag(p.ts_ns) OVER w AS prev_ts
                FROM {points} AS p JOIN b USING (series_id)
                WHERE p.ts_ns >= coalesce(b.a, b.lo) AND p.ts_ns <= coalesce(b.z, b.hi)
                WINDOW w AS (PARTITION BY p.series_id ORDER BY p.ts_ns)
            )
            SELECT series_id, ts_ns, {STEP_SQL} AS inc FROM s WHERE ts_ns >= lo""",
        *_apply_statements(spec),
        "DROP TABLE _late",
    ]
