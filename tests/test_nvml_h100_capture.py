"""The NVML reader's numbers against what a real H100 did (capture: ``bench/gpu_counters.py``).

``tests/data/h100_nvml/capture.json.gz`` was recorded on an NVIDIA H100 80GB HBM3 (driver
580.159.04) while it ran known workloads one after another: idle, back-to-back BF16 GEMMs,
back-to-back 2 GiB device copies, pinned host→device copies, launches of a one-block kernel, idle.
The reader's rows are checked against figures measured independently in the same run (CUDA-event
timing of each workload, nvidia-smi sampling the same GPU) and against the catalog's peaks, and
the envelope rule is run on each phase's counters.
"""

from __future__ import annotations

import datetime as dt
import gzip
import itertools
import json
import statistics
from functools import cache
from typing import Any

import pytest

from analyzer import catalog
from analyzer.envelope import Signals, classify
from analyzer.thresholds import Thresholds
from tests.conftest import DATA

NS = 1_000_000_000
H100 = catalog.gpu("NVIDIA H100 80GB HBM3")
SETTLE_NS = NS  # GPM ratios span the previous read: skip each phase's first second


@cache
def capture() -> dict[str, Any]:
    with gzip.open(DATA / "h100_nvml" / "capture.json.gz") as f:
        return dict(json.load(f))


def phase(name: str) -> dict[str, Any]:
    return dict(capture()["phases"][name])


def values(name: str, metric: str) -> list[float]:
    p = phase(name)
    lo, hi = p["start_ns"] + SETTLE_NS, p["end_ns"]
    rows = capture()["reader_rows"]
    return [r["value"] for r in rows if r["metric"] == metric and r["link"] == -1 and lo <= r["ts_ns"] <= hi]


def median(name: str, metric: str) -> float:
    got = values(name, metric)
    assert len(got) >= 5, (name, metric, got)
    return statistics.median(got)


def test_capture_is_a_real_h100_read_without_problems() -> None:
    m = capture()["machine"]
    assert m["gpu_name"] == "NVIDIA H100 80GB HBM3" and H100.name == "h100_sxm"
    assert capture()["reader_problems"] == []
    assert {r["source"] for r in capture()["reader_rows"]} == {"nvml"}


def test_dram_ratio_times_peak_hbm_bandwidth_is_what_the_copy_moved() -> None:
    # DRAM_BW_UTIL is a share of the 3.35 TB/s peak: 0.90 × 3.35 TB/s = the 3.02 TB/s measured.
    moved = phase("memory")["bytes_per_s"]
    assert median("memory", "dram_active_ratio") * H100.hbm_bytes_per_s == pytest.approx(moved, rel=0.03)
    assert median("memory", "tensor_active_ratio") < 0.01


def test_tensor_ratio_is_achieved_flops_over_the_peak_at_the_clock_held() -> None:
    # The 989 TFLOP/s BF16 peak is 132 SMs × 4096 FLOP/clock at 1830 MHz; under the 700 W cap
    # the GEMMs ran near 1400 MHz, so the peak they could reach scales with the clock.
    clock_hz = statistics.mean(values("compute", "sm_clock_mhz")) * 1e6
    peak_at_clock = H100.peak_flops("bf16") * clock_hz / 1830e6
    achieved = phase("compute")["tflops"] * 1e12
    assert median("compute", "tensor_active_ratio") == pytest.approx(achieved / peak_at_clock, abs=0.05)
    assert median("compute", "dram_active_ratio") < 0.4


def test_gemms_hit_the_power_cap_and_the_event_reasons_say_so() -> None:
    limit = capture()["machine"]["power_limit_w"]
    assert median("compute", "power_w") >= 0.97 * limit
    masks = [int(v) for v in values("compute", "throttle_reasons_mask")]
    assert sum(m & 0x4 for m in masks) / 4 >= 0.8 * len(masks)  # 0x4: software power cap
    assert median("compute", "sm_clock_mhz") < capture()["machine"]["max_sm_clock_mhz"]
    # the copy draws less power and keeps the full clock
    assert median("memory", "sm_clock_mhz") == capture()["machine"]["max_sm_clock_mhz"]
    assert int(median("idle", "throttle_reasons_mask")) & 0x1  # 0x1: GPU idle


