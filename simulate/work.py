"""What one engine step does on one GPU: FLOPs and HBM bytes, counted from the model's shape.

The step's *duration* comes from the planner's model (:mod:`simulate.stepmodel`); this module
counts the *work* in it independently, from the architecture alone, so that the GPU counters
follow what the step computes and moves rather than the model's roofline times. Per GPU of a
replica of ``group`` = TP × PP GPUs (with EP the experts are spread over the same GPUs):

1. GEMM FLOPs: 2 × active parameters × tokens ÷ group. A prompt token skips the LM head
   (logits are computed only where a token is sampled).
2. Attention FLOPs (QKᵀ and PV): 4 × layers × heads × head_dim × context per token ÷ group; a
   decode token attends to its whole context, a prompt token on average to half its prompt.
3. HBM bytes streamed: the weights the step touches (all of a dense model's shard; of an MoE
   layer's experts, those the batch's ``tokens × top_k`` routings hit: E × (1 − (1 − k/E)^N)),
   the KV cache the decodes read (a prompt's own K/V once per 128-query tile, as flash attention
   reads it), the KV written for every token, and activations (per token per layer:
   6 × hidden + 3 × intermediate ÷ TP values read or written, 2 bytes each; an MoE token's
   intermediate is top_k experts' worth).
4. A GEMM that runs at the tensor pipes' rate still re-reads operand tiles from HBM: on a real
   H100 (tests/data/h100_nvml) an 8192³ BF16 GEMM at 679 TFLOP/s kept DRAM 0.257 busy of
   3.35 TB/s, i.e. 1.27 mB per FLOP; the step's HBM bytes are at least that many per GEMM FLOP.
"""

from __future__ import annotations

from dataclasses import dataclass

from analyzer.modelcfg import ModelConfig

BYTES_PER_PARAM = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5}
ACT_BYTES = 2.0
KV_BYTES = 2.0
FLASH_QUERY_TILE = 128  # a prompt's K/V is read once per tile of this many queries
GEMM_HBM_BYTES_PER_FLOP = 0.257 * 3.35e12 / 679e12  # rule 4, measured on an H100


@dataclass(frozen=True)
class StepWork:
    """One step's work on one GPU (rules 1-4)."""

    gemm_flops: float
    attn_flops: float
    hbm_bytes: float
    weight_bytes: float
    kv_read_bytes: float

    @property
    def flops(self) -> float:
        return self.gemm_flops + self.attn_flops


def experts_hit(experts: int, top_k: int, routings: float) -> float:
    """Expected distinct experts hit by ``routings`` tokens each choosing ``top_k`` of ``experts``."""
    if experts <= 0 or routings <= 0:
        return 0.0
    return experts * (1 - (1 - min(top_k, experts) / experts) ** routings)


def weight_bytes_touched(m: ModelConfig, precision: str, group: int, tokens: int) -> float:
    """Rule 3's weights: the shard of every dense weight, and the experts the batch hits."""
    b = BYTES_PER_PARAM[precision]
    embed = m.vocab * m.hidden * (1 if m.tied_embeddings else 2)
    dense = m.layers * m.attention_params() + embed
    if not m.is_moe:
        return (dense + m.mlp_params(active=False)) * b / group
    dense += m.dense_layers * 3 * m.hidden * m.intermediate
    dense += m.moe_layers * (m.shared_experts * m.expert_params() + m.hidden * m.experts)
    hit = experts_hit(m.experts, m.top_k, tokens)
    return (dense + m.moe_layers * hit * m.expert_params()) * b / group


def kv_bytes_per_token(m: ModelConfig, tp: int, pp: int) -> float:
    """KV bytes one token keeps on one GPU: its layers' share, its KV heads' share (GQA)."""
    split = 1 if m.is_mla else min(tp, max(m.kv_heads, 1))
    return m.layers * m.kv_elems_per_token_layer() * KV_BYTES / split / pp


def step_work(
    m: ModelConfig, precision: str, tp: int, pp: int, decodes: int, ctx_tokens: int, prefill: int, isl: int
) -> StepWork:
    """Rules 1-4 for ``decodes`` sequences holding ``ctx_tokens`` in all, plus ``prefill`` prompt
    tokens of ``isl``-long prompts."""
    group = tp * pp
    tokens = decodes + prefill
    active = m.active_params()
    gemm = 2 * (active * decodes + (active - m.vocab * m.hidden) * prefill) / group
    per_ctx = 4 * m.layers * m.heads * m.head_dim / group
    attn = per_ctx * (ctx_tokens + prefill * isl / 2)
    weights = weight_bytes_touched(m, precision, group, tokens) if tokens else 0.0
    kv_tok = kv_bytes_per_token(m, tp, pp)
    kv_read = kv_tok * (ctx_tokens + prefill * isl / 2 / FLASH_QUERY_TILE)
    inter = m.moe_intermediate * m.top_k if m.is_moe else m.intermediate
    acts = tokens * m.layers / pp * (6 * m.hidden + 3 * inter / tp) * ACT_BYTES
    stream = weights + kv_read + kv_tok * tokens + acts
    return StepWork(gemm, attn, max(stream, GEMM_HBM_BYTES_PER_FLOP * gemm), weights, kv_read)
