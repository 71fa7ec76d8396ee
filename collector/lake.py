"""The fleet store: IOE's tables in a DuckLake (PostgreSQL catalog + shared data path).

Many sidecars write one lake at once; ``ioe serve`` reads it. :class:`LakeStore` has the
interface of :class:`collector.store.Store` (``write``, ``cursor``, ``count``, ``counts``,
``maintain``, ``schema_version``, ``close``) and the same tables, so the analyzer's SQL runs
unchanged on either backend. :func:`open_store` picks the backend from the settings.

Rules:

1. **Acknowledge only what is durable.** ``write`` validates the batch, casts it to the
   table's types and writes it to the local spool as one Arrow IPC file (temp file, fsync,
   rename, fsync of the directory) before it returns. A SIGKILL after ``write`` returned
   loses nothing; a batch that fails validation is refused with :class:`LakeError` and never
   enters the spool (so no poison file can block the flush).
2. **Commits are batched.** A background thread moves spooled files to the lake every
   ``commit_interval_s`` in one transaction, and deletes the files only after the commit
   succeeded. A catalog outage leaves them in the spool; the next flush after the catalog
   returns commits them.
3. **Idempotent on the natural key** (DuckLake has no primary keys): a batch is first
   de-duplicated on :attr:`collector.records.Table.key` (first row wins; last row wins for
   ``targets``/``deployments``), then inserted by an anti-join against the lake, bounded by
   the batch's time range where the key starts with a time column. A replayed spool file
   (killed between commit and delete) therefore inserts nothing. ``targets`` and
   ``deployments`` keep their latest state: delete-then-insert of the batch's keys.
4. **Bounded, logged retry.** DuckLake retries catalog write conflicts itself
   (``ducklake_max_retry_count``); any other failure is retried ``max_retries`` times with
   exponential back-off, each failure logged; a broken connection is re-opened. After the
   last attempt the batch stays in the spool and the error is logged, not raised, by the
   background flush.
5. **One spool per process**: the spool directory is locked (``flock``); a second process
   on the same spool is refused, so no spool file is ever committed by two writers at once.
6. **Maintenance** (:meth:`LakeStore.maintain`) recomputes the ``*_1m`` rollups of every
   minute that is new since the last pass or that received rows since the DuckLake snapshot
   the last pass saw (late rows from a spool that waited out an outage are rolled up too),
   applies retention, then flushes inlined data, merges adjacent files, expires old
   snapshots and removes their files. Run it from ONE process per lake (the API server or a
   designated sidecar): two concurrent rollup passes could both insert a minute's rollup.
7. **Rollup increases.** A counter rollup's ``increase`` (``engine_samples_1m``,
   ``histogram_buckets_1m``: the sum of the minute's point steps, as a store file keeps it,
   collector.store rollup rule 2) is taken with ``lag`` over the rows of the dirty minutes and
   the :data:`STEP_LOOKBACK_NS` before them (the lake's wide tables keep no point increase). A
   series' first row after a gap longer than that has no previous row read: its step is NULL
   (not counted), where a store file counts the step from the point before the gap.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from collector.batch import Batch, as_polars
from collector.increases import steps_sql
from collector.lake_spool import Spool
from collector.records import REPLACE_TABLES, TABLES, Table
from collector.store import MIGRATIONS, NS_PER_MIN, SCHEMA_VERSION, Retention, RowCounts, Store, StoreError

if TYPE_CHECKING:
    from ioeconf.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_ABANDONED = 16  # broken lake connections set aside unclosed (LakeStore._drop_connection)
LAKE = "lake"
# Extension wheel module -> the name DuckDB expects (its entry point is <name>_duckdb_cpp_init).
_EXTENSIONS = {"duckdb_extension_ducklake": "ducklake", "duckdb_extension_postgres": "postgres_scanner"}
# Key columns that order rows in time: an anti-join is bounded to the batch's range of them.
_TIME_KEYS = ("ts_ns", "minute_ns", "ts_us")
_DUCK_TO_ARROW = {
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "DOUBLE": pa.float64(),
    "VARCHAR": pa.string(),
    "BOOLEAN": pa.bool_(),
}
_PERMANENT = (
    duckdb.ParserException,
    duckdb.BinderException,
    duckdb.ConversionException,
    duckdb.ConstraintException,
)
_RAW_TABLES = ("gpu_samples", "engine_samples", "histogram_buckets", "fabric_samples")
_ROLLUP_TABLES = ("gpu_samples_1m", "engine_samples_1m", "histogram_buckets_1m")


class LakeError(StoreError):
    """The lake or its spool cannot be used; the message says which and why."""


@dataclass(frozen=True)
class LakeConfig:
    """Where the lake and the spool are, and how often and how hard to commit."""

    catalog_dsn: str  # libpq key=value string, e.g. "dbname=ioe host=127.0.0.1 port=5432"
    data_path: str  # directory shared by every writer (or s3://… where httpfs is deployed)
    spool_dir: str  # local to this process
    commit_interval_s: float = 5.0
    max_retries: int = 5
    retry_wait_s: float = 0.2
    flush_max_files: int = 512  # spool files committed per transaction
    background: bool = True  # run the periodic flush thread
    snapshot_keep_s: float = 3600.0  # snapshots younger than this are kept (time travel)


# -- extensions and connection ---------------------------------------------------------------
def extension_dir() -> Path:
    """A private directory of links to the installed extension wheels, named as DuckDB wants.

    The wheels ship ``postgres.duckdb_extension`` whose entry point is ``postgres_scanner``;
    DuckDB derives the entry point from the file name, so each file is linked under the
    name it needs. Nothing is downloaded.
    """
    target = Path(tempfile.gettempdir()) / f"ioe-duckdb-ext-{os.getuid()}" / duckdb.__version__
    target.mkdir(parents=True, exist_ok=True)
    for module, name in _EXTENSIONS.items():
        link = target / f"{name}.duckdb_extension"
        if link.exists():
            continue
        spec = importlib.util.find_spec(module)
        roots = list(spec.submodule_search_locations or []) if spec else []
        found = [p for r in roots for p in Path(r).rglob("*.duckdb_extension")]
        if not found:
            raise LakeError(
                f"extension wheel {module} is not installed (pip install {module.replace('_', '-')})"
            )
        tmp = target / f".{name}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(found[0])
        os.replace(tmp, link)
    return target


def connect_lake(cfg: LakeConfig) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the lake attached as ``lake`` and selected by ``USE``."""
    ext = extension_dir()
    con = duckdb.connect()
    try:
        for name in _EXTENSIONS.values():
            con.execute(f"LOAD '{ext / (name + '.duckdb_extension')}'")
        con.execute("SET ducklake_max_retry_count = 100")
        dsn = cfg.catalog_dsn.replace("'", "''")
        data = cfg.data_path.replace("'", "''")
        con.execute(f"ATTACH 'ducklake:postgres:{dsn}' AS {LAKE} (DATA_PATH '{data}')")
        con.execute(f"USE {LAKE}")
    except duckdb.Error:
        con.close()
        raise
    return con


