"""Capacity figures pinned to REFERENCE §5 and the public model configs."""

from __future__ import annotations

import json

import pytest

from analyzer import capacity as cap
from analyzer import catalog, modelcfg
from analyzer.capacity import Layout

H100 = catalog.gpu("NVIDIA H100 80GB HBM3")


def test_llama3_70b_kv_bytes_per_token_bf16_and_fp8() -> None:
    m = modelcfg.load("Llama-3-70B")
    assert cap.kv_bytes_per_token(m, "bf16") == 327_680
    assert cap.kv_bytes_per_token(m, "fp8") == 160 * 1024
    assert cap.kv_bytes_per_sequence(m, 8192) / 1e9 == pytest.approx(2.68, abs=0.005)
    assert cap.kv_bytes_per_sequence(m, 131072) / 1e9 == pytest.approx(43.0, abs=0.1)


def test_llama_70b_bf16_does_not_fit_one_h100_but_tp4_does() -> None:
    m = modelcfg.load("meta-llama/Llama-3.1-70B-Instruct")
    assert cap.weight_bytes(m, "bf16") / 1e9 == pytest.approx(141.1, abs=0.1)
    assert not cap.capacity(m, H100, Layout(tp=1), context_tokens=8192).fits
    assert not cap.capacity(m, H100, Layout(tp=2), context_tokens=8192).fits
    tp4 = cap.capacity(m, H100, Layout(tp=4), context_tokens=8192)
    assert tp4.fits
    # 72 GB usable - 35.3 GB weights - 2.0 GB activations over 0.671 GB per 8K sequence.
    assert tp4.kv_per_sequence_bytes == pytest.approx(327_680 * 8192 / 4)
    assert tp4.max_sequences == 51


def test_kv_split_stops_at_kv_heads_and_pp_takes_stage_layers() -> None:
    m = modelcfg.load("llama-3.1-70b")  # 8 KV heads
    one = cap.kv_per_gpu_per_sequence(m, 1000, "bf16", Layout())
    assert cap.kv_per_gpu_per_sequence(m, 1000, "bf16", Layout(tp=8)) == pytest.approx(one / 8)
    assert cap.kv_per_gpu_per_sequence(m, 1000, "bf16", Layout(tp=16)) == pytest.approx(one / 8)
    assert cap.kv_per_gpu_per_sequence(m, 1000, "bf16", Layout(tp=4, pp=2)) == pytest.approx(one / 8)
    q = modelcfg.load("qwen3-235b-a22b")  # 4 KV heads: TP8 replicates each head twice
    q1 = cap.kv_per_gpu_per_sequence(q, 1000, "bf16", Layout())
    assert cap.kv_per_gpu_per_sequence(q, 1000, "bf16", Layout(tp=8)) == pytest.approx(q1 / 4)


def test_mla_latent_kv_is_replicated_under_tp() -> None:
    m = modelcfg.load("deepseek-ai/DeepSeek-V3")
    assert cap.kv_bytes_per_token(m) == 61 * (512 + 64) * 2 == 70_272
    one = cap.kv_per_gpu_per_sequence(m, 1000, "bf16", Layout())
    assert cap.kv_per_gpu_per_sequence(m, 1000, "bf16", Layout(tp=8)) == one


def test_sliding_window_layers_cap_kv() -> None:
    m = modelcfg.load("gpt-oss-120b")  # 18 full + 18 sliding(128) layers, 8 KV heads × 64
    per_layer = 2 * 8 * 64 * 2
    assert cap.kv_bytes_per_sequence(m, 8192) == 18 * per_layer * 8192 + 18 * per_layer * 128


@pytest.mark.parametrize(
    ("name", "billions"),
    [
        ("llama-3.1-8b", 8.03),
        ("llama-3.1-70b", 70.55),
        ("llama-3.1-405b", 405.85),
        ("qwen3-8b", 8.19),
        ("qwen3-32b", 32.76),
        ("qwen3-30b-a3b", 30.53),
        ("qwen3-235b-a22b", 235.09),
        ("deepseek-v3", 671.03),
        ("mixtral-8x7b", 46.70),
        ("gpt-oss-120b", 116.79),
    ],
)
def test_parameter_counts_match_published_sizes(name: str, billions: float) -> None:
    assert modelcfg.load(name).params() / 1e9 == pytest.approx(billions, abs=0.01)


def test_moe_active_parameters() -> None:
    assert modelcfg.load("qwen3-30b-a3b").active_params() / 1e9 == pytest.approx(3.0, abs=0.1)
    assert modelcfg.load("deepseek-v3").active_params() / 1e9 == pytest.approx(37.0, abs=0.5)


def test_ep_shards_experts_and_attention_dp_multiplies_sequences() -> None:
    m = modelcfg.load("qwen3-235b-a22b")
    tp8 = cap.weights_per_gpu(m, "fp8", Layout(tp=8))
    ep8 = cap.weights_per_gpu(m, "fp8", Layout(tp=8, ep=8))
    assert ep8 == pytest.approx(tp8)  # same expert bytes, sharded by whole experts instead
    h200 = catalog.gpu("h200")
    plain = cap.capacity(m, h200, Layout(tp=8, ep=8), context_tokens=4096, precision="fp8")
    adp = cap.capacity(m, h200, Layout(tp=8, ep=8, attention_dp=True), context_tokens=4096, precision="fp8")
    assert adp.max_sequences > plain.max_sequences


def test_context_mix_concurrency_between_its_extremes() -> None:
    m = modelcfg.load("llama-3.1-8b")
    short = cap.capacity(m, H100, Layout(), context_tokens=1000).max_sequences
    long = cap.capacity(m, H100, Layout(), context_tokens=8000).max_sequences
    mixed = cap.max_concurrency_mix(m, H100, Layout(), [(1000, 0.5), (8000, 0.5)])
    assert long < mixed < short
    with pytest.raises(ValueError, match="positive shares"):
        cap.max_concurrency_mix(m, H100, Layout(), [])


def test_user_config_json_path_and_errors(tmp_path) -> None:
    good = tmp_path / "my-model" / "config.json"
    good.parent.mkdir()
    cfg = json.loads((modelcfg.MODELS_DIR / "llama-3.1-8b.json").read_text())
    good.write_text(json.dumps(cfg))
    assert modelcfg.load(str(good)).name == "my-model"
    assert modelcfg.load(str(good)).params() == modelcfg.load("llama-3.1-8b").params()
    del cfg["hidden_size"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(cfg))
    with pytest.raises(modelcfg.ModelConfigError, match=r"bad\.json: missing field 'hidden_size'"):
        modelcfg.load(str(bad))
    with pytest.raises(modelcfg.ModelConfigError, match="unknown model 'gpt-9'"):
        modelcfg.load("gpt-9")
