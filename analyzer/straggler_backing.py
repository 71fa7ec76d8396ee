"""Whether a two-rank verdict is backed: the waited-for rank's own evidence that it is the slow one.

With two ranks the arrival test of :mod:`analyzer.stragglers` says only which rank the other
waits for; a rank that is merely fast makes its peer look the same. The waited-for rank is named
(:mod:`analyzer.stragglers` rule 7) only when at least one of these backs it:

1. ``telemetry``: a cause other than ``unexplained`` from its GPU's counters, against its peer
   or against its own earlier windows (:mod:`analyzer.straggler_causes`; e.g. SM clock 1,584
   against 1,980 MHz with a thermal throttle bit set).
2. ``own_timing``: its compute segment (rule 2's ``start_r − previous stop_r``: its own work
   between two collectives; all ranks leave a collective together, so one rank's segment does
   not depend on the other's) grew in its slow windows against its other evaluated windows,
   ``slow / rest ≥ 1 + slow_min``, while the peer's did not shrink (``≥ 1 − slow_min``): it got
   slower, the peer did not get faster. A rank slow in every window has no such history.
3. ``model``: its mean segment in its slow windows ≥ (1 + ``model_tolerance``) × the
   performance model's expected segment (:func:`expected_segment_us`), while its peer's mean
   is within ``model_tolerance`` of it: the peer runs at the model's pace and the rank does not.
   Means, not medians: the model's per-step overhead falls in one segment of each step.

The segment figures are in :class:`PairTiming`; each backing that holds adds an evidence row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from analyzer import perf
from analyzer.capacity import Layout
from analyzer.catalog import Gpu
from analyzer.modelcfg import ModelConfig


class BackingThresholds(Protocol):
    """The numbers notes 2–3 read (:class:`analyzer.stragglers.Thresholds`)."""

    @property
    def slow_min(self) -> float: ...

    @property
    def model_tolerance(self) -> float: ...


@dataclass
class PairTiming:
    """Note 2–3 figures of one rank and its peer (µs; None where no segment was measured)."""

    slow: float | None  # median segment in the rank's slow windows
    rest: float | None  # median segment in its other evaluated windows (own history)
    mean: float | None  # mean segment in its slow windows
    peer_slow: float | None  # the peer's, in the same windows
    peer_rest: float | None
    peer_mean: float | None


def _stat(v: np.ndarray, how: str) -> float | None:
    v = v[np.isfinite(v)]
    if v.size == 0:
        return None
    return float(np.median(v) if how == "median" else v.mean())


def pair_timing(
    segment: np.ndarray, window: np.ndarray, col: int, slow: list[int], evaluated: list[int]
) -> PairTiming:
    """Note 1–3 figures from the instance × rank segment matrix (two columns) of one communicator."""
    in_slow = np.isin(window, slow)
    in_rest = np.isin(window, sorted(set(evaluated) - set(slow)))
    mine, peer = segment[:, col], segment[:, 1 - col]
    return PairTiming(
        _stat(mine[in_slow], "median"), _stat(mine[in_rest], "median"), _stat(mine[in_slow], "mean"),
        _stat(peer[in_slow], "median"), _stat(peer[in_rest], "median"), _stat(peer[in_slow], "mean"),
    )  # fmt: skip


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def own_timing_row(t: PairTiming, th: BackingThresholds) -> dict[str, Any] | None:
    """Note 2: the evidence row when the rank's own segment grew and its peer's did not shrink."""
    mine, peer = _ratio(t.slow, t.rest), _ratio(t.peer_slow, t.peer_rest)
    if mine is None or peer is None or mine < 1 + th.slow_min or peer < 1 - th.slow_min:
        return None
    return {"metric": "compute_segment_us", "how": "median", "culprit": t.slow, "peers_median": t.peer_slow,
            "ratio": _ratio(t.slow, t.peer_slow), "own_history": t.rest, "peer_own_history": t.peer_rest,
            "backs": "own_timing"}  # fmt: skip


def model_row(t: PairTiming, expected_us: float | None, th: BackingThresholds) -> dict[str, Any] | None:
    """Note 3: the evidence row when the rank runs slower than the model and its peer at its pace."""
    mine, peer = _ratio(t.mean, expected_us), _ratio(t.peer_mean, expected_us)
    if mine is None or peer is None:
        return None
    tol = th.model_tolerance
    if mine < 1 + tol or not (1 / (1 + tol) <= peer <= 1 + tol):
        return None
    return {"metric": "compute_segment_vs_model", "how": "mean", "culprit": t.mean,
            "peers_median": t.peer_mean, "model_expected_us": expected_us, "ratio": mine,
            "peer_ratio": peer, "backs": "model"}  # fmt: skip


def backing(
    cause: str, t: PairTiming | None, expected_us: float | None, th: BackingThresholds
) -> tuple[list[str], list[dict[str, Any]]]:
    """Notes 1–3: which backings hold, and the timing evidence rows of those that do."""
    by = ["telemetry"] if cause != "unexplained" and not cause.startswith("unexplained:") else []
    rows = [r for r in (own_timing_row(t, th), model_row(t, expected_us, th)) if r] if t else []
    return by + [r["backs"] for r in rows], rows


def expected_segment_us(
    model: ModelConfig, gpu: Gpu, layout: Layout, running: int, ctx_tokens: float, backend: str = "vllm"
) -> dict[str, float]:
    """Note 3's expected segment: one decode step of ``running`` sequences at mean context
    ``ctx_tokens`` (:func:`analyzer.perf.decode_step`), less its collectives, over the step's TP
    all-reduces (2 per layer of a stage); with the step's terms, for the evidence."""
    s = perf.Setup(model, gpu, layout, backend=backend, topo=perf.Topology.for_gpu(gpu))
    terms = perf.decode_step(s, running, ctx_tokens)
    comm = terms.get("decode_tp_allreduce_s", 0.0) + terms.get("decode_ep_alltoall_s", 0.0)
    stage = (terms["decode_step_s"] - terms.get("decode_pp_send_s", 0.0)) / max(layout.pp, 1) - comm
    per_step = 2 * s.stage_layers
    return {"segment_us": stage / per_step * 1e6, "decode_step_s": terms["decode_step_s"],
            "collectives_per_step": float(per_step), "running": float(running),
            "ctx_tokens": ctx_tokens}  # fmt: skip
