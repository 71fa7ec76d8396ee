"""Issue 19's straggler scenarios on traces and telemetry built by hand in this file.

Each collective trace is a timeline written out step by step: every rank computes for its own
time after its previous all-reduce ended, arrives, and all ranks leave together ``transfer_us``
after the last arrival (what an NCCL ring does). A rank "x % slow" computes ``(1 + x) ×`` as long.
The telemetry is a table of what each GPU's counters read every second. Nothing here is produced
by ``simulate/`` or ``analyzer/``; every expected answer carries its reason in the test.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from analyzer.stragglers import Thresholds, analyze
from collector.formats import IngestContext
from collector.ingest import ingest_paths
from collector.records import frame
from collector.store import Store

WINDOW_S = 2.0
T0_US = 1_800_000_000_000_000  # epoch µs, a multiple of the window
W0 = int(T0_US // (WINDOW_S * 1e6))  # the first window's number
TH = Thresholds(window_s=WINDOW_S)
NS = 1000  # ns per µs


@dataclass
class Group:
    """One communicator's timeline. ``slow``: rank → compute factor (1.07 = 7 % slower);
    ``when``: rank → window offsets it is slow in (absent: always)."""

    n_ranks: int = 8
    steps: int = 1900  # ~21 ms a step: ~95 instances in each 2 s window, 20 windows
    compute_us: float = 20_000.0
    transfer_us: float = 1_000.0
    jitter: float = 0.01  # compute time's relative standard deviation
    slow: dict[int, float] = field(default_factory=dict)
    when: dict[int, set[int]] = field(default_factory=dict)
    hosts: list[str] = field(default_factory=list)
    comm_id: str = "0xc0ffee"
    seed: int = 1


def trace(g: Group) -> Any:
    """``collective_records`` rows of ``g`` (Inspector verbose: start and stop per rank)."""
    rng = np.random.default_rng(g.seed)
    hosts = g.hosts or ["node0"] * g.n_ranks
    free = np.full(g.n_ranks, float(T0_US))  # when each rank's previous collective ended
    cols: dict[str, list[Any]] = {
        k: [] for k in ("coll_sn", "rank", "host", "start_us", "stop_us", "exec_us")
    }
    for sn in range(g.steps):
        dur = g.compute_us * (1 + g.jitter * rng.standard_normal(g.n_ranks))
        window = int((free.min() + g.compute_us - T0_US) // (WINDOW_S * 1e6))
        for r, f in g.slow.items():
            if r not in g.when or window in g.when[r]:
                dur[r] *= f
        arrive = free + dur
        stop = arrive.max() + g.transfer_us + rng.uniform(0.0, 2.0, g.n_ranks)
        for r in range(g.n_ranks):
            for k, v in (("coll_sn", sn), ("rank", r), ("host", hosts[r]), ("start_us", arrive[r]),
                         ("stop_us", stop[r]), ("exec_us", stop[r] - arrive[r])):  # fmt: skip
                cols[k].append(v)
        free = stop
    n = len(cols["rank"])
    cols.update(origin=["inspector"] * n, comm_id=[g.comm_id] * n, kind=["coll"] * n, op=["AllReduce"] * n)
    cols.update(n_ranks=[g.n_ranks] * n, msg_bytes=[16 << 20] * n, pid=[4000 + r for r in cols["rank"]])
    return frame("collective_records", cols)


HEALTHY: dict[str, float] = {
    "sm_clock_mhz": 1980.0,
    "gpu_temp_c": 66.0,
    "power_w": 640.0,
    "power_limit_w": 700.0,
    "gpu_util_ratio": 0.99,
    "pcie_link_gen_last": 5.0,
    "pcie_link_width_last": 16.0,
    "throttle_reasons_mask": 0.0,
    "xid_last": 0.0,
    "ecc_sbe_volatile_total": 0.0,
    "ecc_dbe_volatile_total": 0.0,
    "pcie_replay_total": 0.0,
    "nvlink_replay_errors_total": 0.0,
    "thermal_violation_s": 0.0,
    "power_violation_s": 0.0,
}
Series = float | Callable[[np.ndarray], np.ndarray]  # a constant, or a function of seconds since T0


def telemetry(
    gpus: list[tuple[str, int]], special: dict[tuple[str, int], dict[str, Series]], seconds: int = 60
) -> Any:
    """``gpu_samples`` every second: :data:`HEALTHY` values, replaced per GPU by ``special``."""
    t = np.arange(seconds, dtype=float)
    cols: dict[str, list[Any]] = {k: [] for k in ("ts_ns", "host", "gpu", "uuid", "metric", "value")}
    for host, gpu in gpus:
        values: dict[str, Series] = {**HEALTHY, **special.get((host, gpu), {})}
        for metric, v in values.items():
            series = v(t) if callable(v) else np.full(t.size, v)
            cols["ts_ns"] += (T0_US * NS + t * 1e9).astype(np.int64).tolist()
            cols["value"] += [float(x) for x in series]
            for k, val in (("host", host), ("gpu", gpu), ("uuid", f"GPU-{host}-{gpu}"), ("metric", metric)):
                cols[k] += [val] * t.size
    return frame("gpu_samples", cols)


def judge(*groups: Group, gpu: Any = None, fabric: Any = None) -> list[dict[str, Any]]:
    st = Store(":memory:")
    for g in groups:
        st.write("collective_records", trace(g))
    if gpu is not None:
        st.write("gpu_samples", gpu)
    if fabric is not None:
        st.write("fabric_samples", fabric)
    with st.cursor() as con:
        return list(analyze(con, "inspector", th=TH)["origins"]["inspector"])


def node0(n: int = 8) -> list[tuple[str, int]]:
    return [("node0", g) for g in range(n)]


def causes(s: dict[str, Any]) -> list[str]:
    return [c["cause"] for c in s["causes"]]


def ev(s: dict[str, Any], metric: str) -> dict[str, Any]:
    return next(e for e in s["evidence"] if e["metric"] == metric)


# ---- traces --------------------------------------------------------------------------------------


def test_persistent_and_intermittent_are_both_named() -> None:
    """Rank 2 computes 15 % longer in every step: slow in every window, persistent. Rank 6
    computes 40 % longer only in windows 5 and 12 (two steps' worth of windows): named too,
    intermittent, with exactly those windows. The old ≥ 0.5 blame-share gate could never name
    rank 6, because rank 2 is late in the same windows."""
    found = judge(Group(slow={2: 1.15, 6: 1.40}, when={6: {5, 12}}))
    assert sorted((s["rank"], s["kind"]) for s in found) == [(2, "persistent"), (6, "intermittent")]
    by = {s["rank"]: s for s in found}
    assert by[2]["windows_flagged"] == by[2]["windows_evaluated"] >= 20  # everyone runs at rank 2's pace
    assert by[6]["flagged_windows"] == [W0 + 5, W0 + 12]
    assert [e["windows"] for e in by[6]["episodes"]] == [1, 1]
    assert by[6]["episodes"][0]["start_ns"] == (W0 + 5) * int(WINDOW_S * 1e9)
    assert by[2]["slowness"] == pytest.approx(0.15, abs=0.01)
    assert by[6]["slowness"] == pytest.approx(0.40, abs=0.02)


@pytest.mark.parametrize("factor", [1.05, 1.06, 1.07])
def test_mild_consistent_slowness_is_found(factor: float) -> None:
    """Rank 4 computes 5–7 % longer in every step, with 2 % jitter on every rank: its arrival is
    last or near last in nearly every instance, so every window's test rejects; slowness is
    measured from the compute segments (start − previous stop) and comes out at the factor."""
    found = judge(Group(slow={4: factor}, jitter=0.02))
    assert [(s["rank"], s["kind"]) for s in found] == [(4, "persistent")]
    assert found[0]["slowness"] == pytest.approx(factor - 1, abs=0.01)
    assert found[0]["z"] > 10 and found[0]["q_value"] < 1e-6


def test_two_stragglers_at_once() -> None:
    """Rank 1 is 10 % slow and rank 7 is 5 % slow, both always: rank 7 is second to last in
    nearly every instance (never last), which an arrival-order test still sees; both named."""
    found = judge(Group(slow={1: 1.10, 7: 1.05}))
    assert [(s["rank"], s["kind"]) for s in found] == [(1, "persistent"), (7, "persistent")]
    assert [round(s["slowness"], 2) for s in found] == [0.10, 0.05]
    assert found[1]["blame_share"] < 0.05  # blame goes to rank 1: a blame gate would miss rank 7


def test_balanced_group_names_nobody() -> None:
    """All eight ranks draw their compute time from the same distribution: nobody is slow."""
    assert judge(Group(jitter=0.03, seed=11)) == []


@pytest.mark.parametrize("seed", range(8))
def test_healthy_groups_stay_quiet_across_seeds(seed: int) -> None:
    """Eight healthy 8-rank groups (160 rank × window tests each): false discoveries are
    controlled across all of them, so none names a rank (the old rule flagged 1–3 windows)."""
    assert judge(Group(jitter=0.02, seed=100 + seed, steps=1000)) == []


# ---- NCCL ≥ 2.19 kernel names (Kineto) -------------------------------------------------------------


def _kineto_rank(rank: int, gemm_us: list[int], starts: list[int], stops: list[int]) -> dict[str, Any]:
    """One rank's trace: per step a ProfilerStep, a GEMM, then an ncclDevKernel all-reduce (the
    kernel's start is its arrival: it begins when the GEMM before it on the GPU is done)."""
    ev: list[dict[str, Any]] = []
    pid = 1000 + rank
    args = {"Collective name": "allreduce", "In msg nelems": 4194304, "Out msg nelems": 4194304,
            "Group size": 8, "dtype": "BFloat16", "Process Group Name": "0",
            "Process Group Description": "tp", "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]"}  # fmt: skip
    for s, (g, a, b) in enumerate(zip(gemm_us, starts, stops, strict=True)):
        t = T0_US + s * 4000
        c = 10 * s
        ev += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 1}", "pid": pid, "tid": pid,
             "ts": t, "dur": 3995, "args": {"External id": s}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": pid,
             "ts": t + 5, "dur": 4, "args": {"correlation": c + 1}},
            {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "pid": rank,
             "tid": 7, "ts": t + 20, "dur": g, "args": {"correlation": c + 1, "stream": 7, "device": rank}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": pid,
             "ts": t + 9, "dur": 4, "args": {"correlation": c + 2}},
            {"ph": "X", "cat": "kernel", "pid": rank, "tid": 20, "ts": a, "dur": b - a,
             "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
             "args": {"correlation": c + 2, "stream": 20, "device": rank, "Seq": s + 1, **args}},
        ]  # fmt: skip
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 8},
            "traceEvents": ev}  # fmt: skip


