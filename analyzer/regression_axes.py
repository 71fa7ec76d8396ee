"""The axes a p99 regression is blamed on, measured per time bin (rules 5-6 of :mod:`analyzer.regression`).

Shape: ``axis_parts(con, dep, lo, hi, bin_s, sources)`` → ``{axis: Parts}``, where ``Parts`` holds
per bin ``k`` (bins ``(lo + k·bin, lo + (k+1)·bin]``) a numerator and a denominator, so that a bin's
value is ``num / den`` and an interval's value is ``Σ num / Σ den`` over its bins (a rate over a
longer interval, a mean over more samples: the same arithmetic, exact at every scale).

Axes and what each reads:

- ``load``: ARRIVAL RATE, requests/s. From spans, the requests whose span starts (the request
  arrives) in the bin; else from a request counter's increase: ``request_success_total``,
  ``e2e_seconds_count`` or ``ttft_seconds_count`` (completions or first tokens per second, which
  equal arrivals when the deployment keeps up). Never ``requests_running``: by Little's law
  running = arrival rate × latency, so it rises *because* latency rose and would blame load for
  every regression.
- ``context_length``: prompt tokens per request. Spans' ``input_tokens``; else the
  ``request_prompt_tokens`` histogram's ``_sum`` / ``_count``; else ``prompt_tokens_total`` over
  the load counter's requests.
- ``kv_pressure``: mean KV-cache usage (0..1) over the deployment's engines' samples.
- ``fabric_bytes``: NVLink + PCIe bytes/s summed over the deployment's GPUs, mean over samples.
- ``clocks``: mean SM clock (MHz) over the deployment's GPUs. For a selection of 1,000 series or
  more, both take the span's final minutes from the GPU rollup (analyzer.rolled_minutes rule
  12: the same sample times and counts, sums within the rollup's rounding).
- ``straggler_share``: the part of all collective wait in the deployment's communicators that
  one rank causes (the last to arrive at an instance is charged its peers' waits; see
  :mod:`analyzer.collectives`); the rank is the one blamed most in the analysed window, followed
  on both sides, so that a balanced group reads about ``1/n`` throughout.

A source is chosen once per analysis (:func:`choose_sources`), the first in the order above that
has data on both sides of the comparison, so before and after are measured alike.

Known limit: engines send a request's span when it finishes, so a request that arrived near the
end of the window and is still running is not counted yet: the last ``e2e`` seconds of the window
read low. Over a window many times the request latency this is a small part; the counters have
the mirror limit (a completion is counted one latency after its arrival).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import polars as pl

from analyzer.collectives import rank_waits
from analyzer.crossover import rolled_gauges
from analyzer.deployments import ENGINE_KEY_SQL, IN_TEXTS, Deployment, texts
from analyzer.latency import NS, counter_increases, in_shared_reads, reads_points, rollup_for, table_sql
from analyzer.planner import span_filter
from analyzer.point_bins import binned_points, exact_sum, exact_total
from analyzer.rolled_minutes import link_clock_with_minutes
from collector.series import times_name

AXES = ("load", "context_length", "kv_pressure", "fabric_bytes", "clocks", "straggler_share")
GAUGE_AXES = ("kv_pressure", "fabric_bytes", "clocks")  # sums and counts of samples per bin: additive
LOAD_COUNTERS = ("request_success_total", "e2e_seconds_count", "ttft_seconds_count")
MIN_SPANS = 20  # spans on each side before spans are the load and context source
EPOCH_US_MIN = 1e15  # collective start times below this are trace-relative (no wall time)
UNITS = {
    "load": "requests/s",
    "context_length": "prompt tokens/request",
    "kv_pressure": "ratio",
    "fabric_bytes": "bytes/s",
    "clocks": "MHz",
    "straggler_share": "ratio",
}


@dataclass(frozen=True)
class Parts:
    """Per-bin numerator and denominator of one axis (bins without data hold 0 / 0)."""

    num: np.ndarray
    den: np.ndarray
    source: str

    def value(self, first: int, last: int) -> float | None:
        """``Σ num / Σ den`` over bins ``first..last-1``; None without data."""
        d = float(self.den[first:last].sum())
        return float(self.num[first:last].sum()) / d if d > 0 else None

    def per_bin(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.den > 0, self.num / np.where(self.den > 0, self.den, 1.0), np.nan)


@dataclass(frozen=True)
class Sources:
    load: str | None  # "spans" | a counter concept | None
    context: str | None  # "spans" | "request_prompt_tokens" | "prompt_tokens_total" | None
    straggler: tuple[str, int] | None  # (comm_id, rank) followed on both sides


def _bins(lo: int, hi: int, bin_s: float) -> tuple[int, int]:
    bin_ns = max(int(bin_s * NS), 1)
    return bin_ns, max(-(-(hi - lo) // bin_ns), 1)


def _dense(rows: list[tuple[int, float, float]], n: int) -> tuple[np.ndarray, np.ndarray]:
    num, den = np.zeros(n), np.zeros(n)
    for b, x, y in rows:
        if 0 <= int(b) < n and x is not None and y is not None:
            num[int(b)] += float(x)
            den[int(b)] += float(y)
    return num, den


def _span_rows(
    con: duckdb.DuckDBPyConnection, dep: Deployment, lo: int, hi: int, bin_ns: int
) -> list[tuple[int, float, float, float]]:
    """Per bin of span start: requests, prompt tokens, requests with prompt tokens."""
    cond, params = span_filter(con, dep.name, dep.model)
    return con.execute(  # type: ignore[return-value]
        f"""SELECT (start_ns - {int(lo)} - 1) // {int(bin_ns)} AS b, count(DISTINCT trace_id),
                   sum(input_tokens), count(input_tokens)
            FROM request_spans WHERE {cond} AND start_ns > {int(lo)} AND start_ns <= {int(hi)} GROUP BY b""",
        params,
    ).fetchall()


def _span_counts(
    con: duckdb.DuckDBPyConnection, dep: Deployment, sides: tuple[tuple[int, int], ...]
) -> list[tuple[int, int]]:
    """Per side ``(lo, hi]``: requests (distinct traces) and requests with prompt tokens whose span
    starts in it, every side in one read of the spans (sides may overlap: one filter each)."""
    cond, params = span_filter(con, dep.name, dep.model)
    side = [f"start_ns > {int(lo)} AND start_ns <= {int(hi)}" for lo, hi in sides]
    cols = ", ".join(
        f"count(DISTINCT trace_id) FILTER (WHERE {w}), count(input_tokens) FILTER (WHERE {w})" for w in side
    )
    within = " OR ".join(f"({w})" for w in side)
    row = (
        con.execute(f"SELECT {cols} FROM request_spans WHERE {cond} AND ({within})", params).fetchone() or ()
    )
    return [(int(row[2 * i] or 0), int(row[2 * i + 1] or 0)) for i in range(len(sides))]


def _counter_rows(
    con: duckdb.DuckDBPyConnection, dep: Deployment, lo: int, hi: int, bin_s: float, concepts: list[str]
) -> dict[str, dict[int, float]]:
    inc = counter_increases(con, lo, hi, concepts, keys=list(dep.engine_keys), bin_s=bin_s)
    out: dict[str, dict[int, float]] = {}
    for c, b, v in inc.select("concept", "bin", "increase").iter_rows():
        out.setdefault(c, {})[int(b)] = float(v or 0.0)
    return out


def choose_sources(
    con: duckdb.DuckDBPyConnection,
    dep: Deployment,
    sides: tuple[tuple[int, int], tuple[int, int]],
    window: tuple[int, int],
    span: tuple[int, int, float] | None = None,
) -> Sources:
    """The load, context and straggler sources with data on both ``sides`` (module notes).

    Counters are read only where spans do not serve both axes. ``span`` = ``(lo, hi, bin_s)``:
    the span whose per-bin counters :func:`axis_parts` reads next; inside one report
    (:func:`analyzer.latency.shared_reads`) they are read first, so that a side starting where
    the span does is regrouped from them instead of read again (latency rule 10)."""
    spans, counters = _span_counts(con, dep, sides), []
    if not all(a >= MIN_SPANS and b >= MIN_SPANS for a, b in spans):
        if span is not None and in_shared_reads():
            _counter_rows(con, dep, *span, list(LOAD_COUNTERS))
        for lo, hi in sides:
            got = _counter_rows(con, dep, lo, hi, (hi - lo) / NS, [*LOAD_COUNTERS, *_CONTEXT_COUNTERS])
            counters.append({c: sum(v.values()) for c, v in got.items()})
    else:
        counters = [{}, {}]
    load: str | None = None
    if all(n >= MIN_SPANS for n, _ in spans):
        load = "spans"
    else:
        load = next((c for c in LOAD_COUNTERS if all(side.get(c, 0) > 0 for side in counters)), None)
    context: str | None = None
    if all(n >= MIN_SPANS for _, n in spans):
        context = "spans"
    elif all(side.get("request_prompt_tokens_count", 0) > 0 for side in counters):
        context = "request_prompt_tokens"
    elif load not in (None, "spans") and all(side.get("prompt_tokens_total", 0) > 0 for side in counters):
        context = "prompt_tokens_total"
    return Sources(load, context, _most_blamed(con, dep, *window))


_CONTEXT_COUNTERS = ("request_prompt_tokens_sum", "request_prompt_tokens_count", "prompt_tokens_total")


def axis_parts(
    con: duckdb.DuckDBPyConnection,
    dep: Deployment,
    lo: int,
    hi: int,
    bin_s: float,
    src: Sources,
    *,
    gauges: bool = True,
) -> dict[str, Parts]:
    """Every axis with data, per bin of ``(lo, hi]`` (module notes); without the gauge axes
    (:data:`GAUGE_AXES`) unless ``gauges``."""
    bin_ns, n = _bins(lo, hi, bin_s)
    out: dict[str, Parts] = {}
    out.update(_requests(con, dep, lo, hi, bin_s, bin_ns, n, src))
    if gauges:
        out.update(_gauges(con, dep, lo, hi, bin_ns, n))
    if src.straggler is not None:
        num, den = _dense(_blame_rows(con, src.straggler, lo, hi, bin_ns), n)
        if den.sum() > 0:
            out["straggler_share"] = Parts(num, den, f"collectives: rank {src.straggler[1]}")
    return out


def _requests(
    con: duckdb.DuckDBPyConnection,
    dep: Deployment,
    lo: int,
    hi: int,
    bin_s: float,
    bin_ns: int,
    n: int,
    src: Sources,
) -> dict[str, Parts]:
    """``load`` and ``context_length`` from the chosen sources."""
    out: dict[str, Parts] = {}
    seconds = np.full(n, bin_ns / NS)
    if "spans" in (src.load, src.context):
        rows = _span_rows(con, dep, lo, hi, bin_ns)
        if src.load == "spans":
            out["load"] = Parts(_dense([(r[0], r[1], 0.0) for r in rows], n)[0], seconds, "spans")
        if src.context == "spans":
            out["context_length"] = Parts(*_dense([(r[0], r[2], r[3]) for r in rows], n), "spans")
    wanted = [c for c in (src.load, src.context) if c and c != "spans"]
    if not wanted:
        return out
    names = [*wanted, "request_prompt_tokens_sum", "request_prompt_tokens_count"]
    got = _counter_rows(con, dep, lo, hi, bin_s, names)

    def dense(concept: str) -> np.ndarray:
        v = np.zeros(n)
        for b, x in got.get(concept, {}).items():
            if 0 <= b < n:
                v[b] += x
        return v

    if src.load and src.load != "spans":
        out["load"] = Parts(dense(src.load), seconds, src.load)
    if src.context == "request_prompt_tokens":
        out["context_length"] = Parts(
            dense("request_prompt_tokens_sum"), dense("request_prompt_tokens_count"), "request_prompt_tokens"
        )
    elif src.context == "prompt_tokens_total" and src.load:
        out["context_length"] = Parts(
            dense("prompt_tokens_total"), dense(src.load), f"prompt_tokens_total / {src.load}"
        )
    return out


def _gauges(
    con: duckdb.DuckDBPyConnection, dep: Deployment, lo: int, hi: int, bin_ns: int, n: int
) -> dict[str, Parts]:
    """``kv_pressure`` (engine samples), ``fabric_bytes`` and ``clocks`` (GPU samples)."""
    out: dict[str, Parts] = {}
    rollup = rollup_for(con, lo, hi, bin_ns / NS)  # latency rule 6: long spans read the minute means
    num, den = _dense(_kv_rows(con, dep, lo, hi, bin_ns, rollup), n)
    if den.sum() > 0:
        out["kv_pressure"] = Parts(num, den, "kv_usage_ratio")
    gpu = _gpu_rows(con, dep, lo, hi, bin_ns, rollup)
    for axis, i, source in (("fabric_bytes", 1, "nvlink+pcie bytes/s"), ("clocks", 3, "sm_clock_mhz")):
        num, den = _dense([(r[0], r[i] or 0.0, r[i + 1] or 0.0) for r in gpu], n)
        if den.sum() > 0:
            out[axis] = Parts(num, den, source)
    return out


def has_points(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    """Whether ``table``'s raw rows are read from its points table here (latency rule 7: the
    catalog is asked once per report, not once per statement)."""
    return reads_points(con, table)


_SUM = exact_sum("value")  # exact (analyzer.point_bins.exact_sum): the same in any order


def _kv_rows(
    con: duckdb.DuckDBPyConnection, dep: Deployment, lo: int, hi: int, bin_ns: int, rollup: bool
) -> list[tuple[int, float, float]]:
    """Per bin, the sum and count of the deployment's ``kv_usage_ratio`` samples. On the series
    layout (raw rows) the series are chosen first and only their points read (latency rule 7)."""
    if not rollup and has_points(con, "engine_samples"):  # bins from T_times (analyzer.point_bins)
        bin_of = f"({int(-lo - 1)} + ts_ns) // {int(bin_ns)}"
        points = binned_points("engine_samples", "value", lo, hi, bin_of)
        return con.execute(
            f"""SELECT bin AS b, {_SUM}, count(value) FROM {points} WHERE series_id IN (
                   SELECT series_id FROM engine_samples_series WHERE concept = 'kv_usage_ratio'
                     AND {ENGINE_KEY_SQL} {IN_TEXTS}) GROUP BY b""",
            [texts(dep.engine_keys)],
        ).fetchall()
    source = f"""{table_sql("engine_gauges", rollup, (lo, hi))} WHERE concept = 'kv_usage_ratio'
          AND {ENGINE_KEY_SQL} {IN_TEXTS}"""
    return con.execute(
        f"""SELECT (ts_ns - {int(lo)} - 1) // {int(bin_ns)} AS b, {_SUM}, count(value) FROM {source}
              AND ts_ns > {int(lo)} AND ts_ns <= {int(hi)} GROUP BY b""",
        [texts(dep.engine_keys)],
    ).fetchall()


_LINK = "(metric LIKE 'nvlink_%' OR metric LIKE 'pcie_%') AND metric LIKE '%_bytes_per_s'"
_CLOCK = "metric = 'sm_clock_mhz'"


def _gpu_rows(
    con: duckdb.DuckDBPyConnection, dep: Deployment, lo: int, hi: int, bin_ns: int, rollup: bool
) -> list[tuple[Any, ...]]:
    """Per bin: NVLink + PCIe bytes/s summed and the number of their sample times, SM clock sum
    and count, over the deployment's GPUs. On the series layout (raw rows) only the points of
    those metrics' series are read, their metric class decided once per series; for 1,000
    series or more, the span's final minutes from the GPU rollup (:func:`_rolled_links`,
    analyzer.rolled_minutes rule 12: 512 GPUs' 30 minutes 0.175 -> 0.116-0.126 s, load ~1)."""
    lo, hi, bin_ns = int(lo), int(hi), int(bin_ns)  # SQL literals: a bound number costs a search for pandas
    # exact sums (analyzer.point_bins.exact_sum): the same in any order DuckDB adds them
    link_sum, clock_sum = exact_sum("value", "link"), exact_sum("value", "clock")
    aggregates = f"""{link_sum}, count(DISTINCT ts_ns) FILTER (WHERE link),
                    {clock_sum}, count(value) FILTER (WHERE clock)"""
    if not rollup and has_points(con, "gpu_samples"):
        rolled = _rolled_links(con, dep, (lo, hi, bin_ns))
        if rolled is not None:
            return rolled
        # bins from the timestamps (analyzer.point_bins); the sums of each sample time and class
        # first, so the link sample times are counted as groups, not a DISTINCT over the points:
        # 512 GPUs' 30 minutes (1.8 M points) 0.30 -> 0.15 s (medians of 7, load 3.4)
        points = binned_points("gpu_samples", "value", lo, hi, f"({int(-lo - 1)} + ts_ns) // {int(bin_ns)}")
        sql = f"""
            WITH s AS (
                SELECT series_id, {_LINK} AS link, {_CLOCK} AS clock FROM gpu_samples_series
                WHERE uuid {IN_TEXTS} AND (({_LINK}) OR {_CLOCK})
            )
            SELECT bin AS b, {exact_sum("v", "link")}, count(*) FILTER (WHERE link),
                   {exact_sum("v", "NOT link")}, sum(n) FILTER (WHERE NOT link) FROM (
                SELECT bin, ts_ns, link, {exact_sum("value")} AS v, count(value) AS n
                FROM {points} JOIN s USING (series_id) GROUP BY bin, ts_ns, link
            ) GROUP BY b"""
        return con.execute(sql, [texts(dep.gpu_uuids)]).fetchall()
    sql = f"""
        SELECT (ts_ns - {lo} - 1) // {bin_ns} AS b, {aggregates}
        FROM (SELECT ts_ns, value, {_LINK} AS link, {_CLOCK} AS clock
              FROM {table_sql("gpu_samples", rollup, (lo, hi))}
              WHERE ts_ns > {lo} AND ts_ns <= {hi} AND uuid {IN_TEXTS}) GROUP BY b"""
    return con.execute(sql, [texts(dep.gpu_uuids)]).fetchall()


