"""The scenarios of the truth set, each with the verdict an expert signs and the reason.

Numbers in the reasons are the generator's own (``scenario.json`` holds them per interval); the
physics that produces them is in :mod:`truthgen.physics` and :mod:`truthgen.engine`.
"""

from __future__ import annotations

from truthgen.physics import ETH_100G, IB_NDR, LLAMA_8B, LLAMA_70B, QWEN3_235B, Fabric
from truthgen.scenarios import (
    ETH_25G,
    EngineSpec,
    Expected,
    Phase,
    Scenario,
    Window,
    _gpus,
    _one,
    _steady,
    _two_node_tp16,
)

LIGHT = Scenario(
    "light_load_headroom",
    "Llama-3.1-8B on one H100, a trickle of chat traffic",
    LLAMA_8B,
    _one(1),
    _steady(0.25, 800, 250),
    Expected(
        "headroom",
        "Half a request in flight on average: the GPU is idle ~60 % of the time, KV cache under 1 % used, "
        "nothing waits, TTFT tens of ms and ITL at the single-sequence floor (weights ÷ HBM bandwidth ≈ 7 "
        "ms). Every wall is "
        "far "
        "away; load can grow many-fold before any of them binds.",
    ),
    seed=11,
)

HBM_1GPU = Scenario(
    "hbm_decode_1gpu",
    "Llama-3.1-8B on one H100, decode-heavy traffic near its throughput limit",
    LLAMA_8B,
    _one(1),
    _steady(17.0, 100, 800),
    Expected(
        "hbm_bandwidth",
        "~160 sequences decode together with short prompts: every step streams 16 GB of weights plus ~10 GB "
        "of KV, DRAM_ACTIVE sits at its ~0.8 ceiling while the tensor pipes run at ~0.3; ITL is ~1.6× the "
        "single-sequence floor and grows with batch. KV is ~20 % used and nothing queues: the binding wall "
        "is HBM bandwidth.",
    ),
    seed=12,
)

HBM_TP4 = Scenario(
    "hbm_decode_tp4",
    "Llama-3.1-70B TP4 inside one NVLink node, decode-heavy traffic near its limit",
    LLAMA_70B,
    _one(4),
    _steady(7.0, 100, 600),
    Expected(
        "hbm_bandwidth",
        "TP4 on NVLink, ~90 sequences decoding: each GPU streams its 35 GB weight shard plus KV every step "
        "(DRAM_ACTIVE ~0.6, tensor ~0.2). The two all-reduces per layer run on NVLink (~20 % of the step, "
        "fabric overhead inside the node, not a network). Nothing queues and KV is not full: HBM bandwidth "
        "binds.",
    ),
    seed=13,
)

COMPUTE = Scenario(
    "compute_prefill",
    "Llama-3.1-8B on one H100, long prompts and short answers (RAG / summarisation)",
    LLAMA_8B,
    _one(1),
    _steady(4.7, 6000, 40),
    Expected(
        "compute",
        "Each request brings 6,000 prompt tokens and asks for 40: the engine spends most of every step in "
        "prefill GEMMs (tensor pipes ~0.6, SM ~0.9) while DRAM is far below its ceiling; TTFT is dominated "
        "by "
        "prefill time, KV stays low. Prompt tokens/s sits near the H100's dense BF16 rate at the measured "
        "efficiency: compute binds.",
    ),
    seed=14,
)

COMPUTE_RAMP = Scenario(
    "compute_prefill_ramp",
    "Llama-3.1-8B on one H100, RAG traffic ramping up for ten minutes, then held (a 14-minute window)",
    LLAMA_8B,
    _one(1),
    (Phase(0.0, 600.0, 0.2, 4.7, 6000, 40), Phase(600.0, 840.0, 4.7, 4.7, 6000, 40)),
    Expected(
        "compute",
        "The same long-prompt traffic as compute_prefill, arriving at 0.2 requests/s and ramping to 4.7 over "
        "ten minutes, then held for four: for the last third of the window the tensor pipes sit at ~0.6 "
        "and SM ~0.9 as in the steady case. A mean over the whole 14 minutes is diluted by the quiet start "
        "(it would read ~0.4), but the deployment has reached its compute wall: judged at the load it "
        "reached, compute binds.",
    ),
    duration_s=840.0,
    seed=18,
)

KV = Scenario(
    "kv_capacity",
    "Llama-3.1-8B on one H100, long-context chat that outgrows the KV pool",
    LLAMA_8B,
    _one(1),
    _steady(1.9, 6000, 1000),
    Expected(
        "kv_capacity",
        "Each sequence holds ~6,500 tokens × 128 KiB of KV; the 54 GB pool fits ~63 of them, far below "
        "max_num_seqs 256. KV usage sits at ~0.98, the engine preempts, requests wait and the queue grows, "
        "so TTFT is mostly queue time. DRAM is busy (the KV reads) but the admission limit is the KV pool: "
        "KV capacity binds.",
    ),
    seed=15,
)

