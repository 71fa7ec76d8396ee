"""Envelope zones: which wall a deployment is against in a window, with the evidence.

Input: a DuckDB connection over the store, a :class:`~analyzer.deployments.Deployment`, a window,
:class:`~analyzer.thresholds.Thresholds`, and two optional injected callables (collective
evidence, model-expected latency). Output: a :class:`Verdict` (primary zone, secondary zone,
confidence, scores, every signal used as an :class:`Evidence` row, and what was missing).

The rule (``th`` = the Thresholds in force; every number below is a field there):
 1. Signals are window means over the deployment's own GPUs and engine series: DCGM SM, tensor
    and DRAM activity; engine KV usage, running, waiting; counter rates (preemptions, tokens);
    queue share of TTFT = mean queue time / mean TTFT (``_sum``/``_count`` counters); TTFT/ITL
    quantiles from histogram buckets (bucket estimates, reported as such).
 2. Each check is ``pass`` (threshold met), ``near`` (within ``near_fraction`` of it), ``fail``,
    or ``n/a`` (its source is missing or the window holds too little variation).
 3. compute: tensor ≥ ``compute_tensor_min_ratio``; SM ≥ ``compute_sm_min_ratio``, which counts
    only while tensors are active (SM_ACTIVE includes warps stalled on memory).
 4. hbm_bandwidth: DRAM ≥ ``hbm_dram_min_ratio``; DRAM/SM ≥ ``hbm_dram_over_sm_min_ratio``;
    tensor < ``hbm_tensor_max_ratio`` — the last two count only while DRAM is busy.
 5. kv_capacity: KV usage ≥ ``kv_usage_min_ratio``; preemptions/s > ``kv_preemptions_min_per_s``;
    waiting/running ≥ ``kv_waiting_min_ratio``; queue share of TTFT ≥ ``kv_queue_share_min_ratio``.
 6. network: exposed collective share ≥ ``net_collective_share_min_ratio``; busbw / capability ≤
    ``net_busbw_max_ratio``; and the four signals of REFERENCE §6, over ``bin_s`` bins:
    (a) slope d log ITL p99 / d log running ≥ ``net_latency_slope_min`` while GPUs unsaturated
    (SM and DRAM < ``net_unsaturated_max_ratio``); (b) p50-p99 gap widening: (p99/p50 − 1) in the
    high-load half of bins ÷ low-load half ≥ ``net_gap_widening_min_ratio``; (c) throughput
    elasticity d log tokens/s / d log running < ``net_throughput_elasticity_max`` while
    unsaturated; (d) decode stalls: ITL p99/p50 ≥ ``net_decode_stall_min_ratio``; and, when a
    latency model is given, measured/expected ITL ≥ ``net_model_excess_min_ratio`` while
    unsaturated. (a) and (c) are ``n/a`` when running varies less than ``net_min_load_spread_ratio``.
 7. A zone's score = (passes + ½ nears) / judged checks (``n/a`` excluded); a zone with no judged
    check has no score and its sources are named in ``missing``.
 8. primary = the best score ≥ ``zone_min_score``, else ``headroom``; secondary = the next best
    score ≥ ``secondary_min_score`` (for headroom: the best zone at or above it).
 9. confidence = base × (0.75 + 0.25 × margin) − penalties, clipped to [0.05, 0.99]; base = the
    primary score (headroom: 1 − best zone score); margin = base − next score; penalties per
    missing source: no DCGM, no collective records, no histograms, no engine series.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import duckdb
import polars as pl

from analyzer.crossover import collective_evidence, load_bins, network_signals
from analyzer.deployments import ENGINE_KEY_SQL, Deployment
from analyzer.latency import NS, counter_increases, window_means, window_quantiles
from analyzer.thresholds import Thresholds

ZONES = ("compute", "hbm_bandwidth", "kv_capacity", "network")
GPU_METRICS = ("sm_active_ratio", "tensor_active_ratio", "dram_active_ratio", "fb_used_bytes")
GAUGES = ("requests_running", "requests_waiting", "kv_usage_ratio")
COUNTERS = ("preemptions_total", "prompt_tokens_total", "generation_tokens_total")

NetworkEvidence = Callable[[duckdb.DuckDBPyConnection, Deployment, int, int], Mapping[str, float] | None]
"""Injected collective evidence: keys ``collective_share_ratio``, ``busbw_ratio`` (optional)."""
ExpectedLatency = Callable[[Deployment, Mapping[str, float]], Mapping[str, float] | None]
"""Injected latency model: load ``{running, prompt_tokens_per_request, kv_usage_ratio}`` →
``{itl_s, ttft_s}``."""


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
    sig = Signals()
    sig.gpu = _gpu_means(con, dep, start_ns, end_ns)
    sig.engine = _engine_window(con, keys, start_ns, end_ns, th)
    wq = window_quantiles(con, start_ns, end_ns, keys=keys, lookback_s=th.counter_lookback_s)
    sig.quantiles = {c: {q: x.value_s for q, x in d.items()} for c, d in wq.items()}
    sig.means = window_means(con, start_ns, end_ns, keys=keys, lookback_s=th.counter_lookback_s)
    sig.bins = load_bins(con, dep, start_ns, end_ns, th)
    sig.collectives, sig.collectives_source = collective_evidence(
        con, dep, start_ns, end_ns, network_evidence
    )
    sig.expected = _expected(dep, sig, expected_latency)
    sig.missing = _missing(sig, dep, network_evidence, expected_latency)
    return sig


def _gpu_means(
    con: duckdb.DuckDBPyConnection, dep: Deployment, start_ns: int, end_ns: int
) -> dict[str, float]:
    if not dep.gpu_uuids:
        return {}
    rows = con.execute(
        """SELECT metric, avg(v), max(v) FROM (
               SELECT uuid, metric, avg(value) AS v FROM gpu_samples
               WHERE ts_ns > ? AND ts_ns <= ? AND list_contains(?, uuid) AND list_contains(?, metric)
               GROUP BY ALL) GROUP BY metric""",
        [start_ns, end_ns, list(dep.gpu_uuids), list(GPU_METRICS)],
    ).fetchall()
    out: dict[str, float] = {}
    for metric, mean, top in rows:
        out[str(metric)] = float(mean)
        out[f"{metric}_max_gpu"] = float(top)
    return out


def _engine_window(
    con: duckdb.DuckDBPyConnection, keys: list[str], start_ns: int, end_ns: int, th: Thresholds
) -> dict[str, float]:
    rows = con.execute(
        f"""SELECT concept, sum(v), max(v), count(*) FROM (
               SELECT {ENGINE_KEY_SQL} AS k, concept, avg(value) AS v FROM engine_samples
               WHERE ts_ns > ? AND ts_ns <= ? AND list_contains(?, concept)
                 AND list_contains(?, {ENGINE_KEY_SQL}) GROUP BY ALL) GROUP BY concept""",
        [start_ns, end_ns, list(GAUGES), keys],
    ).fetchall()
    out: dict[str, float] = {}
    for concept, total, top, n in rows:
        # running/waiting add up over engines; KV usage is a per-engine ratio: mean and max.
        out[str(concept)] = float(total) / n if concept == "kv_usage_ratio" else float(total)
        out[f"{concept}_max"] = float(top)
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
    ) -> None:
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

    def score(self, zone: str) -> float | None:
        judged = [e for e in self.rows if e.zone == zone and e.verdict in ("pass", "near", "fail")]
        if not judged:
            return None
        got = sum(1.0 if e.verdict == "pass" else 0.5 if e.verdict == "near" else 0.0 for e in judged)
        return round(got / len(judged), 3)


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
    _latency_info(c, sig)
    scores = {z: c.score(z) for z in ZONES}
    primary, secondary, base, margin = _pick(scores, th)
    penalties = _penalties(sig, th)
    conf = min(max(base * (0.75 + 0.25 * margin) - sum(penalties.values()), 0.05), 0.99)
    notes = [
        f"confidence = {base:.2f} × (0.75 + 0.25 × {margin:.2f}) − {sum(penalties.values()):.2f} "
        f"({', '.join(penalties) or 'no penalties'})"
    ]
    notes += [f"zone {z} unjudged: no source for any of its checks" for z, s in scores.items() if s is None]
    return Verdict(
        deployment,
        start_ns,
        end_ns,
        primary,
        secondary,
        round(conf, 3),
        scores,
        c.rows,
        list(sig.missing),
        notes,
    )


def _pick(scores: dict[str, float | None], th: Thresholds) -> tuple[str, str | None, float, float]:
    """Rule 8 and the base/margin of rule 9."""
    ranked = sorted(((s, z) for z, s in scores.items() if s is not None), reverse=True)
    best = ranked[0] if ranked else (0.0, "")
    if best[0] >= th.zone_min_score:
        nxt = ranked[1] if len(ranked) > 1 else (0.0, "")
        secondary = nxt[1] if nxt[0] >= th.secondary_min_score else None
        return best[1], secondary, best[0], best[0] - nxt[0]
    secondary = best[1] if best[0] >= th.secondary_min_score else None
    base = 1.0 - best[0]
    return "headroom", secondary, base, base - best[0]


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
    waiting = _ratio(e.get("requests_waiting"), max(e.get("requests_running", 0.0), 1.0)) if e else None
    c.check(
        "kv_capacity",
        "waiting_over_running",
        waiting,
        "ratio",
        th.kv_waiting_min_ratio,
        above=True,
        source="engine requests_waiting / requests_running (window means, summed over engines)",
    )
    share = _ratio(sig.means.get("queue_seconds"), sig.means.get("ttft_seconds"))
    c.check(
        "kv_capacity",
        "queue_share_of_ttft",
        None if share is None else min(share, 1.0),
        "ratio",
        th.kv_queue_share_min_ratio,
        above=True,
        source="engine queue_seconds_sum/_count ÷ ttft_seconds_sum/_count (exact means)",
    )


def _unsaturated(sig: Signals, th: Thresholds) -> bool | None:
    sm, dram = sig.gpu.get("sm_active_ratio"), sig.gpu.get("dram_active_ratio")
    if sm is None:
        return None
    return sm < th.net_unsaturated_max_ratio and (dram is None or dram < th.net_unsaturated_max_ratio)


def _network_checks(c: _Checks, sig: Signals) -> None:
    th, col = c.th, sig.collectives
    src = sig.collectives_source or "collective records"
    c.check(
        "network",
        "collective_share_ratio",
        col.get("collective_share_ratio"),
        "ratio",
        th.net_collective_share_min_ratio,
        above=True,
        source=src,
    )
    c.check(
        "network",
        "busbw_over_capability",
        col.get("busbw_ratio"),
        "ratio",
        th.net_busbw_max_ratio,
        above=False,
        source=src,
        note=f"busbw {col.get('busbw_gbs')} GB/s vs {col.get('capability_gbs')} GB/s" if col else "",
    )
    unsat = _unsaturated(sig, th)
    gate = (
        None
        if unsat
        else (
            "GPUs saturated: latency/throughput bend explained by compute or HBM" if unsat is False else None
        )
    )
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
        source=f"ITL p99 per {th.bin_s:g} s bin vs requests_running" + gate_src,
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
        source="generation tokens/s per bin vs requests_running" + gate_src,
    )
    itl = sig.quantiles.get("itl_seconds", {})
    c.check(
        "network",
        "decode_stall_ratio",
        _ratio(itl.get(0.99), itl.get(0.5)),
        "p99/p50",
        th.net_decode_stall_min_ratio,
        above=True,
        source="ITL histogram (bucket estimates)",
    )
    exp_itl = sig.expected.get("itl_s")
    if exp_itl:
        c.check(
            "network",
            "itl_measured_over_expected",
            _ratio(sig.means.get("itl_seconds"), exp_itl),
            "ratio",
            th.net_model_excess_min_ratio,
            above=True,
            gate=gate,
            source="mean ITL (_sum/_count) ÷ analyzer.perf expected ITL",
        )
    c.info(
        "network", "load_spread", ns["load_spread"], "max/min running over bins", "engine requests_running"
    )


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
    cp = cp_from_store(con, dep, max(end_ns - int(history_s * NS), 0), end_ns, th)
    return {"deployment": dep.summary(), "envelope": verdict.as_dict(), "cp": cp.as_dict(), "headroom": room}
