"""Issue 19's last straggler items: TP2 backed by the rank's own evidence, and host contention
from the engine's step timing.

The timelines and telemetry are built by hand with the helpers of
``tests/test_stragglers_scenarios.py`` (every rank computes its own time after the previous
all-reduce ended; counters read every second); the engine's inter-token latency histogram is
written here as vLLM would count it: per second, ``running`` requests × steps per second
observations, each one step long. Nothing comes from ``simulate/`` or ``analyzer/``; each
expected answer carries its reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import polars as pl
import pytest

from analyzer.stragglers import analyze
from collector.records import frame
from collector.store import Store
from tests.test_stragglers_scenarios import (
    NS,
    T0_US,
    TH,
    W0,
    Group,
    Series,
    causes,
    ev,
    node0,
    telemetry,
    trace,
)


def judge(
    *groups: Group, gpu: Any = None, engine: Any = None, expected_us: Mapping[str, float] | None = None
) -> list[dict[str, Any]]:
    st = Store(":memory:")
    for g in groups:
        st.write("collective_records", trace(g))
    if gpu is not None:
        st.write("gpu_samples", gpu)
    if engine is not None:
        targets, samples = engine
        st.write("targets", targets)
        st.write("engine_samples", samples)
    with st.cursor() as con:
        return list(analyze(con, "inspector", th=TH, expected_us=expected_us)["origins"]["inspector"])


def vllm_itl(host: str, step_s: Any, running: int = 32, seconds: int = 60) -> tuple[Any, Any]:
    """A vLLM engine on ``host`` (its ``targets`` row) and its ITL ``_sum``/``_count`` counters:
    each second ``running`` × (1 / step) observations of ``step`` seconds each."""
    t = np.arange(seconds, dtype=float)
    step = step_s(t) if callable(step_s) else np.full(t.size, step_s)
    count = np.cumsum(running / step)
    total = np.cumsum(running / step * step)
    src = f"vllm-{host}"
    rows = [
        {"ts_ns": int(T0_US * NS + s * 1e9), "source": src, "engine": "vllm", "model": "llama-3.1-8b",
         "dp_rank": 0, "concept": concept, "value": float(v)}
        for concept, series in (("itl_seconds_count", count), ("itl_seconds_sum", total))
        for s, v in zip(t, series, strict=True)
    ]  # fmt: skip
    targets = frame("targets", {"target": [src], "kind": ["engine"], "host": [host], "up": [True]})
    return targets, frame("engine_samples", rows)


# ---- TP2 (rule 7) ----------------------------------------------------------------------------------


def test_tp2_thermal_is_backed_by_telemetry() -> None:
    """GPU 1 at 1,584 MHz with the thermal bit 0x40 against its peer's 1,980 MHz computes 1.25 ×
    as long: named, cause gpu_throttled: thermal, backed by telemetry (slow in every window, so no
    history of its own; no model given)."""
    hot: dict[str, Series] = {"sm_clock_mhz": 1584.0, "throttle_reasons_mask": 64.0, "gpu_temp_c": 87.0}
    found = judge(Group(n_ranks=2, slow={1: 1.25}), gpu=telemetry(node0(2), {("node0", 1): hot}))
    assert [(s["rank"], s["cause"], s["backed_by"]) for s in found] == [
        (1, "gpu_throttled: thermal", ["telemetry"])
    ]
    assert ev(found[0], "sm_clock_mhz")["culprit"] == 1584.0


@pytest.mark.parametrize("seed", [31, 32, 33])
def test_tp2_healthy_pair_names_nobody(seed: int) -> None:
    """Two healthy GPUs computing from the same distribution, telemetry identical, and the model
    expecting exactly their 20 ms: no rank is later than the other beyond chance, nothing named."""
    found = judge(
        Group(n_ranks=2, jitter=0.02, seed=seed),
        gpu=telemetry(node0(2), {}),
        expected_us={"0xc0ffee": 20_000.0},
    )
    assert found == []


def test_tp2_rank_merely_later_by_noise_names_nobody() -> None:
    """Rank 1 computes 1.5 % longer, well inside the pair's 2 % jitter, and its GPU reads
    harmlessly different: 1,965 against 1,980 MHz (0.99 of its peer, throttle mask clear), 2 °C
    warmer, 10 W more. By chance the arrival test flags it in one window of 20 (1.5 % is under
    the 4 % floor over the span), but nothing backs it: no counter crosses its threshold, its
    segments in that window are those of its other windows (20.37 against 20.30 ms), and against
    the model (20 ms) both ranks run at its pace: nothing named."""
    noisy: dict[str, Series] = {"sm_clock_mhz": 1965.0, "gpu_temp_c": 68.0, "power_w": 650.0}
    noisy["gpu_util_ratio"] = 0.985
    found = judge(
        Group(n_ranks=2, jitter=0.02, slow={1: 1.015}, seed=5),
        gpu=telemetry(node0(2), {("node0", 1): noisy}),
        expected_us={"0xc0ffee": 20_000.0},
    )
    assert found == []


def test_tp2_peer_merely_faster_names_nobody() -> None:
    """In windows 8–11 rank 0 computes 20 % faster (rank 1 unchanged), so rank 0 waits for rank
    1 there: the arrival test names rank 1. Its own segments did not grow against its other
    windows (rule 7 backing 2 fails: the peer got faster, it did not get slower) and the two GPUs
    read the same: not named."""
    g = Group(n_ranks=2, slow={0: 0.80}, when={0: {8, 9, 10, 11}})
    assert judge(g, gpu=telemetry(node0(2), {})) == []


def test_tp2_backed_by_its_own_timing() -> None:
    """Rank 1 computes 25 % longer in windows 8–11 only; the GPUs read the same (its cause is not
    in the counters). Its segments there are 1.25 × its own in the other windows while rank 0's
    did not change: named intermittent, backed by own_timing, cause unexplained."""
    g = Group(n_ranks=2, slow={1: 1.25}, when={1: {8, 9, 10, 11}})
    found = judge(g, gpu=telemetry(node0(2), {}))
    assert [(s["rank"], s["kind"], s["cause"], s["backed_by"]) for s in found] == [
        (1, "intermittent", "unexplained", ["own_timing"])]  # fmt: skip
    assert found[0]["flagged_windows"] == [W0 + w for w in (8, 9, 10, 11)]
    row = ev(found[0], "compute_segment_us")
    assert row["culprit"] / row["own_history"] == pytest.approx(1.25, abs=0.02)
    assert row["peers_median"] / row["peer_own_history"] == pytest.approx(1.0, abs=0.02)


def test_tp2_backed_by_the_model_and_not_when_the_peer_is_the_odd_one() -> None:
    """Rank 1 computes 25 % longer in every window; the GPUs read the same. With the model
    expecting 20 ms per segment, rank 0 runs at the model's pace and rank 1 at 1.25 × it: named,
    backed by the model. With the model expecting 25 ms instead, rank 1 is the one at the model's
    pace and rank 0 is 0.8 × it (merely fast): not named."""
    g = Group(n_ranks=2, slow={1: 1.25})
    found = judge(g, gpu=telemetry(node0(2), {}), expected_us={"0xc0ffee": 20_000.0})
    assert [(s["rank"], s["cause"], s["backed_by"]) for s in found] == [(1, "unexplained", ["model"])]
    row = ev(found[0], "compute_segment_vs_model")
    assert row["ratio"] == pytest.approx(1.25, abs=0.02) and row["peer_ratio"] == pytest.approx(1.0, abs=0.02)
    assert judge(g, gpu=telemetry(node0(2), {}), expected_us={"0xc0ffee": 25_000.0}) == []


def test_expected_segment_is_the_step_without_collectives_per_all_reduce() -> None:
    """Llama-3.1-8B (32 layers) on TP2: 64 all-reduces per decode step, so the expected segment
    × 64 plus the step's all-reduce time is the modelled decode step."""
    from analyzer import catalog, modelcfg, perf
    from analyzer.capacity import Layout
    from analyzer.straggler_backing import expected_segment_us

    model, gpu, lay = modelcfg.load("llama-3.1-8b"), catalog.gpu("h100_sxm"), Layout(tp=2)
    got = expected_segment_us(model, gpu, lay, 32, 1024.0)
    terms = perf.decode_step(perf.Setup(model, gpu, lay, topo=perf.Topology.for_gpu(gpu)), 32, 1024.0)
    assert got["collectives_per_step"] == 64.0
    assert got["segment_us"] * 64 / 1e6 + terms["decode_tp_allreduce_s"] == pytest.approx(
        terms["decode_step_s"]
    )