OVERLOAD = Scenario(
    "overload_no_kv_pressure",
    "Llama-3.1-8B on one H100, more decode traffic than it can serve, short contexts",
    LLAMA_8B,
    _one(1),
    _steady(26.0, 100, 800),
    Expected(
        "hbm_bandwidth",
        "Arrivals exceed what 256 concurrent sequences can finish: running is pinned at max_num_seqs, the "
        "queue grows every scrape and TTFT is queue time. KV is only ~30 % used and nothing is preempted, so "
        "this is not KV capacity; each step streams weights + KV with DRAM_ACTIVE at its ceiling while the "
        "tensor pipes are half idle: the wall the queue stands behind is HBM bandwidth.",
    ),
    seed=16,
)

TP8_LIGHT = Scenario(
    "tp8_nvlink_light",
    "Llama-3.1-70B TP8 inside one NVLink node at light load",
    LLAMA_70B,
    _one(8),
    _steady(0.5, 800, 300),
    Expected(
        "headroom",
        "TP8 in one node: the two all-reduces per layer are small (~32 KB) latency-bound messages on "
        "NVLink, "
        "so their bus bandwidth is far below link peak and they take a large share of a small-batch step — "
        "that is fabric overhead inside one NVLink domain, not a network wall (no collective crosses a "
        "node). Two sequences in flight, no queue, KV ~0 %, TTFT and ITL where the model puts them: "
        "headroom.",
    ),
    seed=17,
)


def _tp16(
    name: str, title: str, fabric: Fabric, phases: tuple[Phase, ...], reason: str, seed: int
) -> Scenario:
    return Scenario(
        name,
        title,
        LLAMA_70B,
        _two_node_tp16(),
        phases,
        Expected("network", reason, cross_node=True),
        inter_fabric=fabric,
        seed=seed,
    )


TP16_ETH_RAMP = _tp16(
    "tp16_eth_ramp",
    "Llama-3.1-70B TP16 across two nodes over 100 GbE, load ramping up",
    ETH_100G,
    (Phase(0.0, 600.0, 0.2, 1.8, 800, 300),),
    "The TP group spans node-a and node-b: 160 all-reduces per step cross 100 GbE. As load ramps, ITL "
    "grows with concurrency while DRAM and tensor activity stay low, the p99/p50 gap widens with the "
    "link's jitter, and the Inspector shows all-reduce time as most of the wall clock: the network (cross-"
    "node TP) is the wall.",
    21,
)
TP16_ETH_PLATEAU = _tp16(
    "tp16_eth_plateau",
    "Llama-3.1-70B TP16 across two nodes over 100 GbE, saturated (plateau)",
    ETH_100G,
    _steady(3.2, 800, 300),
    "Same layout held at its plateau: arrivals exceed what the all-reduce-bound step can serve, the queue "
    "grows and TTFT is queue time, yet the GPUs are mostly waiting (DRAM and tensor low) and collectives "
    "take ~90 % of wall time at a fraction of link bandwidth. Nothing changes with load on a plateau, so the "
    "level evidence carries it: the cross-node network is the wall, not headroom.",
    22,
)
TP16_IB_RAMP = _tp16(
    "tp16_ib_ramp",
    "Llama-3.1-70B TP16 across two nodes over InfiniBand NDR, load ramping up",
    IB_NDR,
    (Phase(0.0, 600.0, 0.5, 6.0, 800, 300),),
    "TP16 across two nodes on 400 Gb/s InfiniBand: faster than Ethernet, but every step still waits on "
    "160 cross-node all-reduces (~80 % of the step at the top of the ramp). ITL grows with load while the "
    "GPUs stay unsaturated: "
    "the network (cross-node TP) is the wall; TP8 per node with PP or DP across would not pay it.",
    23,
)
TP16_IB_PLATEAU = _tp16(
    "tp16_ib_plateau",
    "Llama-3.1-70B TP16 across two nodes over InfiniBand NDR, saturated (plateau)",
    IB_NDR,
    _steady(8.5, 800, 300),
    "At its plateau over InfiniBand: the queue grows, KV is far from full, DRAM and tensor are low, and the "
    "cross-node all-reduces take most of each step. The level evidence (collective share, ITL far above "
    "the model for this batch on one node) says network, cross-node.",
    24,
)

