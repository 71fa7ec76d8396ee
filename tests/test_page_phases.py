"""The page's request-phase panel in headless Debian Chromium (Playwright) against a real uvicorn.

Spans reach the app through its own OTLP/HTTP receiver (tests/otlp_engine_spans.py, values in
tests/test_api_phases.py): ``chat`` (vLLM) has queue 10 ms and prefill 40 ms of a 99.5 ms mean TTFT,
``pd`` (TensorRT-LLM, disaggregated) a KV transfer of 13.5 ms of 120 ms. The panel must draw TTFT as a
bar of those shares, say the quantiles are exact (spans), and name the KV-transfer share where there
is one; a deployment without spans (only engine TTFT histograms) says "bucket estimate" and draws no bar.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import httpx
import pytest
from conftest import free_port
from otlp_engine_spans import T0_NS, to_protobuf, trtllm_spans, vllm_spans
from test_api_phases import declare
from test_api_uvicorn import Served
from test_page_playwright import open_page

from api.app import create_app
from collector.records import frame
from collector.store import Store
from ioe.settings import Settings

NS = 1_000_000_000


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    st = Store(":memory:")
    declare(st, "chat", "meta-llama/Llama-3.1-8B-Instruct")
    declare(st, "pd", "Qwen3-32B")
    declare(st, "hist", "meta-llama/Llama-3.1-70B-Instruct")  # no spans: engine histograms only
    rows = [{"ts_ns": T0_NS + k * NS, "source": "hist-engine", "engine": "0", "model": "m", "dp_rank": -1,
             "concept": "ttft_seconds", "le": le, "cumulative_count": float(k * c)}
            for k in (1, 5) for le, c in ((0.1, 40), (0.5, 90), (1.0, 100), (math.inf, 100))]  # fmt: skip
    st.write("histogram_buckets", frame("histogram_buckets", rows))
    with Served(create_app(Settings(store_path=":memory:"), st), free_port()) as s:
        for spans in (vllm_spans(100), trtllm_spans(100)):
            r = httpx.post(f"{s.url}/v1/traces", content=to_protobuf(spans),
                           headers={"Content-Type": "application/x-protobuf"}, timeout=30)  # fmt: skip
            assert r.status_code == 200, r.text
        yield s
    st.close()


def shares(page: object) -> dict[str, float]:
    parts = page.locator("#phases svg.ttft-bar rect.part")  # type: ignore[attr-defined]
    return {parts.nth(i).get_attribute("data-part"): float(parts.nth(i).get_attribute("data-share"))
            for i in range(parts.count())}  # fmt: skip


def test_ttft_bar_and_exact_quantiles_for_a_deployment_with_spans(browser: object, served: Served) -> None:
    page, errors, foreign = open_page(browser, served.url + "/deployments/chat", served.url)
    got = shares(page)
    assert set(got) == {"queue", "prefill", "other"}
    assert got["queue"] == pytest.approx(0.010 / 0.0995) and got["prefill"] == pytest.approx(0.040 / 0.0995)
    q = page.locator  # type: ignore[attr-defined]
    labels = q("#phases .phase-source")
    assert labels.count() >= 4
    assert {labels.nth(i).inner_text() for i in range(labels.count())} == {"exact (spans)"}
    assert "Mean TTFT 99.5 ms" in q("#phases svg.ttft-bar text.title").text_content()
    assert q("#phases .kv-share").count() == 0  # vLLM spans carry no KV transfer
    assert errors == [] and foreign == []


def test_disaggregated_deployment_names_its_kv_transfer_share(browser: object, served: Served) -> None:
    page, errors, foreign = open_page(browser, served.url + "/deployments/pd", served.url)
    assert shares(page)["kv_transfer"] == pytest.approx(0.1125)
    assert "KV transfer is 11.3 % of mean TTFT" in page.locator("#phases .kv-share").inner_text()  # type: ignore[attr-defined]
    assert errors == [] and foreign == []


def test_without_spans_the_panel_says_bucket_estimate(browser: object, served: Served) -> None:
    page, errors, foreign = open_page(browser, served.url + "/deployments/hist", served.url)
    page.wait_for_selector("#plan[data-ready='1']", timeout=30_000)  # type: ignore[attr-defined]
    q = page.locator  # type: ignore[attr-defined]
    assert q("#phases svg.ttft-bar").count() == 0
    assert "No TTFT decomposition" in q("#phases .no-decomposition").inner_text()
    labels = q("#phases .phase-source")
    assert [labels.nth(i).inner_text() for i in range(labels.count())] == ["bucket estimate"]  # TTFT only
    # the plan needs request spans for its workload: its 422 is the one failed load (shown as "No plan")
    assert [e for e in errors if "status of 422" not in e] == [] and len(errors) <= 1
    assert "No plan" in q("#plan").inner_text() and foreign == []
