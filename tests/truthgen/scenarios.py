"""The truth set: deployments with the verdict an expert gives them and why.

Notes:

1. A scenario is its parameters (model, GPU, engines and the GPUs each runs on, fabrics, traffic
   phases) plus :class:`Expected`: the zone (compute | hbm_bandwidth | kv_capacity | network |
   headroom | unknown | saturated), whether a network wall crosses nodes, per-window zones for a
   deployment that moves, the evidence that is missing, and the reason in an SRE's words.
2. Engines get GPUs ``(host, index)``; a TP group inside one host talks over NVLink 4, a group over
   two hosts over the scenario's inter-node fabric (its slowest hop).
3. Every scenario is deterministic (its ``seed``), 10 minutes of 10 s scrapes unless it says other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from truthgen.physics import (
    ETH_100G,
    H100_SXM,
    IB_NDR,
    LLAMA_8B,
    LLAMA_70B,
    NVLINK4,
    QWEN3_235B,
    Fabric,
    Gpu,
    Model,
    kv_capacity_tokens,
)

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
ZONES = ("compute", "hbm_bandwidth", "kv_capacity", "network", "headroom", "unknown", "saturated")
# a 25 GbE front-end NIC (3.125 GB/s): what NIXL falls back to over TCP when RDMA is not configured
ETH_25G = Fabric("eth_25g", 3.125e9, 30e-6, 20e-6, True)


@dataclass(frozen=True)
class Phase:
    """Traffic from ``start_s`` to ``end_s`` (seconds into the capture): arrivals ramp linearly."""

    start_s: float
    end_s: float
    arrival_start: float  # requests/s offered to the whole deployment
    arrival_end: float
    isl: int
    osl: int

    def arrival_at(self, t: float) -> float:
        f = (t - self.start_s) / max(self.end_s - self.start_s, 1e-9)
        return self.arrival_start + (self.arrival_end - self.arrival_start) * min(max(f, 0.0), 1.0)


@dataclass(frozen=True)
class EngineSpec:
    """One vLLM engine (a DP rank or a P/D role) and the GPUs its TP group runs on."""

    server: str  # the API server whose /metrics shows it (one file per server)
    engine_label: int
    gpus: tuple[tuple[str, int], ...]
    role: str = "both"  # both | prefill | decode

    @property
    def tp(self) -> int:
        return len(self.gpus)

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(sorted({h for h, _ in self.gpus}))


@dataclass(frozen=True)
class Window:
    start_s: float
    end_s: float
    zone: str


@dataclass(frozen=True)
class Expected:
    zone: str
    reason: str
    cross_node: bool | None = None  # for network: does the wall cross nodes
    windows: tuple[Window, ...] = ()
    missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    model: Model
    engines: tuple[EngineSpec, ...]
    phases: tuple[Phase, ...]
    expected: Expected
    gpu: Gpu = H100_SXM
    ep: int = 1
    inter_fabric: Fabric | None = None
    kv_link: Fabric | None = None  # P/D: the link the KV cache crosses
    max_num_seqs: int = 256
    profiling: bool = True
    seed: int = 1
    scrape_s: float = 10.0
    duration_s: float = 600.0
    load_noise: float = 0.04
    t0: float = T0
    notes: tuple[str, ...] = field(default_factory=tuple)

    # -- structure
    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({h for e in self.engines for h, _ in e.gpus}))

    def phase_at(self, t: float) -> Phase:
        for ph in self.phases:
            if ph.start_s <= t < ph.end_s:
                return ph
        return self.phases[-1]

    def engines_serving(self, role: str) -> int:
        return sum(1 for e in self.engines if e.role == role)

    def tp_fabric(self, spec: EngineSpec) -> Fabric | None:
        if spec.tp <= 1:
            return None
        return (self.inter_fabric or IB_NDR) if len(spec.hosts) > 1 else NVLINK4

    def ep_fabric(self) -> Fabric | None:
        if self.ep <= 1:
            return None
        return (self.inter_fabric or IB_NDR) if len(self.nodes) > 1 else NVLINK4

    def tp_jitter(self, spec: EngineSpec) -> float:
        return _fabric_sigma(self.tp_fabric(spec))

    def ep_jitter(self) -> float:
        return _fabric_sigma(self.ep_fabric())

    @property
    def itl_sigma(self) -> float:
        """Spread of per-step ITL: chunked-prefill steps are longer than decode-only ones (0.25);
        a token loop that waits on a cross-node link adds that link's jitter."""
        worst = max([self.tp_jitter(e) for e in self.engines] + [self.ep_jitter()])
        return 0.25 + (worst if worst > 0.1 else 0.0)

    def kv_pool_tokens(self, spec: EngineSpec) -> float:
        return kv_capacity_tokens(self.model, self.gpu, spec.tp, self.ep)

    def kv_transfer(self, t: float) -> tuple[float, float, float]:
        """P/D: (requests waiting on KV, seconds each waits, PCIe bytes/s per GPU) from an M/D/1 link.

        Service = KV bytes per request (KV bytes/token × ISL) ÷ link bandwidth; wait = ρ/(2(1−ρ)) ×
        service (Pollaczek-Khinchine with deterministic service); in transfer = λ × (service + wait).
        """
        if self.kv_link is None:
            return 0.0, 0.0, 0.0
        ph = self.phase_at(t)
        lam = ph.arrival_at(t)
        nbytes = self.model.kv_bytes_per_token() * ph.isl
        service = nbytes / self.kv_link.bw
        rho = min(lam * service, 0.97)
        wait = rho / (2 * (1 - rho)) * service
        per_gpu = lam * nbytes / max(self.engines[0].tp, 1)
        return lam * (service + wait), service + wait, per_gpu

    # -- outputs
    def deployment_yaml(self) -> str:
        """The ``deployments:`` block of an IOE config file (ioe/settings.py DeploymentSpec)."""
        roles = {e.role: 0 for e in self.engines if e.role != "both"}
        for e in self.engines:
            if e.role != "both":
                roles[e.role] += 1
        fabric = (self.inter_fabric or self.kv_link or NVLINK4).name if len(self.nodes) > 1 else NVLINK4.name
        lines = [
            "deployments:",
            f"  - name: {self.name}",
            f"    model: {self.model.name}",
            f"    gpu_type: {self.gpu.name}",
            "    engine: vllm",
            f"    tp: {self.engines[0].tp}",
            "    pp: 1",
            f"    dp: {len(self.engines) if not roles else 1}",
            f"    ep: {self.ep}",
            f"    roles: {{{', '.join(f'{k}: {v}' for k, v in roles.items())}}}",
            f"    nodes: [{', '.join(self.nodes)}]",
            f"    fabric: {fabric}",
        ]
        return "\n".join(lines) + "\n"

    def expected_json(self) -> dict[str, Any]:
        x = self.expected
        return {
            "scenario": self.name,
            "title": self.title,
            "zone": x.zone,
            "cross_node": x.cross_node,
            "windows": [{"start_s": w.start_s, "end_s": w.end_s, "zone": w.zone} for w in x.windows],
            "missing": list(x.missing),
            "reason": x.reason,
            "capture": {"start_s": self.t0, "end_s": self.t0 + self.duration_s, "scrape_s": self.scrape_s},
        }

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model.name,
            "gpu": self.gpu.name,
            "engines": [
                {"server": e.server, "engine": e.engine_label, "role": e.role, "gpus": list(e.gpus)}
                for e in self.engines
            ],
            "ep": self.ep,
            "inter_fabric": self.inter_fabric.name if self.inter_fabric else None,
            "kv_link": self.kv_link.name if self.kv_link else None,
            "phases": [vars(p) for p in self.phases],
            "max_num_seqs": self.max_num_seqs,
            "profiling": self.profiling,
            "seed": self.seed,
            "notes": list(self.notes),
        }


