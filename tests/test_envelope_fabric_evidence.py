"""The network zone's port-counter evidence, the engine's measured roofline, and NIXL's transfer
time for P/D, on hand-built signals (classify is pure: the inputs are written here with the reason
for each expected answer)."""

from __future__ import annotations

from analyzer.critical_path import CriticalPath
from analyzer.envelope import Signals, classify
from analyzer.thresholds import Thresholds

T0, T1 = 0, 600 * 1_000_000_000
# TP16 across two nodes at a plateau: GPUs mostly idle, 60 % of wall time in cross-node all-reduces.
CROSS = CriticalPath(collectives_cross_nodes=True, why="NCCL records: 1 of 1 communicators span nodes",
                     network_share=0.6)  # fmt: skip
GPU = {"sm_active_ratio": 0.25, "tensor_active_ratio": 0.08, "dram_active_ratio": 0.1}
ENGINE = {"requests_running": 64.0, "requests_waiting": 80.0, "kv_usage_ratio": 0.2}


def _ev(v, signal):  # type: ignore[no-untyped-def]
    return [e for e in v.evidence if e.signal == signal]


def test_a_busy_ib_link_and_discards_count_for_the_network() -> None:
    # the busiest port sends 85 % of its 50 GB/s and drops packets: a saturated, congested link
    sig = Signals(gpu=dict(GPU), engine=dict(ENGINE), path=CROSS, collectives={"collective_share_ratio": 0.6},
                  fabric={"ports": 2, "tx_utilization_max": 0.85, "discards_per_s_max": 3.0,
                          "xmit_wait_per_s_max": 1e6})  # fmt: skip
    v = classify(sig, Thresholds(), "tp16", T0, T1)
    assert v.primary == "network"
    (util,) = _ev(v, "ib_tx_utilization")
    (drops,) = _ev(v, "ib_tx_discards_per_s")
    (wait,) = _ev(v, "ib_xmit_wait_ticks_per_s")
    assert (util.verdict, drops.verdict, wait.verdict) == ("pass", "pass", "info")


def test_a_quiet_ib_link_is_reported_never_held_against_the_network() -> None:
    # latency-bound small all-reduces leave the link nearly idle: no evidence either way
    sig = Signals(gpu=dict(GPU), engine=dict(ENGINE), path=CROSS, collectives={"collective_share_ratio": 0.6},
                  fabric={"ports": 2, "tx_utilization_max": 0.05, "discards_per_s_max": 0.0})  # fmt: skip
    v = classify(sig, Thresholds(), "tp16", T0, T1)
    assert v.primary == "network"
    assert [e.verdict for e in _ev(v, "ib_tx_utilization")] == ["info"]
    assert [e.verdict for e in _ev(v, "ib_tx_discards_per_s")] == ["info"]


def test_port_counters_inside_one_node_are_never_network_evidence() -> None:
    # TP8 in one NVLink node: whatever the NIC does, the collectives do not use it
    inside = CriticalPath(collectives_cross_nodes=False, why="declared: a group of 8 GPUs fits one domain")
    quiet = {"requests_running": 2.0, "requests_waiting": 0.0, "kv_usage_ratio": 0.01}
    sig = Signals(gpu=dict(GPU), engine=quiet,
                  path=inside, fabric={"ports": 1, "tx_utilization_max": 0.9})  # fmt: skip
    v = classify(sig, Thresholds(), "tp8", T0, T1)
    assert v.scores["network"] is None and v.primary == "headroom"
    assert [e.verdict for e in _ev(v, "ib_tx_utilization")] == ["info"]


def test_the_engines_roofline_is_reported_beside_compute_and_hbm() -> None:
    # vLLM's MFU counters: 0.4 of dense peak, 0.7 of HBM bandwidth, per GPU
    sig = Signals(gpu=dict(GPU), engine=dict(ENGINE), roofline={"flops_ratio": 0.4, "hbm_ratio": 0.7})
    v = classify(sig, Thresholds(), "one", T0, T1)
    (flops,) = _ev(v, "engine_flops_over_peak")
    (hbm,) = _ev(v, "engine_bytes_over_hbm_peak")
    assert (flops.zone, flops.value, flops.verdict) == ("compute", 0.4, "info")
    assert (hbm.zone, hbm.value, hbm.verdict) == ("hbm_bandwidth", 0.7, "info")


def test_nixl_transfer_share_is_p_d_network_evidence() -> None:
    # P/D on two nodes: requests wait for their KV (queue 90 % of TTFT), NIXL says the transfer
    # is 60 % of TTFT, GPUs idle, KV pool nearly empty
    pd = CriticalPath(collectives_cross_nodes=False, kv_transfer_crosses_nodes=True, why="P/D on 2 nodes")
    engine = {"requests_running": 10.0, "requests_waiting": 4.0, "kv_usage_ratio": 0.02}
    sig = Signals(gpu=dict(GPU), engine=engine,
                  means={"queue_seconds": 0.9, "ttft_seconds": 1.0, "kv_transfer_seconds": 0.6}, path=pd,
                  kv_transfer_share=0.6, kv_transfer_source="engine NIXL transfer time")  # fmt: skip
    v = classify(sig, Thresholds(), "pd", T0, T1)
    assert v.primary == "network"
    (share,) = _ev(v, "kv_transfer_share_of_ttft")
    assert share.verdict == "pass" and "NIXL" in share.source