# ---- host contention from the engine's step timing (rule 13) ------------------------------------


def _contended(t: np.ndarray) -> np.ndarray:
    return (t >= 6) & (t < 14)  # windows 3–6


def test_host_contention_from_engine_step_timing() -> None:
    """Rank 0's host runs a noisy job in seconds 6–14 (windows 3–6): rank 0's worker launches its
    kernels late, so it computes 12 % longer then and its GPU idles (utilization 0.95 there
    against 0.99 before and after; its peers, spinning in the all-reduce, stay at 0.99), clocks
    normal. The TP8 engine on the host steps in 23.5 ms instead of 21 ms then. Named
    intermittent, cause host_contention, its evidence the step time against its own history and
    the utilization against its own history."""
    util: dict[str, Series] = {"gpu_util_ratio": lambda t: np.where(_contended(t), 0.95, 0.99)}
    found = judge(
        Group(slow={0: 1.12}, when={0: {3, 4, 5, 6}}),
        gpu=telemetry(node0(), {("node0", 0): util}),
        engine=vllm_itl("node0", lambda t: np.where(_contended(t), 0.0235, 0.021)),
    )
    assert [(s["rank"], s["kind"], s["cause"]) for s in found] == [(0, "intermittent", "host_contention")]
    (hc,) = [c for c in found[0]["causes"] if c["cause"] == "host_contention"]
    cited = {e["metric"]: e for e in hc["evidence"]}
    assert set(cited) == {"engine_step_s", "gpu_util_ratio", "sm_clock_mhz"}
    assert cited["engine_step_s"]["culprit"] == pytest.approx(0.0235, rel=0.02)
    assert cited["engine_step_s"]["own_history"] == pytest.approx(0.021, rel=0.02)
    assert cited["gpu_util_ratio"]["culprit"] == pytest.approx(0.95)
    assert cited["gpu_util_ratio"]["own_history"] == pytest.approx(0.99)


