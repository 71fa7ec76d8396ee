"""The series layout of the raw sample tables in a DuckDB store file.

A raw sample row is a timestamp, a few numbers, and a long description that repeats every
second: a GPU sample names its host, UUID, metric, pod and model in nine text columns; a
histogram bucket its engine, model, ranks, concept and labels. DuckDB pays for every one of
those strings on every insert and again at every checkpoint (the 14-column ``gpu_samples`` row
cost ~4 µs to append and ~5 µs to checkpoint; storing one node's 1 Hz scrapes cost 4.55 ms of CPU
a cycle, 1.46 ms in this layout: ``bench/results/sidecar.md`` round 5). So a raw table ``T`` of a
store file is kept as:

- ``T_series``: one row per series — ``series_id`` and every column of ``T`` except ``ts_ns``
  and the value columns (:attr:`collector.records.Table.values`);
- the points, kept in two forms and read as one through the view ``T_points``
  (``ts_ns, series_id, values...``):

  - ``T_recent``: ``(ts_ns, series_id, values...)`` in the order written (time order), where
    every write appends;
  - ``T_packed`` and ``T_times``: the points of closed time slices (:data:`SLICE_NS`), packed
    by the store's maintenance (:func:`pack_statements`), or written packed by a backfill
    (:func:`packed_insert_statements`). ``T_times`` numbers each distinct
    timestamp of a slice (``tix``, dense, in time order within the slice); ``T_packed`` holds
    ``(series_id, tix, values...)`` sorted by time chunk (:data:`CHUNKS_NS`), then series (in
    their places, rule 5), then time. A series' values then sit side by side (DuckDB's ALP and
    RLE compress them), and its times are small consecutive numbers (bit-packed in a bit or
    two) rather than nanosecond timestamps whose scrape jitter costs ~21 bits a point in series
    order; each timestamp is stored once per slice, not once per point;
- the view ``T``: ``T_points`` joined to ``T_series`` back into exactly the columns of
  :data:`collector.records.TABLES`, so every reader (analyzer, API, ``ioe query``) sees the
  table it always saw.

Rules:

1. A series is every descriptive column of a row: the same GPU under another pod is another
   series. The natural key of a point is ``(ts_ns, series_id)``; a replayed scrape repeats both
   and stores nothing new (the store's de-duplication runs on the points).
2. ``series_id`` is assigned by the store (the only writer), densely from 0, the first time a
   series is written; it never changes and is never reused while the series has a row.
   Key columns of a series are NOT NULL, as they were on the wide table: a NULL is refused by
   DuckDB before any point of the batch is written.
3. A series whose points have all been deleted by retention is pruned at most hourly
   (:meth:`SeriesIndex.prune`).
4. A file made with wide raw tables (before this layout) is converted when it is opened for
   writing, in one transaction (:func:`convert_statements`); opened read-only it is read as it is.
   A file whose ``T_points`` is a table (schema 3) has it renamed ``T_recent`` and gets the
   packed tables and the view, in one transaction (:func:`recent_statements`).
5. Packing a slice moves every point of it (recent and already packed: late samples) into the
   packed form, a time chunk a transaction (:func:`slice_statements` once, then
   :func:`chunk_statements` per chunk; :func:`pack_statements` is all of it in one): the rows
   read through ``T_points`` after each commit are the same as before it. A slice's rows are
   sorted by time chunk, then by series: each series' points of a chunk are one run, the runs
   in the series' places. A series' place in a slice comes from its values there (the table's
   first value column): constant series first, then by the decimals
   the values need (most first: 6-decimal ratios, then 3-decimal energies, ..., whole numbers),
   then by magnitude (smallest first), then by id. DuckDB compresses a value column with ALP
   1,024 values at a time, choosing each vector's decimal scale among the few its row group's
   samples (nine vectors of 122,880 rows) voted for, so runs of one scale side by side share a
   row group's choices and a vector that spans two runs mixes fewer scales. On an hour of one
   node's 25 dcgm fields (bench.bench_density) the values took 925,324 bytes in id order (the
   order fields were first seen) and 836,108 in places: the packed table 4 blocks of 256 KiB
   instead of 5. A slice's chunk is the shortest of :data:`CHUNKS_NS` (divisors of
   :data:`SLICE_NS`) that gives each chunk at least :data:`CHUNK_ROWS` points of the slice on
   average, or the whole slice where none does (a slice's chunk is chosen from all its points
   each time it is packed, late ones included). Packed runs
   alternate direction (even series by rising ``tix``, odd by falling), so the step between one
   series' run and the next is ~0 and a bit-packing group that spans both stays a few bits wide.
6. Time windows still prune: ``T_recent`` by its ``ts_ns`` zone maps; the packed rows through
   the join, whose ``tix`` range DuckDB pushes into the ``T_packed`` scan (zone maps on ``tix``:
   each chunk's rows hold only its own ``tix`` range, as ``tix`` rises with time in a slice), so
   a window reads the chunks it overlaps, not whole slices: a 15-minute window (and its look-back)
   of a packed hour in 5-minute chunks reads about a third of it.
7. A file whose slices were packed in series order over the whole slice (schema 6 and before)
   has each of its packed slices packed again when opened for writing (:meth:`collector.store.
   Store._chunk_slices`, a slice a transaction: rule 5's statements), so its windows prune as
   rule 6 says; read-only it is read as it is (the same rows, each window reading whole slices).

The DuckLake store (``collector.lake``) keeps the wide tables: Parquet's dictionary encoding
already stores a repeated description once per file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import accumulate, chain, repeat
from typing import TYPE_CHECKING, Any

from collector.batch import Batch, run_on_stream
from collector.records import (
    INCREASE,
    Table,
    point_values,
    points_name,
    points_table,
    series_name,
    series_table,
)

if TYPE_CHECKING:
    import duckdb


SLICE_NS = 3600 * 1_000_000_000  # the time slice packed at once (rule 5)
# The time chunks a packed slice's rows may be sorted by first (rule 5), shortest first, so that a
# window's tix range skips the row groups of the chunks it does not overlap (rule 6). A slice takes
# the shortest whose chunks hold at least CHUNK_ROWS points each, else it is one chunk. Chunks cost
# density: DuckDB's ALP compresses a value column 1,024 values at a time, and a vector that holds
# two series' runs encodes both at the wider one's bit width; a run of a 1 Hz series over 5 (15)
# minutes is 300 (900) values, so nearly every vector holds two. On an hour of one 8-GPU node's
# dcgm fields (bench.bench_density, 720,000 points) 5-minute chunks took 5.10 bytes a sample and
# 15-minute ones 4.37, against 3.64 in whole-hour runs; the bench fleet's synthetic values took
# 2.9 % more blocks at 512 GPUs (5-minute chunks) and 1.4 % at 64 (15-minute chunks for the GPU
# and bucket tables; bench/results/envelope_scale.md).
CHUNKS_NS = (300 * 1_000_000_000, 900 * 1_000_000_000)
# Two row groups (DuckDB's 122,880 rows each): a smaller chunk shares its row groups with its
# neighbours, so a window skips little of the slice for the density it costs. One node's hour of
# dcgm fields stays one chunk; 512 GPUs' hour of histogram buckets (19.8 M points) is cut in 5 minutes.
CHUNK_ROWS = 2 * 122_880


def chunked_points() -> int:
    """The fewest points of a slice that rule 5 sorts by a chunk shorter than the slice."""
    return CHUNK_ROWS * (SLICE_NS // max(CHUNKS_NS))


def recent_name(table: str) -> str:
    return f"{table}_recent"


def packed_name(table: str) -> str:
    return f"{table}_packed"


def times_name(table: str) -> str:
    return f"{table}_times"


def _values(spec: Table, alias: str = "") -> str:
    return ", ".join(f"{alias}{c}" for c, _ in point_values(spec))


def _typed(spec: Table) -> str:
    return ", ".join(f"{c} {t}" for c, t in point_values(spec))


def points_view_ddl(spec: Table, replace: bool = False) -> str:
    """The view ``T_points``: recent and packed points, ``(ts_ns, series_id, values...)`` (with
    ``increase`` for a counter table: collector.increases)."""
    t = spec.name
    create = "CREATE OR REPLACE VIEW" if replace else "CREATE VIEW IF NOT EXISTS"
    return (
        f"{create} {points_name(t)} AS "
        f"SELECT ts_ns, series_id, {_values(spec)} FROM {recent_name(t)} UNION ALL "
        f"SELECT t.ts_ns, p.series_id, {_values(spec, 'p.')} "
        f"FROM {packed_name(t)} AS p JOIN {times_name(t)} AS t USING (tix)"
    )


def points_statements(spec: Table) -> list[str]:
    """``T_recent`` (the table writes append to), ``T_packed``, ``T_times`` and the view."""
    t = spec.name
    return [
        f"CREATE TABLE IF NOT EXISTS {recent_name(t)} "
        f"(ts_ns BIGINT NOT NULL, series_id BIGINT NOT NULL, {_typed(spec)})",
        f"CREATE TABLE IF NOT EXISTS {packed_name(t)} "
        f"(series_id BIGINT NOT NULL, tix BIGINT NOT NULL, {_typed(spec)})",
        f"CREATE TABLE IF NOT EXISTS {times_name(t)} (tix BIGINT NOT NULL, ts_ns BIGINT NOT NULL)",
        points_view_ddl(spec),
    ]


def recent_statements(spec: Table) -> list[str]:
    """Rule 4: a schema-3 file's points table becomes ``T_recent`` (run in a transaction; a
    counter table's increases are filled after, :func:`collector.increases.fill_statements`)."""
    rename = f"ALTER TABLE {points_name(spec.name)} RENAME TO {recent_name(spec.name)}"
    add = [f"ALTER TABLE {recent_name(spec.name)} ADD COLUMN {INCREASE} DOUBLE"] if spec.counter else []
    return [rename, *add, *points_statements(spec), view_ddl(spec)]


