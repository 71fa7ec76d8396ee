"""Synthetic collective_records + matching DCGM gpu_samples for straggler tests and benchmarks.

Scenarios (8 ranks on one host by default, one AllReduce every ``step_s``):

- ``balanced``: every rank arrives with the same Gaussian jitter; nobody is a straggler.
- ``intermittent``: rank 5 arrives ``delay_us`` late only in windows 10–13 of 40 (intermittent).
- ``throttled``: rank 3 is always late; its GPU runs at 1,400 MHz, 88 °C, thermal violation
  time rising and throttle mask 0x40 (HW thermal slowdown), peers 1,980 MHz / 65 °C.
- ``slow_link``: rank 6 is always late; its PCIe replay counter rises, clocks are normal.

Timestamps are epoch µs (like Inspector verbose). Everything is seeded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from collector.records import frame

T0_US = 1_800_000_000_000_000.0


@dataclass(frozen=True)
class Scenario:
    name: str
    culprit: int = -1
    delay_us: float = 0.0
    windows: tuple[int, int] | None = None  # [first, last) windows where the culprit is late


SCENARIOS = {
    "balanced": Scenario("balanced"),
    "intermittent": Scenario("intermittent", culprit=5, delay_us=400.0, windows=(10, 14)),
    "throttled": Scenario("throttled", culprit=3, delay_us=300.0),
    "slow_link": Scenario("slow_link", culprit=6, delay_us=250.0),
}


def collectives(
    sc: Scenario,
    n_ranks: int = 8,
    n_windows: int = 40,
    per_window: int = 25,
    window_s: float = 10.0,
    seed: int = 7,
) -> pl.DataFrame:
    """``collective_records`` rows: one AllReduce instance per step on every rank."""
    rng = np.random.default_rng(seed)
    n = n_windows * per_window
    step_us = window_s * 1e6 / per_window
    t0 = T0_US + (np.arange(n) + 0.5) * step_us  # mid-step: jitter never crosses a window edge
    arrive = t0[:, None] + rng.normal(0, 20.0, size=(n, n_ranks)).clip(-60, 60)
    if sc.culprit >= 0:
        late = np.ones(n, dtype=bool)
        if sc.windows:
            w = np.arange(n) // per_window
            late = (w >= sc.windows[0]) & (w < sc.windows[1])
        arrive[late, sc.culprit] += sc.delay_us
    last = arrive.max(axis=1)
    stop = last[:, None] + 300.0 + rng.normal(0, 2.0, size=(n, n_ranks))
    msg = 64 * 1024 * 1024
    exec_us = stop - arrive
    algbw = msg / exec_us / 1e3
    ranks = np.tile(np.arange(n_ranks), n)
    return frame(
        "collective_records",
        {
            "origin": ["inspector"] * (n * n_ranks), "comm_id": ["0xabc"] * (n * n_ranks),
            "coll_sn": np.repeat(np.arange(n), n_ranks).tolist(), "rank": ranks.tolist(),
            "kind": ["coll"] * (n * n_ranks), "n_ranks": [n_ranks] * (n * n_ranks),
            "host": ["node0"] * (n * n_ranks), "pid": (1000 + ranks).tolist(),
            "op": ["AllReduce"] * (n * n_ranks),
            "msg_bytes": [msg] * (n * n_ranks), "exec_us": exec_us.ravel().tolist(),
            "algbw_gbs": algbw.ravel().tolist(),
            "busbw_gbs": (algbw * 2 * (n_ranks - 1) / n_ranks).ravel().tolist(),
            "start_us": arrive.ravel().tolist(), "stop_us": stop.ravel().tolist(),
        },
    )  # fmt: skip


def _gpu_series(sc: Scenario, gpu: int, seconds: np.ndarray) -> dict[str, np.ndarray]:
    hot = sc.name == "throttled" and gpu == sc.culprit
    link = sc.name == "slow_link" and gpu == sc.culprit
    return {
        "sm_clock_mhz": np.full(seconds.size, 1400.0 if hot else 1980.0),
        "gpu_temp_c": np.full(seconds.size, 88.0 if hot else 65.0),
        "power_w": np.full(seconds.size, 520.0 if hot else 560.0),
        "clock_throttle_reasons_mask": np.full(seconds.size, 0x40 if hot else 0.0),
        "thermal_violation_s": seconds * 0.6 if hot else np.zeros(seconds.size),
        "power_violation_s": np.zeros(seconds.size),
        "xid_last": np.zeros(seconds.size),
        "pcie_replay_total": seconds * 3.0 if link else np.zeros(seconds.size),
    }


def gpu_samples(sc: Scenario, n_gpus: int = 8, duration_s: int = 400, every_s: int = 5) -> pl.DataFrame:
    """``gpu_samples`` rows for the same host and time span as :func:`collectives`."""
    seconds = np.arange(0, duration_s, every_s, dtype=float)
    ts = (T0_US * 1e3 + seconds * 1e9).astype(np.int64)
    cols: dict[str, list] = {k: [] for k in ("ts_ns", "host", "gpu", "uuid", "metric", "value")}
    for gpu in range(n_gpus):
        for metric, values in _gpu_series(sc, gpu, seconds).items():
            cols["ts_ns"] += ts.tolist()
            cols["host"] += ["node0"] * ts.size
            cols["gpu"] += [gpu] * ts.size
            cols["uuid"] += [f"GPU-{gpu:04d}"] * ts.size
            cols["metric"] += [metric] * ts.size
            cols["value"] += values.tolist()
    return frame("gpu_samples", cols)