def test_energy_counter_matches_integrated_power() -> None:
    rows = sorted(
        (r["ts_ns"], r["metric"], r["value"])
        for r in capture()["reader_rows"]
        if r["metric"] in ("power_w", "energy_j")
    )
    power = [(t, v) for t, m, v in rows if m == "power_w"]
    energy = [(t, v) for t, m, v in rows if m == "energy_j"]
    integral = sum((t1 - t0) / NS * (p0 + p1) / 2 for (t0, p0), (t1, p1) in itertools.pairwise(power))
    assert energy[-1][1] - energy[0][1] == pytest.approx(integral, rel=0.05)
    assert all(b >= a for (_, a), (_, b) in itertools.pairwise(energy))


def test_gpu_util_is_not_sm_activity() -> None:
    # One-block kernels back to back: "utilization" says busy, the SMs are idle.
    assert median("tiny", "gpu_util_ratio") > 0.2
    assert median("tiny", "sm_active_ratio") < 0.01


def test_pcie_rx_counts_the_host_to_device_copy() -> None:
    # GPM PCIE_RX_PER_SEC (MiB/s) × 2**20 reads about 10 % above the payload the copy moved.
    ratio = median("h2d", "pcie_rx_bytes_per_s") / phase("h2d")["bytes_per_s"]
    assert 1.0 <= ratio <= 1.2
    assert median("compute", "pcie_rx_bytes_per_s") < 0.01 * phase("h2d")["bytes_per_s"]


def test_memory_used_leaves_the_driver_reservation_out_like_nvidia_smi() -> None:
    m = capture()["machine"]
    assert m["memory_v1"]["used"] == m["memory_v2"]["reserved"] == 480 * 2**20
    assert median("idle", "fb_used_bytes") == 0
    assert median("idle", "fb_reserved_bytes") == 480 * 2**20
    # the two 2 GiB copy buffers show up in used memory
    grown = median("memory", "fb_used_bytes") - median("compute", "fb_used_bytes")
    assert grown >= 2 * phase("memory")["buffer_bytes"] - 3 * 8192 * 8192 * 2


def _smi(name: str, column: int) -> float:
    p = phase(name)
    got = []
    for line in capture()["nvidia_smi"]:
        cells = [c.strip() for c in line.split(",")]
        when = dt.datetime.strptime(cells[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=dt.UTC)
        ts = int(when.timestamp() * NS)
        if p["start_ns"] + SETTLE_NS <= ts <= p["end_ns"]:
            got.append(float(cells[column]))
    assert len(got) >= 5, name
    return statistics.median(got)


@pytest.mark.parametrize("name", ["idle", "compute", "memory", "tiny"])
def test_nvidia_smi_agrees_on_power_and_clock(name: str) -> None:
    assert _smi(name, 1) == pytest.approx(median(name, "power_w"), rel=0.05)
    assert _smi(name, 2) == pytest.approx(median(name, "sm_clock_mhz"), rel=0.05)


# The capture holds GPU counters only: with no engine series nothing shows whether requests
# queue, so an idle GPU alone is "unknown", not headroom. Given an engine that shows one request
# running and none waiting (the capture's own loop ran one stream at a time), it is headroom.
QUIET_ENGINE = {"requests_running": 1.0, "requests_waiting": 0.0, "kv_usage_ratio": 0.01}


@pytest.mark.parametrize(
    ("name", "engine", "zone"),
    [
        ("compute", False, "compute"),
        ("memory", False, "hbm_bandwidth"),
        ("idle", False, "unknown"),
        ("tiny", False, "unknown"),
        ("idle", True, "headroom"),
        ("tiny", True, "headroom"),
    ],
)
def test_envelope_rule_names_each_phase_wall(name: str, engine: bool, zone: str) -> None:
    gpu = {m: median(name, m) for m in ("sm_active_ratio", "tensor_active_ratio", "dram_active_ratio")}
    p = phase(name)
    sig = Signals(gpu=gpu, engine=dict(QUIET_ENGINE) if engine else {})
    v = classify(sig, Thresholds(), name, p["start_ns"], p["end_ns"])
    assert v.primary == zone
    assert v.secondary is None  # a copy's busy SMs are no compute evidence; an idle GPU no HBM one