def increase_column_statements(spec: Table) -> list[str]:
    """Rule 4: a schema-4 file's counter table gets the ``increase`` column on both point forms
    and its ``T_points`` view again (run in a transaction, with the fill after)."""
    t = spec.name
    return [
        f"ALTER TABLE {recent_name(t)} ADD COLUMN {INCREASE} DOUBLE",
        f"ALTER TABLE {packed_name(t)} ADD COLUMN {INCREASE} DOUBLE",
        points_view_ddl(spec, replace=True),
    ]


def pack_statements(spec: Table, lo_ns: int, hi_ns: int) -> list[str]:
    """Rule 5: every point of the slice ``[lo_ns, hi_ns)`` into the packed form in one
    transaction: :func:`slice_statements`, :func:`chunk_statements` over the whole slice, and
    :data:`DROP_SLICE`. The store packs a slice a chunk a transaction instead (its ``pack`` rule
    2), which writes the same rows in the same order."""
    return [*slice_statements(spec, lo_ns, hi_ns), *chunk_statements(spec, lo_ns, hi_ns), *DROP_SLICE]


def slice_statements(spec: Table, lo_ns: int, hi_ns: int) -> list[str]:
    """Rule 5's temp tables of the slice ``[lo_ns, hi_ns)``: ``_tix`` (the slice's timestamps
    numbered above every stored ``tix``, dense in time order, with their rank and time chunk) and
    ``_places`` (its series' places). :data:`SLICE_CHUNKS` then lists its chunks."""
    t = spec.name
    window = f"ts_ns >= {int(lo_ns)} AND ts_ns < {int(hi_ns)}"
    return [
        _tix_statement(t, f"{points_name(t)} WHERE {window}"),
        _places_statement(spec, points_name(t), f"WHERE p.{window}"),
    ]


