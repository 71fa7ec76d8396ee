"""MoE terms of the step model (analyzer/perf.py note 9) stay on the pessimistic side of physics.

Expected answers come from arithmetic written here, not from the model's own terms:
  1. An MoE model is never faster than its dense twin — the same attention, embeddings and
     layers, with a dense MLP as wide as the experts one token activates (top_k + shared) — at
     the same TP, concurrency and shape: it multiplies through at least the same weights and
     reads at least as many.
  2. A routed expert that receives m < 64 tokens costs a whole 64-row tile: the useful share is
     m / 64 (Hopper wgmma M = 64; vLLM pads each expert's tokens to its block). A step's tokens
     reach E × (1 − (1 − k/E)^tokens) distinct experts (each token picks k of E), and the step
     reads those experts' weights.
  5. The MoE block's four extra small kernels (router GEMM, top-k, token sort, weighted sum)
     cost 3 µs each per MoE layer.
  3. EP all-to-all: the bytes a rank sends are the token's hidden state (2 B per element) once to
     each remote rank holding one of its experts; spanning a second node over a NIC slower than
     NVLink never makes it faster.
  4. Attention-DP: the busiest of D ranks carries at least 1/D of the attention and at most all
     of it; with one sequence per rank and equal contexts it carries exactly 1/D.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from analyzer import capacity as cap
from analyzer import catalog, modelcfg, perf
from analyzer.capacity import Layout

MOE = ["qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x7b"]


def dense_twin(m: modelcfg.ModelConfig) -> modelcfg.ModelConfig:
    """``m`` with its MoE MLP replaced by one dense MLP of the active experts' width (note 1)."""
    assert m.dense_layers == 0
    width = (m.top_k + m.shared_experts) * m.moe_intermediate
    return dataclasses.replace(m, name=m.name + "-dense", experts=0, top_k=0, moe_intermediate=0,
                               shared_experts=0, intermediate=width)  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    name=st.sampled_from(MOE),
    gpu=st.sampled_from(["h100_sxm", "h200_sxm"]),
    backend=st.sampled_from(["vllm", "sglang", "trtllm"]),
    tp=st.sampled_from([1, 2, 4, 8]),
    ep=st.booleans(),
    isl=st.integers(128, 16384),
    osl=st.integers(16, 4096),
    c=st.integers(1, 256),
)
def test_moe_is_never_more_optimistic_than_its_dense_twin(
    name: str, gpu: str, backend: str, tp: int, ep: bool, isl: int, osl: int, c: int
) -> None:
    m, g = modelcfg.load(name), catalog.gpu(gpu)
    d = dense_twin(m)
    assert d.active_params() <= m.active_params()  # the twin lacks only the router
    lay = Layout(tp=tp, ep=tp if ep and tp > 1 else 1)
    try:
        cap.check_layout(m, lay)
    except ValueError:
        assume(False)
    moe = perf.expected_latency(m, g, lay, c, isl, osl, backend, "fp8")
    assume(moe.running == c)  # both run the same batch (the MoE's larger weights hold fewer)
    dense = perf.expected_latency(d, g, Layout(tp=tp), c, isl, osl, backend, "fp8")
    assert moe.tpot_s >= dense.tpot_s * (1 - 1e-9)
    assert moe.ttft_s >= dense.ttft_s * (1 - 1e-9)


def test_an_expert_with_few_tokens_costs_a_whole_tile() -> None:
    m, g = modelcfg.load("qwen3-30b-a3b"), catalog.gpu("h200_sxm")
    s = perf.Setup(m, g, Layout(tp=8, ep=8, attention_dp=True), "fp8", "sglang")
    # 64 tokens × top-8 = 512 pairs spread over EP8: 64 pairs on each rank; of its 16 experts
    # 16 × (1 − (120/128)^64) = 15.74 are reached, 64 / 15.74 = 4.07 pairs each
    assert perf.expert_gemm_efficiency(s, 64) == pytest.approx(64 / (16 * (1 - (120 / 128) ** 64)) / 64)
    # 1,024 tokens: every expert reached, 64 each fill the tile exactly
    assert perf.expert_gemm_efficiency(s, 1024) == pytest.approx(1.0)
    # one token touches 8 experts (on one rank at most 8 of its 16): one row of a 64-row tile
    assert perf.expert_gemm_efficiency(s, 1) == pytest.approx(1 / 64)
    dense = perf.Setup(modelcfg.load("qwen3-32b"), g, Layout(tp=8), "fp8", "sglang")
    assert perf.expert_gemm_efficiency(dense, 7) == 1.0


