"""A request's own phases from its spans: queue, prefill, KV transfer, decode, and what TTFT is made of.

Input: ``request_spans`` rows (one per serving request, from the engines' OTLP spans) of one
deployment and window; where a deployment sends no spans, its engine histograms.
Output: :class:`PhaseReport` — per phase the observed quantiles, and the TTFT decomposition.

Rules:
 1. A span belongs to the deployment as :func:`analyzer.planner.span_filter` says (its resource
    names the deployment, else its model is the deployment's model), and to the window when the
    request ended inside it (``end_ns`` in ``[start, end)``).
 2. With spans, every quantile is the empirical quantile of the observed per-request values
    (DuckDB ``quantile_cont``, linear between order statistics): ``source = "spans"``, exact for
    the requests seen, no bucket interpolation. A phase a span does not carry (``NULL``) is left
    out of that phase only.
 3. Without spans, quantiles come from the engine's request-phase histograms
    (:func:`analyzer.latency.window_quantiles`), labelled ``source = "histogram_buckets"`` and
    ``estimate = "bucket_interpolated"``: they are interpolated inside buckets, never exact.
 4. TTFT decomposition, from spans only, over the requests that carry a TTFT: the mean of each
    component — queue, prefill, KV transfer — and ``other`` = mean(TTFT) − their sum, floored at 0
    (scheduling, tokenization, the first decode step, network to the client); each component's
    share is its mean over mean TTFT (a request that lacks a component counts 0 for it). Means
    add up where quantiles do not, so the decomposition is of means, and p99 TTFT is reported
    beside it. A component that no span of the window carries is left out (its time, if any,
    is inside ``other``), so an unmeasured phase never reads as a measured 0.
 5. KV-transfer share of TTFT (rule 4's ``kv_transfer`` share) is the evidence a disaggregated
    deployment offers for the network wall: in a prefill→decode deployment the KV cache crosses
    the fabric inside TTFT, and its share says how much of the user's wait the transfer is.
    Whether the transfer crosses nodes is the envelope's question, not this module's.
 6. Fewer than :data:`MIN_REQUESTS` spans in the window → no span quantiles (too few to rank a
    p99), the histogram fallback of rule 3 is used, and ``note`` says why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import duckdb

from analyzer.deployments import Deployment
from analyzer.latency import window_quantiles
from analyzer.planner import span_filter

PHASES = ("ttft_s", "queue_s", "prefill_s", "kv_transfer_s", "decode_s", "e2e_s")
COMPONENTS = ("queue_s", "prefill_s", "kv_transfer_s")  # rule 4: the parts of TTFT spans carry
QS = (0.5, 0.9, 0.99)
MIN_REQUESTS = 20
# rule 3: the histogram concept standing in for each phase when no spans exist
_HISTOGRAM_OF = {
    "ttft_s": "ttft_seconds",
    "queue_s": "queue_seconds",
    "prefill_s": "prefill_seconds",
    "decode_s": "decode_seconds",
    "e2e_s": "e2e_seconds",
}


@dataclass(frozen=True)
class PhaseQuantiles:
    """Quantiles of one phase in one window, and where they came from (rules 2-3)."""

    phase: str
    count: int
    mean_s: float | None
    quantiles_s: dict[str, float | None]
    source: str  # "spans" | "histogram_buckets"
    estimate: str  # "exact_over_observed_requests" | "bucket_interpolated"


@dataclass(frozen=True)
class PhaseReport:
    """A deployment's request phases and TTFT decomposition over one window."""

    deployment: str
    start_ns: int
    end_ns: int
    requests: int
    phases: list[PhaseQuantiles] = field(default_factory=list)
    ttft_decomposition: dict[str, dict[str, float]] = field(default_factory=dict)
    kv_transfer_share_of_ttft: float | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _q_name(q: float) -> str:
    return f"p{round(q * 100):d}"


