"""The store: the only writer of IOE's tables.

An embedded DuckDB file by default (``":memory:"`` for tests). Writes are column-wise (one
``INSERT … SELECT`` per batch from a Batch, polars frame or Arrow table, never row at a time) and
idempotent on each table's natural key: a replayed scrape, a re-sent span or a re-read log line
inserts nothing new. ``targets`` and ``deployments`` keep their latest state instead.

The small tables enforce their key with a PRIMARY KEY. The four raw sample tables do not
(``Table.indexed``): there the index was ~77 % of the file and half the insert CPU (2 days of
one node's samples: ~12 GB with it, ~3 GB without; ``bench/results/sidecar.md``), so
:meth:`Store._insert_unindexed` keeps the key unique instead. In a store file they are views
over a series table and the points (:mod:`collector.series`): each description is stored
once, and a write appends ``(ts_ns, series_id, values)`` to ``T_recent``. Maintenance (and the
close of a writable file) packs each closed hour of points by series (:meth:`Store.pack`); a
backfill of the past writes whole hours packed at once (:meth:`Store.write_closed`).

The schema is versioned in ``ioe_schema``: a new file is created at the current version, an
older file is brought forward by the steps in :data:`MIGRATIONS`.

Retention: raw rows older than ``raw_retention_s`` are deleted once they have been rolled up
into the per-minute ``*_1m`` tables, which are kept for ``rollup_retention_s``; ``ingest_errors``
rows are kept as long as raw rows.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from collector import compaction, increases, series, state
from collector.batch import Batch, as_polars, run_on_stream
from collector.engine import duckdb
from collector.errors import first_line
from collector.records import INCREASE, REPLACE_TABLES, TABLES, Table, points_name, series_name

if TYPE_CHECKING:
    import polars as pl
    import pyarrow as pa

log = logging.getLogger(__name__)
_T = TypeVar("_T")

SCHEMA_VERSION = 7
NS_PER_MIN = 60_000_000_000
# Block size of a new store file: DuckDB's default, 256 KiB. DuckDB compresses doubles with ALP
# only in blocks this large: with 64 or 128 KiB blocks every value column stayed RLE or
# uncompressed (an hour of 8 GPUs' packed values: 4.4 bytes a point at 64 KiB, 1.5 at 256 KiB;
# bench/results/density.md). 64 KiB had been chosen when the raw tables were 37 wide columns,
# each pinning a block of rows appended since the last checkpoint (~18 MB of a collector's RSS);
# the points tables now have 14 columns in all. An existing file keeps the block size it was
# created with.
BLOCK_SIZE = 256 * 1024
# Storage format of a new store file (an ATTACH option, like BLOCK_SIZE). DuckDB 1.5.5 still
# writes its v1.0.0 format unless told otherwise, whose table metadata costs ~3 KiB a column, empty
# or not: the store's ~290 columns took 177 metadata pages of 4 KiB, three 256 KiB blocks, in an
# empty file (0.98 bytes a sample of an hour of 8 GPUs). From v1.2.0 on, the same catalog takes
# 15 pages, one block, and the data compresses the same (bench/results/density.md). A v1.2.0 file
# opens in DuckDB 1.2 and later; a file made before keeps its format until it is rewritten
# (collector.compaction).
STORAGE_VERSION = "v1.2.0"
# When a closed file is rewritten without its free blocks (Store._worth_rewriting): at least this
# share of its blocks free, and the file at most this large (the measured cost is there).
COMPACT_FREE_SHARE = 0.25
COMPACT_MAX_BYTES = 32 << 20
# How long after a time slice ends its points are packed (collector.series rule 5): samples of
# a slice that arrive later are packed again with it, at the next pass.
PACK_GRACE_NS = 2 * NS_PER_MIN
# WAL size that triggers a checkpoint (DuckDB's default: 16 MiB). Until a checkpoint the appended
# rows and their key index stay in memory; a collector writing ~900 rows/s reached 16 MiB after
# ~2 min and +45 MB resident. At 4 MiB its DuckDB memory stays at 15-24 MB (1 MiB checkpoints so
# often that inserts cost ~50 % more CPU). Measured in bench/results/sidecar.md.
WAL_AUTOCHECKPOINT = "4MB"
# Row groups keep DuckDB's default size (122,880 rows). Round 4 tried 16,384 to make a collector's
# checkpoints cheaper (each rewrites the last, partly filled group), but DuckDB keeps buffers of
# every small group pinned: a 16MB-capped store ran out of memory within 600 cycles of one node's
# replayed 1 Hz samples, and a checkpoint did not rescue the write (bench/results/sidecar.md,
# round 5). A writable file is attached (BLOCK_SIZE is an ATTACH option) and made the
# connection's default catalog.
ATTACHED = "store"  # the catalog name of an attached store file
# How often series without a point left are deleted (collector.series rule 3): the check scans
# every point, so it runs hourly, not at every maintenance pass.
SERIES_PRUNE_NS = 3600 * 1_000_000_000


def _increase_column(rollup: str) -> list[str]:
    """Schema 6 for the rollup ``rollup``: its ``increase`` column, added and filled from the
    step between each minute's last value and the previous minute's of its series (collector.
    increases rule 1; NULL for a series' first minute), logical statements for either backend."""
    spec = TABLES[rollup]
    value = "cumulative_count" if rollup.startswith("histogram") else "last"
    key = [c for c in spec.key if c != "minute_ns"]
    match = " AND ".join(f"t.{c} IS NOT DISTINCT FROM s.{c}" for c in key)
    cols = ", ".join(key)
    steps = increases.steps_sql(rollup, f"minute_ns, {cols}", value, "minute_ns", cols)
    return [
        f"ALTER TABLE {rollup} ADD COLUMN IF NOT EXISTS {INCREASE} DOUBLE",
        f"""UPDATE {rollup} AS t SET {INCREASE} = s.inc FROM ({steps}) AS s
            WHERE t.minute_ns = s.minute_ns AND {match}""",
    ]


# (from_version, statements bringing a store from from_version to from_version + 1). Shared with
# the DuckLake store, so they change logical tables only.
# 1 -> 2: the raw sample tables of a store file moved to the series layout. That is physical (a
#   DuckLake keeps wide tables), so it has no statement here: Store._layout converts a file.
# 2 -> 3: collective_records gains algo_proto and msg_bytes_max (the Inspector textfile's
#   algorithm/protocol label and the upper end of its bucketed message sizes).
# 3 -> 4: the points of a store file are kept recent and packed (collector.series rule 4):
#   physical again, converted by Store._layout.
# 4 -> 5: the points of counter tables keep each point's increase (collector.increases rule 6):
#   physical, added and filled by Store._layout.
# 5 -> 6: the counter rollups (engine_samples_1m, histogram_buckets_1m) keep each minute's
#   increase (collector.store rollup rule 2), filled here from the step between consecutive
#   minutes' last values (what the analyzer read with lag() before); a store file then computes
#   it again from the stored point increases for every minute that still has raw points
#   (Store._refill_rollups).
# 6 -> 7: a packed slice of a store file is sorted by time chunk, then series (collector.series
#   rules 5-7): physical, each packed slice packed again by Store._chunk_slices.
MIGRATIONS: list[tuple[int, list[str]]] = [
    (1, []),
    (
        2,
        [
            "ALTER TABLE collective_records ADD COLUMN IF NOT EXISTS algo_proto VARCHAR",
            "ALTER TABLE collective_records ADD COLUMN IF NOT EXISTS msg_bytes_max BIGINT",
        ],
    ),
    (3, []),
    (4, []),
    (5, [sql for t in ("engine_samples_1m", "histogram_buckets_1m") for sql in _increase_column(t)]),
    (6, []),
]


def _cpus() -> int:
    """CPUs this process may run on: DuckDB otherwise starts a thread per machine core, which costs
    a pinned or CPU-limited sidecar ~60 % more CPU per insert (measured in ``bench/bench_otlp.py``)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else os.cpu_count() or 1


class StoreError(RuntimeError):
    """The store cannot be opened or written; the message says which file and why."""


@dataclass(frozen=True)
class Retention:
    raw_s: float = 2 * 86400
    rollup_s: float = 30 * 86400


class RowCounts:
    """``count``/``counts`` for any store whose ``cursor()`` reads its tables (DuckDB file or lake)."""

    def cursor(self) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        raise NotImplementedError

    def count(self, table: str) -> int:
        with self.cursor() as cur:
            row = cur.execute(f"SELECT count(*) FROM {TABLES[table].name}").fetchone()
        return int(row[0]) if row else 0

    def counts(self) -> dict[str, int]:
        return {name: self.count(name) for name in TABLES}


class Store(RowCounts):
    """DuckDB-backed store. Thread-safe: writes are serialized; reads use their own cursor."""

    def __init__(
        self,
        path: str | Path = ":memory:",
        *,
        read_only: bool = False,
        threads: int | None = None,
        memory_limit: str | None = None,
        wal_autocheckpoint: str = WAL_AUTOCHECKPOINT,
    ):
        """``threads``: DuckDB worker threads (default: the CPUs this process may use). A sidecar,
        which mostly inserts small batches, passes 1: extra threads only add scheduling cost.
        ``memory_limit``: DuckDB's buffer-pool cap (``"64MB"``; default DuckDB's, 80 % of RAM).
        ``wal_autocheckpoint``: the WAL size that triggers a checkpoint (:data:`WAL_AUTOCHECKPOINT`)."""
        self.path = str(path)
        self.read_only = read_only
        self._lock = threading.RLock()
        self._config: dict[str, Any] = {
            "threads": threads or _cpus(),
            "autoload_known_extensions": False,
            "autoinstall_known_extensions": False,
        }
        if memory_limit:
            self._config["memory_limit"] = memory_limit
        if not read_only:
            self._config["wal_autocheckpoint"] = wal_autocheckpoint
        attached = not read_only and self.path != ":memory:"
        self._use = f"USE {ATTACHED}" if attached else ""  # makes a new cursor see the store's tables
        self._open()

    def _open(self) -> None:
        """Connect (or reconnect: :meth:`reopen`), check, migrate and lock the database down."""
        try:
            if self._use:
                self.con = self._attach(self._config)
            else:
                self.con = duckdb.connect(self.path, read_only=self.read_only, config=self._config)
        except duckdb.Error as exc:
            raise StoreError(f"store {self.path}: cannot open ({first_line(exc)})") from exc
        try:
            self._check_size()
            if not self.read_only:
                self._migrate()
        except (duckdb.Error, StoreError) as exc:
            self.con.close()
            if isinstance(exc, StoreError):
                raise
            raise StoreError(f"store {self.path}: cannot open ({first_line(exc)})") from exc
        if self._use:
            compaction.remove_leftover(self.path)  # the write lock is ours: no rewrite is running
        self.lock_down()
        # what the writer keeps in memory is read again from the file (a reopen may follow a
        # commit that failed)
        self._series = {name: series.SeriesIndex(t) for name, t in TABLES.items() if t.values}
        self._last = {name: increases.LastPoints(t) for name, t in TABLES.items() if t.counter}
        self._newest: dict[str, int | None] = {}  # points table -> its largest ts_ns stored
        self._layouts: dict[str, tuple[str, ...]] = {}  # table -> its columns in order (rule 4 of
        # _insert_unindexed)
        self._writer = self._new_cursor()

    def _check_size(self) -> None:
        """A file shorter than the blocks its header lists was cut off (a copy that stopped, a full
        disk): DuckDB opens it and fails only when a query reaches a missing block, so it is
        refused here. The file is three 4 KiB headers followed by at least ``used_blocks`` blocks
        (``total_blocks`` counts free blocks too, and DuckDB cuts free blocks off the file's end)."""
        if self.path == ":memory:" or not Path(self.path).is_file():
            return
        got = self.con.execute(
            "SELECT block_size, used_blocks FROM pragma_database_size() "
            "WHERE database_name = current_database()"
        ).fetchone()
        if not got:
            return
        expected, size = 3 * 4096 + int(got[0]) * int(got[1]), Path(self.path).stat().st_size
        if size < expected:
            raise StoreError(
                f"store {self.path}: truncated ({size} bytes, its header lists {expected}); "
                "restore it from a copy or move it away"
            )

    def reopen(self) -> None:
        """Close and open the file again: DuckDB invalidates a database whose checkpoint failed (a
        full disk) until it is detached and attached again; what was committed is kept (the WAL
        is replayed). Raises :class:`StoreError` while the file still cannot be opened."""
        with self._lock:
            for handle in (self._writer, self.con):
                with contextlib.suppress(duckdb.Error):  # an invalidated database may refuse even this
                    handle.close()
            if self._use and not Path(self.path).is_file():  # never a new, empty store in its place
                raise StoreError(f"store {self.path}: no such file (it was moved or deleted)")
            self._open()

    def _attach(self, config: dict[str, Any]) -> duckdb.DuckDBPyConnection:
        """A writable file store, attached (with :data:`BLOCK_SIZE` and :data:`STORAGE_VERSION` when
        the file is new) and made the connection's default catalog."""
        config = {**config, "temp_directory": self.path + ".tmp"}  # DuckDB's own default for a file
        new = f" (BLOCK_SIZE {BLOCK_SIZE}, STORAGE_VERSION {_text(STORAGE_VERSION)})"
        options = "" if Path(self.path).exists() else new
        con = duckdb.connect(":memory:", config=config)
        try:
            con.execute(f"ATTACH {_text(self.path)} AS {ATTACHED}{options}")
            con.execute(self._use)
        except duckdb.Error:
            con.close()
            raise
        return con

    def lock_down(self) -> None:
        """Close the database to everything outside its own file, for good.

        Once the file is attached and migrated the store needs nothing outside it, and every
        reader (the API's SQL route included) shares this one database: DuckDB's settings are
        per database, not per cursor. So external access is switched off (no file, URL or glob
        reads, no ``COPY``, ``ATTACH``, ``INSTALL`` or ``LOAD``, no replacement scans of files or
        Python objects), extensions are neither installed nor loaded on demand, and the
        configuration is locked so no statement can turn either back on. DuckDB's own spill files
        under ``temp_directory`` keep working. Writes read their batches as registered relations
        (:func:`collector.batch.run_on_stream`)."""
        try:
            self.con.execute("SET enable_external_access = false")
            self.con.execute("SET lock_configuration = true")
        except duckdb.Error as exc:
            raise StoreError(f"store {self.path}: cannot lock the database down ({exc})") from exc

    def _new_cursor(self) -> duckdb.DuckDBPyConnection:
        cur = self.con.cursor()
        if self._use:
            cur.execute(self._use)
        return cur

    # -- schema ---------------------------------------------------------------------------
    def schema_version(self) -> int:
        row = self.con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'ioe_schema'"
        ).fetchone()
        if not row or not row[0]:
            return 0
        got = self.con.execute("SELECT max(version) FROM ioe_schema").fetchone()
        return int(got[0]) if got and got[0] is not None else 0

    def _migrate(self) -> None:
        with self._lock:
            current = self.schema_version()
            if current > SCHEMA_VERSION:
                raise StoreError(
                    f"store {self.path}: schema version {current} is newer than this IOE ({SCHEMA_VERSION})"
                )
            self.con.execute("CREATE TABLE IF NOT EXISTS ioe_schema (version INTEGER, applied_ns BIGINT)")
            state.ensure(self.con)  # one row: no data block (collector.state rule 1)
            if current == 0:
                self._layout()
                self._stamp(SCHEMA_VERSION)
                return
            # the layout first: a table an older file lacks is created at today's shape, so a
            # later step's ALTER finds it (its ADD COLUMN IF NOT EXISTS is then a no-op)
            self._layout()
            for from_version, statements in MIGRATIONS:
                if from_version >= current:
                    for sql in statements:
                        self.con.execute(sql)
                    if from_version == 5:
                        self._refill_rollups()
                    if from_version == 6:
                        self._chunk_slices()
                    self._stamp(from_version + 1)

    def _refill_rollups(self) -> None:
        """Schema 6 in a store file: the rolled-up minutes that still have raw points are rolled up
        again, their increase summed from the points' (rollup rule 2) instead of the step between
        minutes the migration filled in."""
        watermark = self._state("rollup_watermark_ns")
        if watermark:
            log.info("store %s: summing the increase of every rolled-up minute with raw points", self.path)
            self._roll_up(0, watermark)

    def _chunk_slices(self) -> None:
        """Schema 7 in a store file (collector.series rule 7): every packed slice packed again, a
        slice a transaction (Store.pack rule 2), so its rows are sorted by time chunk. A slice of
        fewer points than any chunk needs (:func:`collector.series.chunked_points`: one node's hour) is
        one chunk, stored in that order already, and is left as it is."""
        for name, spec in TABLES.items():
            if not spec.values:
                continue
            slices = self.con.execute(
                f"SELECT t.ts_ns // {series.SLICE_NS} AS k FROM {series.packed_name(name)} AS p "
                f"JOIN {series.times_name(name)} AS t USING (tix) WHERE t.ts_ns >= 0 "
                f"GROUP BY k HAVING count(*) >= {series.chunked_points()} ORDER BY k"
            ).fetchall()
            if slices:
                log.info("store %s: sorting %d packed slices of %s by chunk", self.path, len(slices), name)
            for (k,) in slices:
                self.pack_slice(spec, int(k) * series.SLICE_NS)

    def _layout(self) -> None:
        """Every table of :data:`TABLES`: created when missing; a raw table in the series layout,
        converted from a wide base table or a schema-3 points table in one transaction
        (collector.series rule 4)."""
        kinds = dict(
            self.con.execute(
                "SELECT table_name, table_type FROM information_schema.tables "
                "WHERE table_catalog = current_database() AND table_schema = current_schema()"
            ).fetchall()
        )
        for name, table in TABLES.items():
            fill = increases.fill_statements(table) if table.counter else []
            if not table.values:
                self.con.execute(table.ddl())
            elif kinds.get(name) == "BASE TABLE":
                log.info("store %s: converting %s to the series layout", self.path, name)
                self._transaction(series.convert_statements(table) + fill)
            elif kinds.get(points_name(name)) == "BASE TABLE":
                log.info("store %s: keeping the points of %s recent and packed", self.path, name)
                self._transaction(series.recent_statements(table) + fill)
            elif (
                fill and kinds.get(series.recent_name(name)) == "BASE TABLE" and not self._has_increase(name)
            ):
                log.info("store %s: storing the increase of every point of %s", self.path, name)
                self._transaction(series.increase_column_statements(table) + fill)
            else:
                for sql in series.create_statements(table):
                    self.con.execute(sql)

    def _has_increase(self, name: str) -> bool:
        """Whether ``T_recent`` of counter table ``name`` has the increase column (schema 5)."""
        got = self.con.execute(
            "SELECT count(*) FROM information_schema.columns WHERE table_catalog = current_database() "
            f"AND table_name = {_text(series.recent_name(name))} AND column_name = {_text(INCREASE)}"
        ).fetchone()
        return bool(got and got[0])

    def _transaction(self, statements: list[str], con: duckdb.DuckDBPyConnection | None = None) -> None:
        """``statements`` in one transaction: all of them or, on any error, none."""
        con = con or self.con
        con.execute("BEGIN TRANSACTION")
        try:
            for sql in statements:
                con.execute(sql)
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")

    def _stamp(self, version: int) -> None:
        self.con.execute(f"INSERT INTO ioe_schema VALUES ({int(version)}, {time.time_ns()})")

    # -- writes ---------------------------------------------------------------------------
    def write(self, table: str, batch: Batch | pl.DataFrame | pa.Table) -> int:
        """Insert ``batch`` into ``table``; returns the number of rows that were new."""
        return self._write(table, batch, closed=False)

    def write_closed(self, table: str, batch: Batch | pl.DataFrame | pa.Table) -> int:
        """:meth:`write` for rows of closed time slices (a backfill of the past, in time order).

        Rules:

        1. The points of a raw table go straight into the packed form (collector.series rule
           5) when every one of them is in a time slice newer than the slice of the newest
           point stored: no point of those slices is stored yet, so nothing is de-duplicated
           against stored rows, and nothing is written to ``T_recent`` to be moved out again.
           Written in one transaction: all of the batch or none of it.
        2. Otherwise (a batch reaching into a slice that has points), :meth:`write`'s way:
           appended to ``T_recent`` and packed at the next pass.
        3. A slice that gets more points later (a batch that did not hold all of it) has them
           in ``T_recent`` until the next pass packs them with it (:meth:`pack` rule 3).
        """
        return self._write(table, batch, closed=True)

    def _write(self, table: str, batch: Batch | pl.DataFrame | pa.Table, *, closed: bool) -> int:
        spec = TABLES.get(table)
        if spec is None:
            raise StoreError(f"store {self.path}: no table {table!r}")
        if self.read_only:
            raise StoreError(f"store {self.path}: opened read-only")
        if isinstance(batch, Batch) and batch.table != table:
            raise StoreError(f"store {self.path}: a batch of {batch.table!r} cannot go into {table!r}")
        names = batch.column_names if hasattr(batch, "column_names") else batch.columns
        if len(batch) == 0:
            return 0
        missing = [c for c in spec.column_names if c not in names]
        if missing:
            raise StoreError(f"{table}: batch lacks columns {missing}")
        with self._lock:
            return self._retrying(f"write to {table}", lambda: self._insert(spec, batch, closed))

    def _retrying(self, what: str, work: Callable[[], _T]) -> _T:
        """``work``, run once more after a checkpoint if DuckDB's buffer pool is full.

        Rows appended since the last checkpoint stay pinned in memory until it writes them out;
        under a small ``memory_limit`` a statement can find the pool full of them. The failed
        statement wrote nothing (autocommit) and every write and maintenance step is idempotent,
        so running it again after the checkpoint gives the same rows."""
        try:
            return work()
        except duckdb.OutOfMemoryException as exc:
            log.warning("store %s: %s found memory full (%s); checkpoint, retry", self.path, what, exc)
            self.con.execute("CHECKPOINT")
            return work()

    def _insert(self, spec: Table, batch: Any, closed: bool = False) -> int:
        cur = self._writer
        if spec.values:
            return self._insert_points(cur, spec, batch, closed)
        if spec.indexed or not spec.key:
            return _insert(cur, spec.name, ", ".join(spec.column_names), batch)
        return self._insert_unindexed(cur, spec, batch)

    def _insert_points(self, cur: duckdb.DuckDBPyConnection, spec: Table, batch: Any, closed: bool) -> int:
        """A raw table's rows as points of its series (collector.series rules 1-2), appended to
        ``T_recent``, or packed when ``closed`` allows (:meth:`write_closed`); the keys stored are
        those of every point (``T_points``). A counter table's points carry their increase
        (collector.increases rules 3-4: a batch with late points is inserted and its late series'
        increases repaired in one transaction; a batch of fresh slices has no late point)."""
        cols, height = _columns(batch, spec.column_names)
        index = self._series[spec.name]
        hints = (batch.runs, batch.parts, batch.same) if isinstance(batch, Batch) else ()
        ids = index.ids(cur, cols, *hints)
        target = index.points
        data = {"ts_ns": cols["ts_ns"], "series_id": ids, **{c: cols[c] for c in spec.values}}
        unique = isinstance(batch, Batch) and batch.unique
        into = series.recent_name(spec.name)
        last = self._last.get(spec.name)
        late: dict[int, tuple[int, int]] = {}
        if last is not None:
            data[INCREASE], late, newest = last.increases(
                cur, ids, cols["ts_ns"], cols[spec.counter], index.first_new
            )
        rows = Batch(target.name, data, height, unique=unique)
        if late:
            stored = self._insert_repairing(cur, spec, rows, late)
        elif closed and self._fresh_slices(cur, spec.name, rows):
            stored = self._insert_packed(cur, spec, rows)
        else:
            stored = self._insert_unindexed(cur, target, rows, into)
        if last is not None:
            last.commit(newest)
        return stored

    def _insert_repairing(
        self, cur: duckdb.DuckDBPyConnection, spec: Table, rows: Batch, late: dict[int, tuple[int, int]]
    ) -> int:
        """collector.increases rule 4: the batch appended to ``T_recent`` and its late series'
        increases computed again, in one transaction."""
        target = rows.table
        known = self._newest.get(target)
        cur.execute("BEGIN TRANSACTION")
        try:
            stored = self._insert_unindexed(
                cur, self._series[spec.name].points, rows, series.recent_name(spec.name)
            )
            if stored:
                for sql in increases.repair_statements(spec, late):
                    cur.execute(sql)
        except BaseException:
            cur.execute("ROLLBACK")
            self._newest[target] = known
            raise
        cur.execute("COMMIT")
        return stored

    def _newest_ts(self, cur: duckdb.DuckDBPyConnection, table: str, column: str = "ts_ns") -> int | None:
        """The largest ``column`` (the key's time) stored in ``table``, kept once read; every
        insert moves it."""
        if table not in self._newest:
            got = cur.execute(f"SELECT max({column}) FROM {table}").fetchone()
            self._newest[table] = None if not got or got[0] is None else int(got[0])
        return self._newest[table]

    def _fresh_slices(self, cur: duckdb.DuckDBPyConnection, table: str, rows: Batch) -> bool:
        """:meth:`write_closed` rule 1: every point of ``rows`` in a slice after the newest
        stored point's slice (and at or after 0, where slices start)."""
        lo, _ = _ts_range(rows, "ts_ns")
        newest = self._newest_ts(cur, points_name(table))
        return lo >= 0 and (newest is None or lo >= (newest // series.SLICE_NS + 1) * series.SLICE_NS)

    def _insert_packed(self, cur: duckdb.DuckDBPyConnection, spec: Table, rows: Batch) -> int:
        """:meth:`write_closed` rule 1: the points (one per key: ``DISTINCT ON`` as in
        :meth:`_insert_unindexed` rule 1) into a temp table, then packed from it, in one
        transaction."""
        distinct = "" if rows.unique else "DISTINCT ON (ts_ns, series_id) "
        cur.execute("BEGIN TRANSACTION")
        try:
            sql = f"CREATE OR REPLACE TEMP TABLE _points AS SELECT {distinct}* FROM _stream"
            run_on_stream(cur, sql, rows)
            tix, places, insert, *rest = series.packed_insert_statements(spec, "_points")
            cur.execute(tix)
            cur.execute(places)
            got = cur.execute(insert).fetchone()
            for sql in [*rest, "DROP TABLE _points"]:
                cur.execute(sql)
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")
        _, hi = _ts_range(rows, "ts_ns")
        newest = self._newest[points_name(spec.name)]
        self._newest[points_name(spec.name)] = hi if newest is None else max(newest, hi)
        return int(got[0]) if got else 0

    def _insert_unindexed(
        self, cur: duckdb.DuckDBPyConnection, spec: Table, batch: Any, into: str = ""
    ) -> int:
        """Insert into a table whose key has no index (``Table.indexed`` False): the points of a
        raw table.

        Rules (the same rows an index would keep):

        1. Rows of the batch that share a key are one row (``DISTINCT ON`` the key; which of
           them is kept is not defined — a batch holding two values for one key is bad input).
           A Batch marked ``unique`` (Batch rule 4: a checked replay) skips this step.
        2. A row whose key is already stored is not inserted: an anti-join against the rows
           stored in the batch's ``ts_ns`` range (every key starts with ``ts_ns``, so the scan
           skips row groups by their min/max).
        3. A batch entirely newer than the largest ``ts_ns`` stored cannot repeat a stored key,
           so rule 2 is skipped: a sidecar's scrapes (always newer) pay only for rule 1.
        4. A ``unique`` Batch that rule 3 lets through whole, with the table's columns in the
           table's order, is appended as it is (``insert_into`` on the Arrow stream): every row is
           new, so the count is the batch's height. No view is registered for it, which made
           each flush's append of a sidecar's points cost ~1.5 ms more CPU (bench/results/
           sidecar.md, round 9).

        ``into``: the table appended to when it is not ``spec.name`` (the points of a raw table
        go to ``T_recent``; rules 2-3 read every point through the view ``T_points``).
        """
        table = spec.name
        cols, key = ", ".join(spec.column_names), ", ".join(spec.key)
        lo, hi = _ts_range(batch, spec.key[0])
        newest = self._newest_ts(cur, table, spec.key[0])
        where = ""
        if newest is not None and lo <= newest:
            match = " AND ".join(f"l.{k} = b.{k}" for k in spec.key)
            bound = f"l.{spec.key[0]} BETWEEN {lo} AND {hi}"
            where = f" WHERE NOT EXISTS (SELECT 1 FROM {table} AS l WHERE {bound} AND {match})"
        unique = isinstance(batch, Batch) and batch.unique
        if unique and not where and self._appendable(cur, into or table, batch):
            cur.from_arrow(batch.__arrow_c_stream__()).insert_into(into or table)  # rule 4
            stored = len(batch)
        else:
            rows = "_stream AS b" if unique else f"(SELECT DISTINCT ON ({key}) * FROM _stream) AS b"
            sql = f"INSERT INTO {into or table} ({cols}) SELECT {cols} FROM {rows}{where}"
            stored = run_on_stream(cur, sql, batch)
        self._newest[table] = hi if newest is None else max(newest, hi)
        return stored

    def _appendable(self, cur: duckdb.DuckDBPyConnection, table: str, batch: Batch) -> bool:
        """:meth:`_insert_unindexed` rule 4: ``batch``'s columns are ``table``'s, in its order."""
        columns = self._layouts.get(table)
        if columns is None:
            got = cur.execute(f"SELECT * FROM {table} LIMIT 0").description or []
            columns = self._layouts[table] = tuple(d[0] for d in got)
        return tuple(batch.data) == columns

    @contextmanager
    def cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor for reads (or analyzer work) that does not block the writer."""
        cur = self._new_cursor()
        try:
            yield cur
        finally:
            cur.close()

    # -- maintenance ----------------------------------------------------------------------
    # Statements here carry their numbers as SQL literals, not bound parameters: binding a
    # Python value makes DuckDB import pandas (and with it pyarrow and numpy, +90 MB resident)
    # when it is installed, which a collector-only sidecar must not pay for.
    def maintain(self, now_ns: int | None = None, retention: Retention | None = None) -> dict[str, int]:
        """Roll complete minutes up into ``*_1m``, apply retention and pack closed slices
        (:meth:`pack`); returns rows touched.

        Rollup rules:

        1. Every pass recomputes the complete minutes from two minutes before the last pass's
           end (the watermark), so late samples still land in their rollup: the rollup rows
           from the first minute with a raw point in that span up to the current minute are
           deleted by a plain ``minute_ns`` range and inserted again from the raw points, in
           one transaction. Minutes before that first raw point are left alone, so a minute
           whose raw points retention deleted keeps its rollup; retention deletes the oldest
           points first, so no minute after the first raw point lost its points (as the old
           ``IN (SELECT DISTINCT minute …)`` delete, a minute that retention cut in part is
           rolled up again from what is left, which only a raw retention under the two
           recomputed minutes could reach).
        2. A counter rollup (``engine_samples_1m``, ``histogram_buckets_1m``) keeps the minute's
           ``increase``: the sum of its points' stored increases (collector.increases rule 1),
           so the first point's step from the previous minute counts and a reset inside the
           minute loses nothing; NULL where every point's increase is (a series' first point).
           A long window's increase is then a sum over its minutes (analyzer.latency rule 11).
        """
        now_ns = time.time_ns() if now_ns is None else now_ns
        with self._lock:
            return self._retrying("maintenance", lambda: self._maintain(now_ns, retention or Retention()))

    def _maintain(self, now_ns: int, retention: Retention) -> dict[str, int]:
        cutoff = now_ns - now_ns % NS_PER_MIN  # start of the current, incomplete minute
        since = max(self._state("rollup_watermark_ns") - 2 * NS_PER_MIN, 0)
        done = self._roll_up(since, cutoff)
        self._set_state("rollup_watermark_ns", cutoff)
        raw_before = min(now_ns - int(retention.raw_s * 1e9), cutoff)
        for table, index in self._series.items():  # the raw tables
            old = f"SELECT count(*) FROM {points_name(table)} WHERE ts_ns < {int(raw_before)}"
            got = self.con.execute(old).fetchone()
            done[f"deleted_{table}"] = int(got[0]) if got else 0
            if done[f"deleted_{table}"]:
                self._transaction(series.delete_before_statements(index.spec, raw_before))
        # refused inputs are kept as long as raw rows (a garbage source adds some every scrape)
        done["deleted_ingest_errors"] = self._delete_before("ingest_errors", "ts_ns", raw_before)
        if now_ns - self._state("series_pruned_ns") >= SERIES_PRUNE_NS:
            for name, index in self._series.items():
                done[f"pruned_{name}_series"] = index.prune(self.con)
                if done[f"pruned_{name}_series"] and name in self._last:
                    self._last[name].forget()  # a pruned series' id may be given again
            self._set_state("series_pruned_ns", now_ns)
        roll_before = now_ns - int(retention.rollup_s * 1e9)
        for table in ("gpu_samples_1m", "engine_samples_1m", "histogram_buckets_1m"):
            done[f"deleted_{table}"] = self._delete_before(table, "minute_ns", roll_before)
        done.update(self._pack(now_ns))
        return done

    def _roll_up(self, since: int, cutoff: int) -> dict[str, int]:
        """Rollup rule 1 over the raw points in ``[since, cutoff)``; rollup rows inserted per table."""
        done: dict[str, int] = {}
        for name, sql in _ROLLUPS.items():
            raw = points_name(name.removesuffix("_1m"))
            row = self.con.execute(
                f"SELECT min(ts_ns) FROM {raw} WHERE ts_ns >= {int(since)} AND ts_ns < {int(cutoff)}"
            ).fetchone()
            if not row or row[0] is None:
                done[name] = 0
                continue
            lo = int(row[0]) - int(row[0]) % NS_PER_MIN
            self.con.execute("BEGIN TRANSACTION")
            try:
                self.con.execute(f"DELETE FROM {name} WHERE minute_ns >= {lo} AND minute_ns < {int(cutoff)}")
                got = self.con.execute(sql.format(since=lo, cutoff=int(cutoff))).fetchone()
            except BaseException:
                self.con.execute("ROLLBACK")
                raise
            self.con.execute("COMMIT")
            done[name] = int(got[0]) if got else 0
        return done

    def pack(self, now_ns: int | None = None) -> dict[str, int]:
        """Pack the closed time slices that have recent points; returns the points moved per table.

        Rules (collector.series rule 5 says what packing does):

        1. A slice is closed :data:`PACK_GRACE_NS` after it ends (``now_ns``: the wall clock,
           or the time a maintenance pass is run for).
        2. Each time chunk of a slice is packed in its own transaction (the slice's ``tix`` and
           places are worked out once, before its first chunk: collector.series rule 5, so the
           rows and their order are those of packing the slice at once). A crash or a failure
           part way keeps every point, in one form or the other (the earlier chunks and slices
           packed, the rest recent; the next pass packs the slice again whole, rule 3). What one
           transaction holds is bounded by its chunk, not by the slice: an hour of 5.76 M
           histogram points, packed at once, filled the collector's 32MB cap in the checkpoint
           of its commit, and DuckDB then invalidates the database; a chunk at a time it packs
           (``tests/test_store_pack.py``).
        3. A slice that gets late points after it was packed is packed again with them at the
           next pass (they wait in ``T_recent`` until then, read like any other point).
        """
        now_ns = time.time_ns() if now_ns is None else now_ns
        with self._lock:
            return self._retrying("packing", lambda: self._pack(now_ns))

    def _pack(self, now_ns: int) -> dict[str, int]:
        slice_ns = series.SLICE_NS
        before = (now_ns - PACK_GRACE_NS) // slice_ns * slice_ns  # rule 1
        done: dict[str, int] = {}
        for name, index in self._series.items():
            slices = self.con.execute(
                f"SELECT ts_ns // {slice_ns} AS k, count(*) FROM {series.recent_name(name)} "
                f"WHERE ts_ns >= 0 AND ts_ns < {int(before)} GROUP BY k ORDER BY k"
            ).fetchall()
            for k, _ in slices:  # rule 2
                self.pack_slice(index.spec, int(k) * slice_ns)
            done[f"packed_{name}"] = sum(int(n) for _, n in slices)
        return done

    def pack_slice(self, spec: Table, lo_ns: int) -> None:
        """:meth:`pack` rule 2 for the slice of ``spec``'s points that starts at ``lo_ns``: its
        temp tables first (collector.series rule 5), then one transaction per chunk, in time order,
        each followed by a checkpoint where there are several: without it a chunk's deleted
        recent rows stay in DuckDB's memory until the WAL's own checkpoint, and the bench node's
        hour (``bench.bench_sidecar``'s bodies replayed) ran out of the 32MB cap in its third
        histogram chunk."""
        hi_ns, con = lo_ns + series.SLICE_NS, self.con
        with self._lock:
            try:
                for sql in series.slice_statements(spec, lo_ns, hi_ns):
                    con.execute(sql)
                starts = [int(c) for (c,) in con.execute(series.SLICE_CHUNKS).fetchall()]
                edges = [lo_ns, *starts[1:], hi_ns]
                for a, b in pairwise(edges):
                    self._transaction(series.chunk_statements(spec, a, b))
                    if len(edges) > 2:
                        con.execute("CHECKPOINT")
            finally:
                for sql in series.DROP_SLICE:
                    con.execute(sql)

    def _delete_before(self, table: str, column: str, before_ns: int) -> int:
        got = self.con.execute(f"DELETE FROM {table} WHERE {column} < {int(before_ns)}").fetchone()
        return int(got[0]) if got else 0

    def _state(self, key: str) -> int:
        return state.read(self.con, key)

    def _set_state(self, key: str, value: int) -> None:
        state.write(self.con, key, value)

    def checkpoint(self) -> None:
        with self._lock:
            self.con.execute("CHECKPOINT")

    def close(self) -> None:
        """Pack the closed slices of a writable store file (an ``ioe ingest`` of past captures
        runs no maintenance), close it, and rewrite it without its free blocks when
        :meth:`_worth_rewriting` says so (:mod:`collector.compaction`). A failed packing or
        rewrite is logged: the points stay as written, the file as it was."""
        with self._lock:
            rewrite = False
            if not self.read_only and self.path != ":memory:":
                try:
                    self.pack()
                except duckdb.Error:
                    log.exception("store %s: packing at close failed; the points stay as written", self.path)
                try:
                    rewrite = self._worth_rewriting()
                except duckdb.Error as exc:
                    log.warning("store %s: checkpoint at close failed (%s); not rewritten", self.path, exc)
            self._writer.close()
            self.con.close()
            if rewrite:
                try:
                    done = compaction.compact(self.path, STORAGE_VERSION, self._config)
                except compaction.CompactionError as exc:
                    log.warning("%s; the file keeps its free blocks", exc)
                else:
                    log.info(
                        "store %s: rewritten without its free blocks, %d -> %d bytes in %.2f s",
                        self.path, done.bytes_before, done.bytes_after, done.seconds,
                    )  # fmt: skip

    def _worth_rewriting(self) -> bool:
        """Whether the file is rewritten at close (collector.compaction).

        1. At least :data:`COMPACT_FREE_SHARE` (a quarter) of its blocks are free, and
        2. it is at most :data:`COMPACT_MAX_BYTES` (32 MiB), so the rewrite stays short.

        Measured (``python -m bench.bench_density --rounds 3 --compaction 1 4 12 48``: the
        sidecar's hour of 8 GPUs, repeated; 1 thread, 32MB, as the sidecar's store; load 6-8 on
        2 shared cores): 1 h 7.6 -> 2.6 MB in 0.56 s; 4 h 9.7 -> 7.1 MB in 1.2 s; 12 h 22.3 ->
        18.4 MB in 4.1 s; 48 h 83 -> 71 MB in 13.8 s, about 6 MB of file a second. A
        long-running store keeps about one hour of free blocks (reused by the next hour), so the
        share falls under a quarter after a few hours (12 h: 18 %); the size cap bounds the
        rewrite at ~6 s on such a machine, within a shutdown's grace period."""
        self.con.execute("CHECKPOINT")  # blocks the packing freed count as free only after it
        got = self.con.execute(
            "SELECT block_size, total_blocks, free_blocks FROM pragma_database_size() "
            "WHERE database_name = current_database()"
        ).fetchone()
        if not got or not got[1]:
            return False
        block, total, free = (int(v) for v in got)
        return free >= COMPACT_FREE_SHARE * total and block * total <= COMPACT_MAX_BYTES

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _text(value: str) -> str:
    """A SQL string literal (for the store's own constant keys)."""
    return "'" + value.replace("'", "''") + "'"


def _insert(
    cur: duckdb.DuckDBPyConnection, table: str, cols: str, batch: Batch | pl.DataFrame | pa.Table
) -> int:
    """Insert ``batch``; rows whose natural key exists are ignored (or replace).

    DuckDB reads the batch through the Arrow C stream interface (a PyCapsule from
    ``__arrow_c_stream__``), not through pyarrow: handed a polars frame or a registered object,
    DuckDB imports pyarrow, pandas and numpy (+60-90 MB resident in a sidecar that needs none of
    them) and converts; the capsule is scanned as it is. A capsule is read once, so each statement
    gets a fresh one.

    A plain ``INSERT`` is tried first: DuckDB's ``OR IGNORE`` path costs 2-3x more per row, and
    most batches (a new scrape, new spans) have no key that exists. A statement that hits a
    duplicate key writes nothing (autocommit), so falling back to ``OR IGNORE`` then gives exactly
    the same rows and count.

    A table that keeps the latest state (``targets``, ``deployments``) gets each key's last row of
    the batch only (:func:`_last_per_key`): handed one key twice in one statement, DuckDB's
    ``INSERT OR REPLACE`` keeps the first, so a flush of 30 s of a target's health stored its
    health of 30 s before.
    """
    sql = f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _stream"
    if table in REPLACE_TABLES:
        latest = _last_per_key(TABLES[table].key, batch)
        return run_on_stream(cur, sql.replace("INSERT", "INSERT OR REPLACE", 1), latest)
    try:
        return run_on_stream(cur, sql, batch)
    except duckdb.ConstraintException:
        return run_on_stream(cur, sql.replace("INSERT", "INSERT OR IGNORE", 1), batch)


def _last_per_key(key: tuple[str, ...], batch: Any) -> Any:
    """The rows of ``batch`` that are the last of their ``key`` in it, in batch order (a Batch or
    a polars frame; an Arrow table as it is)."""
    if isinstance(batch, Batch):
        last = {k: i for i, k in enumerate(zip(*(batch[c] for c in key), strict=True))}
        return batch if len(last) == batch.height else batch.take(sorted(last.values()))
    if hasattr(batch, "unique") and hasattr(batch, "height"):  # a polars frame
        return batch.unique(subset=list(key), keep="last", maintain_order=True)
    return batch


def _columns(batch: Any, names: list[str]) -> tuple[dict[str, Any], int]:
    """``names`` of a Batch, polars frame or Arrow table as Python sequences, and the height."""
    if isinstance(batch, Batch):
        return batch.data, batch.height
    if hasattr(batch, "column_names"):  # a pyarrow table
        return {c: batch.column(c).to_pylist() for c in names}, batch.num_rows
    return {c: batch.get_column(c).to_list() for c in names}, batch.height


def _ts_range(batch: Any, column: str) -> tuple[int, int]:
    """Smallest and largest ``column`` value of a Batch, polars frame or Arrow table."""
    if isinstance(batch, Batch):
        values = batch[column]
        if None in values:
            raise StoreError(f"{batch.table}: key column {column} holds NULL")
        return int(min(values)), int(max(values))
    if hasattr(batch, "column_names"):  # a pyarrow table
        import pyarrow.compute as pc

        got = pc.min_max(batch.column(column))
        lo, hi = got["min"].as_py(), got["max"].as_py()
    else:
        lo, hi = batch[column].min(), batch[column].max()
    if lo is None or hi is None:
        raise StoreError(f"key column {column} holds NULL")
    return int(lo), int(hi)


_MINUTE = f"(ts_ns - ts_ns % {NS_PER_MIN})"


def _rollup(target: str, raw: str, inner: str, key: str, outer: str, last_of: str = "value") -> str:
    """``INSERT`` into ``target`` (its rows of the window deleted first) of the complete minutes
    in ``[since, cutoff)`` of the raw table ``raw`` (series layout). The points are aggregated
    per minute and series first (``inner``, on integers), then joined to their ~1,000 series and
    combined per rollup key
    (``key``, ``outer``): the join and the grouping on text see one row per series and minute,
    not one per point. ``outer`` combines partial aggregates exactly: counts and sums add up,
    a mean is their ratio, the last value is the one with the latest ``ts_ns`` among the points
    whose ``last_of`` is not NULL (``arg_max`` leaves NULL values out), an increase the sum of
    the points' (rollup rule 2)."""
    return f"""
        INSERT INTO {target}
        SELECT m.minute_ns, {outer}
        FROM (SELECT {_MINUTE} AS minute_ns, series_id, count(*) AS n, {inner},
                     max(ts_ns) FILTER (WHERE {last_of} IS NOT NULL) AS last_ts
              FROM {points_name(raw)} WHERE ts_ns >= {{since}} AND ts_ns < {{cutoff}}
              GROUP BY minute_ns, series_id) AS m
        JOIN {series_name(raw)} AS s USING (series_id)
        GROUP BY m.minute_ns, {_of_series(key)}"""


def _of_series(columns: str) -> str:
    """``"a, b"`` -> ``"s.a, s.b"``: the columns of the joined series row."""
    return ", ".join(f"s.{c}" for c in columns.split(", "))


_ENGINE_ID = "source, engine, model, dp_rank, tp_rank, pp_rank, ep_rank, concept, labels"
_S_ENGINE_ID = _of_series(_ENGINE_ID)
_MEAN = "sum(m.{0}_sum) / nullif(sum(m.{0}_k), 0)"  # avg() of the points: NULLs left out
_ROLLUPS: dict[str, str] = {
    "gpu_samples_1m": _rollup(
        "gpu_samples_1m",
        "gpu_samples",
        "count(value) AS v_k, sum(value) AS v_sum, min(value) AS lo, max(value) AS hi, "
        "arg_max(value, ts_ns) AS last",
        "host, uuid, metric, link",
        "s.host, any_value(s.gpu), s.uuid, s.metric, s.link, sum(m.n), min(m.lo), max(m.hi), "
        f"{_MEAN.format('v')}, arg_max(m.last, m.last_ts)",
    ),
    "engine_samples_1m": _rollup(
        "engine_samples_1m",
        "engine_samples",
        "count(value) AS v_k, sum(value) AS v_sum, max(value) AS hi, arg_max(value, ts_ns) AS last, "
        f"count(rate_per_s) AS r_k, sum(rate_per_s) AS r_sum, sum({INCREASE}) AS inc",
        _ENGINE_ID,
        f"{_S_ENGINE_ID}, sum(m.n), {_MEAN.format('v')}, max(m.hi), arg_max(m.last, m.last_ts), "
        f"{_MEAN.format('r')}, sum(m.inc)",
    ),
    "histogram_buckets_1m": _rollup(
        "histogram_buckets_1m",
        "histogram_buckets",
        f"arg_max(cumulative_count, ts_ns) AS last, sum({INCREASE}) AS inc",
        f"{_ENGINE_ID}, le",
        f"{_S_ENGINE_ID}, s.le, arg_max(m.last, m.last_ts), sum(m.inc)",
        last_of="cumulative_count",
    ),
}


class MemorySink:
    """The in-memory twin of :class:`Store` for tests of sources: keeps every batch written."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, pl.DataFrame]] = []

    def write(self, table: str, batch: Batch | pl.DataFrame | pa.Table) -> int:
        import polars as pl

        frame = as_polars(batch)
        frame = frame if isinstance(frame, pl.DataFrame) else pl.from_arrow(frame)
        assert isinstance(frame, pl.DataFrame)
        self.batches.append((table, frame))
        return frame.height

    def frame(self, table: str) -> pl.DataFrame:
        import polars as pl

        parts = [f for t, f in self.batches if t == table]
        return pl.concat(parts) if parts else pl.DataFrame()


Writer = Callable[[str, "pl.DataFrame"], int]
