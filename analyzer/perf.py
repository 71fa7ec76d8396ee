"""Step-time model: expected TTFT and TPOT of a layout at a batch, with every term shown.

Rules (REFERENCE §5), per GPU of the most loaded pipeline stage:
  1. Decode step = the GPU's kernels + communication + a fixed per-step overhead. The kernels
     run one after another, each on its own roofline (:func:`roofline`): the non-expert GEMMs
     take max(their weights' read, their FLOPs), the routed-expert GEMMs likewise, attention
     max(its KV read, its FLOPs) — so a riding prompt's GEMM FLOPs do not hide the decodes' KV
     reads. Reads go at HBM bandwidth × hbm_eff; an MoE step reads only the distinct experts
     the batch routes to (note 9, :func:`touched_experts`). FLOPs: 2 × active params × tokens
     / (TP·PP) / (dense peak × mfu) + attention FLOPs. ``decode_hbm_s`` and
     ``decode_compute_s`` are the step's totals of each (they name the wall).
  2. Prefill: 2 × active params × prompt tokens + 2 × layers × ISL² × heads × head_dim (causal
     attention) over the compute roofline, each GEMM group never less than one read of the
     weights it touches (a short prompt on a large or MoE model is HBM-bound).
  3. TP: 2 all-reduces per layer of tokens × hidden × 2 B; ring traffic 2(n−1)/n × message.
     PP: hidden × 2 B per token at each stage boundary; a token crosses all PP stages in turn,
     each running 1/PP of the batch (the pipeline's micro-batches), so PP does not shorten TPOT.
     EP: dispatch + combine all-to-all of hidden × bytes per token per MoE layer to each
     distinct remote rank holding one of its top_k experts (DeepEP/pplx-style dispatch sends a
     token once per rank): ranks × (1 − C(E − E/EP, k) / C(E, k)) − its own, not top_k × (EP−1)/EP.
     P/D: KV bytes/token × ISL per request crosses the inter-node fabric.
  4. Each transfer costs the latency + bytes / one-way bandwidth of the link it crosses: the
     scale-up (NVLink) domain when the group fits in one node, the inter-node fabric otherwise.
  5. Serving at concurrency C (requests in the system per replica) in aggregated mode: the
     running batch is min(C, sequences the KV pool holds under the engine's admission policy):
     vLLM and SGLang allocate KV blocks as tokens are written and preempt when the pool runs
     out, so a running sequence holds on average its prompt plus half its output (ISL + OSL/2);
     TRT-LLM's default GUARANTEED_NO_EVICT scheduler reserves ISL + OSL at admission. One
     sequence must still fit whole (ISL + OSL). Spread-out arrivals (:func:`steady_latency`):
     ``running / OSL`` prompts join per step; a "mixed" engine (vLLM, TRT-LLM) folds a prompt's
     tokens into one decode step's GEMMs (weights read once) — a share of the steps carries a
     prompt, the rest decode only, and TPOT is their mean — a "prefill_first" engine (SGLang)
     pauses decoding for each prefill. Prompts queue for the prefill capacity as an M/D/1 queue
     (Poisson arrivals, deterministic prefill service): with utilization ρ the wait is
     ρ S / (2(1 − ρ)), ρ held below 0.95 (beyond it the wait grows linearly in ρ instead of
     diverging, so the estimate stays finite and monotone). With free KV, free slots and light
     prefill load, TTFT is therefore the prefill (its chunks' steps) plus at most about one
     step. When C exceeds the running batch, the rest wait for a slot (queue_wait_s, Little's
     law: (C / running − 1) × a request's time in the batch). Pipeline stages each run their
     micro-batch as a separate engine step, so PP pays the per-step overhead once per stage.
     Waves (:func:`wave_latency`): prompts that arrive together are prefilled in step-budget
     chunks, request i waiting for the chunks ahead of it. A closed-loop benchmark (C clients,
     each sending its next request when the previous ends, all starting at once) is a harness,
     modelled outside the live model (``bench/closed_loop.py``).
  6. All efficiency factors are in one block: :data:`EFFICIENCY` (one row per backend) and
     :data:`PLATFORM_EFFICIENCY` (a (backend, GPU) row fitted on that platform's measurements),
     resolved by :func:`efficiency` — nothing per row or per model.
  7. Disaggregated serving (:func:`disaggregated_latency`): decode workers run pure decode
     steps; with a known client count the prefill pool is an M/D/1 queue and decode slots beyond
     KV capacity wait.
  8. The live model has no term for a benchmark's harness (its opening burst, its repeated
     prompts, a closed loop's slot handoff): those belong to the harness model in
     ``bench/closed_loop.py``, used only to compare with benchmark rows.
  9. MoE terms, none fitted (the calibration rows are dense), each from a public source:
     a. Expert GEMM efficiency at small per-expert batch: each expert's tokens are padded to the
        kernel's M-tile, so an expert receiving few tokens costs a whole 64-row tile
        (:func:`expert_gemm_efficiency`; PTX ISA ``wgmma.mma_async`` m64nNk16 shapes, vLLM's
        ``moe_align_block_size``).
     b. Expert weight reads: the expected distinct experts the step's T tokens reach,
        E_local × (1 − (1 − top_k/E)^T) (:func:`touched_experts`) — nearly every expert once T
        passes a few × E/top_k, so decode reads almost all expert weights, not the active share
        (DeepSpeed-MoE, Rajbhandari et al., ICML 2022, §5).
     c. EP all-to-all from the EP degree and the fabric: a token goes once to each remote rank
        holding one of its experts, same-node ranks over NVLink and the others over the NIC side
        by side (:func:`remote_ranks`, :func:`alltoall_time`; DeepEP's dispatch/combine kernels).
     d. Attention-DP imbalance: sequences are dispatched round-robin and the step waits for the
        busiest rank's attention and KV, √(2 ln D) standard deviations above the mean
        (:func:`attention_dp_share`; SGLang ``--load-balance-method round_robin``, DeepSeek's
        inference-system overview on core-attention load balancing); a prompt runs whole on one
        attention rank.
     e. The MoE block's four extra short kernels (router GEMM, top-k, token sort, weighted sum)
        cost a short kernel's floor, 3 µs, per MoE layer (:func:`moe_kernel_time`; NVIDIA
        Technical Blog, "Getting Started with CUDA Graphs", 2019).
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
    seq_overhead_s: host time per running sequence per engine step (the scheduler's per-request
      bookkeeping, sampling and detokenization run on the CPU, one sequence after another).
    comm_eff: fraction of link bandwidth a collective reaches.
    fp8_kv: whether the backend stores the KV cache in FP8 when the weights are FP8/FP4.
    prefix_hit: share of each prompt's tokens the engine finds in its prefix cache (vLLM's
      ``prefix_cache_hits / prefix_cache_queries``, SGLang's radix-cache hit rate) and so does
      not recompute; the rest still attend to the whole prompt. A property of the workload: 0
      in every tabled row (a deployment's measured hit rate, or a harness, sets it).
    admission: "on_demand" (vLLM, SGLang: KV blocks allocated as tokens are written, preempting
      when the pool is full) or "reserve" (TRT-LLM's GUARANTEED_NO_EVICT: ISL + OSL reserved at
      admission); note 5.
    """

    mfu: float
    hbm_eff: float
    step_overhead_s: float
    comm_eff: float
    fp8_kv: bool
    scheduler: str = "mixed"
    chunk_tokens: int = 8192
    low_precision_scale: float = 1.0
    seq_overhead_s: float = 0.0
    prefix_hit: float = 0.0
    admission: str = "on_demand"

    def fresh(self, isl: int) -> int:
        """Prompt tokens an ``isl``-long prompt must compute after its prefix-cache hit."""
        return max(1, round(isl * (1 - self.prefix_hit)))

    def mfu_at(self, precision: str) -> float:
        """MFU against the precision's own peak: FP8/FP4 GEMMs reach ``low_precision_scale`` × mfu."""
        return self.mfu * (self.low_precision_scale if precision in ("fp8", "fp4") else 1.0)