def chunk_statements(spec: Table, lo_ns: int, hi_ns: int) -> list[str]:
    """Rule 5 for the points of ``[lo_ns, hi_ns)``, one or more whole chunks of a slice whose
    :func:`slice_statements` ran (one transaction): written packed under their new ``tix``, then
    their old forms deleted (packed rows by their old ``tix``, which the new ones are not among
    until ``T_times`` gets them last; recent rows by time). No copy of the points is held aside:
    the sort spills to disk under a small memory limit."""
    t, window = spec.name, f"ts_ns >= {int(lo_ns)} AND ts_ns < {int(hi_ns)}"
    return [
        _packed_insert(spec, points_name(t), f"WHERE p.{window}"),
        f"DELETE FROM {packed_name(t)} WHERE tix IN (SELECT tix FROM {times_name(t)} WHERE {window})",
        f"DELETE FROM {times_name(t)} WHERE {window}",
        f"DELETE FROM {recent_name(t)} WHERE {window}",
        f"INSERT INTO {times_name(t)} SELECT tix, ts_ns FROM _tix WHERE {window} ORDER BY tix",
    ]


SLICE_CHUNKS = "SELECT DISTINCT chunk FROM _tix ORDER BY chunk"  # the starts of a slice's chunks
DROP_SLICE = ["DROP TABLE IF EXISTS _tix", "DROP TABLE IF EXISTS _places"]


