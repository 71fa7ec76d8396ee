"""Re-parallelization planner: which layout serves this traffic best, and why (REFERENCE §6).

The search, for a GPU budget, a topology and a workload (ISL, OSL, SLOs):
  1. Enumerate aggregated layouts TP × PP × DP = GPUs (TP and PP powers of two dividing the
     budget); for MoE models also EP = TP (experts over the TP group) and attention-DP + EP; and
     disaggregated prefill/decode splits of the same replica shape.
  2. For each, find the largest per-replica concurrency whose steady-state TTFT and TPOT meet both
     SLOs (:func:`analyzer.perf.expected_latency`); goodput = output tokens/s per GPU there.
  3. Rank by goodput. Gray zone: among candidates within 12.5 % of the best, the simplest wins
     (first no placement against the framework — TP across nodes, PP inside a node — then fewer
     parallel dimensions, disaggregation counting 2) — the seeds' 10–15 % rule
     (:meth:`Candidate.simplicity_key`).
  4. Every candidate carries the framework's reasons: Step 0 (KV footprint), Step 1 (fits one GPU
     with KV headroom → DP), Step 2 (fits one node → TP inside NVLink), Step 3 (multi-node → PP
     across nodes), Step 4 (MoE → EP for experts), and the interconnect check (TP or EP over a
     slow link; P/D only over an RDMA fabric). Step 1 says "DP preferred" only of a DP layout;
     when the pick is not the framework's default (DP where one GPU holds the model, EP for an
     MoE's experts), its reasons add what that default serves against it (:func:`_explain_pick`).
  5. A candidate that meets no SLO says why in words (:func:`why_infeasible`): the memory that
     does not fit, or the TTFT/TPOT that misses its SLO with one request per replica.
  6. Planning for a running deployment (:func:`deployment_context`, :func:`fit_correction`) keeps
     its declared nodes, fabric, engine and precision (the precision a model name carries:
     ``-FP8``, ``-NVFP4``), and compares its measured latency (median TTFT and inter-token
     latency of its request spans) with the model's for its current layout at its measured
     concurrency. The ratios, clamped to [1/5, 50], multiply every candidate's TTFT and TPOT
     before the SLO check (the same engine, host and workload run whichever layout is chosen),
     so a deployment slower than the model serves less per layout within the SLOs, and the
     ranking follows; the plan states the correction as evidence.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace

from analyzer import capacity as cap
from analyzer import modelcfg, perf
from analyzer.capacity import Layout
from analyzer.catalog import FABRICS, Fabric, Gpu
from analyzer.modelcfg import ModelConfig

GRAY_ZONE = 0.125
KV_HEADROOM_SEQUENCES = 16  # Step 1: "fits one GPU with KV headroom" = room for ≥ 16 sequences


@dataclass(frozen=True)
class Workload:
    """Traffic to plan for: prompt/output lengths, SLOs (s) and optional measured load."""

    isl: int
    osl: int
    ttft_slo_s: float = 2.0
    tpot_slo_s: float = 0.05
    arrival_rate_per_s: float = 0.0
    concurrency: float = 0.0


@dataclass(frozen=True)
class Correction:
    """A deployment's measured latency over the model's, applied to every layout (note 6)."""

    tpot_factor: float = 1.0
    ttft_factor: float = 1.0
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class Problem:
    model: ModelConfig
    gpu: Gpu
    gpus: int
    nodes: int = 1
    fabric: Fabric = FABRICS["ib_ndr"]
    backend: str = "vllm"
    precision: str = "bf16"
    correction: Correction = Correction()

    @property
    def topo(self) -> perf.Topology:
        per_node = min(self.gpus // max(self.nodes, 1), self.gpu.domain_gpus) or 1
        return perf.Topology(gpus_per_node=per_node, inter_node=self.fabric)


@dataclass
class Candidate:
    """One layout with its predicted figures, limiting wall and reasons."""

    layout: Layout
    disagg: tuple[int, int] = (0, 0)  # (prefill replicas, decode replicas) when disaggregated
    batch: int = 0
    ttft_s: float = float("inf")
    tpot_s: float = float("inf")
    goodput_per_gpu: float = 0.0
    kv_headroom_sequences: int = 0
    wall: str = ""
    reasons: list[str] = field(default_factory=list)
    terms: dict[str, float] = field(default_factory=dict)
    infeasible: str = ""  # why no concurrency meets the SLOs, in words (empty when one does)

    @property
    def name(self) -> str:
        if self.disagg[0]:
            return f"P/D {self.disagg[0]}×{self.layout.label()} + {self.disagg[1]}×{self.layout.label()}"
        return self.layout.label()

    def complexity(self) -> int:
        """Parallel dimensions in use (TP, PP, EP, attention-DP); disaggregation counts 2."""
        lay = self.layout
        return (lay.tp > 1) + (lay.pp > 1) + (lay.ep > 1) + lay.attention_dp + 2 * bool(self.disagg[0])

    def misplaced(self, per_node: int) -> int:
        """Placements against the framework (TP inside NVLink, PP across nodes): TP wider than a
        node (its all-reduces leave NVLink) and PP inside a node (:func:`pp_inside_node`: a stage
        boundary inside one NVLink domain adds pipeline bubbles and a micro-batch schedule that a
        TP/EP split of the same GPUs does without). The gray zone compares these first, so such a
        layout is never "simpler" than a TP/EP layout of comparable goodput."""
        return (self.layout.tp > per_node) + pp_inside_node(self.layout, per_node)

    def simplicity_key(self, per_node: int) -> tuple[int, int]:
        """Gray-zone order, simplest first: (:meth:`misplaced`, :meth:`complexity`)."""
        return self.misplaced(per_node), self.complexity()

    def as_dict(self) -> dict[str, object]:
        return {
            "layout": self.name, "tp": self.layout.tp, "pp": self.layout.pp, "dp": self.layout.dp,
            "ep": self.layout.ep, "attention_dp": self.layout.attention_dp,
            "prefill_replicas": self.disagg[0], "decode_replicas": self.disagg[1],
            "batch_per_replica": self.batch, "ttft_ms": _ms(self.ttft_s), "tpot_ms": _ms(self.tpot_s),
            "goodput_tok_s_per_gpu": round(self.goodput_per_gpu, 1),
            "kv_headroom_sequences": self.kv_headroom_sequences, "wall": self.wall, "reasons": self.reasons,
            "feasible": not self.infeasible, "why_infeasible": self.infeasible or None,
        }  # fmt: skip


def corrected(est: perf.Estimate, c: Correction) -> perf.Estimate:
    """``est`` with the deployment's correction applied to TTFT and TPOT (note 6)."""
    if c.tpot_factor == 1.0 and c.ttft_factor == 1.0:
        return est
    return replace(est, ttft_s=est.ttft_s * c.ttft_factor, tpot_s=est.tpot_s * c.tpot_factor)


