"""Simulated deployments served over HTTP on 127.0.0.1, advanced in real time.

Every ``tick_s`` the engines are advanced to the wall clock and each GPU's counters are set
from the steps it ran over the last second (:mod:`simulate.activity`). Endpoints (one server
for all):

* ``/dcgm/<host>/metrics`` — that node's dcgm-exporter (:mod:`simulate.dcgm_exporter`);
* ``/vllm/<deployment>/metrics`` — the deployment's vLLM ``/metrics`` (``engine`` = the
  engine's index: DP rank, or prefill engines first then decode engines).

Spans go to ``otlp_endpoint`` when given; NCCL Inspector logs to ``inspector_dir`` when given.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from analyzer.catalog import gpu as catalog_gpu
from analyzer.modelcfg import load as load_model
from simulate import dcgm_exporter as dcgm
from simulate.activity import RankStep
from simulate.emitters import InspectorWriter, SpanEmitter
from simulate.engine import EngineConfig, EngineSim, Finished, Request, StepCost
from simulate.spec import SimDeployment
from simulate.stepmodel import StepModel, kv_capacity_tokens, kv_transfer_s, step_model, tdp_w
from simulate.vllm_metrics import EngineMetrics, VllmRegistry
from simulate.workload import Arrival, load_trace, replay

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
    """Engine observer: forwards to the vLLM metrics, puts each step on its GPUs' timelines and
    writes sampled Inspector records."""

    def __init__(self, metrics: EngineMetrics, sim: DeploymentSim, engine_index: int):
        self.metrics, self.sim, self.index = metrics, sim, engine_index
        self.engine: EngineSim | None = None
        self._last_write = -1.0

    def step(self, cost: StepCost, decoding: int, prefill_tokens: int, itl_s: float) -> None:
        self.metrics.step(cost, decoding, prefill_tokens, itl_s)
        if self.engine is None:
            return
        start = self.engine.clock - cost.seconds
        for g, rank in zip(self.sim.engine_gpus(self.index), cost.ranks, strict=False):
            g.timeline.add(start, rank)
        writer = self.sim.inspectors.get(self.index)
        if writer is None or not cost.collectives:
            return
        if self.engine.clock - self._last_write < INSPECTOR_MIN_GAP_S:
            return
        self._last_write = self.engine.clock
        self.sim.write_collective(writer, start, cost)

    def first_token(self, req: Request, now: float) -> None:
        self.metrics.first_token(req, now)

    def finished(self, done: Finished) -> None:
        self.metrics.finished(done)

    def preempted(self) -> None:
        self.metrics.preempted()


class HandOff:
    """A decode engine's arrivals: requests whose KV a prefill engine has sent, by arrival time."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, Arrival]] = []
        self.n = 0

    def put(self, a: Arrival) -> None:
        self.n += 1
        heapq.heappush(self.heap, (a.t_s, self.n, a))

    def __iter__(self) -> HandOff:
        return self

    def __next__(self) -> Arrival:
        if not self.heap:
            raise StopIteration
        return heapq.heappop(self.heap)[2]