def packed_insert_statements(spec: Table, source: str) -> list[str]:
    """Rule 5 without the detour through ``T_recent``: the points of the table ``source``
    (``ts_ns, series_id, values...``, no two sharing a key), all of time slices that hold no
    stored point yet, written straight into the packed form (run in a transaction). Each slice's
    rows are sorted as :func:`pack_statements` sorts them, chunk after chunk, so every chunk's
    rows hold only its own ``tix`` range (rule 6). The third statement (the ``INSERT`` into
    ``T_packed``) counts the points written."""
    t = spec.name
    return [
        _tix_statement(t, source),
        _places_statement(spec, source),
        _packed_insert(spec, source),
        f"INSERT INTO {times_name(t)} SELECT tix, ts_ns FROM _tix ORDER BY tix",
        "DROP TABLE _tix",
        "DROP TABLE _places",
    ]


# Rule 5's places of a slice's series: constant series first, then by the decimals their values
# need (most first), then by magnitude (smallest first), then by id. A value's decimals: the
# fewest (0-6, else 7) that make it whole to 1e-9 of itself (0.07 * 100 is 7.000000000000001).
# The decimals are judged on the points of every 16th second (seconds since the epoch), which
# took the place of an hour of 512 GPUs' 12.9 M points from 2.6-3.3 s to 1.4-1.8 s; a series with
# no point in them has no decimals (NULL, placed after those that have).
_WHOLE = "abs(v * 1e{k} - round(v * 1e{k})) <= 1e-9 * greatest(abs(v * 1e{k}), 1)"
_DECIMALS = (
    "max(CASE WHEN ts_ns // 1000000000 % 16 <> 0 THEN NULL "
    + " ".join(f"WHEN {_WHOLE.format(k=k)} THEN {k}" for k in range(7))
    + " ELSE 7 END)"
)
_CLASS = (
    "min(v) IS NOT DISTINCT FROM max(v) AS constant, "
    f"{_DECIMALS} AS decimals, "
    "CASE WHEN max(abs(v)) > 0 THEN floor(log10(max(abs(v)))) ELSE -400 END AS magnitude"
)


def _places_statement(spec: Table, source: str, where: str = "") -> str:
    """The temp table ``_places``: each series' place in the points of ``source`` (with ``where``
    on its alias ``p``; rule 5), from its values in the table's first value column."""
    first = point_values(spec)[0][0]
    return (
        "CREATE OR REPLACE TEMP TABLE _places AS SELECT series_id, row_number() OVER "
        "(ORDER BY constant DESC, decimals DESC, magnitude, series_id) - 1 AS place "
        f"FROM (SELECT p.series_id, {_CLASS} FROM (SELECT ts_ns, series_id, {first} AS v FROM {source}) AS p "
        f"{where} GROUP BY p.series_id)"
    )


def _packed_insert(spec: Table, source: str, where: str = "") -> str:
    """Rule 5's ``INSERT`` into ``T_packed`` of the points of ``source`` (with ``where`` on its
    alias ``p``) numbered by ``_tix``: chunk after chunk, each series' run of a chunk at its place
    in ``_places``, runs at even places by rising ``tix``, at odd ones by falling. The place and
    the time are one sort key (``pos``: a timestamp's rank in ``_tix``, under 2^32): with the two
    as keys an hour of 200 bucket series (720,000 points) needed 28MB to pack, with one 21MB
    (sorted by series id, before places: 19MB)."""
    return (
        f"INSERT INTO {packed_name(spec.name)} SELECT p.series_id, x.tix, {_values(spec, 'p.')} "
        f"FROM {source} AS p JOIN _tix AS x USING (ts_ns) JOIN _places AS c USING (series_id) {where} "
        "ORDER BY x.chunk, "
        "c.place * 4294967296 + CASE WHEN c.place % 2 = 0 THEN x.pos ELSE 4294967295 - x.pos END"
    )


