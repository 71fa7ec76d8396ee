"""The analyses the API serves, as plain functions over a store cursor (no HTTP, no I/O but the
connection): every query and rule the API, page and ``/metrics`` need lives here, below ``api/``.

Each function calls the analyzer and reshapes its output for the wire; the only new rules are
the series downsampling and the window of collective records:

  1. A chart series has at most ``points`` bins: ``bin = max(window / points, 1 s)``, each bin
     the mean (and min/max) over the deployment's GPUs of the samples in ``(start + k·bin,
     start + (k+1)·bin]``. Windows longer than :data:`RAW_WINDOW_MAX_S` read the 1-minute
     rollups (``*_1m``) instead of raw samples.
  2. Collective records belong to a deployment through its communicators; a record is in the
     window when its start (or dump) time in epoch µs is. Records on a trace-relative clock
     (Kineto, < :data:`EPOCH_US_MIN`) have no wall time and are always included.
  3. Stragglers and their heat map come from :mod:`analyzer.stragglers` over those records
     (share of the window's blame per rank and ``window_s`` slice).
  4. The plan runs :mod:`analyzer.planner` for the deployment's model, GPU, size and measured
     workload (``request_spans``), and compares with its current layout.
  5. The window's load points (the envelope plot's dots) use rule 1's bins. Per engine and bin:
     mean running requests and mean ``generation_tokens_total`` rate (the per-scrape rate, so a
     bin holding one scrape and a bin holding two read alike); a bin counts only when every engine
     seen in the window has both there. A counter's first sample has no rate, so the warm-up bin
     of an engine that starts inside the window is left out instead of reading as zero
     throughput. ITL p99 per bin is the bucket estimate of :func:`binned_quantiles`. Windows
     longer than :data:`RAW_WINDOW_MAX_S` read the per-minute rollups (mean gauge, mean rate).
  6. A latency chart point is the quantile of the bucket increases over the trailing
     ``max(bin, LATENCY_SPAN_S)`` ending at its bin (PromQL's ``histogram_quantile`` over
     ``rate(…[1m])`` does the same): a 7.5 s bin holding a few long prefill-stalled steps would
     otherwise swing the p50 between 20 ms and 600 ms from one bin to the next. A bin with no
     increase of its own stays empty (a gap), never filled from its neighbours.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import duckdb
import polars as pl

from analyzer import stragglers as strag
from analyzer.collectives import rank_waits, summary
from analyzer.crossover import history_bins
from analyzer.deployments import ENGINE_KEY_SQL, Deployment, list_deployments
from analyzer.latency import binned_quantiles, bucket_increases, quantiles_from_increases, window_quantiles
from analyzer.phases import request_phases
from analyzer.report import deployment_report, expected_segments_for, plan_for_deployment
from analyzer.thresholds import Thresholds

NS = 1_000_000_000
RAW_WINDOW_MAX_S = 6 * 3600.0
EPOCH_US_MIN = 1e15  # 2001-09-09 in µs: smaller start times are trace-relative
GPU_METRICS = ("sm_active_ratio", "tensor_active_ratio", "dram_active_ratio", "gpu_util_ratio")
LINK_METRICS = (
    "nvlink_tx_bytes_per_s",
    "nvlink_rx_bytes_per_s",
    "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s",
)
LATENCY_QS = (0.5, 0.9, 0.99)
LOAD_POINTS = 120
ENGINE_1M = (  # the per-minute rollup shaped like engine_samples (a minute stamped at its end)
    "(SELECT minute_ns + 60000000000 AS ts_ns, source, engine, dp_rank, concept, avg AS value,"
    " avg_rate_per_s AS rate_per_s FROM engine_samples_1m) AS engine_samples"
)
LATENCY_SPAN_S = 60.0


def deployments(con: duckdb.DuckDBPyConnection) -> list[Deployment]:
    return list_deployments(con)


def sources_health(con: duckdb.DuckDBPyConnection, dep: Deployment) -> list[dict[str, Any]]:
    """``targets`` rows of the deployment's engine sources and of its nodes."""
    sources = sorted({k.split("|", 1)[0] for k in dep.engine_keys})
    return targets(con, names=sources, hosts=list(dep.nodes))


