"""Step-time model: rooflines, link choice, and agreement with measured rows."""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import replace

import pytest

from analyzer import capacity as cap
from analyzer import catalog, modelcfg, perf
from analyzer.capacity import Layout, capacity
from ioe.commands.estimate import annotate, annotate_csv
from tests.conftest import DATA

H100 = catalog.gpu("h100_sxm")
CSV = DATA / "silicon" / "dense_calibration.csv"


def test_decode_is_hbm_bound_at_small_batch_with_weights_over_bandwidth() -> None:
    m = modelcfg.load("llama-3.1-8b")
    s = perf.Setup(m, H100, Layout(), "bf16", "vllm")
    t = perf.decode_step(s, 1, 1024)
    assert t["weights_read_bytes"] == pytest.approx(16.06e9, rel=1e-3)
    # 16.06 GB / (3.35 TB/s × hbm_eff 0.9) = 5.33 ms, plus the 3 ms vLLM step overhead.
    eff = perf.EFFICIENCY["vllm"]
    assert t["decode_hbm_s"] == pytest.approx(16.06e9 / (3.35e12 * eff.hbm_eff), rel=1e-2)
    assert t["decode_hbm_s"] > t["decode_compute_s"]
    assert t["decode_step_s"] == pytest.approx(t["decode_hbm_s"] + eff.step_overhead_s, rel=1e-2)


def test_tp_allreduce_crosses_nvlink_inside_node_and_fabric_beyond() -> None:
    m = modelcfg.load("llama-3.1-70b")
    inside = perf.Setup(m, H100, Layout(tp=8), "bf16", "vllm")
    across = perf.Setup(m, H100, Layout(tp=16), "bf16", "vllm")
    a = perf.comm_time(inside, 64)["tp_allreduce_s"]
    b = perf.comm_time(across, 64)["tp_allreduce_s"]
    # 160 all-reduces: NVLink 12 µs latency vs IB NDR 25 µs latency and 9× less bandwidth.
    assert a == pytest.approx(160 * (12e-6 + 2 * 7 / 8 * 64 * 8192 * 2 / (450e9 * 0.7)), rel=1e-6)
    assert b > 2 * a


def test_pp_boundary_carries_hidden_times_two_bytes_per_token() -> None:
    m = modelcfg.load("llama-3.1-70b")
    s = perf.Setup(m, H100, Layout(tp=8, pp=2), "bf16", "vllm")
    # 16 KiB per token (REFERENCE §5); TP8·PP2 spans two nodes so the boundary is IB NDR.
    assert perf.comm_time(s, 1)["pp_send_s"] == pytest.approx(25e-6 + 16384 / (50e9 * 0.7))


def test_moe_decode_reads_only_routed_experts_and_ep_adds_alltoall() -> None:
    m = modelcfg.load("qwen3-30b-a3b")
    s = perf.Setup(m, H100, Layout(tp=1), "bf16", "vllm")
    assert perf.touched_weight_bytes(s, 1) < 0.2 * perf.touched_weight_bytes(s, 64)
    ep = perf.Setup(m, H100, Layout(tp=4, ep=4), "bf16", "vllm")
    assert perf.comm_time(ep, 32)["ep_alltoall_s"] > 0


def test_70b_on_one_h100_does_not_fit() -> None:
    e = perf.expected_latency(modelcfg.load("llama-3.1-70b"), H100, Layout(), 8, 1024, 128)
    assert e.wall == "kv_capacity" and e.tpot_s == float("inf")


