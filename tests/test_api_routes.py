"""REST routes over a realistic store: values equal the analyzer's, windows and names validated."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from api_store import END_NS, IB_TX_BYTES_PER_S, NS, START_NS, build
from fastapi.testclient import TestClient

from analyzer.deployments import find_deployment
from analyzer.latency import window_quantiles
from api.app import create_app
from api.params import ParamError, parse_at, parse_window
from collector.store import Store
from ioe.settings import Settings

BASE = "/api/v1/deployments/llama70b"


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    st = build()
    yield st
    st.close()


@pytest.fixture(scope="module")
def client(store: Store) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(store_path=":memory:"), store)) as c:
        yield c


def get(client: TestClient, path: str, status: int = 200) -> Any:
    r = client.get(path)
    assert r.status_code == status, r.text
    return r.json()


def test_overview_glance_matches_the_analyzer(client: TestClient, store: Store) -> None:
    body = get(client, "/api/v1/deployments")
    assert body["window"] == {"start_ns": END_NS - 900 * NS, "end_ns": END_NS, "seconds": 900.0}
    (row,) = body["deployments"]
    g = row["glance"]
    assert row["deployment"]["layout"] == {"tp": 4, "pp": 1, "dp": 2, "ep": 1}
    assert (g["zone"], g["secondary"], g["stragglers"]) == ("kv_capacity", "hbm_bandwidth", 1)
    with store.cursor() as cur:
        dep = find_deployment(cur, "llama70b")
        q = window_quantiles(cur, END_NS - 900 * NS, END_NS, keys=list(dep.engine_keys), qs=(0.99,))
    assert g["ttft_p99_s"] == pytest.approx(q["ttft_seconds"][0.99].value_s)
    assert g["itl_p99_s"] == pytest.approx(q["itl_seconds"][0.99].value_s)
    assert 0.03 < g["itl_p99_s"] < 0.1  # kv_capacity profile: ITL p50 30-32 ms, p99/p50 1.7-1.8
    assert g["kv_sequences_left"] == pytest.approx(100 * (1 / 0.97 - 1), abs=0.2)  # 100 running, KV 97 %


def test_detail_lists_sources_health(client: TestClient) -> None:
    body = get(client, BASE)
    assert body["comm_ids"] == ["0xabc"]
    assert len(body["gpu_uuids"]) == 8
    health = {s["target"]: s for s in body["sources"]}
    assert set(health) == {"llama70b-engine-0", "llama70b-engine-1", "dcgm-node0"}
    down = health["llama70b-engine-1"]
    assert (down["up"], down["last_error"], down["consecutive_failures"]) == (False, "connection refused", 7)


def test_envelope_zone_evidence_cp_headroom_regression(client: TestClient) -> None:
    body = get(client, f"{BASE}/envelope?window=15m")
    env = body["envelope"]
    assert env["primary"] == "kv_capacity" and 0.5 < env["confidence"] <= 0.99
    kv = next(e for e in env["evidence"] if e["signal"] == "kv_usage_ratio")
    assert (
        kv["value"] == pytest.approx(0.97, abs=0.005) and kv["verdict"] == "pass" and kv["threshold"] == 0.9
    )
    assert body["headroom"]["kv_sequences_left"] == pytest.approx(3.1, abs=0.2)
    assert {m["metric"] for m in body["regression"]["metrics"]} == {"ttft_seconds", "itl_seconds"}
    assert len(body["load_curve"]) == 15  # 900 s of history in 60 s bins
    assert all(48 * 2 <= p["concurrency"] <= 52 * 2 + 0.01 for p in body["load_curve"])


def test_window_and_at_move_the_window(client: TestClient) -> None:
    at_s = (START_NS + 600 * NS) / NS
    body = get(client, f"{BASE}/envelope?window=5m&at={at_s:.0f}")
    assert body["window"] == {
        "start_ns": START_NS + 300 * NS,
        "end_ns": START_NS + 600 * NS,
        "seconds": 300.0,
    }
    iso = get(client, f"{BASE}/latency?window=300s&at=2027-01-15T08:02:30")  # = START + 600 s
    assert iso["window"]["end_ns"] == START_NS + 600 * NS


def test_latency_is_labelled_as_bucket_estimates(client: TestClient) -> None:
    body = get(client, f"{BASE}/latency?window=15m&points=30")
    assert "bucket estimates" in body["note"]
    assert {q["estimate"] for q in body["quantiles"]} == {"bucket_interpolated"}
    ttft = {q["q"]: q["value_s"] for q in body["quantiles"] if q["metric"] == "ttft_seconds"}
    assert 4.0 < ttft[0.5] < 5.5  # generated TTFT median 4-5 s
    assert body["bin_s"] == 30.0
    bins = {p["bin"] for p in body["series"]}
    assert len(bins) == 30 and {p["concept"] for p in body["series"]} == {"ttft_seconds", "itl_seconds"}


def test_gpu_and_fabric_series_are_downsampled(client: TestClient) -> None:
    gpu = get(client, f"{BASE}/gpu?window=15m&points=20")
    assert gpu["bin_s"] == 45.0 and gpu["source"] == "gpu_samples"
    sm = [p for p in gpu["series"] if p["metric"] == "sm_active_ratio"]
    assert len(sm) == 20
    assert all(0.45 < p["mean"] < 0.57 for p in sm)  # kv_capacity: SM 0.50-0.52 ± 2 % noise
    fab = get(client, f"{BASE}/fabric?window=15m&points=20")
    tx = [p for p in fab["ports"] if p["metric"] == "tx_bytes"]
    assert tx and all(p["mean"] == pytest.approx(IB_TX_BYTES_PER_S) for p in tx)
    assert {p["metric"] for p in fab["links"]} == {"nvlink_tx_bytes_per_s"}


def test_collectives_and_stragglers(client: TestClient) -> None:
    col = get(client, f"{BASE}/collectives")
    assert col["records"] == 8000  # 1000 AllReduce instances × 8 ranks
    (row,) = col["summary"]
    assert row["op"] == "AllReduce" and 0.3 < row["wait_share"] < 0.6
    strag = get(client, f"{BASE}/stragglers")
    (s,) = strag["stragglers"]
    assert (s["rank"], s["kind"], s["host"], s["gpu"]) == (3, "persistent", "node0", 3)
    assert s["cause"] == "gpu_throttled: thermal" and s["blame_share"] == pytest.approx(1.0)
    rank3 = [c["share"] for c in strag["heatmap"] if c["rank"] == 3]
    others = [c["share"] for c in strag["heatmap"] if c["rank"] != 3]
    assert len(rank3) == 40 and min(rank3) > 0.9 and max(others) < 0.1


def test_plan_ranks_layouts_against_the_current_one(client: TestClient) -> None:
    body = get(client, f"{BASE}/plan?top=3")
    assert body["gpus"] == 8 and body["workload"]["isl"] == 1020 and body["workload"]["osl"] == 200
    assert len(body["candidates"]) == 3 and body["current"]["tp"] == 4 and body["current"]["dp"] == 2
    assert body["candidates"][0]["goodput_tok_s_per_gpu"] > 0


def test_targets(client: TestClient) -> None:
    body = get(client, "/api/v1/targets")
    assert [t["target"] for t in body["targets"]] == ["dcgm-node0", "llama70b-engine-0", "llama70b-engine-1"]


@pytest.mark.parametrize(
    ("query", "parameter", "value"),
    [
        ("window=abc", "window", "abc"),
        ("window=0m", "window", "0m"),
        ("window=40d", "window", "40d"),
        ("window=1.5h", "window", "1.5h"),
        ("at=yesterday", "at", "yesterday"),
        ("at=-5", "at", "-5"),
        ("at=2026-02-30", "at", "2026-02-30"),
        ("at=9300000000", "at", "9300000000"),  # 2264: past what nanoseconds in 64 bits hold
        ("at=4100000000", "at", "4100000000"),  # 2099-12-04 is the last Unix second taken, like the dates
    ],
)
def test_bad_windows_are_refused_naming_the_parameter(
    client: TestClient, query: str, parameter: str, value: str
) -> None:
    (err,) = get(client, f"{BASE}/latency?{query}", 422)["detail"]
    assert err["loc"] == ["query", parameter] and err["input"] == value and "pattern" in err["msg"]


@pytest.mark.parametrize(
    ("call", "text", "parameter"),
    [(parse_window, "abc", "window"), (parse_window, "32d", "window"), (parse_at, "2026-13-01", "at")],
)
def test_parsers_quote_the_bad_value(call: Any, text: str, parameter: str) -> None:
    with pytest.raises(ParamError) as got:
        call(text)
    assert got.value.status_code == 400
    assert got.value.detail["parameter"] == parameter and repr(text) in got.value.detail["message"]


def test_parsers_read_units_and_times() -> None:
    assert [parse_window(w) for w in ("900", "900s", "15m", "6h", "31d")] == [900, 900, 900, 21600, 2678400]
    assert parse_at("1800000000.5") == 1_800_000_000_500_000_000
    assert parse_at("2027-01-15T08:00") == parse_at("2027-01-15T09:00+01:00") == 1_800_000_000 * NS
    assert parse_at("4099999999") == 4_099_999_999 * NS
    assert parse_at(None) is None


def test_unknown_deployment_lists_known_and_malformed_names_are_refused(client: TestClient) -> None:
    assert get(client, "/api/v1/deployments/nope", 404)["detail"]["known"] == ["llama70b"]
    detail = get(client, "/api/v1/deployments/" + "x" * 257, 422)["detail"]  # any character, at most 256
    assert detail[0]["loc"] == ["path", "name"]
    assert get(client, f"{BASE}/gpu?points=5", 422)["detail"][0]["loc"] == ["query", "points"]


def test_fifty_concurrent_clients_share_one_analysis(store: Store) -> None:
    app = create_app(Settings(store_path=":memory:"), store)
    results: list[int] = []
    with TestClient(app) as c:
        c.get("/readyz")
        before = app.state.cache.computed

        def one() -> None:
            results.append(c.get(f"{BASE}/envelope?window=10m").status_code)

        threads = [threading.Thread(target=one) for _ in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert results == [200] * 50
    # one envelope analysis, its serialized body, and the shared "latest" and "deployments" look-ups
    assert app.state.cache.computed - before == 4
