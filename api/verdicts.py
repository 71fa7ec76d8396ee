"""IOE's verdicts as Prometheus series (docs/metrics.md, "Verdicts"), from a custom Collector.

On each scrape, for every deployment, over the last ``window_s`` ending at the newest sample:
  1. ``ioe_deployment_zone{zone}`` is 1 for the primary zone and 0 for the four others;
     ``ioe_deployment_secondary_zone{zone}`` is 1 for the secondary zone (if any); the zone label
     takes only the five zone names.
  2. TTFT/ITL p50/p99 (bucket estimates) are one gauge per quantile
     (``ioe_deployment_ttft_p99_seconds``, …): a ``quantile`` label belongs to summaries only.
     KV headroom (1 − mean KV usage, and sequences left), Cp, concurrency, collective exposed
     share and busbw/capability come from the envelope report; a series whose value is unknown
     is left out rather than exported as NaN.
  3. Per ``signal`` ∈ {ttft, itl}: ``ioe_deployment_p99_baseline_available`` is 1 when the
     regression rows hold a baseline p99, else 0; only then are
     ``ioe_deployment_p99_regression_ratio`` and the 0/1 ``ioe_deployment_p99_regression``
     exported, so "no baseline" never reads as "no regression".
  4. ``ioe_straggler_score_ratio`` / ``ioe_straggler`` per flagged rank (blame share; 1 when
     persistent). Only flagged ranks are exported, so labels stay bounded by the deployment's ranks.
  5. ``ioe_analysis_timestamp_seconds`` is when the verdict was computed (wall clock).
  6. ``ioe_deployment_ttft_share_ratio{phase}``: the share of mean TTFT each part takes, from
     request spans (:mod:`analyzer.phases` rule 4): ``phase`` ∈ ``queue``, ``prefill``,
     ``kv_transfer`` (a part only when spans carry it) and ``other`` (what the spans do not break
     down). Absent without enough spans: a histogram estimate cannot be decomposed.
The analyses go through the app's TTL cache, so a scrape every few seconds costs one analysis
per cache period. A deployment whose analysis fails is skipped (logged once per scrape).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)
ZONE_NAMES = ("compute", "hbm_bandwidth", "kv_capacity", "network", "headroom", "saturated", "unknown")
SIGNALS = {"ttft_seconds": "ttft", "itl_seconds": "itl"}

Analysis = Callable[[], list[tuple[Any, dict[str, Any], dict[str, Any], float, dict[str, Any]]]]
"""Returns ``(deployment, envelope report, stragglers report, computed_at_s, phases report)`` per
deployment."""
TTFT_PARTS = ("queue", "prefill", "kv_transfer", "other")


_D, _RANK = ("deployment",), ("deployment", "rank", "host", "gpu")
FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "zone": ("ioe_deployment_zone", "1 for the primary envelope zone, 0 for the others", (*_D, "zone")),
    "secondary": (
        "ioe_deployment_secondary_zone",
        "1 for the secondary zone when one is close",
        (*_D, "zone"),
    ),
    "conf": ("ioe_deployment_zone_confidence_ratio", "Confidence of the primary zone, 0..1", _D),
    **{
        f"{sig}_p{q}": (
            f"ioe_deployment_{sig}_p{q}_seconds",
            f"{sig.upper()} p{q} (bucket-interpolated estimate)",
            _D,
        )
        for sig in ("ttft", "itl")
        for q in ("50", "99")
    },
    "kv": ("ioe_deployment_kv_headroom_ratio", "1 - KV cache usage", _D),
    "kvseq": ("ioe_deployment_kv_headroom_sequences", "Sequences that still fit at the current mix", _D),
    "cp": ("ioe_deployment_crossover_concurrency", "Fitted Cp: where throughput stops scaling", _D),
    "conc": ("ioe_deployment_concurrency", "Running requests (window mean)", _D),
    "exposed": ("ioe_deployment_collective_exposed_ratio", "Exposed collective time / step time", _D),
    "busbw": ("ioe_deployment_collective_busbw_ratio", "Achieved bus bandwidth / fabric capability", _D),
    "regr": ("ioe_deployment_p99_regression_ratio", "Current p99 / baseline p99", (*_D, "signal")),
    "regflag": ("ioe_deployment_p99_regression", "1 when a p99 regression is detected", (*_D, "signal")),
    "baseline": (
        "ioe_deployment_p99_baseline_available",
        "1 when a baseline p99 exists to compare with, else 0",
        (*_D, "signal"),
    ),
    "score": ("ioe_straggler_score_ratio", "Share of peers' wait blamed on this rank, 0..1", _RANK),
    "strag": ("ioe_straggler", "1 when the rank is a persistent straggler", _RANK),
    "ts": ("ioe_analysis_timestamp_seconds", "When the verdict was computed", _D),
    "ttft_share": (
        "ioe_deployment_ttft_share_ratio",
        "Share of mean TTFT per phase, from request spans (exact over the requests seen)",
        (*_D, "phase"),
    ),
}


def _families() -> dict[str, GaugeMetricFamily]:
    return {
        k: GaugeMetricFamily(name, doc, labels=list(labels)) for k, (name, doc, labels) in FAMILIES.items()
    }


def _add(fam: GaugeMetricFamily, labels: list[str], value: Any) -> None:
    if value is not None:
        fam.add_metric(labels, float(value))


def _evidence(env: dict[str, Any], signal: str) -> float | None:
    for e in env["envelope"]["evidence"]:
        if e["signal"] == signal and e["value"] is not None:
            return float(e["value"])
    return None


def add_envelope(f: dict[str, GaugeMetricFamily], name: str, env: dict[str, Any]) -> None:
    """Rules 1-3 for one deployment's envelope report."""
    v = env["envelope"]
    for z in ZONE_NAMES:
        f["zone"].add_metric([name, z], 1.0 if v["primary"] == z else 0.0)
        f["secondary"].add_metric([name, z], 1.0 if v["secondary"] == z else 0.0)
    _add(f["conf"], [name], v["confidence"])
    for sig in ("ttft", "itl"):
        for q in ("50", "99"):
            _add(f[f"{sig}_p{q}"], [name], _evidence(env, f"{sig}_seconds_p{q}"))
    kv = _evidence(env, "kv_usage_ratio")
    _add(f["kv"], [name], None if kv is None else max(1.0 - kv, 0.0))
    _add(f["kvseq"], [name], env["headroom"]["kv_sequences_left"])
    _add(f["cp"], [name], env["cp"]["cp"])
    _add(f["conc"], [name], _evidence(env, "requests_running"))
    exposed = _evidence(env, "collective_share_ratio")
    _add(
        f["exposed"],
        [name],
        exposed if exposed is not None else _evidence(env, "fabric_collective_share_ratio"),
    )
    _add(f["busbw"], [name], _evidence(env, "busbw_over_capability"))
    for row in env["regression"]["metrics"]:
        add_regression(f, name, row)