# THE efficiency factors: every number the model was calibrated with is in this block. Each row
# is fitted on real measured rows of tests/data/silicon/dense_calibration.csv by
# ``python -m bench.calibration --fit`` (coordinate descent of the factors over grids of plausible
# values, minimizing median TPOT error + ½ median TTFT error, the rows predicted through the
# closed-loop harness model of bench/closed_loop.py whose own two factors are fitted alongside and
# kept there; ``--cv`` reports the fit cross-validated, leaving out shapes and models). Backend
# defaults (EFFICIENCY) are fitted on the h100_sxm rows and serve any platform without its own
# row; a platform row (PLATFORM_EFFICIENCY, keyed (backend, GPU)) is fitted on that platform's
# rows only — what a user does with their own telemetry. Factors:
#   mfu             BF16 GEMM efficiency of prefill-sized batches (0.55 of 989 TFLOP/s on H100 ≈
#                   540 TFLOP/s; the 8192³ matmul peak measured on H100 is ~800).
#   low_precision_scale  FP8/FP4 GEMMs reach this share of that mfu against their 2×/4× peak
#                   (per-tensor/block scaling and quantization overheads; 1.0 on H200/Blackwell
#                   with newer kernels: FP8 at 0.5-0.6 of its peak).
#   hbm_eff         decode's weight + KV streaming rate over nominal HBM bandwidth (0.6-0.9).
#   step_overhead_s CPU scheduling, sampling and launch gaps per engine step.
#   seq_overhead_s  host time per running sequence per step (per-request scheduler bookkeeping,
#                   sampling, detokenization); makes large-batch TPOT grow even where TP shrinks
#                   the GPU work.
#   comm_eff        share of NVLink bandwidth a TP all-reduce reaches (0.7, NCCL busbw on H100
#                   NVLink; held, not fitted: a lower value would stand in for GEMM efficiency
#                   lost at high TP and mislead the planner about TP).
#   fp8_kv          TRT-LLM keeps an FP8 KV cache for FP8/FP4 weights; vLLM/SGLang keep BF16
#                   unless told (a fact of the backends' defaults, not fitted).
#   scheduler       "mixed" (vLLM, TRT-LLM: chunked prefill rides in decode steps) or
#                   "prefill_first" (SGLang: a prefill batch pauses decoding); chunk_tokens = the
#                   engines' default step budget (8192).
#   admission       "on_demand" (vLLM, SGLang) or "reserve" (TRT-LLM GUARANTEED_NO_EVICT), note 5.
# No factor is per row, per shape, per TP or per model; no factor describes a benchmark harness.
EFFICIENCY: dict[str, Efficiency] = {  # backend defaults: fitted on h100_sxm rows
    # TRT-LLM 1.0.0rc3 (353 rows) + 1.2.0rc6 (4): Llama-3.1-8B BF16, Qwen3-32B FP8.
    "trtllm": Efficiency(
        mfu=0.65, hbm_eff=0.90, step_overhead_s=2.0e-3, comm_eff=0.7, fp8_kv=True,
        scheduler="mixed", low_precision_scale=0.6, seq_overhead_s=10e-6, admission="reserve",
    ),
    # vLLM 0.12.0 (94 rows): Qwen3-32B BF16 (90) and FP8 (4).
    "vllm": Efficiency(
        mfu=0.65, hbm_eff=0.90, step_overhead_s=3.0e-3, comm_eff=0.7, fp8_kv=False,
        scheduler="mixed", low_precision_scale=0.6, seq_overhead_s=40e-6,
    ),
    # SGLang 0.5.1 (78 rows), 0.5.8 (6), 0.5.6 disagg (4): Qwen3-32B.
    "sglang": Efficiency(
        mfu=0.55, hbm_eff=0.90, step_overhead_s=2.0e-3, comm_eff=0.7, fp8_kv=False,
        scheduler="prefill_first", low_precision_scale=0.7, seq_overhead_s=20e-6,
    ),
}  # fmt: skip

PLATFORM_EFFICIENCY: dict[tuple[str, str], Efficiency] = {  # (backend, GPU): fitted on that GPU's rows
    # SGLang 0.5.6 on H200 (46 rows, Llama-3.1-8B FP8).
    ("sglang", "h200_sxm"): Efficiency(
        mfu=0.70, hbm_eff=0.90, step_overhead_s=5.0e-3, comm_eff=0.7, fp8_kv=False,
        scheduler="prefill_first", low_precision_scale=1.0, seq_overhead_s=10e-6,
    ),
    # vLLM 0.12.0 on H200 (21 rows, Llama-3.1-8B FP8).
    ("vllm", "h200_sxm"): Efficiency(
        mfu=0.70, hbm_eff=0.90, step_overhead_s=1.0e-3, comm_eff=0.7, fp8_kv=False,
        scheduler="mixed", low_precision_scale=1.0, seq_overhead_s=0.0,
    ),
}  # fmt: skip


def efficiency(backend: str, gpu: str = "") -> Efficiency:
    """The factors of ``backend`` on ``gpu`` (a catalog name): the platform's own row when it has
    one, else the backend's default row. Unknown backends raise, naming the known ones."""
    found = PLATFORM_EFFICIENCY.get((backend, gpu)) or EFFICIENCY.get(backend)
    if found is None:
        raise KeyError(f"unknown backend {backend!r}; known: {', '.join(EFFICIENCY)}")
    return found


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
    efficiency: Efficiency | None = None  # None: :func:`efficiency` of (backend, GPU)

    @property
    def eff(self) -> Efficiency:
        return self.efficiency or efficiency(self.backend, self.gpu.name)

    @property
    def kv_precision(self) -> str:
        return "fp8" if self.precision in ("fp8", "fp4") and self.eff.fp8_kv else "bf16"

    @property
    def stage_layers(self) -> int:
        return cap.stage_layers(self.model, self.layout.pp)


def touched_weight_bytes(s: Setup, tokens: int) -> float:
    """Weight bytes per GPU one step reads: all of a dense model; routed experts hit by the batch."""
    return sum(weight_parts(s, tokens))


def weight_parts(s: Setup, tokens: int) -> tuple[float, float]:
    """(non-expert, routed-expert) weight bytes per GPU one step reads: every non-expert weight,
    and the routed experts the step's ``tokens`` reach (:func:`touched_experts`)."""
    full = cap.weights_per_gpu(s.model, s.precision, s.layout)
    m = s.model
    if not m.is_moe:
        return full, 0.0
    shard = s.layout.ep if s.layout.ep > 1 else s.layout.tp
    local = m.experts / shard if s.layout.ep > 1 else m.experts
    expert_b = m.expert_params() / (1 if s.layout.ep > 1 else shard) * cap.bytes_per_param(s.precision)
    layers = s.stage_layers * m.moe_layers / m.layers
    return full - layers * local * expert_b, layers * touched_experts(s, tokens) * expert_b


def touched_experts(s: Setup, tokens: float) -> float:
    """Expected distinct routed experts, of those one GPU holds, that ``tokens`` tokens reach in
    one MoE layer (note 9b): each token picks top_k of E experts, so a given expert is missed by
    all of them with probability (1 − k/E)^tokens and the GPU's E_local experts see
    E_local × (1 − (1 − k/E)^tokens). Near E/k tokens and beyond this is nearly all of them:
    a decode step of a few dozen sequences reads almost every expert's weights, not only the
    active-parameter share (DeepSpeed-MoE, Rajbhandari et al., ICML 2022, §5: MoE inference at
    batch must read all expert parameters). With EP the tokens of every rank are dispatched to
    the GPU's experts, so ``tokens`` is the replica's step batch."""
    m, lay = s.model, s.layout
    local = m.experts / lay.ep if lay.ep > 1 else m.experts
    if tokens <= 0:
        return 0.0
    k = min(m.top_k, m.experts)
    return local * (1 - (1 - k / m.experts) ** tokens)


def compute_time(
    s: Setup, tokens: int, ctx_tokens: float, causal_prefill: bool, rank_share: float | None = None
) -> float:
    """GEMM + attention FLOPs of ``tokens`` tokens on one GPU over their dense peaks × mfu (notes 1-2, 9):
    the sum of :func:`compute_parts`."""
    return sum(compute_parts(s, tokens, ctx_tokens, causal_prefill, rank_share))


def compute_parts(
    s: Setup, tokens: int, ctx_tokens: float, causal_prefill: bool, rank_share: float | None = None
) -> tuple[float, float, float]:
    """(non-expert GEMM, routed-expert GEMM, attention) seconds of ``tokens`` tokens on one GPU.

    1. GEMMs run at the weights' precision. A prompt token skips the LM head (the engines compute
       logits only at the positions they sample), so prefill multiplies through the active
       parameters less ``vocab × hidden``; a decode token goes through all of them.
    2. Attention (QKᵀ and PV) runs at the KV cache's precision — BF16, or FP8 where the backend
       keeps an FP8 cache — never at FP4, whatever the weights are.
    3. Prompt tokens are the tail of their prompt that the prefix cache missed: they attend, on
       average, to (1 + prefix_hit) / 2 of ``ctx_tokens`` (the prompt length).
    4. Attention-DP: the non-expert GEMMs and attention of the tokens run on the attention rank
       that holds their sequence, ``rank_share`` of them on the busiest one (a prompt: all of it;
       decodes: :func:`attention_dp_share`); routed-expert GEMMs are spread over the EP ranks and
       run at :func:`expert_gemm_efficiency` of the tokens each expert receives.
    """
    m, lay = s.model, s.layout
    params = m.active_params() - (m.vocab * m.hidden if causal_prefill else 0)
    routed = m.moe_layers * m.top_k * m.expert_params() * s.stage_layers / m.layers
    span = ctx_tokens * (1 + s.eff.prefix_hit) / 2 if causal_prefill else ctx_tokens
    attn = 4 * s.stage_layers * tokens * span * m.heads * m.head_dim
    e, kv = s.eff, s.kv_precision
    peak = s.gpu.peak_flops(s.precision) * e.mfu_at(s.precision)
    shard = lay.ep if lay.ep > 1 else lay.tp  # experts split over EP ranks, else each TP-sliced
    expert = 2 * routed * tokens / (shard * peak * expert_gemm_efficiency(s, tokens))
    if lay.attention_dp:
        share = rank_share if rank_share is not None else 1.0 / lay.tp
        dense = 2 * (params / lay.pp - routed) * tokens * share / peak
        return dense, expert, attn * share / (s.gpu.peak_flops(kv) * e.mfu_at(kv))
    dense = 2 * (params / lay.pp - routed) * tokens / (lay.tp * peak)
    return dense, expert, attn / lay.tp / (s.gpu.peak_flops(kv) * e.mfu_at(kv))


def roofline(s: Setup, parts: tuple[float, float, float], weights: tuple[float, float], kv: float) -> float:
    """Time of one stage's kernels, each bound by its own roofline (note 1): the non-expert GEMMs
    take max(their weights' read, their FLOPs), the routed-expert GEMMs likewise, attention
    max(its KV read, its FLOPs), one after another. A step runs these as separate kernels in
    sequence, so one kernel's compute does not hide another's memory traffic (the roofline is
    per operator — Williams, Waterman & Patterson, CACM 2009; Yuan et al., "LLM Inference
    Unveiled: Survey and Roofline Model Insights", 2024, sum it over a layer's operators)."""
    bw = s.gpu.hbm_bytes_per_s * s.eff.hbm_eff
    return max(weights[0] / bw, parts[0]) + max(weights[1] / bw, parts[1]) + max(kv / bw, parts[2])


# Grouped (MoE) GEMMs issue their tensor-core work in M-tiles: Hopper's warpgroup MMA computes
# 64 rows at a time (PTX ISA, wgmma.mma_async shapes m64nNk16), and the fused-MoE kernels of
# vLLM/SGLang/TRT-LLM pad each expert's tokens to their tile (vLLM
# ``moe_align_block_size``: each expert's token count rounded up to BLOCK_SIZE_M, 16-128 in its
# tuned configs). An expert that receives m tokens therefore costs ceil(m / tile) × tile rows.
EXPERT_TILE_TOKENS = 64


# The routed-expert block runs kernels a dense MLP (gate-up GEMM, activation, down GEMM) does
# not: the router's gate GEMM, the top-k softmax, the sort of tokens by expert (vLLM
# ``moe_align_block_size``; TRT-LLM's permute), and the top-k weighted sum of the experts'
# outputs (vLLM ``moe_sum``; TRT-LLM's finalize) — four per MoE layer in each engine. At decode
# each moves a few kB, so it costs the floor of a short kernel on the GPU, launch, ramp-up and
# drain, which a CUDA graph does not remove: about 3 µs (NVIDIA Technical Blog, "Getting Started
# with CUDA Graphs", 2019: a few-µs kernel costs ≈3 µs each, graph-launched, back to back).
MOE_EXTRA_KERNELS = 4
KERNEL_FLOOR_S = 3e-6


def moe_kernel_time(s: Setup) -> float:
    """Fixed time of the MoE block's extra kernels on one stage (note 9e): MoE layers of the stage
    × :data:`MOE_EXTRA_KERNELS` × :data:`KERNEL_FLOOR_S`. 0 for a dense model. Not fitted."""
    if not s.model.is_moe:
        return 0.0
    return s.stage_layers * s.model.moe_layers / s.model.layers * MOE_EXTRA_KERNELS * KERNEL_FLOOR_S


