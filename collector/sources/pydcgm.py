"""GPU counters through DCGM's own Python bindings (pydcgm) → ``gpu_samples`` (REFERENCE §1).

pydcgm is not on PyPI: it ships with the DCGM package under one of :data:`BINDING_PATHS`, and is
imported from there when present. The pattern is DCGM's own: ``DcgmHandle`` → ``DcgmGroup``
(all GPUs) → ``DcgmFieldGroup`` (numeric field IDs: DCGM 4.6 renamed the Python constants) →
``WatchFields`` once → ``GetAllSinceLastCall`` on every read, which returns every sample DCGM
took since the last call, each with its own timestamp.

Rules:

1. Field IDs map to canonical metrics with one conversion each (:data:`FIELDS`): MiB → bytes,
   mJ → J, percent → ratio, violation ns → s; profiling ratios and bytes/s are stored as given.
   The names are those :mod:`collector.formats.dcgm` gives the same fields (power limits, PCIe
   link generation/width, volatile ECC and NVLink error counters included: the straggler
   causes read them).
2. Every sample is a row at its own DCGM timestamp (µs → ns), not at the read time.
3. Blank samples (``isBlank``, DCGM's sentinel values ≥ 1e14, NaN or non-numbers) are dropped,
   never stored.
4. ``available()`` is (False, reason) when the bindings are not installed or the host engine
   cannot be reached; nothing raises out of the reader.
"""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from collector.errors import Problem
from collector.formats import Parsed
from collector.records import batch

TABLE = "gpu_samples"
BINDING_PATHS = (
    Path("/usr/share/datacenter-gpu-manager-4/bindings/python3"),
    Path("/usr/local/dcgm/bindings/python3"),
)
BLANK_MIN = 1e14
MIB = 1 << 20

# DCGM field id -> (canonical metric, multiplier)
FIELDS: dict[int, tuple[str, float]] = {
    100: ("sm_clock_mhz", 1.0),
    101: ("mem_clock_mhz", 1.0),
    112: ("throttle_reasons_mask", 1.0),
    140: ("memory_temp_c", 1.0),
    150: ("gpu_temp_c", 1.0),
    155: ("power_w", 1.0),
    156: ("energy_j", 1e-3),
    160: ("power_limit_w", 1.0),
    164: ("enforced_power_limit_w", 1.0),
    202: ("pcie_replay_total", 1.0),
    203: ("gpu_util_ratio", 0.01),
    230: ("xid_last", 1.0),
    235: ("pcie_max_link_gen_last", 1.0),
    236: ("pcie_max_link_width_last", 1.0),
    237: ("pcie_link_gen_last", 1.0),
    238: ("pcie_link_width_last", 1.0),
    240: ("power_violation_s", 1e-9),
    241: ("thermal_violation_s", 1e-9),
    251: ("fb_free_bytes", MIB),
    252: ("fb_used_bytes", MIB),
    310: ("ecc_sbe_volatile_total", 1.0),
    311: ("ecc_dbe_volatile_total", 1.0),
    409: ("nvlink_crc_flit_errors_total", 1.0),
    419: ("nvlink_crc_data_errors_total", 1.0),
    429: ("nvlink_replay_errors_total", 1.0),
    439: ("nvlink_recovery_errors_total", 1.0),
    1001: ("gr_engine_active_ratio", 1.0),
    1002: ("sm_active_ratio", 1.0),
    1003: ("sm_occupancy_ratio", 1.0),
    1004: ("tensor_active_ratio", 1.0),
    1005: ("dram_active_ratio", 1.0),
    1009: ("pcie_tx_bytes_per_s", 1.0),
    1010: ("pcie_rx_bytes_per_s", 1.0),
    1011: ("nvlink_tx_bytes_per_s", 1.0),
    1012: ("nvlink_rx_bytes_per_s", 1.0),
}


def load_bindings(paths: tuple[Path, ...] = BINDING_PATHS) -> tuple[Any | None, str]:
    """``(namespace with pydcgm + dcgm_structs, '')`` or ``(None, why not)``.

    The first existing path is put on ``sys.path`` (pydcgm imports its sibling modules by name).
    """
    found = next((p for p in paths if (p / "pydcgm.py").is_file()), None)
    if found is None:
        return None, "pydcgm not installed (looked in " + ", ".join(str(p) for p in paths) + ")"
    if str(found) not in sys.path:
        sys.path.append(str(found))
    try:
        pydcgm = importlib.import_module("pydcgm")
        structs = importlib.import_module("dcgm_structs")
    except Exception as exc:  # a broken install or a missing libdcgm.so.4
        return None, f"pydcgm at {found} cannot be imported ({exc})"
    return SimpleNamespace(
        DcgmHandle=pydcgm.DcgmHandle,
        DcgmGroup=pydcgm.DcgmGroup,
        DcgmFieldGroup=pydcgm.DcgmFieldGroup,
        DCGM_GROUP_DEFAULT=structs.DCGM_GROUP_DEFAULT,
        DCGM_OPERATION_MODE_AUTO=structs.DCGM_OPERATION_MODE_AUTO,
    ), ""


