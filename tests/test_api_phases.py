"""``GET /api/v1/deployments/{name}/phases`` and ``ioe_deployment_ttft_share_ratio`` over spans that
arrived through the app's own OTLP/HTTP receiver (issue 19, item 3).

The spans are the real OpenTelemetry SDK's (tests/otlp_engine_spans.py), with values fixed there:
- vLLM, 100 requests: queue 10 ms, prefill 40 ms, TTFT 50 + i ms (i = 0..99), e2e 500 ms. So mean
  TTFT = 50 + 49.5 = 99.5 ms, queue share 10/99.5, prefill 40/99.5, the rest (49.5 ms) is 'other';
  exact p99 = 50 + 0.99·99 = 148.01 ms (linear between order statistics); no KV transfer.
- TensorRT-LLM disaggregated, 100 requests: TTFT 120 ms, KV transfer 12 ms (even requests, by
  attribute) or 15 ms (odd, between the transfer events): mean 13.5 ms, share 13.5/120 = 0.1125;
  queue and prefill are not carried, so they are not claimed.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
from conftest import require_component
from fastapi.testclient import TestClient
from otlp_engine_spans import T0_NS, to_protobuf, trtllm_spans, vllm_spans

from api.app import create_app
from collector.records import frame
from collector.store import Store
from ioe.settings import Settings

NS = 1_000_000_000
AT = str(T0_NS // NS + 60)
PB = {"Content-Type": "application/x-protobuf"}


def declare(st: Store, name: str, model: str) -> None:
    spec = {"targets": [f"{name}-engine"], "gpus": []}
    st.write("deployments", frame("deployments", [{
        "name": name, "model": model, "gpu_type": "h100_sxm", "tp": 1, "pp": 1, "dp": 1, "ep": 1,
        "roles": "{}", "nodes": json.dumps(["node-a"]), "fabric": "nvlink4", "engine": "vllm",
        "origin": "config", "spec": json.dumps(spec), "updated_ns": T0_NS,
    }]))  # fmt: skip
    # one engine sample, so the default window (ending at the newest sample) holds the spans
    st.write("engine_samples", frame("engine_samples", [{
        "ts_ns": T0_NS + 5 * NS, "source": f"{name}-engine", "engine": "0", "model": model, "dp_rank": -1,
        "concept": "kv_usage_ratio", "value": 0.3, "rate_per_s": None,
    }]))  # fmt: skip


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    st = Store(":memory:")
    declare(st, "chat", "meta-llama/Llama-3.1-8B-Instruct")
    declare(st, "pd", "Qwen3-32B")
    with TestClient(create_app(Settings(store_path=":memory:"), st)) as c:
        for spans in (vllm_spans(100), trtllm_spans(100)):
            r = c.post("/v1/traces", content=to_protobuf(spans), headers=PB)
            assert r.status_code == 200, r.text
        yield c
    st.close()


def test_phases_route_gives_exact_span_quantiles_and_the_ttft_decomposition(client: TestClient) -> None:
    body = client.get("/api/v1/deployments/chat/phases", params={"window": "15m", "at": AT}).json()
    assert body["deployment"] == "chat" and body["requests"] == 100
    ttft = next(p for p in body["phases"] if p["phase"] == "ttft_s")
    assert ttft["source"] == "spans" and ttft["estimate"] == "exact_over_observed_requests"
    assert ttft["quantiles_s"]["p99"] == pytest.approx(0.14801) and ttft["mean_s"] == pytest.approx(0.0995)
    d = body["ttft_decomposition"]
    assert set(d) == {"queue", "prefill", "other", "ttft"}  # no span carries a KV transfer
    assert d["queue"]["share"] == pytest.approx(0.010 / 0.0995)
    assert d["prefill"]["share"] == pytest.approx(0.040 / 0.0995)
    assert d["other"]["mean_s"] == pytest.approx(0.0495)
    assert d["ttft"]["p99_s"] == pytest.approx(0.14801)
    assert body["kv_transfer_share_of_ttft"] is None


def test_disaggregated_deployment_shows_its_kv_transfer_share(client: TestClient) -> None:
    body = client.get("/api/v1/deployments/pd/phases", params={"window": "15m", "at": AT}).json()
    assert body["requests"] == 100
    assert body["kv_transfer_share_of_ttft"] == pytest.approx(0.0135 / 0.120)
    assert set(body["ttft_decomposition"]) == {"kv_transfer", "other", "ttft"}


def test_without_spans_the_route_says_bucket_estimates(client: TestClient) -> None:
    # a window before any span: no spans, no histograms either; the note says what stands in
    before = {"window": "60s", "at": str(T0_NS // NS - 3600)}
    body = client.get("/api/v1/deployments/chat/phases", params=before)
    got = body.json()
    assert body.status_code == 200 and got["requests"] == 0 and got["ttft_decomposition"] == {}
    assert "histogram buckets" in got["note"] and "estimates" in got["note"]


def test_phases_route_validates_and_404s(client: TestClient) -> None:
    assert client.get("/api/v1/deployments/nope/phases").status_code == 404
    r = client.get("/api/v1/deployments/chat/phases", params={"window": "forever"})
    assert r.status_code in (400, 422) and "window" in r.text


def test_metrics_export_the_ttft_shares_and_pass_promtool(client: TestClient) -> None:
    text = client.get("/metrics").text
    shares = {
        line.split("{", 1)[1].split("}", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("ioe_deployment_ttft_share_ratio{")
    }
    assert shares['deployment="chat",phase="queue"'] == pytest.approx(0.010 / 0.0995)
    assert shares['deployment="pd",phase="kv_transfer"'] == pytest.approx(0.1125)
    assert 'deployment="pd",phase="queue"' not in shares  # not carried: not claimed
    promtool = require_component("promtool")
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