def expert_gemm_efficiency(s: Setup, tokens: int) -> float:
    """Useful share of the routed-expert GEMM rows: the tokens each touched expert receives over
    those rows padded to :data:`EXPERT_TILE_TOKENS` (note 9). 1 for a dense model."""
    m, lay = s.model, s.layout
    if not m.is_moe or tokens <= 0:
        return 1.0
    pairs = tokens * m.top_k / (lay.ep if lay.ep > 1 else 1)  # token-expert pairs on this GPU
    per_expert = pairs / max(touched_experts(s, tokens), 1e-12)
    tile = EXPERT_TILE_TOKENS
    return per_expert / (math.ceil(per_expert / tile) * tile)


def attention_dp_share(s: Setup, running: int, ctx_tokens: float, isl: int) -> float:
    """Share of a replica's decode attention work on its busiest attention-DP rank (note 9).

    1. The engines dispatch sequences to the attention ranks round-robin (SGLang
       ``--load-balance-method round_robin``), so each rank runs ceil(N / D) of the N sequences.
    2. Their contexts differ: a running sequence is somewhere in its output, so its context is
       ISL plus a uniform share of OSL, standard deviation (ctx − ISL) / √3 around the mean
       ``ctx_tokens`` (= ISL + OSL/2). A rank's KV is the sum of its n sequences' contexts; the
       busiest of D ranks lies about √(2 ln D) standard deviations above the mean (the maximum
       of D near-Gaussian sums), which the step waits for — the imbalance DeepSeek's inference
       system overview balances explicitly ("core-attention computation load balancing").
    Returns that rank's attention tokens over the replica's (1/D when perfectly balanced).
    """
    d = s.layout.tp
    if d <= 1 or running <= 0 or ctx_tokens <= 0:
        return 1.0
    n = math.ceil(running / d)
    sd = max(ctx_tokens - isl, 0.0) / math.sqrt(3)
    busiest = n * ctx_tokens + math.sqrt(n) * sd * math.sqrt(2 * math.log(d))
    return min(1.0, busiest / (running * ctx_tokens))


def comm_time(s: Setup, tokens: int) -> dict[str, float]:
    """Per-step communication on one stage: TP all-reduces, EP all-to-all, PP sends (note 3)."""
    m, lay, e = s.model, s.layout, s.eff.comm_eff
    out: dict[str, float] = {}
    msg = tokens * m.hidden * ACT_BYTES
    if lay.tp > 1 and not lay.attention_dp:
        link = group_link(s.gpu, s.topo, lay.tp)
        out["tp_allreduce_s"] = 2 * s.stage_layers * allreduce_time(link, lay.tp, msg, e)
    if m.is_moe and lay.ep > 1:
        moe_layers = s.stage_layers * m.moe_layers / m.layers
        out["ep_alltoall_s"] = moe_layers * 2 * alltoall_time(s, tokens)
    if lay.pp > 1:
        link = group_link(s.gpu, s.topo, lay.tp * lay.pp)
        out["pp_send_s"] = (lay.pp - 1) * link_time(link, msg, e)
    return out


def alltoall_time(s: Setup, tokens: int) -> float:
    """One EP dispatch (or combine) of a step's ``tokens`` from one rank (note 3, 9).

    1. Each rank sends its 1/EP of the tokens, hidden × 2 B each, once to every remote rank that
       holds one of the token's experts (:func:`remote_ranks`).
    2. Remote ranks in the same node are reached over NVLink, the others over the rank's NIC;
       the two transfers run side by side, so the all-to-all takes the slower of the two
       (DeepEP's "normal" kernels forward NVLink and RDMA traffic concurrently). With EP inside
       one node only the NVLink part exists.
    """
    m, lay, e = s.model, s.layout, s.eff.comm_eff
    sent = remote_ranks(m.experts, m.top_k, lay.ep) * m.hidden * ACT_BYTES * tokens / lay.ep
    per_node = s.topo.gpus_per_node
    nvlink = FABRICS[s.gpu.scale_up]
    if lay.ep <= per_node:
        return link_time(nvlink, sent, e)
    inside = (per_node - 1) / (lay.ep - 1)  # share of the remote ranks on the same node
    return max(link_time(nvlink, sent * inside, e), link_time(s.topo.inter_node, sent * (1 - inside), e))


