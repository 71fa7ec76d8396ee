"""``/metrics``: the verdict series of docs/metrics.md, their values, the registries passed in, and a
live body from a real uvicorn on 127.0.0.1 checked by the real ``promtool check metrics``."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator

import httpx
import pytest
from api_store import build
from conftest import ROOT, free_port, require_component
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from test_api_uvicorn import Served

from api.app import create_app
from api.verdicts import _families, add_envelope
from ioe.settings import Settings


def documented_verdicts() -> set[str]:
    """Series names in the 'Verdicts' table of docs/metrics.md."""
    text = (ROOT / "docs" / "metrics.md").read_text()
    section = text.split("## Verdicts", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(ioe_[a-z0-9_]+)`", section, flags=re.M))


@pytest.fixture(scope="module")
def scraped() -> Iterator[dict[str, list[tuple[dict[str, str], float]]]]:
    st = build()
    own = CollectorRegistry()
    Counter("ioe_rows_stored", "rows stored", ["table"], registry=own).labels("gpu_samples").inc(42)
    with TestClient(create_app(Settings(store_path=":memory:"), st, registries=[own])) as c:
        r = c.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        text = r.text
        latency = c.get("/api/v1/deployments/llama70b/latency").json()
        envelope = c.get("/api/v1/deployments/llama70b/envelope").json()
    st.close()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    out["_latency"] = [({q["metric"] + str(q["q"]): ""}, q["value_s"]) for q in latency["quantiles"]]
    out["_cp"] = [({}, envelope["cp"]["cp"])]
    yield out


def one(scraped: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    got = [v for lab, v in scraped[name] if all(lab.get(k) == x for k, x in labels.items())]
    assert len(got) == 1, (name, labels, scraped.get(name))
    return got[0]


def test_every_documented_verdict_series_is_exported(scraped: dict) -> None:
    documented = documented_verdicts()
    assert len(documented) == 20
    # regression ratio and flag are absent here only because the store holds no baseline day
    exported = {n for n in scraped if n.startswith("ioe_") and not n.startswith("ioe_rows_stored")}
    assert exported == documented - {"ioe_deployment_p99_regression_ratio", "ioe_deployment_p99_regression"}
    assert one(scraped, "ioe_rows_stored_total", table="gpu_samples") == 42.0  # registries passed in


def test_zone_is_one_hot_with_bounded_labels(scraped: dict) -> None:
    zones = {lab["zone"]: v for lab, v in scraped["ioe_deployment_zone"]}
    assert zones == {
        "compute": 0.0,
        "hbm_bandwidth": 0.0,
        "kv_capacity": 1.0,
        "network": 0.0,
        "headroom": 0.0,
        "saturated": 0.0,
        "unknown": 0.0,
    }
    second = {lab["zone"]: v for lab, v in scraped["ioe_deployment_secondary_zone"]}
    assert sum(second.values()) == 1.0 and second["hbm_bandwidth"] == 1.0
    assert 0.5 < one(scraped, "ioe_deployment_zone_confidence_ratio", deployment="llama70b") <= 0.99


def test_latency_headroom_and_cp_match_the_api(scraped: dict) -> None:
    lat = {next(iter(lab)): v for lab, v in scraped["_latency"]}
    for signal, concept in (("ttft", "ttft_seconds"), ("itl", "itl_seconds")):
        for q in ("0.5", "0.99"):
            name = f"ioe_deployment_{signal}_p{round(float(q) * 100)}_seconds"
            got = one(scraped, name, deployment="llama70b")
            assert got == pytest.approx(lat[concept + q], rel=1e-5)
    assert one(scraped, "ioe_deployment_kv_headroom_ratio", deployment="llama70b") == pytest.approx(
        0.03, abs=0.005
    )
    assert one(scraped, "ioe_deployment_kv_headroom_sequences", deployment="llama70b") == pytest.approx(
        3.1, abs=0.2
    )
    assert one(scraped, "ioe_deployment_concurrency", deployment="llama70b") == pytest.approx(100.0, abs=0.5)
    cp = scraped["_cp"][0][1]
    assert one(scraped, "ioe_deployment_crossover_concurrency", deployment="llama70b") == pytest.approx(cp)


def test_stragglers_and_regression_flags(scraped: dict) -> None:
    labels = {"deployment": "llama70b", "rank": "3", "host": "node0", "gpu": "3"}
    assert one(scraped, "ioe_straggler_score_ratio", **labels) == pytest.approx(1.0)
    assert one(scraped, "ioe_straggler", **labels) == 1.0
    assert len(scraped["ioe_straggler"]) == 1  # only flagged ranks: bounded by the deployment's ranks
    # no baseline day in the store: "no regression" (0) would be a claim IOE cannot make
    assert "ioe_deployment_p99_regression" not in scraped
    for signal in ("ttft", "itl"):
        assert one(scraped, "ioe_deployment_p99_baseline_available", signal=signal) == 0.0
    assert one(scraped, "ioe_deployment_collective_exposed_ratio") > 0
    # median busbw of the throttled scenario (≈197 GB/s) over the 380 GB/s nccl-tests baseline
    assert one(scraped, "ioe_deployment_collective_busbw_ratio") == pytest.approx(197.38 / 380.0, rel=0.01)
    assert one(scraped, "ioe_analysis_timestamp_seconds", deployment="llama70b") > 1.7e9


def _regression_only(rows: list[dict]) -> dict[str, GaugeMetricFamily]:
    """The families after :func:`add_envelope` over a hand-built report holding only ``rows``."""
    env = {
        "envelope": {"primary": "headroom", "secondary": None, "confidence": None, "evidence": []},
        "headroom": {"kv_sequences_left": None},
        "cp": {"cp": None},
        "regression": {"metrics": rows},
    }
    fams = _families()
    add_envelope(fams, "d", env)
    return fams


def test_regression_flag_only_where_a_baseline_exists() -> None:
    # ttft: baseline 2.0 s, now 3.0 s -> ratio 1.5 ≥ 1.25, regressed; itl: no baseline day in the store
    rows = [
        {"metric": "ttft_seconds", "now_s": 3.0, "baseline_s": 2.0, "ratio": 1.5, "verdict": "regressed"},
        {"metric": "itl_seconds", "now_s": 0.05, "baseline_s": None, "ratio": None, "verdict": "no data"},
    ]
    fams = _regression_only(rows)

    def samples(key: str) -> dict[str, float]:
        return {s.labels["signal"]: s.value for s in fams[key].samples}

    assert samples("baseline") == {"ttft": 1.0, "itl": 0.0}
    assert samples("regr") == {"ttft": 1.5}
    assert samples("regflag") == {"ttft": 1.0}


def test_live_metrics_pass_promtool_check_metrics() -> None:
    """A real server on 127.0.0.1 over a store with data; its body through ``promtool check metrics``
    (lint included: a ``quantile`` label on a gauge, a counter without ``_total`` fail it)."""
    promtool = require_component("promtool")
    st = build()
    own = CollectorRegistry()
    Counter("ioe_rows_stored", "rows stored", ["table"], registry=own).labels("gpu_samples").inc(42)
    try:
        with Served(create_app(Settings(store_path=":memory:"), st, registries=[own]), free_port()) as s:
            body = httpx.get(f"{s.url}/metrics", timeout=60).text
    finally:
        st.close()
    assert "ioe_deployment_ttft_p99_seconds{" in body and "ioe_straggler_score_ratio{" in body
    got = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=60
    )
    assert got.returncode == 0 and got.stdout.strip() == "" and got.stderr.strip() == "", (
        got.stdout + got.stderr
    )


def test_ttft_share_only_for_the_parts_spans_carry(scraped: dict) -> None:
    # api_store's 200 spans carry TTFT (4.5 s) and nothing it is made of: the whole of it is 'other',
    # and no queue/prefill/kv_transfer share is claimed
    assert [(lab["phase"], v) for lab, v in scraped["ioe_deployment_ttft_share_ratio"]] == [("other", 1.0)]