def request_phases(
    con: duckdb.DuckDBPyConnection, dep: Deployment, start_ns: int, end_ns: int
) -> PhaseReport:
    """Rules 1-6 for ``dep`` over ``[start_ns, end_ns)``."""
    cond, params = span_filter(con, dep.name, dep.model)
    where = f"{cond} AND end_ns >= ? AND end_ns < ?"
    args = [*params, start_ns, end_ns]
    row = con.execute(f"SELECT count(*) FROM request_spans WHERE {where}", args).fetchone()
    requests = int(row[0]) if row else 0
    if requests < MIN_REQUESTS:
        note = (
            f"{requests} request span(s) in the window (fewer than {MIN_REQUESTS}): "
            "phases from histogram buckets, interpolated estimates"
        )
        return PhaseReport(dep.name, start_ns, end_ns, requests, _from_histograms(con, dep, start_ns, end_ns),
                           note=note)  # fmt: skip
    phases = [_span_phase(con, where, args, phase) for phase in PHASES]
    decomposition, kv_share = _decompose(con, where, args)
    return PhaseReport(
        dep.name, start_ns, end_ns, requests, [p for p in phases if p.count], decomposition, kv_share
    )


def _span_phase(con: duckdb.DuckDBPyConnection, where: str, args: list[Any], phase: str) -> PhaseQuantiles:
    """Rule 2 for one phase."""
    picks = ", ".join(f"quantile_cont({phase}, {q})" for q in QS)
    row = con.execute(
        f"SELECT count({phase}), avg({phase}), {picks} FROM request_spans WHERE {where} AND {phase} >= 0",
        args,
    ).fetchone()
    count = int(row[0]) if row else 0
    values = list(row[2:]) if row else [None] * len(QS)
    return PhaseQuantiles(
        phase,
        count,
        float(row[1]) if row and row[1] is not None else None,
        {_q_name(q): (float(v) if v is not None else None) for q, v in zip(QS, values, strict=True)},
        "spans",
        "exact_over_observed_requests",
    )


def _decompose(
    con: duckdb.DuckDBPyConnection, where: str, args: list[Any]
) -> tuple[dict[str, dict[str, float]], float | None]:
    """Rules 4-5: means of the TTFT components over requests that carry a TTFT."""
    means = ", ".join(f"avg(coalesce({c}, 0))" for c in COMPONENTS)
    counts = ", ".join(f"count({c})" for c in COMPONENTS)
    row = con.execute(
        f"SELECT avg(ttft_s), quantile_cont(ttft_s, 0.99), {means}, {counts} "
        f"FROM request_spans WHERE {where} AND ttft_s >= 0",
        args,
    ).fetchone()
    if not row or row[0] is None or row[0] <= 0:
        return {}, None
    ttft, p99, k = float(row[0]), float(row[1]), len(COMPONENTS)
    parts = {
        c.removesuffix("_s"): float(v or 0.0)
        for c, v, n in zip(COMPONENTS, row[2 : 2 + k], row[2 + k : 2 + 2 * k], strict=True)
        if n
    }
    parts["other"] = max(0.0, ttft - sum(parts.values()))
    out = {name: {"mean_s": value, "share": value / ttft} for name, value in parts.items()}
    out["ttft"] = {"mean_s": ttft, "p99_s": p99, "share": 1.0}
    kv_share = parts["kv_transfer"] / ttft if "kv_transfer" in parts else None
    return out, kv_share


def _from_histograms(
    con: duckdb.DuckDBPyConnection, dep: Deployment, start_ns: int, end_ns: int
) -> list[PhaseQuantiles]:
    """Rule 3: the engine histograms' bucket estimates for the phases they cover."""
    got = window_quantiles(
        con,
        start_ns,
        end_ns,
        keys=list(dep.engine_keys) or None,
        concepts=tuple(_HISTOGRAM_OF.values()),
        qs=QS,
    )
    out = []
    for phase, concept in _HISTOGRAM_OF.items():
        quantiles = got.get(concept)
        if not quantiles:
            continue
        first = next(iter(quantiles.values()))
        out.append(
            PhaseQuantiles(
                phase,
                round(first.observations),
                None,
                {_q_name(q): quantiles[q].value_s for q in QS if q in quantiles},
                "histogram_buckets",
                "bucket_interpolated",
            )
        )
    return out
