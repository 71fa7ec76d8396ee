"""Regressions that blame the right axis, and baselines that fall back and say so (issue 19, item 2).

The telemetry is HAND-BUILT here, one engine scraped every 5 s, from a few numbers per phase:
arrival rate ``lam`` (requests/s), prompt tokens per request ``isl``, TTFT median ``ttft`` (lognormal,
p99/p50 = 2, written as vLLM's cumulative TTFT buckets) and end-to-end latency ``e2e``. Requests
running is written as Little's law gives it, ``lam × e2e``: it rises whenever latency rises, which is
why it must never stand for load. Why each expected answer holds is stated in each test.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pytest
from gen_telemetry import TTFT_LE, lognormal_cdf

from analyzer.deployments import list_deployments
from analyzer.regression import p99_regression
from analyzer.thresholds import Thresholds
from collector.records import frame
from collector.store import Store

NS = 1_000_000_000
T0 = 1_790_000_000 * NS
STEP_S = 5
SOURCE = "chat-engine-0"


@dataclass(frozen=True)
class Phase:
    seconds: int
    lam: float = 10.0
    isl: float = 1000.0
    ttft: float = 0.2
    e2e: float = 2.0
    kv: float = 0.4


def build(phases: list[Phase], t0: int = T0, *, spans: bool = False) -> Store:
    """One deployment ``chat`` whose engine lives through ``phases`` one after another from ``t0``;
    with ``spans``, one vLLM request span per arrival too (evenly spaced, ``isl`` prompt tokens)."""
    st = Store(":memory:")
    spec = {"targets": [SOURCE], "gpus": []}
    st.write(
        "deployments",
        frame(
            "deployments",
            [
                {
                    "name": "chat",
                    "model": "meta-llama/Llama-3.1-8B-Instruct",
                    "gpu_type": "h100_sxm",
                    "tp": 1,
                    "pp": 1,
                    "dp": 1,
                    "ep": 1,
                    "roles": "{}",
                    "nodes": json.dumps(["node-a"]),
                    "fabric": "nvlink4",
                    "engine": "vllm",
                    "origin": "config",
                    "spec": json.dumps(spec),
                    "updated_ns": t0,
                }
            ],
        ),
    )
    ident = {"source": SOURCE, "engine": "0", "model": "llama8b", "dp_rank": -1}
    eng: list[dict[str, object]] = []
    hist: list[dict[str, object]] = []
    acc: dict[str, float] = {}
    t = t0
    for ph in phases:
        for _ in range(ph.seconds // STEP_S):
            t += STEP_S * NS
            n = ph.lam * STEP_S
            counters = {
                "request_success_total": n,
                "ttft_seconds_count": n,
                "request_prompt_tokens_count": n,
                "request_prompt_tokens_sum": n * ph.isl,
                "prompt_tokens_total": n * ph.isl,
            }
            for concept, inc in counters.items():
                acc[concept] = acc.get(concept, 0.0) + inc
                eng.append(
                    {**ident, "ts_ns": t, "concept": concept, "value": acc[concept], "rate_per_s": inc / 5}
                )
            for concept, value in (("requests_running", ph.lam * ph.e2e), ("kv_usage_ratio", ph.kv)):
                eng.append({**ident, "ts_ns": t, "concept": concept, "value": value, "rate_per_s": None})
            for le in TTFT_LE:
                key = f"ttft:{le}"
                acc[key] = acc.get(key, 0.0) + n * lognormal_cdf(le, ph.ttft, 2.0)
                hist.append(
                    {
                        **ident,
                        "ts_ns": t,
                        "concept": "ttft_seconds",
                        "le": le,
                        "cumulative_count": round(acc[key], 3),
                    }
                )
    st.write("engine_samples", frame("engine_samples", eng))
    st.write("histogram_buckets", frame("histogram_buckets", hist))
    if spans:
        st.write("request_spans", _spans(phases, t0))
    return st


def _spans(phases: list[Phase], t0: int) -> object:
    rows, t, i = [], t0, 0
    for ph in phases:
        gap = int(NS / ph.lam)
        for k in range(int(ph.seconds * ph.lam)):
            start = t + (k + 1) * gap
            rows.append(
                {
                    "trace_id": f"{i:032x}",
                    "span_id": f"{i + 1:016x}",
                    "start_ns": start,
                    "end_ns": start + int(ph.e2e * NS),
                    "name": "llm_request",
                    "service": "vllm",
                    "engine": "vllm",
                    "model": "meta-llama/Llama-3.1-8B-Instruct",
                    "dp_rank": -1,
                    "role": "",
                    "request_id": f"r{i}",
                    "ttft_s": ph.ttft,
                    "e2e_s": ph.e2e,
                    "input_tokens": int(ph.isl),
                    "output_tokens": 100,
                    "cached_tokens": 0,
                    "finish_reason": "stop",
                    "attributes": "{}",
                }
            )
            i += 1
        t += ph.seconds * NS
    return frame("request_spans", rows)


def collectives(seconds: int, straggle_from_s: int, t0: int = T0) -> object:
    """Four ranks on ``node-a``, one all-reduce a second. Every rank arrives within 100 µs of the
    others in random order (seeded) until ``straggle_from_s``; from then on rank 2 arrives 2 ms late."""
    rng = np.random.default_rng(3)
    rows = []
    for sn in range(seconds):
        t_us = t0 / 1000 + sn * 1e6
        late = rng.uniform(0, 100, 4)
        if sn >= straggle_from_s:
            late[2] += 2000.0
        end = t_us + late.max() + 300.0
        for rank in range(4):
            start = t_us + late[rank]
            rows.append(
                {
                    "origin": "inspector",
                    "comm_id": "0xc1",
                    "coll_sn": sn,
                    "rank": rank,
                    "kind": "coll",
                    "comm_name": "tp",
                    "n_ranks": 4,
                    "nnodes": 1,
                    "host": "node-a",
                    "op": "AllReduce",
                    "msg_bytes": 1 << 20,
                    "exec_us": end - start,
                    "busbw_gbs": 100.0,
                    "start_us": start,
                    "stop_us": end,
                }
            )
    return frame("collective_records", rows)


def regression(st: Store, start: int, end: int, **th: object):  # type: ignore[no-untyped-def]
    with st.cursor() as con:
        dep = list_deployments(con)[0]
        return p99_regression(con, dep, start, end, Thresholds(bin_s=60.0, **th))  # type: ignore[arg-type]


def axes(reg) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    return {a["axis"]: a for a in reg.axes}


def test_context_regression_at_constant_arrivals_names_context_not_load() -> None:
    # 30 min at 10 req/s with 1000-token prompts, then 15 min at the same 10 req/s with 3000-token
    # prompts: prefill triples TTFT (0.2 → 0.6 s) and e2e grows 2.0 → 3.4 s, so running requests grow
    # 20 → 34 (+70 %, Little's law) while arrivals do not move at all. The window is the last 30 min,
    # the baseline its previous 30 min; the change is at its midpoint.
    st = build([Phase(1800), Phase(900), Phase(900, isl=3000.0, ttft=0.6, e2e=3.4)])
    start, end = T0 + 1800 * NS, T0 + 3600 * NS
    reg = regression(st, start, end, regression_baseline="previous_window")
    ttft = next(m for m in reg.metrics if m["metric"] == "ttft_seconds")
    assert ttft["verdict"] == "regressed" and abs(ttft["change_point_ns"] - (start + 900 * NS)) <= 60 * NS
    a = axes(reg)
    assert a["context_length"]["moved"] and a["context_length"]["source"] == "request_prompt_tokens"
    assert a["context_length"]["before"] == pytest.approx(1000.0) and a["context_length"][
        "after"
    ] == pytest.approx(3000.0)
    assert a["context_length"]["change_point_ns"] == ttft["change_point_ns"]
    assert not a["load"]["moved"] and a["load"]["change_ratio"] == pytest.approx(0.0, abs=1e-9)
    assert a["load"]["unit"] == "requests/s" and a["load"]["before"] == pytest.approx(10.0)
    assert reg.moved_first == "context_length"
    assert not a["kv_pressure"]["moved"]


def test_load_surge_names_load() -> None:
    # 10 → 25 req/s at the same 1000-token prompts: queueing lifts TTFT 0.2 → 0.8 s. The arrival rate
    # rises 2.5× (+150 %) in the bin where latency turns; KV usage follows it 0.4 → 0.7 (+75 %), in the
    # same bin, so the larger change (load) is named first.
    st = build([Phase(1800), Phase(900), Phase(900, lam=25.0, ttft=0.8, e2e=4.0, kv=0.7)])
    start, end = T0 + 1800 * NS, T0 + 3600 * NS
    reg = regression(st, start, end, regression_baseline="previous_window")
    a = axes(reg)
    assert a["load"]["moved"] and a["load"]["change_ratio"] == pytest.approx(1.5, rel=0.01)
    assert a["load"]["source"] == "request_success_total"
    assert not a["context_length"]["moved"]
    assert reg.moved_first == "load" and a["load"]["lead_s"] == 0.0


def test_young_store_falls_back_to_the_previous_window_and_says_so() -> None:
    # 1 h of history and a 30-min window at its end: the day before lies wholly before the first
    # sample, so day_before cannot serve; the previous 30 min are all history, so they serve instead.
    st = build([Phase(1800), Phase(1800, ttft=0.5)])
    start, end = T0 + 1800 * NS, T0 + 3600 * NS
    reg = regression(st, start, end)  # default: day_before
    assert reg.baseline == "day_before" and reg.baseline_mode_used == "previous_window"
    assert reg.baseline_window_ns == (T0, start)
    assert reg.fallback_reason and "day_before" in reg.fallback_reason and "0%" in reg.fallback_reason
    ttft = next(m for m in reg.metrics if m["metric"] == "ttft_seconds")
    assert ttft["verdict"] == "regressed" and ttft["baseline_mode"] == "previous_window"
    # true p99s 0.4 → 1.0 s; their bucket estimates (buckets 0.25-0.5 and 0.75-1.0) are ≈ 0.45 and 0.92
    assert 1.8 <= ttft["ratio"] <= 2.6


def test_no_usable_history_reports_no_data_and_why() -> None:
    # the store holds exactly the window: no mode has history, the metrics say "no data"
    st = build([Phase(1800)])
    reg = regression(st, T0, T0 + 1800 * NS, regression_baseline="trailing_7d")
    assert reg.baseline_mode_used == "previous_window"
    assert reg.fallback_reason is not None
    assert "trailing_7d" in reg.fallback_reason and "no baseline with enough history" in reg.fallback_reason
    assert {m["verdict"] for m in reg.metrics} == {"no data"}


def test_a_pinned_reference_window_is_the_baseline() -> None:
    # reference = the first 10 min (TTFT 0.2 s); the window (TTFT 0.4 s) is compared with it,
    # not with the previous window (which holds 0.4 s as well)
    st = build([Phase(600), Phase(2400, ttft=0.4)])
    ref = (T0 / NS, T0 / NS + 600)
    reg = regression(
        st,
        T0 + 1800 * NS,
        T0 + 3000 * NS,
        regression_baseline="reference",
        regression_reference_start_s=ref[0],
        regression_reference_end_s=ref[1],
    )
    assert reg.baseline_mode_used == "reference" and reg.fallback_reason is None
    assert reg.baseline_window_ns == (T0, T0 + 600 * NS)
    ttft = next(m for m in reg.metrics if m["metric"] == "ttft_seconds")
    assert ttft["ratio"] == pytest.approx(2.0, rel=0.15)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"regression_baseline": "reference"}, "needs regression_reference_start_s"),
        (
            {
                "regression_baseline": "reference",
                "regression_reference_start_s": 10.0,
                "regression_reference_end_s": 5.0,
            },
            "must be after",
        ),
        (
            {"regression_reference_start_s": 10.0, "regression_reference_end_s": 20.0},
            "set regression_baseline",
        ),
        ({"regression_baseline": "last_tuesday"}, "regression_baseline"),
    ],
)
def test_baseline_settings_are_validated(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Thresholds(**fields)  # type: ignore[arg-type]


def test_running_requests_alone_never_move_load() -> None:
    # the same arrivals and prompts, e2e doubled by a slower decode: running doubles (Little), load
    # must not move; nothing in these signals moved first
    st = build([Phase(1800), Phase(900), Phase(900, ttft=0.5, e2e=4.0)])
    reg = regression(st, T0 + 1800 * NS, T0 + 3600 * NS, regression_baseline="previous_window")
    a = axes(reg)
    assert not a["load"]["moved"] and not a["context_length"]["moved"]
    assert reg.moved_first is None
    assert math.isclose(a["load"]["before"], 10.0) and math.isclose(a["load"]["after"], 10.0)


def test_arrivals_from_spans_when_the_deployment_sends_them() -> None:
    # the same surge as above, with one span per arrival: spans are the load source (the requests
    # whose span starts in a bin arrived in it) and read 10 → 25 req/s
    st = build([Phase(1800), Phase(900), Phase(900, lam=25.0, ttft=0.8, e2e=4.0, kv=0.7)], spans=True)
    reg = regression(st, T0 + 1800 * NS, T0 + 3600 * NS, regression_baseline="previous_window")
    a = axes(reg)
    assert a["load"]["source"] == "spans" and a["context_length"]["source"] == "spans"
    assert a["load"]["before"] == pytest.approx(10.0, rel=0.01) and a["load"]["after"] == pytest.approx(
        25.0, rel=0.01
    )
    assert reg.moved_first == "load"


def test_a_new_straggler_is_the_axis_that_moved() -> None:
    # arrivals and prompts constant; from minute 45 rank 2 arrives 2 ms late at every all-reduce and
    # TTFT doubles. Before, the four ranks are last in turn (rank 2 carries about a quarter of the
    # wait); after, rank 2 causes all of it: share → 1.0, the only axis that moved.
    st = build([Phase(1800), Phase(900), Phase(900, ttft=0.4, e2e=3.0)])
    st.write("collective_records", collectives(3600, 2700))
    reg = regression(st, T0 + 1800 * NS, T0 + 3600 * NS, regression_baseline="previous_window")
    a = axes(reg)
    share = a["straggler_share"]
    assert share["source"] == "collectives: rank 2" and share["after"] == pytest.approx(1.0)
    assert 0.15 <= share["before"] <= 0.35 and share["moved"]
    assert not a["load"]["moved"] and not a["context_length"]["moved"]
    assert reg.moved_first == "straggler_share"
