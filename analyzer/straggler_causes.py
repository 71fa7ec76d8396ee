"""Why a straggler is slow: its GPU's telemetry, counter by counter, against its peers and itself.

Used by :mod:`analyzer.stragglers` once a rank is named; the readers of the hosts' ports, the
engine's step timing and kernel traces are in :mod:`analyzer.straggler_sources`. The culprit is
the rank's GPU (host, index); its peers are the other GPUs of the communicator; the spans are
the windows the rank was slow in, and its own history is the rest of the communicator's
evaluated time.

How each counter is read (one rule per kind, never a pattern over names, never a difference
between two different counters):

1. Gauges (:data:`GAUGES`): mean of the samples inside the spans; the peers' value is the median
   of the peers' means. The culprit's mean over its own history is shown where there is one.
2. Volatile counters (:data:`COUNTERS`): the sum of positive steps between consecutive samples of
   the *same* counter (and link) inside the spans, starting from the last sample before each
   span; a step down is a reset and counts 0. Lifetime/aggregate counters (``ecc_*_total`` without
   ``volatile``, retired pages, remapped rows) are never read: a static aggregate never "rises".
3. ``throttle_reasons_mask``: the bits set in at least half of a GPU's samples; the culprit's own
   bits are those most peers do not have. Idle (0x1), application clocks (0x2) and display
   (0x100) are ignored.
4. ``xid_last``: an XID is new when a sample in the spans is non-zero and differs from the sample
   before it (the gauge keeps the last code, so a GPU's first sample tells nothing: it may be old).
5. InfiniBand/RoCE (``fabric_samples``, per host): the counters of :data:`IB_ERRORS` and
   :data:`IB_CONGESTION` summed over the host's ports, read as in rule 2; compared only when the
   communicator spans several hosts (a one-host group does not cross the fabric).
5b. Engine step time (``engine_step_s``): the mean of a per-step latency histogram, Σ rise of
   its ``_sum`` / Σ rise of its ``_count`` (rule 2, per series): TGI's ``batch_step_seconds``
   (one observation per forward pass), else ``itl_seconds`` (vLLM and SGLang observe it once
   per engine step per running request). SGLang's ``forward_busy_seconds_total`` rises by the
   seconds the GPU runs forward passes: its rise over the elapsed seconds is
   ``engine_forward_busy_ratio``. The culprit's figures are those of the engines scraped on its
   host (``targets.host`` of the sample's source) — or, when every series carries a
   ``tp_rank`` (SGLang exporting from every scheduler), of the series whose ``tp_rank`` is its
   rank — in its slow windows, against its own history and the median of its peers (the other
   hosts, or the other ``tp_rank``) in the same windows. An engine whose TP group spans the
   host's GPUs times the group's step, not one rank's.

Causes, in order; each that fits is listed with its evidence, the first is the verdict:

6. ``gpu_xid``: a new XID on the culprit in its slow windows.
7. ``ecc_errors``: a volatile ECC counter rises on the culprit more than on the median peer.
8. ``gpu_throttled: …``: SM clock < ``clock_ratio_max`` × the peers (or × its own history), or a
   culprit-only throttle bit, or a violation counter rising on the culprit only. Sub-cause
   ``thermal`` (≥ ``temp_delta_c`` hotter, thermal bits or thermal violation), else
   ``power_limit`` (its power limit < ``power_limit_ratio_max`` × the peers'), else ``power``
   (power bits or power violation), else none. A lower power limit with the GPU drawing ≥ 90 %
   of it is ``gpu_throttled: power_limit`` even without clock samples.
9. ``pcie_link_degraded``: current PCIe link generation or width below the peers' median.
10. ``slow_link``: PCIe replays or NVLink error counters rising more than on the median peer.
11. ``ib_port_errors`` / ``ib_congestion``: the culprit host's port error counters rise more
    than the other hosts' median, or its congestion counters (xmit wait, discards, ECN/CNP)
    ≥ ``congestion_ratio`` × theirs.
12. ``slow_compute`` (kernel traces): the culprit's compute kernels take ≥ ``compute_ratio_min``
    × the peers' median mean time.
13. ``host_contention``: the GPU idles while its peers wait in the collective, with a normal
    clock (not rule 8): (a) kernel traces: an idle share of its kernel time ≥ ``util_gap_min``
    above the peers'; (b) the engine's step timing (rule 5b): the step takes ≥
    ``compute_ratio_min`` × as long as in its own history (else as its peers') while the GPU
    idles: its utilization (``gpu_util_ratio``, else ``gr_engine_active_ratio``, else
    ``sm_active_ratio``) or its engine's forward-busy share is ≥ ``util_gap_min`` below its
    peers' median or its own history; (c) else, that utilization ≥ ``util_gap_min`` below the
    peers' median. A slower step with a GPU as busy as before and as its peers is GPU-bound,
    not host contention.
14. ``unexplained`` only when none of 6–13 fits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import duckdb
import numpy as np
import polars as pl

from analyzer.straggler_sources import (
    IB_CONGESTION,
    IB_ERRORS,
    Spans,
    counter_rise,
    engine_rows,
    fabric_rows,
    gauge_mean,
    in_spans,
    kernel_rows,
    load_engine_samples,
    median_of,
    row,
)

GAUGES = (
    "sm_clock_mhz",
    "gpu_temp_c",
    "power_w",
    "power_limit_w",
    "enforced_power_limit_w",
    "gpu_util_ratio",
    "gr_engine_active_ratio",
    "sm_active_ratio",
    "pcie_link_gen_last",
    "pcie_link_width_last",
)
MASKS = ("throttle_reasons_mask", "clock_throttle_reasons_mask")  # canonical, and an older spelling
ECC = ("ecc_sbe_volatile_total", "ecc_dbe_volatile_total")
VIOLATIONS = ("thermal_violation_s", "power_violation_s")
NVLINK_ERRORS = (
    "nvlink_crc_flit_errors_total",
    "nvlink_crc_data_errors_total",
    "nvlink_replay_errors_total",
    "nvlink_recovery_errors_total",
)
COUNTERS = (*ECC, *VIOLATIONS, "pcie_replay_total", *NVLINK_ERRORS)
THERMAL_BITS = 0x20 | 0x40  # SW / HW thermal slowdown
POWER_BITS = 0x4 | 0x80  # SW power cap, HW power brake
IGNORED_BITS = 0x1 | 0x2 | 0x100  # idle, application clocks, display clock
UTIL = ("gpu_util_ratio", "gr_engine_active_ratio", "sm_active_ratio")


class CauseThresholds(Protocol):
    """The numbers rules 8–13 read (:class:`analyzer.stragglers.Thresholds`)."""

    @property
    def clock_ratio_max(self) -> float: ...

    @property
    def temp_delta_c(self) -> float: ...

    @property
    def power_limit_ratio_max(self) -> float: ...

    @property
    def util_gap_min(self) -> float: ...

    @property
    def compute_ratio_min(self) -> float: ...

    @property
    def congestion_ratio(self) -> float: ...


Gpu = tuple[str, int]


@dataclass
class Verdict:
    cause: str
    causes: list[dict[str, Any]] = field(default_factory=list)
    evidence: list[dict[str, Any]] = field(default_factory=list)


def rank_gpus(
    con: duckdb.DuckDBPyConnection,
    origin: str | None,
    mapping: dict[int, tuple[str, int]] | None = None,
    comm_id: str | None = None,
) -> tuple[dict[int, tuple[str, int]], str]:
    """rank → (host, gpu) within one communicator (ranks are numbered per communicator).

    Given ``mapping`` wins; else the ranks of the communicator on a host take its GPUs in rank order.
    """
    if mapping:
        return dict(mapping), "given"
    conds = [c for c, v in (("origin = ?", origin), ("comm_id = ?", comm_id)) if v]
    params = [v for v in (origin, comm_id) if v]
    where = f"WHERE {' AND '.join(conds)}" if conds else ""
    rows = con.execute(
        f"SELECT rank, mode(coalesce(host, '')) FROM collective_records {where} GROUP BY rank ORDER BY rank",
        params,
    ).fetchall()
    out: dict[int, tuple[str, int]] = {}
    per_host: dict[str, int] = {}
    for rank, host in rows:
        out[int(rank)] = (host, per_host.get(host, 0))
        per_host[host] = per_host.get(host, 0) + 1
    return out, "assumed: local rank order on host"


# ---- reading the samples (rules 1–5) -----------------------------------------------------------------


def mask_bits(v: np.ndarray) -> int:
    """Rule 3: bits set in at least half of the samples (ignored bits cleared)."""
    bits = 0
    for b in range(16):
        if ((v.astype(np.int64) >> b) & 1).mean() >= 0.5:
            bits |= 1 << b
    return bits & ~IGNORED_BITS


def new_xid(ts: np.ndarray, v: np.ndarray, spans: Spans) -> int:
    """Rule 4: the last new XID code inside the spans, 0 if none."""
    code = 0
    for i in np.flatnonzero(in_spans(ts, spans)):
        if v[i] != 0 and i > 0 and v[i] != v[i - 1]:
            code = int(v[i])
    return code


def _series(df: pl.DataFrame) -> dict[tuple[str, int, str, int], tuple[np.ndarray, np.ndarray]]:
    out = {}
    for key, part in df.sort("ts_ns").group_by(["host", "gpu", "metric", "link"], maintain_order=True):
        out[(str(key[0]), int(key[1]), str(key[2]), int(key[3]))] = (  # type: ignore[call-overload]
            part["ts_ns"].to_numpy(),
            part["value"].to_numpy().astype(float),
        )
    return out


def load_gpu_samples(con: duckdb.DuckDBPyConnection, hosts: list[str], lo: int, hi: int) -> pl.DataFrame:
    """The samples rules 1–4 read for ``hosts`` in ``[lo, hi)``; when none are there (telemetry
    on another clock), the hosts' last hour of samples."""
    metrics = [*GAUGES, *MASKS, *COUNTERS, "xid_last"]
    sql = (
        "SELECT host, gpu, metric, link, ts_ns, value FROM gpu_samples "
        "WHERE list_contains(?, metric) AND list_contains(?, host)"
    )
    got = con.execute(sql + " AND ts_ns >= ? AND ts_ns < ?", [metrics, hosts, lo, hi]).to_arrow_table()
    df: pl.DataFrame = pl.from_arrow(got)  # type: ignore[assignment]
    if df.height == 0:  # telemetry outside the collectives' time (another clock): its last hour
        last = sql + " AND ts_ns >= (SELECT max(ts_ns) FROM gpu_samples WHERE list_contains(?, host)) - ?"
        got = con.execute(last, [metrics, hosts, hosts, 3_600 * 10**9]).to_arrow_table()
        df = pl.from_arrow(got)  # type: ignore[assignment]
    return df


