"""Step-time model: expected TTFT and TPOT of a layout at a batch, with every term shown.

Rules (REFERENCE §5), per GPU of the most loaded pipeline stage:
  1. Decode step = max(HBM time, compute time) + communication + a fixed per-step overhead.
     HBM time = (weights/GPU touched + KV of the batch) / (HBM bandwidth × hbm_eff); an MoE step
     touches only the experts the batch routes to (``min(experts, batch × top_k)``).
     Compute time = 2 × active params × tokens / (TP·PP) / (dense peak × mfu) + attention FLOPs.
  2. Prefill is compute-bound: 2 × active params × prompt tokens + 2 × layers × ISL² × heads ×
     head_dim (causal attention), over the same roofline.
  3. TP: 2 all-reduces per layer of tokens × hidden × 2 B; ring traffic 2(n−1)/n × message.
     PP: hidden × 2 B per token at each stage boundary; a token crosses all PP stages in turn,
     each running 1/PP of the batch (the pipeline's micro-batches), so PP does not shorten TPOT.
     EP: dispatch + combine all-to-all ≈ 2 × top_k × hidden × bytes × (EP−1)/EP per token per
     MoE layer. P/D: KV bytes/token × ISL per request crosses the inter-node fabric.
  4. Each transfer costs the latency + bytes / one-way bandwidth of the link it crosses: the
     scale-up (NVLink) domain when the group fits in one node, the inter-node fabric otherwise.
  5. Serving at a fixed concurrency C in aggregated mode (the calibration benchmarks): the running
     batch is min(C, sequences that fit in KV); every decode step absorbs the prefills of the
     running/OSL requests that arrive per step (chunked prefill), which is why TPOT rises with
     ISL/OSL; TTFT is the request's own prefill, the prefills queued with it, and, when C exceeds
     what fits, the wait for a slot.
  6. All efficiency factors are in :data:`EFFICIENCY` (one row per backend) — nothing per row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from analyzer import capacity as cap
from analyzer.capacity import Layout
from analyzer.catalog import FABRICS, Fabric, Gpu
from analyzer.modelcfg import ModelConfig

ACT_BYTES = 2  # activations cross links in BF16


@dataclass(frozen=True)
class Efficiency:
    """Physically meaningful efficiency factors of a serving backend (note 6).

    mfu: fraction of dense tensor peak reached by prefill/large GEMMs.
    hbm_eff: fraction of HBM bandwidth reached by decode's weight and KV reads.
    step_overhead_s: fixed time per engine step (scheduling, sampling, kernel launch gaps).
    comm_eff: fraction of link bandwidth a collective reaches.
    fp8_kv: whether the backend stores the KV cache in FP8 when the weights are FP8/FP4.
    burst_share: share of a closed-loop benchmark's requests that arrive in its opening burst
      (all C requests at once, prefilled one after another before steady state). It describes
      the harness that measured the calibration rows, not the hardware; planning uses 0.
    """

    mfu: float
    hbm_eff: float
    step_overhead_s: float
    comm_eff: float
    fp8_kv: bool
    burst_share: float = 0.0


# Fitted once against tests/data/silicon/dense_calibration.csv on a coarse grid (mfu 0.45/0.6,
# hbm_eff 0.8/0.9, overhead 0.5/1.5/3 ms, burst 0.25-1.0), minimizing median TPOT + ½ TTFT error
# per backend: ``python -m bench.calibration`` reproduces the table. hbm_eff 0.9 × 3.35 TB/s is
# the ~3.0 TB/s device copy measured on the project's H100 (REFERENCE §5).
EFFICIENCY: dict[str, Efficiency] = {
    "trtllm": Efficiency(
        mfu=0.45, hbm_eff=0.80, step_overhead_s=1.5e-3, comm_eff=0.7, fp8_kv=True, burst_share=0.25
    ),
    "vllm": Efficiency(
        mfu=0.60, hbm_eff=0.90, step_overhead_s=3.0e-3, comm_eff=0.7, fp8_kv=False, burst_share=0.25
    ),
    "sglang": Efficiency(
        mfu=0.45, hbm_eff=0.90, step_overhead_s=1.5e-3, comm_eff=0.7, fp8_kv=False, burst_share=0.5
    ),
}


@dataclass(frozen=True)
class Topology:
    """Where the GPUs sit: GPUs per node (one scale-up domain) and the fabric between nodes."""

    gpus_per_node: int = 8
    inter_node: Fabric = FABRICS["ib_ndr"]

    @classmethod
    def for_gpu(cls, gpu: Gpu, inter_node: Fabric = FABRICS["ib_ndr"]) -> Topology:
        return cls(gpus_per_node=gpu.domain_gpus, inter_node=inter_node)


@dataclass(frozen=True)
class Estimate:
    """Expected latencies and the terms they are made of (seconds, bytes, tokens)."""

    ttft_s: float
    tpot_s: float
    running: int  # sequences decoding together per replica
    wall: str  # compute | hbm_bandwidth | kv_capacity | network
    terms: dict[str, float] = field(default_factory=dict)

    def throughput_per_gpu(self, layout: Layout, osl: int) -> float:
        """Output tokens/s per GPU in steady state: running / (TTFT + OSL × TPOT) × OSL / GPUs."""
        if self.running <= 0:
            return 0.0
        cycle = self.ttft_s + osl * self.tpot_s
        return self.running * osl / cycle / layout.gpus_per_replica


def link_time(link: Fabric, nbytes: float, eff: float) -> float:
    """Latency + bytes / (one-way bandwidth × efficiency) (note 4)."""
    return link.latency_s + nbytes / (link.bytes_per_s * eff)


def group_link(gpu: Gpu, topo: Topology, span: int) -> Fabric:
    """The slowest link a group spanning ``span`` consecutive GPUs crosses (note 4)."""
    return FABRICS[gpu.scale_up] if span <= topo.gpus_per_node else topo.inter_node


def allreduce_time(link: Fabric, n: int, nbytes: float, eff: float) -> float:
    """Ring all-reduce of ``nbytes`` over ``n`` GPUs: latency + 2(n−1)/n × bytes / bandwidth."""
    if n <= 1:
        return 0.0
    return link_time(link, 2 * (n - 1) / n * nbytes, eff)


@dataclass(frozen=True)
class Setup:
    """Everything fixed for one estimate: model, hardware, layout, precision and backend."""

    model: ModelConfig
    gpu: Gpu
    layout: Layout
    precision: str = "bf16"
    backend: str = "vllm"
    topo: Topology = field(default_factory=Topology)

    @property
    def eff(self) -> Efficiency:
        if self.backend not in EFFICIENCY:
            raise KeyError(f"unknown backend {self.backend!r}; known: {', '.join(EFFICIENCY)}")
        return EFFICIENCY[self.backend]

    @property
    def kv_precision(self) -> str:
        return "fp8" if self.precision in ("fp8", "fp4") and self.eff.fp8_kv else "bf16"

    @property
    def stage_layers(self) -> int:
        return cap.stage_layers(self.model, self.layout.pp)


def touched_weight_bytes(s: Setup, tokens: int) -> float:
    """Weight bytes per GPU one step reads: all of a dense model; routed experts hit by the batch."""
    full = cap.weights_per_gpu(s.model, s.precision, s.layout)
    m = s.model
    if not m.is_moe:
        return full
    shard = s.layout.ep if s.layout.ep > 1 else s.layout.tp
    local = m.experts / shard if s.layout.ep > 1 else m.experts
    expert_b = m.expert_params() / (1 if s.layout.ep > 1 else shard) * cap.bytes_per_param(s.precision)
    layers = s.stage_layers * m.moe_layers / m.layers
    all_local = layers * local * expert_b
    hit = min(local, tokens * m.top_k / shard if s.layout.ep > 1 else tokens * m.top_k)
    return full - all_local + layers * hit * expert_b


def compute_time(s: Setup, tokens: int, ctx_tokens: float, causal_prefill: bool) -> float:
    """GEMM + attention FLOPs of ``tokens`` tokens on one GPU over its dense peak × mfu (notes 1-2)."""
    m, lay = s.model, s.layout
    attn_tp = 1 if lay.attention_dp else lay.tp
    gemm = 2 * m.active_params() * tokens / (lay.tp * lay.pp)
    span = ctx_tokens / 2 if causal_prefill else ctx_tokens
    attn = 4 * s.stage_layers * tokens * span * m.heads * m.head_dim / attn_tp
    return (gemm + attn) / (s.gpu.peak_flops(s.precision) * s.eff.mfu)


def comm_time(s: Setup, tokens: int) -> dict[str, float]:
    """Per-step communication on one stage: TP all-reduces, EP all-to-all, PP sends (note 3)."""
    m, lay, e = s.model, s.layout, s.eff.comm_eff
    out: dict[str, float] = {}
    msg = tokens * m.hidden * ACT_BYTES
    if lay.tp > 1 and not lay.attention_dp:
        link = group_link(s.gpu, s.topo, lay.tp)
        out["tp_allreduce_s"] = 2 * s.stage_layers * allreduce_time(link, lay.tp, msg, e)
    if m.is_moe and lay.ep > 1:
        link = group_link(s.gpu, s.topo, lay.ep)
        per = 2 * m.top_k * m.hidden * ACT_BYTES * (lay.ep - 1) / lay.ep * tokens / lay.ep
        moe_layers = s.stage_layers * m.moe_layers / m.layers
        out["ep_alltoall_s"] = moe_layers * 2 * link_time(link, per / 2, e)
    if lay.pp > 1:
        link = group_link(s.gpu, s.topo, lay.tp * lay.pp)
        out["pp_send_s"] = (lay.pp - 1) * link_time(link, msg, e)
    return out


def decode_step(s: Setup, batch: int, ctx_tokens: float) -> dict[str, float]:
    """Terms of one decode step for ``batch`` sequences of mean context ``ctx_tokens`` (note 1)."""
    lay = s.layout
    per_stage = max(1, round(batch / lay.pp))
    kv = per_stage * cap.kv_per_gpu_per_sequence(s.model, round(ctx_tokens), s.kv_precision, lay)
    if lay.attention_dp:
        kv /= lay.tp
    weights = touched_weight_bytes(s, per_stage)
    hbm = (weights + kv) / (s.gpu.hbm_bytes_per_s * s.eff.hbm_eff)
    flops = compute_time(s, per_stage, ctx_tokens, causal_prefill=False)
    comm = comm_time(s, per_stage)
    stage = max(hbm, flops) + comm.get("tp_allreduce_s", 0.0) + comm.get("ep_alltoall_s", 0.0)
    return {
        "weights_read_bytes": weights,
        "kv_read_bytes": kv,
        "decode_hbm_s": hbm,
        "decode_compute_s": flops,
        **{f"decode_{k}": v for k, v in comm.items()},
        "decode_step_s": lay.pp * stage + comm.get("pp_send_s", 0.0) + s.eff.step_overhead_s,
    }


def prefill_time(s: Setup, tokens: int, isl: int) -> dict[str, float]:
    """Terms of prefilling ``tokens`` prompt tokens of ``isl``-long prompts (note 2).

    The marginal cost (``prefill_stage_s``) is what a stage adds when those tokens ride along in
    a decode step; a prompt's latency passes every stage in turn (``prefill_s``).
    """
    lay = s.layout
    flops = compute_time(s, tokens, isl, causal_prefill=True)
    comm = comm_time(s, tokens)
    stage = flops + comm.get("tp_allreduce_s", 0.0) + comm.get("ep_alltoall_s", 0.0)
    return {
        "prefill_compute_s": flops * lay.pp,
        **{f"prefill_{k}": v for k, v in comm.items()},
        "prefill_stage_s": stage,
        "prefill_s": lay.pp * stage + comm.get("pp_send_s", 0.0),
    }


def _wall(terms: dict[str, float], queued: bool) -> str:
    """The wall the decode step presses against (REFERENCE §6 zones).

    1. Requests waiting for KV room → kv_capacity. 2. Communication above a quarter of the step →
    network. 3. Otherwise the larger of the HBM and compute rooflines.
    """
    if queued:
        return "kv_capacity"
    comm = sum(
        v
        for k, v in terms.items()
        if k.startswith("decode_") and k.endswith(("allreduce_s", "alltoall_s", "send_s"))
    )
    if comm > 0.25 * terms["decode_step_s"]:
        return "network"
    return "hbm_bandwidth" if terms["decode_hbm_s"] >= terms["decode_compute_s"] else "compute"


def expected_latency(
    model: ModelConfig,
    gpu: Gpu,
    layout: Layout,
    batch: int,
    isl: int,
    osl: int,
    backend: str = "vllm",
    precision: str = "bf16",
    topo: Topology | None = None,
    burst_share: float = 0.0,
) -> Estimate:
    """Expected TTFT and TPOT at concurrency ``batch`` per replica, aggregated serving (note 5).

    ``burst_share`` > 0 mixes in a benchmark's opening burst: those requests see the prefills of
    the burst ahead of them ((running + 1) / 2 prompts on average) and decode without
    interference, because all prompts were prefilled before decoding started.
    """
    s = Setup(model, gpu, layout, precision, backend, topo or Topology.for_gpu(gpu))
    c = cap.capacity(
        model, gpu, layout, context_tokens=isl + osl, precision=precision, kv_precision=s.kv_precision
    )
    if not c.fits:
        inf = float("inf")
        return Estimate(
            inf,
            inf,
            0,
            "kv_capacity",
            {"weights_per_gpu_bytes": c.weights_bytes, "kv_budget_bytes": c.kv_budget_bytes},
        )
    running = max(1, min(batch, c.max_sequences))
    terms = decode_step(s, running, isl + osl / 2)
    own = prefill_time(s, isl, isl)
    arrivals = running / max(osl, 1)
    interference = arrivals * own["prefill_stage_s"] * layout.pp
    steady_ttft = max(1.0, arrivals) * own["prefill_s"] + terms["decode_step_s"]
    burst_ttft = (running + 1) / 2 * own["prefill_s"] + terms["decode_step_s"]
    ttft = burst_share * burst_ttft + (1 - burst_share) * steady_ttft
    tpot = terms["decode_step_s"] + (1 - burst_share) * interference
    queue = (ttft + osl * tpot) * (batch / running - 1) if batch > running else 0.0
    terms.update(own)
    terms.update(
        {
            "running_sequences": float(running),
            "max_sequences": float(c.max_sequences),
            "weights_per_gpu_bytes": c.weights_bytes,
            "kv_budget_bytes": c.kv_budget_bytes,
            "prefill_arrivals_per_step": arrivals,
            "prefill_interference_s": interference,
            "queue_wait_s": queue,
        }
    )
    return Estimate(ttft + queue, tpot, running, _wall(terms, batch > running), terms)


def disaggregated_latency(
    model: ModelConfig,
    gpu: Gpu,
    prefill: Layout,
    decode: Layout,
    prefill_batch: int,
    decode_batch: int,
    isl: int,
    osl: int,
    backend: str = "vllm",
    precision: str = "bf16",
    topo: Topology | None = None,
) -> Estimate:
    """Prefill and decode on separate GPU pools; the KV of each prompt crosses the fabric (note 3).

    TTFT = the prefill batch's prompts through the prefill pool + the KV transfer of one prompt.
    TPOT = a decode step at the decode batch with no prefill interference.
    """
    topo = topo or Topology.for_gpu(gpu)
    ps = Setup(model, gpu, prefill, precision, backend, topo)
    dec = expected_latency(model, gpu, decode, decode_batch, isl, osl, backend, precision, topo)
    kv_bytes = cap.kv_bytes_per_sequence(model, isl, ps.kv_precision)
    link = topo.inter_node if prefill.gpus + decode.gpus > topo.gpus_per_node else FABRICS[gpu.scale_up]
    transfer = link_time(link, kv_bytes / max(prefill.tp, 1), ps.eff.comm_eff)
    pre = prefill_time(ps, isl * max(prefill_batch, 1), isl)
    terms = {k: v for k, v in dec.terms.items() if k.startswith("decode_")}
    terms.update(pre)
    terms.update({"kv_transfer_bytes": kv_bytes, "kv_transfer_s": transfer})
    tpot = terms["decode_step_s"]
    return Estimate(pre["prefill_s"] + transfer, tpot, dec.running, dec.wall, terms)