def targets(
    con: duckdb.DuckDBPyConnection, *, names: list[str] | None = None, hosts: list[str] | None = None
) -> list[dict[str, Any]]:
    where, params = "", []
    if names is not None or hosts is not None:
        where = "WHERE list_contains(?, target) OR list_contains(?, host)"
        params = [names or [], hosts or []]
    cur = con.execute(f"SELECT * FROM targets {where} ORDER BY target", params)
    cols = [c[0] for c in cur.description or []]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def envelope(
    con: duckdb.DuckDBPyConnection,
    dep: Deployment,
    start_ns: int,
    end_ns: int,
    th: Thresholds | None = None,
    history_s: float = 86400.0,
) -> dict[str, Any]:
    """The analyzer's one front door (:func:`analyzer.report.deployment_report`: zone, evidence,
    Cp, headroom, regressions) under the app's analysis settings, plus the load curve."""
    th = th or Thresholds()
    report = deployment_report(con, dep, start_ns, end_ns, th, history_s=history_s)
    report["load_curve"] = load_curve(con, dep, max(end_ns - int(history_s * NS), 0), end_ns, th)
    report["load_points"] = window_load(con, dep, start_ns, end_ns, LOAD_POINTS)
    report["window"] = {"start_ns": start_ns, "end_ns": end_ns, "seconds": (end_ns - start_ns) / NS}
    report["computed_at_s"] = time.time()
    return report


def load_curve(
    con: duckdb.DuckDBPyConnection, dep: Deployment, start_ns: int, end_ns: int, th: Thresholds
) -> list[dict[str, float | None]]:
    """The points Cp is fitted on (:func:`history_bins`: per-minute rollups over long history):
    per ``bin_s`` bin, running requests vs tokens/s per GPU and ITL p99."""
    bins = history_bins(con, dep, start_ns, end_ns, th)
    gpus = max(dep.n_gpus, 1)
    itl = bins["itl_p99_s"].to_list() if "itl_p99_s" in bins.columns else [None] * bins.height
    return [
        {"concurrency": float(r), "tokens_per_s_per_gpu": float(t) / gpus, "itl_p99_s": _num(i)}
        for r, t, i in zip(bins["running"].to_list(), bins["tokens_per_s"].to_list(), itl, strict=True)
    ]


def _num(v: Any) -> float | None:
    return None if v is None or v != v else float(v)  # NaN != NaN


def window_load(
    con: duckdb.DuckDBPyConnection, dep: Deployment, start_ns: int, end_ns: int, points: int
) -> list[dict[str, Any]]:
    """Rule 5: ``[{bin_start_ns, concurrency, tokens_per_s_per_gpu, itl_p99_s}]`` per complete bin."""
    window_s = (end_ns - start_ns) / NS
    bin_s = bin_seconds(window_s, points)
    bin_ns = int(bin_s * NS)
    rollup = window_s > RAW_WINDOW_MAX_S
    table = ENGINE_1M if rollup else "engine_samples"
    rows = con.execute(
        f"""WITH per_engine AS (
               SELECT CAST((ts_ns - ? - 1) // ? AS BIGINT) AS b, {ENGINE_KEY_SQL} AS k,
                      avg(value) FILTER (WHERE concept = 'requests_running') AS running,
                      avg(rate_per_s) FILTER (WHERE concept = 'generation_tokens_total') AS tok_s
               FROM {table} WHERE ts_ns > ? AND ts_ns <= ?
                 AND concept IN ('requests_running', 'generation_tokens_total')
                 AND list_contains(?, {ENGINE_KEY_SQL}) GROUP BY ALL)
           SELECT b, sum(running) AS running, sum(tok_s) AS tok_s,
                  count(running) AS n_run, count(tok_s) AS n_tok,
                  (SELECT count(DISTINCT k) FROM per_engine) AS engines
           FROM per_engine GROUP BY b ORDER BY b""",
        [start_ns, bin_ns, start_ns, end_ns, list(dep.engine_keys)],
    ).fetchall()
    itl = binned_quantiles(
        con, start_ns, end_ns, bin_s, keys=list(dep.engine_keys), concepts=("itl_seconds",), qs=(0.99,),
        rollup=rollup,
    )  # fmt: skip
    itl_by_bin = dict(zip(itl["bin"].to_list(), itl["value_s"].to_list(), strict=True))
    gpus = max(dep.n_gpus, 1)
    return [
        {
            "bin_start_ns": start_ns + int(b) * bin_ns,
            "concurrency": float(run),
            "tokens_per_s_per_gpu": float(tok) / gpus,
            "itl_p99_s": _num(itl_by_bin.get(b)),
        }
        for b, run, tok, n_run, n_tok, engines in rows
        if n_run == engines and n_tok == engines
    ]


def bin_seconds(window_s: float, points: int) -> float:
    """Rule 1's bin width."""
    return max(window_s / max(points, 1), 1.0)


