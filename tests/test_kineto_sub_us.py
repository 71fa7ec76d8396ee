"""Collectives from a real trace keep sub-µs durations: busbw is derived from the trace's own
float µs, not from HTA's inward-rounded integers (which kernel_events keep for HTA parity)."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest

from collector.formats import kineto
from tests.conftest import DATA

TRACE = DATA / "kineto" / "nccl_parser_config_1rank" / "nccl_data.json.gz"


def test_collective_times_are_the_traces_float_microseconds() -> None:
    doc = json.loads(gzip.decompress(TRACE.read_bytes()))
    kernels = {
        round(e["ts"], 3): e
        for e in doc["traceEvents"]
        if isinstance(e, dict)
        and e.get("cat") == "kernel"
        and str(e.get("name", "")).startswith("ncclKernel")
    }
    parsed = kineto.parse_document(doc, "nccl_parser_config_1rank", TRACE.name)
    rows = parsed.tables["collective_records"]
    assert rows.height == len(kernels) == 21
    for row in rows.to_dicts():
        e = kernels[round(row["start_us"], 3)]
        assert row["exec_us"] == pytest.approx(e["dur"], abs=1e-9)
        if row["msg_bytes"]:
            assert row["algbw_gbs"] == pytest.approx(row["msg_bytes"] / e["dur"] / 1e3)
    # a 30.975 µs broadcast: rounded inward it would read 30 µs and overstate bandwidth by 3.25 %
    bcast = rows.filter(pl.col("exec_us") == 30.975).row(0, named=True)
    assert bcast["op"] == "Broadcast"
    events = parsed.tables["kernel_events"]
    kept = events.filter(pl.col("ts_us") == 4458676423386)
    assert kept["dur_us"].to_list() == [30]  # HTA's rounding, unchanged
