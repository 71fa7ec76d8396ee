"""`ioe plan --deployment`: the deployment's nodes, fabric, engine and precision, and a correction
fitted from its measured latency that moves the ranking and is shown as evidence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

from collector.records import frame
from collector.store import Store
from ioe.cli import app

N = 40


def _store(path: Path, itl_s: float, ttft_s: float) -> Path:
    """A running Llama-3.1-70B FP8 deployment, TP2 × DP4 over two nodes on 100 GbE, vLLM, with
    ``N`` request spans of 2,000 prompt and 400 output tokens at the given latencies."""
    with Store(path) as st:
        st.write("deployments", frame("deployments", [{
            "name": "chat", "model": "meta-llama/Llama-3.1-70B-Instruct-FP8",
            "gpu_type": "NVIDIA H100 80GB HBM3", "tp": 2, "pp": 1, "dp": 4, "ep": 1,
            "nodes": json.dumps(["node-a", "node-b"]),
            "fabric": "100GbE", "engine": "vllm"}]))  # fmt: skip
        st.write("request_spans", frame("request_spans", {
            "trace_id": [f"t{i}" for i in range(N)], "span_id": ["s"] * N,
            "model": ["meta-llama/Llama-3.1-70B-Instruct-FP8"] * N,
            "start_ns": [i * 500_000_000 for i in range(N)], "input_tokens": [2000] * N,
            "output_tokens": [400] * N, "ttft_s": [ttft_s] * N, "decode_s": [itl_s * 399] * N}))  # fmt: skip
        st.write("engine_samples", frame("engine_samples", pl.DataFrame({
            "ts_ns": [1, 2], "model": ["meta-llama/Llama-3.1-70B-Instruct-FP8"] * 2,
            "concept": ["requests_running"] * 2, "value": [8.0, 8.0]}).to_dicts()))  # fmt: skip
    return path


def _plan(path: Path, *extra: str) -> dict[str, Any]:
    args = ["plan", "--deployment", "chat", "--store", str(path), "--json", "--top", "40"]
    args += ["--tpot-slo", "0.08"]
    got = CliRunner().invoke(app, [*args, *extra])
    assert got.exit_code == 0, got.output
    return json.loads(got.stdout)


def test_plan_keeps_the_deployments_nodes_fabric_engine_and_precision(tmp_path: Path) -> None:
    doc = _plan(_store(tmp_path / "s.duckdb", itl_s=0.02, ttft_s=0.3))
    assert (doc["nodes"], doc["fabric"], doc["precision"], doc["backend"]) == (2, "eth_100g", "fp8", "vllm")
    assert doc["gpus"] == 8
    # the running FP8 TP2 layout fits (35 GB of weights per GPU), so it is not called infeasible
    assert doc["baseline"]["feasible"] and doc["baseline"]["goodput_tok_s_per_gpu"] > 0
    # 8 GPUs over two nodes: TP8 would cross 100 GbE, and says so
    tp8 = next(c for c in doc["candidates"] if c["layout"] == "TP8·PP1·DP1")
    assert any("crosses nodes over eth_100g" in r for r in tp8["reasons"])


def test_measured_itl_far_above_the_model_changes_the_ranking_and_is_shown(tmp_path: Path) -> None:
    near = _plan(_store(tmp_path / "near.duckdb", itl_s=0.02, ttft_s=0.3))
    slow = _plan(_store(tmp_path / "slow.duckdb", itl_s=0.1, ttft_s=0.3))
    f_near, f_slow = near["correction"]["tpot_factor"], slow["correction"]["tpot_factor"]
    assert f_slow == pytest.approx(f_near * 5)  # measured ITL / the model's: 0.1 s against 0.02 s
    assert 0.8 < f_near < 1.25 and f_slow > 4  # the model is near the 20 ms deployment
    ev = slow["correction"]["evidence"][0]
    assert ev.startswith("measured ITL 100.0 ms vs model ") and "TP2·PP1·DP4 at 8 running/replica" in ev
    # near the model the running layout stays best; 5× slower steps need TP4's shorter ones
    assert near["candidates"][0]["layout"] == "TP2·PP1·DP4" and near["change"].startswith("keep")
    assert slow["candidates"][0]["layout"] == "TP4·PP1·DP2"
    assert slow["change"].startswith("TP4·PP1·DP2 vs current TP2·PP1·DP4: goodput +")
    # the slower the deployment, the less each layout serves within the same TPOT SLO
    good = {c["layout"]: c["goodput_tok_s_per_gpu"] for c in near["candidates"]}
    assert all(c["goodput_tok_s_per_gpu"] <= good[c["layout"]] for c in slow["candidates"])
    text = CliRunner().invoke(app, ["plan", "--deployment", "chat", "--store", str(tmp_path / "slow.duckdb"),
                                    "--tpot-slo", "0.08"]).stdout  # fmt: skip
    assert text.startswith("correction: measured ITL 100.0 ms vs model ")
