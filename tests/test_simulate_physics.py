"""The simulator itself: its GPU counters follow what each step does, EP and prefill/decode emit
what IOE reads for them, inter-node jitter and congestion slow crossing collectives, and each
non-thermal fault shows in the fields it should — all read back through IOE's own parsers.

These tests check the simulator, never a verdict: verdict tests use tests/truthgen."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import polars as pl
import pytest

from collector.formats.nccl_inspector import parse_jsonl
from collector.formats.scrape import parse_scrape
from simulate import dcgm_exporter as dcgm
from simulate.activity import RankStep, Timeline
from simulate.node import DeploymentSim, Simulation
from simulate.spec import Faults, SimDeployment
from simulate.stepmodel import step_model


def _steady(d: SimDeployment, batch: int, ctx: int, prefill: int, seconds: float = 2.0) -> dcgm.GpuState:
    """GPU 0 after running the same step back to back for ``seconds``: its exporter values."""
    model = step_model(d)
    gpu = dcgm.GpuState("h", 0, "NVIDIA H100 80GB HBM3", 81559)
    t = 0.0
    while t < seconds:
        cost = model(batch, ctx, prefill, t)
        gpu.timeline.add(t, cost.ranks[0])
        t += cost.seconds
    dcgm.update(gpu, t)
    return gpu


def _prof(g: dcgm.GpuState) -> dict[str, float]:
    v = g.values
    return {k: v[f"DCGM_FI_PROF_{k}"] for k in ("SM_ACTIVE", "PIPE_TENSOR_ACTIVE", "DRAM_ACTIVE")}


def test_decode_steps_keep_dram_busy_and_prefill_steps_the_tensor_pipes() -> None:
    """A decode step streams the weights and KV for few FLOPs; a prefill step does ~2 × 8B × 8k
    FLOPs per weight read. The counters must say so, whatever the roofline times are."""
    d = SimDeployment("one", "llama-3.1-8b")
    decode = _prof(_steady(d, batch=64, ctx=64 * 2000, prefill=0))
    prefill = _prof(_steady(d, batch=0, ctx=0, prefill=8192))
    assert decode["DRAM_ACTIVE"] > 0.6 and decode["PIPE_TENSOR_ACTIVE"] < 0.2
    assert decode["DRAM_ACTIVE"] > 3 * decode["PIPE_TENSOR_ACTIVE"]
    assert prefill["PIPE_TENSOR_ACTIVE"] > 0.5
    assert prefill["PIPE_TENSOR_ACTIVE"] > 1.5 * prefill["DRAM_ACTIVE"]
    # warps stalled on memory count as active: SM activity follows kernel time in both (an H100
    # copy read 0.99); the decode step's host overhead (~⅓ of it at batch 64) is idle GPU time
    assert decode["SM_ACTIVE"] > 0.55 and prefill["SM_ACTIVE"] > 0.8


def test_idle_gaps_between_steps_lower_every_activity_pro_rata() -> None:
    """One 0.25 s step in a 1 s interval is a quarter of the activity of back-to-back steps."""
    step = RankStep(seconds=0.25, kernel_s=0.25, tensor_s=0.2, dram_s=0.05, clock_s=0.25, energy_j=100.0)
    busy, sparse = Timeline(), Timeline()
    for k in range(8):
        busy.add(k * 0.25, step)
    sparse.add(1.75, step)
    full, _ = busy.sample(2.0, 1.0)
    gap, _ = sparse.sample(2.0, 1.0)
    assert full.tensor == pytest.approx(0.8) and gap.tensor == pytest.approx(0.2)
    assert gap.sm_active == pytest.approx(full.sm_active / 4)
    assert gap.power_w < full.power_w
    # a step straddling the interval's start counts for its overlap only
    half = Timeline()
    half.add(0.875, step)
    assert half.sample(2.0, 1.0)[0].tensor == pytest.approx(0.1)


def test_collective_time_holds_few_sms_and_no_tensor_pipes() -> None:
    """TP16 across two nodes at small batch: most of the step is the inter-node all-reduce."""
    d = SimDeployment("tp16", "llama-3.1-70b", tp=16)
    cost = step_model(d)(16, 16 * 1000, 0)
    r = cost.ranks[0]
    assert r.collective_s > r.kernel_s and r.nic_bytes > 0 and r.nvlink_bytes > 0
    v = _prof(_steady(d, 16, 16 * 1000, 0))
    assert v["SM_ACTIVE"] < 0.5 and v["PIPE_TENSOR_ACTIVE"] < 0.1


def _run(d: SimDeployment, seconds: int, tmp_path: Path | None = None) -> DeploymentSim:
    sim = DeploymentSim(d, epoch_s=1.8e9, inspector_dir=tmp_path)
    for t in range(1, seconds + 1):
        sim.advance(float(t))
    return sim


def _dcgm_rows(sim: DeploymentSim) -> pl.DataFrame:
    frames = []
    for host in sim.hosts():
        body = dcgm.exposition([g for g in sim.gpus if g.host == host])
        parsed = parse_scrape(body, kind="dcgm", ts_ns=1, source="t")
        assert not parsed.problems
        frames.append(parsed.tables["gpu_samples"])
    return pl.concat(frames, how="diagonal_relaxed")


def _by_gpu(rows: pl.DataFrame, metric: str) -> dict[tuple[str, int], float]:
    got = rows.filter(pl.col("metric") == metric)
    return {(h, g): v for h, g, v in zip(got["host"], got["gpu"], got["value"], strict=True)}


def test_a_lowered_power_limit_throttles_its_gpu_in_the_fields_ioe_reads() -> None:
    """Rank 1's limit is set to 300 W: its prefill steps demand more, so its clock drops, its
    power sits at the limit, SW_POWER_CAP (0x4) is set and the power-violation counter rises;
    its peers keep the 700 W limit and nominal clocks."""
    f = Faults(power_limit_gpu=1, power_limit_w=300.0)
    d = SimDeployment("pl", "llama-3.1-70b", tp=4, workload="azure_code", speed=2.5, max_isl=6000,
                      poisson=True, faults=f, seed=2)  # fmt: skip
    rows = _dcgm_rows(_run(d, 20))
    limit = _by_gpu(rows, "enforced_power_limit_w")
    assert limit == {("pl-node0", i): 300.0 if i == 1 else 700.0 for i in range(4)}
    assert _by_gpu(rows, "power_limit_w")[("pl-node0", 1)] == 300.0
    mask = _by_gpu(rows, "throttle_reasons_mask")
    assert mask[("pl-node0", 1)] == 0x4 and mask[("pl-node0", 0)] == 0
    clock = _by_gpu(rows, "sm_clock_mhz")
    assert clock[("pl-node0", 1)] < 0.95 * clock[("pl-node0", 0)]
    assert _by_gpu(rows, "power_w")[("pl-node0", 1)] <= 300.0
    viol = _by_gpu(rows, "power_violation_s")
    assert viol[("pl-node0", 1)] > 1.0 and viol[("pl-node0", 0)] == 0.0


def test_link_errors_xid_and_host_contention_show_on_their_gpu_only() -> None:
    f = Faults(link_error_gpu=0, xid_gpu=1, xid=79, xid_at_s=8.0, xid_stall_s=3.0,
               host_contention_gpu=2, host_contention_s=0.02)  # fmt: skip
    d = SimDeployment("f", "llama-3.1-8b", tp=4, workload="azure_conv", speed=4.0, faults=f, seed=5)
    sim = DeploymentSim(d, epoch_s=0.0)
    for t in range(1, 8):
        sim.advance(float(t))
    before = _dcgm_rows(sim)
    assert set(_by_gpu(before, "xid_last").values()) == {0.0}
    for t in range(8, 10):  # the hang (8-11 s): the stuck GPU keeps utilization, DCP fields go to 0
        sim.advance(float(t) + 0.5)
    hung = sim.gpus[1].values
    assert hung["DCGM_FI_DEV_GPU_UTIL"] == 100 and hung["DCGM_FI_PROF_SM_ACTIVE"] < 0.05
    for t in range(10, 25):
        sim.advance(float(t))
    rows = _dcgm_rows(sim)
    assert _by_gpu(rows, "xid_last") == {("f-node0", 0): 0.0, ("f-node0", 1): 79.0, ("f-node0", 2): 0.0,
                                         ("f-node0", 3): 0.0}  # fmt: skip
    for metric in ("nvlink_crc_flit_errors_total", "nvlink_replay_errors_total", "pcie_replay_total"):
        errs = _by_gpu(rows, metric)
        assert errs[("f-node0", 0)] > 0 and all(v == 0 for k, v in errs.items() if k[1] != 0), metric
    # host contention: GPU 2 launches late every step, so it idles while its peers spin in NCCL
    util = _by_gpu(rows, "gpu_util_ratio")
    assert util[("f-node0", 2)] < util[("f-node0", 3)] - 0.05
    assert _by_gpu(rows, "sm_clock_mhz")[("f-node0", 2)] == 1980.0


def test_inter_node_jitter_and_congestion_slow_only_crossing_collectives() -> None:
    base = SimDeployment("j", "llama-3.1-70b", tp=16)
    jittery = dataclasses.replace(base, faults=Faults(jitter_s=200e-6))
    burst = Faults(congestion_at_s=10.0, congestion_s=5.0, congestion_bw_ratio=0.25, congestion_period_s=60.0)
    congested = dataclasses.replace(base, faults=burst)
    calm = step_model(base)(32, 32 * 1000, 0)
    noisy = [step_model(jittery)(32, 32 * 1000, 0).comm_s for _ in range(3)]
    model = step_model(congested)
    during, after = model(32, 32 * 1000, 0, 12.0), model(32, 32 * 1000, 0, 20.0)
    again = model(32, 32 * 1000, 0, 72.0)
    # 160 all-reduces a step each wait Exp(200 µs) more: ~32 ms
    assert all(0.02 < n - calm.comm_s < 0.045 for n in noisy) and len(set(noisy)) == 1  # seeded
    assert during.comm_s > 3 * after.comm_s and after.comm_s == pytest.approx(calm.comm_s)
    assert again.comm_s == pytest.approx(during.comm_s)
    inside = SimDeployment("in", "llama-3.1-70b", tp=8, faults=Faults(jitter_s=200e-6))
    quiet = dataclasses.replace(inside, faults=Faults())
    assert step_model(inside)(32, 32000, 0).comm_s == step_model(quiet)(32, 32000, 0).comm_s


def test_ep_across_two_nodes_writes_alltoall_records_with_its_ranks_and_hosts(tmp_path: Path) -> None:
    d = SimDeployment("moe", "qwen3-30b-a3b", tp=16, ep=16, attention_dp=True, workload="azure_conv",
                      speed=2.0, seed=7)  # fmt: skip
    sim = _run(d, 6, tmp_path)
    sim.close()
    text = "".join(p.read_text() for p in sorted(tmp_path.glob("*.log")))
    parsed = parse_jsonl(text, source="inspector")
    assert not parsed.problems
    rows = parsed.tables["collective_records"]
    assert set(rows["op"]) == {"AlltoAll"}
    assert set(rows["n_ranks"]) == {16} and set(rows["nnodes"]) == {2}
    assert set(rows["host"]) == {"moe-node0", "moe-node1"} and set(rows["rank"]) == set(range(16))
    # coll_sn advances by the step's calls: dispatch + combine for each of the 48 MoE layers
    sns = sorted(set(rows["coll_sn"]))
    assert all((b - a) % 96 == 0 for a, b in itertools.pairwise(sns))
    rec = json.loads(text.splitlines()[0])["coll_perf"]
    assert rec["coll_busbw_gbs"] == pytest.approx(rec["coll_algobw_gbs"] * 15 / 16, rel=1e-3)
    spec = Simulation([d]).deployment_specs()[0]
    assert spec["ep"] == 16 and spec["fabric"] == "ib_ndr"
    # the all-to-all's remote half leaves through the NIC (PCIe), the rest over NVLink
    pcie = _by_gpu(_dcgm_rows(sim), "pcie_tx_bytes_per_s")
    assert min(pcie.values()) > 1e8


def test_prefill_decode_sends_each_prompts_kv_and_the_decode_engine_reports_nixl() -> None:
    d = SimDeployment("pd", "llama-3.1-70b", tp=8, dp=1, prefill=1, kv_fabric="eth_100g",
                      workload="azure_conv", speed=1.0, seed=9)  # fmt: skip
    sim = _run(d, 40)
    assert sim.hosts() == ["pd-node0", "pd-node1"]
    engine = parse_scrape(sim.registry.exposition(), kind="engine", ts_ns=1)
    buckets = engine.tables["histogram_buckets"]
    xfer = buckets.filter(pl.col("concept") == "kv_transfer_seconds")
    assert set(xfer["dp_rank"]) == {1} and float(xfer["cumulative_count"].max()) > 10  # type: ignore[arg-type]
    samples = engine.tables["engine_samples"]

    def mean(concept: str, rank: int) -> float:
        names = [f"{concept}_sum", f"{concept}_count"]
        got = samples.filter((pl.col("dp_rank") == rank) & pl.col("concept").is_in(names))
        vals = dict(zip(got["concept"], got["value"], strict=True))
        return vals[f"{concept}_sum"] / vals[f"{concept}_count"]

    per_transfer = mean("kv_transfer_seconds", 1)
    # each transfer: 60 µs + its bytes (prompt × 320 KiB/token) over the 8 GPUs' 12.5 GB/s NICs
    nbytes = mean("kv_transfer_bytes", 1)
    front = samples.filter(pl.col("dp_rank") == 0)
    total = dict(zip(front["concept"], front["value"], strict=True))
    prompt = total["prompt_tokens_total"] / total["request_success_total"]  # the prefill engine's mean prompt
    assert nbytes / 327680 == pytest.approx(prompt, rel=0.2)
    assert per_transfer == pytest.approx(60e-6 + nbytes / 8 / 12.5e9, rel=1e-6)
    # the decode engine's TTFT runs from the request's arrival at the prefill engine
    assert mean("ttft_seconds", 1) > per_transfer + mean("ttft_seconds", 0) * 0.5
    # prefill GPUs send the KV (PCIe TX), decode GPUs receive it (PCIe RX)
    rows = _dcgm_rows(sim)
    tx, rx = _by_gpu(rows, "pcie_tx_bytes_per_s"), _by_gpu(rows, "pcie_rx_bytes_per_s")
    assert min(v for (h, _), v in tx.items() if h == "pd-node0") > 1e7
    assert min(v for (h, _), v in rx.items() if h == "pd-node1") > 1e7
    assert max(v for (h, _), v in tx.items() if h == "pd-node1") < 1e7
    spec = Simulation([d]).deployment_specs()[0]
    assert spec["roles"] == {"prefill": 1, "decode": 1} and spec["fabric"] == "eth_100g"


def test_a_yaml_config_declares_ep_pd_and_faults_and_bad_ranks_are_refused(tmp_path: Path) -> None:
    from simulate.spec import load_deployments

    good = tmp_path / "sim.yaml"
    good.write_text(
        "- {name: moe, model: qwen3-30b-a3b, tp: 16, ep: 16, attention_dp: true,\n"
        "   faults: {jitter_s: 0.0001}}\n"
        "- {name: pd, model: llama-3.1-70b, tp: 8, prefill: 2, dp: 1, kv_fabric: eth_100g,\n"
        "   faults: {power_limit_gpu: 3, power_limit_w: 400, xid_gpu: 1, xid: 48, xid_at_s: 30}}\n"
    )
    moe, pd = load_deployments(str(good))
    assert (moe.ep, moe.attention_dp, moe.faults.jitter_s) == (16, True, 0.0001)
    assert pd.engines == 3 and [pd.role(i) for i in range(3)] == ["prefill", "prefill", "decode"]
    assert pd.gpu_indices(2) == list(range(16, 24)) and pd.nodes == 3  # decode starts on its own node
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {name: x, model: llama-3.1-8b, tp: 2, faults: {xid_gpu: 2}}\n")
    with pytest.raises(ValueError, match=r"faults.xid_gpu = 2 is not a rank of its 2-GPU group"):
        load_deployments(str(bad))
    with pytest.raises(ValueError, match="ep must be 1 or tp × pp"):
        SimDeployment("e", "qwen3-30b-a3b", tp=4, ep=2)


def test_a_late_rank_arrives_last_in_the_inspector_records(tmp_path: Path) -> None:
    """Host contention on rank 2: it launches each step 20 ms late, so in every sampled all-reduce it
    is the last to arrive and its exec time (arrival to end, waiting included) is the shortest."""
    f = Faults(host_contention_gpu=2, host_contention_s=0.02)
    d = SimDeployment("hc", "llama-3.1-8b", tp=4, workload="azure_conv", speed=4.0, faults=f, seed=3)
    sim = _run(d, 8, tmp_path)
    sim.close()
    rows = parse_jsonl("".join(p.read_text() for p in tmp_path.glob("*.log"))).tables["collective_records"]
    assert set(rows["op"]) == {"AllReduce"} and set(rows["nnodes"]) == {1}
    by_call = rows.sort("start_us").group_by("coll_sn")
    last = by_call.agg(pl.col("rank").last(), pl.col("exec_us").min().alias("m"))
    shortest = rows.join(last, on="coll_sn").filter(pl.col("exec_us") == pl.col("m"))
    assert len(last) > 20 and set(last["rank"]) == {2} and set(shortest["rank"]) == {2}
