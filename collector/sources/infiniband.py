"""InfiniBand / RoCE port counters from sysfs → ``fabric_samples`` rows.

Reads ``<root>/<device>/ports/<port>/counters/*`` and ``…/hw_counters/*`` (root defaults to
``/sys/class/infiniband``) plus the port's ``rate`` file. One row per counter per read, with the
cumulative value and the per-second rate since the previous read by the same reader.

Rules:

1. ``port_xmit_data`` / ``port_rcv_data`` count 4-byte words (the IBTA "octets divided by 4"):
   they become ``tx_bytes`` / ``rx_bytes`` = words × 4. Other well-known counters get short
   names (``tx_packets``, ``rx_packets``, ``tx_discards``, ``rx_errors``, ``symbol_errors``,
   ``link_downed``, ``tx_wait``…); any other counter (``hw_counters`` such as
   ``np_ecn_marked_roce_packets``, ``rp_cnp_handled``, ``out_of_sequence``) keeps its file name.
2. ``rate_per_s`` = (value − previous value) / (ts − previous ts), in the value's unit per second.
   It is NULL on the first read, when the time did not move forward, and when the value went
   down (a counter reset or a driver reload): a reset is never reported as a negative rate.
3. ``link_rate_bytes_per_s`` is the port's signalling rate from ``rate`` ("200 Gb/sec (4X HDR)")
   as bytes/s (×10⁹ / 8); it is a gauge (no rate).
4. A counter file that cannot be read or does not hold an integer is a Problem naming the file;
   the other counters are kept.

Known limits: legacy 32-bit ``port_*_data`` counters saturate at 2³²−1 on old HCAs (a
saturated counter shows as a rate of 0); modern mlx5 sysfs counters are 64-bit.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from collector.errors import Problem
from collector.formats import Parsed
from collector.records import batch

DEFAULT_ROOT = Path("/sys/class/infiniband")
TABLE = "fabric_samples"

# sysfs name -> (canonical metric, multiplier to base units)
COUNTERS: dict[str, tuple[str, int]] = {
    "port_xmit_data": ("tx_bytes", 4),
    "port_rcv_data": ("rx_bytes", 4),
    "port_xmit_packets": ("tx_packets", 1),
    "port_rcv_packets": ("rx_packets", 1),
    "port_xmit_discards": ("tx_discards", 1),
    "port_rcv_errors": ("rx_errors", 1),
    "port_rcv_remote_physical_errors": ("rx_remote_physical_errors", 1),
    "port_xmit_constraint_errors": ("tx_constraint_errors", 1),
    "port_rcv_constraint_errors": ("rx_constraint_errors", 1),
    "port_xmit_wait": ("tx_wait", 1),
    "symbol_error": ("symbol_errors", 1),
    "link_downed": ("link_downed", 1),
    "link_error_recovery": ("link_error_recovery", 1),
    "local_link_integrity_errors": ("local_link_integrity_errors", 1),
    "excessive_buffer_overrun_errors": ("excessive_buffer_overrun_errors", 1),
    "VL15_dropped": ("vl15_dropped", 1),
}
_RATE = re.compile(r"^\s*([\d.]+)\s*Gb/sec")


class InfinibandReader:
    """Reads every port's counters under ``root``; keeps the previous read to compute rates."""

    name = "infiniband"

    def __init__(self, root: str | Path = DEFAULT_ROOT, host: str = ""):
        self.root = Path(root)
        self.host = host
        self._prev: dict[tuple[str, int, str], tuple[int, float]] = {}

    def available(self) -> tuple[bool, str]:
        if not self.root.is_dir():
            return False, f"no InfiniBand/RoCE devices: {self.root} does not exist"
        if not any(self.root.glob("*/ports/*")):
            return False, f"no InfiniBand/RoCE ports under {self.root}"
        return True, f"{len(list(self.root.glob('*/ports/*')))} port(s) under {self.root}"

    def read(self, ts_ns: int) -> Parsed:
        """One row per counter per port at ``ts_ns`` (rules 1–4)."""
        rows: list[dict[str, Any]] = []
        problems: list[Problem] = []
        for port_dir in sorted(self.root.glob("*/ports/*")):
            device, port = port_dir.parent.parent.name, _port_number(port_dir.name)
            if port is None:
                continue
            for metric, value, problem in _port_values(port_dir):
                if problem:
                    problems.append(problem)
                    continue
                rows.append(self._row(ts_ns, device, port, metric, value))
        parsed = Parsed(problems=problems)
        if rows:
            parsed.add(TABLE, batch(TABLE, rows))
        return parsed

    def _row(self, ts_ns: int, device: str, port: int, metric: str, value: float) -> dict[str, Any]:
        row: dict[str, Any] = {
            "ts_ns": ts_ns,
            "host": self.host,
            "device": device,
            "port": port,
            "metric": metric,
            "value": float(value),
            "rate_per_s": None,
        }
        if metric == "link_rate_bytes_per_s":
            return row
        key = (device, port, metric)
        prev = self._prev.get(key)
        self._prev[key] = (int(value), ts_ns)
        if prev is not None:
            row["rate_per_s"] = counter_rate(prev[0], prev[1], int(value), ts_ns)
        return row


def counter_rate(prev: int, prev_ts_ns: float, value: int, ts_ns: float) -> float | None:
    """Per-second increase, or ``None`` for a reset (value went down) or no time step (rule 2)."""
    dt = (ts_ns - prev_ts_ns) / 1e9
    if dt <= 0 or value < prev:
        return None
    return (value - prev) / dt


def _port_number(name: str) -> int | None:
    return int(name) if name.isdigit() else None


def _port_values(port_dir: Path) -> list[tuple[str, float, Problem | None]]:
    out: list[tuple[str, float, Problem | None]] = []
    for sub in ("counters", "hw_counters"):
        folder = port_dir / sub
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if not path.is_file():
                continue
            metric, mult = COUNTERS.get(path.name, (path.name, 1))
            try:
                out.append((metric, int(path.read_text().strip()) * mult, None))
            except (OSError, ValueError) as exc:
                out.append((metric, 0.0, Problem(str(path), f"unreadable counter ({exc})")))
    rate = _link_rate(port_dir / "rate")
    if rate is not None:
        out.append(("link_rate_bytes_per_s", rate, None))
    return out


def _link_rate(path: Path) -> float | None:
    """'200 Gb/sec (4X HDR)' → 25e9 bytes/s (rule 3); ``None`` when absent or unparsable."""
    try:
        m = _RATE.match(path.read_text())
    except OSError:
        return None
    return float(m.group(1)) * 1e9 / 8 if m else None