def _tix_statement(table: str, source: str) -> str:
    """The temp table ``_tix``: each distinct ``ts_ns`` of ``source`` (a table, optionally with
    its ``WHERE``) numbered above every stored ``tix``, densely in time order, with its rank
    (``pos``, from 0) and the start of its time chunk (``chunk``, rule 5: chosen per slice from
    the slice's count of points ``n``)."""
    whens = " ".join(
        f"WHEN n >= {CHUNK_ROWS * (SLICE_NS // c)} THEN ts_ns // {c} * {c}" for c in sorted(CHUNKS_NS)
    )
    return (
        f"CREATE OR REPLACE TEMP TABLE _tix AS SELECT ts_ns, (SELECT coalesce(max(tix), -1) "
        f"FROM {times_name(table)}) + row_number() OVER (ORDER BY ts_ns) AS tix, "
        "row_number() OVER (ORDER BY ts_ns) - 1 AS pos, "
        f"CASE {whens} ELSE ts_ns // {SLICE_NS} * {SLICE_NS} END AS chunk "
        f"FROM (SELECT ts_ns, sum(k) OVER (PARTITION BY ts_ns // {SLICE_NS}) AS n "
        f"FROM (SELECT ts_ns, count(*) AS k FROM {source} GROUP BY ts_ns))"
    )


def delete_before_statements(spec: Table, before_ns: int) -> list[str]:
    """Retention: the points older than ``before_ns`` from both forms."""
    t, before = spec.name, int(before_ns)
    return [
        f"DELETE FROM {recent_name(t)} WHERE ts_ns < {before}",
        f"DELETE FROM {packed_name(t)} WHERE tix IN (SELECT tix FROM {times_name(t)} WHERE ts_ns < {before})",
        f"DELETE FROM {times_name(t)} WHERE ts_ns < {before}",
    ]


def view_ddl(spec: Table) -> str:
    """The view ``spec.name`` with exactly the wide table's columns, in its order."""
    cols = ", ".join(f"p.{c}" if c == "ts_ns" or c in spec.values else f"s.{c}" for c in spec.column_names)
    return (
        f"CREATE VIEW IF NOT EXISTS {spec.name} AS SELECT {cols} "
        f"FROM {points_name(spec.name)} AS p JOIN {series_name(spec.name)} AS s USING (series_id)"
    )


def create_statements(spec: Table) -> list[str]:
    """``T_series`` (the raw table's key columns NOT NULL, rule 2), the points and the views."""
    return [series_table(spec).ddl(), *points_statements(spec), view_ddl(spec)]


def convert_statements(spec: Table) -> list[str]:
    """Rule 4: a wide base table ``spec.name`` becomes the series layout (run in a transaction).

    Series are numbered in the order of their first row; ``IS NOT DISTINCT FROM`` matches the
    descriptive columns that may be NULL."""
    ids = ", ".join(spec.series_columns)
    match = " AND ".join(f"w.{c} IS NOT DISTINCT FROM s.{c}" for c in spec.series_columns)
    values = ", ".join(f"w.{c}" for c in spec.values)
    old = f"{spec.name}_wide"
    return [
        f"ALTER TABLE {spec.name} RENAME TO {old}",
        *create_statements(spec)[:-1],
        f"INSERT INTO {series_name(spec.name)} SELECT row_number() OVER (ORDER BY first_ts, {ids}) - 1, "
        f"{ids} FROM (SELECT {ids}, min(ts_ns) AS first_ts FROM {old} GROUP BY ALL)",
        f"INSERT INTO {recent_name(spec.name)} (ts_ns, series_id, {', '.join(spec.values)}) "
        f"SELECT w.ts_ns, s.series_id, {values} "
        f"FROM {old} AS w JOIN {series_name(spec.name)} AS s ON {match} ORDER BY w.ts_ns",
        f"DROP TABLE {old}",
        view_ddl(spec),
    ]


