"""Envelope zones: which wall a deployment is against in a window, with the evidence.

Input: a DuckDB connection over the store, a :class:`~analyzer.deployments.Deployment`, a window,
:class:`~analyzer.thresholds.Thresholds`, and two optional injected callables (collective
evidence, model-expected latency). Output: a :class:`Verdict` (primary state, secondary zone,
confidence, scores, every signal used as an :class:`Evidence` row, and what was missing).

States: ``compute``, ``hbm_bandwidth``, ``kv_capacity``, ``network`` (the four walls),
``headroom`` (positive evidence of slack), ``saturated`` (requests queue but no wall is
identified) and ``unknown`` (the evidence that would decide is missing, named in ``missing``).

The rule (``th`` = the Thresholds in force; every number below is a field there):
 1. Signals are means over the deployment's own GPUs and engine series: DCGM SM, tensor and
    DRAM activity; engine KV usage, running, waiting; counter rates (preemptions, tokens);
    queue share of TTFT = mean queue time / mean TTFT (``_sum``/``_count`` counters); TTFT/ITL
    quantiles from histogram buckets (bucket estimates, reported as such). On a ramp (the last
    quarter of ``bin_s`` bins runs ≥ ``ramp_min_ratio`` × the first quarter's requests, or its
    KV usage is that many times higher: a pool filling up) the GPU and engine means are taken
    from the first high-load bin (≥ the median bin) on, so a window is judged at the load it
    reached, not diluted by its start (nor by a young store's warm-up).
 2. Each check is ``pass`` (threshold met), ``near`` (within ``near_fraction`` of it), ``fail``,
    or ``n/a`` (its source is missing or the window holds too little variation).
 3. compute: tensor ≥ ``compute_tensor_min_ratio``; SM ≥ ``compute_sm_min_ratio``, which counts
    only while tensors are active (SM_ACTIVE includes warps stalled on memory).
 4. hbm_bandwidth: DRAM ≥ ``hbm_dram_min_ratio``; DRAM/SM ≥ ``hbm_dram_over_sm_min_ratio``;
    tensor < ``hbm_tensor_max_ratio`` — the last two count only while DRAM is busy.
 5. kv_capacity: KV usage ≥ ``kv_usage_min_ratio``; preemptions/s > ``kv_preemptions_min_per_s``;
    waiting/running ≥ ``kv_waiting_min_ratio``; queue share of TTFT ≥ ``kv_queue_share_min_ratio``.
    The two queueing checks count for KV only under KV pressure (usage within ``near_fraction``
    of its threshold, preemptions, or a pool without room for another sequence): queueing alone
    is the symptom of whichever wall binds. Room is reported as ``kv_free_sequences``: per engine,
    running × (1/usage − 1), the average running sequences the free blocks still hold (vLLM admits
    a waiting request only when its blocks can be allocated); below ``kv_free_sequences_max``
    while requests wait, the pool has no room for the next request.
 6. network is judged only when the network is in the critical path (:mod:`analyzer.critical_path`:
    a TP/PP/EP group or a prefill→decode KV transfer that crosses nodes). Otherwise collective
    time is reported as fabric overhead (``info``) and the zone is unjudged. When it is judged:
    level checks — exposed collective share of the crossing communicators ≥
    ``net_collective_share_min_ratio``; GPUs unsaturated (SM and DRAM < ``net_unsaturated_max_ratio``);
    measured mean ITL ÷ the model's ITL for the same batch with the group inside one NVLink
    domain ≥ ``net_single_domain_excess_min_ratio`` (what the network costs each step); for P/D,
    waiting share of TTFT ≥ ``pd_wait_share_min_ratio`` and the spans' KV-transfer share of TTFT ≥
    ``pd_kv_transfer_share_min_ratio``. Change-with-load checks over ``bin_s`` bins (REFERENCE's
    four signals): (a) slope d log ITL p99 / d log running ≥ ``net_latency_slope_min`` while
    unsaturated; (b) p50-p99 gap widening ≥ ``net_gap_widening_min_ratio``; (c) throughput
    elasticity < ``net_throughput_elasticity_max`` while unsaturated — ``n/a`` when running varies
    less than ``net_min_load_spread_ratio``. Slopes are Theil-Sen (median of pairwise slopes), so
    one outlier bin cannot make or break them. busbw/capability, ITL p99/p50 and measured/expected
    ITL are ``info``: latency-bound small messages always sit far below link peak, a saturated
    link sits near it, and chunked prefill alone widens p99/p50. IB/RoCE port counters of the
    deployment's hosts count for network only when they show pressure — the busiest port's transmit
    bytes/s ≥ ``net_link_busy_min_ratio`` of its link rate, or discards — and are ``info`` otherwise
    (an idle port says nothing against a latency-bound collective); xmit-wait ticks are ``info``
    (the tick period is the HCA's). For P/D without spans, the engine's NIXL transfer time stands
    in for the spans' KV-transfer time.
 6b. The engine's own work estimate (vLLM's MFU counters: FLOPs and bytes per GPU) is reported
    as ``info`` beside compute and HBM: achieved FLOP/s ÷ dense BF16 peak and bytes/s ÷ HBM
    bandwidth, a measured roofline where DCGM profiling fields are absent.
 7. A zone's score = (passes + ½ nears) / judged checks (``n/a`` excluded), and for network
    (1 − ``net_change_weight``) × level score + ``net_change_weight`` × change score when change
    checks were judged. A zone with fewer than ``zone_min_checks`` judged checks has no score.
 8. primary: KV capacity when it scores ≥ ``zone_min_score`` with KV pressure (usage at its
    threshold, or near it while the engine preempts, has no room for another sequence (rule 5) or
    holds at least 2 × ``kv_waiting_min_ratio`` waiting per running request) and requests turned
    away (preemptions,
    waiting, queue share): a full KV pool binds admission whatever the GPUs do; else the best score ≥
    ``zone_min_score``. Scores within ``zone_tie_margin`` of the best are a near-tie: ``ambiguous``
    lists them and the label says "ambiguous: X or Y"; the primary among them is the one whose
    own deciding signal is furthest past its threshold (never the zone name). With no zone at
    ``zone_min_score``: ``saturated`` when requests queue (waiting/running ≥
    ``kv_waiting_min_ratio``, queue share of TTFT ≥ ``kv_queue_share_min_ratio``, or TTFT p99 over
    its SLO), ``unknown`` when DCGM activity or engine series are missing (no positive evidence of
    slack), else ``headroom``.
 9. secondary = the next best score ≥ ``secondary_min_score``. confidence = base × (0.75 + 0.25 ×
    margin) − penalties, clipped to [0.05, 0.99]; base = the primary score (headroom: 1 − best
    zone score; saturated: 0.5; unknown: 0.2); margin = base − next score; penalties per missing
    source: no DCGM, no collective records, no histograms, no engine series.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import duckdb
import numpy as np
import polars as pl

from analyzer.critical_path import CriticalPath, critical_path
from analyzer.crossover import (
    ENGINE_GAUGES,
    collective_evidence,
    engine_window_sums,
    gpu_window_sums,
    load_bins,
    network_signals,
)
from analyzer.deployments import ENGINE_KEY_SQL, IN_TEXTS, Deployment, texts
from analyzer.latency import (
    HISTOGRAMS,
    NS,
    counter_increases,
    per_series_means,
    reads_points,
    rollup_for,
    table_sql,
    window_means,
    window_quantiles,
)
from analyzer.point_bins import exact_avg, exact_mean, exact_ratio, exact_sum, exact_total
from analyzer.thresholds import Thresholds

ZONES = ("compute", "hbm_bandwidth", "kv_capacity", "network")
STATES = (*ZONES, "headroom", "saturated", "unknown")
GPU_METRICS = ("sm_active_ratio", "tensor_active_ratio", "dram_active_ratio", "fb_used_bytes")
GAUGES = ("requests_running", "requests_waiting", "kv_usage_ratio")
COUNTERS = ("preemptions_total", "prompt_tokens_total", "generation_tokens_total")

NetworkEvidence = Callable[[duckdb.DuckDBPyConnection, Deployment, int, int], Mapping[str, float] | None]
"""Injected collective evidence: keys ``collective_share_ratio``, ``busbw_ratio`` (optional)."""
ExpectedLatency = Callable[[Deployment, Mapping[str, float]], Mapping[str, float] | None]
"""Injected latency model: load ``{running, prompt_tokens_per_request, kv_usage_ratio}`` →
``{itl_s, ttft_s}`` and, where the model can say, ``itl_single_domain_s`` (the same batch with
the whole group inside one NVLink domain)."""


@dataclass(frozen=True)
class Evidence:
    """One signal used in a verdict, with the comparison an SRE can redo by hand."""

    signal: str
    zone: str
    value: float | None
    unit: str
    compared_with: str
    threshold: float | None
    verdict: str  # pass | near | fail | n/a | info
    source: str
    note: str = ""


@dataclass
class Verdict:
    """A deployment's zone in one window."""

    deployment: str
    start_ns: int
    end_ns: int
    primary: str
    secondary: str | None
    confidence: float
    scores: dict[str, float | None]
    evidence: list[Evidence]
    missing: list[str]
    notes: list[str] = field(default_factory=list)
    label: str = ""
    ambiguous: list[str] = field(default_factory=list)
    critical_path: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["window"] = {"start_ns": self.start_ns, "end_ns": self.end_ns, "seconds": self.seconds}
        return out

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / NS