@dataclass
class DeploymentSim:
    """One deployment's engines (DP replicas, or prefill and decode engines) and their GPUs.

    Disaggregated prefill/decode (``spec.prefill`` > 0):
    1. Arrivals go round-robin to the prefill engines, each with one output token (vLLM's P/D
       proxy sends the prompt with ``max_tokens=1``).
    2. When a prefill finishes, its KV cache is sent to the next decode engine (round-robin) over
       ``kv_fabric``; transfers from one prefill engine's NICs go one after another, and
       congestion (a fault) divides the fabric's bandwidth as for collectives.
    3. The decode engine receives the request when the transfer ends, with its KV in place; the
       transfer's wire time and bytes go to its ``vllm:nixl_xfer_time_seconds`` and
       ``vllm:nixl_bytes_transferred`` when it is posted (before any wait for the link). Its TTFT
       runs from the request's arrival at the prefill engine. The prefill GPUs send the
       bytes (PCIe TX), the decode GPUs receive them (PCIe RX).
    """

    spec: SimDeployment
    epoch_s: float
    otlp_endpoint: str = ""
    inspector_dir: Path | None = None
    engines: list[EngineSim] = field(default_factory=list)
    gpus: list[dcgm.GpuState] = field(default_factory=list)
    inspectors: dict[int, InspectorWriter] = field(default_factory=dict)
    spans: SpanEmitter | None = None
    observers: list[EngineMetrics] = field(default_factory=list)
    handoffs: dict[int, HandOff] = field(default_factory=dict)

    def __post_init__(self) -> None:
        d = self.spec
        self.model: StepModel = step_model(d)
        self.layers = load_model(d.model).layers
        g = catalog_gpu(d.gpu)
        self.registry = VllmRegistry(_hf_name(d.model))
        if self.otlp_endpoint:
            self.spans = SpanEmitter(self.otlp_endpoint, d.name, self.registry.model_name, f"{d.name}-engine")
        self._link_free: dict[int, float] = {}
        self._osl: dict[int, dict[int, int]] = {}
        self._next_decode = 0
        self._build(g.hbm_bytes, tdp_w(g))

    def _arrivals(self, index: int, front: int) -> Iterator[Arrival]:
        """Each front-door engine takes every ``front``-th request of the trace (round-robin)."""
        d = self.spec

        def surge(t: float) -> float:
            f = d.faults
            return f.surge_multiplier if 0 <= f.surge_at_s <= t else 1.0

        stream = replay(load_trace(d.workload), speed=d.speed, rate_multiplier=surge, seed=d.seed,
                        max_isl=d.max_isl, poisson=d.poisson)  # fmt: skip
        mine = (a for i, a in enumerate(stream) if i % front == index)
        if d.role(index) != "prefill":
            return mine
        osl = self._osl.setdefault(index, {})

        def one_token() -> Iterator[Arrival]:
            for rid, a in enumerate(mine, start=1):  # the engine numbers its requests 1, 2, …
                osl[rid] = a.osl
                yield Arrival(a.t_s, a.isl, 1)

        return one_token()

    def _build(self, hbm_bytes: float, tdp: float) -> None:
        d = self.spec
        cfg = EngineConfig(kv_capacity_tokens=kv_capacity_tokens(d), max_num_seqs=d.max_num_seqs)
        front = d.prefill or d.dp
        for index in range(d.engines):
            role = d.role(index)
            if role == "decode":
                self.handoffs[index] = HandOff()
                arrivals: Iterator[Arrival] = self.handoffs[index]
            else:
                arrivals = self._arrivals(index, front)
            metrics = self.registry.observer(index, self._on_finish(index), receives_kv=role == "decode")
            tap = _Tap(metrics, self, index)
            model = step_model(replace(d, seed=d.seed * 1000 + index))
            engine = EngineSim(cfg, model, arrivals, tap)
            tap.engine = engine
            self.engines.append(engine)
            self.observers.append(metrics)
            ranks = d.gpu_indices(index)
            for rank, i in enumerate(ranks):
                f = d.faults
                self.gpus.append(
                    dcgm.GpuState(
                        d.host(i), i % d.gpus_per_node, _gpu_model_name(d.gpu), int(hbm_bytes / 2**20),
                        pod=f"{d.name}-{'engine' if role == 'both' else role}-{index}",
                        clock_ratio=f.straggler_clock_ratio if rank == f.straggler_gpu else 1.0,
                        tdp_w=tdp,
                        power_limit_w=f.power_limit_w if rank == f.power_limit_gpu else 0.0,
                        xid=f.xid if rank == f.xid_gpu else 0,
                        xid_at_s=f.xid_at_s if rank == f.xid_gpu else -1.0,
                    )
                )  # fmt: skip
            if self.inspector_dir is not None and d.per_engine > 1:
                comm = "0x" + hashlib.sha1(f"{d.name}/{index}".encode()).hexdigest()[:16]
                self.inspectors[index] = InspectorWriter(
                    self.inspector_dir, d.name, [d.host(i) for i in ranks], self.layers, comm_id=comm,
                    comm_name=f"{d.name}-{'ep' if d.ep > 1 else 'tp'}",
                )  # fmt: skip

    def engine_gpus(self, index: int) -> list[dcgm.GpuState]:
        per = self.spec.per_engine
        return self.gpus[index * per : (index + 1) * per]

    def _on_finish(self, index: int) -> Any:
        prefill = self.spec.role(index) == "prefill"

        def emit(done: Finished) -> None:
            if prefill:
                self._send_kv(index, done)
            elif self.spans is not None:
                self.spans.emit(done, self.epoch_s, index)

        return emit

    def _send_kv(self, index: int, done: Finished) -> None:
        """Rules 2-3: the prefilled request's KV goes to the next decode engine."""
        d = self.spec
        seconds, nbytes = kv_transfer_s(d, done.isl)
        seconds /= self.model.congestion(done.finish_s)
        start = max(done.finish_s, self._link_free.get(index, 0.0))
        end = start + seconds
        self._link_free[index] = end
        target = d.prefill + self._next_decode % d.dp
        self._next_decode += 1
        original = self._osl.get(index, {}).pop(done.rid, done.osl)
        self.handoffs[target].put(Arrival(end, done.isl, original, origin_s=done.arrival_s, kv_ready=True))
        self.observers[target].kv_transfer(seconds, nbytes)
        per_gpu = nbytes / d.per_engine
        for g in self.engine_gpus(index):
            g.timeline.add(start, RankStep(seconds=seconds, pcie_tx_bytes=per_gpu))
        for g in self.engine_gpus(target):
            g.timeline.add(start, RankStep(seconds=seconds, pcie_rx_bytes=per_gpu))

    def advance(self, t: float) -> None:
        # prefill engines first, so that the KV they send is waiting when the decode engines run
        for engine, obs in zip(self.engines, self.observers, strict=True):
            engine.advance(t)
            obs.gauges(
                len(engine.running), len(engine.waiting), engine.kv_used / engine.cfg.kv_capacity_tokens
            )
        for g in self.gpus:
            dcgm.update(g, t)

    def write_collective(self, writer: InspectorWriter, start_s: float, cost: StepCost) -> None:
        """The step's sampled collective call (emitters rules 1-2): each rank's arrival and the
        transfer, plus this call's own cross-node jitter."""
        c = cost.collectives[0]
        f = self.spec.faults
        jitter = self.model.rng.expovariate(1 / f.jitter_s) if f.jitter_s else 0.0
        crosses = self.spec.nodes > 1 and self.spec.per_engine > self.spec.gpus_per_node
        base = (self.epoch_s + start_s) * 1e6
        writer.write_step(
            base,
            [base + a * 1e6 for a in c.arrivals_s],
            (c.transfer_s + (jitter if crosses else 0.0)) * 1e6,
            c.msg_bytes,
            op=c.op,
            calls=c.calls,
        )

    def hosts(self) -> list[str]:
        return sorted({g.host for g in self.gpus})

    def close(self) -> None:
        for w in self.inspectors.values():
            w.close()
        if self.spans is not None:
            self.spans.close()


def _declaration(s: SimDeployment, hosts: list[str]) -> dict[str, Any]:
    """What an operator would declare: layout, roles, nodes and the fabric between them."""
    out: dict[str, Any] = {
        "name": s.name,
        "model": s.model,
        "gpu_type": s.gpu,
        "engine": "vllm",
        "tp": s.tp,
        "pp": s.pp,
        "dp": s.dp,
        "nodes": hosts,
        "fabric": s.fabric if s.per_engine > s.gpus_per_node else "nvlink4",
        "targets": [f"{s.name}/vllm", *[f"{h}/dcgm" for h in hosts]],
    }
    if s.ep > 1:
        out["ep"] = s.ep
    if s.prefill:
        out["roles"] = {"prefill": s.prefill, "decode": s.dp}
        out["fabric"] = s.kv_fabric or s.fabric
    return out


def _hf_name(model: str) -> str:
    names = {
        "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
        "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
        "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
        "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
        "mixtral-8x7b": "mistralai/Mixtral-8x7B-Instruct-v0.1",
        "deepseek-v3": "deepseek-ai/DeepSeek-V3",
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
        return [_declaration(d.spec, d.hosts()) for d in self.deployments]

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
