"""What to simulate: deployments (model, GPU, layout, nodes, fabric), their workload and faults.

The embedded demo set (:func:`demo_deployments`) is built so that each deployment sits in a
different zone of the envelope, by construction of its workload and layout:

1. ``chat-8b``: Llama-3.1-8B, one H100 PCIe (2.0 TB/s HBM) per replica, DP 2, Azure conversation
   trace with prompts capped at 256 tokens (a chat front end) → decode-dominated, HBM-bandwidth
   bound (weights take ~10 of a ~14 ms step); its load
   triples 60 % of the way through the warm-up, clear of the report's half-way baseline split
   (a p99 regression).
2. ``code-70b``: Llama-3.1-70B TP 4 on H100 NVLink, Azure code trace's requests (long prompts,
   few output tokens) as a steady Poisson stream → prefill-heavy, compute bound; GPU 2 is
   throttled (thermal, 80 % clock): a straggler with matching clocks, throttle reasons and
   temperature.
3. ``longctx-70b``: Llama-3.1-70B TP 4, Mooncake conversation trace (8–16K-token prompts,
   ~500-token answers) at a rate its KV cache cannot hold → KV-capacity bound (preemptions,
   queueing, TTFT ≈ queue time).
4. ``tp16-ib``: Llama-3.1-70B TP 16 across two 8-GPU nodes over InfiniBand NDR → every layer's
   all-reduce crosses the slow fabric: network-critical.

Beyond the demo set a deployment can declare EP for an MoE model (``ep`` > 1: experts spread
over the replica's GPUs, dispatch and combine all-to-alls each MoE layer), disaggregated
prefill/decode (``prefill`` > 0 prefill engines beside ``dp`` decode engines, each role on its
own nodes, every request's KV cache sent over ``kv_fabric``), and the faults of
:class:`Faults`. Rank numbers in faults are ranks inside every replica's TP × PP group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml


@dataclass(frozen=True)
class Faults:
    straggler_gpu: int = -1  # TP rank whose GPU is thermally throttled
    straggler_clock_ratio: float = 0.7  # its SM clock / nominal
    degraded_link_ratio: float = 1.0  # fabric bandwidth multiplier (< 1 = degraded link)
    # a lowered power limit (``nvidia-smi -pl``) on one rank: it throttles when a step's demand
    # exceeds it (simulate.activity rule 6)
    power_limit_gpu: int = -1
    power_limit_w: float = 0.0
    # NVLink CRC/replay errors and PCIe replays rising on one rank; its link retransmits, so
    # every collective of its group takes link_error_comm_ratio × as long
    link_error_gpu: int = -1
    nvlink_errors_per_s: float = 40.0
    pcie_replays_per_s: float = 4.0
    link_error_comm_ratio: float = 1.3
    # an XID on one rank at xid_at_s: the GPU hangs for xid_stall_s (its group waits), then the
    # gauge keeps the code
    xid_gpu: int = -1
    xid: int = 13
    xid_at_s: float = 0.0
    xid_stall_s: float = 5.0
    # host contention on one rank: its CPU needs host_contention_s more per step before it
    # launches the step's kernels (its peers wait for it in the first collective)
    host_contention_gpu: int = -1
    host_contention_s: float = 0.01
    # cross-node collectives: each call waits an extra Exp(jitter_s) latency; during congestion
    # (from congestion_at_s for congestion_s, every congestion_period_s if > 0) the inter-node
    # fabric gives congestion_bw_ratio of its bandwidth
    jitter_s: float = 0.0
    congestion_at_s: float = -1.0
    congestion_s: float = 0.0
    congestion_period_s: float = 0.0
    congestion_bw_ratio: float = 1.0
    surge_at_s: float = -1.0  # load surge start (simulated seconds), -1 = none
    surge_multiplier: float = 1.0
    exporter_hangs: bool = False
    exporter_garbage: bool = False


@dataclass(frozen=True)
class SimDeployment:
    name: str
    model: str
    gpu: str = "h100_sxm"
    tp: int = 1
    pp: int = 1
    dp: int = 1
    gpus_per_node: int = 8
    fabric: str = "ib_ndr"
    precision: str = "bf16"
    workload: str = "azure_conv"
    speed: float = 1.0
    max_isl: int = 0
    poisson: bool = False  # the trace's request mix at its mean rate, without its bursts
    max_num_seqs: int = 256
    ep: int = 1  # expert parallelism inside each replica (MoE models): 1 or tp × pp
    attention_dp: bool = False  # attention data-parallel over the TP group (DeepSeek-style EP)
    prefill: int = 0  # > 0: disaggregated, this many prefill engines beside dp decode engines
    kv_fabric: str = ""  # the prefill→decode KV link ("" = fabric)
    faults: Faults = field(default_factory=Faults)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.ep not in (1, self.tp * self.pp):
            raise ValueError(f"deployment {self.name}: ep must be 1 or tp × pp = {self.tp * self.pp}")
        f = self.faults
        for name in ("straggler_gpu", "power_limit_gpu", "link_error_gpu", "xid_gpu", "host_contention_gpu"):
            rank = getattr(f, name)
            if rank >= self.per_engine:
                raise ValueError(
                    f"deployment {self.name}: faults.{name} = {rank} is not a rank of its "
                    f"{self.per_engine}-GPU group (0..{self.per_engine - 1})"
                )
        if f.power_limit_gpu >= 0 and f.power_limit_w <= 0:
            raise ValueError(f"deployment {self.name}: faults.power_limit_gpu needs power_limit_w > 0 W")

    @property
    def per_engine(self) -> int:
        return self.tp * self.pp

    @property
    def engines(self) -> int:
        return self.prefill + self.dp

    def role(self, engine: int) -> str:
        """``prefill``/``decode`` in a disaggregated deployment, else ``both``."""
        if not self.prefill:
            return "both"
        return "prefill" if engine < self.prefill else "decode"

    def gpu_indices(self, engine: int) -> list[int]:
        """Global GPU slots of an engine; a disaggregated deployment starts each role on a new node."""
        per = self.per_engine
        if not self.prefill or engine < self.prefill:
            return list(range(engine * per, (engine + 1) * per))
        first_decode = -(-self.prefill * per // self.gpus_per_node) * self.gpus_per_node
        start = first_decode + (engine - self.prefill) * per
        return list(range(start, start + per))

    @property
    def gpus(self) -> int:
        return self.per_engine * self.engines

    @property
    def nodes(self) -> int:
        last = self.gpu_indices(self.engines - 1)[-1]
        return last // self.gpus_per_node + 1

    def host(self, gpu_index: int) -> str:
        return f"{self.name}-node{gpu_index // self.gpus_per_node}"


def demo_deployments(surge_at_s: float) -> list[SimDeployment]:
    """The embedded default set (module rules 1–4); ``chat-8b``'s load surges at ``surge_at_s``."""
    chat_surge = Faults(surge_at_s=surge_at_s, surge_multiplier=3.0)
    throttled = Faults(straggler_gpu=2, straggler_clock_ratio=0.8)
    return [
        SimDeployment("chat-8b", "llama-3.1-8b", dp=2, workload="azure_conv", speed=2.0, max_isl=256,
                      gpu="h100_pcie", faults=chat_surge, seed=1),
        SimDeployment("code-70b", "llama-3.1-70b", tp=4, workload="azure_code", speed=2.5, max_isl=6000,
                      poisson=True, faults=throttled, seed=2),
        SimDeployment("longctx-70b", "llama-3.1-70b", tp=4, workload="mooncake", speed=0.5, seed=3),
        SimDeployment("tp16-ib", "llama-3.1-70b", tp=16, workload="azure_conv", speed=1.0, fabric="ib_ndr",
                      seed=4),
    ]  # fmt: skip


def load_deployments(path: str) -> list[SimDeployment]:
    """Deployments from a YAML file: a list of mappings with :class:`SimDeployment`'s fields."""
    with open(path) as fh:
        data = yaml.safe_load(fh)
    if not isinstance(data, list):
        raise ValueError(f"simulate config {path}: expected a list of deployments, got {type(data).__name__}")
    return [_deployment(item, f"{path}[{i}]") for i, item in enumerate(data)]


def _deployment(item: Any, where: str) -> SimDeployment:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected a mapping")
    item = dict(item)
    faults = Faults(**item.pop("faults", {}) or {})
    try:
        return SimDeployment(**item, faults=faults)
    except TypeError as exc:
        raise ValueError(f"{where}: {exc}") from exc
