"""First-principles step costs for the truth set: hardware, models, fabrics, collectives, queues.

Nothing here comes from IOE's analyzer or simulator; every figure is a public specification (cited
beside it) or a number taken from NVIDIA's measured curves in
``fixtures/silicon/dense_calibration.csv`` (aiconfigurator ``silicon_sample.csv``, REAL TTFT/TPOT).

Notes (the rules this module applies):

1. Weights bytes = parameters × bytes per parameter; per GPU ÷ (TP × PP) for a dense model, and for
   an MoE model the expert weights are split over EP and the rest over TP.
2. KV bytes per token = 2 (K and V) × layers × kv_heads × head_dim × bytes; per GPU ÷ min(TP,
   kv_heads), because KV heads are replicated once TP exceeds their number.
3. One engine step (one forward over a batch) is a roofline: bytes = weights read once + the KV of
   every running sequence; FLOPs = 2 × active parameters × tokens in the step (decode tokens plus
   chunked-prefill tokens) + attention 4 × layers × context × heads × head_dim per token. Step time
   = max(bytes / (η_hbm × HBM bandwidth), FLOPs / (η_compute × peak)) + exposed communication +
   a fixed scheduling overhead.
4. Calibration from dense_calibration.csv (:func:`derive_calibration` recomputes both from the file):
   η_hbm = 0.70 from the row Llama-3.1-8B-Instruct, BF16, h100_sxm, TRT-LLM, TP1, ISL 1024, OSL 512,
   concurrency 8 (TPOT 7.42 ms): its roofline bytes (16.06 GB weights + 8 × 1,280 tokens × 131,072 B
   KV) ÷ 3.35 TB/s = 5.19 ms, so the engine reaches 0.70 of peak HBM bandwidth in decode.
   η_compute = 0.57 from the row Llama-3.1-8B-Instruct, BF16, h100_sxm, TRT-LLM, TP1, ISL 4096,
   OSL 128, concurrency 64 (TPOT 64.32 ms): at that mix every step carries 64 decode tokens plus
   64 × 4096 / 128 = 2,048 prefill tokens, whose FLOPs at the measured step time give 0.57 of the
   989 TFLOP/s BF16 peak. With these two numbers the mixed-step model of
   :func:`predicted_tpot_s` gives the measured TPOT of the Llama-3.1-8B H100 rows (TP1-8, ISL
   1-4K, concurrency 8-128) with a median ratio near 0.9 and most rows within ±35 %
   (tests/test_truthgen.py checks it).
5. Collectives (NCCL's cost model shape): ring all-reduce = base + 2(n−1)·α + 2(n−1)/n · bytes / bw;
   tree all-reduce = base + 2·log2(n)·α + 2 · bytes / bw; NCCL picks the faster, so the cost is the
   minimum (trees span nodes: inside one NVLink node the ring is the cost). All-gather and
   reduce-scatter = base + (n−1)·α + (n−1)/n · total bytes / bw. A group that crosses nodes runs at
   the inter-node fabric's per-GPU bandwidth and latency (its slowest hop).
6. Little's law: mean requests in the system = arrival rate × mean time in the system.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

GB = 1e9
TB = 1e12
TFLOPS = 1e12
US = 1e-6

# --------------------------------------------------------------------------------------------- hardware


@dataclass(frozen=True)
class Gpu:
    """One GPU model's public peaks."""

    name: str  # the catalog spelling a deployment declares (h100_sxm)
    dcgm_model: str  # what dcgm-exporter prints as modelName
    hbm_bytes: float
    hbm_bw: float  # bytes/s
    peak_bf16: float  # dense FLOP/s
    scale_up: str  # the fabric inside a node
    gpus_per_node: int
    idle_w: float
    max_w: float


# NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100), SXM5 column: 80 GB HBM3,
# 3.35 TB/s, BF16 Tensor Core 1,979 TFLOP/s *with sparsity* (989 dense), NVLink 900 GB/s, TDP 700 W.
H100_SXM = Gpu(
    "h100_sxm", "NVIDIA H100 80GB HBM3", 80 * GB, 3.35 * TB, 989 * TFLOPS, "nvlink4", 8, 70.0, 700.0
)
# NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): 141 GB HBM3e, 4.8 TB/s, same Hopper
# tensor cores (989 TFLOP/s dense BF16), NVLink 900 GB/s, TDP 700 W.
H200_SXM = Gpu("h200_sxm", "NVIDIA H200", 141 * GB, 4.8 * TB, 989 * TFLOPS, "nvlink4", 8, 75.0, 700.0)


