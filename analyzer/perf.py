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
  5. Serving at concurrency C in aggregated mode: the running batch is min(C, sequences that fit
     in KV). Spread-out arrivals (:func:`steady_latency`): ``running / OSL`` prompts join per
     step; a "mixed" engine (vLLM, TRT-LLM) folds their tokens into the decode step's GEMMs
     (weights read once), a "prefill_first" engine (SGLang) pauses decoding for each prefill.
     Waves (:func:`wave_latency`): a closed-loop benchmark starts all C clients at once; the
     wave's prompts are prefilled in step-budget chunks, so request i waits for the chunks ahead
     of it. ``burst_share`` mixes the two (the harness, not the hardware). When C exceeds what
     fits, the rest wait for a slot (queue_wait_s). Pipeline stages each run their micro-batch
     as a separate engine step, so PP pays the per-step overhead once per stage.
  6. All efficiency factors are in :data:`EFFICIENCY` (one row per backend) — nothing per row.
"""

from __future__ import annotations

import math
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
    scheduler: str = "mixed"
    chunk_tokens: int = 8192
    low_precision_scale: float = 1.0

    def mfu_at(self, precision: str) -> float:
        """MFU against the precision's own peak: FP8/FP4 GEMMs reach ``low_precision_scale`` × mfu."""
        return self.mfu * (self.low_precision_scale if precision in ("fp8", "fp4") else 1.0)


# Fitted on the h100_sxm rows of tests/data/silicon/dense_calibration.csv only (h200/b200/gb200
# rows are held out), by a small grid minimizing median TPOT error + ½ median TTFT error per
# backend (a throwaway grid, not shipped; ``python -m bench.calibration`` prints the errors with
# each group marked in-sample or held-out). Physical reading of each factor:
#   mfu             BF16 GEMM efficiency of prefill-sized batches (0.5-0.55 of 989 TFLOP/s on H100,
#                   i.e. ~500 TFLOP/s; the 8192³ matmul peak measured here is ~800).
#   low_precision_scale  FP8/FP4 GEMMs reach this share of that mfu against their 2× peak
#                   (0.7: ~690 TFLOP/s FP8 on H100: per-tensor scaling and quantization overheads).
#   hbm_eff         decode's weight + KV streaming rate over nominal HBM bandwidth (0.7-0.9).
#   step_overhead_s CPU scheduling, sampling and launch gaps per engine step.
#   comm_eff        share of NVLink bandwidth a TP all-reduce reaches at these message sizes.
#                   Held at 0.7 (NCCL busbw on H100 NVLink): the grid preferred 0.4 for vLLM and
#                   TRT-LLM (vLLM TPOT median 9.5 % instead of 13.2 %), but that stands in for the
#                   GEMM efficiency lost at high TP and would mislead the planner about TP.
#   scheduler       "mixed" (vLLM, TRT-LLM: chunked prefill rides in decode steps) or
#                   "prefill_first" (SGLang: a prefill batch pauses decoding); chunk_tokens = the
#                   engines' default step budget (max_num_batched_tokens / max_num_tokens /
#                   chunked_prefill_size = 8192).
#   burst_share     the HARNESS, not the hardware: share of requests arriving in synchronized
#                   waves. SGLang's prefill-first keeps a closed loop's waves synchronized (1.0);
#                   for mixed schedulers the waves dissolve after the first (~1/k for k requests
#                   per client; 0.15 fitted). Planning passes 0.
EFFICIENCY: dict[str, Efficiency] = {
    "trtllm": Efficiency(
        mfu=0.50, hbm_eff=0.70, step_overhead_s=2.0e-3, comm_eff=0.7, fp8_kv=True,
        burst_share=0.15, scheduler="mixed", low_precision_scale=0.7,
    ),
    "vllm": Efficiency(
        mfu=0.55, hbm_eff=0.80, step_overhead_s=3.0e-3, comm_eff=0.7, fp8_kv=False,
        burst_share=0.15, scheduler="mixed", low_precision_scale=0.7,
    ),
    "sglang": Efficiency(
        mfu=0.55, hbm_eff=0.90, step_overhead_s=3.0e-3, comm_eff=0.7, fp8_kv=False,
        burst_share=1.0, scheduler="prefill_first", low_precision_scale=0.7,
    ),
}  # fmt: skip


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
    gemm = 2 * m.active_params() * tokens / (lay.tp * lay.pp)
    span = ctx_tokens / 2 if causal_prefill else ctx_tokens
    # TP splits the heads, attention-DP splits the sequences: either way 1/TP of the work per GPU.
    attn = 4 * s.stage_layers * tokens * span * m.heads * m.head_dim / lay.tp
    return (gemm + attn) / (s.gpu.peak_flops(s.precision) * s.eff.mfu_at(s.precision))


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