def remote_ranks(experts: int, top_k: int, ep: int) -> float:
    """Expected remote EP ranks a token's ``top_k`` experts land on (experts spread evenly, the
    token's own rank holding its share): ep × P(a rank holds one of them) × (ep − 1)/ep."""
    if ep <= 1 or experts <= 0:
        return 0.0
    k = min(top_k, experts)
    none_here = math.comb(experts - experts // ep, k) / math.comb(experts, k)
    return ep * (1 - none_here) * (ep - 1) / ep


def step_time(s: Setup, running: int, ctx_tokens: float, prefill_tokens: float, isl: int) -> dict[str, float]:
    """One engine step: ``running`` decodes at mean context ``ctx_tokens`` plus ``prefill_tokens``
    prompt tokens of ``isl``-long prompts riding in the same batch (notes 1-2, 5).

    Weights are read once for the whole batch; the GEMMs see decode + prefill tokens together.
    """
    lay = s.layout
    per_stage = max(1, round(running / lay.pp))
    pre = prefill_tokens / lay.pp
    kv = per_stage * cap.kv_per_gpu_per_sequence(s.model, round(ctx_tokens), s.kv_precision, lay)
    # attention-DP: the step waits for the busiest attention rank (its sequences' KV and
    # attention); a riding prompt runs whole on the rank that holds it (note 9)
    share = attention_dp_share(s, per_stage, ctx_tokens, isl) if lay.attention_dp else 1.0
    if lay.attention_dp:
        kv *= share
    parts = weight_parts(s, per_stage + round(pre))
    weights = sum(parts)
    hbm = (weights + kv) / (s.gpu.hbm_bytes_per_s * s.eff.hbm_eff)
    ops = compute_parts(s, per_stage, ctx_tokens, causal_prefill=False, rank_share=share)
    if pre > 0:
        riding = compute_parts(s, round(pre), isl, causal_prefill=True, rank_share=1.0)
        ops = (ops[0] + riding[0], ops[1] + riding[1], ops[2] + riding[2])
    flops = sum(ops)
    comm = comm_time(s, per_stage + round(pre))
    moe_kernels = moe_kernel_time(s)
    kernels = roofline(s, ops, parts, kv) + moe_kernels
    stage = kernels + comm.get("tp_allreduce_s", 0.0) + comm.get("ep_alltoall_s", 0.0)
    # host bookkeeping per sequence: with attention-DP each of the TP ranks schedules its own
    # sequences (round-robin: ceil(N / D) on each), side by side
    scheduled = math.ceil(per_stage / lay.tp) if lay.attention_dp else per_stage
    return {
        "weights_read_bytes": weights,
        "kv_read_bytes": kv,
        "decode_hbm_s": hbm,
        "decode_compute_s": flops,
        "decode_kernels_s": kernels,
        **{f"decode_{k}": v for k, v in comm.items()},
        **({"decode_moe_kernels_s": moe_kernels} if s.model.is_moe else {}),
        "decode_step_s": lay.pp * (stage + s.eff.step_overhead_s + s.eff.seq_overhead_s * scheduled)
        + comm.get("pp_send_s", 0.0),
    }


def decode_step(s: Setup, batch: int, ctx_tokens: float) -> dict[str, float]:
    """Terms of one pure decode step for ``batch`` sequences of mean context ``ctx_tokens`` (note 1)."""
    return step_time(s, batch, ctx_tokens, 0.0, 0)


def prefill_time(s: Setup, tokens: int, isl: int) -> dict[str, float]:
    """Terms of prefilling ``tokens`` prompt tokens of ``isl``-long prompts (note 2).

    The marginal cost (``prefill_stage_s``) is what a stage adds when those tokens ride along in
    a decode step; a prompt's latency passes every stage in turn (``prefill_s``). Only the
    prefix-cache misses are computed (``1 − prefix_hit`` of ``tokens``).
    """
    lay = s.layout
    tokens = max(1, round(tokens * (1 - s.eff.prefix_hit)))
    # attention-DP: each prompt runs whole on one attention rank, the busiest holding
    # ceil(prompts / ranks) of them (note 9)
    prompts = max(1, math.ceil(tokens / max(isl, 1)))
    share = math.ceil(prompts / lay.tp) / prompts if lay.attention_dp else None
    ops = compute_parts(s, tokens, isl, causal_prefill=True, rank_share=share)
    flops = sum(ops)
    # the stage reads its weights (an MoE's experts the prompt routes to) at least once
    parts = weight_parts(s, tokens)
    hbm = sum(parts) / (s.gpu.hbm_bytes_per_s * s.eff.hbm_eff)
    comm = comm_time(s, tokens)
    stage = roofline(s, ops, parts, 0.0) + comm.get("tp_allreduce_s", 0.0) + comm.get("ep_alltoall_s", 0.0)
    stage += moe_kernel_time(s)
    return {
        "prefill_compute_s": flops * lay.pp,
        "prefill_hbm_s": hbm * lay.pp,
        **{f"prefill_{k}": v for k, v in comm.items()},
        "prefill_stage_s": stage,
        "prefill_s": lay.pp * stage + comm.get("pp_send_s", 0.0),
    }


def inter_node_terms(s: Setup) -> tuple[str, ...]:
    """The decode step's communication terms whose group spans nodes (note 4): those cross the
    inter-node fabric; the rest stay on the scale-up (NVLink) domain."""
    lay, per_node = s.layout, s.topo.gpus_per_node
    out = []
    if lay.tp > per_node and not lay.attention_dp:
        out.append("decode_tp_allreduce_s")
    if lay.ep > per_node:
        out.append("decode_ep_alltoall_s")
    if lay.pp > 1 and lay.tp * lay.pp > per_node:
        out.append("decode_pp_send_s")
    return tuple(out)


def _wall(terms: dict[str, float], queued: bool, fabric_terms: tuple[str, ...] = ()) -> str:
    """The wall the decode step presses against (REFERENCE §6 zones).

    1. Requests waiting for KV room → kv_capacity. 2. Communication over the inter-node fabric
    (``fabric_terms``) above a quarter of the step → network; collectives inside one NVLink
    domain are not the network. 3. Otherwise the larger of the HBM and compute rooflines.
    """
    if queued:
        return "kv_capacity"
    comm = sum(terms.get(k, 0.0) for k in fabric_terms)
    if comm > 0.25 * terms["decode_step_s"]:
        return "network"
    return "hbm_bandwidth" if terms["decode_hbm_s"] >= terms["decode_compute_s"] else "compute"


def _chunk_budget(s: Setup, running: int) -> int:
    """Prompt tokens one step can take: the step token budget less the decodes riding in it."""
    decodes = 0 if s.eff.scheduler == "prefill_first" else running
    return max(s.eff.chunk_tokens - decodes, 1)


RHO_CAP = 0.95  # prefill utilization beyond which the M/D/1 wait grows linearly (note 5)


def prefill_queue_wait(rho: float, service_s: float) -> float:
    """M/D/1 wait before a prompt's prefill starts: ρ S / (2(1 − ρ)), ρ capped at :data:`RHO_CAP`
    in the denominator so the wait stays finite and keeps growing with ρ (note 5)."""
    if rho <= 0:
        return 0.0
    return rho * service_s / (2 * (1 - min(rho, RHO_CAP)))


def steady_latency(s: Setup, running: int, isl: int, osl: int) -> tuple[float, float, dict[str, float]]:
    """(TTFT, TPOT, terms) once arrivals are spread out: ``running / OSL`` prompts join per step.

    1. mixed: an arriving prompt rides in a decode step whole (or in step-budget pieces when it
       is longer than the budget), so a share ``arrivals × ISL / piece`` of the steps carries a
       piece and the rest are pure decode steps; TPOT is the mean of the two. (Averaging the
       prompt tokens over every step instead hid them under the decode step's HBM time: a step
       is max(HBM, compute), and the mean of the maxima is not the max of the means.) A new
       prompt waits half a step, then queues for the step budget (M/D/1, ρ = prompt tokens
       arriving per step / budget), then takes ceil(ISL / budget) steps: whole budgets of its
       tokens, the last one its remainder.
    2. prefill_first: each arriving prompt's prefill pauses decoding, so TPOT is the pure decode
       step + arrivals × prefill time. A new prompt waits for the running step to end (half a
       step) and is prefilled in one batch with the prompts that arrived during that step (up to
       the step budget): TTFT = half a step + that batch's prefill.
    """
    ctx = isl + osl / 2
    arrivals = running / max(osl, 1)
    if s.eff.scheduler == "prefill_first":
        step = step_time(s, running, ctx, 0.0, isl)
        own = prefill_time(s, isl, isl)["prefill_s"] + s.eff.step_overhead_s
        tpot = step["decode_step_s"] + arrivals * own
        # the prompts that arrived during one step are prefilled together (up to the budget)
        together = max(float(isl), min(arrivals * isl, float(s.eff.chunk_tokens)))
        batch = prefill_time(s, round(together), isl)["prefill_s"] + s.eff.step_overhead_s
        terms = {**step, "prefill_arrivals_per_step": arrivals, "prefill_utilization": arrivals * own / tpot}
        return batch + tpot / 2, tpot, {**terms, "prefill_queue_s": batch - own}
    budget = _chunk_budget(s, running)
    fresh = s.eff.fresh(isl)
    piece = max(min(fresh, budget), min(arrivals * fresh, budget))  # prompt tokens a carrying step holds
    share = min(1.0, arrivals * fresh / piece)  # share of steps that carry one
    chunk = step_time(s, running, ctx, piece, isl)
    pure = step_time(s, running, ctx, 0.0, isl)
    tpot = share * chunk["decode_step_s"] + (1 - share) * pure["decode_step_s"]
    rho = arrivals * fresh / budget
    wait = prefill_queue_wait(rho, fresh / budget * chunk["decode_step_s"])
    # the prompt's steps: full budgets, then the step carrying its remainder (the carrying step
    # itself when the prompt fits one budget)
    n = math.ceil(fresh / budget)
    last = chunk if n == 1 else step_time(s, running, ctx, fresh - (n - 1) * budget, isl)
    ttft = tpot / 2 + wait + (n - 1) * chunk["decode_step_s"] + last["decode_step_s"]
    # the terms of the mean step: its reads, FLOPs and transfers with the prompt tokens spread
    mean = step_time(s, running, ctx, min(arrivals * fresh, budget), isl)
    terms = {**mean, "decode_step_s": tpot, "prefill_step_share": share, "prefill_utilization": rho}
    return ttft, tpot, {**terms, "prefill_arrivals_per_step": arrivals, "prefill_queue_s": wait}


def wave_latency(s: Setup, running: int, isl: int, osl: int) -> tuple[float, float]:
    """(TTFT, TPOT) averaged over a wave of ``running`` prompts that arrive together.

    1. The wave's running × ISL prompt tokens are prefilled in chunks of the step budget; request
       i (in arrival order) gets its first token when the chunk holding its last prompt token ends.
    2. prefill_first: nobody decodes until the whole wave is prefilled (time T), so request i's
       TPOT carries (T − TTFT_i) / (OSL − 1) on top of the pure decode step.
    3. mixed: request i decodes one token per remaining chunk step, then at the decode step.
    """
    budget = _chunk_budget(s, running)
    fresh = s.eff.fresh(isl)
    total = running * fresh
    n_chunks = math.ceil(total / budget)
    riders = 0 if s.eff.scheduler == "prefill_first" else running // 2
    chunk_s = step_time(s, riders, isl, min(budget, total), isl)["decode_step_s"]
    decode_s = decode_step(s, running, isl + osl / 2)["decode_step_s"]
    gaps = max(osl - 1, 1)
    ttfts, tpots = [], []
    for i in range(1, running + 1):
        k = math.ceil(i * fresh / budget)
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
    eff: Efficiency | None = None,
) -> Estimate:
    """Expected TTFT and TPOT at concurrency ``batch`` (requests in the system) per replica,
    aggregated serving, arrivals spread out (note 5; :func:`steady_latency`).

    ``eff`` replaces the tabled efficiency factors (calibration fits them with it). A layout
    whose weights leave no room for one ISL + OSL sequence returns infinite latencies, running 0.
    """
    s = Setup(model, gpu, layout, precision, backend, topo or Topology.for_gpu(gpu), eff)
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
    running = max(1, min(batch, admitted(s, isl, osl, c)))
    ttft, tpot, terms = steady_latency(s, running, isl, osl)
    queue = (ttft + osl * tpot) * (batch / running - 1) if batch > running else 0.0
    terms.update(prefill_time(s, isl, isl))
    terms.update(
        {
            "running_sequences": float(running),
            "max_sequences": float(c.max_sequences),
            "admitted_sequences": float(admitted(s, isl, osl, c)),
            "weights_per_gpu_bytes": c.weights_bytes,
            "kv_budget_bytes": c.kv_budget_bytes,
            "queue_wait_s": queue,
        }
    )
    return Estimate(ttft + queue, tpot, running, _wall(terms, batch > running, inter_node_terms(s)), terms)