@dataclass(frozen=True)
class Fabric:
    """A link: per-GPU one-way bandwidth, per-hop latency α and a per-collective base cost."""

    name: str  # the catalog spelling (nvlink4, ib_ndr, eth_100g)
    bw: float  # bytes/s per GPU, one direction
    alpha_s: float  # per ring/tree step
    base_s: float  # launch + synchronisation per collective
    crosses_nodes: bool


# NVLink 4: 900 GB/s bidirectional per H100 = 450 GB/s each way (H100 datasheet). The base and α are
# chosen so that an 8-GPU small-message all-reduce costs ≈ 37 µs, the measured H100×8 figure in the
# project's reference notes (nccl-tests all_reduce_perf, 8 B-64 KiB rows).
NVLINK4 = Fabric("nvlink4", 450 * GB, 1.2 * US, 20 * US, False)
# InfiniBand NDR: 400 Gb/s = 50 GB/s per GPU with one ConnectX-7 NIC per GPU (DGX H100 user guide:
# 8 × 400 Gb/s compute NICs). ~5 µs per hop through NIC, PCIe and switch (NVIDIA Quantum-2 switch
# port-to-port latency is sub-µs; the rest is NIC/PCIe/proxy).
IB_NDR = Fabric("ib_ndr", 50 * GB, 5 * US, 20 * US, True)
# 100 GbE: 100 Gb/s = 12.5 GB/s, one NIC per node shared by the node's rings; NCCL over TCP sockets
# costs tens of µs per hop (kernel network stack).
ETH_100G = Fabric("eth_100g", 12.5 * GB, 30 * US, 20 * US, True)

FABRICS = {f.name: f for f in (NVLINK4, IB_NDR, ETH_100G)}


# ------------------------------------------------------------------------------------------------ models


