"""Memory capacity of a parallel layout: weights and KV cache per GPU, and how many sequences fit.

Rules (REFERENCE §5):
  1. Weights bytes = parameters × bytes/param: BF16 2, FP8 1, FP4 0.5 + one 8-bit scale per
     16 values (NVFP4) = 0.5625.
  2. KV bytes per token = layers × 2 × kv_heads × head_dim × bytes (GQA) or
     layers × (kv_lora_rank + qk_rope_head_dim) × bytes (MLA). Sliding-window layers keep at most
     ``sliding_window`` tokens.
  3. Under TP the KV of a layer is split over min(TP, kv_heads) GPUs (heads are replicated beyond
     that; MLA's latent is shared by all heads, so it is replicated on every TP rank). Under PP a
     GPU holds only its stage's layers (the largest stage, ceil(layers / PP)).
  4. Attention weights and dense MLPs split over TP and PP; routed experts split over EP when
     EP > 1, else over TP. Embedding and LM head are vocab-parallel over TP; with PP they sit on
     the first and last stage, so the largest stage carries one of them.
  5. Usable HBM = HBM × 0.90 (vLLM's default gpu_memory_utilization); the activation reserve is
     the peak of one forward over ``max_batched_tokens`` plus a fixed 1.5 GB for CUDA context,
     NCCL buffers and CUDA graphs.
  6. Max concurrency = (usable − weights/GPU − activations) / (KV per GPU per sequence), per
     replica; attention-DP multiplies it by the group size (each rank holds its own sequences).
  7. A layout that leaves no room for one sequence does not fit; :attr:`Capacity.reason` says
     whether the weights and activations alone overflow HBM or the KV room is too small.
  8. A layout the engines refuse is an error (:func:`check_layout`): TP must divide the attention
     heads (vLLM, SGLang and TRT-LLM split heads evenly over TP ranks), and the KV heads must
     divide evenly too — KV heads % TP = 0, or TP % KV heads = 0 where TP exceeds them and each
     KV head is replicated on TP / KV heads ranks; PP at most the layers; EP only for an MoE
     model, dividing its routed experts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from analyzer.catalog import Gpu
from analyzer.modelcfg import ModelConfig

BYTES_PER_PARAM = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5625}
USABLE_FRACTION = 0.90
FIXED_RESERVE_BYTES = 1.5e9
MAX_BATCHED_TOKENS = 8192


@dataclass(frozen=True)
class Layout:
    """A parallel layout of one deployment: TP × PP GPUs per replica, DP replicas, EP for experts.

    ``attention_dp`` runs attention data-parallel over the TP group (each rank its own sequences,
    attention weights replicated) while experts are split over EP — the DeepSeek/SGLang layout.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    attention_dp: bool = False

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def label(self) -> str:
        parts = [f"TP{self.tp}", f"PP{self.pp}", f"DP{self.dp}"]
        if self.ep > 1:
            parts.append(f"EP{self.ep}")
        if self.attention_dp:
            parts.append("attnDP")
        return "·".join(parts)


def check_layout(model: ModelConfig, layout: Layout) -> None:
    """Raise ``ValueError`` naming the rule when an engine would refuse ``layout`` (note 8)."""
    tp, name = layout.tp, model.name
    if min(layout.tp, layout.pp, layout.dp, layout.ep) < 1:
        raise ValueError(f"{layout.label()}: every parallel degree must be at least 1")
    if not layout.attention_dp:
        if model.heads % tp:
            raise ValueError(f"TP{tp} does not divide {name}'s {model.heads} attention heads")
        kv = model.kv_heads
        if (tp <= kv and kv % tp) or (tp > kv and tp % kv):
            raise ValueError(f"TP{tp} does not divide {name}'s {kv} KV heads (nor is it a multiple of them)")
    if layout.pp > model.layers:
        raise ValueError(f"PP{layout.pp} exceeds {name}'s {model.layers} layers")
    if layout.ep > 1 and not model.is_moe:
        raise ValueError(f"EP{layout.ep} needs an MoE model; {name} is dense")
    if layout.ep > 1 and model.experts % layout.ep:
        raise ValueError(f"EP{layout.ep} does not divide {name}'s {model.experts} routed experts")


def bytes_per_param(precision: str) -> float:
    """Note 1; unknown precisions raise naming the known ones."""
    try:
        return BYTES_PER_PARAM[precision]
    except KeyError:
        raise KeyError(f"unknown precision {precision!r}; known: {', '.join(BYTES_PER_PARAM)}") from None


def weight_bytes(model: ModelConfig, precision: str) -> float:
    """All weights of the model at ``precision`` (note 1)."""
    return model.params() * bytes_per_param(precision)


def stage_layers(model: ModelConfig, pp: int) -> int:
    """Layers on the largest pipeline stage (note 3)."""
    return math.ceil(model.layers / pp)


def weights_per_gpu(model: ModelConfig, precision: str, layout: Layout) -> float:
    """Weight bytes on the most loaded GPU (note 4)."""
    b = bytes_per_param(precision)
    attn_tp = 1 if layout.attention_dp else layout.tp
    layers = stage_layers(model, layout.pp)
    attn = model.attention_params() / attn_tp
    dense_mlp = 3 * model.hidden * model.intermediate / layout.tp
    per_layer_dense = attn + (0 if model.is_moe else dense_mlp)
    moe = 0.0
    if model.is_moe:
        shard = layout.ep if layout.ep > 1 else layout.tp
        routed = model.experts * model.expert_params() / shard
        shared = model.shared_experts * model.expert_params() / layout.tp
        moe_frac = model.moe_layers / model.layers
        moe = layers * moe_frac * (routed + shared) + layers * (1 - moe_frac) * dense_mlp
    embed = model.vocab * model.hidden / layout.tp
    n_embed = 1 if layout.pp > 1 or model.tied_embeddings else 2
    return (layers * per_layer_dense + moe + n_embed * embed) * b


