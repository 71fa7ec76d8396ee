"""`ioe estimate` / `ioe plan` on the command line: strict JSON, capacity figures, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from ioe.cli import app


def _strict(text: str) -> Any:
    """Parse ``text`` as strict JSON: NaN / Infinity are refused, not read as floats."""

    def refuse(name: str) -> None:
        raise AssertionError(f"non-strict JSON constant {name} in output")

    return json.loads(text, parse_constant=refuse)


def _refused(args: list[str]) -> str:
    """Run ``args``; assert exit 2 and exactly one line on stderr; return that line."""
    got = CliRunner().invoke(app, args)
    assert got.exit_code == 2, got.output
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1, got.stderr
    return lines[0]


def test_70b_bf16_on_one_h100_does_not_fit_exit_2_and_strict_json() -> None:
    args = ["estimate", "--model", "llama-3.1-70b", "--gpu", "h100", "--json"]
    line = _refused(args)
    assert line.startswith("estimate: llama-3.1-70b bf16 does not fit TP1·PP1·DP1 on h100_sxm: ")
    assert "weights 141.1 GB" in line and "72.0 GB usable" in line
    doc = _strict(CliRunner().invoke(app, args).stdout)
    assert doc["fits"] is False and doc["capacity"]["fits"] is False
    assert doc["ttft_ms"] is None and doc["tpot_ms"] is None
    assert doc["reason"] == doc["capacity"]["reason"] and "exceed" in doc["reason"]
    assert doc["capacity"]["max_sequences"] == 0


def test_fitting_layout_carries_the_capacity_figures() -> None:
    got = CliRunner().invoke(
        app, ["estimate", "--model", "llama-3.1-70b", "--gpu", "h100_sxm", "--tp", "4", "--batch", "8",
              "--isl", "1024", "--osl", "1024", "--json"],
    )  # fmt: skip
    assert got.exit_code == 0, got.output
    doc = _strict(got.stdout)
    c = doc["capacity"]
    # Llama-3.1-70B: 80 layers × 2 (K, V) × 8 KV heads × 128 × 2 B = 327,680 B per token; TP4 splits
    # the 8 KV heads over 4 GPUs.
    assert c["kv_bytes_per_token"] == 327_680
    assert c["kv_bytes_per_token_per_gpu"] == 327_680 / 4
    assert c["sequence_tokens"] == 2048 and c["kv_bytes_per_sequence"] == 2048 * 327_680
    assert c["kv_bytes_per_sequence_per_gpu"] == 2048 * 327_680 / 4
    assert c["max_sequences"] == int(c["kv_budget_bytes_per_gpu"] // c["kv_bytes_per_sequence_per_gpu"])
    assert 30e9 < c["weights_bytes_per_gpu"] < 40e9  # 141 GB / 4 plus the vocab-parallel embeddings
    assert doc["fits"] is True and c["reason"] is None and doc["reason"] is None
    assert doc["ttft_ms"] > 0 and doc["tpot_ms"] > 0


def test_unknown_gpu_is_an_error_listing_the_known_ones() -> None:
    line = _refused(["estimate", "--model", "llama-3.1-8b", "--gpu", "h1000"])
    assert line == (
        "estimate refused: unknown GPU 'h1000'; known: a100_sxm, b200_sxm, gb200, h100_pcie, h100_sxm, "
        "h200_sxm, mi300x"
    )


def test_unknown_model_is_an_error_listing_the_shipped_ones() -> None:
    line = _refused(["estimate", "--model", "llama-9b", "--gpu", "h100"])
    assert line.startswith("estimate refused: unknown model 'llama-9b'; shipped: deepseek-v3, ")
    assert "llama-3.1-70b" in line and "qwen3-30b-a3b" in line


def test_tp_that_does_not_divide_the_heads_is_an_error() -> None:
    line = _refused(["estimate", "--model", "llama-3.1-70b", "--gpu", "h100", "--tp", "3"])
    assert line == "estimate refused: TP3 does not divide llama-3.1-70b's 64 attention heads"


def test_tp_that_does_not_divide_the_kv_heads_is_an_error(tmp_path: Path) -> None:
    cfg = {"hidden_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 12, "num_key_value_heads": 3,
           "intermediate_size": 4096, "vocab_size": 32000}  # fmt: skip
    path = tmp_path / "tiny" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    line = _refused(["estimate", "--model", str(path), "--gpu", "h100", "--tp", "2"])
    assert line == "estimate refused: TP2 does not divide tiny's 3 KV heads (nor is it a multiple of them)"


def test_ep_on_a_dense_model_is_an_error() -> None:
    line = _refused(["estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--tp", "2", "--ep", "2"])
    assert line == "estimate refused: EP2 needs an MoE model; llama-3.1-8b is dense"


def test_unknown_backend_and_precision_are_errors() -> None:
    line = _refused(["estimate", "--model", "llama-3.1-8b", "--backend", "tgi"])
    assert line == "estimate refused: unknown backend 'tgi'; known: sglang, trtllm, vllm"
    line = _refused(["estimate", "--model", "llama-3.1-8b", "--precision", "int3"])
    assert line.startswith("estimate refused: unknown precision 'int3'; known: bf16")


def test_plan_says_in_words_why_a_row_is_infeasible() -> None:
    got = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-70b", "--gpu", "h100", "--gpus", "8",
                                   "--top", "20"])  # fmt: skip
    assert got.exit_code == 0, got.output
    rows = [ln for ln in got.stdout.splitlines() if ln[:1].isdigit()]
    assert rows and not any("None ms" in ln or " 0.0 tok/s" in ln for ln in rows)
    tp1 = next(ln for ln in rows if ln.split(". ", 1)[1].startswith("TP1·PP1·DP8"))
    assert "infeasible: does not fit: weights 141.1 GB" in tp1
    doc = _strict(CliRunner().invoke(app, ["plan", "--model", "llama-3.1-70b", "--gpu", "h100", "--gpus", "8",
                                           "--top", "20", "--json"]).stdout)  # fmt: skip
    bad = [c for c in doc["candidates"] if not c["feasible"]]
    assert bad and all(c["why_infeasible"] for c in bad)
    assert all(c["why_infeasible"] is None for c in doc["candidates"] if c["feasible"])


def test_plan_slo_miss_names_the_latency_over_its_slo() -> None:
    got = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--gpu", "h100", "--gpus", "1",
                                   "--tpot-slo", "0.001", "--json"])  # fmt: skip
    assert got.exit_code == 0, got.output
    (only,) = [c for c in _strict(got.stdout)["candidates"] if c["layout"] == "TP1·PP1·DP1"]
    assert only["why_infeasible"].startswith("misses the SLOs even with one request per replica: TPOT ")
    assert "> SLO 1.0 ms" in only["why_infeasible"]


def test_plan_unknown_gpu_is_an_error() -> None:
    line = _refused(["plan", "--model", "llama-3.1-8b", "--gpu", "h1000", "--gpus", "8"])
    assert line.startswith("plan refused: unknown GPU 'h1000'; known: a100_sxm")