def test_gpu_bound_slow_rank_is_not_host_contention() -> None:
    """Rank 3's GPU computes 14 % longer in seconds 6–14 with its SMs busy the whole time:
    utilization 0.99 like its peers and its own other windows, clocks normal, no counter moves.
    The engine's step grows just the same (the group waits for rank 3), but the GPU did not idle:
    not host contention. Nothing in the counters explains it, so the cause is unexplained."""
    found = judge(
        Group(slow={3: 1.14}, when={3: {3, 4, 5, 6}}),
        gpu=telemetry(node0(), {}),
        engine=vllm_itl("node0", lambda t: np.where(_contended(t), 0.024, 0.021)),
    )
    assert [(s["rank"], s["kind"], s["cause"]) for s in found] == [(3, "intermittent", "unexplained")]
    assert "host_contention" not in causes(found[0])
    assert ev(found[0], "engine_step_s")["culprit"] == pytest.approx(0.024, rel=0.02)


def test_deployment_view_backs_tp2_with_the_model() -> None:
    """A declared TP2 Llama-3.1-8B deployment on H100s with 32 requests running: a decode step
    of ~8.6 ms over 64 all-reduces leaves ~120 µs of compute between two all-reduces, and rank 0
    computes 120 µs. Rank 1 computes 150 µs (1.25 ×) with nothing in its counters: the
    deployment's stragglers name it, backed by the model. The same store declaring an unknown
    model has no model to back it, and names nobody."""
    from analyzer.deployments import find_deployment
    from analyzer.views import stragglers

    def view(model: str) -> list[dict[str, Any]]:
        st = Store(":memory:")
        pair = Group(n_ranks=2, compute_us=120.0, transfer_us=15.0, slow={1: 1.25})
        st.write("collective_records", trace(pair))
        st.write("gpu_samples", telemetry(node0(2), {}))
        targets, _ = vllm_itl("node0", 0.0086)
        st.write("targets", targets)
        rows = [{"ts_ns": int(T0_US * NS + s * 1e9), "source": "vllm-node0", "engine": "vllm", "model": model,
                 "dp_rank": 0, "concept": "requests_running", "value": 32.0} for s in range(60)]  # fmt: skip
        st.write("engine_samples", frame("engine_samples", rows))
        dep = {"name": "tp2", "model": model, "gpu_type": "h100_sxm", "tp": 2, "pp": 1, "dp": 1, "ep": 1,
               "nodes": '["node0"]', "origin": "config"}  # fmt: skip
        st.write("deployments", frame("deployments", [dep]))
        with st.cursor() as con:
            d = find_deployment(con, "tp2")
            got = stragglers(con, d, int(T0_US * NS) - 1, int(T0_US * NS) + 60 * 10**9, 2.0)
        return list(got["stragglers"])

    found = view("llama-3.1-8b")
    assert [(s["rank"], s["backed_by"]) for s in found] == [(1, ["model"])]
    row = ev(found[0], "compute_segment_vs_model")
    assert row["model_expected_us"] == pytest.approx(120.0, rel=0.05)
    assert view("mystery-model") == []


