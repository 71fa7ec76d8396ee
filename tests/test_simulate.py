"""The simulator: engines follow the performance model, faults show where they should, and the
endpoints speak the real formats (parsed back with IOE's own parsers)."""

from __future__ import annotations

import dataclasses
import time

import httpx
import pytest

from collector.formats.scrape import parse_scrape
from simulate.engine import EngineConfig, EngineSim
from simulate.node import DeploymentSim, Simulation
from simulate.spec import Faults, SimDeployment, demo_deployments
from simulate.stepmodel import kv_capacity_tokens, step_model
from simulate.workload import Arrival, WorkloadError, load_trace, replay


class _Recorder:
    """An engine observer that keeps what finished and counts preemptions."""

    def __init__(self) -> None:
        self.done: list = []
        self.preemptions = 0

    def step(self, *a) -> None: ...

    def first_token(self, *a) -> None: ...

    def preempted(self) -> None:
        self.preemptions += 1

    def finished(self, done) -> None:
        self.done.append(done)


def test_shipped_traces_load_with_their_published_shape() -> None:
    conv = load_trace("azure_conv")
    assert len(conv) == 19366 and conv[0] == Arrival(0.0, 374, 44)
    assert load_trace("mooncake")[0].isl == 6758
    with pytest.raises(WorkloadError, match="no such trace"):
        load_trace("nope")


def test_replay_speed_surge_and_poisson() -> None:
    trace = [Arrival(float(i), 100, 10) for i in range(100)]
    fast = [a.t_s for _, a in zip(range(10), replay(trace, speed=2.0), strict=False)]
    assert fast[:3] == [0.0, 0.5, 1.0]
    surged = [a for _, a in zip(range(300), replay(trace, rate_multiplier=lambda t: 3.0), strict=False)]
    assert sum(1 for a in surged if a.t_s < 10) == 30  # every request three times
    pois = [a.t_s for _, a in zip(range(2000), replay(trace, poisson=True, seed=1), strict=False)]
    assert pois[-1] / len(pois) == pytest.approx(1.0, rel=0.1)  # the trace's mean rate, 1 request/s


def test_engine_preempts_when_kv_runs_out_and_finishes_every_request() -> None:
    obs = _Recorder()
    d = SimDeployment("x", "llama-3.1-8b")
    arrivals = iter([Arrival(0.0, 900, 200) for _ in range(20)])
    eng = EngineSim(EngineConfig(kv_capacity_tokens=5000, max_num_seqs=64), step_model(d), arrivals, obs)
    eng.advance(600.0)
    assert len(obs.done) == 20
    assert obs.preemptions > 0 and eng.preemptions == obs.preemptions
    assert all(f.first_token_s >= f.scheduled_s >= f.arrival_s for f in obs.done)


def test_step_model_is_the_planners_and_faults_slow_it_down() -> None:
    base = SimDeployment("tp16", "llama-3.1-70b", tp=16)
    cost = step_model(base)(64, 64 * 1000, 0)
    slow_link = step_model(dataclasses.replace(base, faults=Faults(degraded_link_ratio=0.25)))(
        64, 64 * 1000, 0
    )
    throttled = step_model(dataclasses.replace(base, faults=Faults(straggler_gpu=3)))(64, 64 * 1000, 0)
    assert slow_link.comm_s > 2 * cost.comm_s and slow_link.seconds > cost.seconds
    assert throttled.seconds > cost.seconds and throttled.comm_s == cost.comm_s
    assert kv_capacity_tokens(SimDeployment("a", "llama-3.1-70b", tp=4)) > 0


def test_a_throttled_gpu_looks_throttled_and_its_peers_do_not() -> None:
    d = next(x for x in demo_deployments(1e9) if x.name == "code-70b")
    sim = DeploymentSim(d, epoch_s=0.0)
    for t in range(1, 6):
        sim.advance(float(t))
    clocks = [g.values["DCGM_FI_DEV_SM_CLOCK"] for g in sim.gpus]
    reasons = [g.values["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"] for g in sim.gpus]
    assert clocks == [1980, 1980, 1584, 1980] and reasons == [0, 0, 0x60, 0]


def test_endpoints_parse_back_and_exporter_faults_show(tmp_path) -> None:
    deps = [
        SimDeployment("ok", "llama-3.1-8b", workload="azure_conv", speed=4.0),
        SimDeployment("garbled", "llama-3.1-8b", faults=Faults(exporter_garbage=True)),
        SimDeployment("stuck", "llama-3.1-8b", faults=Faults(exporter_hangs=True)),
    ]
    sim = Simulation(deps, inspector_dir=str(tmp_path), tick_s=0.1)
    sim.start()
    try:
        time.sleep(1.5)
        dcgm = httpx.get(sim.url("/dcgm/ok-node0/metrics"), timeout=5).text
        rows = parse_scrape(dcgm, kind="dcgm", ts_ns=1, source="t").tables["gpu_samples"]
        assert set(rows["host"]) == {"ok-node0"} and "dram_active_ratio" in set(rows["metric"])
        vllm = parse_scrape(httpx.get(sim.url("/vllm/ok/metrics"), timeout=5).text, kind="engine", ts_ns=1)
        assert "ttft_seconds" in set(vllm.tables["histogram_buckets"]["concept"])
        garbled = parse_scrape(httpx.get(sim.url("/dcgm/garbled-node0/metrics"), timeout=5).content, ts_ns=1)
        assert garbled.problems and "gpu_samples" not in garbled.tables
        with pytest.raises(httpx.ReadTimeout):
            httpx.get(sim.url("/dcgm/stuck-node0/metrics"), timeout=1.0)
        assert httpx.get(sim.url("/nowhere"), timeout=5).status_code == 404
    finally:
        sim.stop()
