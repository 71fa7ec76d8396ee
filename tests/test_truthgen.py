"""The truth-set generator (tests/truthgen): independent of IOE, real formats, physics that holds."""

from __future__ import annotations

import ast
import csv
import gzip
import hashlib
import itertools
import json
import statistics
import time
from pathlib import Path

import pytest
from conftest import in_ci
from truth_store import build, ingest_capture
from truthgen import formats, physics
from truthgen.physics import ETH_100G, H100_SXM, IB_NDR, LLAMA_8B, LLAMA_70B, NVLINK4
from truthgen.render import render
from truthgen.scenarios import ZONES, build_all, check
from typer.testing import CliRunner

from ioe.cli import app

TRUTHGEN = Path(__file__).parent / "truthgen"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
SCENARIOS = build_all()
FORBIDDEN = ("analyzer", "simulate", "api", "collector", "ioe")


def _csv() -> Path:
    p = SHARED / "silicon" / "dense_calibration.csv"
    if p.exists():
        return p
    why = "shared/fixtures/silicon/dense_calibration.csv is not beside this checkout"
    if in_ci():
        pytest.fail(why)
    pytest.skip(why)


# ----------------------------------------------------------------------------------------- independence
@pytest.mark.parametrize("module", sorted(p.name for p in TRUTHGEN.glob("*.py")))
def test_generator_imports_nothing_from_ioe(module: str) -> None:
    tree = ast.parse((TRUTHGEN / module).read_text())
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    bad = [n for n in names if n.split(".")[0] in FORBIDDEN]
    assert not bad, f"tests/truthgen/{module} imports {bad}: the truth set must not come from IOE's code"


def test_every_scenario_is_well_formed() -> None:
    assert len(SCENARIOS) >= 15
    for sc in SCENARIOS.values():
        check(sc)
        assert sc.expected.reason and sc.expected.zone in ZONES
        if sc.expected.zone == "network":
            assert sc.expected.cross_node is not None, sc.name


