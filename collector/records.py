"""Every record type that flows through IOE, defined once.

Each table is a list of typed columns plus its natural key. Units live in column names
(``ts_ns``, ``exec_us``, ``bytes_per_s``); conversions happen once, in the parsers, so every
row in the store is already in base units (ratios 0..1, bytes, bytes/s, W, J, °C, MHz, s).

Parsers build frames with :func:`frame`; the store creates tables from :data:`TABLES` and is
the only thing that writes them. Identity columns that take part in a natural key are never
NULL: unknown text is ``''`` and an unknown rank or index is ``-1``.

Canonical GPU metric names (``gpu_samples.metric``) end in their unit:
``*_ratio`` (0..1), ``*_bytes``, ``*_bytes_per_s``, ``*_w``, ``*_j``, ``*_c``, ``*_mhz``,
``*_s``, ``*_total`` (a count) or ``*_mask`` / ``*_last`` (codes, not quantities).
Canonical engine concepts (``engine_samples.concept``) are listed in
:mod:`collector.formats.engine`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from collector.batch import Batch

if TYPE_CHECKING:
    import polars as pl

# DuckDB type -> the polars dtype's name (polars is imported only where a frame is built: the
# collector's hot path moves Batch objects and never loads it).
_POLARS = {
    "BIGINT": "Int64",
    "INTEGER": "Int32",
    "DOUBLE": "Float64",
    "VARCHAR": "Utf8",
    "BOOLEAN": "Boolean",
}
# A natural-key column left out by a parser: unknown text is '', an unknown rank or index -1.
_KEY_DEFAULT: dict[str, Any] = {"VARCHAR": "", "BOOLEAN": False}


@dataclass(frozen=True)
class Table:
    """A table of the store: ordered ``(column, duckdb_type)`` pairs and its natural key."""

    name: str
    columns: tuple[tuple[str, str], ...]
    key: tuple[str, ...]
    doc: str = ""
    defaults: dict[str, Any] = field(default_factory=dict)
    # False for the raw sample tables: their key is kept unique by the store's insert (an
    # anti-join), not by a PRIMARY KEY index, which was ~77 % of a store file (collector.store).
    indexed: bool = True
    # The value columns of a raw sample table kept in the series layout of a store file
    # (collector.series); empty for every other table.
    values: tuple[str, ...] = ()
    # Columns that refuse NULL besides the key's (a series table keeps its raw table's key
    # columns NOT NULL though its own key is series_id).
    not_null: tuple[str, ...] = ()
    # The value column of a raw table holding cumulative counters: its points also keep the
    # reset-aware increase since the previous point of their series (``INCREASE``,
    # collector.increases), so a window's increase is a plain sum. Empty for other tables.
    counter: str = ""

    @property
    def column_names(self) -> list[str]:
        return [c for c, _ in self.columns]

    @property
    def series_columns(self) -> tuple[str, ...]:
        """The descriptive columns of a series-layout table: all but ``ts_ns`` and the values."""
        return tuple(c for c, _ in self.columns if c != "ts_ns" and c not in self.values)

    def polars_schema(self) -> dict[str, Any]:
        import polars as pl

        return {c: getattr(pl, _POLARS[t]) for c, t in self.columns}

    def ddl(self) -> str:
        required = (*self.key, *self.not_null)
        cols = ",\n  ".join(f"{c} {t}{' NOT NULL' if c in required else ''}" for c, t in self.columns)
        key = f",\n  PRIMARY KEY ({', '.join(self.key)})" if self.key and self.indexed else ""
        return f"CREATE TABLE IF NOT EXISTS {self.name} (\n  {cols}{key}\n)"


def _t(name: str, doc: str, key: tuple[str, ...], *cols: tuple[str, str]) -> Table:
    return Table(name=name, columns=tuple(cols), key=key, doc=doc)


# Identity columns of an engine series (REFERENCE §2 identity labels).
_ENGINE_ID = (
    ("source", "VARCHAR"),
    ("engine", "VARCHAR"),
    ("model", "VARCHAR"),
    ("dp_rank", "INTEGER"),
    ("tp_rank", "INTEGER"),
    ("pp_rank", "INTEGER"),
    ("ep_rank", "INTEGER"),
    ("concept", "VARCHAR"),
    ("labels", "VARCHAR"),
)
_ENGINE_KEY = tuple(c for c, _ in _ENGINE_ID)

TARGETS = _t(
    "targets",
    "One row per scrape target or source, with its latest health.",
    ("target",),
    ("target", "VARCHAR"),
    ("kind", "VARCHAR"),
    ("url", "VARCHAR"),
    ("host", "VARCHAR"),
    ("up", "BOOLEAN"),
    ("last_scrape_ns", "BIGINT"),
    ("last_duration_s", "DOUBLE"),
    ("last_error", "VARCHAR"),
    ("samples_last", "INTEGER"),
    ("dropped_last", "INTEGER"),
    ("consecutive_failures", "INTEGER"),
    ("updated_ns", "BIGINT"),
)

DEPLOYMENTS = _t(
    "deployments",
    "A named set of engine processes and GPUs with its model and parallel layout.",
    ("name",),
    ("name", "VARCHAR"),
    ("model", "VARCHAR"),
    ("gpu_type", "VARCHAR"),
    ("tp", "INTEGER"),
    ("pp", "INTEGER"),
    ("dp", "INTEGER"),
    ("ep", "INTEGER"),
    ("roles", "VARCHAR"),  # JSON: {"prefill": n, "decode": m} or {}
    ("nodes", "VARCHAR"),  # JSON list of host names
    ("fabric", "VARCHAR"),
    ("engine", "VARCHAR"),
    ("origin", "VARCHAR"),  # 'config' | 'inferred'
    ("spec", "VARCHAR"),  # JSON of the full declaration
    ("updated_ns", "BIGINT"),
)

GPU_SAMPLES = _t(
    "gpu_samples",
    "One GPU counter value at one time, in canonical units (see module docstring).",
    ("ts_ns", "host", "uuid", "metric", "link"),
    ("ts_ns", "BIGINT"),
    ("host", "VARCHAR"),
    ("gpu", "INTEGER"),
    ("uuid", "VARCHAR"),
    ("metric", "VARCHAR"),
    ("link", "INTEGER"),  # NVLink index for per-link fields, -1 otherwise
    ("value", "DOUBLE"),
    ("source", "VARCHAR"),
    ("gpu_model", "VARCHAR"),
    ("pod", "VARCHAR"),
    ("namespace", "VARCHAR"),
    ("container", "VARCHAR"),
    ("mig_profile", "VARCHAR"),
    ("mig_instance", "VARCHAR"),
)

ENGINE_SAMPLES = _t(
    "engine_samples",
    "One serving-engine gauge or counter value; counters carry their per-second rate.",
    ("ts_ns", *_ENGINE_KEY),
    ("ts_ns", "BIGINT"),
    *_ENGINE_ID,
    ("value", "DOUBLE"),
    ("rate_per_s", "DOUBLE"),  # counters only; NULL on the first sample and after a reset
)

HISTOGRAM_BUCKETS = _t(
    "histogram_buckets",
    "Cumulative bucket counts of an engine latency histogram, kept as buckets.",
    ("ts_ns", *_ENGINE_KEY, "le"),
    ("ts_ns", "BIGINT"),
    *_ENGINE_ID,
    ("le", "DOUBLE"),  # upper bound in seconds; +inf for the last bucket
    ("cumulative_count", "DOUBLE"),
)

FABRIC_SAMPLES = _t(
    "fabric_samples",
    "InfiniBand/RoCE port counters: cumulative value and per-second rate, in bytes/packets.",
    ("ts_ns", "host", "device", "port", "metric"),
    ("ts_ns", "BIGINT"),
    ("host", "VARCHAR"),
    ("device", "VARCHAR"),
    ("port", "INTEGER"),
    ("metric", "VARCHAR"),
    ("value", "DOUBLE"),
    ("rate_per_s", "DOUBLE"),
)

REQUEST_SPANS = _t(
    "request_spans",
    "One serving request from an engine's OTLP span; latencies in seconds.",
    ("trace_id", "span_id"),
    ("trace_id", "VARCHAR"),
    ("span_id", "VARCHAR"),
    ("start_ns", "BIGINT"),
    ("end_ns", "BIGINT"),
    ("name", "VARCHAR"),
    ("service", "VARCHAR"),
    ("engine", "VARCHAR"),
    ("model", "VARCHAR"),
    ("dp_rank", "INTEGER"),
    ("role", "VARCHAR"),
    ("request_id", "VARCHAR"),
    ("ttft_s", "DOUBLE"),
    ("queue_s", "DOUBLE"),
    ("prefill_s", "DOUBLE"),
    ("decode_s", "DOUBLE"),
    ("inference_s", "DOUBLE"),
    ("e2e_s", "DOUBLE"),
    ("kv_transfer_s", "DOUBLE"),
    ("input_tokens", "BIGINT"),
    ("output_tokens", "BIGINT"),
    ("cached_tokens", "BIGINT"),
    ("finish_reason", "VARCHAR"),
    ("attributes", "VARCHAR"),  # JSON of attributes not mapped above
)

COLLECTIVE_RECORDS = _t(
    "collective_records",
    "One collective (or P2P op) on one rank, from NCCL Inspector or a kernel trace.",
    ("origin", "comm_id", "coll_sn", "rank", "kind"),
    ("origin", "VARCHAR"),  # 'inspector' | 'kineto:<trace set>'
    ("comm_id", "VARCHAR"),
    ("coll_sn", "BIGINT"),
    ("rank", "INTEGER"),
    ("kind", "VARCHAR"),  # 'coll' | 'p2p'
    ("comm_name", "VARCHAR"),
    ("n_ranks", "INTEGER"),
    ("nnodes", "INTEGER"),
    ("host", "VARCHAR"),
    ("pid", "BIGINT"),
    ("op", "VARCHAR"),
    ("peer", "INTEGER"),
    ("msg_bytes", "BIGINT"),
    ("exec_us", "DOUBLE"),
    ("algbw_gbs", "DOUBLE"),
    ("busbw_gbs", "DOUBLE"),
    ("timing_source", "VARCHAR"),
    ("start_us", "DOUBLE"),  # epoch µs (Inspector verbose) or trace µs (Kineto)
    ("stop_us", "DOUBLE"),
    ("dump_ts_us", "DOUBLE"),
    ("kernel_events", "VARCHAR"),  # JSON list of per-channel kernel timestamps
    ("algo_proto", "VARCHAR"),  # NCCL algorithm_protocol (Inspector textfile's algo_proto label)
    ("msg_bytes_max", "BIGINT"),  # upper end of a bucketed size ("4-5GB"), else = msg_bytes or NULL
)

KERNEL_EVENTS = _t(
    "kernel_events",
    "GPU events (stream != -1) of a Kineto trace after HTA 0.5's preprocessing (µs, rounded inward); "
    "kept / kept_with_last say whether HTA keeps it without / with the last ProfilerStep.",
    ("trace_set", "rank", "stream", "correlation", "ts_us", "name"),
    ("trace_set", "VARCHAR"),
    ("rank", "INTEGER"),
    ("stream", "BIGINT"),
    ("correlation", "BIGINT"),
    ("ts_us", "BIGINT"),
    ("dur_us", "BIGINT"),
    ("name", "VARCHAR"),
    ("cat", "VARCHAR"),
    ("is_comm", "BOOLEAN"),
    ("kernel_type", "VARCHAR"),  # COMMUNICATION | MEMORY | COMPUTATION | OTHER (HTA's rules)
    ("iteration", "BIGINT"),  # ProfilerStep number of the launching CPU op, -1 if none
    ("last_step", "BOOLEAN"),
    ("kept", "BOOLEAN"),  # survives HTA's default filter (last ProfilerStep dropped)
    ("kept_with_last", "BOOLEAN"),  # survives with include_last_profiler_step=True
)

NCCL_BASELINES = _t(
    "nccl_baselines",
    "Measured collective bandwidth (nccl-tests) per op, size, GPU count and placement.",
    ("source", "op", "n_gpus", "size_bytes", "dtype", "in_place"),
    ("source", "VARCHAR"),
    ("host", "VARCHAR"),
    ("op", "VARCHAR"),
    ("n_gpus", "INTEGER"),
    ("size_bytes", "BIGINT"),
    ("count", "BIGINT"),
    ("dtype", "VARCHAR"),
    ("redop", "VARCHAR"),
    ("root", "INTEGER"),
    ("in_place", "BOOLEAN"),
    ("time_us", "DOUBLE"),
    ("algbw_gbs", "DOUBLE"),
    ("busbw_gbs", "DOUBLE"),
    ("wrong", "BIGINT"),
    ("ts_ns", "BIGINT"),
)

INGEST_ERRORS = _t(
    "ingest_errors",
    "Inputs that were refused: where, what, and a quote of the bad part.",
    ("ts_ns", "source", "location"),
    ("ts_ns", "BIGINT"),
    ("source", "VARCHAR"),
    ("location", "VARCHAR"),
    ("message", "VARCHAR"),
)

# 1-minute rollups kept longer than raw samples (see collector.store.Store.maintain).
GPU_SAMPLES_1M = _t(
    "gpu_samples_1m",
    "Per-minute min/max/avg/last of gpu_samples.",
    ("minute_ns", "host", "uuid", "metric", "link"),
    ("minute_ns", "BIGINT"),
    ("host", "VARCHAR"),
    ("gpu", "INTEGER"),
    ("uuid", "VARCHAR"),
    ("metric", "VARCHAR"),
    ("link", "INTEGER"),
    ("n", "BIGINT"),
    ("min", "DOUBLE"),
    ("max", "DOUBLE"),
    ("avg", "DOUBLE"),
    ("last", "DOUBLE"),
)

ENGINE_SAMPLES_1M = _t(
    "engine_samples_1m",
    "Per-minute avg/max/last of engine_samples (last value, mean rate and increase for counters).",
    ("minute_ns", *_ENGINE_KEY),
    ("minute_ns", "BIGINT"),
    *_ENGINE_ID,
    ("n", "BIGINT"),
    ("avg", "DOUBLE"),
    ("max", "DOUBLE"),
    ("last", "DOUBLE"),
    ("avg_rate_per_s", "DOUBLE"),
    # the sum of the minute's point increases (collector.increases): exact across a reset inside
    # the minute; the last column, as ALTER TABLE … ADD COLUMN (schema 6) puts it
    ("increase", "DOUBLE"),
)

HISTOGRAM_BUCKETS_1M = _t(
    "histogram_buckets_1m",
    "Last cumulative bucket count and its increase per minute: any quantile over any whole-minute window.",
    ("minute_ns", *_ENGINE_KEY, "le"),
    ("minute_ns", "BIGINT"),
    *_ENGINE_ID,
    ("le", "DOUBLE"),
    ("cumulative_count", "DOUBLE"),
    ("increase", "DOUBLE"),  # as engine_samples_1m's
)

# Rollups are rewritten a window of minutes at a time (collector.store), so they need no index to
# stay unique: with one (five columns, three of them text) an hour of 8 GPUs' rollups took 1.3 MB.
GPU_SAMPLES_1M = replace(GPU_SAMPLES_1M, indexed=False)
ENGINE_SAMPLES_1M = replace(ENGINE_SAMPLES_1M, indexed=False)
HISTOGRAM_BUCKETS_1M = replace(HISTOGRAM_BUCKETS_1M, indexed=False)

# Raw samples: hundreds of rows a second per node, kept unique without an index (see Table.indexed)
# and, in a store file, as series plus points (collector.series).
GPU_SAMPLES = replace(GPU_SAMPLES, indexed=False, values=("value",))
ENGINE_SAMPLES = replace(ENGINE_SAMPLES, indexed=False, values=("value", "rate_per_s"), counter="value")
HISTOGRAM_BUCKETS = replace(
    HISTOGRAM_BUCKETS, indexed=False, values=("cumulative_count",), counter="cumulative_count"
)
FABRIC_SAMPLES = replace(FABRIC_SAMPLES, indexed=False, values=("value", "rate_per_s"))

TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        TARGETS,
        DEPLOYMENTS,
        GPU_SAMPLES,
        ENGINE_SAMPLES,
        HISTOGRAM_BUCKETS,
        FABRIC_SAMPLES,
        REQUEST_SPANS,
        COLLECTIVE_RECORDS,
        KERNEL_EVENTS,
        NCCL_BASELINES,
        INGEST_ERRORS,
        GPU_SAMPLES_1M,
        ENGINE_SAMPLES_1M,
        HISTOGRAM_BUCKETS_1M,
    )
}

# Tables whose natural key is replaced rather than ignored on a re-send (latest state wins).
REPLACE_TABLES = frozenset({"targets", "deployments"})


def series_name(table: str) -> str:
    return f"{table}_series"


def points_name(table: str) -> str:
    return f"{table}_points"


def series_table(spec: Table) -> Table:
    """``T_series`` of a series-layout table: ``series_id`` and the descriptive columns."""
    cols = tuple((c, t) for c, t in spec.columns if c in spec.series_columns)
    return Table(
        name=series_name(spec.name),
        columns=(("series_id", "BIGINT"), *cols),
        key=("series_id",),
        doc=f"The series of {spec.name}: each description once (collector.series).",
        not_null=tuple(c for c in spec.key if c in spec.series_columns),
        # the store numbers series itself (collector.series rule 2); an index on series_id took
        # three 256 KiB blocks of a store file for 200 series
        indexed=False,
    )


# The points column holding each point's reset-aware increase since the previous point of its
# series (tables with a ``Table.counter``; collector.increases).
INCREASE = "increase"


def point_values(spec: Table) -> tuple[tuple[str, str], ...]:
    """The value columns of a raw table's points: its values, then ``increase`` for a counter table."""
    values = tuple((c, t) for c, t in spec.columns if c in spec.values)
    return (*values, (INCREASE, "DOUBLE")) if spec.counter else values