def latency(
    con: duckdb.DuckDBPyConnection, dep: Deployment, start_ns: int, end_ns: int, points: int
) -> dict[str, Any]:
    """Window quantiles of every histogram and TTFT/ITL p50/p99 per bin (bucket estimates)."""
    keys = list(dep.engine_keys)
    wq = window_quantiles(con, start_ns, end_ns, keys=keys, qs=LATENCY_QS)
    bin_s = bin_seconds((end_ns - start_ns) / NS, points)
    span = max(round(LATENCY_SPAN_S / bin_s), 1)
    series = trailing_quantiles(con, start_ns, end_ns, bin_s, span, keys, ("ttft_seconds", "itl_seconds"))
    return {
        "quantiles": [q.as_dict() for d in wq.values() for q in d.values()],
        "bin_s": bin_s,
        "span_s": span * bin_s,
        "series": sorted(series, key=lambda r: (r["concept"], r["q"], r["bin"])),
        "computed_at_s": time.time(),
    }


def trailing_quantiles(
    con: duckdb.DuckDBPyConnection,
    start_ns: int,
    end_ns: int,
    bin_s: float,
    span: int,
    keys: list[str] | None,
    concepts: tuple[str, ...],
    qs: tuple[float, ...] = (0.5, 0.99),
) -> list[dict[str, Any]]:
    """Rule 6: ``[{concept, bin, bin_start_ns, q, value_s, observations}]`` per bin that has data,
    each over the bucket increases of that bin and the ``span − 1`` bins before it."""
    inc = bucket_increases(con, start_ns, end_ns, keys=keys, concepts=concepts, bin_s=bin_s)
    if inc.is_empty():
        return []
    own = inc.group_by(["concept", "bin"]).agg(pl.col("count").sum().alias("own")).filter(pl.col("own") > 0)
    merged = (
        pl.concat([inc.with_columns(pl.col("bin") + k) for k in range(span)])
        .group_by(["concept", "bin", "le"])
        .agg(pl.col("count").sum())
        .join(own.select("concept", "bin"), on=["concept", "bin"], how="semi")
    )
    got = quantiles_from_increases(merged, qs)
    return [
        {"concept": c, "bin": b, "bin_start_ns": start_ns + int(b * bin_s * NS), "q": x.q,
         "value_s": x.value_s, "observations": x.observations}
        for (c, b), qlist in sorted(got.items())
        for x in sorted(qlist, key=lambda x: x.q)
    ]  # fmt: skip


def phases(con: duckdb.DuckDBPyConnection, dep: Deployment, start_ns: int, end_ns: int) -> dict[str, Any]:
    """Request phases and the TTFT decomposition (:func:`analyzer.phases.request_phases`): exact
    quantiles from spans, bucket estimates where the deployment sends none, each labelled."""
    got = request_phases(con, dep, start_ns, end_ns).to_dict()
    got.pop("deployment", None)
    got["computed_at_s"] = time.time()
    return got


def gpu_series(
    con: duckdb.DuckDBPyConnection,
    dep: Deployment,
    start_ns: int,
    end_ns: int,
    points: int,
    metrics: tuple[str, ...] = GPU_METRICS,
) -> dict[str, Any]:
    """Rule 1 over ``gpu_samples``: ``[metric, bin_start_ns, mean, min, max]`` per bin."""
    window_s = (end_ns - start_ns) / NS
    bin_s = bin_seconds(window_s, points)
    raw = window_s <= RAW_WINDOW_MAX_S
    table, ts, value = ("gpu_samples", "ts_ns", "value") if raw else ("gpu_samples_1m", "minute_ns", "avg")
    bin_ns = int(bin_s * NS)
    rows = con.execute(
        f"""SELECT metric, ? + b * ? AS bin_start_ns, avg(v) AS mean, min(v) AS min, max(v) AS max FROM (
                SELECT metric, ({ts} - ? - 1) // ? AS b, {ts} AS t, sum({value}) AS v
                FROM {table} WHERE {ts} > ? AND {ts} <= ? AND list_contains(?, uuid)
                  AND list_contains(?, metric) GROUP BY metric, b, t, uuid)
            GROUP BY metric, b ORDER BY metric, b""",
        [start_ns, bin_ns, start_ns, bin_ns, start_ns, end_ns, list(dep.gpu_uuids), list(metrics)],
    ).pl()
    return {"bin_s": bin_s, "source": table, "gpus": dep.n_gpus, "series": rows.to_dicts()}


