"""The analyzer's views the routes call (:mod:`analyzer.views`): ``api/`` validates, calls these
and serializes; it holds no SQL and no rule of its own."""

from __future__ import annotations

from analyzer.views import (
    EPOCH_US_MIN,
    GPU_METRICS,
    LATENCY_QS,
    LINK_METRICS,
    LOAD_POINTS,
    RAW_WINDOW_MAX_S,
    bin_seconds,
    collective_records,
    collectives,
    deployments,
    envelope,
    fabric_series,
    gpu_series,
    latency,
    load_curve,
    phases,
    plan,
    sources_health,
    stragglers,
    targets,
    trailing_quantiles,
    window_load,
)

__all__ = [
    "EPOCH_US_MIN",
    "GPU_METRICS",
    "LATENCY_QS",
    "LINK_METRICS",
    "LOAD_POINTS",
    "RAW_WINDOW_MAX_S",
    "bin_seconds",
    "collective_records",
    "collectives",
    "deployments",
    "envelope",
    "fabric_series",
    "gpu_series",
    "latency",
    "load_curve",
    "phases",
    "plan",
    "sources_health",
    "stragglers",
    "targets",
    "trailing_quantiles",
    "window_load",
]