@dataclass
class Signals:
    """Everything rule 1 reads, gathered once (a plain value object: tests build it by hand)."""

    gpu: dict[str, float] = field(default_factory=dict)
    engine: dict[str, float] = field(default_factory=dict)
    quantiles: dict[str, dict[float, float | None]] = field(default_factory=dict)
    means: dict[str, float] = field(default_factory=dict)
    bins: pl.DataFrame = field(default_factory=pl.DataFrame)
    collectives: dict[str, float] = field(default_factory=dict)
    collectives_source: str = ""
    expected: dict[str, float] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    path: CriticalPath = field(default_factory=CriticalPath)
    judged_from_ns: int | None = None  # rule 1's high-load start on a ramp
    kv_transfer_share: float | None = None  # P/D: KV-transfer share of TTFT (spans, else NIXL)
    kv_transfer_source: str = ""
    fabric: dict[str, float] = field(default_factory=dict)  # IB/RoCE ports of the deployment's hosts
    roofline: dict[str, float] = field(default_factory=dict)  # engine-estimated FLOP/s, bytes/s per GPU
    ttft_slo_s: float | None = None


# --------------------------------------------------------------------------------------------- gather
def gather(
    con: duckdb.DuckDBPyConnection,
    dep: Deployment,
    start_ns: int,
    end_ns: int,
    th: Thresholds,
    *,
    network_evidence: NetworkEvidence | None = None,
    expected_latency: ExpectedLatency | None = None,
) -> Signals:
    """Rule 1: read the window's signals for ``dep`` (every read is one SQL statement)."""
    keys = list(dep.engine_keys)
    sig = Signals(ttft_slo_s=dep.ttft_slo_s)
    sig.bins = load_bins(con, dep, start_ns, end_ns, th)
    sig.judged_from_ns = _ramp_start(sig.bins, start_ns, th)
    from_ns = sig.judged_from_ns or start_ns
    sig.gpu = _gpu_means(con, dep, from_ns, end_ns)
    sig.engine = _engine_window(con, keys, from_ns, end_ns, th)
    wq = window_quantiles(con, start_ns, end_ns, keys=keys, lookback_s=th.counter_lookback_s)
    sig.quantiles = {c: {q: x.value_s for q, x in d.items()} for c, d in wq.items()}
    sig.means = window_means(
        con, from_ns, end_ns, keys=keys, concepts=(*HISTOGRAMS, "kv_transfer_seconds"),
        lookback_s=th.counter_lookback_s,
    )  # fmt: skip
    sig.collectives, sig.collectives_source = collective_evidence(
        con, dep, start_ns, end_ns, network_evidence
    )
    sig.path = critical_path(con, dep, start_ns, end_ns)
    if sig.path.kv_transfer_crosses_nodes:
        sig.kv_transfer_share = _kv_transfer_share(con, dep, start_ns, end_ns)
        sig.kv_transfer_source = "request spans: mean KV-transfer time ÷ mean TTFT"
        nixl, ttft = sig.means.get("kv_transfer_seconds"), sig.means.get("ttft_seconds")
        if sig.kv_transfer_share is None and nixl is not None and ttft:
            sig.kv_transfer_share = min(nixl / ttft, 1.0)
            sig.kv_transfer_source = "engine NIXL transfer time (mean per transfer) ÷ mean TTFT"
    sig.fabric = _fabric_means(con, dep, from_ns, end_ns)
    sig.roofline = _roofline(con, dep, keys, from_ns, end_ns, th)
    sig.expected = _expected(dep, sig, expected_latency)
    sig.missing = _missing(sig, dep, network_evidence, expected_latency)
    return sig


def _ramp_start(bins: pl.DataFrame, start_ns: int, th: Thresholds) -> int | None:
    """Rule 1's ramp test, on running requests and on KV usage (a KV pool filling up is load
    building too): the start of the first high-load bin of the later-starting ramp, or None when
    the window is steady."""
    starts = [s for col in ("running", "kv") if (s := _ramp_of(bins, col, th)) is not None]
    if not starts:
        return None
    return start_ns + max(starts) * int(th.bin_s * NS)