def fabric_series(
    con: duckdb.DuckDBPyConnection, dep: Deployment, start_ns: int, end_ns: int, points: int
) -> dict[str, Any]:
    """NVLink/PCIe bytes/s per GPU (rule 1) and InfiniBand/RoCE port bytes/s summed per node."""
    links = gpu_series(con, dep, start_ns, end_ns, points, LINK_METRICS)
    bin_ns = int(links["bin_s"] * NS)
    ports = con.execute(
        """SELECT metric, ? + b * ? AS bin_start_ns, avg(v) AS mean, min(v) AS min, max(v) AS max FROM (
               SELECT metric, (ts_ns - ? - 1) // ? AS b, ts_ns, sum(rate_per_s) AS v FROM fabric_samples
               WHERE ts_ns > ? AND ts_ns <= ? AND list_contains(?, host)
                 AND metric IN ('tx_bytes', 'rx_bytes') AND rate_per_s IS NOT NULL
               GROUP BY metric, b, ts_ns)
           GROUP BY metric, b ORDER BY metric, b""",
        [start_ns, bin_ns, start_ns, bin_ns, start_ns, end_ns, list(dep.nodes)],
    ).pl()
    return {"bin_s": links["bin_s"], "links": links["series"], "ports": ports.to_dicts()}


def collective_records(
    con: duckdb.DuckDBPyConnection, dep: Deployment, start_ns: int, end_ns: int
) -> pl.DataFrame:
    """Rule 2: the deployment's collective records in the window."""
    rel = con.execute(
        """SELECT origin, comm_id, coll_sn, rank, op, host, pid, n_ranks, msg_bytes, exec_us, busbw_gbs,
                  start_us, stop_us, coalesce(start_us, dump_ts_us) AS t_us
           FROM collective_records WHERE list_contains(?, comm_id)
             AND (coalesce(start_us, dump_ts_us) < ? OR
                  (coalesce(start_us, dump_ts_us) > ? AND coalesce(start_us, dump_ts_us) <= ?))""",
        [list(dep.comm_ids), EPOCH_US_MIN, start_ns / 1000, end_ns / 1000],
    )
    return pl.from_arrow(rel.to_arrow_table())  # type: ignore[return-value]


def collectives(
    con: duckdb.DuckDBPyConnection, dep: Deployment, start_ns: int, end_ns: int
) -> dict[str, Any]:
    """Per communicator/op: time, wait vs transfer split, busbw, jitter (:func:`summary`)."""
    records = collective_records(con, dep, start_ns, end_ns)
    if records.height == 0:
        return {"records": 0, "summary": []}
    return {"records": records.height, "summary": summary(records).drop("window").to_dicts()}


def stragglers(
    con: duckdb.DuckDBPyConnection, dep: Deployment, start_ns: int, end_ns: int, window_s: float
) -> dict[str, Any]:
    """Rule 3: flagged ranks with root causes, and the rank × time blame-share heat map (a TP2
    pair is backed by the performance model's segment for the deployment, when it has one)."""
    th = strag.Thresholds(window_s=window_s)
    records = collective_records(con, dep, start_ns, end_ns)
    out: dict[str, Any] = {"thresholds": asdict(th), "stragglers": [], "heatmap": []}
    expected = expected_segments_for(con, dep, start_ns, end_ns) if records.height else {}
    for (origin, _comm), part in records.group_by(["origin", "comm_id"], maintain_order=True):
        # ranks are numbered per communicator: each is judged and mapped within it
        for found in strag.judge(con, part, str(origin), None, th, expected):
            out["stragglers"].append({"origin": str(origin), **found})
        waits = rank_waits(part)
        if waits.height:
            heat = strag.blame_by_window(waits, window_s * 1e6).with_columns(
                (pl.col("window") * int(window_s * 1e9)).alias("window_start_ns"),
                pl.lit(str(origin)).alias("origin"),
            )
            out["heatmap"] += heat.select("origin", "window_start_ns", "rank", "share", "blame_us").to_dicts()
    return out


def plan(
    con: duckdb.DuckDBPyConnection, dep: Deployment, ttft_slo_s: float, tpot_slo_s: float, top: int
) -> dict[str, Any]:
    """Rule 4 (:func:`analyzer.report.plan_for_deployment`); ``ValueError``/``KeyError`` when the
    deployment lacks a model, GPU or workload."""
    got = plan_for_deployment(con, dep.name, ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s, top=top)
    prob = got["problem"]
    return {
        "model": prob["model"], "gpu": prob["gpu"], "gpus": prob["gpus"], "nodes": prob["nodes"],
        "fabric": prob["fabric"], "workload": got["workload"], "candidates": got["candidates"],
        "current": got["baseline"], "change": got["verdict"],
    }  # fmt: skip
