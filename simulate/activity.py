"""What each simulated GPU did, step by step, integrated over a DCGM sample interval.

One :class:`RankStep` per GPU per engine step says how the step's wall time split on that GPU:
host time (the CPU schedules and launches; the GPU idles), kernel time (the step's GEMMs,
attention, norms), waiting inside a collective for a later rank (NCCL kernels spinning), the
collectives' own transfer time, and a hang (after an XID the GPU is stuck). Its counters are
what that step did; :class:`Timeline` turns a GPU's steps into interval averages.

Rules (each activity is a fraction of the interval's cycles):

1. PIPE_TENSOR_ACTIVE: the step's FLOPs ÷ (dense peak at its precision × the SM clock ratio),
   the cycles the tensor pipes need at full rate (a real H100 GEMM at 679 TFLOP/s, 1395 MHz,
   read 0.935; this rule gives 0.97). Never more than the kernel time.
2. DRAM_ACTIVE: the step's HBM bytes ÷ HBM peak bandwidth (a real H100 copy at 3.02 of
   3.35 TB/s read 0.899). Never more than the kernel time. NCCL moves each wire byte through
   HBM twice (read to send, write on receive).
3. SM_ACTIVE: compute kernels keep warps on the SMs (0.96 during a GEMM, 0.99 during an HBM
   copy on the real H100: warps stalled on memory count) → :data:`SM_FILL` of kernel time;
   NCCL kernels, waiting or transferring, hold only their channels' SMs
   (:data:`NCCL_CHANNELS` of :data:`SMS`); host time and a hang add nothing.
4. GR_ENGINE_ACTIVE = kernel + collective time. GPU_UTIL also counts a hang: a kernel that never
   finishes keeps utilization at 100 % while the profiling fields read 0.
5. SM_OCCUPANCY: a GEMM keeps few warps resident (0.14 on the H100), an HBM stream many (0.80);
   the kernel time is split between the two by its tensor share.
6. Power = idle + (TDP − idle) × (0.206 × engine active + 0.337 × DRAM + 0.82 × tensor), shares
   fitted on the H100 capture (idle 72 W; a one-block kernel at 41 % utilization 125 W; an HBM
   copy 392 W; a GEMM at its 700 W limit). The efficiency the step model was fitted with
   already reflects a stock GPU's operating clock, so only a limit *below* stock throttles: when
   a step's demand exceeds it, the clock drops until it fits, with dynamic power ∝ f·V² and
   V ∝ f: ratio = ((limit − idle) ÷ (demand − idle))^(1/3). That time is power-violation time.
7. Link bytes: collective traffic inside a node is NVLink; traffic to other nodes (and a KV
   transfer) leaves through the NIC, which GPUDirect RDMA reads over PCIe.
8. A step's counters are spread evenly over its duration; a sample integrates the steps that
   overlap its interval, and time without a step is idle (no activity, idle power).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, fields

import numpy as np

SM_FILL = 0.96
SMS = 132
NCCL_CHANNELS = 16
NCCL_SM_SHARE = NCCL_CHANNELS / SMS
OCC_GEMM, OCC_STREAM = 0.14, 0.80
IDLE_W = 72.0
POWER_SHARES = (0.206, 0.337, 0.82)  # engine active, DRAM, tensor (rule 6)
KEEP_S = 2.0  # steps older than this are folded into the cumulative base


@dataclass(frozen=True)
class RankStep:
    """One GPU's share of one engine step (seconds, bytes, counts)."""

    seconds: float
    kernel_s: float = 0.0
    collective_s: float = 0.0  # waiting + transfer inside NCCL kernels
    hang_s: float = 0.0
    tensor_s: float = 0.0  # rule 1's tensor-busy seconds
    dram_s: float = 0.0  # rule 2's DRAM-busy seconds
    clock_s: float = 0.0  # SM clock ratio × (kernel + collective) seconds
    capped_s: float = 0.0  # time the power limit held the clock down (rule 6)
    thermal_s: float = 0.0  # time a thermal slowdown held the clock down
    energy_j: float = 0.0  # energy above idle
    nvlink_bytes: float = 0.0
    nic_bytes: float = 0.0  # both directions (collectives are symmetric)
    pcie_tx_bytes: float = 0.0  # one way only (a KV transfer leaving a prefill GPU)
    pcie_rx_bytes: float = 0.0  # one way only (a KV transfer reaching a decode GPU)
    nvlink_errors: float = 0.0
    pcie_replays: float = 0.0


_FIELDS = tuple(f.name for f in fields(RankStep))
_IDX = {n: i for i, n in enumerate(_FIELDS)}