class SeriesIndex:
    """The ``series_id`` of every series of one raw table, kept in memory by the store.

    Loaded from ``T_series`` the first time it is needed; only the store's writer uses it, under
    the store's lock, so the dict and the file never disagree."""

    def __init__(self, spec: Table):
        self.spec = spec
        self.series = series_table(spec)
        self.points = points_table(spec)
        self._ids: dict[tuple[Any, ...], int] | None = None
        self._next = 0
        self.first_new = 0  # the first id :meth:`ids` gave in its last call (ids from it on are new)

    def ids(
        self,
        cur: duckdb.DuckDBPyConnection,
        cols: Mapping[str, Sequence[Any]],
        runs: Sequence[int] | None = None,
        parts: Sequence[int] | None = None,
        same: Sequence[int] | None = None,
    ) -> list[int]:
        """The ``series_id`` of each row of ``cols`` (the wide table's columns); series seen for
        the first time are inserted into ``T_series`` first (a NULL key column raises there).
        ``runs``: the rows come in runs of one series each (Batch rule 5), looked up once a run.
        ``parts``: the heights of the scrapes joined in the batch (Batch rule 6); a part whose
        series columns equal an earlier part's (the same target scraped again) takes its ids
        without a lookup; ``same`` (Batch rule 6), where given, says which parts those are."""
        if runs is not None:
            starts = [0, *accumulate(runs)][:-1]
            firsts = {c: [cols[c][i] for i in starts] for c in self.spec.series_columns}
            return list(chain.from_iterable(map(repeat, self.ids(cur, firsts), runs)))
        if parts is not None and len(parts) > 1:
            return self._by_part(cur, cols, parts, same)
        known = self._load(cur)
        self.first_new = self._next
        names = self.spec.series_columns
        keys = list(zip(*(cols[c] for c in names), strict=True))
        got = list(map(known.get, keys))
        if None not in got:
            return got  # type: ignore[return-value]
        new: dict[tuple[Any, ...], int] = {}
        for key, sid in zip(keys, got, strict=True):
            if sid is None and key not in new:
                new[key] = self._next + len(new)
        data: dict[str, list[Any]] = {"series_id": list(new.values())}
        for i, name in enumerate(names):
            data[name] = [key[i] for key in new]
        rows = Batch(self.series.name, data, len(new))
        run_on_stream(cur, f"INSERT INTO {self.series.name} SELECT * FROM _stream", rows)
        known.update(new)
        self._next += len(new)
        return [known[key] for key in keys]

    def _by_part(
        self,
        cur: duckdb.DuckDBPyConnection,
        cols: Mapping[str, Sequence[Any]],
        parts: Sequence[int],
        same: Sequence[int] | None = None,
    ) -> list[int]:
        names = self.spec.series_columns
        out: list[int] = []
        seen: dict[int, int] = {}  # a part's height -> where the last part of that height starts
        starts = [0, *accumulate(parts)]
        first_new, a = None, 0
        for i, height in enumerate(parts):
            b, before = a + height, seen.get(height)
            if same is not None and same[i] != i:  # the very lists of an earlier part
                out += out[starts[same[i]] : starts[same[i]] + height]
            elif before is not None and all(
                cols[c][a:b] == cols[c][before : before + height] for c in names
            ):  # list equality: element by element, identical objects at once
                out += out[before : before + height]
            else:
                out += self.ids(cur, {c: cols[c][a:b] for c in names})
                first_new = self.first_new if first_new is None else first_new
            seen[height] = a
            a = b
        self.first_new = self._next if first_new is None else first_new
        return out

    def _load(self, cur: duckdb.DuckDBPyConnection) -> dict[tuple[Any, ...], int]:
        if self._ids is None:
            names = ", ".join(self.spec.series_columns)
            rows = cur.execute(f"SELECT series_id, {names} FROM {self.series.name}").fetchall()
            self._ids = {tuple(r[1:]): int(r[0]) for r in rows}
            self._next = 1 + max(self._ids.values(), default=-1)
        return self._ids

    def prune(self, cur: duckdb.DuckDBPyConnection) -> int:
        """Rule 3: delete the series that have no point left; returns how many."""
        got = cur.execute(
            f"DELETE FROM {self.series.name} WHERE series_id NOT IN "
            f"(SELECT DISTINCT series_id FROM {self.points.name})"
        ).fetchone()
        self._ids = None  # reloaded on the next write; ids of kept series do not change
        return int(got[0]) if got else 0
