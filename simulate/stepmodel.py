"""Step time of one simulated engine replica, from the model's architecture and the hardware catalog.

For a step with ``B`` decoding sequences holding ``C`` context tokens in total and ``P``
prefill tokens, on each of the replica's TP×PP GPUs:

1. FLOPs = 2 × active parameters / (TP·PP) × (B + P), plus attention: 4 × layers × heads ×
   head_dim / TP × (C + P²/2) (each decode token attends to its context; a prompt chunk to
   itself, causally).
2. HBM bytes = weights per GPU + C × KV bytes per token per GPU (``analyzer.capacity``).
3. compute = FLOPs / (peak × ``COMPUTE_EFFICIENCY``); memory = bytes / (bandwidth ×
   ``HBM_EFFICIENCY``); the GPU part of the step is max(compute, memory) — and, with a
   throttled GPU in the TP group, that GPU's part divided by its clock ratio (everyone waits
   for the slowest rank at the next all-reduce).
4. TP communication: 2 all-reduces per layer of (B + P) × hidden × 2 bytes, each costing the
   link's latency + 2(TP−1)/TP × message / bandwidth; the link is the node's NVLink when the TP
   group fits in one node, else the inter-node fabric (times the degraded-link ratio).
5. step = GPU part × PP + communication + ``STEP_OVERHEAD_S`` (scheduling, launch).
"""

from __future__ import annotations

from dataclasses import dataclass

from analyzer import capacity
from analyzer.capacity import Layout
from analyzer.catalog import fabric, gpu
from analyzer.modelcfg import load as load_model
from simulate.engine import StepCost
from simulate.spec import SimDeployment

COMPUTE_EFFICIENCY = 0.6
HBM_EFFICIENCY = 0.8
STEP_OVERHEAD_S = 0.002


@dataclass(frozen=True)
class StepModel:
    """Callable ``(decode_batch, decode_context_tokens, prefill_tokens) -> StepCost`` for one replica."""

    peak_flops: float
    hbm_bytes_per_s: float
    active_params_per_gpu: float
    attn_flops_per_ctx_token: float
    weights_per_gpu: float
    kv_bytes_per_token_gpu: float
    hidden: int
    layers: int
    tp: int
    pp: int
    link_bytes_per_s: float
    link_latency_s: float
    slowest_clock_ratio: float = 1.0

    def __call__(self, batch: int, ctx: int, prefill: int) -> StepCost:
        tokens = batch + prefill
        flops = 2 * self.active_params_per_gpu * tokens
        flops += self.attn_flops_per_ctx_token * (ctx + prefill * prefill / 2)
        hbm = self.weights_per_gpu + ctx * self.kv_bytes_per_token_gpu
        compute_s = flops / (self.peak_flops * COMPUTE_EFFICIENCY)
        hbm_s = hbm / (self.hbm_bytes_per_s * HBM_EFFICIENCY)
        gpu_s = max(compute_s, hbm_s) / self.slowest_clock_ratio * self.pp
        comm_s, comm_bytes = self._allreduce(tokens)
        return StepCost(gpu_s + comm_s + STEP_OVERHEAD_S, compute_s, hbm_s, comm_s, comm_bytes, flops, hbm)

    def _allreduce(self, tokens: int) -> tuple[float, float]:
        if self.tp == 1:
            return 0.0, 0.0
        msg = tokens * self.hidden * 2
        wire = 2 * (self.tp - 1) / self.tp * msg
        per_layer = 2 * (self.link_latency_s + wire / self.link_bytes_per_s)
        layers = self.layers // self.pp
        return per_layer * layers, 2 * wire * layers


def step_model(d: SimDeployment) -> StepModel:
    """Rules 1–5 instantiated for a deployment replica."""
    m = load_model(d.model)
    g = gpu(d.gpu)
    layout = Layout(tp=d.tp, pp=d.pp)
    inside_node = d.tp <= d.gpus_per_node
    link = fabric(g.scale_up if inside_node else d.fabric)
    link_bw = link.bytes_per_s * (1.0 if inside_node else d.faults.degraded_link_ratio)
    ratio = d.faults.straggler_clock_ratio if d.faults.straggler_gpu >= 0 else 1.0
    return StepModel(
        peak_flops=g.peak_flops(d.precision),
        hbm_bytes_per_s=g.hbm_bytes_per_s,
        active_params_per_gpu=m.active_params() / (d.tp * d.pp),
        attn_flops_per_ctx_token=4 * m.layers * m.heads * m.head_dim / d.tp / d.pp,
        weights_per_gpu=capacity.weights_per_gpu(m, d.precision, layout),
        kv_bytes_per_token_gpu=capacity.kv_per_gpu_per_sequence(m, 1, d.precision, layout),
        hidden=m.hidden,
        layers=m.layers,
        tp=d.tp,
        pp=d.pp,
        link_bytes_per_s=link_bw,
        link_latency_s=link.latency_s,
        slowest_clock_ratio=ratio,
    )


def kv_capacity_tokens(d: SimDeployment) -> int:
    """Tokens of KV cache one replica holds (``analyzer.capacity``: usable HBM − weights − reserve)."""
    m = load_model(d.model)
    g = gpu(d.gpu)
    layout = Layout(tp=d.tp, pp=d.pp)
    free = g.hbm_bytes * capacity.USABLE_FRACTION - capacity.weights_per_gpu(m, d.precision, layout)
    free -= capacity.activation_reserve(m, layout)
    per_token = capacity.kv_per_gpu_per_sequence(m, 1, d.precision, layout)
    return max(int(free / per_token), 0)