@dataclass(frozen=True)
class Model:
    """The public architecture numbers a step cost needs (from each model's config.json)."""

    name: str  # Hugging Face id, as vLLM prints model_name
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    params: float  # total
    active_params: float  # per token (== params for a dense model)
    experts: int = 0
    top_k: int = 0
    expert_params: float = 0.0  # the part of params held in experts (split over EP)
    bytes_per_param: float = 2.0  # BF16

    @property
    def moe(self) -> bool:
        return self.experts > 0

    def kv_bytes_per_token(self, kv_bytes: float = 2.0) -> float:
        """Note 2: 2 × layers × kv_heads × head_dim × bytes (whole model, all GPUs)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * kv_bytes

    def kv_bytes_per_token_per_gpu(self, tp: int, pp: int = 1) -> float:
        return self.kv_bytes_per_token() / min(tp, self.kv_heads) / pp

    def weights_bytes(self) -> float:
        return self.params * self.bytes_per_param

    def weights_per_gpu(self, tp: int, pp: int = 1, ep: int = 1) -> float:
        """Note 1: dense weights ÷ (TP·PP); MoE expert weights ÷ EP, the rest ÷ TP (per PP stage)."""
        if not self.moe or ep <= 1:
            return self.weights_bytes() / (tp * pp)
        expert = self.expert_params * self.bytes_per_param / ep
        rest = (self.params - self.expert_params) * self.bytes_per_param / tp
        return (expert + rest) / pp

    def decode_bytes_read_per_gpu(self, tp: int, ep: int, batch_tokens: float) -> float:
        """Weights a step actually reads: for MoE only the experts some token in the batch routes to."""
        if not self.moe or ep <= 1:
            return self.weights_per_gpu(tp, 1, ep)
        local = self.experts / ep
        # expected fraction of a rank's experts hit by batch_tokens tokens each picking top_k of E
        hit = 1.0 - (1.0 - self.top_k / self.experts) ** max(batch_tokens, 0.0)
        expert = self.expert_params * self.bytes_per_param / self.experts * local * hit
        rest = (self.params - self.expert_params) * self.bytes_per_param / tp
        return expert + rest


# meta-llama/Llama-3.1-8B-Instruct config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads, head_dim
# 128; 8.03 B parameters (model card).
LLAMA_8B = Model("meta-llama/Llama-3.1-8B-Instruct", 32, 4096, 32, 8, 128, 8.03e9, 8.03e9)
# meta-llama/Llama-3.1-70B-Instruct config.json: 80 layers, hidden 8192, 64 heads, 8 KV heads, 128;
# 70.55 B parameters (model card).
LLAMA_70B = Model("meta-llama/Llama-3.1-70B-Instruct", 80, 8192, 64, 8, 128, 70.55e9, 70.55e9)
# Qwen/Qwen3-235B-A22B config.json: 94 layers, hidden 4096, 64 heads, 4 KV heads, 128; 128 experts,
# 8 per token, moe_intermediate 1536; 235 B total, 22 B active (model card). Expert weights:
# 94 layers × 128 experts × 3 × 4096 × 1536 = 227 B.
QWEN3_235B = Model(
    "Qwen/Qwen3-235B-A22B", 94, 4096, 64, 4, 128, 235e9, 22e9, experts=128, top_k=8, expert_params=227e9
)

MODELS = {m.name: m for m in (LLAMA_8B, LLAMA_70B, QWEN3_235B)}

# ------------------------------------------------------------------------------------------ calibration

ETA_HBM = 0.70  # note 4
ETA_COMPUTE = 0.57  # note 4
STEP_OVERHEAD_S = 0.4e-3  # scheduler + sampling + launch per step (CPU side, vLLM V1 with CUDA graphs)
USABLE_HBM = 0.90  # vLLM's default gpu_memory_utilization
ACTIVATION_BYTES = 2.0 * GB  # activations and CUDA graphs reserve per GPU


def attention_flops_per_token(m: Model, context: float) -> float:
    """Note 3: QKᵀ and A·V, 2 FLOPs per multiply-add, over ``context`` earlier tokens."""
    return 4.0 * m.layers * context * m.heads * m.head_dim


def step_flops(m: Model, decode_tokens: float, prefill_tokens: float, ctx: float, isl: float) -> float:
    """FLOPs of one step over the whole model (all GPUs)."""
    linear = 2.0 * m.active_params * (decode_tokens + prefill_tokens)
    attn = decode_tokens * attention_flops_per_token(m, ctx) + prefill_tokens * attention_flops_per_token(
        m, isl / 2
    )
    return linear + attn


@dataclass(frozen=True)
class StepCost:
    """One step on one GPU of the group: its roofline terms and the exposed communication."""

    mem_s: float
    compute_s: float
    comm_s: float
    overhead_s: float
    bytes: float
    flops: float

    @property
    def total_s(self) -> float:
        return max(self.mem_s, self.compute_s) + self.comm_s + self.overhead_s


def step_cost(
    m: Model,
    gpu: Gpu,
    *,
    tp: int,
    ep: int = 1,
    batch: float,
    ctx: float,
    prefill_tokens: float = 0.0,
    isl: float = 0.0,
    comm_s: float = 0.0,
) -> StepCost:
    """Note 3 for one GPU of a TP (×EP) group: ``batch`` decode sequences of mean context ``ctx``."""
    group = tp * max(ep // tp, 1) if m.moe else tp
    tokens = batch + prefill_tokens
    nbytes = m.decode_bytes_read_per_gpu(tp, ep, tokens * max(ep // tp, 1)) + batch * ctx * (
        m.kv_bytes_per_token_per_gpu(tp)
    )
    flops = (
        step_flops(m, batch, prefill_tokens, ctx, isl) / tp
        if not m.moe
        else (step_flops(m, batch, prefill_tokens, ctx, isl) * max(ep // tp, 1) / group)
    )
    return StepCost(
        nbytes / (ETA_HBM * gpu.hbm_bw),
        flops / (ETA_COMPUTE * gpu.peak_bf16),
        comm_s,
        STEP_OVERHEAD_S,
        nbytes,
        flops,
    )


def kv_capacity_tokens(m: Model, gpu: Gpu, tp: int, ep: int = 1) -> float:
    """Tokens of KV one engine holds: (usable HBM − weights − activations) ÷ KV bytes per token per GPU."""
    free = gpu.hbm_bytes * USABLE_HBM - m.weights_per_gpu(tp, 1, ep) - ACTIVATION_BYTES
    return max(free, 0.0) / m.kv_bytes_per_token_per_gpu(tp)


# -------------------------------------------------------------------------------------------- collectives


def all_reduce_s(nbytes: float, n: int, fabric: Fabric) -> float:
    """Note 5: the faster of ring and tree all-reduce of ``nbytes`` over ``n`` ranks."""
    if n <= 1:
        return 0.0
    ring = fabric.base_s + 2 * (n - 1) * fabric.alpha_s + 2 * (n - 1) / n * nbytes / fabric.bw
    if not fabric.crosses_nodes:
        return ring
    tree = fabric.base_s + 2 * math.log2(n) * fabric.alpha_s + 2 * nbytes / fabric.bw
    return min(ring, tree)


def all_gather_s(total_bytes: float, n: int, fabric: Fabric) -> float:
    """Note 5: ring all-gather (or reduce-scatter) whose result is ``total_bytes`` on every rank."""
    if n <= 1:
        return 0.0
    return fabric.base_s + (n - 1) * fabric.alpha_s + (n - 1) / n * total_bytes / fabric.bw


def bus_bandwidth(op: str, nbytes: float, seconds: float, n: int) -> tuple[float, float]:
    """nccl-tests' algbw = bytes / time and busbw = algbw × factor (AllReduce 2(n−1)/n; AllGather,
    ReduceScatter, AlltoAll (n−1)/n), both in GB/s (10⁹ B/s)."""
    algbw = nbytes / seconds / GB
    factor = 2 * (n - 1) / n if op == "AllReduce" else (n - 1) / n
    return algbw, algbw * factor


def tp_allreduce_per_step(m: Model, tokens: float, tp: int, fabric: Fabric) -> tuple[float, float, int]:
    """TP: two all-reduces per layer of tokens × hidden × 2 bytes → (seconds per step, message bytes,
    collectives per step)."""
    msg = tokens * m.hidden * 2.0
    calls = 2 * m.layers
    return calls * all_reduce_s(msg, tp, fabric), msg, calls


def ep_dispatch_per_step(
    m: Model, tokens_per_rank: float, ep: int, fabric: Fabric
) -> tuple[float, float, int]:
    """EP with vLLM's all-gather/reduce-scatter all2all backend: per MoE layer one all-gather of
    every rank's hidden states (dispatch) and one reduce-scatter (combine) → (seconds per step, bytes
    gathered per collective, collectives per step)."""
    total = tokens_per_rank * ep * m.hidden * 2.0
    calls = 2 * m.layers
    return calls * all_gather_s(total, ep, fabric), total, calls


# ------------------------------------------------------------------------------------------------ queues


def littles_law_in_system(arrival_per_s: float, time_in_system_s: float) -> float:
    """Note 6: L = λ · W."""
    return arrival_per_s * time_in_system_s


# --------------------------------------------------------------------------- calibration from the CSV


def _row(rows: list[dict[str, str]], **want: str) -> dict[str, str]:
    for r in rows:
        if all(r.get(k) == v for k, v in want.items()):
            return r
    raise KeyError(f"dense_calibration.csv: no row with {want}")


def derive_calibration(csv_path: str | Path) -> dict[str, float]:
    """Note 4: η_hbm and η_compute recomputed from the two named rows of dense_calibration.csv."""
    with open(csv_path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    base = {"model_path": LLAMA_8B.name, "system": "h100_sxm", "backend": "trtllm", "tp_size": "1.0"}
    dec = _row(rows, **base, isl="1024", osl="512", batch_size="8.0")
    ctx = 1024 + 512 / 2
    nbytes = LLAMA_8B.weights_bytes() + 8 * ctx * LLAMA_8B.kv_bytes_per_token()
    eta_hbm = nbytes / H100_SXM.hbm_bw / (float(dec["silicon_tpot_ms"]) / 1e3)
    pre = _row(rows, **base, isl="4096", osl="128", batch_size="64.0")
    b, isl, osl = 64.0, 4096.0, 128.0
    flops = step_flops(LLAMA_8B, b, b * isl / osl, isl + osl / 2, isl)
    eta_compute = flops / H100_SXM.peak_bf16 / (float(pre["silicon_tpot_ms"]) / 1e3)
    return {"eta_hbm": eta_hbm, "eta_compute": eta_compute}


def predicted_tpot_s(m: Model, gpu: Gpu, tp: int, isl: float, osl: float, concurrency: float) -> float:
    """The mixed (chunked-prefill) step of a closed loop at ``concurrency``: each step carries
    ``concurrency`` decode tokens and concurrency × ISL / OSL prefill tokens (every request's prompt
    is prefilled once per OSL generated tokens). TP all-reduce over NVLink is added (note 5)."""
    pre = concurrency * isl / osl
    comm, _, _ = tp_allreduce_per_step(m, concurrency + pre, tp, NVLINK4)
    cost = step_cost(
        m, gpu, tp=tp, batch=concurrency, ctx=isl + osl / 2, prefill_tokens=pre, isl=isl, comm_s=comm
    )
    return cost.total_s