@dataclass
class Telemetry:
    """The samples of one communicator's GPUs, by (host, gpu, metric, link)."""

    series: dict[tuple[str, int, str, int], tuple[np.ndarray, np.ndarray]]

    def _links(self, gpu: Gpu, metric: str) -> list[tuple[np.ndarray, np.ndarray]]:
        agg = self.series.get((gpu[0], gpu[1], metric, -1))
        if agg is not None:
            return [agg]
        return [s for (h, g, m, _), s in self.series.items() if (h, g, m) == (gpu[0], gpu[1], metric)]

    def gauge(self, gpu: Gpu, metric: str, spans: Spans) -> float | None:
        got = self.series.get((gpu[0], gpu[1], metric, -1))
        return None if got is None else gauge_mean(*got, spans)

    def rise(self, gpu: Gpu, metric: str, spans: Spans) -> float | None:
        got = [counter_rise(ts, v, spans) for ts, v in self._links(gpu, metric)]
        vals = [g for g in got if g is not None]
        return float(sum(vals)) if vals else None

    def bits(self, gpu: Gpu, spans: Spans) -> int | None:
        for metric in MASKS:
            got = self.series.get((gpu[0], gpu[1], metric, -1))
            if got is not None and in_spans(got[0], spans).any():
                return mask_bits(got[1][in_spans(got[0], spans)])
        return None

    def xid(self, gpu: Gpu, spans: Spans) -> int | None:
        got = self.series.get((gpu[0], gpu[1], "xid_last", -1))
        return None if got is None else new_xid(*got, spans)