_SELECTED = f"uuid {IN_TEXTS} AND (({_LINK}) OR {_CLOCK})"


def _rolled_links(
    con: duckdb.DuckDBPyConnection, dep: Deployment, window: tuple[int, int, int]
) -> list[tuple[Any, ...]] | None:
    """:func:`_gpu_rows` with the span's final minutes from the GPU rollup (analyzer.rolled_minutes
    rule 12), or None where rules 7 and 9-10 keep the points alone (too few series, no final
    minutes that fit the bins, no point kept before them, a NULL value in them)."""
    ids = texts(dep.gpu_uuids)
    used = rolled_gauges(con, "gpu_samples", _SELECTED, ids, window)
    if used is None:
        return None
    lo, hi, _ = window
    row = con.execute(
        f"SELECT min(tix), max(tix) FROM {times_name('gpu_samples')} WHERE ts_ns > {lo} AND ts_ns <= {hi}"
    ).fetchone()
    tix = (int(row[0]), int(row[1])) if row and row[0] is not None else (0, -1)
    sql = link_clock_with_minutes(_SELECTED, f"({_LINK})", window, used, tix)
    return con.execute(sql, [ids, ids]).fetchall()


def _waits(con: duckdb.DuckDBPyConnection, comm_ids: list[str], lo: int, hi: int) -> pl.DataFrame:
    """Per instance of the communicators' collectives with an epoch time in ``(lo, hi]``: its time
    (earliest start, else dump time), culprit and blame (the sum of its ranks' waits)."""
    rel = con.execute(
        """SELECT origin, comm_id, coll_sn, rank, exec_us, start_us, stop_us,
                  coalesce(start_us, dump_ts_us) AS t_us
           FROM collective_records WHERE list_contains(?, comm_id)
             AND coalesce(start_us, dump_ts_us) >= ? AND coalesce(start_us, dump_ts_us) > ?
             AND coalesce(start_us, dump_ts_us) <= ?""",
        [comm_ids, EPOCH_US_MIN, lo / 1000, hi / 1000],
    )
    records: pl.DataFrame = pl.from_arrow(rel.to_arrow_table())  # type: ignore[assignment]
    if records.height == 0:
        return pl.DataFrame()
    waits = rank_waits(records)
    if waits.height == 0:
        return pl.DataFrame()
    return waits.group_by(["origin", "comm_id", "coll_sn"]).agg(
        pl.col("t_us").min(), pl.col("last_rank").first(), exact_total(pl.col("wait_us")).alias("blame_us")
    )