def open_lake_readonly(catalog_dsn: str, data_path: str = "") -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the lake attached read-only as ``lake`` (``USE`` done), then
    closed to everything else, for ``ioe query`` and ``ioe analyze``.

    1. ``READ_ONLY``: no statement can change the lake (DuckDB refuses INSERT, DELETE, CREATE …).
    2. After the attach, external access is switched off and the configuration locked, as for an
       embedded store (:func:`collector.readonly.open_readonly`): no file, URL or glob reads, no
       further ``ATTACH``, ``COPY``, ``INSTALL`` or ``LOAD``, except under the lake's data path
       (``allowed_directories``), which DuckDB must read to answer. The catalog connection itself
       stays reachable through the postgres extension's table functions (``postgres_query``), so
       statements run here must also be checked (``ioe query`` uses :func:`api.query.run_query`,
       which allows only the store's tables and generator functions).
    3. ``data_path`` may be empty: the lake's catalog records where its data is, and that is used.
    Raises :class:`LakeError` naming the catalog when it cannot be attached.
    """
    ext = extension_dir()
    con = duckdb.connect(config={"autoload_known_extensions": False, "autoinstall_known_extensions": False})
    try:
        for name in _EXTENSIONS.values():
            con.execute(f"LOAD '{ext / (name + '.duckdb_extension')}'")
        dsn = catalog_dsn.replace("'", "''")
        data = f"DATA_PATH '{data_path.replace(chr(39), chr(39) * 2)}', " if data_path else ""
        con.execute(f"ATTACH 'ducklake:postgres:{dsn}' AS {LAKE} ({data}READ_ONLY)")
        con.execute(f"USE {LAKE}")
        where = con.execute(
            f"SELECT value FROM __ducklake_metadata_{LAKE}.ducklake_metadata WHERE key = 'data_path'"
        ).fetchone()
        allowed = [p for p in {data_path, where[0] if where else ""} if p]
        con.execute("SET allowed_directories = ?", [allowed])
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except duckdb.Error as exc:
        con.close()
        why = " ".join(str(exc).split())
        raise LakeError(f"lake {catalog_dsn!r}: cannot attach it read-only ({why})") from exc
    return con


def lake_ddl(table: Table) -> str:
    """``CREATE TABLE`` for the lake: the store's columns and NOT NULL keys, no PRIMARY KEY."""
    cols = ", ".join(f"{c} {t}{' NOT NULL' if c in table.key else ''}" for c, t in table.columns)
    return f"CREATE TABLE IF NOT EXISTS {table.name} ({cols})"


def arrow_schema(table: Table) -> pa.Schema:
    return pa.schema([pa.field(c, _DUCK_TO_ARROW[t]) for c, t in table.columns])


# -- the store --------------------------------------------------------------------------------
class LakeStore(RowCounts):
    """DuckLake-backed store with a local spool; see the module docstring for its rules."""

    def __init__(self, cfg: LakeConfig, *, retention: Retention | None = None):
        self.cfg = cfg
        self.path = f"ducklake:postgres:{cfg.catalog_dsn} ({cfg.data_path})"
        self.retention = retention or Retention()
        self.spool = Spool(cfg.spool_dir)
        self._lock = threading.RLock()
        self._flush_lock = threading.Lock()
        self._con: duckdb.DuckDBPyConnection | None = None
        self._abandoned: list[duckdb.DuckDBPyConnection] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self._retry("open", self._bootstrap)
        except LakeError:
            self.spool.close()
            raise
        if cfg.background:
            self._thread = threading.Thread(target=self._flush_loop, name="lake-flush", daemon=True)
            self._thread.start()

    # -- connection and retry -----------------------------------------------------------
    def _connection(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            self._con = connect_lake(self.cfg)
        return self._con

    def _drop_connection(self, *, broken: bool = False) -> None:
        """Forget the connection. A broken one (its statement failed, e.g. the Postgres catalog
        went away) is set aside unclosed: closing a DuckLake connection whose catalog
        connection died aborted the whole process under DuckDB 1.5.5 (seen in
        tests/test_lake_fleet.py's catalog-outage test, while the catalog was down). At most
        :data:`MAX_ABANDONED` are kept, closed at :meth:`close`; a healthy one is closed at once."""
        if self._con is None:
            return
        if broken:
            self._abandoned.append(self._con)
            del self._abandoned[:-MAX_ABANDONED]
        else:
            try:
                self._con.close()
            except duckdb.Error:
                log.debug("closing the lake connection failed", exc_info=True)
        self._con = None

    def _retry(self, what: str, fn: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        """Run ``fn`` in a transaction; retried ``max_retries`` times with back-off (rule 4)."""
        attempts = max(self.cfg.max_retries, 1)
        for attempt in range(1, attempts + 1):
            with self._lock:
                try:
                    return self._in_transaction(fn)
                except _PERMANENT as exc:  # a bug or a bad batch: retrying cannot help
                    raise LakeError(f"lake {self.path}: {what} failed: {exc}") from exc
                except duckdb.Error as exc:
                    log.warning("lake %s failed (attempt %d/%d): %s", what, attempt, attempts, exc)
                    if not isinstance(exc, duckdb.TransactionException):
                        self._drop_connection(broken=True)
                    last: duckdb.Error = exc
            if attempt < attempts:
                time.sleep(self.cfg.retry_wait_s * 2 ** (attempt - 1))
        raise LakeError(f"lake {self.path}: {what} failed after {attempts} attempts: {last}") from last

    def _in_transaction(self, fn: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        con = self._connection()
        con.execute("BEGIN TRANSACTION")
        try:
            out = fn(con)
            con.execute("COMMIT")
        except BaseException:
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:
                log.debug("rollback after a failed lake transaction failed", exc_info=True)
            raise
        return out

    # -- schema -------------------------------------------------------------------------
    def _bootstrap(self, con: duckdb.DuckDBPyConnection) -> None:
        """Create or migrate the schema (every writer may race here; a conflict is retried)."""
        current = _schema_version(con)
        if current > SCHEMA_VERSION:
            raise LakeError(
                f"lake {self.path}: schema version {current} is newer than this IOE ({SCHEMA_VERSION})"
            )
        con.execute("CREATE TABLE IF NOT EXISTS ioe_schema (version INTEGER, applied_ns BIGINT)")
        con.execute("CREATE TABLE IF NOT EXISTS ioe_state (key VARCHAR NOT NULL, value BIGINT)")
        if current > 0:
            for from_version, statements in MIGRATIONS:
                if from_version >= current:
                    for sql in statements:
                        con.execute(sql)
                    con.execute("INSERT INTO ioe_schema VALUES (?, ?)", [from_version + 1, time.time_ns()])
        for table in TABLES.values():
            con.execute(lake_ddl(table))
        if current == 0:
            con.execute("INSERT INTO ioe_schema VALUES (?, ?)", [SCHEMA_VERSION, time.time_ns()])

    def schema_version(self) -> int:
        with self.cursor() as cur:
            return _schema_version(cur)

    # -- writes -------------------------------------------------------------------------
    def write(self, table: str, batch: Batch | pl.DataFrame | pa.Table) -> int:
        """Validate ``batch`` and spool it durably; returns the rows acknowledged (rule 1).

        How many of them are new is known only at commit: :meth:`flush` returns it.
        """
        arrow = _conform(table, batch)
        if arrow.num_rows == 0:
            return 0
        self.spool.put(table, arrow)
        return arrow.num_rows

    def flush(self) -> dict[str, int]:
        """Commit spooled batches (oldest first) in one transaction; returns new rows per table."""
        total: dict[str, int] = {}
        with self._flush_lock:  # one flush at a time: a file is never committed twice at once
            self._flush_into(total)
        return total

    def _flush_into(self, total: dict[str, int]) -> None:
        while True:
            paths = self.spool.pending()[: self.cfg.flush_max_files]
            if not paths:
                return
            batches = self._read_spool(paths)
            new = self._retry("commit", partial(_commit, batches=batches)) if batches else {}
            self.spool.remove(paths)
            for name, n in new.items():
                total[name] = total.get(name, 0) + n

    def _read_spool(self, paths: list[Path]) -> dict[str, list[pa.Table]]:
        grouped: dict[str, list[pa.Table]] = {}
        for path in paths:
            try:
                name, data = self.spool.read(path)
            except (OSError, pa.ArrowException) as exc:
                self.spool.quarantine(path, str(exc))
                continue
            grouped.setdefault(name, []).append(data)
        return grouped

    def _flush_loop(self) -> None:
        while not self._stop.wait(self.cfg.commit_interval_s):
            self._flush_logged()

    def _flush_logged(self) -> None:
        try:
            self.flush()
        except LakeError as exc:
            log.error("%s; %d batches stay in spool %s", exc, len(self.spool.pending()), self.spool.path)

    # -- reads --------------------------------------------------------------------------
    @contextmanager
    def cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor on the lake (``USE lake`` already done) that does not block the writer."""
        with self._lock:
            cur = self._connection().cursor()
        try:
            cur.execute(f"USE {LAKE}")
            yield cur
        finally:
            cur.close()

    # -- maintenance --------------------------------------------------------------------
    def maintain(self, now_ns: int | None = None, retention: Retention | None = None) -> dict[str, int]:
        """Rollups and retention in one transaction, then compaction (rule 6); rows touched."""
        now_ns = time.time_ns() if now_ns is None else now_ns
        retention = retention or self.retention
        done = self._retry("rollup", lambda con: _rollup_pass(con, now_ns, retention))
        done.update(self.compact())
        return done

    def compact(self) -> dict[str, int]:
        """Flush inlined rows, merge adjacent files, expire old snapshots, delete their files."""
        keep = f"now() - INTERVAL '{int(self.cfg.snapshot_keep_s * 1e6)} microseconds'"
        steps = {
            "flushed_inlined": f"CALL ducklake_flush_inlined_data('{LAKE}')",
            "merged_files": f"CALL ducklake_merge_adjacent_files('{LAKE}')",
            "expired_snapshots": f"CALL ducklake_expire_snapshots('{LAKE}', older_than => {keep})",
            "cleaned_files": f"CALL ducklake_cleanup_old_files('{LAKE}', older_than => {keep})",
        }
        done: dict[str, int] = {}
        for name, sql in steps.items():
            done[name] = self._retry(name, partial(_rows_of, sql=sql))
        return done

    def close(self) -> None:
        """Stop the flush thread, try a last flush (what fails stays spooled), release all."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._flush_logged()
        with self._lock:
            self._drop_connection()
            for con in self._abandoned:  # the catalog is back or gone for good: close them now
                try:
                    con.close()
                except duckdb.Error:
                    log.debug("closing a broken lake connection failed", exc_info=True)
            self._abandoned.clear()
        self.spool.close()

    def __enter__(self) -> LakeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- pure SQL helpers ---------------------------------------------------------------------------
def _schema_version(con: duckdb.DuckDBPyConnection) -> int:
    row = con.execute(
        "SELECT count(*) FROM information_schema.tables "
        "WHERE table_catalog = ? AND table_name = 'ioe_schema'",
        [LAKE],
    ).fetchone()
    if not row or not row[0]:
        return 0
    got = con.execute(f"SELECT max(version) FROM {LAKE}.ioe_schema").fetchone()
    return int(got[0]) if got and got[0] is not None else 0


def _rows_of(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    return len(con.execute(sql).fetchall())


def _conform(table: str, batch: Batch | pl.DataFrame | pa.Table) -> pa.Table:
    """``batch`` as exactly ``table``'s columns and types; refuses NULL keys, naming them."""
    spec = TABLES.get(table)
    if spec is None:
        raise LakeError(f"lake: no table {table!r}")
    batch = as_polars(batch)
    arrow = batch.to_arrow() if isinstance(batch, pl.DataFrame) else batch
    missing = [c for c in spec.column_names if c not in arrow.column_names]
    if missing:
        raise LakeError(f"{table}: batch lacks columns {missing}")
    try:
        arrow = arrow.select(spec.column_names).cast(arrow_schema(spec))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise LakeError(f"{table}: batch does not fit the table's types ({exc})") from exc
    nulls = [c for c in spec.key if arrow.column(c).null_count]
    if nulls:
        raise LakeError(f"{table}: key columns {nulls} hold NULL (use '' / -1 for unknown)")
    return arrow


def _commit(con: duckdb.DuckDBPyConnection, *, batches: dict[str, list[pa.Table]]) -> dict[str, int]:
    return {name: _insert(con, name, pa.concat_tables(parts)) for name, parts in batches.items()}


def _insert(con: duckdb.DuckDBPyConnection, table: str, arrow: pa.Table) -> int:
    """Insert the batch's rows whose key is not in the lake yet (rule 3); returns their count."""
    spec = TABLES[table]
    cols = ", ".join(spec.column_names)
    key = ", ".join(spec.key)
    order = "DESC" if table in REPLACE_TABLES else "ASC"
    con.register("_raw", arrow.append_column("_i", pa.array(range(arrow.num_rows), pa.int64())))
    try:
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE _batch AS SELECT {cols} FROM _raw "
            f"QUALIFY row_number() OVER (PARTITION BY {key} ORDER BY _i {order}) = 1"
        )
    finally:
        con.unregister("_raw")
    match = " AND ".join(f"l.{k} = b.{k}" for k in spec.key)
    if table in REPLACE_TABLES:
        con.execute(f"DELETE FROM {table} AS l WHERE EXISTS (SELECT 1 FROM _batch AS b WHERE {match})")
        got = con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _batch").fetchone()
        return int(got[0]) if got else 0
    bound = _time_bound(spec, arrow)
    got = con.execute(
        f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _batch AS b "
        f"WHERE NOT EXISTS (SELECT 1 FROM {table} AS l WHERE {bound} AND {match})"
    ).fetchone()
    return int(got[0]) if got else 0


def _time_bound(spec: Table, arrow: pa.Table) -> str:
    """Filters on the lake side of the anti-join that let the scan skip files by their stats.

    1. The time key (first key column, when it is one): ``BETWEEN`` the batch's min and max.
    2. A text or integer key column holding one value in the whole batch (a sidecar's
       ``host``, one metric): equality with that value.
    Both only narrow rows that could never match, so the result is unchanged.
    """
    parts = ["TRUE"]
    if spec.key[0] in _TIME_KEYS:
        lo_hi = pc.min_max(arrow.column(spec.key[0]))
        parts.append(f"l.{spec.key[0]} BETWEEN {int(lo_hi['min'].as_py())} AND {int(lo_hi['max'].as_py())}")
    for column in spec.key[1:]:
        values = pc.unique(arrow.column(column))
        if len(values) != 1:
            continue
        value = values[0].as_py()
        if isinstance(value, str):
            parts.append(f"l.{column} = '{value.replace(chr(39), chr(39) * 2)}'")
        elif isinstance(value, int) and not isinstance(value, bool):
            parts.append(f"l.{column} = {value}")
    return " AND ".join(parts)


_ENGINE_ID = "source, engine, model, dp_rank, tp_rank, pp_rank, ep_rank, concept, labels"
_MINUTE = f"(ts_ns - ts_ns % {NS_PER_MIN})"
_DIRTY = f"{_MINUTE} IN (SELECT minute_ns FROM _dirty)"
# How far before its dirty minutes a counter's points are read for their steps (rule 7).
STEP_LOOKBACK_NS = 10 * NS_PER_MIN


def _stepped(raw: str, value: str) -> str:
    """Rule 7: the rows of ``raw`` around the dirty minutes with ``inc``, each one's step from the
    previous row of its series (collector.increases rule 1, by ``lag``)."""
    key = ", ".join(c for c in TABLES[raw].key if c != "ts_ns")
    lo = f"(SELECT min(minute_ns) FROM _dirty) - {STEP_LOOKBACK_NS}"
    hi = f"(SELECT max(minute_ns) FROM _dirty) + {NS_PER_MIN}"
    return f"({steps_sql(raw, '*', value, 'ts_ns', key, where=f'ts_ns >= {lo} AND ts_ns < {hi}')}) AS {raw}"


_ROLLUP_SELECT: dict[str, tuple[str, str]] = {
    "gpu_samples_1m": (
        "gpu_samples",
        f"SELECT {_MINUTE} AS minute_ns, host, any_value(gpu), uuid, metric, link, count(*), min(value), "
        f"max(value), avg(value), arg_max(value, ts_ns) FROM gpu_samples WHERE {_DIRTY} GROUP BY ALL",
    ),
    "engine_samples_1m": (
        "engine_samples",
        f"SELECT {_MINUTE} AS minute_ns, {_ENGINE_ID}, count(*), avg(value), max(value), "
        f"arg_max(value, ts_ns), avg(rate_per_s), sum(inc) FROM {_stepped('engine_samples', 'value')} "
        f"WHERE {_DIRTY} GROUP BY ALL",
    ),
    "histogram_buckets_1m": (
        "histogram_buckets",
        f"SELECT {_MINUTE} AS minute_ns, {_ENGINE_ID}, le, arg_max(cumulative_count, ts_ns), sum(inc) "
        f"FROM {_stepped('histogram_buckets', 'cumulative_count')} WHERE {_DIRTY} GROUP BY ALL",
    ),
}


def _rollup_pass(con: duckdb.DuckDBPyConnection, now_ns: int, retention: Retention) -> dict[str, int]:
    """One maintenance transaction: recompute dirty minutes, apply retention, save the marks.

    Notes:
    1. Complete minutes only: ``cutoff`` is the start of the current minute.
    2. Dirty minutes of a raw table: those in ``[last cutoff - 2 min, cutoff)`` plus those of
       rows inserted since the snapshot the last pass saw (late rows), never before the raw
       retention limit (their raw rows are gone, a recompute would shrink the rollup).
    3. A dirty minute's rollup rows are deleted and re-inserted in this transaction
       (DuckLake has no ``INSERT OR REPLACE``).
    """
    cutoff = now_ns - now_ns % NS_PER_MIN
    raw_before = min(now_ns - int(retention.raw_s * 1e9), cutoff)
    state = dict(con.execute("SELECT key, value FROM ioe_state").fetchall())
    snap_row = con.execute(f"SELECT id FROM {LAKE}.current_snapshot()").fetchone()
    snapshot = int(snap_row[0]) if snap_row else 0
    last = _last_snapshot(con, state)
    since = max(int(state.get("rollup_watermark_ns", 0)) - 2 * NS_PER_MIN, raw_before, 0)
    done: dict[str, int] = {}
    for rollup, (raw, select) in _ROLLUP_SELECT.items():
        _dirty_minutes(con, raw, since, cutoff, raw_before, (last, snapshot))
        con.execute(f"DELETE FROM {rollup} WHERE minute_ns IN (SELECT minute_ns FROM _dirty)")
        got = con.execute(f"INSERT INTO {rollup} {select}").fetchone()
        done[rollup] = int(got[0]) if got else 0
    for table in (*_RAW_TABLES, "ingest_errors"):  # refused inputs are kept as long as raw rows
        done[f"deleted_{table}"] = _delete_before(con, table, "ts_ns", raw_before)
    for table in _ROLLUP_TABLES:
        done[f"deleted_{table}"] = _delete_before(
            con, table, "minute_ns", now_ns - int(retention.rollup_s * 1e9)
        )
    con.execute("DELETE FROM ioe_state WHERE key IN ('rollup_watermark_ns', 'rollup_snapshot')")
    con.execute(
        "INSERT INTO ioe_state VALUES ('rollup_watermark_ns', ?), ('rollup_snapshot', ?)", [cutoff, snapshot]
    )
    return done


def _dirty_minutes(
    con: duckdb.DuckDBPyConnection, raw: str, since: int, cutoff: int, floor: int, snapshots: tuple[int, int]
) -> None:
    """Temp table ``_dirty``: the minutes of ``raw`` to recompute (see :func:`_rollup_pass`)."""
    late = (
        f"UNION SELECT {_MINUTE} FROM ducklake_table_insertions('{LAKE}', 'main', '{raw}', {snapshots[0]}, "
        f"{snapshots[1]}) WHERE ts_ns >= {floor} AND ts_ns < {cutoff}"
        if snapshots[0]
        else ""
    )
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE _dirty AS SELECT DISTINCT {_MINUTE} AS minute_ns FROM {raw} "
        f"WHERE ts_ns >= {since} AND ts_ns < {cutoff} {late}"
    )


def _last_snapshot(con: duckdb.DuckDBPyConnection, state: dict[str, int]) -> int:
    """The snapshot the last pass saw, or 0 when there is none or it has expired since."""
    last = int(state.get("rollup_snapshot", 0))
    if not last:
        return 0
    row = con.execute(f"SELECT count(*) FROM {LAKE}.snapshots() WHERE snapshot_id = ?", [last]).fetchone()
    if not row or not row[0]:
        log.warning(
            "lake snapshot %d of the last rollup pass has expired: late rows before it are not re-rolled",
            last,
        )
        return 0
    return last


def _delete_before(con: duckdb.DuckDBPyConnection, table: str, column: str, before_ns: int) -> int:
    got = con.execute(f"DELETE FROM {table} WHERE {column} < ?", [before_ns]).fetchone()
    return int(got[0]) if got else 0


# -- factory ------------------------------------------------------------------------------------
def lake_config(settings: Settings, **overrides: Any) -> LakeConfig:
    """The :class:`LakeConfig` of ``settings``; refuses a lake setting that is missing."""
    missing = [
        f for f in ("lake_catalog_dsn", "lake_data_path", "lake_spool_dir") if not getattr(settings, f)
    ]
    if missing:
        raise LakeError(f"store_backend 'ducklake' needs settings {missing} (IOE_{missing[0].upper()})")
    return LakeConfig(
        catalog_dsn=settings.lake_catalog_dsn,
        data_path=settings.lake_data_path,
        spool_dir=settings.lake_spool_dir,
        commit_interval_s=settings.lake_commit_interval_s,
        **overrides,
    )


def open_store(settings: Settings, *, read_only: bool = False) -> Store | LakeStore:
    """The store ``settings.store_backend`` names: the embedded DuckDB file or the lake."""
    retention = Retention(raw_s=settings.raw_retention_s, rollup_s=settings.rollup_retention_s)
    if settings.store_backend == "ducklake":
        return LakeStore(lake_config(settings), retention=retention)
    return Store(settings.store_path, read_only=read_only)