def evidence_rows(
    tel: Telemetry, culprit: Gpu, peers: list[Gpu], spans: Spans, history: Spans
) -> list[dict[str, Any]]:
    """Rules 1–4: one row per metric the culprit has, with the peers' median in the same spans."""
    rows = []
    for m in GAUGES:
        mine = tel.gauge(culprit, m, spans)
        if mine is not None:
            own = tel.gauge(culprit, m, history) if history else None
            rows.append(row(m, "mean", mine, median_of([tel.gauge(p, m, spans) for p in peers]), own))
    for m in COUNTERS:
        mine = tel.rise(culprit, m, spans)
        if mine is not None:
            rows.append(row(m, "rise", mine, median_of([tel.rise(p, m, spans) for p in peers])))
    bits = tel.bits(culprit, spans)
    if bits is not None:
        peer_bits = [b for b in (tel.bits(p, spans) for p in peers) if b is not None]
        common = sum(1 << b for b in range(16) if sum((pb >> b) & 1 for pb in peer_bits) * 2 > len(peer_bits))
        rows.append(row("throttle_reasons_mask", "bits", float(bits), float(common)))
    xid = tel.xid(culprit, spans)
    if xid is not None:
        rows.append(row("xid_last", "new", float(xid), median_of([tel.xid(p, spans) for p in peers])))
    return rows


