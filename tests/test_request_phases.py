"""Request phases and the TTFT decomposition from spans (hand-built spans with known values).

Why each expected answer holds: the spans are written with values drawn here, so the empirical
quantiles and means the module must report are computed independently with numpy over the same
values; the decomposition's parts are built to add up (TTFT = queue + prefill + KV transfer + 5 ms).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from analyzer.deployments import Deployment
from analyzer.phases import MIN_REQUESTS, request_phases
from collector.records import frame
from collector.store import Store

NS = 1_000_000_000
T0 = 1_800_000_000 * NS
MODEL = "meta-llama/Llama-3.1-70B-Instruct"


def _spans(n: int, *, kv: bool, seed: int = 7, deployment: str = "") -> tuple[object, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    queue = rng.exponential(0.2, n)
    prefill = rng.uniform(0.05, 0.4, n)
    transfer = rng.uniform(0.02, 0.3, n) if kv else np.zeros(n)
    ttft = queue + prefill + transfer + 0.005
    decode = rng.uniform(1.0, 3.0, n)
    attrs = json.dumps({"resource.k8s.deployment.name": deployment}) if deployment else "{}"
    rows = [
        {"trace_id": f"{seed:08x}{i:024x}", "span_id": f"{i + 1:016x}", "start_ns": T0 + i * NS,
         "end_ns": T0 + i * NS + int((ttft[i] + decode[i]) * NS), "name": "llm_request", "service": "trtllm",
         "engine": "trtllm", "model": MODEL, "dp_rank": -1, "role": "decode" if kv else "",
         "request_id": f"r{i}", "ttft_s": ttft[i], "queue_s": queue[i], "prefill_s": prefill[i],
         "decode_s": decode[i], "e2e_s": ttft[i] + decode[i], "kv_transfer_s": transfer[i] if kv else None,
         "input_tokens": 1000, "output_tokens": 200, "cached_tokens": 0, "finish_reason": "stop",
         "attributes": attrs}
        for i in range(n)
    ]  # fmt: skip
    return frame("request_spans", rows), {"ttft": ttft, "queue": queue, "prefill": prefill, "kv": transfer}


def _store(n: int, *, kv: bool) -> tuple[Store, dict[str, np.ndarray]]:
    st = Store(":memory:")
    rows, values = _spans(n, kv=kv)
    st.write("request_spans", rows)
    return st, values


DEP = Deployment(name="llama70b", model=MODEL)


def test_span_quantiles_are_the_observed_values_quantiles() -> None:
    st, v = _store(300, kv=False)
    with st.cursor() as cur:
        got = request_phases(cur, DEP, T0, T0 + 3600 * NS)
    assert got.requests == 300
    ttft = next(p for p in got.phases if p.phase == "ttft_s")
    assert ttft.source == "spans" and ttft.estimate == "exact_over_observed_requests"
    for q, name in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        assert ttft.quantiles_s[name] == pytest.approx(float(np.quantile(v["ttft"], q)), rel=1e-9)
    assert ttft.mean_s == pytest.approx(float(v["ttft"].mean()))
    assert not any(p.phase == "kv_transfer_s" for p in got.phases)  # no span carries it
    # ... so the decomposition leaves it out rather than claiming a measured 0
    assert "kv_transfer" not in got.ttft_decomposition and got.kv_transfer_share_of_ttft is None
    assert {"queue", "prefill", "other", "ttft"} == set(got.ttft_decomposition)


def test_ttft_decomposition_adds_up_and_names_the_kv_transfer_share() -> None:
    st, v = _store(200, kv=True)
    with st.cursor() as cur:
        got = request_phases(cur, DEP, T0, T0 + 3600 * NS)
    d = got.ttft_decomposition
    assert d["ttft"]["mean_s"] == pytest.approx(float(v["ttft"].mean()))
    assert d["queue"]["mean_s"] == pytest.approx(float(v["queue"].mean()))
    assert d["kv_transfer"]["mean_s"] == pytest.approx(float(v["kv"].mean()))
    assert d["other"]["mean_s"] == pytest.approx(0.005, abs=1e-9)
    assert sum(d[k]["share"] for k in ("queue", "prefill", "kv_transfer", "other")) == pytest.approx(1.0)
    assert got.kv_transfer_share_of_ttft == pytest.approx(float(v["kv"].mean() / v["ttft"].mean()))


def test_window_and_deployment_select_the_spans() -> None:
    st = Store(":memory:")
    mine, _ = _spans(50, kv=False, seed=1)
    other, _ = _spans(50, kv=False, seed=2, deployment="someone-else")
    st.write("request_spans", mine)
    st.write("request_spans", other)
    with st.cursor() as cur:
        assert request_phases(cur, DEP, T0, T0 + 3600 * NS).requests == 50
        # requests that ended before the window are not in it
        assert request_phases(cur, DEP, T0 + 40 * NS, T0 + 3600 * NS).requests < 50


def test_too_few_spans_fall_back_to_labelled_bucket_estimates() -> None:
    st, _ = _store(MIN_REQUESTS - 1, kv=False)
    with st.cursor() as cur:
        got = request_phases(cur, DEP, T0, T0 + 3600 * NS)
    assert got.requests == MIN_REQUESTS - 1 and got.ttft_decomposition == {}
    assert "histogram buckets" in got.note and "estimates" in got.note
    assert all(p.source == "histogram_buckets" and p.estimate == "bucket_interpolated" for p in got.phases)
