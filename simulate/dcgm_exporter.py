"""The simulated nodes' dcgm-exporter ``/metrics``: real field names, labels, units and quirks.

Activity fields are what the GPU's steps did over the last interval (:mod:`simulate.activity`:
FLOPs over tensor peak, bytes over HBM bandwidth, kernel and collective time, idle gaps).
The rest, field by field:

1. ``NVLINK_BANDWIDTH_TOTAL`` (field 449) is exported as dcgm-exporter does: a MB/s rate of both
   directions, typed ``counter``. Inter-node traffic leaves through the NIC (GPUDirect RDMA),
   so it is PCIe bytes.
2. Frame buffer: vLLM preallocates 90 % of HBM, so ``FB_USED`` is flat whatever the load (MiB).
3. Power: the interval's energy ÷ its length (idle + what the steps drew), never above the
   enforced limit; ``POWER_MGMT_LIMIT`` and ``ENFORCED_POWER_LIMIT`` read the GPU's limit (W):
   the board's TDP unless a fault lowered it. ``TOTAL_ENERGY_CONSUMPTION`` is mJ since start.
4. Throttle reasons as the bitmask DCGM exports: ``SW_POWER_CAP`` 0x4 while the power limit held
   the clock in the interval, ``SW_THERMAL | HW_THERMAL`` (0x20 | 0x40) on a thermally throttled
   GPU (which also reads ~88 °C). ``POWER_VIOLATION`` / ``THERMAL_VIOLATION`` count the
   throttled time in ns, as DCGM does.
5. ``XID_ERRORS`` is the last XID code (a gauge, not a count): 0 until the fault, the code after.
6. ``NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL``, ``_CRC_DATA_``, ``_REPLAY_``, ``_RECOVERY_`` and
   ``PCIE_REPLAY_COUNTER`` are counters that rise on a GPU with link errors (flit CRC errors
   as injected; a data CRC error per four of them; a replay per two), 0 elsewhere.
7. ``SM_CLOCK``: nominal × the busy-time mean clock ratio (nominal while idle).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from simulate.activity import IDLE_W, Timeline

NOMINAL_SM_MHZ = 1980
MEM_MHZ = 2619
SW_POWER_CAP = 0x4
THERMAL_THROTTLE_MASK = 0x20 | 0x40
DRIVER = "580.105.08"
WINDOW_S = 1.0  # the exporter's collect interval the activity fields average over

# (field, type, help, value key)
FIELDS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Power management limit (in W)."),
    ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "gauge", "Current enforced power limit (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Current clock throttle reasons."),
    ("DCGM_FI_DEV_POWER_VIOLATION", "counter", "Throttling duration due to power constraints (in ns)."),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Throttling duration due to thermal constraints (in ns)."),
    (
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink flow-control CRC errors.",
    ),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink data CRC errors."),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries."),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink recovery errors."),
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
    """One simulated GPU's identity, its fault state and its step timeline."""

    host: str
    index: int
    model_name: str
    hbm_mib: int
    pod: str = ""
    clock_ratio: float = 1.0  # < 1: thermally throttled
    tdp_w: float = 700.0
    power_limit_w: float = 0.0  # 0: the TDP
    xid: int = 0
    xid_at_s: float = -1.0
    timeline: Timeline = field(default_factory=Timeline)
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


def update(gpu: GpuState, t: float, window_s: float = WINDOW_S) -> None:
    """Set ``gpu.values`` at simulated time ``t`` (rules 1-7)."""
    w, total = gpu.timeline.sample(t, min(window_s, max(t, 1e-3)))
    thermal = gpu.clock_ratio < 1.0
    limit = gpu.power_limit_w or gpu.tdp_w
    power = min(w.power_w, limit)
    flits = total["nvlink_errors"]
    mask = (THERMAL_THROTTLE_MASK if thermal else 0) | (SW_POWER_CAP if w.capped > 0 else 0)
    hot = round(32 + 40 * (power - IDLE_W) / (gpu.tdp_w - IDLE_W))
    gpu.values = {
        "DCGM_FI_DEV_SM_CLOCK": round(NOMINAL_SM_MHZ * w.clock_ratio),
        "DCGM_FI_DEV_MEM_CLOCK": MEM_MHZ,
        "DCGM_FI_DEV_GPU_TEMP": 88 if thermal else hot,
        "DCGM_FI_DEV_MEMORY_TEMP": 80 if thermal else round(35 + 30 * w.dram),
        "DCGM_FI_DEV_POWER_USAGE": power,
        "DCGM_FI_DEV_POWER_MGMT_LIMIT": limit,
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": limit,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": round((IDLE_W * t + total["energy_j"]) * 1000),
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": round(total["pcie_replays"]),
        "DCGM_FI_DEV_GPU_UTIL": round(100 * w.util),
        "DCGM_FI_DEV_MEM_COPY_UTIL": round(100 * w.dram),
        "DCGM_FI_DEV_FB_FREE": round(gpu.hbm_mib * 0.1) - 512,
        "DCGM_FI_DEV_FB_USED": round(gpu.hbm_mib * 0.9),
        "DCGM_FI_DEV_XID_ERRORS": gpu.xid if 0 <= gpu.xid_at_s <= t else 0,
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": mask,
        "DCGM_FI_DEV_POWER_VIOLATION": round(total["capped_s"] * 1e9),
        "DCGM_FI_DEV_THERMAL_VIOLATION": round(total["thermal_s"] * 1e9),
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": round(flits),
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": round(flits / 4),
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": round(flits / 2),
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 0,
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": round(2 * w.nvlink_bytes_per_s / 1e6),
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": w.gr_active,
        "DCGM_FI_PROF_SM_ACTIVE": w.sm_active,
        "DCGM_FI_PROF_SM_OCCUPANCY": w.sm_occupancy,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": w.tensor,
        "DCGM_FI_PROF_DRAM_ACTIVE": w.dram,
        "DCGM_FI_PROF_PCIE_TX_BYTES": round(w.nic_bytes_per_s + w.pcie_tx_bytes_per_s + 2e6 * w.util),
        "DCGM_FI_PROF_PCIE_RX_BYTES": round(w.nic_bytes_per_s + w.pcie_rx_bytes_per_s + 1e6 * w.util),
        "DCGM_FI_PROF_NVLINK_TX_BYTES": round(w.nvlink_bytes_per_s),
        "DCGM_FI_PROF_NVLINK_RX_BYTES": round(w.nvlink_bytes_per_s),
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