def _fabric_sigma(f: Fabric | None) -> float:
    if f is None:
        return 0.0
    return {"nvlink4": 0.08, "ib_ndr": 0.15}.get(f.name, 0.4)


def _gpus(host: str, n: int, first: int = 0) -> tuple[tuple[str, int], ...]:
    return tuple((host, first + i) for i in range(n))


def _one(tp: int, host: str = "node-a") -> tuple[EngineSpec, ...]:
    return (EngineSpec("node-a", 0, _gpus(host, tp)),)


def _steady(rate: float, isl: int, osl: int, end: float = 600.0) -> tuple[Phase, ...]:
    return (Phase(0.0, end, rate, rate, isl, osl),)


def _two_node_tp16() -> tuple[EngineSpec, ...]:
    return (EngineSpec("node-a", 0, _gpus("node-a", 8) + _gpus("node-b", 8)),)


def build_all() -> dict[str, Scenario]:
    """Every scenario of the truth set, by name."""
    from truthgen.catalog import SCENARIOS

    return {s.name: s for s in SCENARIOS}


def check(sc: Scenario) -> None:
    """Refuse a scenario whose expectation is not one of :data:`ZONES` (a typo would pass silently)."""
    zones = [sc.expected.zone, *(w.zone for w in sc.expected.windows)]
    bad = [z for z in zones if z not in ZONES]
    if bad:
        raise ValueError(f"scenario {sc.name}: unknown zone(s) {bad}; expected one of {ZONES}")
    if not math.isfinite(sc.duration_s) or sc.duration_s <= 0:
        raise ValueError(f"scenario {sc.name}: duration_s must be positive")


__all__ = [
    "ETH_25G",
    "ETH_100G",
    "IB_NDR",
    "LLAMA_8B",
    "LLAMA_70B",
    "QWEN3_235B",
    "EngineSpec",
    "Expected",
    "Phase",
    "Scenario",
    "Window",
    "build_all",
    "check",
]
