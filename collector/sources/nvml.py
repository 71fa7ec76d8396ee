"""GPU counters through NVML (PyPI ``nvidia-ml-py``, imported as ``pynvml``) → ``gpu_samples``.

For nodes without dcgm-exporter. The NVML module is a constructor parameter so tests pass a fake
object with the same functions; by default it is imported on first use, and a missing library
or GPU makes :meth:`NvmlReader.available` say so instead of raising.

Canonical metrics (the same names :mod:`collector.formats.dcgm` gives dcgm-exporter fields):

==============================  =============================================  ==================
metric                          NVML call                                      conversion
==============================  =============================================  ==================
``fb_used_bytes``/``_free_``    ``nvmlDeviceGetMemoryInfo_v2`` (v1 fallback)    bytes as given
``fb_reserved_bytes``           ``nvmlDeviceGetMemoryInfo_v2``                  bytes as given
``power_w``                     ``nvmlDeviceGetPowerUsage``                     mW / 1000
``energy_j``                    ``nvmlDeviceGetTotalEnergyConsumption``         mJ / 1000
``sm_clock_mhz``/``mem_clock_``  ``nvmlDeviceGetClockInfo``                     MHz
``gpu_temp_c``                  ``nvmlDeviceGetTemperature``                    °C
``throttle_reasons_mask``       ``nvmlDeviceGetCurrentClocksEventReasons``      bitmask (a code)
``pcie_link_gen_last``/``_width_``  ``nvmlDeviceGetCurrPcieLinkGeneration``/``Width``  as given (a code)
``power_limit_w``               ``nvmlDeviceGetPowerManagementLimit``           mW / 1000
``enforced_power_limit_w``      ``nvmlDeviceGetEnforcedPowerLimit``             mW / 1000
``pcie_max_link_gen_last``/wid  ``nvmlDeviceGetMaxPcieLinkGeneration``/``Width``  as given (a code)
``ecc_sbe_volatile_total``/dbe  ``nvmlDeviceGetTotalEccErrors`` (volatile)      count
``pcie_replay_total``           ``nvmlDeviceGetPcieReplayCounter``              count
``gpu_util_ratio``              ``nvmlDeviceGetUtilizationRates().gpu``         % / 100
``nvlink_tx_bytes_per_s``/rx    field values 138/139 per link (KiB, cumulative)  Δ×1024 / Δt
``sm_active_ratio`` etc.        GPM SM_UTIL / ANY_TENSOR_UTIL / DRAM_BW_UTIL    % / 100
``sm_occupancy_ratio``          GPM SM_OCCUPANCY                               % / 100
``gr_engine_active_ratio``      GPM GRAPHICS_UTIL                              % / 100
``pcie_tx_bytes_per_s``/rx      GPM PCIE_TX_PER_SEC / PCIE_RX_PER_SEC          MiB/s × 2**20
==============================  =============================================  ==================

Checked on a real H100 80GB HBM3 (driver 580.159.04, ``bench/gpu_counters.py``, capture in
``tests/data/h100_nvml``): DRAM_BW_UTIL × 3.35 TB/s matched the bytes/s a device-to-device copy
moved; ANY_TENSOR_UTIL tracked achieved BF16 TFLOP/s over the clock-scaled peak; the v1 memory
call counts the driver's reserved 480 MiB as used where nvidia-smi and DCGM's FB_USED do not,
hence v2.

Rules:

1. A call NVML answers with ``NVMLError`` (not supported on this GPU, MIG, permissions) drops
   that metric for that GPU silently; the rest of the GPU's metrics are kept.
2. NVLink: per-link rows carry ``link`` = the link index; a row with ``link = -1`` sums the links
   that had a rate. Rates need two reads: none on the first, and none for a link whose
   counter went down (reset) or when time did not move forward.
3. GPM (Hopper and newer) also needs two samples: the first read only takes a sample. GPUs
   without GPM support emit no GPM rows.
4. Every row has ``source='nvml'`` and the GPU's index, UUID and model name.
5. ``energy_j`` is read on the first read and then every ``energy_every`` reads (default 10):
   on a real H100 that one call took 6-7 of the 7.6 ms a read cost (bench/results/nvml.md), and
   a cumulative counter loses nothing by being sampled less often. The power limits, the
   maximum PCIe link, the volatile ECC counts and the PCIe replay counter (settings and
   counters the straggler causes compare) are read on the same reads; the current PCIe link
   generation and width on every read (the link trains down when idle). A binding without one
   of these functions skips that metric.
"""

from __future__ import annotations

import importlib
import math
import sys
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from collector.errors import Problem
from collector.formats import Parsed
from collector.records import batch

TABLE = "gpu_samples"
FI_NVLINK_TX_KIB = 138  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
FI_NVLINK_RX_KIB = 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS of older bindings; newer ones say 36
MIB = 1 << 20
# GPM metric id -> (canonical metric, multiplier): percentages → ratios, MiB/s → bytes/s
GPM_METRICS: dict[int, tuple[str, float]] = {
    1: ("gr_engine_active_ratio", 0.01),  # NVML_GPM_METRIC_GRAPHICS_UTIL
    2: ("sm_active_ratio", 0.01),  # SM_UTIL
    3: ("sm_occupancy_ratio", 0.01),  # SM_OCCUPANCY
    5: ("tensor_active_ratio", 0.01),  # ANY_TENSOR_UTIL
    10: ("dram_active_ratio", 0.01),  # DRAM_BW_UTIL
    20: ("pcie_tx_bytes_per_s", MIB),  # PCIE_TX_PER_SEC
    21: ("pcie_rx_bytes_per_s", MIB),  # PCIE_RX_PER_SEC
}
NVML_MEMORY_V2 = 0x02000028  # nvmlMemory_v2: sizeof(nvmlMemory_v2_t) | 2 << 24


@dataclass
class _GpuState:
    """What one GPU's rates need from the previous read."""

    nvlink: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    gpm_sample: Any = None


class NvmlReader:
    """Reads every GPU NVML sees; ``nvml`` is the ``pynvml`` module or a stand-in for tests."""

    name = "nvml"

    def __init__(self, nvml: ModuleType | Any | None = None, host: str = "", energy_every: int = 10):
        self._nvml = nvml
        self._imported = False  # whether this reader imported ``pynvml`` itself
        self.host = host
        self._started = False
        self._state: dict[str, _GpuState] = {}
        self.energy_every = max(1, energy_every)
        self._reads = 0

    def available(self) -> tuple[bool, str]:
        """(True, what was found) or (False, why not), never raising. A ``pynvml`` this reader
        imported and could not start (no library, no driver) is let go again (:meth:`_forget`)."""
        try:
            nvml = self._start()
            n = nvml.nvmlDeviceGetCount()
        except ImportError:
            return False, "nvidia-ml-py is not installed (pip install 'ioe[nvml]')"
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self._forget()
            return False, f"NVML cannot start: {exc}"
        if n == 0:
            return False, "NVML found no NVIDIA GPU"
        return True, f"NVML sees {n} GPU(s)"

    def close(self) -> None:
        if self._started and self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._started = False

    def read(self, ts_ns: int) -> Parsed:
        """One row per metric per GPU (and per NVLink link) at ``ts_ns``."""
        ok, why = self.available()
        if not ok:
            return Parsed(problems=[Problem("nvml", why)])
        nvml = self._start()
        self._reads += 1
        rows: list[dict[str, Any]] = []
        problems: list[Problem] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                rows.extend(self._gpu_rows(nvml, index, ts_ns))
            except Exception as exc:  # one broken GPU must not hide the others
                problems.append(Problem(f"nvml gpu {index}", f"read failed ({exc})"))
        parsed = Parsed(problems=problems)
        if rows:
            parsed.add(TABLE, batch(TABLE, rows))
        return parsed

    def _forget(self) -> None:
        """Drop the ``pynvml`` module this reader imported but could not start: on a node without
        NVML the collector never calls it, and its ~1 MB resident (a sidecar's budget is 100 MB,
        bench/results/sidecar.md round 10) goes once nothing refers to it. A module passed in
        is kept; the next :meth:`available` imports it again."""
        if self._imported and not self._started:
            self._nvml = None
            self._imported = False
            sys.modules.pop("pynvml", None)

    def _start(self) -> Any:
        if self._nvml is None:
            self._nvml = importlib.import_module("pynvml")
            self._imported = True
        if not self._started:
            self._nvml.nvmlInit()
            self._started = True
        return self._nvml

    def _gpu_rows(self, nvml: Any, index: int, ts_ns: int) -> list[dict[str, Any]]:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        ident = {
            "ts_ns": ts_ns,
            "host": self.host,
            "gpu": index,
            "uuid": uuid,
            "source": "nvml",
            "gpu_model": _text(_try(nvml, nvml.nvmlDeviceGetName, handle) or ""),
        }
        state = self._state.setdefault(uuid, _GpuState())
        energy = (self._reads - 1) % self.energy_every == 0  # rule 5
        values = [(m, -1, v) for m, v in _plain_metrics(nvml, handle, energy=energy)]
        values += _nvlink_rates(nvml, handle, state, ts_ns)
        values += _gpm_ratios(nvml, handle, state)
        return [{**ident, "metric": m, "link": link, "value": float(v)} for m, link, v in values]


def _try(nvml: Any, fn: Any, *args: Any) -> Any:
    """``fn(*args)``, or ``None`` when NVML answers NVMLError (rule 1)."""
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _plain_metrics(nvml: Any, h: Any, *, energy: bool = True) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    out += _memory(nvml, h)
    reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    single: list[tuple[str, Any, tuple[Any, ...], float]] = [
        ("power_w", nvml.nvmlDeviceGetPowerUsage, (h,), 1e-3),
        ("sm_clock_mhz", nvml.nvmlDeviceGetClockInfo, (h, nvml.NVML_CLOCK_SM), 1.0),
        ("mem_clock_mhz", nvml.nvmlDeviceGetClockInfo, (h, nvml.NVML_CLOCK_MEM), 1.0),
        ("gpu_temp_c", nvml.nvmlDeviceGetTemperature, (h, nvml.NVML_TEMPERATURE_GPU), 1.0),
    ]
    if reasons_fn is not None:
        single.append(("throttle_reasons_mask", reasons_fn, (h,), 1.0))
    if energy:
        single.append(("energy_j", nvml.nvmlDeviceGetTotalEnergyConsumption, (h,), 1e-3))
    single += _optional(nvml, h, _LINK + (_SLOW if energy else ()))
    for metric, fn, args, scale in single:
        value = _try(nvml, fn, *args)
        if value is not None:
            out.append((metric, value * scale))
    util = _try(nvml, nvml.nvmlDeviceGetUtilizationRates, h)
    if util is not None:
        out.append(("gpu_util_ratio", util.gpu / 100.0))
    return out


# (metric, NVML function, extra arguments as (constant name, default), scale): read when the
# binding has the function (rule 5).
_LINK: tuple[tuple[str, str, tuple[tuple[str, int], ...], float], ...] = (
    ("pcie_link_gen_last", "nvmlDeviceGetCurrPcieLinkGeneration", (), 1.0),
    ("pcie_link_width_last", "nvmlDeviceGetCurrPcieLinkWidth", (), 1.0),
)
_SLOW: tuple[tuple[str, str, tuple[tuple[str, int], ...], float], ...] = (
    ("power_limit_w", "nvmlDeviceGetPowerManagementLimit", (), 1e-3),
    ("enforced_power_limit_w", "nvmlDeviceGetEnforcedPowerLimit", (), 1e-3),
    ("pcie_max_link_gen_last", "nvmlDeviceGetMaxPcieLinkGeneration", (), 1.0),
    ("pcie_max_link_width_last", "nvmlDeviceGetMaxPcieLinkWidth", (), 1.0),
    ("pcie_replay_total", "nvmlDeviceGetPcieReplayCounter", (), 1.0),
    ("ecc_sbe_volatile_total", "nvmlDeviceGetTotalEccErrors",
     (("NVML_MEMORY_ERROR_TYPE_CORRECTED", 0), ("NVML_VOLATILE_ECC", 0)), 1.0),
    ("ecc_dbe_volatile_total", "nvmlDeviceGetTotalEccErrors",
     (("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1), ("NVML_VOLATILE_ECC", 0)), 1.0),
)  # fmt: skip


def _optional(
    nvml: Any, h: Any, table: tuple[tuple[str, str, tuple[tuple[str, int], ...], float], ...]
) -> list[tuple[str, Any, tuple[Any, ...], float]]:
    """The rows of ``table`` whose function this binding has, as ``(metric, fn, args, scale)``."""
    out = []
    for metric, name, consts, scale in table:
        fn = getattr(nvml, name, None)
        if fn is not None:
            out.append((metric, fn, (h, *(getattr(nvml, c, d) for c, d in consts)), scale))
    return out


def _memory(nvml: Any, h: Any) -> list[tuple[str, float]]:
    """Used/free (and reserved) framebuffer bytes; v2 keeps the driver's reservation out of used."""
    try:
        mem = nvml.nvmlDeviceGetMemoryInfo(h, getattr(nvml, "nvmlMemory_v2", NVML_MEMORY_V2))
        return [("fb_used_bytes", mem.used), ("fb_free_bytes", mem.free), ("fb_reserved_bytes", mem.reserved)]
    except (nvml.NVMLError, TypeError, AttributeError):  # old driver or bindings without v2
        mem = _try(nvml, nvml.nvmlDeviceGetMemoryInfo, h)
    return [] if mem is None else [("fb_used_bytes", mem.used), ("fb_free_bytes", mem.free)]


def _nvlink_rates(nvml: Any, h: Any, state: _GpuState, ts_ns: int) -> list[tuple[str, int, float]]:
    """Per-link TX/RX bytes/s from the cumulative KiB fields 138/139 (rule 2)."""
    n_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", MAX_LINKS))
    query = [(fid, link) for link in range(n_links) for fid in (FI_NVLINK_TX_KIB, FI_NVLINK_RX_KIB)]
    got = _try(nvml, nvml.nvmlDeviceGetFieldValues, h, query)
    out: list[tuple[str, int, float]] = []
    totals: dict[str, float] = {}
    for fv in got or []:
        if fv.nvmlReturn != 0:
            continue
        key, kib = (fv.fieldId, fv.scopeId), int(fv.value.ullVal)
        prev = state.nvlink.get(key)
        state.nvlink[key] = (kib, ts_ns)
        if prev is None or kib < prev[0] or ts_ns <= prev[1]:
            continue
        metric = "nvlink_tx_bytes_per_s" if fv.fieldId == FI_NVLINK_TX_KIB else "nvlink_rx_bytes_per_s"
        rate = (kib - prev[0]) * 1024 / ((ts_ns - prev[1]) / 1e9)
        out.append((metric, fv.scopeId, rate))
        totals[metric] = totals.get(metric, 0.0) + rate
    out += [(metric, -1, total) for metric, total in totals.items()]
    return out


def _gpm_ratios(nvml: Any, h: Any, state: _GpuState) -> list[tuple[str, int, float]]:
    """SM / tensor / DRAM activity from two GPM samples (rule 3); [] where unsupported."""
    support = _try(nvml, getattr(nvml, "nvmlGpmQueryDeviceSupport", _unsupported), h)
    if support is None or not getattr(support, "isSupportedDevice", 0):
        return []
    sample = nvml.nvmlGpmSampleAlloc()
    nvml.nvmlGpmSampleGet(h, sample)
    prev, state.gpm_sample = state.gpm_sample, sample
    if prev is None:
        return []
    req = nvml.c_nvmlGpmMetricsGet_t()
    req.version = nvml.NVML_GPM_METRICS_GET_VERSION
    req.numMetrics = len(GPM_METRICS)
    req.sample1, req.sample2 = prev, sample
    for i, metric_id in enumerate(GPM_METRICS):
        req.metrics[i].metricId = metric_id
    nvml.nvmlGpmMetricsGet(req)
    nvml.nvmlGpmSampleFree(prev)
    out = []
    for i in range(len(GPM_METRICS)):
        got = req.metrics[i]
        if got.nvmlReturn == 0 and math.isfinite(got.value):
            metric, scale = GPM_METRICS[got.metricId]
            out.append((metric, -1, got.value * scale))
    return out


def _unsupported(*_: Any) -> None:
    return None