@pytest.mark.parametrize(("tokens", "want"), [(1, 8.0), (16, 128 * (1 - (15 / 16) ** 16)), (256, 128.0)])
def test_decode_reads_the_union_of_the_experts_its_tokens_reach(tokens: int, want: float) -> None:
    # Qwen3-30B-A3B: 128 experts, top-8, on one GPU. One token reaches its 8 experts; 16 tokens
    # reach 128 × (1 − (15/16)^16) = 82.3 distinct ones (not 16 × 8 = 128: they share); 256
    # tokens reach all but 128 × (15/16)^256 ≈ 10⁻⁵ of them.
    m, g = modelcfg.load("qwen3-30b-a3b"), catalog.gpu("h200_sxm")
    s = perf.Setup(m, g, Layout(tp=1), "fp8", "vllm")
    assert perf.touched_experts(s, tokens) == pytest.approx(want, rel=1e-4)
    expert_bytes = m.expert_params() * 1  # FP8: one byte per parameter
    full = cap.weights_per_gpu(m, "fp8", s.layout)
    unread = m.moe_layers * (128 - want) * expert_bytes
    assert perf.touched_weight_bytes(s, tokens) == pytest.approx(full - unread, rel=1e-4)
    # EP4: each GPU holds 32 experts and sees every token of the replica
    ep = dataclasses.replace(s, layout=Layout(tp=4, ep=4))
    assert perf.touched_experts(ep, tokens) == pytest.approx(want / 4, rel=1e-4)


def test_moe_block_pays_four_short_kernels_per_layer() -> None:
    # 48 MoE layers × 4 extra kernels × 3 µs = 0.576 ms on one stage; a dense model pays none
    m, g = modelcfg.load("qwen3-30b-a3b"), catalog.gpu("h200_sxm")
    s = perf.Setup(m, g, Layout(tp=1), "fp8", "vllm")
    assert perf.moe_kernel_time(s) == pytest.approx(48 * 4 * 3e-6)
    assert perf.step_time(s, 8, 1000, 0.0, 1000)["decode_moe_kernels_s"] == pytest.approx(0.576e-3)
    pp2 = dataclasses.replace(s, layout=Layout(tp=1, pp=2))
    assert perf.moe_kernel_time(pp2) == pytest.approx(24 * 4 * 3e-6)
    dense = perf.Setup(modelcfg.load("qwen3-32b"), g, Layout(tp=1), "fp8", "vllm")
    assert perf.moe_kernel_time(dense) == 0.0


def test_alltoall_bytes_and_crossing_a_node() -> None:
    m, g = modelcfg.load("qwen3-235b-a22b"), catalog.gpu("h200_sxm")
    nvl = catalog.FABRICS["nvlink4"]
    one_node = perf.Setup(m, g, Layout(tp=8, ep=8, attention_dp=True), "fp8", "vllm",
                          perf.Topology(8, catalog.FABRICS["ib_ndr"]))  # fmt: skip
    tokens = 256
    sent = perf.remote_ranks(128, 8, 8) * m.hidden * 2 * tokens / 8  # bytes one rank sends
    want = nvl.latency_s + sent / (nvl.bytes_per_s * 0.7)
    assert perf.alltoall_time(one_node, tokens) == pytest.approx(want)
    two_nodes = dataclasses.replace(one_node, layout=Layout(tp=16, ep=16, attention_dp=True))
    for fabric in ("ib_ndr", "eth_100g"):
        topo = perf.Topology(8, catalog.FABRICS[fabric])
        t16 = perf.alltoall_time(dataclasses.replace(two_nodes, topo=topo), tokens)
        # 7 of the 15 remote ranks are on NVLink; the other 8 over the NIC, which is slower
        remote = perf.remote_ranks(128, 8, 16) * m.hidden * 2 * tokens / 16
        nic = catalog.FABRICS[fabric]
        assert t16 == pytest.approx(nic.latency_s + remote * 8 / 15 / (nic.bytes_per_s * 0.7))
        # the same tokens spread over twice the ranks, half of them behind a NIC: never faster
        # than EP8 inside NVLink at the same per-rank share of tokens
        assert t16 > perf.alltoall_time(one_node, tokens // 2)


@pytest.mark.parametrize(("running", "d"), [(8, 8), (64, 8), (512, 8), (3, 4), (100, 2)])
def test_attention_dp_busiest_rank_share(running: int, d: int) -> None:
    m, g = modelcfg.load("qwen3-30b-a3b"), catalog.gpu("h200_sxm")
    s = perf.Setup(m, g, Layout(tp=d, ep=d, attention_dp=True), "fp8", "sglang")
    share = perf.attention_dp_share(s, running, 4000 + 250, 4000)
    assert 1 / d <= share <= 1.0
    n = math.ceil(running / d)
    sd = 250 / math.sqrt(3)
    assert share == pytest.approx(
        min(1.0, (n * 4250 + math.sqrt(n) * sd * math.sqrt(2 * math.log(d))) / (running * 4250))
    )
    # equal contexts (OSL 0 spread) and one sequence per rank: exactly 1/D
    assert perf.attention_dp_share(s, d, 4000, 4000) == pytest.approx(1 / d)


def test_attention_dp_step_waits_for_the_busiest_rank() -> None:
    m, g = modelcfg.load("qwen3-30b-a3b"), catalog.gpu("h200_sxm")
    s = perf.Setup(m, g, Layout(tp=8, ep=8, attention_dp=True), "fp8", "sglang")
    per_seq = cap.kv_per_gpu_per_sequence(m, 4250, "bf16", s.layout)
    step = perf.step_time(s, 64, 4250, 0.0, 4000)
    # more than the even split (64/8 sequences' KV), because contexts differ
    assert step["kv_read_bytes"] > 8 * per_seq