class DcgmReader:
    """Watches :data:`FIELDS` on all GPUs and returns every sample since the previous read."""

    name = "pydcgm"

    def __init__(
        self,
        dcgm: Any | None = None,
        host: str = "",
        *,
        host_engine: str = "127.0.0.1",
        update_us: int = 1_000_000,
        paths: tuple[Path, ...] = BINDING_PATHS,
    ):
        self._dcgm = dcgm
        self.host = host
        self.host_engine = host_engine
        self.update_us = update_us
        self.paths = paths
        self._watch: tuple[Any, Any, Any] | None = None
        self._uuids: dict[int, str] = {}

    def available(self) -> tuple[bool, str]:
        try:
            self._start()
        except _Unavailable as exc:
            return False, str(exc)
        return True, f"DCGM host engine at {self.host_engine}, {len(FIELDS)} fields watched"

    def read(self, ts_ns: int) -> Parsed:
        """Every sample since the last read (rules 1–3); a Problem instead of raising."""
        try:
            handle, group, field_group = self._start()
            got = group.samples.GetAllSinceLastCall(None, field_group)
        except _Unavailable as exc:
            return Parsed(problems=[Problem("pydcgm", str(exc))])
        except Exception as exc:  # dcgm_structs.DCGMError and friends
            return Parsed(problems=[Problem("pydcgm", f"GetAllSinceLastCall failed ({exc})")])
        rows = list(self._rows(handle, got.values))
        parsed = Parsed()
        if rows:
            parsed.add(TABLE, batch(TABLE, rows))
        return parsed

    def _start(self) -> tuple[Any, Any, Any]:
        if self._watch is not None:
            return self._watch
        if self._dcgm is None:
            self._dcgm, why = load_bindings(self.paths)
            if self._dcgm is None:
                raise _Unavailable(why)
        d = self._dcgm
        try:
            handle = d.DcgmHandle(ipAddress=self.host_engine, opMode=d.DCGM_OPERATION_MODE_AUTO)
            group = d.DcgmGroup(handle, groupName="ioe", groupType=d.DCGM_GROUP_DEFAULT)
            field_group = d.DcgmFieldGroup(handle, name="ioe", fieldIds=list(FIELDS))
            keep_s = max(60.0, 10 * self.update_us / 1e6)
            group.samples.WatchFields(field_group, self.update_us, keep_s, 0)
        except Exception as exc:
            raise _Unavailable(f"DCGM host engine at {self.host_engine} not usable ({exc})") from exc
        self._watch = (handle, group, field_group)
        return self._watch

    def _rows(self, handle: Any, values: dict[int, dict[int, Any]]) -> Any:
        for gpu_id, fields in values.items():
            uuid = self._uuid(handle, gpu_id)
            for field_id, series in fields.items():
                if field_id not in FIELDS:
                    continue
                metric, mult = FIELDS[field_id]
                for sample in series:
                    if getattr(sample, "isBlank", False) or _blank(sample.value):
                        continue  # rule 3
                    yield {
                        "ts_ns": int(sample.ts) * 1000,
                        "host": self.host,
                        "gpu": int(gpu_id),
                        "uuid": uuid,
                        "metric": metric,
                        "link": -1,
                        "value": float(sample.value) * mult,
                        "source": "pydcgm",
                    }

    def _uuid(self, handle: Any, gpu_id: int) -> str:
        if gpu_id not in self._uuids:
            try:
                attrs = handle.GetSystem().discovery.GetGpuAttributes(gpu_id)
                self._uuids[gpu_id] = str(attrs.identifiers.uuid)
            except Exception:  # no attributes: fall back to the DCGM GPU id
                self._uuids[gpu_id] = f"dcgm-gpu-{gpu_id}"
        return self._uuids[gpu_id]


class _Unavailable(RuntimeError):
    """pydcgm or the host engine is not there; the message says which and where."""


def _blank(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return True
    return not math.isfinite(value) or abs(float(value)) >= BLANK_MIN