def pp_inside_node(lay: Layout, per_node: int) -> bool:
    """Whether ``lay`` pipelines inside a node: more PP stages than the nodes a replica spans
    (TP1·PP8 on one 8-GPU node; TP4·PP4 over two nodes, where PP2 would already span them)."""
    nodes = -(-lay.gpus_per_replica // max(per_node, 1))
    return lay.pp > nodes


def _ms(s: float) -> float | None:
    return None if not math.isfinite(s) else round(s * 1e3, 2)


def why_infeasible(kv: cap.Capacity, est: perf.Estimate | None, w: Workload) -> str:
    """Why a layout serves no concurrency within the SLOs, in words (note 5)."""
    if not kv.fits:
        return f"does not fit: {kv.reason}"
    if est is None:
        return "no estimate"
    over = []
    if est.ttft_s > w.ttft_slo_s:
        over.append(f"TTFT {est.ttft_s * 1e3:.0f} ms > SLO {w.ttft_slo_s * 1e3:.0f} ms")
    if est.tpot_s > w.tpot_slo_s:
        over.append(f"TPOT {est.tpot_s * 1e3:.1f} ms > SLO {w.tpot_slo_s * 1e3:.1f} ms")
    return "misses the SLOs even with one request per replica: " + ", ".join(over or ["no slot"])


def _pow2_upto(n: int) -> list[int]:
    out, k = [], 1
    while k <= n:
        out.append(k)
        k *= 2
    return out


def layouts(p: Problem) -> list[Layout]:
    """Aggregated layouts that use the whole budget (note 1)."""
    out = []
    for tp in _pow2_upto(p.gpus):
        for pp in _pow2_upto(p.gpus // tp):
            if p.gpus % (tp * pp) or pp > p.model.layers:
                continue
            base = Layout(tp=tp, pp=pp, dp=p.gpus // (tp * pp))
            out.append(base)
            if p.model.is_moe and tp > 1:
                out.append(replace(base, ep=tp))
                out.append(replace(base, ep=tp, attention_dp=True))
    return [lay for lay in out if _accepted(p.model, lay)]


def _accepted(model: ModelConfig, lay: Layout) -> bool:
    """Whether the engines accept ``lay`` for ``model`` (:func:`analyzer.capacity.check_layout`)."""
    try:
        cap.check_layout(model, lay)
    except ValueError:
        return False
    return True


def _best_batch(p: Problem, lay: Layout, w: Workload) -> tuple[int, perf.Estimate | None]:
    """Largest per-replica concurrency meeting both SLOs (note 2): powers of two up to the first
    that fails, then a bisection between the last that passed and it, so two layouts are not
    compared at 256 when one of them would hold 448."""

    def meets(b: int) -> tuple[bool, perf.Estimate]:
        est = corrected(
            perf.expected_latency(p.model, p.gpu, lay, b, w.isl, w.osl, p.backend, p.precision, p.topo),
            p.correction,
        )
        return est.running >= b and est.ttft_s <= w.ttft_slo_s and est.tpot_s <= w.tpot_slo_s, est

    best: tuple[int, perf.Estimate | None] = (0, None)
    failed = 0
    for b in _pow2_upto(4096):
        ok, est = meets(b)
        if not ok:
            best, failed = (best if best[1] is not None else (0, est)), b
            break
        best = (b, est)
    lo, hi = best[0], failed
    while lo and hi - lo > max(1, lo // 16):  # to within 1/16 of the concurrency
        mid = (lo + hi) // 2
        ok, est = meets(mid)
        if ok:
            lo, best = mid, (mid, est)
        else:
            hi = mid
    return best


def evaluate(p: Problem, lay: Layout, w: Workload) -> Candidate:
    """Predicted figures of an aggregated layout at its best SLO-meeting concurrency."""
    b, est = _best_batch(p, lay, w)
    c = Candidate(layout=lay, batch=b)
    kv = cap.capacity(p.model, p.gpu, lay, context_tokens=w.isl + w.osl, precision=p.precision)
    c.kv_headroom_sequences = max(0, kv.max_sequences - b)
    if est is not None:
        c.ttft_s, c.tpot_s, c.wall, c.terms = est.ttft_s, est.tpot_s, est.wall, est.terms
        if b:
            c.goodput_per_gpu = est.throughput_per_gpu(lay, w.osl)
    if not b:
        c.infeasible = why_infeasible(kv, est, w)
    c.reasons = reasons(p, c, w)
    if not kv.fits:
        c.wall = "kv_capacity"
        c.reasons.insert(1, f"infeasible: {kv.weights_bytes / 1e9:.1f} GB weights/GPU leave no KV room in "
                            f"{kv.usable_bytes / 1e9:.0f} GB usable HBM")  # fmt: skip
    return c


def evaluate_disagg(p: Problem, lay: Layout, n_prefill: int, w: Workload) -> Candidate:
    """P/D split: n_prefill replicas prefill, the rest decode; goodput = the slower pool's rate."""
    n_decode = lay.dp - n_prefill
    single = replace(lay, dp=1)
    agg = evaluate(p, single, w)
    c = Candidate(layout=single, disagg=(n_prefill, n_decode))
    if agg.batch == 0:
        c.wall, c.reasons = agg.wall, [*agg.reasons, "P/D: a replica meets no SLO, so neither pool can"]
        c.infeasible = agg.infeasible
        return c
    b = agg.batch
    est = corrected(perf.disaggregated_latency(p.model, p.gpu, single, single, 1, b, w.isl, w.osl,
                                               p.backend, p.precision, p.topo), p.correction)  # fmt: skip
    prefill_rate = n_prefill / max(est.terms["prefill_s"], 1e-9)
    decode_rate = n_decode * b / (w.osl * est.tpot_s)
    c.batch, c.ttft_s, c.tpot_s, c.terms = b, est.ttft_s, est.tpot_s, est.terms
    ok = est.ttft_s <= w.ttft_slo_s and est.tpot_s <= w.tpot_slo_s
    c.goodput_per_gpu = min(prefill_rate, decode_rate) * w.osl / p.gpus if ok else 0.0
    if not ok:
        c.infeasible = "P/D: " + why_infeasible(
            cap.capacity(p.model, p.gpu, single, context_tokens=w.isl + w.osl, precision=p.precision), est, w
        ).replace("even with one request per replica", f"at the aggregated layout's {b} per replica")
    c.wall = "network" if est.terms["kv_transfer_s"] > 0.1 * est.ttft_s else est.wall
    c.reasons = reasons(p, c, w)
    return c


def reasons(p: Problem, c: Candidate, w: Workload) -> list[str]:
    """The framework's reasons for this candidate (note 4)."""
    m, lay = p.model, c.layout
    per_node = p.topo.gpus_per_node
    one = cap.capacity(m, p.gpu, Layout(), context_tokens=w.isl + w.osl, precision=p.precision)
    kv_seq = cap.kv_bytes_per_sequence(m, w.isl + w.osl, "bf16")
    out = [f"Step 0: KV {kv_seq / 1e9:.2f} GB per {w.isl + w.osl}-token sequence; "
           f"weights {cap.weight_bytes(m, p.precision) / 1e9:.1f} GB"]  # fmt: skip
    if one.max_sequences >= KV_HEADROOM_SEQUENCES:
        plain = lay.gpus_per_replica == 1 and not c.disagg[0]
        out.append(f"Step 1: fits one GPU with room for {one.max_sequences} sequences → "
                   + ("DP preferred" if plain else "DP is the default; this layout shards the model "
                      "anyway and must earn it in goodput"))  # fmt: skip
    elif lay.gpus_per_replica <= per_node:
        n = lay.gpus_per_replica
        out.append(f"Step 2: no KV headroom on one GPU; replica of {n} fits one node → TP inside NVLink")
    else:
        out.append(
            f"Step 3: replica of {lay.gpus_per_replica} GPUs spans nodes → TP in node, PP across nodes"
        )
    if pp_inside_node(lay, per_node):
        out.append(f"PP{lay.pp} pipelines inside an NVLink node: the framework keeps PP for crossing "
                   f"nodes, so it ranks below TP/EP layouts in the gray zone")  # fmt: skip
    if m.is_moe:
        out.append(f"Step 4: MoE ({m.experts} experts, top-{m.top_k}) → EP for experts"
                   + (f"; EP{lay.ep} used" if lay.ep > 1 else "; experts TP-sharded here"))  # fmt: skip
    out.extend(_interconnect(p, c))
    if c.batch == 0:
        out.append(f"meets no SLO (TTFT ≤ {w.ttft_slo_s}s, TPOT ≤ {w.tpot_slo_s}s) at any concurrency")
    else:
        out.append(f"wall at {c.batch} sequences/replica: {c.wall}")
    return out


def _interconnect(p: Problem, c: Candidate) -> list[str]:
    """Interconnect check: collectives in the token loop over the link they cross (note 4)."""
    lay, per_node, out = c.layout, p.topo.gpus_per_node, []
    if lay.tp > per_node:
        out.append(f"interconnect: TP{lay.tp} crosses nodes over {p.fabric.name} — all-reduces per layer "
                   f"leave NVLink (network-critical)")  # fmt: skip
    if lay.pp > 1 and lay.gpus_per_replica > per_node:
        out.append(f"interconnect: PP boundary over {p.fabric.name} carries only hidden×2 B per token")
    if lay.ep > per_node:
        out.append(f"interconnect: EP{lay.ep} all-to-all crosses {p.fabric.name}")
    if c.disagg[0] and not p.fabric.rdma:
        out.append(f"interconnect: P/D KV transfer over non-RDMA {p.fabric.name} — not recommended")
    return out


def search(p: Problem, w: Workload, *, include_disagg: bool = True) -> list[Candidate]:
    """All candidates, ranked by goodput with the gray-zone rule applied (notes 1-3)."""
    cands = [evaluate(p, lay, w) for lay in layouts(p)]
    if include_disagg and p.fabric.rdma:
        for lay in {c.layout for c in cands if c.layout.dp >= 2 and not c.layout.attention_dp}:
            for n_p in sorted({1, lay.dp // 4, lay.dp // 2} - {0}):
                cands.append(evaluate_disagg(p, lay, n_p, w))
    ranked = rank(cands, p.topo.gpus_per_node)
    _explain_pick(p, ranked)
    return ranked


def _explain_pick(p: Problem, ranked: list[Candidate]) -> None:
    """Make the pick's reasons agree with the pick (note 4): when the framework's default (DP of
    single-GPU replicas where one GPU holds the model with headroom; EP for an MoE's experts) is
    not what ranked first, say what the default serves against the pick."""
    if not ranked or ranked[0].goodput_per_gpu <= 0:
        return
    top = ranked[0]

    def versus(other: Candidate, what: str) -> str:
        if other.goodput_per_gpu <= 0:
            return f"{what} {other.name} meets no SLO ({other.infeasible})"
        gain = top.goodput_per_gpu / other.goodput_per_gpu - 1
        if gain < 0:  # a gray-zone pick (rank): simpler, and close enough
            return (f"{what} {other.name} serves {other.goodput_per_gpu:.0f} tok/s/GPU, {-gain:.0%} more, "
                    "within the gray zone: the simpler pick leads")  # fmt: skip
        return (f"picked over {what} {other.name}: {top.goodput_per_gpu:.0f} vs "
                f"{other.goodput_per_gpu:.0f} tok/s/GPU ({gain:+.0%})")  # fmt: skip

    if any(r.startswith("Step 1:") and "DP is the default" in r for r in top.reasons):
        plain = [c for c in ranked if c.layout.gpus_per_replica == 1 and not c.disagg[0]]
        if plain:
            top.reasons.append(versus(plain[0], "the DP default"))
    if p.model.is_moe and top.layout.ep <= 1:
        ep = [c for c in ranked if c.layout.ep > 1]
        if ep:
            top.reasons.append(versus(ep[0], "the best EP layout"))


def rank(cands: list[Candidate], per_node: int) -> list[Candidate]:
    """Goodput order; the simplest candidate within the gray zone of the best moves to the top.
    Candidates that meet no SLO come last: those that fit before those that do not."""
    cands.sort(key=lambda c: (-c.goodput_per_gpu, c.infeasible.startswith("does not fit"),
                              c.simplicity_key(per_node)))  # fmt: skip
    if not cands or cands[0].goodput_per_gpu <= 0:
        return cands
    top = cands[0].goodput_per_gpu
    zone = [c for c in cands if c.goodput_per_gpu >= top * (1 - GRAY_ZONE)]
    pick = min(zone, key=lambda c: (c.simplicity_key(per_node), -c.goodput_per_gpu))
    if pick is not cands[0]:
        pick.reasons.append(
            f"gray zone: within {100 * (1 - pick.goodput_per_gpu / top):.0f} % of {cands[0].name} "
            f"({top:.0f} tok/s/GPU) and simpler → preferred"
        )
        cands.remove(pick)
        cands.insert(0, pick)
    return cands


SPAN_DEPLOYMENT_ATTR = '$."resource.k8s.deployment.name"'


def span_filter(con: object, deployment: str, model: str) -> tuple[str, list[object]]:
    """SQL condition selecting ``request_spans`` rows of ``deployment``.

    1. Spans whose resource names the deployment (``k8s.deployment.name``) belong to it.
    2. Spans that name no deployment belong to it when their model is the deployment's model
       under :func:`analyzer.modelcfg.canonical_name` (``meta-llama/Llama-3.1-70B-Instruct`` is
       ``llama-3.1-70b``).
    """
    q = getattr(con, "execute")  # noqa: B009 - duckdb connection or cursor
    names = [r[0] for r in q("SELECT DISTINCT model FROM request_spans WHERE model IS NOT NULL").fetchall()]
    want = modelcfg.canonical_name(model) if model else ""
    models = [m for m in names if want and modelcfg.canonical_name(m) == want]
    cond = (
        f"(json_extract_string(attributes, '{SPAN_DEPLOYMENT_ATTR}') = ? OR "
        f"(json_extract_string(attributes, '{SPAN_DEPLOYMENT_ATTR}') IS NULL AND list_contains(?, model)))"
    )
    return cond, [deployment, models]


def _engine_filter(con: object, deployment: str, model: str) -> str:
    """SQL condition for the deployment's engine series: its declared targets, else its model."""
    q = getattr(con, "execute")  # noqa: B009
    row = q(
        "SELECT json_extract_string(spec, '$.targets') FROM deployments WHERE name = ?", [deployment]
    ).fetchone()
    targets = json.loads(row[0]) if row and row[0] else []
    if targets:
        return "list_contains(" + _sql_list(targets) + ", source)"
    names = [r[0] for r in q("SELECT DISTINCT model FROM engine_samples").fetchall()]
    want = modelcfg.canonical_name(model) if model else ""
    return (
        "list_contains("
        + _sql_list([m for m in names if want and modelcfg.canonical_name(m) == want])
        + ", model)"
    )


def _sql_list(values: list[str]) -> str:
    return "[" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + "]::VARCHAR[]"


def workload_from_store(con: object, deployment: str, ttft_slo_s: float, tpot_slo_s: float) -> Workload:
    """The measured workload of ``deployment`` from the store (a DuckDB connection or cursor).

    1. ISL/OSL = the p50 of ``request_spans.input_tokens`` / ``output_tokens`` of the
       deployment's spans (:func:`span_filter`).
    2. Arrival rate = spans / (last start − first start).
    3. Concurrency = mean of the deployment's engines' ``requests_running`` (same model).
    Raises ``ValueError`` naming the deployment when it or its spans are missing.
    """
    q = getattr(con, "execute")  # noqa: B009 - duckdb connection or cursor
    row = q("SELECT model FROM deployments WHERE name = ?", [deployment]).fetchone()
    if row is None:
        raise ValueError(f"deployment {deployment!r} is not in the store's deployments table")
    model = row[0]
    cond, params = span_filter(con, deployment, model)
    spans = q(
        "SELECT quantile_cont(input_tokens, 0.5), quantile_cont(output_tokens, 0.5), count(*), "
        f"(max(start_ns) - min(start_ns)) / 1e9 FROM request_spans WHERE {cond} AND input_tokens > 0",
        params,
    ).fetchone()
    if spans is None or not spans[2]:
        raise ValueError(f"deployment {deployment!r}: no request_spans with input_tokens (model {model!r})")
    running = q(
        "SELECT avg(value) FROM engine_samples WHERE concept = 'requests_running' AND "
        f"{_engine_filter(con, deployment, model)}"
    ).fetchone()
    rate = spans[2] / spans[3] if spans[3] else 0.0
    return Workload(
        isl=int(spans[0]), osl=max(1, int(spans[1])), ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s,
        arrival_rate_per_s=rate, concurrency=float(running[0]) if running and running[0] is not None else 0.0,
    )  # fmt: skip


def current_layout(con: object, deployment: str) -> tuple[Layout, dict[str, str]]:
    """The deployment's declared layout and its model/gpu/fabric from the ``deployments`` table."""
    q = getattr(con, "execute")  # noqa: B009
    row = q(
        "SELECT tp, pp, dp, ep, model, gpu_type, fabric FROM deployments WHERE name = ?", [deployment]
    ).fetchone()
    if row is None:
        raise ValueError(f"deployment {deployment!r} is not in the store's deployments table")
    tp, pp, dp, ep = (max(1, int(v or 1)) for v in row[:4])
    return Layout(tp=tp, pp=pp, dp=dp, ep=ep), {
        "model": row[4] or "",
        "gpu": row[5] or "",
        "fabric": row[6] or "",
    }


def compare(baseline: Candidate, best: Candidate) -> str:
    """What the change buys, in goodput per GPU and latency."""
    if best.goodput_per_gpu <= 0:
        return f"no layout meets the SLOs; {baseline.name}: {baseline.infeasible or 'misses them'}"
    if best.layout == baseline.layout and best.disagg == baseline.disagg:
        return f"keep {baseline.name}: it is already the best layout found"
    if baseline.goodput_per_gpu <= 0:
        return f"{best.name} meets the SLOs at {best.goodput_per_gpu:.0f} tok/s/GPU; {baseline.name} does not"
    gain = best.goodput_per_gpu / baseline.goodput_per_gpu - 1
    return (
        f"{best.name} vs current {baseline.name}: goodput {gain:+.0%} per GPU "
        f"({baseline.goodput_per_gpu:.0f} → {best.goodput_per_gpu:.0f} tok/s/GPU), "
        f"TPOT {_ms(baseline.tpot_s)} → {_ms(best.tpot_s)} ms"
    )


CORRECTION_RANGE = (0.2, 50.0)
_PRECISION_IN_NAME = (("nvfp4", "fp4"), ("mxfp4", "fp4"), ("fp4", "fp4"), ("fp8", "fp8"))


def deployment_context(con: object, deployment: str) -> dict[str, str | int]:
    """The deployment's declared nodes (distinct host names, at least 1), engine and the precision
    its model name carries ("" when it names none) (note 6)."""
    q = getattr(con, "execute")  # noqa: B009
    row = q("SELECT model, nodes, engine FROM deployments WHERE name = ?", [deployment]).fetchone()
    if row is None:
        raise ValueError(f"deployment {deployment!r} is not in the store's deployments table")
    nodes = json.loads(row[1]) if row[1] else []
    low = (row[0] or "").lower()
    precision = next((p for key, p in _PRECISION_IN_NAME if key in low), "")
    engine = (row[2] or "").strip().lower()
    return {"nodes": max(len(set(nodes)), 1), "engine": engine, "precision": precision}


def measured_latency(con: object, deployment: str) -> tuple[float | None, float | None, int]:
    """Median TTFT and inter-token latency (decode time / (output tokens − 1)) of the deployment's
    request spans (:func:`span_filter`), and how many spans gave an ITL."""
    q = getattr(con, "execute")  # noqa: B009
    row = q("SELECT model FROM deployments WHERE name = ?", [deployment]).fetchone()
    if row is None:
        raise ValueError(f"deployment {deployment!r} is not in the store's deployments table")
    cond, params = span_filter(con, deployment, row[0])
    itl = "output_tokens > 1 AND decode_s > 0"
    got = q(
        "SELECT quantile_cont(ttft_s, 0.5), "
        f"quantile_cont(decode_s / (output_tokens - 1), 0.5) FILTER (WHERE {itl}), "
        f"count(*) FILTER (WHERE {itl}) FROM request_spans WHERE {cond}",
        params,
    ).fetchone()
    if got is None:
        return None, None, 0
    return got[0], got[1], int(got[2] or 0)


def fit_correction(
    p: Problem, layout: Layout, w: Workload, ttft_s: float | None, itl_s: float | None
) -> Correction:
    """The deployment's measured / modelled TTFT and TPOT for its current ``layout`` at its
    measured concurrency per replica (``Workload.concurrency``, the mean of its engines'
    ``requests_running``; at least 1), clamped to :data:`CORRECTION_RANGE` (note 6)."""
    running = max(1, round(w.concurrency))
    replica = replace(layout, dp=1)
    est = perf.expected_latency(
        p.model, p.gpu, replica, running, w.isl, w.osl, p.backend, p.precision, p.topo
    )
    if est.running <= 0:
        return Correction(evidence=(f"no correction: the model says {layout.label()} does not fit",))
    lo, hi = CORRECTION_RANGE
    tpot_f = min(max(itl_s / est.tpot_s, lo), hi) if itl_s else 1.0
    ttft_f = min(max(ttft_s / est.ttft_s, lo), hi) if ttft_s else 1.0
    where = f"{layout.label()} at {running} running/replica, ISL {w.isl} OSL {w.osl}"
    ev = []
    if itl_s:
        ev.append(f"measured ITL {itl_s * 1e3:.1f} ms vs model {est.tpot_s * 1e3:.1f} ms ({where}) "
                  f"→ every layout's TPOT × {tpot_f:.2f}")  # fmt: skip
    if ttft_s:
        ev.append(f"measured TTFT {ttft_s * 1e3:.0f} ms vs model {est.ttft_s * 1e3:.0f} ms ({where}) "
                  f"→ every layout's TTFT × {ttft_f:.2f}")  # fmt: skip
    return Correction(tpot_f, ttft_f, tuple(ev) or ("no measured latency: no correction",))
