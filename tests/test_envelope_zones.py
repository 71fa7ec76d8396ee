"""Each zone driven from realistic generated telemetry; key evidence values asserted."""

from __future__ import annotations

from typing import Any

import pytest
from gen_telemetry import NS, store_for

from analyzer.deployments import Deployment, list_deployments
from analyzer.envelope import Verdict, analyze_envelope
from analyzer.thresholds import Thresholds


def _verdict(zone: str, **kwargs: Any) -> tuple[Verdict, Deployment]:
    injected = {k: kwargs.pop(k) for k in ("network_evidence", "expected_latency") if k in kwargs}
    st, lay = store_for(zone, **kwargs)
    with st.cursor() as con:
        dep = list_deployments(con)[0]
        v = analyze_envelope(
            con, dep, lay.start_ns, lay.start_ns + lay.duration_s * NS, Thresholds(), **injected
        )
    return v, dep


def _ev(v: Verdict, zone: str, signal: str) -> Any:
    return next(e for e in v.evidence if e.zone == zone and e.signal == signal)


def test_compute_bound() -> None:
    v, dep = _verdict("compute")
    assert (v.primary, v.secondary) == ("compute", None)
    assert dep.origin == "config" and dep.n_gpus == 8 and len(dep.engine_keys) == 2
    tensor = _ev(v, "compute", "tensor_active_ratio")
    assert tensor.value == pytest.approx(0.66, abs=0.01) and tensor.compared_with == "≥ 0.5"
    assert _ev(v, "compute", "sm_active_ratio").value == pytest.approx(0.875, abs=0.01)
    assert v.confidence >= 0.9


def test_hbm_bound() -> None:
    v, _ = _verdict("hbm_bandwidth")
    assert v.primary == "hbm_bandwidth"
    assert _ev(v, "hbm_bandwidth", "dram_active_ratio").value == pytest.approx(0.76, abs=0.01)
    assert _ev(v, "hbm_bandwidth", "dram_over_sm").value > 1.2
    assert _ev(v, "hbm_bandwidth", "tensor_active_ratio").verdict == "pass"


def test_kv_capacity_bound() -> None:
    v, _ = _verdict("kv_capacity")
    assert v.primary == "kv_capacity" and v.scores["kv_capacity"] == 1.0
    assert _ev(v, "kv_capacity", "kv_usage_ratio").value == pytest.approx(0.97, abs=0.005)
    assert _ev(v, "kv_capacity", "preemptions_per_s").value == pytest.approx(
        1.0, rel=0.02
    )  # 2 engines × 0.5/s
    assert _ev(v, "kv_capacity", "waiting_over_running").value == pytest.approx(0.8, abs=0.01)
    assert _ev(v, "kv_capacity", "queue_share_of_ttft").value == pytest.approx(0.85, abs=0.01)
    # TP8 in one node: the network is not in the critical path, so the zone is not judged and the
    # collective time is reported as fabric overhead
    assert v.scores["network"] is None
    assert _ev(v, "network", "fabric_collective_share_ratio").verdict == "info"


def test_network_critical_with_the_four_signals() -> None:
    v, _ = _verdict("network")
    assert v.primary == "network"
    assert _ev(v, "network", "collective_share_ratio").value == pytest.approx(0.4, abs=0.01)
    # busbw and ITL p99/p50 are reported, never judged: small messages are latency-bound
    busbw = _ev(v, "network", "busbw_over_capability")
    assert busbw.value == pytest.approx(18 / 45, abs=0.01) and busbw.verdict == "info"
    assert _ev(v, "network", "decode_stall_ratio").verdict == "info"
    three = ["latency_slope_vs_concurrency", "p50_p99_gap_widening", "throughput_elasticity"]
    assert [_ev(v, "network", s).verdict for s in three] == ["pass"] * 3
    assert v.critical_path["network_in_path"] and "span nodes" in v.critical_path["why"]
    assert _ev(v, "network", "throughput_elasticity").value == pytest.approx(0.3, abs=0.08)
    assert "unsaturated" in _ev(v, "network", "latency_slope_vs_concurrency").source


def test_headroom() -> None:
    v, _ = _verdict("headroom")
    assert v.primary == "headroom" and v.secondary is None
    assert max(s for s in v.scores.values() if s is not None) < 0.4


def test_mixed_gets_the_right_secondary() -> None:
    v, _ = _verdict("mixed")
    assert (v.primary, v.secondary) == ("hbm_bandwidth", "kv_capacity")
    assert v.scores["kv_capacity"] == 0.5
    # one node: whatever latency does with load, the network is not in the path
    assert v.scores["network"] is None


def test_missing_dcgm_lowers_confidence_and_says_so() -> None:
    full, _ = _verdict("kv_capacity")
    blind, _ = _verdict("kv_capacity", with_dcgm=False)
    assert blind.primary == "kv_capacity"
    assert blind.scores["compute"] is None and blind.scores["hbm_bandwidth"] is None
    assert any(m.startswith("dcgm:") for m in blind.missing)
    assert blind.confidence < full.confidence  # the 0.35 penalty outweighs the wider margin
    assert "no DCGM" in blind.notes[0] and "− 0.35" in blind.notes[0]


def test_missing_collectives_named_not_guessed() -> None:
    v, _ = _verdict("hbm_bandwidth", with_collectives=False)
    assert any(m.startswith("collectives:") for m in v.missing)
    assert _ev(v, "network", "fabric_collective_share_ratio").value is None
    assert "no collective records" in v.notes[0]


def test_injected_collectives_and_latency_model_are_used() -> None:
    calls: list[dict[str, float]] = []

    def model(dep: Deployment, load: Any) -> dict[str, float]:
        calls.append(dict(load))
        return {"itl_s": 0.02, "ttft_s": 0.3}

    v, _ = _verdict(
        "network",
        network_evidence=lambda con, dep, a, b: {"collective_share_ratio": 0.55, "busbw_ratio": 0.2},
        expected_latency=model,
    )
    assert _ev(v, "network", "collective_share_ratio").value == 0.55
    assert "injected" in _ev(v, "network", "collective_share_ratio").source
    excess = _ev(v, "network", "itl_measured_over_expected")
    # the load ramps, so the means are over its high-load part: ITL there is above the window's
    # 58 ms mean
    assert any("load ramps" in n for n in v.notes)
    assert excess.value > 0.058 / 0.02 and excess.verdict == "info"
    assert calls and calls[0]["running"] > 40.0  # the high-load part of a ramp averaging 40
    assert not any("not wired" in m for m in v.missing)
