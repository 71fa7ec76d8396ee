"""A store with realistic data for the API and page tests (SYNTHETIC, deterministic).

One declared deployment ``llama70b`` (2 vLLM engines, TP4 × DP2 on host ``node0``) in the
``kv_capacity`` zone (:mod:`gen_telemetry`), whose NCCL communicator has a thermally throttled
straggler at rank 3 (:mod:`gen_collectives` ``throttled``), plus what the other routes read: an
nccl-tests baseline, request spans (planner workload), target health (one engine down) and
InfiniBand port rates.
The 15-minute window ending at the newest sample holds all of it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from gen_collectives import SCENARIOS, T0_US, collectives, gpu_samples
from gen_telemetry import Layout, generate

from collector.records import frame
from collector.store import Store

NS = 1_000_000_000
START_NS = int(T0_US * 1000) - 450 * NS  # collectives span [start + 450 s, start + 850 s]
END_NS = START_NS + 900 * NS  # newest sample: the default window end
LAYOUT = replace(Layout(), hosts=("node0",), start_ns=START_NS, with_collectives=False)
IB_TX_BYTES_PER_S = 12.5e9
SPANS = 200
BASELINE_BUSBW_GBS = 380.0


def build(path: str = ":memory:") -> Store:
    st = Store(path)
    generate(st, "kv_capacity", LAYOUT)
    sc = SCENARIOS["throttled"]
    st.write("collective_records", collectives(sc))
    st.write("gpu_samples", gpu_samples(sc))
    st.write("request_spans", _spans())
    st.write("targets", _targets())
    st.write("fabric_samples", _fabric())
    st.write("nccl_baselines", _baseline())
    return st


def _baseline() -> object:
    """nccl-tests all_reduce_perf on 8 H100s over NVLink: the capability busbw is compared with."""
    return frame("nccl_baselines", [{
        "source": "all_reduce_perf", "host": "node0", "op": "all_reduce", "n_gpus": 8,
        "size_bytes": 1 << 26, "count": 1 << 25, "dtype": "bfloat16", "redop": "sum", "root": -1,
        "in_place": False, "time_us": 300.0, "algbw_gbs": BASELINE_BUSBW_GBS * 8 / 14,
        "busbw_gbs": BASELINE_BUSBW_GBS, "wrong": 0, "ts_ns": START_NS,
    }])  # fmt: skip


def _spans() -> object:
    rows = [{"trace_id": f"{i:032x}", "span_id": f"{i:016x}", "start_ns": START_NS + i * 4 * NS,
             "end_ns": START_NS + i * 4 * NS + 3 * NS, "name": "llm_request", "service": "vllm",
             "engine": "vllm", "model": "meta-llama/Llama-3.1-70B-Instruct", "dp_rank": -1, "role": "",
             "request_id": f"r{i}", "ttft_s": 4.5, "e2e_s": 10.0, "input_tokens": 1000 + (i % 5) * 10,
             "output_tokens": 200, "cached_tokens": 0, "finish_reason": "stop", "attributes": "{}"}
            for i in range(SPANS)]  # fmt: skip
    return frame("request_spans", rows)


def _targets() -> object:
    base = {
        "kind": "engine",
        "host": "node0",
        "samples_last": 120,
        "dropped_last": 0,
        "updated_ns": END_NS,
        "last_scrape_ns": END_NS,
        "last_duration_s": 0.012,
        "last_error": "",
        "consecutive_failures": 0,
    }
    return frame("targets", [
        {**base, "target": "llama70b-engine-0", "url": "http://127.0.0.1:8000/metrics", "up": True},
        {**base, "target": "llama70b-engine-1", "url": "http://127.0.0.1:8001/metrics", "up": False,
         "last_error": "connection refused", "consecutive_failures": 7, "samples_last": 0},
        {**base, "target": "dcgm-node0", "kind": "dcgm", "url": "http://127.0.0.1:9400/metrics", "up": True},
    ])  # fmt: skip


def _fabric() -> object:
    rows = []
    for k in range(1, 91):
        t = START_NS + k * 10 * NS
        for metric, rate in (("tx_bytes", IB_TX_BYTES_PER_S), ("rx_bytes", IB_TX_BYTES_PER_S / 2)):
            rows.append({"ts_ns": t, "host": "node0", "device": "mlx5_0", "port": 1, "metric": metric,
                         "value": rate * k * 10, "rate_per_s": rate})  # fmt: skip
    return frame("fabric_samples", rows)


def dumps(obj: object) -> str:
    return json.dumps(obj, indent=1, default=str)


def consistent_settings(case: Any) -> Any:
    """Keep a generated request's analysis settings inside the one rule its schema cannot state:
    the pinned reference window goes with ``regression_baseline=reference`` and nothing else
    (both ends, end after start). A request breaking it is refused with 400, rightly; the schema
    checks would count that as valid data refused, so such cases are made consistent first."""
    q = case.query
    if not isinstance(q, dict):
        return case
    ends = ("regression_reference_start_s", "regression_reference_end_s")
    start, end = (q.get(k) for k in ends)
    reference = q.get("regression_baseline") == "reference"
    if reference and not (start is not None and end is not None and end > start):
        q.pop("regression_baseline")
    if q.get("regression_baseline") != "reference":
        for k in ends:
            q.pop(k, None)
    return case