def kv_bytes_per_token(model: ModelConfig, precision: str = "bf16") -> float:
    """KV bytes one token adds across all full-attention layers (note 2)."""
    full = model.layers - model.sliding_layers
    return full * model.kv_elems_per_token_layer() * bytes_per_param(precision)


def kv_bytes_per_sequence(model: ModelConfig, tokens: int, precision: str = "bf16") -> float:
    """KV bytes of one ``tokens``-long sequence, sliding-window layers capped (note 2)."""
    per_layer = model.kv_elems_per_token_layer() * bytes_per_param(precision)
    full = (model.layers - model.sliding_layers) * per_layer * tokens
    sliding = model.sliding_layers * per_layer * min(tokens, model.sliding_window)
    return full + sliding


def kv_split(model: ModelConfig, layout: Layout) -> int:
    """Over how many GPUs one sequence's KV of a layer is split (note 3)."""
    if model.is_mla or layout.attention_dp:
        return 1
    return min(layout.tp, model.kv_heads)


def kv_per_gpu_per_sequence(model: ModelConfig, tokens: int, precision: str, layout: Layout) -> float:
    """KV bytes one sequence costs on the most loaded GPU (note 3)."""
    stage_fraction = stage_layers(model, layout.pp) / model.layers
    return kv_bytes_per_sequence(model, tokens, precision) * stage_fraction / kv_split(model, layout)


def activation_reserve(model: ModelConfig, layout: Layout, tokens: int = MAX_BATCHED_TOKENS) -> float:
    """Peak activation bytes of one forward over ``tokens`` tokens, plus the fixed reserve (note 5).

    Live at the peak: the residual stream and norm output (2 × hidden), the QKV output and the
    gated-MLP intermediate for this GPU's shard, in BF16.
    """
    inter = (model.moe_intermediate * model.top_k if model.is_moe else model.intermediate) / layout.tp
    qkv = (model.heads + 2 * model.kv_heads) * model.head_dim / layout.tp
    return tokens * (2 * model.hidden + qkv + 2 * inter) * 2 + FIXED_RESERVE_BYTES


@dataclass(frozen=True)
class Capacity:
    """Memory budget of one GPU of a layout, all in bytes; ``max_sequences`` per replica."""

    hbm_bytes: float
    usable_bytes: float
    weights_bytes: float
    activation_bytes: float
    kv_budget_bytes: float
    kv_per_sequence_bytes: float
    max_sequences: int

    @property
    def fits(self) -> bool:
        """Weights and activations fit with room for at least one sequence of the context."""
        return self.max_sequences >= 1

    @property
    def reason(self) -> str:
        """Why the layout does not fit, in words (empty when it fits; note 7)."""
        if self.fits:
            return ""
        gb = 1e9
        if self.kv_budget_bytes <= 0:
            w, a = self.weights_bytes / gb, self.activation_bytes / gb
            return (
                f"weights {w:.1f} GB + activations {a:.1f} GB per GPU exceed the "
                f"{self.usable_bytes / gb:.1f} GB usable of {self.hbm_bytes / gb:.0f} GB HBM"
            )
        return (
            f"KV room {self.kv_budget_bytes / gb:.2f} GB per GPU is less than one sequence's KV "
            f"({self.kv_per_sequence_bytes / gb:.2f} GB)"
        )


def capacity(
    model: ModelConfig,
    gpu: Gpu,
    layout: Layout,
    *,
    context_tokens: int,
    precision: str = "bf16",
    kv_precision: str = "bf16",
) -> Capacity:
    """Memory budget and max concurrency per replica at ``context_tokens`` per sequence (notes 5-6)."""
    usable = gpu.hbm_bytes * USABLE_FRACTION
    weights = weights_per_gpu(model, precision, layout)
    act = activation_reserve(model, layout)
    budget = usable - weights - act
    per_seq = kv_per_gpu_per_sequence(model, max(context_tokens, 1), kv_precision, layout)
    n = max(0, math.floor(budget / per_seq)) if budget > 0 else 0
    if layout.attention_dp:
        n *= layout.tp
    return Capacity(gpu.hbm_bytes, usable, weights, act, budget, per_seq, n)


def max_concurrency_mix(
    model: ModelConfig,
    gpu: Gpu,
    layout: Layout,
    mix: list[tuple[int, float]],
    *,
    precision: str = "bf16",
    kv_precision: str = "bf16",
) -> int:
    """Max concurrent sequences per replica for a context mix ``[(tokens, share), ...]``.

    The KV per sequence is the share-weighted mean over the mix (shares need not sum to 1).
    """
    total = sum(w for _, w in mix)
    if not mix or total <= 0:
        raise ValueError(f"context mix must have positive shares (got {mix!r})")
    cap = capacity(model, gpu, layout, context_tokens=1, precision=precision, kv_precision=kv_precision)
    per_seq = sum(kv_per_gpu_per_sequence(model, t, kv_precision, layout) * w for t, w in mix) / total
    n = max(0, math.floor(cap.kv_budget_bytes / per_seq)) if cap.kv_budget_bytes > 0 else 0
    return n * (layout.tp if layout.attention_dp else 1)