def add_regression(f: dict[str, GaugeMetricFamily], name: str, row: dict[str, Any]) -> None:
    """Rule 3 for one regression row (signals other than TTFT/ITL are not exported)."""
    signal = SIGNALS.get(row["metric"])
    if signal is None:
        return
    has_baseline = row.get("baseline_s") is not None and row["ratio"] is not None
    f["baseline"].add_metric([name, signal], 1.0 if has_baseline else 0.0)
    if has_baseline:
        _add(f["regr"], [name, signal], row["ratio"])
        f["regflag"].add_metric([name, signal], 1.0 if row["verdict"] == "regressed" else 0.0)


def add_stragglers(f: dict[str, GaugeMetricFamily], name: str, rep: dict[str, Any]) -> None:
    """Rule 4."""
    for s in rep["stragglers"]:
        labels = [name, str(s["rank"]), str(s.get("host") or ""), str(s.get("gpu", -1))]
        f["score"].add_metric(labels, float(s["blame_share"]))
        f["strag"].add_metric(labels, 1.0 if s["kind"] == "persistent" else 0.0)


def add_phases(f: dict[str, GaugeMetricFamily], name: str, rep: dict[str, Any]) -> None:
    """Rule 6."""
    parts = rep.get("ttft_decomposition") or {}
    for phase in TTFT_PARTS:
        if phase in parts:
            _add(f["ttft_share"], [name, phase], parts[phase].get("share"))


class VerdictCollector(Collector):
    """Turns the cached analyses into the families of docs/metrics.md on every ``collect``."""

    def __init__(self, analysis: Analysis):
        self.analysis = analysis

    def collect(self) -> Iterator[GaugeMetricFamily]:
        f = _families()
        try:
            results = self.analysis()
        except Exception:  # a scrape must still answer: self-metrics come from other registries
            log.exception("verdict analysis failed; exporting no verdicts this scrape")
            results = []
        for dep, env, strag, computed_at, phases in results:
            add_envelope(f, dep.name, env)
            add_stragglers(f, dep.name, strag)
            add_phases(f, dep.name, phases)
            f["ts"].add_metric([dep.name], computed_at)
        yield from f.values()

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # registering must not run the analysis
