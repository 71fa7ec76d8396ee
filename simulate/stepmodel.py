"""One simulated engine step: its duration, and what each GPU of the replica did in it.

The step's nominal terms come from :func:`analyzer.perf.step_time` (the model ``ioe estimate``
and ``ioe plan`` use) for the replica's model, GPU, layout and topology: the GPU part (max of
its HBM and compute times), the collectives (TP all-reduce, EP all-to-all, PP sends) and the
host overhead (the rest of the step). The work inside the step — FLOPs and HBM bytes — is
counted by :mod:`simulate.work` from the architecture, and the GPU counters follow from it
(:mod:`simulate.activity`). The simulator adds what the model leaves to the caller:

1. A rank whose clock is held down (thermal straggler, or a lowered power limit the step's
   demand exceeds: activity rule 6) runs its GPU part at its clock ratio; every rank waits
   for the slowest at the next collective, so the step's GPU part is the slowest rank's.
2. A rank with host contention spends ``host_contention_s`` more on the CPU before launching
   the step; a rank hit by an XID hangs ``xid_stall_s`` in the step that reaches ``xid_at_s``.
   Its peers wait inside the collective (NCCL kernels spin: engine active, few SMs).
3. Collectives whose group spans nodes (perf's inter-node terms) cross the inter-node fabric:
   each of the step's calls waits an extra Exp(``jitter_s``) (their sum: a Gamma draw), and
   during congestion the fabric gives ``congestion_bw_ratio`` of its bandwidth (the crossing
   time is divided by it). A degraded link scales the fabric's bandwidth throughout. A rank with
   link errors retransmits: all of its group's collective time × ``link_error_comm_ratio``.
4. Wire bytes per GPU: TP all-reduce 2 × layers × 2(n−1)/n × tokens × hidden × 2 B; EP
   dispatch + combine 2 × MoE layers × tokens/EP × hidden × 2 B × the remote ranks a token's
   top_k experts land on. Inside a node they are NVLink bytes; the share bound for other nodes
   leaves through the NIC: (nodes − 1)/nodes of a TP ring, (EP − per node)/(EP − 1) of EP peers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from analyzer import capacity, perf
from analyzer.capacity import Layout
from analyzer.catalog import Gpu, fabric, gpu
from analyzer.modelcfg import load as load_model
from simulate import work
from simulate.activity import IDLE_W, RankStep, demand_w, power_clock_ratio
from simulate.engine import Collective, StepCost
from simulate.spec import Faults, SimDeployment

TDP_W = {"h100_sxm": 700.0, "h100_pcie": 350.0, "h200_sxm": 700.0, "b200_sxm": 1000.0, "a100_sxm": 400.0}
COMM_TERMS = ("decode_tp_allreduce_s", "decode_ep_alltoall_s", "decode_pp_send_s")


def tdp_w(g: Gpu) -> float:
    return TDP_W.get(g.name, 700.0)


@dataclass(frozen=True)
class RankFaults:
    """Faults of one rank of the replica's group (resolved from :class:`Faults`)."""

    thermal_ratio: float = 1.0
    power_limit_w: float = 0.0  # 0: stock (TDP)
    host_s: float = 0.0
    link_errors: bool = False
    xid_at_s: float = -1.0


def rank_faults(f: Faults, rank: int) -> RankFaults:
    return RankFaults(
        thermal_ratio=f.straggler_clock_ratio if rank == f.straggler_gpu else 1.0,
        power_limit_w=f.power_limit_w if rank == f.power_limit_gpu else 0.0,
        host_s=f.host_contention_s if rank == f.host_contention_gpu else 0.0,
        link_errors=rank == f.link_error_gpu,
        xid_at_s=f.xid_at_s if rank == f.xid_gpu else -1.0,
    )