def _most_blamed(con: duckdb.DuckDBPyConnection, dep: Deployment, lo: int, hi: int) -> tuple[str, int] | None:
    """The (communicator, rank) charged the most wait in ``(lo, hi]``, or None."""
    if not dep.comm_ids:
        return None
    inst = _waits(con, list(dep.comm_ids), lo, hi)
    if inst.height == 0:
        return None
    top = (
        inst.group_by(["comm_id", "last_rank"])
        .agg(exact_total(pl.col("blame_us")))
        .sort("blame_us", descending=True)
    )
    if not top.height or not (top["blame_us"][0] or 0) > 0:
        return None
    return str(top["comm_id"][0]), int(top["last_rank"][0])


def _blame_rows(
    con: duckdb.DuckDBPyConnection, target: tuple[str, int], lo: int, hi: int, bin_ns: int
) -> list[tuple[int, float, float]]:
    """Per bin: blame charged to ``target``'s rank, all blame of its communicator."""
    inst = _waits(con, [target[0]], lo, hi)
    if inst.height == 0:
        return []
    binned = inst.with_columns(((pl.col("t_us") * 1000 - lo - 1) // bin_ns).cast(pl.Int64).alias("b"))
    agg = binned.group_by("b").agg(
        exact_total(pl.col("blame_us").filter(pl.col("last_rank") == target[1])).alias("mine"),
        exact_total(pl.col("blame_us")).alias("all"),
    )
    return [
        (int(b), float(m or 0.0), float(a or 0.0)) for b, m, a in agg.select("b", "mine", "all").iter_rows()
    ]
