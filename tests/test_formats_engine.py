"""Engine metrics -> canonical concepts; parse_scrape; counter rates; `ioe ingest` of the fixtures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import duckdb
import polars as pl
import pytest
from typer.testing import CliRunner

from collector.errors import ParseError
from collector.formats.engine import CONCEPTS, to_engine_samples
from collector.formats.exposition import parse
from collector.formats.scrape import parse_scrape, sniff
from collector.rates import CounterRates
from ioe.cli import app
from tests.conftest import DATA

VLLM_DP2 = DATA / "engine" / "vllm_0.33.0_dp2.prom"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _tables(path: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    parsed = to_engine_samples(parse(path.read_text()), ts_ns=5, source="t")
    assert parsed.problems == []
    return parsed.tables["engine_samples"], parsed.tables["histogram_buckets"]


def _one(df: pl.DataFrame, **where: object) -> dict:
    rows = df.filter(pl.all_horizontal(pl.col(k) == v for k, v in where.items())).to_dicts()
    assert len(rows) == 1, rows
    return rows[0]


@pytest.mark.parametrize("name", ["vllm_0.33.0_dp2.prom", "vllm_0.33.0_dp2.openmetrics"])
def test_vllm_dp2_ranks_gauges_counters_and_ttft_buckets(name: str) -> None:
    samples, buckets = _tables(DATA / "engine" / name)
    assert sorted(samples["dp_rank"].unique()) == [0, 1]
    assert set(samples["engine"]) == {"vllm"} and set(samples["model"]) == {MODEL}
    assert _one(samples, dp_rank=1, concept="kv_usage_ratio")["value"] == 0.52
    assert _one(samples, dp_rank=0, concept="requests_running")["value"] == 12.0
    assert _one(samples, dp_rank=0, concept="prefix_cache_hits_total")["value"] == 76800.0
    assert _one(samples, dp_rank=0, concept="prompt_tokens_total")["labels"] == "{}"
    stop = _one(samples, dp_rank=1, concept="request_success_total", labels='{"finished_reason":"stop"}')
    assert stop["value"] == 5.0
    assert _one(samples, dp_rank=1, concept="ttft_seconds_sum")["value"] == pytest.approx(22.136510976846004)
    assert _one(samples, dp_rank=1, concept="ttft_seconds_count")["value"] == 50.0
    assert samples["rate_per_s"].null_count() == samples.height
    assert _one(buckets, dp_rank=1, concept="ttft_seconds", le=0.1)["cumulative_count"] == 5.0
    assert _one(buckets, dp_rank=1, concept="ttft_seconds", le=math.inf)["cumulative_count"] == 50.0
    ttft_les = buckets.filter((pl.col("concept") == "ttft_seconds") & (pl.col("dp_rank") == 0))["le"]
    assert ttft_les.min() == 0.001 and ttft_les.is_sorted()
    phases = {"itl_seconds", "tpot_seconds", "e2e_seconds", "queue_seconds", "prefill_seconds"}
    assert phases | {"decode_seconds"} <= set(buckets["concept"])


def test_sglang_ranks_and_concepts() -> None:
    samples, buckets = _tables(DATA / "engine" / "sglang_0.5.23.prom")
    running = _one(samples, concept="requests_running")
    assert (running["value"], running["tp_rank"], running["pp_rank"], running["ep_rank"]) == (12.0, 0, 0, 0)
    assert running["dp_rank"] == -1 and running["engine"] == "sglang"
    assert json.loads(running["labels"]) == {"engine_type": "unified"}
    assert _one(samples, concept="kv_usage_ratio")["value"] == 0.42
    assert _one(samples, concept="prefix_cache_hit_ratio")["value"] == 0.75
    cached = _one(samples, concept="cached_tokens_total")
    assert cached["value"] == 15360.0 and json.loads(cached["labels"])["cache_source"] == "device"
    streaming = '{"engine_type":"unified","is_streaming":"true"}'
    assert _one(buckets, concept="ttft_seconds", le=0.4, labels=streaming)["cumulative_count"] == 9.0
    assert _one(samples, concept="queue_seconds_count")["value"] == 10.0


RETIRED_AND_OTHERS = """\
vllm:gpu_cache_usage_perc{model_name="old",engine="0"} 0.3
vllm:time_per_output_token_seconds_bucket{model_name="old",engine="0",le="0.05"} 7
vllm:time_per_output_token_seconds_bucket{model_name="old",engine="0",le="+Inf"} 9
trtllm_kv_cache_utilization{model_name="m",engine_type="pytorch"} 0.6
trtllm_time_to_first_token_seconds_bucket{model_name="m",engine_type="pytorch",le="0.5"} 4
dynamo_frontend_inflight_requests{model="d",worker_id="w1",dp_rank="2"} 6
dynamo_component_gpu_cache_usage_percent{model="d",dp_rank="2"} 0.9
nv_inference_request_duration_us{model="t",version="1"} 2500000
nv_inference_first_response_histogram_ms_bucket{model="t",version="1",le="100"} 3
nv_inference_first_response_histogram_ms_sum{model="t",version="1"} 150
sglang:token_usage{model_name="s",tp_rank="x"} 3.5
sglang:num_queue_reqs{model_name="s",tp_rank="1"} NaN
"""


def test_retired_names_other_engines_and_refusals() -> None:
    parsed = to_engine_samples(parse(RETIRED_AND_OTHERS), ts_ns=1)
    samples, buckets = parsed.tables["engine_samples"], parsed.tables["histogram_buckets"]
    assert _one(samples, engine="vllm", concept="kv_usage_ratio")["value"] == 0.3
    assert _one(buckets, engine="vllm", concept="itl_seconds", le=0.05)["cumulative_count"] == 7.0
    assert _one(samples, engine="trtllm", concept="kv_usage_ratio")["labels"] == '{"engine_type":"pytorch"}'
    assert _one(buckets, engine="trtllm", concept="ttft_seconds")["le"] == 0.5
    dyn = _one(samples, engine="dynamo", concept="requests_running")
    assert (dyn["model"], dyn["dp_rank"], dyn["labels"]) == ("d", 2, '{"worker_id":"w1"}')
    assert _one(samples, engine="dynamo", concept="kv_usage_ratio")["value"] == 0.9
    assert _one(samples, engine="triton", concept="e2e_seconds_sum")["value"] == pytest.approx(2.5)
    assert _one(buckets, engine="triton", concept="ttft_seconds")["le"] == pytest.approx(0.1)
    assert _one(samples, engine="triton", concept="ttft_seconds_sum")["value"] == pytest.approx(0.15)
    messages = [p.message for p in parsed.problems]
    assert any("KV usage 3.5 outside 0..1" in m for m in messages)
    assert any("1 non-finite value(s) dropped" in m for m in messages)
    assert samples.filter(pl.col("engine") == "sglang").height == 0


def test_concepts_are_documented() -> None:
    import collector.formats.engine as engine

    for concept in CONCEPTS:
        assert f"``{concept.removesuffix('_sum').removesuffix('_count')}" in (engine.__doc__ or ""), concept


def test_parse_scrape_auto_reads_a_mixed_body() -> None:
    body = (DATA / "dcgm" / "h100x8_k8s_pod_labels.prom").read_bytes() + VLLM_DP2.read_bytes()
    parsed = parse_scrape(body, kind="auto", ts_ns=9, host="n1", source="mixed")
    assert (
        parsed.tables["gpu_samples"].height == 30 and parsed.tables["engine_samples"].height == 74
    )  # 68 + 3 MFU counters × 2 engines
    only_gpu = parse_scrape(body, kind="dcgm", ts_ns=9)
    assert set(only_gpu.tables) == {"gpu_samples"}
    with pytest.raises(ValueError, match="kind"):
        parse_scrape(body, kind="bogus", ts_ns=9)  # type: ignore[arg-type]


def test_parse_scrape_garbage_and_cap() -> None:
    body = VLLM_DP2.read_bytes() + b"\n\xff\xfe\x00garbage\x81\n"
    parsed = parse_scrape(body, ts_ns=1, source="t1")
    assert parsed.tables["engine_samples"].height == 74  # 68 + 3 MFU counters × 2 engines
    (problem,) = parsed.problems
    assert problem.location == f"t1: line {VLLM_DP2.read_text().count(chr(10)) + 2}"
    with pytest.raises(ParseError, match="exceeds the cap"):
        parse_scrape(b"x 1\n" * 1000, ts_ns=1, source="t1", max_bytes=100)


def test_sniff_by_content() -> None:
    assert sniff("capture.txt", VLLM_DP2.read_bytes()[:4096])
    assert sniff("noext", (DATA / "dcgm" / "h100x8_k8s_pod_labels.prom").read_bytes())
    assert not sniff("x.prom", (DATA / "dcgm" / "h800x8_dcgmi_dmon_nvlink_pcie.txt").read_bytes())
    assert not sniff("x.prom", b"# just a comment\nsome_other_app_metric 1\n")
    assert not sniff("x.json", b'{"a": 1}\n')


def _scrape(ts_s: float, prompt_tokens: float) -> pl.DataFrame:
    text = VLLM_DP2.read_text().replace(
        f'vllm:prompt_tokens_total{{engine="0",model_name="{MODEL}"}} 25600.0',
        f'vllm:prompt_tokens_total{{engine="0",model_name="{MODEL}"}} {prompt_tokens}',
    )
    return parse_scrape(text, ts_ns=int(ts_s * 1e9), source="v").tables["engine_samples"]


def _rate(df: pl.DataFrame, concept: str, dp: int = 0) -> float | None:
    return _one(df, concept=concept, dp_rank=dp)["rate_per_s"]


def test_counter_rates_first_increase_reset_replay() -> None:
    rates = CounterRates()
    first = rates.apply(_scrape(100, 25600))
    assert first["rate_per_s"].null_count() == first.height  # rule 3
    second = rates.apply(_scrape(102, 25700))
    assert _rate(second, "prompt_tokens_total") == pytest.approx(50.0)
    assert _rate(second, "prompt_tokens_total", dp=1) == 0.0
    assert _rate(second, "ttft_seconds_count") == 0.0
    assert _rate(second, "requests_running") is None  # a gauge: never a rate
    reset = rates.apply(_scrape(104, 10))
    assert _rate(reset, "prompt_tokens_total") is None  # rule 4: reset -> NULL
    after = rates.apply(_scrape(105, 30))
    assert _rate(after, "prompt_tokens_total") == pytest.approx(20.0)
    replay = rates.apply(_scrape(105, 30))
    assert _rate(replay, "prompt_tokens_total") is None  # rule 5
    assert _rate(rates.apply(_scrape(106, 40)), "prompt_tokens_total") == pytest.approx(10.0)


def test_counter_rates_fabric_and_bound() -> None:
    rates = CounterRates(max_series=1)
    row = {"host": ["h"], "device": ["mlx5_0"], "port": [1], "metric": ["port_rcv_data_bytes"]}
    a = pl.DataFrame({"ts_ns": [0], **row, "value": [0.0], "rate_per_s": [None]})
    b = a.with_columns(ts_ns=pl.lit(2_000_000_000), value=pl.lit(4e9))
    assert rates.apply(a, table="fabric_samples")["rate_per_s"][0] is None
    assert rates.apply(b, table="fabric_samples")["rate_per_s"][0] == 2e9
    other = b.with_columns(port=pl.lit(2))
    rates.apply(other, table="fabric_samples")
    assert len(rates) == 1  # rule 6: the oldest series was forgotten


def test_ioe_ingest_stores_canonical_rows(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    paths = [str(DATA / "dcgm"), str(DATA / "engine")]
    args = ["ingest", *paths, "--store", str(store), "--ts", "1700000000", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["files"]["prometheus-scrape"] == 6 and report["files"]["dcgmi-dmon"] == 1
    con = duckdb.connect(str(store), read_only=True)
    try:
        power = con.execute(
            "SELECT value FROM gpu_samples WHERE metric='power_w' AND host='gpu-node-1' AND gpu=0"
        ).fetchall()
        assert power == [(113.611,)]
        fb = con.execute("SELECT value FROM gpu_samples WHERE metric='fb_free_bytes' AND host='424773df46e0'")
        assert fb.fetchall() == [(15109 * 1_048_576,)]
        dmon = con.execute("SELECT count(DISTINCT ts_ns) FROM gpu_samples WHERE source LIKE '%dmon%'")
        assert dmon.fetchone() == (10,)
        dp = con.execute(
            "SELECT DISTINCT dp_rank FROM engine_samples WHERE source LIKE '%vllm_0.33.0_dp2.prom' ORDER BY 1"
        ).fetchall()
        assert dp == [(0,), (1,)]
        ttft = con.execute(
            "SELECT cumulative_count FROM histogram_buckets WHERE source LIKE '%dp2.openmetrics' "
            "AND concept='ttft_seconds' AND dp_rank=1 AND le=0.1"
        ).fetchall()
        assert ttft == [(5.0,)]
        ts = con.execute("SELECT DISTINCT ts_ns FROM engine_samples").fetchall()
        assert ts == [(1_700_000_000_000_000_000,)]
    finally:
        con.close()