def _ramp_of(bins: pl.DataFrame, col: str, th: Thresholds) -> int | None:
    if bins.is_empty() or col not in bins.columns:
        return None
    b = bins.drop_nulls([col]).sort("bin")
    n = b.height
    if n < 8:
        return None
    v = b[col].to_numpy()
    q = max(n // 4, 1)
    first, last = float(v[:q].mean()), float(v[-q:].mean())
    if last <= 0 or last < th.ramp_min_ratio * max(first, 1e-9):
        return None
    high = b.filter(pl.col(col) >= float(np.median(v)))
    return int(high["bin"].to_numpy().min())


def _kv_transfer_share(
    con: duckdb.DuckDBPyConnection, dep: Deployment, start_ns: int, end_ns: int
) -> float | None:
    """Mean KV-transfer time ÷ mean TTFT over the window's request spans (None without spans)."""
    from analyzer.phases import request_phases

    try:
        return request_phases(con, dep, start_ns, end_ns).kv_transfer_share_of_ttft
    except (duckdb.Error, KeyError, ValueError):
        return None


def _fabric_means(
    con: duckdb.DuckDBPyConnection, dep: Deployment, start_ns: int, end_ns: int
) -> dict[str, float]:
    """Rule 6's port counters over the deployment's hosts: the busiest port's transmit
    utilisation (bytes/s ÷ link rate), and the worst port's xmit-wait ticks/s and discards/s."""
    if not dep.nodes:
        return {}
    try:
        rows = con.execute(
            f"""SELECT host, device, port,
                      avg(rate_per_s) FILTER (WHERE metric = 'tx_bytes') AS tx,
                      max(value) FILTER (WHERE metric = 'link_rate_bytes_per_s') AS link,
                      avg(rate_per_s) FILTER (WHERE metric = 'tx_wait') AS wait,
                      avg(rate_per_s) FILTER (WHERE metric = 'tx_discards') AS discards
               FROM fabric_samples WHERE ts_ns > ? AND ts_ns <= ? AND host {IN_TEXTS}
               GROUP BY ALL""",
            [start_ns, end_ns, texts(dep.nodes)],
        ).fetchall()
    except duckdb.CatalogException:
        return {}
    if not rows:
        return {}
    util = [tx / link for _, _, _, tx, link, _, _ in rows if tx is not None and link]
    out = {"ports": float(len(rows))}
    if util:
        out["tx_utilization_max"] = max(util)
    waits = [w for *_, w, _ in rows if w is not None]
    if waits:
        out["xmit_wait_per_s_max"] = max(waits)
    drops = [d for *_, d in rows if d is not None]
    if drops:
        out["discards_per_s_max"] = max(drops)
    return out


def _roofline(
    con: duckdb.DuckDBPyConnection,
    dep: Deployment,
    keys: list[str],
    start_ns: int,
    end_ns: int,
    th: Thresholds,
) -> dict[str, float]:
    """The engine's own estimate of work per GPU (vLLM's MFU counters: estimated FLOPs and bytes
    read/written per GPU) as rates and as fractions of the GPU's dense BF16 peak and HBM bandwidth."""
    names = ["estimated_flops_total", "estimated_read_bytes_total", "estimated_write_bytes_total"]
    inc = counter_increases(con, start_ns, end_ns, names, keys=keys, lookback_s=th.counter_lookback_s)
    got = dict(zip(inc["concept"].to_list(), inc["increase"].to_list(), strict=True))
    if not got.get("estimated_flops_total"):
        return {}
    seconds = max((end_ns - start_ns) / NS, 1e-9)
    engines = max(len(keys), 1)  # each engine's counters are per GPU already
    out = {
        "flops_per_s": float(got["estimated_flops_total"]) / seconds / engines,
        "bytes_per_s": float(
            got.get("estimated_read_bytes_total", 0.0) + got.get("estimated_write_bytes_total", 0.0)
        )
        / seconds
        / engines,
    }
    from analyzer import catalog

    try:
        g = catalog.gpu(dep.gpu_type or "h100_sxm")
        out["flops_ratio"] = out["flops_per_s"] / g.peak_flops("bf16")
        out["hbm_ratio"] = out["bytes_per_s"] / g.hbm_bytes_per_s
    except (KeyError, ValueError):
        pass
    return out


def _gpu_means(
    con: duckdb.DuckDBPyConnection, dep: Deployment, start_ns: int, end_ns: int
) -> dict[str, float]:
    if not dep.gpu_uuids:
        return {}
    rollup = rollup_for(con, start_ns, end_ns)  # latency rule 6 for long windows
    kept = None if rollup else gpu_window_sums(con, dep, start_ns, end_ns)
    if kept is not None:  # the load bins' GPU sums of this window (crossover._series_bins)
        per_gpu = (
            kept.filter(pl.col("metric").is_in(GPU_METRICS))
            .group_by("uuid", "metric", maintain_order=True)
            .agg(exact_ratio(pl.col("v"), pl.col("n")).alias("v"))
        )
        got = per_gpu.group_by("metric", maintain_order=True).agg(
            exact_mean(pl.col("v")).alias("mean"), pl.col("v").max().alias("top")
        )
        rows = list(got.iter_rows())
    elif reads_points(con, "gpu_samples", rollup):  # the selected GPUs' series, their points summed first
        rows = con.execute(
            f"""WITH s AS (SELECT series_id, uuid, metric FROM gpu_samples_series
                           WHERE uuid {IN_TEXTS} AND metric {IN_TEXTS})
                SELECT metric, {exact_avg("v")}, max(v) FROM (
                   SELECT uuid, metric, {exact_sum("v")} / sum(n) AS v
                   FROM {per_series_means("gpu_samples")} JOIN s USING (series_id) GROUP BY ALL)
                GROUP BY metric""",
            [texts(dep.gpu_uuids), texts(GPU_METRICS), start_ns, end_ns],
        ).fetchall()
    else:
        gpu = table_sql("gpu_samples", rollup, (start_ns, end_ns))
        rows = con.execute(
            f"""SELECT metric, {exact_avg("v")}, max(v) FROM (
                   SELECT uuid, metric, {exact_avg("value")} AS v FROM {gpu}
                   WHERE ts_ns > ? AND ts_ns <= ? AND uuid {IN_TEXTS}
                     AND metric {IN_TEXTS}
                   GROUP BY ALL) GROUP BY metric""",
            [start_ns, end_ns, texts(dep.gpu_uuids), texts(GPU_METRICS)],
        ).fetchall()
    out: dict[str, float] = {}
    for metric, mean, top in rows:
        out[str(metric)] = float(mean)
        out[f"{metric}_max_gpu"] = float(top)
    return out


def _engine_window(
    con: duckdb.DuckDBPyConnection, keys: list[str], start_ns: int, end_ns: int, th: Thresholds
) -> dict[str, float]:
    rollup = rollup_for(con, start_ns, end_ns)  # latency rule 6
    kept = (
        None
        if rollup or set(GAUGES) - set(ENGINE_GAUGES)
        else engine_window_sums(con, keys, start_ns, end_ns)
    )
    if kept is not None:  # the load bins' engine gauge sums of this window (crossover._series_bins)
        per_engine = (
            kept.filter(pl.col("concept").is_in(GAUGES))
            .group_by("k", "concept", maintain_order=True)
            .agg(exact_ratio(pl.col("v"), pl.col("n")).alias("v"))
        )
        v = pl.col("v")
        got = per_engine.group_by("concept", maintain_order=True).agg(
            pl.when(v.count() > 0).then(exact_total(v)).alias("total"),
            v.max().alias("top"),
            pl.len().alias("n"),
        )
        rows = list(got.iter_rows())
    elif reads_points(con, "engine_samples", rollup):  # the selected series, their points summed first
        rows = con.execute(
            f"""WITH s AS (SELECT series_id, {ENGINE_KEY_SQL} AS k, concept FROM engine_samples_series
                           WHERE concept {IN_TEXTS} AND {ENGINE_KEY_SQL} {IN_TEXTS})
                SELECT concept, {exact_sum("v")}, max(v), count(*) FROM (
                   SELECT k, concept, {exact_sum("v")} / sum(n) AS v
                   FROM {per_series_means("engine_samples")} JOIN s USING (series_id) GROUP BY ALL)
                GROUP BY concept""",
            [texts(GAUGES), texts(keys), start_ns, end_ns],
        ).fetchall()
    else:
        gauges = table_sql("engine_gauges", rollup, (start_ns, end_ns))
        rows = con.execute(
            f"""SELECT concept, {exact_sum("v")}, max(v), count(*) FROM (
                   SELECT {ENGINE_KEY_SQL} AS k, concept, {exact_avg("value")} AS v FROM {gauges}
                   WHERE ts_ns > ? AND ts_ns <= ? AND concept {IN_TEXTS}
                     AND {ENGINE_KEY_SQL} {IN_TEXTS} GROUP BY ALL) GROUP BY concept""",
            [start_ns, end_ns, texts(GAUGES), texts(keys)],
        ).fetchall()
    out: dict[str, float] = {}
    for concept, total, top, n in rows:
        # running/waiting add up over engines; KV usage is a per-engine ratio: mean and max.
        out[str(concept)] = float(total) / n if concept == "kv_usage_ratio" else float(total)
        out[f"{concept}_max"] = float(top)
        if concept == "requests_running":
            out["engines_reporting"] = float(n)
    seconds = (end_ns - start_ns) / NS
    inc = counter_increases(con, start_ns, end_ns, COUNTERS, keys=keys, lookback_s=th.counter_lookback_s)
    for concept, increase in zip(inc["concept"].to_list(), inc["increase"].to_list(), strict=True):
        out[str(concept).removesuffix("_total") + "_per_s"] = float(increase) / seconds
    return out


def _expected(dep: Deployment, sig: Signals, model: ExpectedLatency | None) -> dict[str, float]:
    if model is None or "requests_running" not in sig.engine:
        return {}
    e = sig.engine
    load = {"running": e["requests_running"], "kv_usage_ratio": e.get("kv_usage_ratio", 0.0),
            "prompt_tokens_per_s": e.get("prompt_tokens_per_s", 0.0),
            "ttft_mean_s": sig.means.get("ttft_seconds", 0.0)}  # fmt: skip
    return {k: float(v) for k, v in (model(dep, load) or {}).items() if v is not None}


def _missing(
    sig: Signals, dep: Deployment, net: NetworkEvidence | None, model: ExpectedLatency | None
) -> list[str]:
    out = []
    if "sm_active_ratio" not in sig.gpu:
        out.append("dcgm: no SM/tensor/DRAM activity for this deployment's GPUs (compute/HBM zones unjudged)")
    elif "tensor_active_ratio" not in sig.gpu or "dram_active_ratio" not in sig.gpu:
        out.append("dcgm: tensor or DRAM activity fields absent (add them to the dcgm-exporter CSV)")
    if not sig.engine:
        out.append("engine: no engine series for this deployment")
    if not sig.quantiles:
        out.append("histograms: no TTFT/ITL buckets in the window")
    if not sig.collectives:
        out.append("collectives: no NCCL records or collective evidence (network zone partly unjudged)")
    if net is None and sig.collectives and "busbw_ratio" not in sig.collectives:
        out.append("collectives: no nccl-tests baseline or catalog fabric for busbw vs capability")
    if model is None:
        out.append("latency model not wired in: no measured-vs-expected ITL/TTFT")
    return out


# ------------------------------------------------------------------------------------------- classify
def _grade(value: float | None, threshold: float, near: float, *, above: bool) -> str:
    """Rule 2: ``pass``/``near``/``fail``/``n/a`` for ``value ≥ threshold`` (or ``<`` when not above)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if above:
        return "pass" if value >= threshold else ("near" if value >= threshold * near else "fail")
    return "pass" if value < threshold else ("near" if value * near < threshold else "fail")


class _Checks:
    """Collects Evidence rows while the rule runs (one instance per verdict, never shared)."""

    def __init__(self, th: Thresholds) -> None:
        self.th = th
        self.rows: list[Evidence] = []
        self.change: set[int] = set()  # indexes of rule 6's change-with-load rows

    def check(
        self,
        zone: str,
        signal: str,
        value: float | None,
        unit: str,
        threshold: float,
        *,
        above: bool,
        source: str,
        note: str = "",
        gate: str | None = None,
        change: bool = False,
    ) -> None:
        if change:
            self.change.add(len(self.rows))
        verdict = _grade(value, threshold, self.th.near_fraction, above=above)
        if gate is not None and verdict in ("pass", "near"):
            verdict, note = "fail", gate
        op = "≥" if above else "<"
        self.rows.append(
            Evidence(
                signal, zone, _round(value), unit, f"{op} {threshold:g}", threshold, verdict, source, note
            )
        )

    def info(
        self, zone: str, signal: str, value: float | None, unit: str, source: str, note: str = ""
    ) -> None:
        self.rows.append(Evidence(signal, zone, _round(value), unit, "", None, "info", source, note))

    def _mean(self, rows: list[Evidence]) -> float | None:
        if not rows:
            return None
        return sum(1.0 if e.verdict == "pass" else 0.5 if e.verdict == "near" else 0.0 for e in rows) / len(
            rows
        )

    def score(self, zone: str) -> float | None:
        """Rule 7."""
        judged = [
            (i, e)
            for i, e in enumerate(self.rows)
            if e.zone == zone and e.verdict in ("pass", "near", "fail")
        ]
        if len(judged) < self.th.zone_min_checks:
            return None
        level = self._mean([e for i, e in judged if i not in self.change])
        change = self._mean([e for i, e in judged if i in self.change])
        if level is None:
            got = change
        elif change is None:
            got = level
        else:
            w = self.th.net_change_weight
            got = (1 - w) * level + w * change
        return None if got is None else round(got, 3)

    def value(self, zone: str, signal: str) -> Evidence | None:
        return next((e for e in self.rows if e.zone == zone and e.signal == signal), None)


def _queue_share(sig: Signals) -> float | None:
    """Mean queue time ÷ mean TTFT (exact means from ``_sum``/``_count``), capped at 1."""
    share = _ratio(sig.means.get("queue_seconds"), sig.means.get("ttft_seconds"))
    return None if share is None else min(share, 1.0)


def _round(v: float | None) -> float | None:
    return None if v is None else round(float(v), 6)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def classify(sig: Signals, th: Thresholds, deployment: str, start_ns: int, end_ns: int) -> Verdict:
    """Rules 2-9 on gathered signals (pure: no I/O)."""
    c = _Checks(th)
    _compute_checks(c, sig)
    _hbm_checks(c, sig)
    _kv_checks(c, sig)
    _network_checks(c, sig)
    _roofline_info(c, sig)
    _latency_info(c, sig)
    scores = {z: c.score(z) for z in ZONES}
    pick = _pick(scores, c, sig, th)
    penalties = _penalties(sig, th)
    conf = min(max(pick.base * (0.75 + 0.25 * pick.margin) - sum(penalties.values()), 0.05), 0.99)
    notes = [
        f"confidence = {pick.base:.2f} × (0.75 + 0.25 × {pick.margin:.2f}) − {sum(penalties.values()):.2f} "
        f"({', '.join(penalties) or 'no penalties'})",
        *pick.notes,
    ]
    notes += [
        f"zone {z} unjudged: fewer than {th.zone_min_checks} of its checks had a source"
        for z, sc in scores.items()
        if sc is None and not (z == "network" and not sig.path.network_in_path)
    ]
    if sig.judged_from_ns is not None:
        notes.append(
            f"load ramps inside the window: GPU and engine means over its high-load part "
            f"(the last {(end_ns - sig.judged_from_ns) / NS:.0f} s)"
        )
    missing = list(sig.missing) + pick.missing
    return Verdict(
        deployment, start_ns, end_ns, pick.primary, pick.secondary, round(conf, 3), scores, c.rows,
        missing, notes, pick.label, pick.ambiguous, sig.path.as_dict(),
    )  # fmt: skip


@dataclass
class _Pick:
    primary: str
    secondary: str | None
    base: float
    margin: float
    label: str
    ambiguous: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


# Rule 8's tie-break: each zone's deciding signal and its threshold field (how far past it).
_DECIDING = {
    "compute": ("tensor_active_ratio", "compute_tensor_min_ratio"),
    "hbm_bandwidth": ("dram_active_ratio", "hbm_dram_min_ratio"),
    "kv_capacity": ("kv_usage_ratio", "kv_usage_min_ratio"),
    "network": ("collective_share_ratio", "net_collective_share_min_ratio"),
}


def _past_threshold(zone: str, c: _Checks) -> float:
    signal, field_name = _DECIDING[zone]
    e = c.value(zone, signal)
    limit = float(getattr(c.th, field_name))
    if e is None or e.value is None or limit <= 0:
        return 0.0
    return float(e.value) / limit


def queueing(sig: Signals, th: Thresholds) -> list[str]:
    """Rule 8's queueing test: the reasons requests are seen queueing (empty: none)."""
    out = []
    e = sig.engine
    waiting = _ratio(e.get("requests_waiting"), max(e.get("requests_running", 0.0), 1.0)) if e else None
    if waiting is not None and waiting >= th.kv_waiting_min_ratio:
        out.append(f"waiting/running {waiting:.2f} ≥ {th.kv_waiting_min_ratio:g}")
    share = _queue_share(sig)
    if share is not None and share >= th.kv_queue_share_min_ratio:
        out.append(f"queue share of TTFT {share:.2f} ≥ {th.kv_queue_share_min_ratio:g}")
    p99 = sig.quantiles.get("ttft_seconds", {}).get(0.99)
    if sig.ttft_slo_s and p99 is not None and p99 > sig.ttft_slo_s:
        out.append(f"TTFT p99 {p99:.3g} s over its SLO {sig.ttft_slo_s:g} s")
    return out


def kv_free_sequences(engine: dict[str, float]) -> float | None:
    """Rule 5's room: average running sequences per engine that fit in the free KV pool."""
    usage, running = engine.get("kv_usage_ratio"), engine.get("requests_running")
    if not usage or running is None:
        return None
    per_engine = running / max(engine.get("engines_reporting", 1.0), 1.0)
    return per_engine * (1.0 / min(usage, 1.0) - 1.0)


def _kv_no_room(engine: dict[str, float], th: Thresholds) -> bool:
    """Rule 5: requests wait and the free pool holds less than one more running-size sequence."""
    free = kv_free_sequences(engine)
    waiting = engine.get("requests_waiting") or 0.0
    return free is not None and free < th.kv_free_sequences_max and waiting > 0


def _kv_binding(c: _Checks, sig: Signals) -> bool:
    usage, pre = c.value("kv_capacity", "kv_usage_ratio"), c.value("kv_capacity", "preemptions_per_s")
    waiting = c.value("kv_capacity", "waiting_over_running")
    share = c.value("kv_capacity", "queue_share_of_ttft")
    # the pool is full, or within near_fraction of full while the engine preempts (it preempts only
    # when it cannot allocate a block), has no room for another sequence of the running size, or
    # holds more requests waiting than running (an engine admits until its KV blocks or its
    # sequence cap run out; with the pool nearly full it is the blocks)
    full = usage is not None and usage.verdict == "pass"
    preempting = pre is not None and pre.verdict == "pass"
    no_room = _kv_no_room(sig.engine, c.th)
    backlog = (
        waiting is not None and waiting.value is not None and waiting.value >= 2 * c.th.kv_waiting_min_ratio
    )
    near = usage is not None and usage.verdict == "near"
    pressure = full or (near and (preempting or no_room or backlog))
    turned_away = any(e is not None and e.verdict == "pass" for e in (pre, waiting, share))
    return pressure and turned_away


def _pick(scores: dict[str, float | None], c: _Checks, sig: Signals, th: Thresholds) -> _Pick:
    """Rule 8 and the base/margin of rule 9."""
    judged = {z: sc for z, sc in scores.items() if sc is not None}
    best = max(judged.values(), default=0.0)
    if best >= th.zone_min_score:
        contenders = [
            z for z, sc in judged.items() if sc >= th.zone_min_score and best - sc <= th.zone_tie_margin
        ]
        contenders.sort(key=lambda z: (-(judged[z] or 0.0), -_past_threshold(z, c), ZONES.index(z)))
        notes: list[str] = []
        primary = contenders[0]
        if (judged.get("kv_capacity") or 0.0) >= th.zone_min_score and _kv_binding(c, sig):
            if primary != "kv_capacity":
                notes.append(
                    f"kv_capacity over {primary}: the KV pool is full and turns requests away, "
                    "so it binds admission whatever the GPUs do"
                )
            primary = "kv_capacity"
            contenders = [primary] + [z for z in contenders if z != primary]
        ambiguous = contenders if len(contenders) > 1 and not notes else []
        rest = sorted(
            ((sc, z) for z, sc in judged.items() if z != primary), key=lambda t: (-t[0], ZONES.index(t[1]))
        )
        nxt = rest[0] if rest else (0.0, None)
        secondary = nxt[1] if nxt[0] >= th.secondary_min_score else None
        label = "ambiguous: " + " or ".join(ambiguous) if ambiguous else primary
        base = judged[primary] or 0.0
        return _Pick(primary, secondary, base, max(base - nxt[0], 0.0), label, ambiguous, notes)
    runner = max(judged.items(), key=lambda t: (t[1], -ZONES.index(t[0])), default=(None, 0.0))
    secondary = runner[0] if runner[1] >= th.secondary_min_score else None
    why_queue = queueing(sig, th)
    gpu_missing = "sm_active_ratio" not in sig.gpu or "dram_active_ratio" not in sig.gpu
    identify = []
    if gpu_missing:
        identify.append(
            "dcgm: DCGM_FI_PROF_SM_ACTIVE, DCGM_FI_PROF_PIPE_TENSOR_ACTIVE and DCGM_FI_PROF_DRAM_ACTIVE "
            "(compute or HBM bandwidth)"
        )
    if not sig.collectives and sig.path.network_in_path:
        identify.append("collectives: NCCL Inspector records of the groups that cross nodes (network)")
    if why_queue:
        label = "saturated — wall not identified"
        notes = [f"requests queue ({'; '.join(why_queue)}) but no wall reaches {th.zone_min_score:g}"]
        if identify:
            notes.append("would identify the wall: " + "; ".join(identify))
        return _Pick("saturated", secondary, 0.5, 0.5 - runner[1], label, notes=notes, missing=identify)
    if gpu_missing or not sig.engine:
        need = identify + ([] if sig.engine else ["engine: requests_running/waiting and KV usage"])
        notes = ["no positive evidence of slack: " + "; ".join(need)]
        return _Pick("unknown", secondary, 0.2, 0.2, "unknown — missing evidence", notes=notes, missing=need)
    base = 1.0 - runner[1]
    return _Pick("headroom", secondary, base, base - runner[1], "headroom")


def _penalties(sig: Signals, th: Thresholds) -> dict[str, float]:
    gaps = {
        "no DCGM": ("sm_active_ratio" not in sig.gpu, th.confidence_penalty_no_dcgm),
        "no collective records": (not sig.collectives, th.confidence_penalty_no_collectives),
        "no histograms": (not sig.quantiles, th.confidence_penalty_no_histograms),
        "no engine series": (not sig.engine, th.confidence_penalty_no_engine),
    }
    return {name: penalty for name, (absent, penalty) in gaps.items() if absent}


def _compute_checks(c: _Checks, sig: Signals) -> None:
    th, g = c.th, sig.gpu
    c.check(
        "compute",
        "tensor_active_ratio",
        g.get("tensor_active_ratio"),
        "ratio",
        th.compute_tensor_min_ratio,
        above=True,
        source="dcgm DCGM_FI_PROF_PIPE_TENSOR_ACTIVE (mean over GPUs)",
    )
    tensor = g.get("tensor_active_ratio")
    idle_tensors = tensor is not None and tensor < th.compute_tensor_min_ratio * th.near_fraction
    c.check(
        "compute",
        "sm_active_ratio",
        g.get("sm_active_ratio"),
        "ratio",
        th.compute_sm_min_ratio,
        above=True,
        source="dcgm DCGM_FI_PROF_SM_ACTIVE (mean over GPUs)",
        gate=(
            "SM_ACTIVE counts warps stalled on memory, so without tensor activity it is no compute "
            "evidence (a pure HBM copy on an H100 read 0.99)"
        )
        if idle_tensors
        else None,
    )


def _roofline_info(c: _Checks, sig: Signals) -> None:
    """Rule 6b."""
    r = sig.roofline
    if "flops_ratio" in r:
        c.info("compute", "engine_flops_over_peak", r["flops_ratio"], "ratio",
               "engine estimated_flops_per_gpu rate ÷ dense BF16 peak",
               note="measured roofline (rule 6b)")  # fmt: skip
    if "hbm_ratio" in r:
        c.info("hbm_bandwidth", "engine_bytes_over_hbm_peak", r["hbm_ratio"], "ratio",
               "engine estimated read+write bytes per GPU rate ÷ HBM bandwidth",
               note="measured roofline (rule 6b)")  # fmt: skip


def _fabric_evidence(c: _Checks, sig: Signals, judged: bool) -> None:
    """Rule 6's IB/RoCE port counters: a check only when they show pressure, else info."""
    th, fab = c.th, sig.fabric
    if not fab:
        return
    src = f"IB/RoCE port counters of the deployment's hosts ({fab['ports']:.0f} ports)"
    util, drops = fab.get("tx_utilization_max"), fab.get("discards_per_s_max")
    if judged and util is not None and util >= th.net_link_busy_min_ratio:
        c.check("network", "ib_tx_utilization", util, "ratio", th.net_link_busy_min_ratio, above=True,
                source=src, note="the busiest port's transmit bytes/s ÷ link rate")  # fmt: skip
    else:
        c.info("network", "ib_tx_utilization", util, "ratio", src,
               note="reported only: a quiet port says nothing against a latency-bound "
               "collective")  # fmt: skip
    if judged and drops:
        c.check("network", "ib_tx_discards_per_s", drops, "1/s", 1e-9, above=True, source=src,
                note="packets discarded for congestion or timeouts")  # fmt: skip
    elif drops is not None:
        c.info("network", "ib_tx_discards_per_s", drops, "1/s", src)
    if fab.get("xmit_wait_per_s_max") is not None:
        c.info("network", "ib_xmit_wait_ticks_per_s", fab["xmit_wait_per_s_max"], "ticks/s", src,
               note="time the port had data but no credits (tick length is the HCA's)")  # fmt: skip


def _hbm_checks(c: _Checks, sig: Signals) -> None:
    th, g = c.th, sig.gpu
    dram = g.get("dram_active_ratio")
    quiet = dram is not None and dram < th.hbm_dram_min_ratio * th.near_fraction
    gate = "DRAM is not busy, so this is no bandwidth evidence" if quiet else None
    c.check(
        "hbm_bandwidth",
        "dram_active_ratio",
        g.get("dram_active_ratio"),
        "ratio",
        th.hbm_dram_min_ratio,
        above=True,
        source="dcgm DCGM_FI_PROF_DRAM_ACTIVE (mean over GPUs)",
    )
    c.check(
        "hbm_bandwidth",
        "dram_over_sm",
        _ratio(g.get("dram_active_ratio"), g.get("sm_active_ratio")),
        "ratio",
        th.hbm_dram_over_sm_min_ratio,
        above=True,
        source="dcgm DRAM_ACTIVE / SM_ACTIVE",
        note="memory-bound when DRAM activity keeps up with SM activity (H100: HBM copy 0.90, GEMM 0.27)",
        gate=gate,
    )
    c.check(
        "hbm_bandwidth",
        "tensor_active_ratio",
        g.get("tensor_active_ratio"),
        "ratio",
        th.hbm_tensor_max_ratio,
        above=False,
        source="dcgm DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        gate=gate,
    )


def _kv_checks(c: _Checks, sig: Signals) -> None:
    th, e = c.th, sig.engine
    c.check(
        "kv_capacity",
        "kv_usage_ratio",
        e.get("kv_usage_ratio"),
        "ratio",
        th.kv_usage_min_ratio,
        above=True,
        source="engine kv_usage (mean over engines)",
    )
    # An engine without a preemption counter (TRT-LLM, Dynamo) gives n/a, not zero.
    c.check(
        "kv_capacity",
        "preemptions_per_s",
        e.get("preemptions_per_s"),
        "1/s",
        th.kv_preemptions_min_per_s,
        above=True,
        source="engine preemptions_total rate",
    )
    usage, pre = e.get("kv_usage_ratio"), e.get("preemptions_per_s")
    free, no_room = kv_free_sequences(e), _kv_no_room(e, th)
    c.info(
        "kv_capacity",
        "kv_free_sequences",
        free,
        "sequences",
        "engine requests_running per engine × (1/kv_usage − 1)",
        note=f"< {th.kv_free_sequences_max:g} with requests waiting: no room for the next request"
        if no_room
        else "",
    )
    pressure = (
        (usage is not None and usage >= th.kv_usage_min_ratio * th.near_fraction)
        or (pre is not None and pre > th.kv_preemptions_min_per_s)
        or no_room
    )
    gate = (
        None
        if pressure
        else "queueing without KV pressure (KV not full, no preemptions): another wall's symptom"
    )
    waiting = _ratio(e.get("requests_waiting"), max(e.get("requests_running", 0.0), 1.0)) if e else None
    c.check(
        "kv_capacity",
        "waiting_over_running",
        waiting,
        "ratio",
        th.kv_waiting_min_ratio,
        above=True,
        source="engine requests_waiting / requests_running (window means, summed over engines)",
        gate=gate,
    )
    c.check(
        "kv_capacity",
        "queue_share_of_ttft",
        _queue_share(sig),
        "ratio",
        th.kv_queue_share_min_ratio,
        above=True,
        source="engine queue_seconds_sum/_count ÷ ttft_seconds_sum/_count (exact means)",
        gate=gate,
    )


def _unsaturated(sig: Signals, th: Thresholds) -> bool | None:
    sm, dram = sig.gpu.get("sm_active_ratio"), sig.gpu.get("dram_active_ratio")
    if sm is None:
        return None
    return sm < th.net_unsaturated_max_ratio and (dram is None or dram < th.net_unsaturated_max_ratio)


def _network_checks(c: _Checks, sig: Signals) -> None:
    """Rule 6."""
    th, col, path = c.th, sig.collectives, sig.path
    src = sig.collectives_source or "collective records"
    if not path.network_in_path:
        share = path.fabric_share if path.fabric_share is not None else col.get("collective_share_ratio")
        c.info(
            "network", "fabric_collective_share_ratio", share, "ratio", src,
            note=f"network not in the critical path ({path.why or 'single GPU'}): collective time inside "
            "one NVLink domain is fabric overhead of the layout, not the network wall",
        )  # fmt: skip
        if col.get("busbw_ratio") is not None:
            c.info("network", "busbw_over_capability", col.get("busbw_ratio"), "ratio", src,
                   note=f"busbw {col.get('busbw_gbs')} GB/s vs {col.get('capability_gbs')} GB/s")  # fmt: skip
        _fabric_evidence(c, sig, judged=False)
        return
    unsat = _unsaturated(sig, th)
    gate = "GPUs saturated: latency/throughput bend explained by compute or HBM" if unsat is False else None
    injected = "injected" in sig.collectives_source
    crossing = path.network_share if path.comms and not injected else col.get("collective_share_ratio")
    c.check(
        "network",
        "collective_share_ratio",
        crossing,
        "ratio",
        th.net_collective_share_min_ratio,
        above=True,
        source=(src + "; communicators that cross nodes") if path.comms and not injected else src,
        note=path.why,
    )
    sm, dram = sig.gpu.get("sm_active_ratio"), sig.gpu.get("dram_active_ratio")
    busiest = None if sm is None else max(sm, dram or 0.0)
    c.check(
        "network",
        "gpus_unsaturated",
        busiest,
        "max(SM, DRAM) activity",
        th.net_unsaturated_max_ratio,
        above=False,
        source="dcgm SM_ACTIVE, DRAM_ACTIVE (means over GPUs)",
        note="the GPUs wait on something: they are not the wall",
    )
    single = sig.expected.get("itl_single_domain_s")
    c.check(
        "network",
        "itl_over_single_domain_model",
        _ratio(sig.means.get("itl_seconds"), single),
        "ratio",
        th.net_single_domain_excess_min_ratio,
        above=True,
        gate=gate,
        source="mean ITL (_sum/_count) ÷ analyzer.perf ITL for this batch with the group inside "
        "one NVLink domain",
        note="what crossing nodes costs each decode step"
        if single
        else "no latency model for this deployment",
    )
    if path.kv_transfer_crosses_nodes:
        kv_full = (sig.engine.get("kv_usage_ratio") or 0.0) >= th.kv_usage_min_ratio
        c.check(
            "network",
            "pd_wait_share_of_ttft",
            _queue_share(sig),
            "ratio",
            th.pd_wait_share_min_ratio,
            above=True,
            gate=gate or ("KV pool full: the wait is for KV blocks" if kv_full else None),
            source="engine queue_seconds ÷ ttft_seconds (means): requests deferred while their KV "
            "cache crosses nodes",
        )
        c.check(
            "network",
            "kv_transfer_share_of_ttft",
            sig.kv_transfer_share,
            "ratio",
            th.pd_kv_transfer_share_min_ratio,
            above=True,
            source=sig.kv_transfer_source or "request spans or NIXL metrics (none in the window)",
        )
    _fabric_evidence(c, sig, judged=True)
    ns = network_signals(sig.bins, th)
    why = "" if ns["load_spread"] is None or ns["latency_slope"] is not None else "load too steady to fit"
    if unsat is None:
        gate_src = " (DCGM missing: GPU saturation unknown, counted as signal only)"
    else:
        gate_src = f" (GPUs unsaturated: SM and DRAM < {th.net_unsaturated_max_ratio:g})" if unsat else ""
    c.check(
        "network",
        "latency_slope_vs_concurrency",
        ns["latency_slope"],
        "d log p99 / d log running",
        th.net_latency_slope_min,
        above=True,
        gate=gate,
        note=why,
        source=f"ITL p99 per {th.bin_s:g} s bin vs requests_running, Theil-Sen" + gate_src,
        change=True,
    )
    c.check(
        "network",
        "p50_p99_gap_widening",
        ns["gap_widening"],
        "ratio",
        th.net_gap_widening_min_ratio,
        above=True,
        source="(ITL p99/p50 − 1) high-load bins ÷ low-load bins",
        note=why,
        change=True,
    )
    c.check(
        "network",
        "throughput_elasticity",
        ns["throughput_elasticity"],
        "d log tokens/s / d log running",
        th.net_throughput_elasticity_max,
        above=False,
        gate=gate,
        note=why,
        source="generation tokens/s per bin vs requests_running, Theil-Sen" + gate_src,
        change=True,
    )
    c.info(
        "network", "busbw_over_capability", col.get("busbw_ratio"), "ratio", src,
        note=(f"busbw {col.get('busbw_gbs')} GB/s vs {col.get('capability_gbs')} GB/s; " if col else "")
        + "not a verdict check: small messages are latency-bound far below link peak, "
        "a saturated link near it",
    )  # fmt: skip
    itl = sig.quantiles.get("itl_seconds", {})
    c.info(
        "network", "decode_stall_ratio", _ratio(itl.get(0.99), itl.get(0.5)), "p99/p50",
        "ITL histogram (bucket estimates)", note="not a verdict check: chunked prefill alone widens it",
    )  # fmt: skip
    if sig.expected.get("itl_s"):
        c.info(
            "network", "itl_measured_over_expected",
            _ratio(sig.means.get("itl_seconds"), sig.expected["itl_s"]),
            "ratio", "mean ITL ÷ analyzer.perf expected ITL (deployment's own layout and fabric)",
        )  # fmt: skip
    c.info(
        "network", "load_spread", ns["load_spread"], "max/min running over bins", "engine requests_running"
    )
    if path.fabric_share is not None:
        c.info("network", "fabric_collective_share_ratio", path.fabric_share, "ratio", src,
               note="communicators inside one NVLink domain: fabric overhead, "
               "not network evidence")  # fmt: skip


def _latency_info(c: _Checks, sig: Signals) -> None:
    for concept in ("ttft_seconds", "itl_seconds"):
        for q, v in sorted(sig.quantiles.get(concept, {}).items()):
            c.info(
                "latency",
                f"{concept}_p{round(q * 100)}",
                v,
                "s",
                "histogram buckets",
                note="bucket estimate (linear interpolation inside the bucket)",
            )
    for concept, mean in sorted(sig.means.items()):
        c.info("latency", f"{concept}_mean", mean, "s", "engine _sum/_count")
    for key in ("itl_s", "ttft_s"):
        if key in sig.expected:
            c.info("latency", f"expected_{key}", sig.expected[key], "s", "analyzer.perf (injected)")
    for key in ("prompt_tokens_per_s", "generation_tokens_per_s", "requests_running", "requests_waiting"):
        if key in sig.engine:
            c.info("load", key, sig.engine[key], "1/s" if key.endswith("per_s") else "requests", "engine")


def analyze_envelope(
    con: duckdb.DuckDBPyConnection,
    dep: Deployment,
    start_ns: int,
    end_ns: int,
    th: Thresholds | None = None,
    *,
    network_evidence: NetworkEvidence | None = None,
    expected_latency: ExpectedLatency | None = None,
) -> Verdict:
    """Gather (rule 1) then classify (rules 2-9) one deployment over ``(start_ns, end_ns]``."""
    th = th or Thresholds()
    sig = gather(
        con, dep, start_ns, end_ns, th, network_evidence=network_evidence, expected_latency=expected_latency
    )
    return classify(sig, th, dep.name, start_ns, end_ns)


def analyze_deployment(
    con: duckdb.DuckDBPyConnection,
    dep: Deployment,
    start_ns: int,
    end_ns: int,
    th: Thresholds | None = None,
    *,
    history_s: float = 86400.0,
    network_evidence: NetworkEvidence | None = None,
    expected_latency: ExpectedLatency | None = None,
) -> dict[str, Any]:
    """The full report for one deployment: zone verdict, Cp over ``history_s``, headroom per axis."""
    from analyzer.crossover import cp_from_store, headroom

    th = th or Thresholds()
    # Cp's history first: inside one report the window's gauge bins are its last bins (crossover);
    # its counters are the window's only when it is the window
    history_ns = max(end_ns - int(history_s * NS), 0)
    cp = cp_from_store(con, dep, history_ns, end_ns, th, shared=history_ns == start_ns)
    sig = gather(
        con, dep, start_ns, end_ns, th, network_evidence=network_evidence, expected_latency=expected_latency
    )
    verdict = classify(sig, th, dep.name, start_ns, end_ns)
    p99 = {c: sig.quantiles.get(c, {}).get(0.99) for c in ("ttft_seconds", "itl_seconds")}
    room = headroom(
        running=sig.engine.get("requests_running"),
        kv_usage=sig.engine.get("kv_usage_ratio"),
        dram=sig.gpu.get("dram_active_ratio"),
        busbw_ratio=sig.collectives.get("busbw_ratio"),
        ttft_p99_s=p99["ttft_seconds"],
        itl_p99_s=p99["itl_seconds"],
        ttft_slo_s=dep.ttft_slo_s,
        itl_slo_s=dep.itl_slo_s,
    )
    return {"deployment": dep.summary(), "envelope": verdict.as_dict(), "cp": cp.as_dict(), "headroom": room}