def points_table(spec: Table) -> Table:
    """``T_points`` of a series-layout table: ``ts_ns``, ``series_id`` and the values (with the
    increase of a counter table), unindexed."""
    values = point_values(spec)
    return Table(
        name=points_name(spec.name),
        columns=(("ts_ns", "BIGINT"), ("series_id", "BIGINT"), *values),
        key=("ts_ns", "series_id"),
        doc=f"The points of {spec.name} (collector.series).",
        indexed=False,
    )


# The physical tables behind the series-layout views of a store file (not in TABLES: readers
# and the DuckLake store see only the logical tables).
LAYOUT_TABLES: dict[str, Table] = {
    t.name: t for spec in TABLES.values() if spec.values for t in (series_table(spec), points_table(spec))
}


def spec_of(name: str) -> Table:
    """The :class:`Table` named ``name``: a store table or a layout table behind one."""
    return TABLES.get(name) or LAYOUT_TABLES[name]


def batch(table: str, rows: Mapping[str, Any] | list[dict[str, Any]]) -> Batch:
    """A :class:`~collector.batch.Batch` with exactly ``table``'s columns, in its order.

    ``rows`` is either columns (lists, or any sized iterable such as a numpy array) or a list of
    row dicts. Missing columns are filled with
    the key-safe default (``''``/``-1``) when they are part of the natural key, else NULL.
    Unknown columns raise ``KeyError`` naming them (a programming error, not bad input).
    """
    spec = TABLES[table]
    if isinstance(rows, list):
        names = list(dict.fromkeys(k for row in rows for k in row))
        cols = {c: [row.get(c) for row in rows] for c in names}
    else:
        cols = dict(rows)
    unknown = set(cols) - set(spec.column_names)
    if unknown:
        raise KeyError(f"{table}: unknown columns {sorted(unknown)}")
    n = max((len(v) for v in cols.values()), default=0)
    short = [c for c, v in cols.items() if len(v) != n]
    if short:
        raise ValueError(f"{table}: columns {short} are shorter than {n} rows")
    data: dict[str, list[Any]] = {}
    for name, duck_type in spec.columns:
        given = cols.get(name)
        if given is not None:
            data[name] = given if isinstance(given, list) else list(given)
        else:
            data[name] = [_KEY_DEFAULT.get(duck_type, -1) if name in spec.key else None] * n
    return Batch(table, data, n)


def frame(table: str, rows: Mapping[str, Any] | list[dict[str, Any]]) -> pl.DataFrame:
    """:func:`batch` as a polars frame with the table's dtypes (for readers, ingest and tests)."""
    return batch(table, rows).to_polars()


def empty(table: str) -> pl.DataFrame:
    """A zero-row frame with ``table``'s schema."""
    import polars as pl

    return pl.DataFrame(schema=TABLES[table].polars_schema())