def step_time(s: Setup, running: int, ctx_tokens: float, prefill_tokens: float, isl: int) -> dict[str, float]:
    """One engine step: ``running`` decodes at mean context ``ctx_tokens`` plus ``prefill_tokens``
    prompt tokens of ``isl``-long prompts riding in the same batch (notes 1-2, 5).

    Weights are read once for the whole batch; the GEMMs see decode + prefill tokens together.
    """
    lay = s.layout
    per_stage = max(1, round(running / lay.pp))
    pre = prefill_tokens / lay.pp
    kv = per_stage * cap.kv_per_gpu_per_sequence(s.model, round(ctx_tokens), s.kv_precision, lay)
    if lay.attention_dp:
        kv /= lay.tp
    weights = touched_weight_bytes(s, per_stage + round(pre))
    hbm = (weights + kv) / (s.gpu.hbm_bytes_per_s * s.eff.hbm_eff)
    flops = compute_time(s, per_stage, ctx_tokens, causal_prefill=False)
    if pre > 0:
        flops += compute_time(s, round(pre), isl, causal_prefill=True)
    comm = comm_time(s, per_stage + round(pre))
    stage = max(hbm, flops) + comm.get("tp_allreduce_s", 0.0) + comm.get("ep_alltoall_s", 0.0)
    return {
        "weights_read_bytes": weights,
        "kv_read_bytes": kv,
        "decode_hbm_s": hbm,
        "decode_compute_s": flops,
        **{f"decode_{k}": v for k, v in comm.items()},
        "decode_step_s": lay.pp * (stage + s.eff.step_overhead_s) + comm.get("pp_send_s", 0.0),
    }


def decode_step(s: Setup, batch: int, ctx_tokens: float) -> dict[str, float]:
    """Terms of one pure decode step for ``batch`` sequences of mean context ``ctx_tokens`` (note 1)."""
    return step_time(s, batch, ctx_tokens, 0.0, 0)


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


def _chunk_budget(s: Setup, running: int) -> int:
    """Prompt tokens one step can take: the step token budget less the decodes riding in it."""
    decodes = 0 if s.eff.scheduler == "prefill_first" else running
    return max(s.eff.chunk_tokens - decodes, 1)


def steady_latency(s: Setup, running: int, isl: int, osl: int) -> tuple[float, float, dict[str, float]]:
    """(TTFT, TPOT, terms) once arrivals are spread out: ``running / OSL`` prompts join per step.

    1. mixed: the arriving prompt tokens ride in every decode step (chunked prefill), so TPOT is
       that mixed step; a new prompt waits half a step, then takes ceil(ISL / budget) steps that
       each carry at least one whole budget of its tokens.
    2. prefill_first: each arriving prompt is a separate prefill that pauses decoding, so TPOT is
       the pure decode step + arrivals × prefill time; TTFT = half a step + the prefill.
    """
    ctx = isl + osl / 2
    arrivals = running / max(osl, 1)
    if s.eff.scheduler == "prefill_first":
        step = step_time(s, running, ctx, 0.0, isl)
        own = prefill_time(s, isl, isl)["prefill_s"] + s.eff.step_overhead_s
        tpot = step["decode_step_s"] + arrivals * own
        return own + tpot / 2, tpot, {**step, "prefill_arrivals_per_step": arrivals}
    budget = _chunk_budget(s, running)
    step = step_time(s, running, ctx, min(arrivals * isl, budget), isl)
    chunk = step_time(s, running, ctx, max(min(isl, budget), min(arrivals * isl, budget)), isl)
    tpot = step["decode_step_s"]
    ttft = tpot / 2 + math.ceil(isl / budget) * chunk["decode_step_s"]
    return ttft, tpot, {**step, "prefill_arrivals_per_step": arrivals}


def wave_latency(s: Setup, running: int, isl: int, osl: int) -> tuple[float, float]:
    """(TTFT, TPOT) averaged over a wave of ``running`` prompts that arrive together.

    1. The wave's running × ISL prompt tokens are prefilled in chunks of the step budget; request
       i (in arrival order) gets its first token when the chunk holding its last prompt token ends.
    2. prefill_first: nobody decodes until the whole wave is prefilled (time T), so request i's
       TPOT carries (T − TTFT_i) / (OSL − 1) on top of the pure decode step.
    3. mixed: request i decodes one token per remaining chunk step, then at the decode step.
    """
    budget = _chunk_budget(s, running)
    total = running * isl
    n_chunks = math.ceil(total / budget)
    riders = 0 if s.eff.scheduler == "prefill_first" else running // 2
    chunk_s = step_time(s, riders, isl, min(budget, total), isl)["decode_step_s"]
    decode_s = decode_step(s, running, isl + osl / 2)["decode_step_s"]
    gaps = max(osl - 1, 1)
    ttfts, tpots = [], []
    for i in range(1, running + 1):
        k = math.ceil(i * isl / budget)
        ttfts.append(k * chunk_s)
        if s.eff.scheduler == "prefill_first":
            tpots.append(decode_s + (n_chunks - k) * chunk_s / gaps)
        else:
            m = min(n_chunks - k, gaps)
            tpots.append((m * chunk_s + (gaps - m) * decode_s) / gaps)
    return sum(ttfts) / running, sum(tpots) / running


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

    ``burst_share`` is the share of requests that arrive in synchronized waves (a closed-loop
    benchmark that starts all clients at once: :func:`wave_latency`); the rest see spread-out
    arrivals (:func:`steady_latency`). Planning uses 0.
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
    ttft, tpot, terms = steady_latency(s, running, isl, osl)
    if burst_share > 0:
        w_ttft, w_tpot = wave_latency(s, running, isl, osl)
        ttft = burst_share * w_ttft + (1 - burst_share) * ttft
        tpot = burst_share * w_tpot + (1 - burst_share) * tpot
    queue = (ttft + osl * tpot) * (batch / running - 1) if batch > running else 0.0
    terms.update(prefill_time(s, isl, isl))
    terms.update(
        {
            "running_sequences": float(running),
            "max_sequences": float(c.max_sequences),
            "weights_per_gpu_bytes": c.weights_bytes,
            "kv_budget_bytes": c.kv_budget_bytes,
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