def test_estimate_row_tracks_measured_tpot_on_h100_trtllm() -> None:
    with CSV.open() as fh:
        rows = [r for r in csv.DictReader(fh) if r["system"] == "h100_sxm" and r["backend"] == "trtllm"]
    errors = sorted(
        abs(float(a["predicted_tpot_ms"]) / float(a["silicon_tpot_ms"]) - 1) for a in map(annotate, rows)
    )
    assert len(errors) == 357
    assert errors[len(errors) // 2] < 0.10  # median within 10 % (7.4 % when written)


def test_bad_rows_are_kept_with_the_reason() -> None:
    rows = annotate_csv(CSV)
    assert len(rows) == 630 and all(r["estimate_error"] == "" for r in rows)
    bad = annotate({"model_path": "meta-llama/Llama-3.1-8B", "system": "h100_sxm", "isl": "x", "osl": "1"})
    assert bad["estimate_error"] == "column 'isl' is not a number (got 'x')"
    assert bad["predicted_tpot_ms"] == ""


def _group_medians(system: str, backend: str) -> tuple[float, float]:
    """Median |error| of the group's rows seen through their benchmark's closed-loop harness."""
    from bench.closed_loop import harness_row, read

    rows = [r for r in read(CSV) if r["system"] == system and r["backend"] == backend]
    pairs = [(harness_row(r), r) for r in rows]
    tpot = sorted(abs(e.tpot_s * 1e3 / float(r["silicon_tpot_ms"]) - 1) for e, r in pairs)
    ttft = sorted(abs(e.ttft_s * 1e3 / float(r["silicon_ttft_ms"]) - 1) for e, r in pairs)
    return tpot[len(tpot) // 2], ttft[len(ttft) // 2]


def test_sglang_prefill_first_waves_match_measured_h100_rows() -> None:
    tpot, ttft = _group_medians("h100_sxm", "sglang")
    assert tpot < 0.10 and ttft < 0.20  # 6.2 % and 9.0 % when written


def test_wave_ttft_grows_with_the_prompts_queued_ahead() -> None:
    # Qwen3-32B BF16 TP4 on H100, SGLang, 1024/128: measured TTFT 493 ms at C=16, 2485 ms at C=128.
    m = modelcfg.load("qwen3-32b")
    s = perf.Setup(m, H100, Layout(tp=4), "bf16", "sglang")
    small, _ = perf.wave_latency(s, 16, 1024, 128)
    big, _ = perf.wave_latency(s, 128, 1024, 128)
    assert 0.35 < small < 0.65 and 1.9 < big < 3.1
    # Two 8192-token chunks: half the wave waits one chunk, half two → mean 1.5 chunks.
    chunk = perf.step_time(s, 0, 1024, 8192, 1024)["decode_step_s"]
    assert small == pytest.approx(1.5 * chunk, rel=1e-9)


def test_mixed_step_reads_weights_once_for_decode_and_prefill_tokens() -> None:
    m = modelcfg.load("llama-3.1-8b")
    s = perf.Setup(m, H100, Layout(), "bf16", "vllm")
    alone = perf.step_time(s, 64, 1024, 0.0, 1024)
    mixed = perf.step_time(s, 64, 1024, 2048.0, 1024)
    assert mixed["weights_read_bytes"] == alone["weights_read_bytes"]
    # Prompt tokens skip the LM head: 2 × 6.98 B params × 2048 tokens, plus causal attention over
    # half the 1024-token prompt, at 989 TFLOP/s × mfu (0.55: ≈ 53.6 ms).
    rate = 989e12 * perf.EFFICIENCY["vllm"].mfu
    gemm = 2 * (m.active_params() - m.vocab * m.hidden) * 2048
    attn = 4 * m.layers * 2048 * 512 * m.heads * m.head_dim
    extra = mixed["decode_compute_s"] - alone["decode_compute_s"]
    assert extra == pytest.approx((gemm + attn) / rate, rel=1e-9)
    assert 0.040 < extra < 0.056  # mfu 0.55-0.7


def test_steady_mixed_tpot_is_the_mean_of_carrying_and_pure_decode_steps() -> None:
    # A mixed engine takes an arriving prompt whole into one decode step: at C = 8, OSL 128 a share
    # 8/128 of the steps carries a 1024-token prompt and the rest are pure decode steps. TPOT is
    # their mean, not one step with 64 prompt tokens spread in (which hides them under HBM time).
    m = modelcfg.load("llama-3.1-8b")
    s = perf.Setup(m, H100, Layout(), "bf16", "trtllm")
    ttft, tpot, terms = perf.steady_latency(s, 8, 1024, 128)
    ctx = 1024 + 64
    carrying = perf.step_time(s, 8, ctx, 1024, 1024)["decode_step_s"]
    pure = perf.step_time(s, 8, ctx, 0.0, 1024)["decode_step_s"]
    assert terms["prefill_step_share"] == pytest.approx(8 / 128)
    assert tpot == pytest.approx(8 / 128 * carrying + (1 - 8 / 128) * pure, rel=1e-12)
    spread = perf.step_time(s, 8, ctx, 64.0, 1024)
    assert spread["decode_hbm_s"] > spread["decode_compute_s"]  # the spread tokens hide under HBM
    assert tpot > 1.1 * spread["decode_step_s"]
    assert ttft == pytest.approx(tpot / 2 + terms["prefill_queue_s"] + carrying)
    # light load: 1024 prompt tokens per 16 steps against an 8184-token budget, ρ < 0.01
    assert terms["prefill_utilization"] == pytest.approx(8 / 128 * 1024 / (8192 - 8))
    assert terms["prefill_queue_s"] < 0.01 * carrying
    # once every step carries prompt tokens the share is 1 and the steps hold arrivals × ISL
    _, busy, busy_terms = perf.steady_latency(s, 256, 4096, 128)
    assert busy_terms["prefill_step_share"] == 1.0
    budget = s.eff.chunk_tokens - 256
    assert busy == pytest.approx(perf.step_time(s, 256, 4096 + 64, budget, 4096)["decode_step_s"])


def test_attention_runs_at_the_kv_precision_not_at_fp4() -> None:
    m = modelcfg.load("qwen3-32b")
    b200 = catalog.gpu("b200_sxm")
    fp4 = perf.Setup(m, b200, Layout(), "fp4", "trtllm")
    fp8 = perf.Setup(m, b200, Layout(), "fp8", "trtllm")
    e = fp4.eff
    # One 8000-token prompt: GEMMs at the FP4/FP8 peak, attention at the FP8 KV cache's peak in both.
    attn = 4 * m.layers * 8000 * 4000 * m.heads * m.head_dim / (4500e12 * e.mfu_at("fp8"))
    gemm = 2 * (m.active_params() - m.vocab * m.hidden) * 8000
    assert perf.compute_time(fp4, 8000, 8000, True) == pytest.approx(
        gemm / (9000e12 * e.mfu_at("fp4")) + attn
    )
    assert perf.compute_time(fp8, 8000, 8000, True) == pytest.approx(
        gemm / (4500e12 * e.mfu_at("fp8")) + attn
    )


def test_prefix_cache_hits_are_not_recomputed() -> None:
    m = modelcfg.load("llama-3.1-8b")
    cold = perf.Setup(m, H100, Layout(), "bf16", "vllm")
    warm = perf.Setup(m, H100, Layout(), "bf16", "vllm", efficiency=replace(cold.eff, prefix_hit=0.5))
    assert warm.eff.fresh(4000) == 2000
    # Half the prompt is computed, and its tokens attend to 3/4 of the prompt on average.
    attn = 4 * m.layers * 2000 * 3000 * m.heads * m.head_dim
    gemm = 2 * (m.active_params() - m.vocab * m.hidden) * 2000
    rate = 989e12 * warm.eff.mfu
    assert perf.prefill_time(warm, 4000, 4000)["prefill_s"] == pytest.approx((gemm + attn) / rate)
    assert (
        perf.prefill_time(warm, 4000, 4000)["prefill_s"]
        < 0.55 * perf.prefill_time(cold, 4000, 4000)["prefill_s"]
    )


def test_efficiency_rows_resolve_platform_first_then_backend() -> None:
    h200_vllm = perf.PLATFORM_EFFICIENCY[("vllm", "h200_sxm")]
    assert perf.efficiency("vllm", "h200_sxm") is h200_vllm
    assert perf.efficiency("vllm", "h100_sxm") is perf.EFFICIENCY["vllm"]
    assert perf.efficiency("trtllm", "gb200") is perf.EFFICIENCY["trtllm"]
    with pytest.raises(KeyError, match="unknown backend 'tgi'"):
        perf.efficiency("tgi", "h100_sxm")
    # no tabled row carries a workload's prefix-cache hits, and the live model's factors have no
    # field for a benchmark harness at all (bench/closed_loop.py holds those)
    for eff in [*perf.EFFICIENCY.values(), *perf.PLATFORM_EFFICIENCY.values()]:
        assert eff.prefix_hit == 0.0
    fields = {f.name for f in dataclasses.fields(perf.Efficiency)}
    assert not fields & {"burst_share", "slot_wait"}


def test_disaggregated_decode_carries_no_prefill_and_the_prefill_pool_queues() -> None:
    m = modelcfg.load("qwen3-32b")
    b200 = catalog.gpu("b200_sxm")
    pre, dec = Layout(tp=1), Layout(tp=4)
    alone = perf.disaggregated_latency(m, b200, pre, dec, 1, 80, 15000, 500, "trtllm", "fp4")
    s = perf.Setup(m, b200, dec, "fp4", "trtllm")
    assert alone.tpot_s == pytest.approx(perf.decode_step(s, 80, 15250)["decode_step_s"])
    assert alone.terms["prefill_queue_s"] == 0.0
    # 480 clients over 6 decode workers (80 each) and 40 prefill workers: the M/D/1 wait is the
    # fixed point of ρ = λS/40 with λ = 480 / (TTFT + 499 × TPOT).
    busy = perf.disaggregated_latency(m, b200, pre, dec, 1, 80, 15000, 500, "trtllm", "fp4", None, 40, 6, 480)
    service = busy.terms["prefill_s"]
    rho = 480 / (busy.ttft_s + 499 * busy.tpot_s) * service / 40
    assert busy.terms["prefill_queue_s"] == pytest.approx(rho * service / (2 * (1 - rho)), rel=1e-6)
    assert busy.ttft_s > alone.ttft_s and busy.tpot_s == alone.tpot_s
    fewer = perf.disaggregated_latency(
        m, b200, pre, dec, 1, 80, 15000, 500, "trtllm", "fp4", None, 20, 6, 480
    )
    assert fewer.terms["prefill_queue_s"] > busy.terms["prefill_queue_s"]


def test_concurrency_comes_from_the_row_or_its_data_source() -> None:
    from ioe.commands.estimate import row_concurrency

    assert row_concurrency({"concurrency": "64"}) == 64
    source = "source_file=x; silicon_concurrency=480; measured=y"
    assert row_concurrency({"silicon_data_source": source}) == 480
    assert row_concurrency({"silicon_data_source": "source_file=x"}) == 0


def test_no_closed_loop_slot_term_in_the_live_model() -> None:
    # The example: Llama-3.1-70B BF16 TP4 on H100, a 1K prompt at C = 8, measured TTFT
    # ~100 ms; the previous model's closed-loop slot term (OSL × TPOT / C) predicted ~760 ms. With
    # free KV and slots the live TTFT is the prompt's prefill plus about one step, whatever the OSL.
    m = modelcfg.load("llama-3.1-70b")
    short = perf.expected_latency(m, H100, Layout(tp=4), 8, 1024, 1024, "trtllm")
    long = perf.expected_latency(m, H100, Layout(tp=4), 8, 1024, 8192, "trtllm")
    for est in (short, long):
        assert est.terms["queue_wait_s"] == 0.0
        assert est.ttft_s < est.terms["prefill_s"] + 2 * est.tpot_s
        assert 0.04 < est.ttft_s < 0.15
    assert long.ttft_s < 1.1 * short.ttft_s  # OSL does not stretch TTFT when the slots are free


def test_admission_on_demand_holds_more_sequences_than_reserving_isl_plus_osl() -> None:
    # vLLM / SGLang allocate KV blocks as tokens are written: a running sequence holds on average
    # ISL + OSL/2; TRT-LLM's GUARANTEED_NO_EVICT reserves ISL + OSL at admission.
    m = modelcfg.load("llama-3.1-8b")
    isl, osl = 1024, 8192
    c = capacity(m, H100, Layout(), context_tokens=isl + osl)
    vllm = perf.Setup(m, H100, Layout(), "bf16", "vllm")
    trt = perf.Setup(m, H100, Layout(), "bf16", "trtllm")
    mean = cap.kv_per_gpu_per_sequence(m, isl + osl // 2, "bf16", Layout())
    assert perf.admitted(vllm, isl, osl) == int(c.kv_budget_bytes // mean)
    assert perf.admitted(trt, isl, osl) == c.max_sequences
    assert perf.admitted(vllm, isl, osl) > 1.7 * c.max_sequences  # (1024 + 8192) / (1024 + 4096)
    many = (c.max_sequences + perf.admitted(vllm, isl, osl)) // 2  # 44 reserved, 80 on demand
    assert perf.expected_latency(m, H100, Layout(), many, isl, osl, "vllm").terms["queue_wait_s"] == 0.0
    assert perf.expected_latency(m, H100, Layout(), many, isl, osl, "trtllm").terms["queue_wait_s"] > 0.0


def test_short_prompt_prefill_reads_the_weights_at_least_once() -> None:
    # A 16-token prompt on Llama-3.1-70B TP4 multiplies ~2.2 TFLOP (well under a millisecond at
    # the H100's peak) but must stream the 35 GB weight shard: HBM-bound.
    m = modelcfg.load("llama-3.1-70b")
    s = perf.Setup(m, H100, Layout(tp=4), "bf16", "vllm")
    t = perf.prefill_time(s, 16, 16)
    assert t["prefill_hbm_s"] > 5 * t["prefill_compute_s"]
    assert t["prefill_s"] >= cap.weights_per_gpu(m, "bf16", Layout(tp=4)) / 3.35e12


def test_a_riding_prompt_does_not_hide_the_decodes_kv_read() -> None:
    # Llama-3.1-8B BF16 on one H100, 64 decodes at 4,000 tokens of context with 4,096 prompt
    # tokens riding in the step. The prompt's GEMMs are compute-bound (4,096 tokens ≫ the
    # ~300 FLOP/B ridge) and the decodes' attention reads their KV; the two are different
    # kernels run one after the other, so the step's kernels take at least the KV read at the
    # HBM rate plus the prompt's GEMM FLOPs at the compute rate (not the larger of the totals).
    m = modelcfg.load("llama-3.1-8b")
    s = perf.Setup(m, H100, Layout(), "bf16", "vllm")
    e = s.eff
    t = perf.step_time(s, 64, 4000, 4096.0, 4096)
    kv_s = 64 * 4000 * 131072 / (H100.hbm_bytes_per_s * e.hbm_eff)  # 128 KiB per token (32 × 8 × 128 × 2 × 2)
    gemm_s = 2 * (m.active_params() - m.vocab * m.hidden) * 4096 / (H100.peak_flops("bf16") * e.mfu)
    assert t["decode_kernels_s"] >= (kv_s + gemm_s) * (1 - 1e-9)
    assert t["decode_kernels_s"] > max(t["decode_hbm_s"], t["decode_compute_s"])
