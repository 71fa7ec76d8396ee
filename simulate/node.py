"""Simulated deployments served over HTTP on 127.0.0.1, advanced in real time.

Every ``tick_s`` the engines are advanced to the wall clock and each GPU's counters are set
from what its engine did over the last second. Endpoints (one server for all):

* ``/dcgm/<host>/metrics`` — that node's dcgm-exporter (:mod:`simulate.dcgm_exporter`);
* ``/vllm/<deployment>/metrics`` — the deployment's vLLM ``/metrics`` (``engine`` = DP index).

Spans go to ``otlp_endpoint`` when given; NCCL Inspector logs to ``inspector_dir`` when given.
Inter-node share of TP traffic (used to split NVLink from NIC bytes): (nodes − 1) / nodes of a
group spanning several nodes, 0 inside one node.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from analyzer.catalog import gpu as catalog_gpu
from analyzer.modelcfg import load as load_model
from simulate import dcgm_exporter as dcgm
from simulate.emitters import InspectorWriter, SpanEmitter
from simulate.engine import Activity, EngineConfig, EngineSim, Finished, Request, StepCost
from simulate.spec import SimDeployment
from simulate.stepmodel import StepModel, kv_capacity_tokens, step_model
from simulate.vllm_metrics import EngineMetrics, VllmRegistry
from simulate.workload import load_trace, replay

log = logging.getLogger(__name__)

GPU_MODEL_NAMES = {
    "h100_sxm": "NVIDIA H100 80GB HBM3",
    "h100_pcie": "NVIDIA H100 PCIe",
    "h200_sxm": "NVIDIA H200",
    "b200_sxm": "NVIDIA B200",
    "a100_sxm": "NVIDIA A100-SXM4-80GB",
}
INSPECTOR_MIN_GAP_S = 0.1
GARBAGE = b"\x00\x9f garbage from a broken exporter \xff\n{{{ not exposition\n"


class _Tap:
    """Engine observer that forwards to the vLLM metrics and writes sampled Inspector records."""

    def __init__(self, metrics: EngineMetrics, sim: DeploymentSim, replica: int):
        self.metrics, self.sim, self.replica = metrics, sim, replica
        self.engine: EngineSim | None = None
        self._last_write = -1.0

    def step(self, cost: StepCost, decoding: int, prefill_tokens: int, itl_s: float) -> None:
        self.metrics.step(cost, decoding, prefill_tokens, itl_s)
        writer = self.sim.inspectors.get(self.replica)
        if (
            writer is None
            or self.engine is None
            or self.engine.clock - self._last_write < INSPECTOR_MIN_GAP_S
        ):
            return
        self._last_write = self.engine.clock
        self.sim.write_collective(writer, self.engine.clock - cost.seconds, cost, decoding + prefill_tokens)

    def first_token(self, req: Request, now: float) -> None:
        self.metrics.first_token(req, now)

    def finished(self, done: Finished) -> None:
        self.metrics.finished(done)

    def preempted(self) -> None:
        self.metrics.preempted()


@dataclass
class DeploymentSim:
    spec: SimDeployment
    epoch_s: float
    otlp_endpoint: str = ""
    inspector_dir: Path | None = None
    engines: list[EngineSim] = field(default_factory=list)
    gpus: list[dcgm.GpuState] = field(default_factory=list)
    inspectors: dict[int, InspectorWriter] = field(default_factory=dict)
    spans: SpanEmitter | None = None
    history: list[deque[tuple[float, Activity]]] = field(default_factory=list)
    observers: list[EngineMetrics] = field(default_factory=list)

    def __post_init__(self) -> None:
        d = self.spec
        self.model: StepModel = step_model(d)
        self.layers = load_model(d.model).layers
        g = catalog_gpu(d.gpu)
        self.registry = VllmRegistry(_hf_name(d.model))
        if self.otlp_endpoint:
            self.spans = SpanEmitter(self.otlp_endpoint, d.name, self.registry.model_name, f"{d.name}-engine")
        self._build(g.hbm_bytes)

    def _build(self, hbm_bytes: float) -> None:
        d = self.spec
        trace = load_trace(d.workload)
        cfg = EngineConfig(kv_capacity_tokens=kv_capacity_tokens(d), max_num_seqs=d.max_num_seqs)
        per = d.tp * d.pp
        for replica in range(d.dp):

            def surge(t: float) -> float:
                f = d.faults
                return f.surge_multiplier if 0 <= f.surge_at_s <= t else 1.0

            # each DP replica takes every dp-th request of the trace (a round-robin router)
            arrivals = (
                a
                for i, a in enumerate(
                    replay(
                        trace,
                        speed=d.speed,
                        rate_multiplier=surge,
                        seed=d.seed,
                        max_isl=d.max_isl,
                        poisson=d.poisson,
                    )
                )
                if i % d.dp == replica
            )
            metrics = self.registry.observer(replica, self._on_finish(replica))
            tap = _Tap(metrics, self, replica)
            engine = EngineSim(cfg, self.model, arrivals, tap)
            tap.engine = engine
            self.engines.append(engine)
            self.observers.append(metrics)
            self.history.append(deque([(0.0, Activity())], maxlen=64))
            ranks = list(range(replica * per, (replica + 1) * per))
            for rank_in_group, i in enumerate(ranks):
                ratio = d.faults.straggler_clock_ratio if rank_in_group == d.faults.straggler_gpu else 1.0
                self.gpus.append(
                    dcgm.GpuState(
                        d.host(i),
                        i % d.gpus_per_node,
                        _gpu_model_name(d.gpu),
                        int(hbm_bytes / 2**20),
                        pod=f"{d.name}-engine-{replica}",
                        clock_ratio=ratio,
                    )
                )
            if self.inspector_dir is not None and per > 1:
                comm = "0x" + hashlib.sha1(f"{d.name}/{replica}".encode()).hexdigest()[:16]
                self.inspectors[replica] = InspectorWriter(
                    self.inspector_dir, d.name, [d.host(i) for i in ranks], self.layers, comm_id=comm
                )

    def _on_finish(self, replica: int) -> Any:
        def emit(done: Finished) -> None:
            if self.spans is not None:
                self.spans.emit(done, self.epoch_s, replica)

        return emit

    def advance(self, t: float) -> None:
        for replica, (engine, obs) in enumerate(zip(self.engines, self.observers, strict=True)):
            engine.advance(t)
            obs.gauges(
                len(engine.running), len(engine.waiting), engine.kv_used / engine.cfg.kv_capacity_tokens
            )
            hist = self.history[replica]
            hist.append((t, _copy(engine.activity)))
            self._update_gpus(replica, hist, t)

    def _update_gpus(self, replica: int, hist: deque[tuple[float, Activity]], t: float) -> None:
        t0, a0 = next(((ts, a) for ts, a in hist if t - ts <= 1.0), hist[0])
        a1 = hist[-1][1]
        d = self.spec
        per = d.tp * d.pp
        inter = (d.nodes - 1) / d.nodes if d.tp > d.gpus_per_node else 0.0
        comm = a1.comm_bytes - a0.comm_bytes
        w = dcgm.Window(
            max(t - t0, 1e-3),
            a1.busy_s - a0.busy_s,
            a1.compute_s - a0.compute_s,
            a1.hbm_s - a0.hbm_s,
            a1.compute_bound_s - a0.compute_bound_s,
            a1.memory_bound_s - a0.memory_bound_s,
            a1.comm_s - a0.comm_s,
            comm * (1 - inter),
            comm * inter,
        )
        for g in self.gpus[replica * per : (replica + 1) * per]:
            dcgm.update(g, w)

    def write_collective(self, writer: InspectorWriter, start_s: float, cost: StepCost, tokens: int) -> None:
        """One TP all-reduce of the step: each rank arrives after its share of the step's GPU work
        between two all-reduces (1 / (2 × layers) of it), the throttled rank at its clock ratio."""
        d = self.spec
        per_collective = max(cost.compute_s, cost.hbm_s) / max(2 * self.layers, 1)
        gpu_us = [
            per_collective / (d.faults.straggler_clock_ratio if r == d.faults.straggler_gpu else 1.0) * 1e6
            for r in range(d.tp)
        ]
        transfer_us = cost.comm_s / max(2 * self.layers, 1) * 1e6
        writer.write_step((self.epoch_s + start_s) * 1e6, gpu_us, transfer_us, tokens * self.model.hidden * 2)

    def hosts(self) -> list[str]:
        return sorted({g.host for g in self.gpus})

    def close(self) -> None:
        for w in self.inspectors.values():
            w.close()
        if self.spans is not None:
            self.spans.close()


def _copy(a: Activity) -> Activity:
    return Activity(**vars(a))


def _hf_name(model: str) -> str:
    names = {
        "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
        "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
    }
    return names.get(model, model)


def _gpu_model_name(name: str) -> str:
    return GPU_MODEL_NAMES.get(catalog_gpu(name).name, name)


class Simulation:
    """All simulated deployments, one HTTP server, one ticker thread."""

    def __init__(
        self,
        deployments: list[SimDeployment],
        *,
        port: int = 0,
        otlp_endpoint: str = "",
        inspector_dir: str = "",
        tick_s: float = 0.25,
    ):
        self.epoch_s = time.time()
        self.tick_s = tick_s
        self.lock = threading.Lock()
        idir = Path(inspector_dir) if inspector_dir else None
        self.deployments = [DeploymentSim(d, self.epoch_s, otlp_endpoint, idir) for d in deployments]
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self._threads = [
            threading.Thread(target=self.httpd.serve_forever, daemon=True, name="sim-http"),
            threading.Thread(target=self._tick_loop, daemon=True, name="sim-tick"),
        ]
        for t in self._threads:
            t.start()

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.advance(time.time() - self.epoch_s)

    def advance(self, t: float) -> None:
        with self.lock:
            for d in self.deployments:
                d.advance(t)

    def stop(self) -> None:
        self._stop.set()
        if self._threads:  # shutdown() waits for serve_forever, which only runs once started
            self.httpd.shutdown()
        self.httpd.server_close()
        for d in self.deployments:
            d.close()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def targets(self) -> list[dict[str, Any]]:
        """Scrape targets for ``ioe sidecar`` (names unique, kinds set)."""
        out: list[dict[str, Any]] = []
        for d in self.deployments:
            out.append(
                {
                    "name": f"{d.spec.name}/vllm",
                    "url": self.url(f"/vllm/{d.spec.name}/metrics"),
                    "kind": "engine",
                }
            )
            out += [
                {"name": f"{h}/dcgm", "url": self.url(f"/dcgm/{h}/metrics"), "kind": "dcgm", "host": h}
                for h in d.hosts()
            ]
        return out

    def deployment_specs(self) -> list[dict[str, Any]]:
        """Declarations of the simulated deployments for the sidecar config."""
        return [
            {
                "name": d.spec.name,
                "model": d.spec.model,
                "gpu_type": d.spec.gpu,
                "engine": "vllm",
                "tp": d.spec.tp,
                "pp": d.spec.pp,
                "dp": d.spec.dp,
                "nodes": d.hosts(),
                "fabric": d.spec.fabric if d.spec.tp > d.spec.gpus_per_node else "nvlink4",
                "targets": [f"{d.spec.name}/vllm", *[f"{h}/dcgm" for h in d.hosts()]],
            }
            for d in self.deployments
        ]

    def body(self, path: str) -> tuple[int, bytes, float]:
        """(status, body, seconds to hang first) for a request path."""
        parts = path.strip("/").split("/")
        with self.lock:
            for d in self.deployments:
                if parts[:2] == ["vllm", d.spec.name]:
                    return 200, d.registry.exposition(), 0.0
                if len(parts) == 3 and parts[0] == "dcgm" and parts[1] in d.hosts():
                    f = d.spec.faults
                    if f.exporter_garbage:
                        return 200, GARBAGE, 0.0
                    body = dcgm.exposition([g for g in d.gpus if g.host == parts[1]])
                    return 200, body, 30.0 if f.exporter_hangs else 0.0
        return 404, b"not found\n", 0.0


def _handler(sim: Simulation) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body, hang = sim.body(self.path)
            if hang:
                sim._stop.wait(hang)
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler
