"""dcgm-exporter samples -> ``gpu_samples`` rows in canonical units (REFERENCE §1).

:data:`FIELDS` is the one table of DCGM field -> (canonical name, scale): every unit
conversion of GPU counters happens here, once. :data:`GPU_METRICS` lists the canonical names
(the envelope analysis and dashboards import it).

Rules:

1. A sample is a GPU sample when its name starts with ``DCGM_FI_`` or ``DCGM_EXP_``, or is one
   of Triton's GPU gauges (``nv_gpu_utilization`` 0..1, ``nv_gpu_memory_*_bytes``,
   ``nv_gpu_power_*`` W, ``nv_energy_consumption`` J), or one of the AMD device-metrics-exporter
   fields below (rule 11); other families in the same body (``go_*``, engine metrics) are
   ignored here.
2. Known fields get their canonical name and ``value × scale``: percent → ratio (×0.01),
   MiB → bytes (×1,048,576), ``NVLINK_BANDWIDTH_TOTAL`` (field 449) is a MB/s *rate* despite
   its "counter" type → bytes/s (×1e6), energy mJ → J (×0.001), violation ns → s (×1e-9).
   Ratios from profiling (``PROF_*``), W, °C, MHz, bytes/s are already canonical.
   ``XID_ERRORS`` is the last XID code (``xid_last``), not a count.
3. Unknown ``DCGM_FI_*`` / ``DCGM_EXP_*`` fields are kept, unscaled, under ``dcgm_`` + the
   lowercased name without its ``DCGM_FI_`` prefix (``DCGM_FI_DEV_COUNT`` → ``dcgm_dev_count``).
4. Blank sentinels (values ≥ 1e14, DCGM's "no data") and non-finite values are dropped; one
   Problem per body counts them and names the fields.
5. Identity labels, every spelling: host ``Hostname``/``hostname`` (else the ``host``
   argument); uuid ``UUID``/``uuid``/``gpu_uuid``; gpu index ``gpu`` (else the N of
   ``device="nvidiaN"``, else -1); model ``modelName``/``model_name``; NVLink index ``nvlink``
   (else -1); Kubernetes ``pod``/``pod_name``, ``namespace``/``pod_namespace``,
   ``container``/``container_name``; MIG ``GPU_I_PROFILE``, ``GPU_I_ID``.
6. MIG instances share their parent's UUID; so that each instance keeps its own row under the
   store's key (ts_ns, host, uuid, metric, link), a MIG sample's uuid is ``<UUID>/gi<GPU_I_ID>``.
7. A sample's own timestamp (rare in dcgm-exporter output) wins over ``ts_ns``.
8. ``memo`` (optional, one per scrape target): the identity columns of a series (rules 2-6,
   everything but the time and the value) are computed once per metric name and label
   mapping and reused while the parser hands out the same mapping (see
   :class:`collector.formats.exposition.ParseCache`). Rows are identical with or without it.
9. A sample whose ``gpu`` or ``nvlink`` label is an integer outside the store's INTEGER
   (32-bit) range is refused as a Problem naming the metric and the field; nothing is stored
   for it (a timestamp outside the nanosecond range is refused by the exposition parser).
10. A negative value of a cumulative field (a ``*_total`` count, energy, violation time) is
    refused as a Problem: counters never go below zero, and a rate from it would be bogus.
11. AMD Instinct GPUs through AMD's device-metrics-exporter (ROCm/device-metrics-exporter; its
    names are lowercase, and often relabelled with an ``amd_`` prefix, which is dropped):
    ``gpu_gfx_activity`` and ``gpu_umc_activity`` are percent busy of the graphics/compute engine
    and of the memory controller (→ ``gpu_util_ratio``, ``mem_copy_util_ratio``);
    ``gpu_power_usage`` W; ``gpu_energy_consumed`` µJ (→ J); ``gpu_junction_temperature`` (the
    hotspot, MI3xx) is the die temperature ``gpu_temp_c``, ``gpu_edge_temperature`` (MI2xx) is
    kept apart as ``edge_temp_c``; VRAM in MB as amd-smi counts them (2^20 bytes); ECC totals
    (correctable → ``ecc_sbe_total``, uncorrectable → ``ecc_dbe_total``); ``pcie_replay_count``.
    Identity: index ``gpu_id``, uuid ``gpu_uuid``, host ``hostname``, model ``card_series``
    (else ``card_model``). A GPU split into compute partitions (``gpu_compute_partition_type``
    other than SPX) reports each partition under the same uuid; like a MIG instance, each
    keeps its own row as ``<uuid>/p<gpu_partition_id>``, its type in ``mig_profile``. Other AMD
    fields (clocks with their ``clock_type`` label, violation residencies, XGMI) are not read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from collector.errors import Problem
from collector.formats import Parsed
from collector.formats.exposition import Exposition, Sample, series_text
from collector.records import batch

BLANK_MIN = 1e14
MIB = 1024 * 1024
INT32_MAX = 2**31 - 1


class Field(NamedTuple):
    """A DCGM field: numeric id, exporter name, canonical name, scale to canonical units."""

    id: int
    dcgm: str
    name: str
    scale: float = 1.0


_F = Field
FIELD_LIST: tuple[Field, ...] = (
    _F(100, "DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz"),
    _F(101, "DCGM_FI_DEV_MEM_CLOCK", "mem_clock_mhz"),
    _F(112, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "throttle_reasons_mask"),
    _F(112, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "throttle_reasons_mask"),  # DCGM ≥ 3.3 name
    _F(140, "DCGM_FI_DEV_MEMORY_TEMP", "memory_temp_c"),
    _F(150, "DCGM_FI_DEV_GPU_TEMP", "gpu_temp_c"),
    _F(155, "DCGM_FI_DEV_POWER_USAGE", "power_w"),
    _F(156, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "energy_j", 1e-3),
    _F(158, "DCGM_FI_DEV_SLOWDOWN_TEMP", "slowdown_temp_c"),
    _F(160, "DCGM_FI_DEV_POWER_MGMT_LIMIT", "power_limit_w"),
    _F(164, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "enforced_power_limit_w"),
    _F(190, "DCGM_FI_DEV_PSTATE", "pstate_last"),
    _F(191, "DCGM_FI_DEV_FAN_SPEED", "fan_speed_ratio", 0.01),
    _F(202, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "pcie_replay_total"),
    _F(203, "DCGM_FI_DEV_GPU_UTIL", "gpu_util_ratio", 0.01),
    _F(204, "DCGM_FI_DEV_MEM_COPY_UTIL", "mem_copy_util_ratio", 0.01),
    _F(206, "DCGM_FI_DEV_ENC_UTIL", "enc_util_ratio", 0.01),
    _F(207, "DCGM_FI_DEV_DEC_UTIL", "dec_util_ratio", 0.01),
    _F(230, "DCGM_FI_DEV_XID_ERRORS", "xid_last"),
    _F(235, "DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "pcie_max_link_gen_last"),
    _F(236, "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "pcie_max_link_width_last"),
    _F(237, "DCGM_FI_DEV_PCIE_LINK_GEN", "pcie_link_gen_last"),
    _F(238, "DCGM_FI_DEV_PCIE_LINK_WIDTH", "pcie_link_width_last"),
    _F(240, "DCGM_FI_DEV_POWER_VIOLATION", "power_violation_s", 1e-9),
    _F(241, "DCGM_FI_DEV_THERMAL_VIOLATION", "thermal_violation_s", 1e-9),
    _F(242, "DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "sync_boost_violation_s", 1e-9),
    _F(243, "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "board_limit_violation_s", 1e-9),
    _F(244, "DCGM_FI_DEV_LOW_UTIL_VIOLATION", "low_util_violation_s", 1e-9),
    _F(245, "DCGM_FI_DEV_RELIABILITY_VIOLATION", "reliability_violation_s", 1e-9),
    _F(250, "DCGM_FI_DEV_FB_TOTAL", "fb_total_bytes", MIB),
    _F(251, "DCGM_FI_DEV_FB_FREE", "fb_free_bytes", MIB),
    _F(252, "DCGM_FI_DEV_FB_USED", "fb_used_bytes", MIB),
    _F(253, "DCGM_FI_DEV_FB_RESERVED", "fb_reserved_bytes", MIB),
    _F(254, "DCGM_FI_DEV_FB_USED_PERCENT", "fb_used_ratio"),  # DCGM defines it as 0.0-1.0
    _F(310, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc_sbe_volatile_total"),
    _F(311, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_dbe_volatile_total"),
    _F(312, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "ecc_sbe_total"),
    _F(313, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "ecc_dbe_total"),
    _F(390, "DCGM_FI_DEV_RETIRED_SBE", "retired_pages_sbe_total"),
    _F(391, "DCGM_FI_DEV_RETIRED_DBE", "retired_pages_dbe_total"),
    _F(392, "DCGM_FI_DEV_RETIRED_PENDING", "retired_pages_pending_total"),
    _F(393, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "remapped_rows_uncorrectable_total"),
    _F(394, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "remapped_rows_correctable_total"),
    _F(395, "DCGM_FI_DEV_ROW_REMAP_FAILURE", "row_remap_failure_last"),
    _F(409, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "nvlink_crc_flit_errors_total"),
    _F(419, "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "nvlink_crc_data_errors_total"),
    _F(429, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "nvlink_replay_errors_total"),
    _F(439, "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "nvlink_recovery_errors_total"),
    _F(449, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "nvlink_total_bytes_per_s", 1e6),  # MB/s rate
    _F(-1, "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "vgpu_license_status_last"),  # id not needed
    _F(1001, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gr_engine_active_ratio"),
    _F(1002, "DCGM_FI_PROF_SM_ACTIVE", "sm_active_ratio"),
    _F(1003, "DCGM_FI_PROF_SM_OCCUPANCY", "sm_occupancy_ratio"),
    _F(1004, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_active_ratio"),
    _F(1005, "DCGM_FI_PROF_DRAM_ACTIVE", "dram_active_ratio"),
    _F(1006, "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "fp64_active_ratio"),
    _F(1007, "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "fp32_active_ratio"),
    _F(1008, "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "fp16_active_ratio"),
    _F(1009, "DCGM_FI_PROF_PCIE_TX_BYTES", "pcie_tx_bytes_per_s"),
    _F(1010, "DCGM_FI_PROF_PCIE_RX_BYTES", "pcie_rx_bytes_per_s"),
    _F(1011, "DCGM_FI_PROF_NVLINK_TX_BYTES", "nvlink_tx_bytes_per_s"),
    _F(1012, "DCGM_FI_PROF_NVLINK_RX_BYTES", "nvlink_rx_bytes_per_s"),
    # Triton's own GPU gauges (read through DCGM by Triton, labelled gpu_uuid): rule 1
    _F(-1, "nv_gpu_utilization", "gpu_util_ratio"),  # already 0..1
    _F(-1, "nv_gpu_memory_total_bytes", "fb_total_bytes"),
    _F(-1, "nv_gpu_memory_used_bytes", "fb_used_bytes"),
    _F(-1, "nv_gpu_power_usage", "power_w"),
    _F(-1, "nv_gpu_power_limit", "power_limit_w"),
    _F(-1, "nv_energy_consumption", "energy_j"),  # J since Triton started
    # AMD device-metrics-exporter (rule 11)
    _F(-1, "gpu_gfx_activity", "gpu_util_ratio", 0.01),
    _F(-1, "gpu_umc_activity", "mem_copy_util_ratio", 0.01),
    _F(-1, "gpu_power_usage", "power_w"),
    _F(-1, "gpu_energy_consumed", "energy_j", 1e-6),
    _F(-1, "gpu_junction_temperature", "gpu_temp_c"),
    _F(-1, "gpu_edge_temperature", "edge_temp_c"),
    _F(-1, "gpu_memory_temperature", "memory_temp_c"),
    _F(-1, "gpu_total_vram", "fb_total_bytes", MIB),
    _F(-1, "gpu_used_vram", "fb_used_bytes", MIB),
    _F(-1, "gpu_free_vram", "fb_free_bytes", MIB),
    _F(-1, "gpu_ecc_correct_total", "ecc_sbe_total"),
    _F(-1, "gpu_ecc_uncorrect_total", "ecc_dbe_total"),
    _F(-1, "pcie_replay_count", "pcie_replay_total"),
)
FIELDS: dict[str, Field] = {f.dcgm: f for f in FIELD_LIST}
FIELDS_BY_ID: dict[int, Field] = {f.id: f for f in FIELD_LIST if f.id >= 0}
GPU_METRICS: tuple[str, ...] = tuple(dict.fromkeys(f.name for f in FIELD_LIST))
_TRITON_GPU = frozenset(f.dcgm for f in FIELD_LIST if f.dcgm.startswith("nv_"))
_AMD_GPU = frozenset(f.dcgm for f in FIELD_LIST if f.id < 0 and not f.dcgm.startswith(("nv_", "DCGM_")))
FIELDS.update({"amd_" + name: FIELDS[name] for name in _AMD_GPU})
_NAMED_GPU = _TRITON_GPU | _AMD_GPU | {"amd_" + name for name in _AMD_GPU}

_HOST = ("Hostname", "hostname")
_UUID = ("UUID", "uuid", "gpu_uuid")
_MODEL = ("modelName", "model_name", "card_series", "card_model")
_POD = ("pod", "pod_name")
_NAMESPACE = ("namespace", "pod_namespace")
_CONTAINER = ("container", "container_name")


def is_gpu_metric(name: str) -> bool:
    """Rule 1."""
    return name.startswith(("DCGM_FI_", "DCGM_EXP_")) or name in _NAMED_GPU


def canonical(name: str) -> tuple[str, float]:
    """Rules 2-3: ``(canonical name, scale)`` of a dcgm-exporter metric name."""
    known = FIELDS.get(name)
    if known is not None:
        return known.name, known.scale
    return "dcgm_" + name.removeprefix("DCGM_FI_").lower(), 1.0


def to_gpu_samples(
    exp: Exposition,
    *,
    ts_ns: int,
    host: str = "",
    source: str = "",
    memo: GpuMemo | None = None,
    trace: list[tuple[int, float, bool]] | None = None,
) -> Parsed:
    """``gpu_samples`` rows for the DCGM samples of ``exp`` (see the module rules).

    ``trace``, when given, receives one ``(sample index, scale, False)`` per row, in row order:
    what a scrape cache needs to rebuild the rows from new values (scrape rule 6)."""
    memo = {} if memo is None else memo
    source = source or exp.source
    idents: list[_Ident] = []
    values: list[float] = []
    stamps: list[int] = []
    dropped: dict[str, int] = {}
    refused: list[Problem] = []
    for index, sample in enumerate(exp.samples):
        if not is_gpu_metric(sample.name):
            continue
        if not math.isfinite(sample.value) or sample.value >= BLANK_MIN:
            dropped[sample.name] = dropped.get(sample.name, 0) + 1
            continue
        ident = _identity(memo, sample, host, source)
        why = _refusal(sample, ident)
        if why:
            refused.append(Problem(series_text(sample), why))
            continue
        if trace is not None:
            trace.append((index, ident[1], False))
        idents.append(ident)
        values.append(sample.value * ident[1])
        stamps.append(ts_ns if sample.timestamp_ms is None else int(sample.timestamp_ms * 1_000_000))
    parsed = Parsed(problems=refused)
    parsed.add("gpu_samples", batch("gpu_samples", _columns(idents, values, stamps)))
    if dropped:
        parsed.problems.append(_dropped_problem(dropped))
    return parsed


def is_cumulative(metric: str) -> bool:
    """Rule 10: a canonical GPU metric that only ever counts up."""
    return metric.endswith(("_total", "_j", "_violation_s"))


def _refusal(sample: Sample, ident: _Ident) -> str:
    """Rules 9-10: why this sample cannot be stored, or ''."""
    labels = sample.labels
    for name in ("gpu", "nvlink"):
        text = labels.get(name, "")
        digits = text.removeprefix("-")
        if digits.isascii() and digits.isdigit() and not -INT32_MAX - 1 <= int(text) <= INT32_MAX:
            return f"field {name}: label {name}={text[:40]!r} is out of the store's INTEGER range (rule 9)"
    if sample.value < 0 and is_cumulative(ident[5]):
        return f"field value: counter {ident[5]} is negative ({sample.value:g}) (rule 10)"
    return ""


# (labels, scale, host, gpu, uuid, metric, link, source, gpu_model, pod, namespace, container,
#  mig_profile, mig_instance): a series' identity, ``labels`` kept to check the memo's hit
_Ident = tuple[Any, ...]
GpuMemo = dict[tuple[str, int, str, str], _Ident]
_ID_COLUMNS = (
    "host",
    "gpu",
    "uuid",
    "metric",
    "link",
    "source",
    "gpu_model",
    "pod",
    "namespace",
    "container",
    "mig_profile",
    "mig_instance",
)


def _identity(memo: GpuMemo, sample: Sample, host: str, source: str) -> _Ident:
    """Rule 8: the memo's identity of this series, computed on a miss."""
    key = (sample.name, id(sample.labels), host, source)
    found = memo.get(key)
    if found is None or found[0] is not sample.labels:
        found = memo[key] = _new_identity(sample, host, source)
    return found


def _new_identity(sample: Sample, host: str, source: str) -> _Ident:
    """Rules 2-6 for one series."""
    labels = sample.labels
    metric, scale = canonical(sample.name)
    mig_instance = labels.get("GPU_I_ID", "")
    uuid = _first(labels, _UUID)
    profile = labels.get("GPU_I_PROFILE", "")
    partition = labels.get("gpu_compute_partition_type", "")
    if partition and partition.lower() != "spx" and not mig_instance:
        uuid, profile = f"{uuid}/p{labels.get('gpu_partition_id', '')}", partition
    return (
        labels,
        scale,
        _first(labels, _HOST) or host,
        gpu_index(labels),
        f"{uuid}/gi{mig_instance}" if mig_instance else uuid,
        metric,
        _int_or(labels.get("nvlink", ""), -1),
        source,
        _first(labels, _MODEL),
        _first(labels, _POD),
        _first(labels, _NAMESPACE),
        _first(labels, _CONTAINER),
        profile,
        mig_instance,
    )


def _columns(idents: list[_Ident], values: list[float], stamps: list[int]) -> dict[str, list[Any]]:
    """Identity tuples + values + times -> the table's column lists (C-level transposes)."""
    cols: dict[str, list[Any]] = {"ts_ns": stamps, "value": values}
    transposed = list(zip(*idents, strict=True))[2:] if idents else [()] * len(_ID_COLUMNS)
    cols.update({name: list(column) for name, column in zip(_ID_COLUMNS, transposed, strict=True)})
    return cols


def gpu_index(labels: Mapping[str, str]) -> int:
    """Rules 5 and 11: ``gpu`` label (AMD: ``gpu_id``), else the N of ``device="nvidiaN"``, else -1."""
    index = _int_or(labels.get("gpu", "") or labels.get("gpu_id", ""), -1)
    if index < 0:
        device = labels.get("device", "")
        if device.startswith("nvidia"):
            index = _int_or(device[6:], -1)
    return index


def _first(labels: Mapping[str, str], spellings: tuple[str, ...]) -> str:
    for key in spellings:
        value = labels.get(key)
        if value:
            return value
    return ""


def _int_or(text: str, default: int) -> int:
    """``int(text)`` when it is an integer the store's INTEGER holds, else ``default``."""
    try:
        value = int(text)
    except ValueError:
        return default
    return value if -INT32_MAX - 1 <= value <= INT32_MAX else default


def _dropped_problem(dropped: dict[str, int]) -> Problem:
    total = sum(dropped.values())
    fields = ", ".join(f"{name}×{n}" for name, n in sorted(dropped.items()))
    return Problem(
        "dcgm", f"{total} blank-sentinel (≥ 1e14) or non-finite value(s) dropped (rule 4): {fields}"
    )