def admitted(s: Setup, isl: int, osl: int, c: cap.Capacity | None = None) -> int:
    """Sequences the KV pool holds at once under the backend's admission policy (note 5):
    ``c.max_sequences`` at ISL + OSL for "reserve", the pool over the mean held context
    (ISL + OSL/2) for "on_demand" — never fewer than the reserve count."""
    m, lay = s.model, s.layout
    c = c or cap.capacity(
        m, s.gpu, lay, context_tokens=isl + osl, precision=s.precision, kv_precision=s.kv_precision
    )
    if s.eff.admission != "on_demand" or c.kv_budget_bytes <= 0:
        return c.max_sequences
    per_seq = cap.kv_per_gpu_per_sequence(m, max(1, round(isl + osl / 2)), s.kv_precision, lay)
    n = math.floor(c.kv_budget_bytes / per_seq) * (lay.tp if lay.attention_dp else 1)
    return max(n, c.max_sequences)


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
    prefill_workers: int = 1,
    decode_workers: int = 1,
    clients: int = 0,
    eff: Efficiency | None = None,
) -> Estimate:
    """Prefill and decode on separate GPU pools; the KV of each prompt crosses the fabric (note 3).

    1. TPOT = a pure decode step at the decode batch: a decode worker never prefills, so no prompt
       tokens ride in its steps.
    2. TTFT = prefill of ``prefill_batch`` prompts + KV transfer of one prompt, and, when the
       closed loop's ``clients`` are known (> 0), two waits:
       a. each decode worker carries clients / ``decode_workers`` requests but holds at most
          ``max_sequences``; the rest wait for a slot (the agg queue rule, note 5);
       b. the ``prefill_workers`` form a queue fed at λ = clients / (TTFT + (OSL−1) × TPOT); each
          serves ``prefill_batch`` prompts per prefill time S, so ρ = λS / (workers × batch) and
          the M/D/1 wait ρS / (2(1−ρ)) joins TTFT. TTFT is the fixed point, found by bisection
          (the wait falls as TTFT rises, so there is one root).
       ``clients`` = 0 (unknown, or the planner, which sizes the pools itself): no waits, and the
       decode batch is ``decode_batch``.
    """
    topo = topo or Topology.for_gpu(gpu)
    ps = Setup(model, gpu, prefill, precision, backend, topo, eff)
    ds = Setup(model, gpu, decode, precision, backend, topo, eff)
    c = cap.capacity(
        model, gpu, decode, context_tokens=isl + osl, precision=precision, kv_precision=ds.kv_precision
    )
    if not c.fits:
        inf = float("inf")
        return Estimate(inf, inf, 0, "kv_capacity", {"weights_per_gpu_bytes": c.weights_bytes})
    load = math.ceil(clients / max(decode_workers, 1)) if clients > 0 else decode_batch
    running = max(1, min(load, c.max_sequences))
    dec = decode_step(ds, running, isl + osl / 2)
    tpot = dec["decode_step_s"]
    slot_wait = osl * tpot * (load / running - 1) if clients > 0 and load > running else 0.0
    kv_bytes = cap.kv_bytes_per_sequence(model, isl, ps.kv_precision)
    link = topo.inter_node if prefill.gpus + decode.gpus > topo.gpus_per_node else FABRICS[gpu.scale_up]
    transfer = link_time(link, kv_bytes / max(prefill.tp, 1), ps.eff.comm_eff)
    pre = prefill_time(ps, isl * max(prefill_batch, 1), isl)
    service = pre["prefill_s"]
    base = service + transfer + slot_wait
    wait = 0.0
    if clients > 0:
        slots = max(prefill_workers, 1) * max(prefill_batch, 1)

        def excess(ttft: float) -> tuple[float, float]:
            rho = clients / (ttft + max(osl - 1, 0) * tpot) * service / slots
            w = rho * service / (2 * (1 - rho)) if rho < 1 else float("inf")
            return base + w - ttft, w

        lo, hi = base, base + clients * service / slots + 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if excess(mid)[0] > 0:
                lo = mid
            else:
                hi = mid
        wait = excess(hi)[1]
    terms = dict(dec)
    terms.update(pre)
    terms.update({
        "kv_transfer_bytes": kv_bytes, "kv_transfer_s": transfer, "prefill_queue_s": wait,
        "queue_wait_s": slot_wait, "running_sequences": float(running),
        "max_sequences": float(c.max_sequences), "weights_per_gpu_bytes": c.weights_bytes,
    })  # fmt: skip
    return Estimate(base + wait, tpot, running, _wall(terms, slot_wait > 0, inter_node_terms(ds)), terms)