def test_nccl_2_19_dev_kernel_names(tmp_path: Path) -> None:
    """NCCL ≥ 2.19 names its kernels ``ncclDevKernel_*`` (HTA's finder matches only
    ``ncclKernel``). Rank 5's GEMM takes 1.3 × 1,600 µs, so it reaches the all-reduce ~480 µs
    after everyone else in each of 12 steps: named, persistent, cause slow_compute (its compute
    kernels are 1.3 × its peers')."""
    rng = np.random.default_rng(3)
    steps = 12
    gemm = rng.integers(1590, 1611, size=(8, steps))
    gemm[5] = (gemm[5] * 1.3).astype(int)
    starts = [[T0_US + s * 4000 + 20 + int(gemm[r, s]) + 10 for s in range(steps)] for r in range(8)]
    stops = [max(starts[r][s] for r in range(8)) + 400 for s in range(steps)]
    folder = tmp_path / "tp8_ncclDevKernel"
    folder.mkdir()
    for r in range(8):
        doc = _kineto_rank(r, gemm[r].tolist(), starts[r], stops)
        (folder / f"rank-{r}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    st = Store(":memory:")
    ingest_paths(st, [folder], IngestContext(ts_ns=0, host="node0"))
    with st.cursor() as con:
        found = analyze(con, "kineto:tp8_ncclDevKernel")["origins"]["kineto:tp8_ncclDevKernel"]
    assert [(s["rank"], s["kind"], s["cause"]) for s in found] == [(5, "persistent", "slow_compute")]
    assert ev(found[0], "compute_kernel_time_ratio")["ratio"] == pytest.approx(1.3, abs=0.01)


# ---- telemetry -------------------------------------------------------------------------------------


def test_tp2_thermal_is_named_from_its_telemetry() -> None:
    """TP2: GPU 1 runs at 1,584 MHz (thermal throttle bits 0x40 set, 87 °C) against its peer's
    1,980 MHz, so it computes 1980/1584 = 1.25 × as long and rank 0 waits for it every step.
    With two ranks the arrival test alone cannot tell "1 is slow" from "0 is fast"; the clock,
    the mask and the temperature against the peer back it: persistent, gpu_throttled: thermal."""
    hot = {"sm_clock_mhz": 1584.0, "throttle_reasons_mask": 64.0, "gpu_temp_c": 87.0}
    found = judge(Group(n_ranks=2, slow={1: 1.25}), gpu=telemetry(node0(2), {("node0", 1): hot}))
    assert [(s["rank"], s["kind"], s["cause"]) for s in found] == [
        (1, "persistent", "gpu_throttled: thermal")
    ]
    clock = ev(found[0], "sm_clock_mhz")
    assert (clock["culprit"], clock["peers_median"]) == (1584.0, 1980.0)
    assert ev(found[0], "throttle_reasons_mask")["culprit"] == 64.0


def test_tp2_without_telemetry_backing_names_nobody() -> None:
    """The same TP2 timeline with two identical healthy GPUs: rank 0 waits for rank 1, but
    nothing says rank 1 is the abnormal one (rule 7), so nothing is named."""
    assert judge(Group(n_ranks=2, slow={1: 1.25}), gpu=telemetry(node0(2), {})) == []


def test_lower_power_limit() -> None:
    """GPU 3's power limit is 600 W against 700 W on its peers; it draws 597 W (at its cap, SW
    power-cap bit 0x4) and clocks 1,850 MHz, so it computes 7 % longer: persistent,
    gpu_throttled: power_limit, with the limit against the peers' as evidence."""
    capped = {"power_limit_w": 600.0, "power_w": 597.0, "sm_clock_mhz": 1850.0, "throttle_reasons_mask": 4.0}
    found = judge(Group(slow={3: 1.07}), gpu=telemetry(node0(), {("node0", 3): capped}))
    assert [(s["rank"], s["kind"], s["cause"]) for s in found] == [
        (3, "persistent", "gpu_throttled: power_limit")
    ]
    lim = ev(found[0], "power_limit_w")
    assert (lim["culprit"], lim["peers_median"]) == (600.0, 700.0)


def test_rising_nvlink_errors_are_persistent_slow_link() -> None:
    """GPU 6's NVLink replay counter climbs 40 a second while its peers' stay at 0; every GPU
    carries the same old CRC count (a static counter equal everywhere). Rank 6 is 10 % slow in
    every window: persistent (the old rule said transient), cause slow_link."""
    special = {("node0", g): {"nvlink_crc_flit_errors_total": 12.0} for g in range(8)}
    special[("node0", 6)]["nvlink_replay_errors_total"] = lambda t: 40.0 * t
    found = judge(Group(slow={6: 1.10}), gpu=telemetry(node0(), special))
    assert [(s["rank"], s["kind"], s["cause"]) for s in found] == [(6, "persistent", "slow_link")]
    rise = ev(found[0], "nvlink_replay_errors_total")
    assert rise["culprit"] > 0 and rise["peers_median"] == 0.0
    assert ev(found[0], "nvlink_crc_flit_errors_total")["culprit"] == 0.0  # static: no rise


def test_static_ecc_aggregate_is_never_the_cause() -> None:
    """GPU 5 carries a lifetime ECC aggregate of 2 (SBE and DBE) and a volatile SBE count of 3
    that does not move; its peers read 0. Rank 5 is 8 % slow because its host starves it: its
    GPU is busy 91 % of the time while its peers, waiting inside the all-reduce, read 99 %, with
    normal clocks. The aggregate is never read and the flat volatile counter does not rise, so
    the cause is host_contention and ecc_errors is not among the causes."""
    gpu5 = {"ecc_sbe_total": 2.0, "ecc_dbe_total": 2.0, "ecc_sbe_volatile_total": 3.0, "gpu_util_ratio": 0.91}
    found = judge(Group(slow={5: 1.08}), gpu=telemetry(node0(), {("node0", 5): gpu5}))
    assert [(s["rank"], s["kind"], s["cause"]) for s in found] == [(5, "persistent", "host_contention")]
    assert "ecc_errors" not in causes(found[0])
    assert ev(found[0], "ecc_sbe_volatile_total")["culprit"] == 0.0
    assert not [e for e in found[0]["evidence"] if e["metric"] in ("ecc_sbe_total", "ecc_dbe_total")]


def test_host_contention_in_some_windows() -> None:
    """Rank 0's host runs a noisy batch job during windows 3–6 (seconds 6–14): its GPU idles
    (util 0.88 then, 0.99 otherwise) and it computes 12 % longer only then. Named intermittent
    in those four windows, cause host_contention (clocks normal, nothing else differs)."""

    def util(t: np.ndarray) -> np.ndarray:
        return np.where((t >= 6) & (t < 14), 0.88, 0.99)

    found = judge(
        Group(slow={0: 1.12}, when={0: {3, 4, 5, 6}}),
        gpu=telemetry(node0(), {("node0", 0): {"gpu_util_ratio": util}}),
    )
    assert [(s["rank"], s["kind"], s["cause"]) for s in found] == [(0, "intermittent", "host_contention")]
    assert found[0]["flagged_windows"] == [W0 + w for w in (3, 4, 5, 6)]
    assert ev(found[0], "gpu_util_ratio")["own_history"] == pytest.approx(0.99)


def test_healthy_groups_with_harmless_differences_name_nobody() -> None:
    """Two healthy 8-GPU TP groups on two nodes; GPU node0/3 runs 4 °C warmer, node1/5 carries an
    old lifetime ECC aggregate of 7 and node1/2 an XID 79 from before the window (the gauge keeps
    the last code). No rank is slow, so nothing is named, whatever the telemetry says."""
    a = Group(comm_id="0xaaa", seed=21, jitter=0.02, hosts=["node0"] * 8)
    b = Group(comm_id="0xbbb", seed=22, jitter=0.02, hosts=["node1"] * 8)
    special = {("node0", 3): {"gpu_temp_c": 70.0}, ("node1", 5): {"ecc_dbe_total": 7.0},
               ("node1", 2): {"xid_last": 79.0}}  # fmt: skip
    gpus = node0() + [("node1", g) for g in range(8)]
    assert judge(a, b, gpu=telemetry(gpus, special)) == []


def test_ib_port_congestion_on_the_slow_host() -> None:
    """Four ranks on two hosts; ranks 2 and 3 (host B) are 10 % slow. Host B's port waits to send
    (port_xmit_wait) 50 × as often as host A's and discards 20 packets a second; its GPUs are
    healthy. Both ranks are named, cause ib_congestion, with the xmit wait as evidence."""
    g = Group(n_ranks=4, slow={2: 1.10, 3: 1.10}, hosts=["hostA", "hostA", "hostB", "hostB"])
    gpus = [("hostA", 0), ("hostA", 1), ("hostB", 0), ("hostB", 1)]
    t = np.arange(60, dtype=float)
    rows = []
    for host, wait, drop in (("hostA", 1e5, 0.0), ("hostB", 5e6, 20.0)):
        for metric, per_s in (("tx_wait", wait), ("tx_discards", drop), ("tx_bytes", 4e10)):
            rows += [{"ts_ns": int(T0_US * NS + s * 1e9), "host": host, "device": "mlx5_0", "port": 1,
                      "metric": metric, "value": per_s * s, "rate_per_s": per_s} for s in t]  # fmt: skip
    found = judge(g, gpu=telemetry(gpus, {}), fabric=frame("fabric_samples", rows))
    assert sorted((s["rank"], s["host"], s["cause"]) for s in found) == [
        (2, "hostB", "ib_congestion"),
        (3, "hostB", "ib_congestion"),
    ]
    wait = ev(found[0], "ib_tx_wait")
    assert wait["culprit"] == pytest.approx(50 * wait["peers_median"])


def test_pcie_link_trained_down() -> None:
    """GPU 1's link trained to Gen4 x8 while its peers run Gen5 x16 (its host-device copies take
    4 × as long), so rank 1 is 9 % slow; clocks, temperatures and counters are normal:
    pcie_link_degraded, with both the generation and the width as evidence."""
    gpu1 = {"pcie_link_gen_last": 4.0, "pcie_link_width_last": 8.0}
    found = judge(Group(slow={1: 1.09}), gpu=telemetry(node0(), {("node0", 1): gpu1}))
    assert [(s["rank"], s["kind"], s["cause"]) for s in found] == [(1, "persistent", "pcie_link_degraded")]
    (c,) = [c for c in found[0]["causes"] if c["cause"] == "pcie_link_degraded"]
    assert [(e["metric"], e["culprit"], e["peers_median"]) for e in c["evidence"]] == [
        ("pcie_link_gen_last", 4.0, 5.0), ("pcie_link_width_last", 8.0, 16.0)]  # fmt: skip


def test_new_xid_but_not_an_old_one() -> None:
    """GPU 4 reports XID 79 from second 10 on (the gauge read 0 before): rank 4, 12 % slow from
    then on, is named with cause gpu_xid. GPU 2 is a thermal straggler (1,600 MHz, 0x40, 86 °C)
    whose XID gauge has read 13 since the first sample: an old code, not a cause."""

    def xid(t: np.ndarray) -> np.ndarray:
        return np.where(t >= 10, 79.0, 0.0)

    special = {("node0", 4): {"xid_last": xid},
               ("node0", 2): {"xid_last": 13.0, "sm_clock_mhz": 1600.0, "throttle_reasons_mask": 64.0,
                              "gpu_temp_c": 86.0}}  # fmt: skip
    g = Group(slow={4: 1.12, 2: 1.2}, when={4: set(range(5, 40))})
    found = {s["rank"]: s for s in judge(g, gpu=telemetry(node0(), special))}
    assert sorted(found) == [2, 4]
    assert found[4]["cause"] == "gpu_xid" and ev(found[4], "xid_last")["culprit"] == 79.0
    assert found[2]["cause"] == "gpu_throttled: thermal" and "gpu_xid" not in causes(found[2])


def test_inspector_without_timestamps() -> None:
    """Non-verbose Inspector records carry only each rank's kernel time and the dump time: all
    ranks leave together, so the 10 % slow rank 3 shows the shortest kernel (it waited least).
    It is named from that alone; its slowness comes from the period (time per call between
    records) and still reads about 10 %."""
    rec = trace(Group(slow={3: 1.10})).with_columns(
        (pl.col("stop_us") + 1000).alias("dump_ts_us"), pl.lit(None, pl.Float64).alias("start_us"),
        pl.lit(None, pl.Float64).alias("stop_us"),
    )  # fmt: skip
    st = Store(":memory:")
    st.write("collective_records", rec)
    with st.cursor() as con:
        found = analyze(con, "inspector", th=TH)["origins"]["inspector"]
    assert [(s["rank"], s["kind"]) for s in found] == [(3, "persistent")]
    assert found[0]["slowness"] == pytest.approx(0.10, abs=0.02)


def test_row_order_and_junk_rows_change_nothing() -> None:
    """The same timeline shuffled, with Prometheus aggregates (coll_sn −1) and records seen on one
    rank only added, names the same ranks with the same figures: instances are keyed by
    coll_sn, and rows that are not instances are left out (collectives rule 1)."""
    from analyzer.stragglers import find_stragglers

    clean = trace(Group(slow={2: 1.15, 6: 1.40}, when={6: {5, 12}}, steps=900))
    junk = clean.head(50).with_columns(pl.lit(-1, pl.Int64).alias("coll_sn"))
    lonely = clean.filter(pl.col("rank") == 0).head(30).with_columns(pl.col("coll_sn") + 10_000)
    messy = pl.concat([clean, junk, lonely]).sample(fraction=1.0, shuffle=True, seed=4)

    def key(rec: pl.DataFrame) -> list[tuple[Any, ...]]:
        rec = rec.with_columns(pl.col("start_us").alias("t_us"))
        return [(s.rank, s.kind, s.flagged_windows, round(s.slowness or 0, 9), round(s.z, 6))
                for s in find_stragglers(rec, TH)]  # fmt: skip

    assert key(messy) == key(clean) and [k[0] for k in key(clean)] == [6, 2]


def test_tp2_backed_by_its_own_history() -> None:
    """TP2 across two hosts; only host B (rank 1) is scraped. Its GPU's clock reads 1,584 MHz in
    seconds 16–24 and 1,980 MHz before and after, and rank 1 is 25 % slow exactly then (windows
    8–11). With no peer telemetry, the drop against its own history backs the verdict:
    intermittent, gpu_throttled, the clock's own history shown."""

    def clock(t: np.ndarray) -> np.ndarray:
        return np.where((t >= 16) & (t < 24), 1584.0, 1980.0)

    g = Group(n_ranks=2, slow={1: 1.25}, when={1: {8, 9, 10, 11}}, hosts=["hostA", "hostB"])
    found = judge(g, gpu=telemetry([("hostB", 0)], {("hostB", 0): {"sm_clock_mhz": clock}}))
    assert [(s["rank"], s["host"], s["kind"], s["cause"]) for s in found] == [
        (1, "hostB", "intermittent", "gpu_throttled")]  # fmt: skip
    assert found[0]["flagged_windows"] == [W0 + w for w in (8, 9, 10, 11)]
    c = ev(found[0], "sm_clock_mhz")
    assert (c["culprit"], c["peers_median"], c["own_history"]) == (1584.0, None, 1980.0)
