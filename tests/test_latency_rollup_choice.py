"""Latency rule 6: long windows read the per-minute rollups, short ones raw rows.

Hand-built telemetry: one engine's counter that grows by exactly 1 every 10 s for 3 h, and one
histogram whose ``le=1`` bucket grows by 2 and whose ``+Inf`` bucket grows by 3 every 10 s. Over
any window ``(a, b]`` whose ends are whole minutes the increase is then known without the analyzer:
``(b − a) / 10 s`` for the counter, twice and three times that for the buckets, whether it is read
from raw rows or from the last value of each minute."""

from __future__ import annotations

import math

import pytest

import analyzer.latency as latency
from collector.records import frame
from collector.store import Store

NS = 1_000_000_000
T0 = 1_767_225_600 * NS  # a whole minute
HOURS = 3
IDENT = {
    "source": "e",
    "engine": "vllm",
    "model": "m",
    "dp_rank": 0,
    "tp_rank": 0,
    "pp_rank": 0,
    "ep_rank": 0,
}


@pytest.fixture(scope="module")
def store() -> Store:
    st = Store()
    steps = range(1, HOURS * 360 + 1)
    counter = [
        {
            **IDENT,
            "ts_ns": T0 + i * 10 * NS,
            "concept": "generation_tokens_total",
            "labels": "{}",
            "value": float(i),
        }
        for i in steps
    ]
    buckets = [
        {
            **IDENT,
            "ts_ns": T0 + i * 10 * NS,
            "concept": "itl_seconds",
            "labels": "{}",
            "le": le,
            "cumulative_count": k * i,
        }
        for i in steps
        for le, k in ((1.0, 2.0), (math.inf, 3.0))
    ]
    st.write("engine_samples", frame("engine_samples", counter))
    st.write("histogram_buckets", frame("histogram_buckets", buckets))
    st.maintain(now_ns=T0 + (HOURS * 3600 + 60) * NS)
    return st


def test_rule_six_chooses_by_window_length(store: Store) -> None:
    end = T0 + HOURS * 3600 * NS
    with store.cursor() as cur:
        assert not latency.rollup_for(cur, end - 3600 * NS, end)  # 1 h: raw (the page's 15 min and 1 h)
        assert latency.rollup_for(cur, end - 2 * 3600 * NS, end)  # over 1 h: rollups
        assert not latency.rollup_for(cur, end - 2 * 3600 * NS, end, bin_s=90.0)  # bins not whole minutes
        assert latency.rollup_for(cur, end - 2 * 3600 * NS, end, bin_s=120.0)
        # no rollup rows in the window (before the data): raw rows, whatever the length
        assert not latency.rollup_for(cur, T0 - 10 * 3600 * NS, T0 - 3600 * NS)


@pytest.mark.parametrize("hours", [0.5, 1.0, 2.0, 2.5])
def test_known_increases_from_either_source(store: Store, hours: float) -> None:
    end = T0 + HOURS * 3600 * NS - 60 * NS  # a whole minute inside the data
    start = end - int(hours * 3600) * NS
    steps = hours * 360  # one step every 10 s
    with store.cursor() as cur:
        auto = latency.counter_increases(cur, start, end, ["generation_tokens_total"], keys=["e|vllm|0"])
        assert auto["increase"].to_list() == [pytest.approx(steps)]
        buckets = latency.bucket_increases(cur, start, end, concepts=["itl_seconds"])
        assert buckets["count"].to_list() == [pytest.approx(2 * steps), pytest.approx(3 * steps)]
        for rollup in (False, True):  # both sources agree on whole-minute windows
            got = latency.counter_increases(cur, start, end, ["generation_tokens_total"], rollup=rollup)
            assert got["increase"].to_list() == [pytest.approx(steps)]
        binned = latency.bucket_increases(cur, start, end, concepts=["itl_seconds"], bin_s=600.0)
        assert binned.filter(binned["le"] == 1.0)["count"].to_list() == [pytest.approx(120.0)] * int(
            hours * 6
        )
