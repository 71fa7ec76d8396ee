"""`ioe ingest` reads OTLP/JSON span files: the OpenTelemetry Collector's file exporter writes one
ExportTraceServiceRequest per line; a single pretty-printed request is read whole. Spans come from
the real OpenTelemetry SDK (tests/otlp_engine_spans.py) and a stored vLLM-shaped request."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from otlp_engine_spans import to_otlp_json, trtllm_spans, vllm_spans

from collector.ingest import ingest_paths
from collector.store import Store
from tests.conftest import DATA


def _ingest(tmp_path: Path, *paths: Path) -> tuple[list[tuple], list[str]]:
    st = Store(str(tmp_path / "s.duckdb"))
    try:
        report = ingest_paths(st, list(paths))
        with st.cursor() as con:
            rows = con.execute(
                "SELECT engine, ttft_s, kv_transfer_s FROM request_spans ORDER BY engine, ttft_s"
            ).fetchall()
        return rows, [str(p) for p in report.problems]
    finally:
        st.close()


@pytest.mark.parametrize("gz", [False, True])
def test_collector_file_exporter_lines_with_a_bad_line_between(tmp_path: Path, gz: bool) -> None:
    lines = [
        json.dumps(to_otlp_json(vllm_spans(3))),
        '{"resourceSpans": [oops',
        json.dumps(to_otlp_json(trtllm_spans(2))),
    ]
    body = ("\n".join(lines) + "\n").encode()
    path = tmp_path / ("traces.jsonl.gz" if gz else "traces.jsonl")
    path.write_bytes(gzip.compress(body) if gz else body)
    rows, problems = _ingest(tmp_path, path)
    assert [r[0] for r in rows] == ["trtllm", "trtllm", "vllm", "vllm", "vllm"]
    assert all(r[2] is not None for r in rows if r[0] == "trtllm")  # the KV-transfer time is read
    assert len(problems) == 1 and f"{path}:2" in problems[0] and "not JSON" in problems[0]


def test_one_pretty_printed_request_is_read_whole(tmp_path: Path) -> None:
    rows, problems = _ingest(tmp_path, DATA / "otlp_json" / "vllm_two_requests_one_bad_id.json")
    assert [r[0] for r in rows] == ["vllm", "vllm"]  # the third span's trace id is refused
    assert len(problems) == 1 and "vllm_two_requests_one_bad_id.json" in problems[0]
