"""Hardware catalog: GPUs and the links between them, with the source of every number.

Figures are *dense* (no 2:4 sparsity) tensor throughput per GPU and one-way bandwidth per GPU,
because a transfer of N bytes between two GPUs takes N / one-way bandwidth. Vendors quote NVLink
"bidirectional"; the catalog stores the one-way half next to the quoted figure.

Sources (named next to each entry):
  [H100]  NVIDIA H100 Tensor Core GPU datasheet (SXM5 and PCIe columns).
  [H200]  NVIDIA H200 Tensor Core GPU datasheet (SXM column).
  [B200]  NVIDIA DGX B200 / HGX B200 datasheets (per-GPU = system / 8).
  [GB200] NVIDIA GB200 NVL72 datasheet (per-GPU = rack / 72).
  [A100]  NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB column).
  [MI300X] AMD Instinct MI300X data sheet.
  [REF5]  the project's REFERENCE §5 table (seeds' figures, incl. measured H100 NVLink all-reduce ≈ 37 µs).
  [IB]    NVIDIA ConnectX-7 (NDR 400 Gb/s) and ConnectX-8 (XDR 800 Gb/s) product briefs.
  [PCIe]  PCI-SIG base specifications 4.0 / 5.0 (x16 raw rate, 128b/130b encoding).

Notes:
  1. Latency is the fixed cost of one collective or transfer on that link as seen by an engine
     (launch + synchronization + wire), not the physical hop latency; it is an estimate and says so.
  2. Lookup is forgiving: ``"NVIDIA H100 80GB HBM3"`` (DCGM modelName), ``"h100_sxm"`` (the
     calibration CSV's ``system`` column), ``"H100-SXM5-80GB"`` all resolve to ``h100_sxm``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GB = 1e9
TB = 1e12
T = 1e12  # TFLOP/s
US = 1e-6


@dataclass(frozen=True)
class Fabric:
    """A link class: one-way bandwidth per GPU (bytes/s) and per-operation latency (s)."""

    name: str
    bytes_per_s: float
    latency_s: float
    rdma: bool
    source: str


@dataclass(frozen=True)
class Gpu:
    """One accelerator: memory, dense peak throughput per precision, and its scale-up domain."""

    name: str
    hbm_bytes: float
    hbm_bytes_per_s: float
    flops: dict[str, float]  # precision -> dense FLOP/s; absent = unsupported natively
    scale_up: str  # fabric name inside the scale-up (NVLink) domain
    domain_gpus: int  # GPUs in one scale-up domain (8 per HGX node, 72 per NVL72 rack)
    source: str

    def peak_flops(self, precision: str) -> float:
        """Dense peak for ``precision``; a precision the GPU lacks runs at the next wider one.

        1. fp4 falls back to fp8, fp8 falls back to bf16 (weights are up-cast on the fly).
        """
        for p in _FALLBACK[precision]:
            if p in self.flops:
                return self.flops[p]
        raise KeyError(f"{self.name}: no throughput figure for {precision!r}")


_FALLBACK = {"fp4": ("fp4", "fp8", "bf16"), "fp8": ("fp8", "bf16"), "bf16": ("bf16",)}

FABRICS: dict[str, Fabric] = {
    f.name: f
    for f in (
        Fabric("nvlink3", 300 * GB, 12 * US, True, "[A100][REF5] 600 GB/s bidirectional per GPU"),
        Fabric("nvlink4", 450 * GB, 12 * US, True, "[H100][REF5] 900 GB/s bidirectional; AR ≈ 37 µs nccl"),
        Fabric("nvlink5", 900 * GB, 10 * US, True, "[B200][GB200][REF5] 1.8 TB/s bidirectional per GPU"),
        Fabric("nvlink_c2c", 450 * GB, 5 * US, True, "[REF5] NVLink-C2C 900 GB/s bidirectional (GH200)"),
        Fabric("infinity_fabric", 448 * GB, 15 * US, True, "[MI300X] 7 links x 128 GB/s bidirectional"),
        Fabric("pcie4", 32 * GB, 20 * US, False, "[PCIe] Gen4 x16 ~64 GB/s bidirectional"),
        Fabric("pcie5", 64 * GB, 20 * US, False, "[PCIe][REF5] Gen5 x16 ~128 GB/s bidirectional"),
        Fabric("ib_ndr", 50 * GB, 25 * US, True, "[IB][REF5] NDR 400 Gb/s per GPU NIC"),
        Fabric("ib_xdr", 100 * GB, 25 * US, True, "[IB] XDR 800 Gb/s per GPU NIC"),
        Fabric("roce_400g", 50 * GB, 35 * US, True, "[IB] RoCE v2 400 Gb/s per GPU NIC"),
        Fabric("eth_100g", 12.5 * GB, 60 * US, False, "[REF5] 100 GbE ~12 GB/s, TCP"),
        Fabric("upi", 35 * GB, 5 * US, False, "[REF5] QPI/UPI 30-40 GB/s theoretical"),
    )
}

GPUS: dict[str, Gpu] = {
    g.name: g
    for g in (
        Gpu("h100_sxm", 80 * GB, 3.35 * TB, {"bf16": 989 * T, "fp8": 1979 * T}, "nvlink4", 8, "[H100] SXM5"),
        Gpu("h100_pcie", 80 * GB, 2.0 * TB, {"bf16": 756 * T, "fp8": 1513 * T}, "pcie5", 8, "[H100] PCIe"),
        Gpu("h200_sxm", 141 * GB, 4.8 * TB, {"bf16": 989 * T, "fp8": 1979 * T}, "nvlink4", 8, "[H200] SXM"),
        Gpu(
            "b200_sxm",
            180 * GB,
            8.0 * TB,
            {"bf16": 2250 * T, "fp8": 4500 * T, "fp4": 9000 * T},
            "nvlink5",
            8,
            "[B200] DGX B200 1,440 GB / 8 (REF5 quotes ~192 GB HBM3e raw)",
        ),
        Gpu(
            "gb200",
            186 * GB,
            8.0 * TB,
            {"bf16": 2500 * T, "fp8": 5000 * T, "fp4": 10000 * T},
            "nvlink5",
            72,
            "[GB200] NVL72 13.4 TB HBM3e / 72; 72 GPUs in one NVLink domain",
        ),
        Gpu("a100_sxm", 80 * GB, 2.039 * TB, {"bf16": 312 * T}, "nvlink3", 8, "[A100] SXM4 80GB"),
        Gpu(
            "mi300x",
            192 * GB,
            5.3 * TB,
            {"bf16": 1307.4 * T, "fp8": 2614.9 * T},
            "infinity_fabric",
            8,
            "[MI300X][REF5]",
        ),
    )
}

# Ordered (pattern, canonical) pairs: first match wins, so more specific patterns come first.
# A family name must stand alone as a number: "h100_80gb" is an H100, "h1000" is not.
_GPU_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"gb200(?![0-9])|nvl72", "gb200"),
    (r"(?<![0-9])b200(?![0-9])", "b200_sxm"),
    (r"(?<![0-9])h200(?![0-9])", "h200_sxm"),
    (r"(?<![0-9])h100(?![0-9]).*(pcie|nvl\b)", "h100_pcie"),
    (r"(?<![0-9])(h100|h800)(?![0-9])", "h100_sxm"),
    (r"(?<![0-9])(a100|a800)(?![0-9])", "a100_sxm"),
    (r"(?<![0-9])mi300x?(?![0-9])", "mi300x"),
)

_FABRIC_ALIASES = {
    "nvlink": "nvlink4",
    "nvlink_3": "nvlink3",
    "nvlink_4": "nvlink4",
    "nvlink_5": "nvlink5",
    "c2c": "nvlink_c2c",
    "ib": "ib_ndr",
    "infiniband": "ib_ndr",
    "ndr": "ib_ndr",
    "infiniband_ndr": "ib_ndr",
    "infiniband_xdr": "ib_xdr",
    "xdr": "ib_xdr",
    "roce": "roce_400g",
    "ethernet": "eth_100g",
    "100gbe": "eth_100g",
    "pcie": "pcie5",
    "pcie_gen4": "pcie4",
    "pcie_gen5": "pcie5",
    "qpi": "upi",
}


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.strip().lower()).strip("_")


def gpu(name: str) -> Gpu:
    """The catalog GPU for a free-form name (catalog key, DCGM modelName, CSV ``system``).

    1. An exact catalog key wins. 2. Otherwise the first matching family pattern; the family's
       number must not run on into more digits (``h1000`` is not an H100).
    3. Unknown names raise ``KeyError`` quoting the name and listing the known ones.
    """
    key = _norm(name)
    if key in GPUS:
        return GPUS[key]
    for pattern, canonical in _GPU_PATTERNS:
        if re.search(pattern, key):
            return GPUS[canonical]
    raise KeyError(f"unknown GPU {name!r}; known: {', '.join(sorted(GPUS))}")


def fabric(name: str) -> Fabric:
    """The catalog fabric for a free-form name (``"IB NDR"``, ``"nvlink4"``, ``"RoCE"``)."""
    key = _norm(name)
    key = _FABRIC_ALIASES.get(key, key)
    if key in FABRICS:
        return FABRICS[key]
    raise KeyError(f"unknown fabric {name!r}; known: {', '.join(sorted(FABRICS))}")