def demand_w(tdp_w: float, active: float, dram: float, tensor: float) -> float:
    """Rule 6's power draw at the nominal clock for activity fractions of the time."""
    a, d, t = POWER_SHARES
    return IDLE_W + (tdp_w - IDLE_W) * (a * active + d * dram + t * tensor)


def power_clock_ratio(limit_w: float, demand: float) -> float:
    """Rule 6: the clock ratio at which ``demand`` (drawn at nominal clock) fits ``limit_w``."""
    if demand <= limit_w or demand <= IDLE_W:
        return 1.0
    return max((limit_w - IDLE_W) / (demand - IDLE_W), 0.05) ** (1 / 3)


@dataclass(frozen=True)
class Sample:
    """A GPU's activity over one interval (rules 1-5, 7): fractions, watts, bytes/s."""

    seconds: float
    gr_active: float
    util: float
    sm_active: float
    sm_occupancy: float
    tensor: float
    dram: float
    power_w: float
    clock_ratio: float
    capped: float  # share of the interval under the power limit
    thermal: float
    nvlink_bytes_per_s: float
    nic_bytes_per_s: float
    pcie_tx_bytes_per_s: float
    pcie_rx_bytes_per_s: float


class Timeline:
    """One GPU's steps (start, end, counters) and their integrals (rule 8)."""

    def __init__(self) -> None:
        self.segments: deque[tuple[float, float, tuple[float, ...]]] = deque()
        self.base = np.zeros(len(_FIELDS))

    def add(self, start: float, step: RankStep) -> None:
        vals = tuple(getattr(step, n) for n in _FIELDS)
        self.segments.append((start, start + max(step.seconds, 1e-9), vals))

    def _fold(self, t: float) -> None:
        old = []
        while self.segments and self.segments[0][1] < t - KEEP_S:
            old.append(self.segments.popleft()[2])
        if old:
            self.base += np.asarray(old).sum(axis=0)

    def _integrals(self, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray]:
        """Counters of the steps inside [t0, t1] and of those before t1, each pro rata of its overlap."""
        if not self.segments:
            return np.zeros(len(_FIELDS)), np.zeros(len(_FIELDS))
        n = len(self.segments)
        starts = np.fromiter((s[0] for s in self.segments), float, n)
        ends = np.fromiter((s[1] for s in self.segments), float, n)
        vals = np.array([s[2] for s in self.segments])
        span = ends - starts
        window = np.clip(np.minimum(ends, t1) - np.maximum(starts, t0), 0.0, None) / span
        before = np.clip(np.minimum(ends, t1) - starts, 0.0, None) / span
        return window @ vals, before @ vals

    def sample(self, t: float, window_s: float) -> tuple[Sample, dict[str, float]]:
        """Rules 1-5 and 7 over ``[t − window_s, t]``, and the cumulative counters at ``t``
        (energy above idle, error counts, throttled seconds)."""
        self._fold(t)
        w = max(window_s, 1e-9)
        v, past = self._integrals(t - w, t)
        total = self.base + past

        def frac(name: str) -> float:
            return min(float(v[_IDX[name]]) / w, 1.0)

        kernel, coll, hang = frac("kernel_s"), frac("collective_s"), frac("hang_s")
        tensor = min(frac("tensor_s"), kernel)
        dram = min(frac("dram_s"), kernel + coll)
        tensor_share = tensor / kernel if kernel > 0 else 0.0
        occ = kernel * (OCC_GEMM * tensor_share + OCC_STREAM * (1 - tensor_share))
        busy_clock = float(v[_IDX["kernel_s"]] + v[_IDX["collective_s"]])
        ratio = float(v[_IDX["clock_s"]]) / busy_clock if busy_clock > 0 else 1.0
        sample = Sample(
            seconds=w,
            gr_active=min(kernel + coll, 1.0),
            util=min(kernel + coll + hang, 1.0),
            sm_active=min(SM_FILL * kernel + NCCL_SM_SHARE * coll, 1.0),
            sm_occupancy=min(occ + NCCL_SM_SHARE * 0.25 * coll, 1.0),
            tensor=tensor,
            dram=dram,
            power_w=IDLE_W + float(v[_IDX["energy_j"]]) / w,
            clock_ratio=min(ratio, 1.0),
            capped=frac("capped_s"),
            thermal=frac("thermal_s"),
            nvlink_bytes_per_s=float(v[_IDX["nvlink_bytes"]]) / w,
            nic_bytes_per_s=float(v[_IDX["nic_bytes"]]) / w,
            pcie_tx_bytes_per_s=float(v[_IDX["pcie_tx_bytes"]]) / w,
            pcie_rx_bytes_per_s=float(v[_IDX["pcie_rx_bytes"]]) / w,
        )
        return sample, {n: float(total[i]) for n, i in _IDX.items()}
