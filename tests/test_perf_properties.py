"""The live step and queueing model stays inside physical bounds over a wide grid of shapes.

Grid: every shipped model (dense and MoE), H100/H200, vLLM/SGLang/TRT-LLM, BF16/FP8, TP 1–8,
ISL 128–32K, OSL 16–8K, concurrency 1–512. Bounds are computed here from the model's architecture
and the GPU's datasheet figures, not from the model's own terms:
  1. TTFT ≥ the prompt's GEMM FLOPs over TP × the dense peak (the compute roofline), and ≥ one
     read of the GPU's weight shard at the nominal HBM bandwidth.
  2. TPOT ≥ the weights every decode step must read (all of a dense model's shard; an MoE's
     non-expert weights) plus the running sequences' prompt KV, at the nominal HBM bandwidth.
  3. With free KV, free slots and a lightly loaded prefill (fewer than one prompt per step,
     utilization ≤ 0.2), TTFT ≤ the prompt's prefill time + (its chunks + 1) decode steps, plus
     the M/D/1 wait that light a load allows.
  4. TTFT and TPOT never fall when concurrency rises; TTFT never falls when ISL rises.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from analyzer import capacity as cap
from analyzer import catalog, modelcfg, perf
from analyzer.capacity import Layout

MODELS = modelcfg.shipped()
REL = 1e-6  # rounding noise allowed in the monotonicity comparisons (token counts are rounded)

cases = st.fixed_dictionaries(
    {
        "model": st.sampled_from(MODELS),
        "gpu": st.sampled_from(["h100_sxm", "h200_sxm"]),
        "backend": st.sampled_from(["vllm", "sglang", "trtllm"]),
        "precision": st.sampled_from(["bf16", "fp8"]),
        "tp": st.sampled_from([1, 2, 4, 8]),
        "ep": st.booleans(),
        "isl": st.integers(128, 32768),
        "osl": st.integers(16, 8192),
        "c": st.integers(1, 512),
    }
)
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])


def _setup(case: dict) -> tuple[modelcfg.ModelConfig, catalog.Gpu, Layout]:
    m, g = modelcfg.load(case["model"]), catalog.gpu(case["gpu"])
    lay = Layout(tp=case["tp"], ep=case["tp"] if case["ep"] and m.is_moe and case["tp"] > 1 else 1)
    try:
        cap.check_layout(m, lay)
    except ValueError:
        assume(False)
    kv_p = "fp8" if case["precision"] == "fp8" and case["backend"] == "trtllm" else "bf16"
    c = cap.capacity(m, g, lay, context_tokens=case["isl"] + case["osl"], precision=case["precision"],
                     kv_precision=kv_p)  # fmt: skip
    assume(c.fits)
    return m, g, lay


def _est(case: dict, **change: int) -> perf.Estimate:
    c = {**case, **change}
    m, g, lay = _setup(c)
    return perf.expected_latency(m, g, lay, c["c"], c["isl"], c["osl"], c["backend"], c["precision"])


@SETTINGS
@given(cases)
def test_ttft_is_at_least_the_prefill_roofline(case: dict) -> None:
    m, g, lay = _setup(case)
    est = _est(case)
    peak = g.flops.get(case["precision"], g.flops["bf16"])
    gemm = 2 * (m.active_params() - m.vocab * m.hidden) * case["isl"]
    assert est.ttft_s >= gemm / (lay.tp * peak)
    # at least one full read of the stage's non-expert weights, at datasheet bandwidth
    assert est.ttft_s >= _static_weights(m, case["precision"], lay) / g.hbm_bytes_per_s


def _static_weights(m: modelcfg.ModelConfig, precision: str, lay: Layout) -> float:
    """Weights per GPU that every step reads whatever the routing: all of a dense model's shard;
    an MoE's shard less its routed experts."""
    full = cap.weights_per_gpu(m, precision, lay)
    if not m.is_moe:
        return full
    shard = lay.ep if lay.ep > 1 else lay.tp
    routed = m.moe_layers * m.experts * m.expert_params() / shard * cap.bytes_per_param(precision)
    return full - routed


@SETTINGS
@given(cases)
def test_tpot_is_at_least_the_hbm_time_of_weights_and_kv(case: dict) -> None:
    m, g, lay = _setup(case)
    est = _est(case)
    kv_p = "fp8" if case["precision"] == "fp8" and case["backend"] == "trtllm" else "bf16"
    kv = est.running * cap.kv_per_gpu_per_sequence(m, case["isl"], kv_p, lay)
    assert est.tpot_s >= (_static_weights(m, case["precision"], lay) + kv) / g.hbm_bytes_per_s


@SETTINGS
@given(cases)
def test_with_free_kv_slots_and_light_prefill_ttft_is_prefill_plus_a_few_steps(case: dict) -> None:
    est = _est(case)
    t = est.terms
    assume(est.running == case["c"] and t["queue_wait_s"] == 0.0)  # free KV and free slots
    assume(t["prefill_arrivals_per_step"] < 1 and t["prefill_utilization"] <= 0.2)
    # the engines' 8192-token step budget, less the decodes riding in it on a mixed scheduler
    budget = 8192 - (0 if case["backend"] == "sglang" else case["c"])
    chunks = math.ceil(case["isl"] / budget)
    wait = 0.2 * (t["prefill_s"] + est.tpot_s) / (2 * 0.8)  # M/D/1 at ρ ≤ 0.2
    # each chunk's step also carries the running decodes: one decode step per chunk, plus the
    # wait for the next step boundary
    assert est.ttft_s <= t["prefill_s"] + wait + (chunks + 1) * est.tpot_s


@SETTINGS
@given(cases, st.integers(1, 512))
def test_latency_never_falls_as_concurrency_rises(case: dict, other: int) -> None:
    lo, hi = sorted((case["c"], other))
    a, b = _est(case, c=lo), _est(case, c=hi)
    assert b.ttft_s >= a.ttft_s * (1 - REL)
    assert b.tpot_s >= a.tpot_s * (1 - REL)


@SETTINGS
@given(cases, st.integers(128, 32768))
def test_ttft_never_falls_as_isl_rises(case: dict, other: int) -> None:
    lo, hi = sorted((case["isl"], other))
    _setup({**case, "isl": hi})  # the longer prompt must fit too
    a, b = _est(case, isl=lo), _est(case, isl=hi)
    assert b.ttft_s >= a.ttft_s * (1 - REL)


def test_dense_and_moe_models_are_both_on_the_grid() -> None:
    kinds = {modelcfg.load(n).is_moe for n in MODELS}
    assert kinds == {True, False}
