"""Step time of one simulated engine replica: the planner's performance model, step by step.

The duration and the work of each engine step come from :func:`analyzer.perf.step_time` (the
same model ``ioe estimate`` and ``ioe plan`` use), for the replica's model, GPU, layout, backend
and topology. The simulator adds only what that model leaves to the caller:

1. A throttled GPU in the TP group runs its GPU part (max of the HBM and compute rooflines) at
   its clock ratio, and every rank waits for it at the next all-reduce, so the step grows by
   ``gpu_part × (1/ratio − 1)``.
2. What the GPU sampler needs besides the model's compute and memory roofline times: the TP
   all-reduce wire bytes per GPU = layers × 2 all-reduces × 2(TP−1)/TP × tokens × hidden × 2 bytes.
3. A degraded inter-node link (fault) scales the inter-node fabric's bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from analyzer import capacity, perf
from analyzer.capacity import Layout
from analyzer.catalog import fabric, gpu
from analyzer.modelcfg import load as load_model
from simulate.engine import StepCost
from simulate.spec import SimDeployment


@dataclass(frozen=True)
class StepModel:
    """Callable ``(decode_batch, decode_context_tokens, prefill_tokens) -> StepCost`` for one replica."""

    setup: perf.Setup
    slowest_clock_ratio: float = 1.0

    @property
    def hidden(self) -> int:
        return self.setup.model.hidden

    def __call__(self, batch: int, ctx: int, prefill: int) -> StepCost:
        s = self.setup
        mean_ctx = ctx / batch if batch else 0.0
        terms = perf.step_time(s, batch, mean_ctx, float(prefill), max(prefill, 1))
        gpu_part = max(terms["decode_hbm_s"], terms["decode_compute_s"])
        seconds = terms["decode_step_s"] + gpu_part * (1 / self.slowest_clock_ratio - 1)
        return StepCost(
            seconds=seconds,
            compute_s=terms["decode_compute_s"],
            hbm_s=terms["decode_hbm_s"],
            comm_s=terms.get("decode_tp_allreduce_s", 0.0),
            comm_bytes_per_gpu=_allreduce_wire_bytes(s, batch + prefill),
        )


def _allreduce_wire_bytes(s: perf.Setup, tokens: int) -> float:
    tp = s.layout.tp
    if tp == 1:
        return 0.0
    msg = tokens * s.model.hidden * perf.ACT_BYTES
    return 2 * s.stage_layers * 2 * (tp - 1) / tp * msg


def step_model(d: SimDeployment) -> StepModel:
    """Rules 1–3 instantiated for a deployment replica."""
    g = gpu(d.gpu)
    inter = fabric(d.fabric)
    if d.faults.degraded_link_ratio != 1.0:
        inter = replace(inter, bytes_per_s=inter.bytes_per_s * d.faults.degraded_link_ratio)
    setup = perf.Setup(
        load_model(d.model), g, Layout(tp=d.tp, pp=d.pp), d.precision, "vllm",
        perf.Topology(gpus_per_node=d.gpus_per_node, inter_node=inter),
    )  # fmt: skip
    ratio = d.faults.straggler_clock_ratio if d.faults.straggler_gpu >= 0 else 1.0
    return StepModel(setup, ratio)


def kv_capacity_tokens(d: SimDeployment) -> int:
    """Tokens of KV cache one replica holds (``analyzer.capacity``: usable HBM − weights − reserve)."""
    m = load_model(d.model)
    g = gpu(d.gpu)
    layout = Layout(tp=d.tp, pp=d.pp)
    free = g.hbm_bytes * capacity.USABLE_FRACTION - capacity.weights_per_gpu(m, d.precision, layout)
    free -= capacity.activation_reserve(m, layout)
    per_token = capacity.kv_per_gpu_per_sequence(m, 1, d.precision, layout)
    return max(int(free / per_token), 0)