@dataclass
class StepModel:
    """Callable ``(decode_batch, decode_context_tokens, prefill_tokens, now) -> StepCost``."""

    setup: perf.Setup
    faults: Faults = field(default_factory=Faults)
    ranks: tuple[RankFaults, ...] = ()
    precision: str = "bf16"
    seed: int = 0
    _xid_done: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        if not self.ranks:
            n = self.setup.layout.tp * self.setup.layout.pp
            self.ranks = tuple(rank_faults(self.faults, r) for r in range(n))
        lay, per_node = self.setup.layout, self.setup.topo.gpus_per_node
        self.crossing = set(perf.inter_node_terms(self.setup))
        n = lay.tp * lay.pp
        nodes = -(-n // per_node)
        self.tp_cross_share = (nodes - 1) / nodes if lay.tp > per_node else 0.0
        self.ep_cross_share = (lay.ep - per_node) / (lay.ep - 1) if lay.ep > per_node else 0.0

    def __call__(self, batch: int, ctx: int, prefill: int, now: float = 0.0) -> StepCost:
        s = self.setup
        mean_ctx = ctx / batch if batch else 0.0
        isl = max(prefill, 1)
        terms = perf.step_time(s, batch, mean_ctx, float(prefill), isl)
        gpu_part = terms["decode_kernels_s"]  # each kernel on its own roofline, one stage
        comm_nominal = sum(terms.get(k, 0.0) for k in COMM_TERMS)
        host = max(terms["decode_step_s"] - gpu_part - comm_nominal, 0.0)
        comm, calls = self._comm(terms, now)
        wk = work.step_work(s.model, self.precision, s.layout.tp, s.layout.pp, batch, ctx, prefill, isl)
        wire, cross = self._wire_bytes(batch + prefill)
        ready, kernels, clocks, capped, hangs = [], [], [], [], []
        for r, rf in enumerate(self.ranks):
            ratio, limited = self._clock(rf, wk, gpu_part)
            hang = self._hang(r, rf, now)
            kernels.append(gpu_part / ratio)
            clocks.append(ratio)
            capped.append(limited)
            hangs.append(hang)
            ready.append(host + rf.host_s + gpu_part / ratio + hang)
        last = max(ready)
        seconds = last + comm
        ranks = tuple(
            self._rank_step(rf, wk, seconds, kernels[r], last - ready[r] + comm, hangs[r], clocks[r],
                            capped[r], wire, cross)
            for r, rf in enumerate(self.ranks)
        )  # fmt: skip
        colls = self._collectives(batch + prefill, comm, calls, ready, kernels)
        return StepCost(
            seconds=seconds,
            compute_s=terms["decode_compute_s"],
            hbm_s=terms["decode_hbm_s"],
            comm_s=comm,
            comm_bytes_per_gpu=wire,
            host_s=host,
            flops=wk.flops,
            hbm_bytes=wk.hbm_bytes,
            ranks=ranks,
            collectives=colls,
        )

    def _comm(self, terms: dict[str, float], now: float) -> tuple[float, int]:
        """Rule 3: the step's collective time and its number of calls."""
        f = self.faults
        total = 0.0
        for k in COMM_TERMS:
            t = terms.get(k, 0.0)
            if t and k in self.crossing:
                t /= self.congestion(now)
                if f.jitter_s > 0:
                    t += self.rng.gammavariate(self._calls(k), f.jitter_s)
            total += t
        if any(r.link_errors for r in self.ranks):
            total *= f.link_error_comm_ratio
        calls = sum(self._calls(k) for k in COMM_TERMS if terms.get(k, 0.0))
        return total, max(calls, 1)

    def _calls(self, term: str) -> int:
        m, layers = self.setup.model, self.setup.stage_layers
        if term == "decode_tp_allreduce_s":
            return 2 * layers
        if term == "decode_ep_alltoall_s":
            return 2 * max(round(layers * m.moe_layers / max(m.layers, 1)), 1)
        return max(self.setup.layout.pp - 1, 1)

    def congestion(self, now: float) -> float:
        """Rule 3: the crossing time's divisor at ``now`` (the fabric's bandwidth share, 1 when calm)."""
        f = self.faults
        if f.congestion_at_s < 0 or f.congestion_s <= 0 or now < f.congestion_at_s:
            return 1.0
        since = now - f.congestion_at_s
        if f.congestion_period_s > 0:
            since %= f.congestion_period_s
        return max(f.congestion_bw_ratio, 1e-3) if since < f.congestion_s else 1.0

    def _clock(self, rf: RankFaults, wk: work.StepWork, gpu_part: float) -> tuple[float, bool]:
        """Rule 1: the rank's clock ratio this step, and whether its power limit set it (the
        demand at its thermal clock still above the limit)."""
        if rf.power_limit_w <= 0 or gpu_part <= 0:
            return rf.thermal_ratio, False
        g = self.setup.gpu
        tensor = min(self._tensor_s(wk) / gpu_part, 1.0)
        dram = min(wk.hbm_bytes / g.hbm_bytes_per_s / gpu_part, 1.0)
        demand = demand_w(tdp_w(g), 1.0, dram, tensor)
        if IDLE_W + (demand - IDLE_W) * rf.thermal_ratio**3 <= rf.power_limit_w:
            return rf.thermal_ratio, False
        return power_clock_ratio(rf.power_limit_w, demand), True

    def _hang(self, rank: int, rf: RankFaults, now: float) -> float:
        if rf.xid_at_s < 0 or now < rf.xid_at_s or rank in self._xid_done:
            return 0.0
        self._xid_done.add(rank)
        return self.faults.xid_stall_s

    def _tensor_s(self, wk: work.StepWork) -> float:
        g = self.setup.gpu
        return wk.gemm_flops / g.peak_flops(self.precision) + wk.attn_flops / g.peak_flops("bf16")

    def _wire_bytes(self, tokens: int) -> tuple[float, float]:
        """Rule 4: (wire bytes per GPU, the share of them that leaves the node)."""
        s, m = self.setup, self.setup.model
        lay = s.layout
        msg = tokens * m.hidden * work.ACT_BYTES
        tp_b = ep_b = 0.0
        if lay.tp > 1 and not lay.attention_dp:
            tp_b = 2 * s.stage_layers * 2 * (lay.tp - 1) / lay.tp * msg
        if m.is_moe and lay.ep > 1:
            moe_layers = s.stage_layers * m.moe_layers / m.layers
            ep_b = 2 * moe_layers * msg / lay.ep * perf.remote_ranks(m.experts, m.top_k, lay.ep)
        total = tp_b + ep_b
        out = tp_b * self.tp_cross_share + ep_b * self.ep_cross_share
        return total, (out / total if total else 0.0)

    def _rank_step(
        self,
        rf: RankFaults,
        wk: work.StepWork,
        seconds: float,
        kernel: float,
        coll: float,
        hang: float,
        ratio: float,
        capped: bool,
        wire: float,
        cross: float,
    ) -> RankStep:
        """One rank's counters for the step (activity rules 1, 2, 6, 7)."""
        g = self.setup.gpu
        tdp = tdp_w(g)
        tensor_s = min(self._tensor_s(wk) / ratio, kernel)
        dram_s = min(wk.hbm_bytes / g.hbm_bytes_per_s, kernel) + 2 * wire / g.hbm_bytes_per_s
        p_kernel = IDLE_W
        if kernel > 0:
            demand = demand_w(tdp, 1.0, min(dram_s / kernel, 1.0), tensor_s / kernel)
            p_kernel = min(IDLE_W + (demand - IDLE_W) * ratio**3, rf.power_limit_w or tdp)
        p_nccl = demand_w(tdp, 1.0, 0.02, 0.0)  # spinning NCCL kernels: engine busy, little else
        energy = (p_kernel - IDLE_W) * kernel + (p_nccl - IDLE_W) * (coll + hang)
        errors = seconds if rf.link_errors else 0.0
        return RankStep(
            seconds=seconds,
            kernel_s=kernel,
            collective_s=coll,
            hang_s=hang,
            tensor_s=tensor_s,
            dram_s=dram_s,
            clock_s=ratio * kernel + rf.thermal_ratio * coll,  # a power cap lets go between kernels
            capped_s=kernel if capped else 0.0,
            thermal_s=kernel if rf.thermal_ratio < 1 else 0.0,
            energy_j=max(energy, 0.0),
            nvlink_bytes=wire * (1 - cross),
            nic_bytes=wire * cross,
            nvlink_errors=self.faults.nvlink_errors_per_s * errors,
            pcie_replays=self.faults.pcie_replays_per_s * errors,
        )

    def _collectives(
        self, tokens: int, comm: float, calls: int, ready: list[float], kernels: list[float]
    ) -> tuple[Collective, ...]:
        """The step's collective as the Inspector would sample one call of it: each rank's
        arrival (its host and hang lag, plus one call's share of its GPU part) and the transfer."""
        lay, m = self.setup.layout, self.setup.model
        if comm <= 0 or lay.tp * lay.pp == 1:
            return ()
        op = "AlltoAll" if m.is_moe and lay.ep > 1 else "AllReduce"
        if op == "AlltoAll":
            msg = tokens * m.hidden * work.ACT_BYTES / lay.ep
        else:
            msg = tokens * m.hidden * work.ACT_BYTES
        arrivals = tuple(ready[r] - kernels[r] + kernels[r] / calls for r in range(len(ready)))
        return (Collective(op, calls, int(msg), comm / calls, arrivals),)


def step_model(d: SimDeployment) -> StepModel:
    """Rules 1-4 instantiated for a deployment replica."""
    g = gpu(d.gpu)
    inter = fabric(d.fabric)
    if d.faults.degraded_link_ratio != 1.0:
        inter = replace(inter, bytes_per_s=inter.bytes_per_s * d.faults.degraded_link_ratio)
    setup = perf.Setup(
        load_model(d.model), g, Layout(tp=d.tp, pp=d.pp, ep=d.ep, attention_dp=d.attention_dp), d.precision,
        "vllm", perf.Topology(gpus_per_node=d.gpus_per_node, inter_node=inter),
    )  # fmt: skip
    return StepModel(setup, d.faults, precision=d.precision, seed=d.seed)


def kv_capacity_tokens(d: SimDeployment) -> int:
    """Tokens of KV cache one replica holds (``analyzer.capacity``: usable HBM − weights − reserve)."""
    m = load_model(d.model)
    g = gpu(d.gpu)
    layout = Layout(tp=d.tp, pp=d.pp, ep=d.ep, attention_dp=d.attention_dp)
    free = g.hbm_bytes * capacity.USABLE_FRACTION - capacity.weights_per_gpu(m, d.precision, layout)
    free -= capacity.activation_reserve(m, layout)
    per_token = capacity.kv_per_gpu_per_sequence(m, 1, d.precision, layout)
    return max(int(free / per_token), 0)


def kv_transfer_s(d: SimDeployment, isl: int) -> tuple[float, float]:
    """(seconds, bytes) to send one prompt's KV cache from a prefill to a decode engine over
    ``kv_fabric``: every layer's K and V of ``isl`` tokens, latency + bytes ÷ one-way bandwidth
    of the engine's NICs (one per GPU, all sending their shard side by side)."""
    m = load_model(d.model)
    link = fabric(d.kv_fabric or d.fabric)
    total = isl * m.layers * m.kv_elems_per_token_layer() * work.KV_BYTES
    per_gpu = total / d.per_engine
    return link.latency_s + per_gpu / link.bytes_per_s, total