# ---- rules 6–14 ------------------------------------------------------------------------------------


def _above(ev: dict[str, dict[str, Any]], metric: str, factor: float = 1.0) -> bool:
    r = ev.get(metric)
    if not r or r["culprit"] is None or r["culprit"] <= 0:
        return False
    return bool(r["culprit"] > factor * (r["peers_median"] or 0.0))


def _below(ev: dict[str, dict[str, Any]], metric: str, ratio: float) -> bool:
    r = ev.get(metric)
    if not r or r["culprit"] is None:
        return False
    vs_peers = r["peers_median"] is not None and r["culprit"] < ratio * r["peers_median"]
    vs_own = r.get("own_history") is not None and r["culprit"] < ratio * r["own_history"]
    return bool(vs_peers or vs_own)


def _own_bits(ev: dict[str, dict[str, Any]]) -> int:
    r = ev.get("throttle_reasons_mask")
    return int(r["culprit"]) & ~int(r["peers_median"] or 0) if r else 0


def _throttle(ev: dict[str, dict[str, Any]], th: CauseThresholds) -> tuple[str, list[str]] | None:
    """Rule 8."""
    bits = _own_bits(ev)
    slow_clock = _below(ev, "sm_clock_mhz", th.clock_ratio_max)
    viol = [m for m in VIOLATIONS if _above(ev, m)]
    limit = next(
        (m for m in ("enforced_power_limit_w", "power_limit_w") if _below(ev, m, th.power_limit_ratio_max)),
        None,
    )
    draw, cap = ev.get("power_w"), ev.get(limit) if limit else None
    at_cap = bool(draw and cap and draw["culprit"] is not None and draw["culprit"] >= 0.9 * cap["culprit"])
    if not (slow_clock or bits or viol or (limit and at_cap)):
        return None
    temp = ev.get("gpu_temp_c")
    hot = bool(
        temp
        and temp["peers_median"] is not None
        and temp["culprit"] - temp["peers_median"] >= th.temp_delta_c
    )
    base = ["sm_clock_mhz"] if slow_clock else []
    base += ["throttle_reasons_mask"] if bits else []
    if hot or bits & THERMAL_BITS or "thermal_violation_s" in viol:
        extra = ["gpu_temp_c"] if hot else []
        return "gpu_throttled: thermal", base + extra + [m for m in viol if m.startswith("thermal")]
    if limit:
        return "gpu_throttled: power_limit", [*base, limit, "power_w"]
    if bits & POWER_BITS or "power_violation_s" in viol:
        return "gpu_throttled: power", base + [m for m in viol if m.startswith("power")]
    return "gpu_throttled", base + viol


def classify(ev_rows: list[dict[str, Any]], th: CauseThresholds) -> list[dict[str, Any]]:
    """Rules 6–14 over the evidence rows: every cause that fits, in order, with its metrics."""
    ev = {r["metric"]: r for r in ev_rows}
    found: list[dict[str, Any]] = []

    def add(cause: str, metrics: list[str]) -> None:
        found.append({"cause": cause, "evidence": [ev[m] for m in metrics if m in ev]})

    if ev.get("xid_last") and ev["xid_last"]["culprit"]:
        add("gpu_xid", ["xid_last"])
    if any(_above(ev, m) for m in ECC):
        add("ecc_errors", [m for m in ECC if _above(ev, m)])
    throttled = _throttle(ev, th)
    if throttled:
        add(*throttled)
    link = [m for m in ("pcie_link_gen_last", "pcie_link_width_last") if _lower_link(ev.get(m))]
    if link:
        add("pcie_link_degraded", link)
    errs = [m for m in ("pcie_replay_total", *NVLINK_ERRORS) if _above(ev, m)]
    if errs:
        add("slow_link", errs)
    ib_err = [f"ib_{m}" for m in IB_ERRORS if _above(ev, f"ib_{m}")]
    if ib_err:
        add("ib_port_errors", ib_err)
    ib_cong = [f"ib_{m}" for m in IB_CONGESTION if _above(ev, f"ib_{m}", th.congestion_ratio)]
    if ib_cong:
        add("ib_congestion", ib_cong)
    comp = ev.get("compute_kernel_time_ratio")
    if comp and comp["culprit"] is not None and comp["culprit"] >= th.compute_ratio_min:
        add("slow_compute", ["compute_kernel_time_ratio"])
    host = _host_contention(ev, th, bool(throttled))
    if host:
        add("host_contention", host)
    return found