# ----------------------------------------------------------------------------------------- real formats
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_ingests_with_no_refused_row(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    sc = SCENARIOS[name]
    _, _, report = build(sc, tmp_path_factory.getbasetemp() / "truth")
    assert report.problems == [] and report.unrecognized == []
    assert report.rows["gpu_samples"] > 0 and report.rows["engine_samples"] > 0
    assert report.rows["histogram_buckets"] > 0
    multi_gpu = any(e.tp > 1 for e in sc.engines)
    assert (report.rows["collective_records"] > 0) == multi_gpu
    assert set(report.files) <= {"prometheus-scrape", "nccl-inspector-jsonl", "otlp-json"}
    assert ("otlp-json" in report.files) == (sc.kv_link is not None)  # P/D scenarios send spans


def test_ioe_ingest_cli_takes_a_scrape_folder_with_ts(tmp_path: Path) -> None:
    """The command line a user would run on one scrape folder: rows stamped with ``--ts``."""
    render(SCENARIOS["hbm_decode_tp4"], tmp_path / "cap")
    folder = sorted((tmp_path / "cap" / "scrapes").iterdir())[3]
    args = ["ingest", str(folder), "--store", str(tmp_path / "s.duckdb"), "--ts", folder.name, "--json"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["problems"] == [] and out["unrecognized"] == []
    assert out["files"] == {"prometheus-scrape": 2}
    nccl = CliRunner().invoke(
        app, ["ingest", str(tmp_path / "cap" / "nccl"), "--store", str(tmp_path / "s.duckdb"), "--json"]
    )
    assert json.loads(nccl.output)["problems"] == []


def test_undeclared_capture_still_ingests(tmp_path: Path) -> None:
    render(SCENARIOS["tp16_ib_ramp"], tmp_path / "cap")
    report = ingest_capture(tmp_path / "cap", tmp_path / "s.duckdb", declare=False)
    assert report.problems == [] and report.rows["collective_records"] > 0


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_is_small_fast_and_deterministic(name: str, tmp_path: Path) -> None:
    sc = SCENARIOS[name]
    t = time.perf_counter()
    render(sc, tmp_path / "a")
    elapsed = time.perf_counter() - t
    render(sc, tmp_path / "b")
    size = sum(p.stat().st_size for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert size < 2_000_000, f"{name}: {size} bytes"
    # well under a second on an idle core; the bound only catches a runaway generator on a busy CI machine
    assert elapsed < 10.0, f"{name}: {elapsed:.2f} s"

    def digest(root: Path) -> str:
        h = hashlib.sha256()
        for p in sorted(root.rglob("*")):
            if p.is_file():
                h.update(p.relative_to(root).as_posix().encode() + p.read_bytes())
        return h.hexdigest()

    assert digest(tmp_path / "a") == digest(tmp_path / "b")


def test_vllm_body_has_the_fixture_family_order(tmp_path: Path) -> None:
    """Every vllm: family the writer emits appears in the real vLLM 0.33 exposition, in its order."""
    fixture = SHARED / "engine" / "vllm_0.33.0_dp1.prom"
    if not fixture.exists():
        if in_ci():
            pytest.fail("shared vLLM fixture not beside this checkout")
        pytest.skip("shared vLLM fixture not beside this checkout")
    real = [ln.split()[2] for ln in fixture.read_text().splitlines() if ln.startswith("# TYPE vllm:")]
    render(SCENARIOS["light_load_headroom"], tmp_path)
    body = gzip.decompress(next((tmp_path / "scrapes").glob("*/node-a-vllm.prom.gz")).read_bytes()).decode()
    ours = [ln.split()[2] for ln in body.splitlines() if ln.startswith("# TYPE vllm:")]
    assert set(ours) <= set(real), sorted(set(ours) - set(real))
    assert ours == [f for f in real if f in set(ours)]
    real_help = {
        ln.split()[2]: ln for ln in fixture.read_text().splitlines() if ln.startswith("# HELP vllm:")
    }
    for ln in body.splitlines():
        if ln.startswith("# HELP vllm:"):
            assert ln == real_help[ln.split()[2]]


def test_dcgm_body_with_and_without_profiling_fields() -> None:
    g = formats.GpuIdentity("node-a", 0, "GPU-1", "00000000:18:00.0", H100_SXM.dcgm_model)
    vals = [
        {"DCGM_FI_PROF_DRAM_ACTIVE": 0.8123456, "DCGM_FI_DEV_POWER_USAGE": 512.25, "DCGM_FI_DEV_FB_USED": 7e4}
    ]
    with_prof = formats.dcgm_text([g], vals, profiling=True)
    without = formats.dcgm_text([g], vals, profiling=False)
    assert "DCGM_FI_PROF_DRAM_ACTIVE{" in with_prof and "DCGM_FI_PROF_" not in without
    assert "} 0.812346\n" in with_prof and "} 512.250000\n" in with_prof and "} 70000\n" in with_prof
    assert with_prof.startswith(
        "# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).\n# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n"
    )


def test_go_float_matches_prometheus_client() -> None:
    assert formats.go_float(12.0) == "12.0"
    assert formats.go_float(1150730240.0) == "1.15073024e+09"
    assert formats.go_float(1795330848.45) == "1.79533084845e+09"
    assert formats.go_float(0.42) == "0.42"
    assert formats.go_float(float("inf")) == "+Inf"


def test_inspector_records_are_a_time_sample(tmp_path: Path) -> None:
    """One record per rank per dump; coll_sn jumps by the calls made in between; all ranks of a dump
    name the same collective (the cross-rank join key), and a two-node group says nnodes = 2."""
    render(SCENARIOS["tp16_eth_plateau"], tmp_path)
    logs = sorted((tmp_path / "nccl").glob("*.log"))
    assert len(logs) == 16 and {p.name.split("-pid")[0] for p in logs} == {"node-a", "node-b"}
    recs = [json.loads(x) for p in logs for x in p.read_text().splitlines()]
    by_dump: dict[int, set[int]] = {}
    for r in recs:
        by_dump.setdefault(r["metadata"]["dump_timestamp_us"] // 1_000_000, set()).add(
            r["coll_perf"]["coll_sn"]
        )
        assert r["header"]["nnodes"] == 2 and r["header"]["n_ranks"] == 16
    assert all(len(v) == 1 for v in by_dump.values())
    sns = [next(iter(by_dump[k])) for k in sorted(by_dump)]
    gaps = [b - a for a, b in itertools.pairwise(sns)]
    assert min(gaps) > 100  # ~160 all-reduces per step, many steps per dump interval


# ----------------------------------------------------------------------------------------------- physics
def test_kv_bytes_per_token_from_the_architecture() -> None:
    assert LLAMA_70B.kv_bytes_per_token() == 327_680  # 2 × 80 × 8 × 128 × 2
    assert LLAMA_8B.kv_bytes_per_token() == 131_072
    assert LLAMA_70B.kv_bytes_per_token_per_gpu(tp=16) == 327_680 / 8  # KV heads replicate past 8


def test_decode_step_grows_with_batch_and_is_hbm_bound_below_the_ridge() -> None:
    ridge = H100_SXM.peak_bf16 / H100_SXM.hbm_bw  # FLOP per byte where the roofline bends (~295)
    prev = 0.0
    for b in (1, 8, 32, 128, 256):
        c = physics.step_cost(LLAMA_8B, H100_SXM, tp=1, batch=b, ctx=1000)
        assert c.total_s > prev
        prev = c.total_s
        if c.flops / c.bytes < ridge * physics.ETA_COMPUTE / physics.ETA_HBM:
            assert c.mem_s > c.compute_s
    one = physics.step_cost(LLAMA_8B, H100_SXM, tp=1, batch=1, ctx=1000)
    assert one.mem_s > 10 * one.compute_s  # batch 1 decode: weights stream, tensor cores idle
    pre = physics.step_cost(LLAMA_8B, H100_SXM, tp=1, batch=0, ctx=0, prefill_tokens=8192, isl=8192)
    assert pre.compute_s > 5 * pre.mem_s  # a full prefill chunk is compute-bound


def test_all_reduce_cost_orders_the_fabrics() -> None:
    for nbytes in (64e3, 1e6, 32e6):
        nv = physics.all_reduce_s(nbytes, 8, NVLINK4)
        ib = physics.all_reduce_s(nbytes, 16, IB_NDR)
        eth = physics.all_reduce_s(nbytes, 16, ETH_100G)
        assert nv < ib < eth
    small = physics.all_reduce_s(16e3, 8, NVLINK4)
    assert 30e-6 < small < 45e-6  # the measured H100×8 small-message all-reduce is ≈ 37 µs
    _, busbw = physics.bus_bandwidth("AllReduce", 16e3, small, 8)
    assert busbw < 0.01 * NVLINK4.bw / 1e9  # latency-bound: far below link peak, yet no network


def test_littles_law_holds_in_the_engine_model() -> None:
    from truthgen.engine import Layout, solve

    iv, _ = solve(LLAMA_8B, H100_SXM, Layout(), arrival=10.0, isl=200, osl=500, waiting=0.0, dt=10.0)
    w = iv.ttft_service_s + 499 * iv.itl_mean_s
    assert iv.running == pytest.approx(physics.littles_law_in_system(10.0, w), rel=0.02)


def test_calibration_constants_come_from_the_silicon_csv() -> None:
    got = physics.derive_calibration(_csv())
    assert got["eta_hbm"] == pytest.approx(physics.ETA_HBM, abs=0.005)
    assert got["eta_compute"] == pytest.approx(physics.ETA_COMPUTE, abs=0.005)


def test_step_model_tracks_the_measured_tpot_curves() -> None:
    """Llama-3.1-8B BF16 on H100 SXM (TRT-LLM, TP1-8, ISL 1-4K, concurrency 8-128): the model's
    mixed-step TPOT against the measured one."""
    with _csv().open(newline="") as fh:
        rows = [
            r
            for r in csv.DictReader(fh)
            if r["system"] == "h100_sxm" and r["model_path"] == LLAMA_8B.name and r["precision"] == ""
        ]
    ratios = [
        physics.predicted_tpot_s(
            LLAMA_8B, H100_SXM, int(float(r["tp_size"])), int(r["isl"]), int(r["osl"]), float(r["batch_size"])
        )
        * 1e3
        / float(r["silicon_tpot_ms"])
        for r in rows
    ]
    assert len(ratios) > 100
    assert 0.8 < statistics.median(ratios) < 1.1
    assert sum(0.65 < x < 1.35 for x in ratios) / len(ratios) > 0.8