MOE_EP = Scenario(
    "moe_ep16_two_nodes",
    "Qwen3-235B-A22B, DP2 × TP8 attention with EP16 experts across two nodes over InfiniBand",
    QWEN3_235B,
    (EngineSpec("node-a", 0, _gpus("node-a", 8)), EngineSpec("node-a", 1, _gpus("node-b", 8))),
    _steady(2.4, 1000, 400),
    Expected(
        "network",
        "Experts are split over 16 GPUs on two nodes: every MoE layer all-gathers the tokens of all 16 ranks "
        "and reduce-scatters the results across InfiniBand (vLLM's all-gather/reduce-scatter all2all). Those "
        "collectives take most of each step while DRAM and tensor stay low; the TP8 all-reduces of attention "
        "stay inside each node's NVLink. The expert all-to-all across nodes is the wall (network, "
        "cross-node).",
        cross_node=True,
    ),
    ep=16,
    inter_fabric=IB_NDR,
    seed=25,
)

PD_SLOW_KV = Scenario(
    "pd_slow_kv_transfer",
    "Llama-3.1-70B prefill on node-a (TP8) and decode on node-b (TP8), KV sent over a 25 GbE front-end NIC",
    LLAMA_70B,
    (
        EngineSpec("prefill", 0, _gpus("node-a", 8), "prefill"),
        EngineSpec("decode", 0, _gpus("node-b", 8), "decode"),
    ),
    _steady(2.7, 3000, 300),
    Expected(
        "network",
        "Each request's 3,000-token KV cache (~1 GB) must cross from the prefill node to the decode node "
        "over "
        "a 25 GbE link (RDMA not configured): ~0.3 s per request at ~85 % link utilisation, so requests "
        "queue "
        "for the link. Prefill GPUs are lightly used, decode GPUs too, yet the decode engine always has "
        "requests deferred waiting for KV and TTFT is mostly transfer wait: the cross-node KV transfer is "
        "the "
        "wall. The decode server's request spans carry each request's KV-transfer time: most of TTFT.",
        cross_node=True,
    ),
    kv_link=ETH_25G,
    seed=26,
)

NO_PROF = Scenario(
    "no_profiling_fields",
    "Llama-3.1-8B on one H100 at moderate load, dcgm-exporter with its default CSV minus DCGM_FI_PROF_*",
    LLAMA_8B,
    _one(1),
    _steady(4.0, 800, 250),
    Expected(
        "unknown",
        "The engine shows moderate load without queueing, but dcgm-exporter exports no DCGM_FI_PROF_* fields "
        "(GPU_UTIL only says a kernel was running). Without SM, tensor and DRAM activity nobody can say how "
        "close compute or HBM bandwidth is, so there is no positive evidence of slack: unknown, naming the "
        "missing fields.",
        missing=("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"),
    ),
    profiling=False,
    seed=31,
)

NO_PROF_OVERLOAD = Scenario(
    "no_profiling_overload",
    "Llama-3.1-8B on one H100, overloaded, no DCGM_FI_PROF_* fields",
    LLAMA_8B,
    _one(1),
    _steady(26.0, 100, 800),
    Expected(
        "saturated",
        "Requests queue (waiting grows, TTFT is queue time) with KV only ~30 % used and no preemption, so it "
        "is saturated and not KV-bound — but with no DCGM_FI_PROF_* fields the wall (compute or HBM) cannot "
        "be identified: saturated, wall not identified; DRAM and tensor activity would identify it.",
        missing=("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"),
    ),
    profiling=False,
    seed=32,
)

MOVING = Scenario(
    "moving_hbm_to_kv",
    "Llama-3.1-8B on one H100: short chat (HBM-bound) then long-context traffic (KV-bound)",
    LLAMA_8B,
    _one(1),
    (Phase(0.0, 300.0, 17.0, 17.0, 100, 800), Phase(300.0, 600.0, 1.9, 1.9, 6000, 1000)),
    Expected(
        "kv_capacity",
        "For the first five minutes decode-heavy short chat keeps DRAM at its ceiling with KV half used and "
        "no queue (HBM bandwidth); then long-context traffic fills the KV pool, the engine preempts and "
        "requests queue (KV capacity). The verdict follows the window: hbm_bandwidth for [0, 300 s), "
        "kv_capacity for [360 s, 600 s).",
        windows=(Window(0.0, 300.0, "hbm_bandwidth"), Window(360.0, 600.0, "kv_capacity")),
    ),
    seed=41,
)

SCENARIOS: tuple[Scenario, ...] = (
    LIGHT,
    HBM_1GPU,
    HBM_TP4,
    COMPUTE,
    COMPUTE_RAMP,
    KV,
    OVERLOAD,
    TP8_LIGHT,
    TP16_ETH_RAMP,
    TP16_ETH_PLATEAU,
    TP16_IB_RAMP,
    TP16_IB_PLATEAU,
    MOE_EP,
    PD_SLOW_KV,
    NO_PROF,
    NO_PROF_OVERLOAD,
    MOVING,
)
