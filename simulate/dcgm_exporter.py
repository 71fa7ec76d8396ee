"""The simulated nodes' dcgm-exporter ``/metrics``: real field names, labels, units and quirks.

Counter values are derived from what the engine did in the last window (``window_s``):

1. ``PIPE_TENSOR_ACTIVE`` = 0.9 × the share of the window spent in compute-bound work (the
   model's compute roofline time): the pipes issue on most, not all, cycles of a GEMM.
2. ``DRAM_ACTIVE`` = 0.85 × the share of the window spent streaming HBM (the model's memory
   roofline time), which keeps it under the practical ceiling of ~0.8–0.9 (REFERENCE §1).
3. ``GR_ENGINE_ACTIVE`` = busy fraction. ``SM_ACTIVE`` weighs the busy time by what ran: 0.95
   in compute-bound steps (GEMMs fill every SM), 0.95 in memory-bound steps too (warps stalled on
   HBM count as active: a real H100 streaming a copy at 90 % of peak read SM 0.99, DRAM 0.90,
   tests/data/h100_nvml), 0.25 during all-reduces (NCCL runs on a
   few channels' SMs), 0.3 for the rest (launch gaps, sampling).
4. Intra-node TP traffic is NVLink bytes; traffic to other nodes leaves through the NIC and so
   is PCIe bytes. ``NVLINK_BANDWIDTH_TOTAL`` (field 449) is exported as dcgm-exporter does: a
   MB/s rate of both directions, typed ``counter``.
5. Frame buffer: vLLM preallocates 90 % of HBM, so ``FB_USED`` is flat whatever the load (MiB).
6. A throttled (straggler) GPU shows its SM clock × ratio, throttle reasons
   ``SW_THERMAL | HW_THERMAL`` (0x20 | 0x40), ~88 °C, and a growing thermal-violation counter.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

NOMINAL_SM_MHZ = 1980
MEM_MHZ = 2619
IDLE_W = 70.0
TDP_W = 700.0
THERMAL_THROTTLE_MASK = 0x20 | 0x40
DRIVER = "580.105.08"

# (field, type, help, value key)
FIELDS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Current clock throttle reasons."),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Throttling duration due to thermal constraints (in us)."),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
    ),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active."),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus."),
    ("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge", "The rate of data transmitted over NVLink."),
    ("DCGM_FI_PROF_NVLINK_RX_BYTES", "gauge", "The rate of data received over NVLink."),
)


@dataclass
class GpuState:
    """One simulated GPU's identity and its cumulative counters."""

    host: str
    index: int
    model_name: str
    hbm_mib: int
    pod: str = ""
    clock_ratio: float = 1.0
    energy_mj: float = 0.0
    thermal_violation_us: float = 0.0
    values: dict[str, float] = field(default_factory=dict)

    @property
    def uuid(self) -> str:
        h = hashlib.sha1(f"{self.host}/{self.index}".encode()).hexdigest()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"

    def labels(self) -> str:
        bus = f"00000000:{0x18 + 0x11 * self.index:02X}:00.0"
        parts = [
            f'gpu="{self.index}"',
            f'UUID="{self.uuid}"',
            f'pci_bus_id="{bus}"',
            f'device="nvidia{self.index}"',
            f'modelName="{self.model_name}"',
            f'Hostname="{self.host}"',
            f'DCGM_FI_DRIVER_VERSION="{DRIVER}"',
        ]
        if self.pod:
            parts += ['container="vllm"', 'namespace="inference"', f'pod="{self.pod}"']
        return "{" + ",".join(parts) + "}"


@dataclass(frozen=True)
class Window:
    """What the GPU did over the last ``seconds`` (deltas of the engine's activity)."""

    seconds: float
    busy_s: float
    compute_s: float
    hbm_s: float
    compute_bound_s: float
    memory_bound_s: float
    comm_s: float
    nvlink_bytes: float
    nic_bytes: float


def update(gpu: GpuState, w: Window) -> None:
    """Rules 1–6: set ``gpu.values`` for the window and advance its cumulative counters."""
    dt = max(w.seconds, 1e-9)
    busy = min(w.busy_s / dt, 1.0)
    rest = max(w.busy_s - w.compute_bound_s - w.memory_bound_s - w.comm_s, 0.0)
    sm = min((0.95 * w.compute_bound_s + 0.95 * w.memory_bound_s + 0.25 * w.comm_s + 0.3 * rest) / dt, 1.0)
    tensor = 0.9 * min(w.compute_s / dt, 1.0)
    dram = 0.85 * min(w.hbm_s / dt, 1.0)
    power = IDLE_W + (TDP_W - IDLE_W) * (0.3 * busy + 0.7 * max(tensor, dram))
    throttled = gpu.clock_ratio < 1.0
    gpu.energy_mj += power * dt * 1000
    if throttled:
        gpu.thermal_violation_us += dt * 1e6 * 0.8
    nv = w.nvlink_bytes / dt
    nic = w.nic_bytes / dt
    gpu.values = {
        "DCGM_FI_DEV_SM_CLOCK": round(NOMINAL_SM_MHZ * gpu.clock_ratio),
        "DCGM_FI_DEV_MEM_CLOCK": MEM_MHZ,
        "DCGM_FI_DEV_GPU_TEMP": 88 if throttled else round(32 + 40 * (power - IDLE_W) / (TDP_W - IDLE_W)),
        "DCGM_FI_DEV_MEMORY_TEMP": 80 if throttled else round(35 + 30 * dram),
        "DCGM_FI_DEV_POWER_USAGE": power,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": round(gpu.energy_mj),
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
        "DCGM_FI_DEV_GPU_UTIL": round(100 * busy),
        "DCGM_FI_DEV_MEM_COPY_UTIL": round(100 * dram),
        "DCGM_FI_DEV_FB_FREE": round(gpu.hbm_mib * 0.1) - 512,
        "DCGM_FI_DEV_FB_USED": round(gpu.hbm_mib * 0.9),
        "DCGM_FI_DEV_XID_ERRORS": 0,
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": THERMAL_THROTTLE_MASK if throttled else 0,
        "DCGM_FI_DEV_THERMAL_VIOLATION": round(gpu.thermal_violation_us),
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": round(2 * nv / 1e6),
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": busy,
        "DCGM_FI_PROF_SM_ACTIVE": sm,
        "DCGM_FI_PROF_SM_OCCUPANCY": 0.35 * sm,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": tensor,
        "DCGM_FI_PROF_DRAM_ACTIVE": dram,
        "DCGM_FI_PROF_PCIE_TX_BYTES": round(nic + 2e6 * busy),
        "DCGM_FI_PROF_PCIE_RX_BYTES": round(nic + 1e6 * busy),
        "DCGM_FI_PROF_NVLINK_TX_BYTES": round(nv),
        "DCGM_FI_PROF_NVLINK_RX_BYTES": round(nv),
    }


def exposition(gpus: list[GpuState]) -> bytes:
    """dcgm-exporter text: HELP/TYPE per field, then one line per GPU; floats with 6 decimals."""
    out: list[str] = []
    for name, typ, help_text in FIELDS:
        rows = [(g, g.values[name]) for g in gpus if name in g.values]
        if not rows:
            continue
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {typ}")
        for g, v in rows:
            text = f"{v:.6f}" if isinstance(v, float) else str(int(v))
            out.append(f"{name}{g.labels()} {text}")
    return ("\n".join(out) + "\n").encode()
