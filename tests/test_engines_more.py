"""Engines beyond vLLM V0 names: NIM, Ray Serve, TGI, Triton (+ TRT-LLM backend), Dynamo's
``trtllm:``, SGLang 0.4, vLLM MFU and NIXL, each from a sample in tests/data/engines/
(SOURCES.md there says which are real), and the analyzer judging such a store."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest

from analyzer.deployments import list_deployments
from analyzer.envelope import analyze_envelope
from analyzer.latency import window_means, window_quantiles
from collector.formats.scrape import parse_scrape, sniff
from collector.store import Store
from tests.conftest import DATA

ENGINES = DATA / "engines"
NS = 1_000_000_000


def _parse(name: str) -> dict[str, pl.DataFrame]:
    parsed = parse_scrape((ENGINES / name).read_bytes(), ts_ns=5, source=name)
    assert parsed.problems == []
    return parsed.tables


def _value(df: pl.DataFrame, concept: str, **labels: str) -> float:
    rows = df.filter(pl.col("concept") == concept)
    if labels:
        keep = [labels.items() <= json.loads(t).items() for t in rows["labels"]]
        rows = rows.filter(pl.Series(keep, dtype=pl.Boolean))
    assert rows.height == 1, rows
    return float(rows["value"][0])


# file -> (engine, concepts that must be there)
EXPECTED = {
    "nim_llama32_1b_h100.prom": (
        "nim", {"ttft_seconds_sum", "ttft_seconds_count", "itl_seconds_count", "e2e_seconds_sum",
                "requests_waiting", "request_success_total"}),
    "sglang_0.4_llama31_8b.prom": (
        "sglang", {"itl_seconds_count", "ttft_seconds_count", "kv_usage_ratio", "requests_running",
                   "requests_waiting"}),
    "sglang_0.3_gemma2_9b.prom": (
        "sglang", {"ttft_seconds_count", "itl_seconds_count", "e2e_seconds_sum", "queue_seconds_count",
                   "requests_running", "requests_waiting", "kv_usage_ratio", "prefix_cache_hit_ratio"}),
    "triton_4gpu_gpt_neo_ensemble.prom": (
        "triton", {"e2e_seconds_sum", "e2e_seconds_count", "queue_seconds_sum", "queue_seconds_count",
                   "inference_seconds_count"}),
    "triton_trtllm_backend_docs.prom": (
        "triton", {"requests_waiting", "requests_running", "kv_usage_ratio", "kv_transfer_seconds_sum",
                   "kv_transfer_seconds_count"}),
    "triton_summary_docs.prom": (
        "triton", {"queue_seconds_quantile", "queue_seconds_sum", "queue_seconds_count"}),
    "dynamo_trtllm_1.1.0rc5_docs.prom": (
        "trtllm", {"ttft_seconds_sum", "tpot_seconds_count", "queue_seconds_sum", "e2e_seconds_count",
                   "request_success_total"}),
    "tgi_names_ibm_vllm_tgis_adapter.prom": ("tgi", {"requests_running", "requests_waiting"}),
    "tgi_router_SYNTHETIC.prom": (
        "tgi", {"e2e_seconds_count", "queue_seconds_sum", "tpot_seconds_count", "requests_running",
                "requests_waiting", "request_success_total"}),
    "ray_serve_vllm_SYNTHETIC.prom": ("vllm", {"requests_running", "kv_usage_ratio", "ttft_seconds_count"}),
    "vllm_nixl_SYNTHETIC.prom": (
        "vllm", {"kv_transfer_seconds_sum", "kv_transfer_seconds_count", "kv_transfer_bytes_sum",
                 "kv_transfer_failures_total"}),
}  # fmt: skip


def test_every_sample_has_an_expectation_and_a_source() -> None:
    files = {p.name for p in ENGINES.glob("*.prom")}
    assert files == set(EXPECTED)
    sources = (ENGINES / "SOURCES.md").read_text()
    assert all(f"| {name} |" in sources for name in files)
    assert all(
        ("SYNTHETIC" in name) == sources.split(f"| {name} |")[1].strip().startswith("SYNTHETIC")
        for name in files
    )


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sample_is_recognized_and_yields_its_concepts(name: str) -> None:
    head = (ENGINES / name).read_bytes()
    assert sniff(name, head), f"{name} not recognized"
    engine, concepts = EXPECTED[name]
    samples = _parse(name)["engine_samples"]
    assert set(samples["engine"]) == {engine}
    missing = concepts - set(samples["concept"])
    assert not missing, missing


def test_nim_bare_names_model_and_means() -> None:
    samples = _parse("nim_llama32_1b_h100.prom")["engine_samples"]
    assert set(samples["model"]) == {"meta/llama-3.2-1b-instruct"}
    # 34 requests, 3.78 s of TTFT in all: 111 ms mean; time_per_output_token is per token (963 obs)
    assert _value(samples, "ttft_seconds_sum") / _value(samples, "ttft_seconds_count") == pytest.approx(
        0.11123, 1e-4
    )
    assert _value(samples, "itl_seconds_count") == 963.0 and _value(samples, "requests_max") == 2048.0


def test_bare_names_without_a_model_label_are_not_an_engine() -> None:
    body = b"request_success_total 3\nnum_requests_running 2\n"
    assert parse_scrape(body, ts_ns=1).tables.get("engine_samples") is None
    assert not sniff("x.prom", body)


def test_sglang_04_time_per_output_token_is_itl_with_its_74m_observations() -> None:
    tables = _parse("sglang_0.4_llama31_8b.prom")
    assert _value(tables["engine_samples"], "itl_seconds_count") == 7_400_757.0
    itl = tables["histogram_buckets"].filter(pl.col("concept") == "itl_seconds")
    assert itl.height == 19 and itl["cumulative_count"].max() == 7_400_757.0


def test_sglang_03_name_label_is_the_model_and_hit_rate_a_percentage() -> None:
    tables = _parse("sglang_0.3_gemma2_9b.prom")
    samples = tables["engine_samples"]
    assert set(samples["model"]) == {"google/gemma-2-9b-it"} and set(samples["labels"]) == {"{}"}
    assert _value(samples, "prefix_cache_hit_ratio") == pytest.approx(0.1061)
    assert _value(samples, "kv_usage_ratio") == 0.01
    queue = tables["histogram_buckets"].filter(pl.col("concept") == "queue_seconds")
    assert queue.filter(pl.col("le") == 1.0)["cumulative_count"].to_list() == [421.0]


def test_triton_sums_have_counts_and_gpu_gauges_are_gpu_samples() -> None:
    tables = _parse("triton_4gpu_gpt_neo_ensemble.prom")
    samples = tables["engine_samples"]
    model = samples.filter(pl.col("model") == "distilgpt2_cola")
    part = model.filter(pl.col("labels").str.contains("GPU-8674351b"))
    mean = _value(part, "e2e_seconds_sum") / _value(part, "e2e_seconds_count")
    assert mean == pytest.approx(47574974e-6 / 151)  # 315 ms per request
    assert _value(part, "queue_seconds_sum") == pytest.approx(2550e-6)
    gpu = tables["gpu_samples"]
    used = gpu.filter((pl.col("metric") == "fb_used_bytes") & (pl.col("uuid").str.starts_with("GPU-7a9c")))
    assert used["value"].to_list() == [7329546240.0]
    assert set(gpu["metric"]) == {"gpu_util_ratio", "fb_total_bytes", "fb_used_bytes", "power_w",
                                  "power_limit_w", "energy_j"}  # fmt: skip


def test_triton_trtllm_backend_labelled_gauges_and_kv_transfer() -> None:
    samples = _parse("triton_trtllm_backend_docs.prom")["engine_samples"]
    assert _value(samples, "kv_usage_ratio") == 0.4875
    assert _value(samples, "requests_running", request_type="scheduled") == 1.0
    assert _value(samples, "requests_max", request_type="max") == 512.0
    assert not samples.filter(pl.col("labels").str.contains('"active"')).height  # not a concept


def test_triton_summary_quantiles_in_seconds() -> None:
    samples = _parse("triton_summary_docs.prom")["engine_samples"]
    assert _value(samples, "queue_seconds_quantile", quantile="0.99") == pytest.approx(101e-6)
    assert samples.filter(pl.col("concept") == "queue_seconds_sum").height == 1  # the counter, once


def test_vllm_mfu_counters_get_rates_per_gpu() -> None:
    samples = _parse_path(DATA / "engine" / "vllm_0.33.0_dp1.prom")
    concepts = set(samples["concept"])
    assert {"estimated_flops_total", "estimated_read_bytes_total", "estimated_write_bytes_total"} <= concepts


def _parse_path(path: Path) -> pl.DataFrame:
    return parse_scrape(path.read_bytes(), ts_ns=5, source=path.name).tables["engine_samples"]


def _zeroed(body: str) -> str:
    """The same series at process start: every counter, bucket and gauge 0."""
    return "\n".join(
        line if line.startswith("#") or not line else re.sub(r" \S+$", " 0", line)
        for line in body.splitlines()
    )


@pytest.mark.parametrize(
    ("name", "means", "quantiles"),
    [
        ("tgi_router_SYNTHETIC.prom", {"e2e_seconds", "queue_seconds", "tpot_seconds"},
         {"e2e_seconds", "queue_seconds", "tpot_seconds"}),
        ("triton_4gpu_gpt_neo_ensemble.prom", {"e2e_seconds", "queue_seconds"}, set()),
        ("nim_llama32_1b_h100.prom", {"ttft_seconds", "itl_seconds", "e2e_seconds"}, set()),
    ],
)  # fmt: skip
def test_analyzer_judges_a_store_of_each_engine(
    tmp_path: Path, name: str, means: set, quantiles: set
) -> None:
    """Two scrapes 60 s apart, the first at process start (all counters 0, as an engine's are
    when it starts): every increase in the window is the sample's own count, so the means are
    the sample's sum/count and the quantiles its bucket estimates."""
    body = (ENGINES / name).read_text()
    t0, t1 = 1_700_000_000 * NS, 1_700_000_060 * NS
    with Store(tmp_path / "s.duckdb") as store:
        for ts, text in ((t0, _zeroed(body)), (t1, body)):
            for table, batch in parse_scrape(text, ts_ns=ts, host="h", source="eng").batches.items():
                store.write(table, batch)
    import duckdb

    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    try:
        got = window_means(con, t0, t1)
        assert means <= set(got), got
        q = window_quantiles(con, t0, t1)
        assert set(q) == quantiles
        for concept in quantiles:
            assert q[concept][0.99].value_s is not None
        (dep,) = list_deployments(con)
        verdict = analyze_envelope(con, dep, t0, t1)
        assert verdict.primary
        assert {f"{c}_mean" for c in means} <= {e.signal for e in verdict.evidence}
    finally:
        con.close()


@pytest.mark.parametrize("name", ["triton_4gpu_gpt_neo_ensemble.prom", "triton_trtllm_backend_docs.prom"])
def test_sidecar_replay_of_a_triton_body_equals_the_full_parse(name: str) -> None:
    """A target scraped again with the same shape replays its rows (scrape rule 6), the success
    counter's extra `_count` rows and the GPU gauges included."""
    from collector.formats.scrape import ScrapeCache

    body = (ENGINES / name).read_bytes()
    cache = ScrapeCache()
    parse_scrape(body, ts_ns=1, source="t", cache=cache)
    assert cache.replay is not None
    again = body.replace(b"0.4875", b"0.5").replace(b"151.000000", b"152.000000")
    replayed = parse_scrape(again, ts_ns=2, source="t", cache=cache)
    full = parse_scrape(again, ts_ns=2, source="t")
    assert set(replayed.tables) == set(full.tables)
    assert all(replayed.tables[t].equals(full.tables[t]) for t in full.tables)