def sglang_tp(host: str, step_s: Any, busy: dict[int, Any], seconds: int = 60) -> tuple[Any, Any]:
    """An SGLang server on ``host`` exporting from every scheduler (``tp_rank`` on its scheduler
    series): the tokenizer's ITL ``_sum``/``_count`` (no rank: 32 requests, one observation per
    step each) and per rank ``forward_busy_seconds_total`` split 90/10 over its ``decode`` and
    ``extend`` categories, rising by ``busy(t)`` seconds each second."""
    targets, itl = vllm_itl(host, step_s, seconds=seconds)
    t = np.arange(seconds, dtype=float)
    rows = itl.with_columns(engine=pl.lit("sglang")).to_dicts()
    for rank, share in busy.items():
        per_s = share(t) if callable(share) else np.full(t.size, share)
        for category, part in (("decode", 0.9), ("extend", 0.1)):
            value = np.cumsum(per_s * part)
            rows += [{"ts_ns": int(T0_US * NS + s * 1e9), "source": f"vllm-{host}", "engine": "sglang",
                      "model": "llama-3.1-8b", "dp_rank": -1, "tp_rank": rank, "pp_rank": 0, "ep_rank": 0,
                      "concept": "forward_busy_seconds_total", "labels": json.dumps({"category": category}),
                      "value": float(v)} for s, v in zip(t, value, strict=True)]  # fmt: skip
    return targets, frame("engine_samples", rows)


def test_sglang_forward_execution_is_the_forward_busy_counter() -> None:
    """SGLang 0.5.23's ``sglang:forward_execution_seconds_total`` (seconds the GPU runs forward
    passes, per ``category``) is stored as ``forward_busy_seconds_total`` with its scheduler's
    ``tp_rank`` (the line is in the format of the 0.5.23 fixture, whose scrape had no forward
    pass yet and so no sample of it)."""
    from collector.formats.engine import to_engine_samples
    from collector.formats.exposition import parse

    text = (
        "# TYPE sglang:forward_execution_seconds_total counter\n"
        'sglang:forward_execution_seconds_total{category="decode",engine_type="unified",'
        'model_name="meta-llama/Llama-3.1-8B-Instruct",moe_ep_rank="0",pp_rank="0",tp_rank="1"} 12.5\n'
    )
    parsed = to_engine_samples(parse(text), ts_ns=5, source="t")
    (got,) = parsed.tables["engine_samples"].to_dicts()
    assert (got["concept"], got["tp_rank"], got["value"]) == ("forward_busy_seconds_total", 1, 12.5)
    assert json.loads(got["labels"])["category"] == "decode"


def test_sglang_scheduler_starved_on_one_rank() -> None:
    """SGLang TP4 on one host, every scheduler exporting. In seconds 6–14 (windows 3–6) rank 2's
    scheduler process shares its CPU with a noisy job: it launches forward passes late, so rank 2
    computes 12 % longer and its GPU runs forward passes 80 % of the time instead of 90 % (the
    other ranks wait inside the forward's all-reduce and stay at 90 %). DCGM's coarse utilization
    reads 0.99 on every GPU throughout, clocks normal. The server's step (ITL) is 23.5 ms then
    instead of 21 ms. Named intermittent, host_contention, its evidence the step against its own
    history and rank 2's forward-busy share against the other ranks' and its own."""
    busy: dict[int, Any] = {r: 0.9 for r in (0, 1, 3)}
    busy[2] = lambda t: np.where(_contended(t), 0.8, 0.9)
    found = judge(
        Group(n_ranks=4, slow={2: 1.12}, when={2: {3, 4, 5, 6}}),
        gpu=telemetry(node0(4), {}),
        engine=sglang_tp("node0", lambda t: np.where(_contended(t), 0.0235, 0.021), busy),
    )
    assert [(s["rank"], s["kind"], s["cause"]) for s in found] == [(2, "intermittent", "host_contention")]
    (hc,) = [c for c in found[0]["causes"] if c["cause"] == "host_contention"]
    cited = {e["metric"]: e for e in hc["evidence"]}
    assert set(cited) == {"engine_step_s", "engine_forward_busy_ratio", "sm_clock_mhz"}
    share = cited["engine_forward_busy_ratio"]
    assert (share["culprit"], share["peers_median"], share["own_history"]) == pytest.approx((0.8, 0.9, 0.9))
    assert cited["engine_step_s"]["own_history"] == pytest.approx(0.021, rel=0.02)