def _lower_link(r: dict[str, Any] | None) -> bool:
    """Rule 9: at least half a generation (or half a lane) below the peers' median."""
    return bool(r and r["peers_median"] is not None and r["culprit"] < r["peers_median"] - 0.5)


def _host_contention(ev: dict[str, dict[str, Any]], th: CauseThresholds, throttled: bool) -> list[str]:
    """Rule 13."""
    kernel = ev.get("gpu_idle_share")
    if (
        kernel
        and kernel["peers_median"] is not None
        and kernel["culprit"] - kernel["peers_median"] >= th.util_gap_min
    ):
        return ["gpu_idle_share"]  # (a)
    present = [ev[m] for m in UTIL if m in ev]
    util = next((u for u in present if u["peers_median"] is not None), present[0] if present else None)
    if throttled:
        return []
    idle = [
        r["metric"] for r in (util, ev.get("engine_forward_busy_ratio")) if r and _fell(r, th.util_gap_min)
    ]
    step = ev.get("engine_step_s")
    ref = step and (step.get("own_history") or step["peers_median"])
    if step and ref and step["culprit"] >= th.compute_ratio_min * ref and idle:
        return ["engine_step_s", *idle, "sm_clock_mhz"]  # (b)
    if (
        util
        and util["peers_median"] is not None
        and util["peers_median"] - util["culprit"] >= th.util_gap_min
    ):
        return [util["metric"], "sm_clock_mhz"]  # (c)
    return []


def _fell(r: dict[str, Any], gap: float) -> bool:
    """Rule 13 (b): ≥ ``gap`` below the peers' median or its own history."""
    refs = (r["peers_median"], r.get("own_history"))
    return any(ref is not None and ref - r["culprit"] >= gap for ref in refs)


def explain(
    con: duckdb.DuckDBPyConnection,
    culprit: Gpu,
    peers: list[Gpu],
    spans: Spans,
    history: Spans,
    origin: str | None,
    rank: int,
    th: CauseThresholds,
    cache: dict[Any, Any] | None = None,
) -> Verdict:
    """Rules 1–14 for one named rank. ``cache`` keeps the samples read for one set of hosts and
    time range, so the ranks of one communicator share one query. The engine's samples (rule 5b)
    are read in the slow windows even when the GPU's are not there (on another clock)."""
    hosts = sorted({culprit[0], *(p[0] for p in peers)})
    allspans = spans + history
    lo = min(s[0] for s in allspans) - 3_600 * 10**9 if allspans else 0
    hi = max(s[1] for s in allspans) if allspans else 2**62
    cache = {} if cache is None else cache
    key = (tuple(hosts), lo, hi)
    if key not in cache:
        cache[key] = Telemetry(_series(load_gpu_samples(con, hosts, lo, hi)))
        cache[("engine", *key)] = load_engine_samples(con, hosts, lo, hi)
    tel = cache[key]
    other_hosts = sorted({p[0] for p in peers} - {culprit[0]})
    engine = engine_rows(
        cache[("engine", *key)], culprit[0], rank, other_hosts, spans, history
    )  # its windows
    if not any(
        in_spans(ts, spans).any() for (h, g, _, _), (ts, _v) in tel.series.items() if (h, g) == culprit
    ):
        spans, history = [(0, 2**62)], []  # no sample inside the slow windows: judge on all of them
    rows = evidence_rows(tel, culprit, peers, spans, history)
    rows += fabric_rows(con, culprit[0], other_hosts, spans)
    rows += engine
    rows += kernel_rows(con, origin, rank)
    found = classify(rows, th)
    return Verdict(found[0]["cause"] if found else "unexplained", found, rows)
