"""OTLP/HTTP receiver through a real uvicorn server on 127.0.0.1 and the real SDK exporter.

The SDK's ``force_flush()`` reports success even when nothing arrived, so every test reads
the store (or the HTTP answer) instead of trusting the exporter.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import uvicorn
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace.export import SpanExportResult
from otlp_engine_spans import sglang_spans, to_otlp_json, to_protobuf, trtllm_spans, vllm_spans

from api.app import create_app
from collector.sink import Overloaded
from collector.store import Store
from ioe.settings import OtlpSettings, Settings
from tests.conftest import free_port

PB = {"Content-Type": "application/x-protobuf"}
CAP = 256 * 1024


@dataclass
class Server:
    url: str
    store: Store


class FullSink:
    def write(self, table: str, batch: object) -> int:
        raise Overloaded("queue full (256 batches)")


def _serve(settings: Settings, store: Store, sink: object = None) -> Iterator[Server]:
    port = free_port()
    app = create_app(settings, store, sink)  # type: ignore[arg-type]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield Server(f"http://127.0.0.1:{port}", store)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def server() -> Iterator[Server]:
    store = Store(":memory:")
    yield from _serve(Settings(store_path=":memory:", otlp=OtlpSettings(max_body_bytes=CAP)), store)
    store.close()


def _rows(store: Store, where: str = "true") -> dict[str, dict]:
    with store.cursor() as cur:
        rel = cur.execute(f"SELECT * FROM request_spans WHERE {where}")
        cols = [d[0] for d in rel.description]
        return {r[cols.index("request_id")]: dict(zip(cols, r, strict=True)) for r in rel.fetchall()}


def _exporter(url: str, **kw: object) -> OTLPSpanExporter:
    return OTLPSpanExporter(endpoint=f"{url}/v1/traces", timeout=5, **kw)  # type: ignore[call-overload]


def test_sdk_exporter_gzip_protobuf_all_engines(server: Server) -> None:
    exporter = _exporter(server.url, compression=Compression.Gzip)
    spans = vllm_spans(5) + sglang_spans(3) + trtllm_spans(2)
    assert exporter.export(spans) == SpanExportResult.SUCCESS
    rows = _rows(server.store)
    assert len(rows) == 10  # 5 + 3 roots + 2: SGLang's 15 other spans are folded or ignored
    assert rows["cmpl-4"]["ttft_s"] == pytest.approx(0.054)
    assert rows["cmpl-4"]["input_tokens"] == 104 and rows["cmpl-4"]["engine"] == "vllm"
    assert rows["00000002deadbeef"]["prefill_s"] == pytest.approx(0.030)
    assert rows["00000002deadbeef"]["cached_tokens"] == 512
    assert rows["trt-1"]["kv_transfer_s"] == pytest.approx(0.015)
    exporter.shutdown()


def test_duplicate_sends_are_stored_once(server: Server) -> None:
    exporter = _exporter(server.url)
    spans = vllm_spans(4)
    assert exporter.export(spans) == SpanExportResult.SUCCESS
    assert exporter.export(spans) == SpanExportResult.SUCCESS  # a retry after a lost answer
    assert exporter.export(vllm_spans(4)) == SpanExportResult.SUCCESS  # same seeded ids again
    assert server.store.count("request_spans") == 4
    exporter.shutdown()


def test_json_body_and_json_reply(server: Server) -> None:
    body = json.dumps(to_otlp_json(trtllm_spans(2)))
    r = httpx.post(f"{server.url}/v1/traces", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == {}
    assert _rows(server.store)["trt-0"]["kv_transfer_s"] == pytest.approx(0.012)


def test_json_gzip_partial_success(server: Server) -> None:
    doc = to_otlp_json(vllm_spans(3))
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][1]["spanId"] = "zz"  # type: ignore[index]
    body = gzip.compress(json.dumps(doc).encode())
    headers = {"Content-Type": "application/json; charset=utf-8", "Content-Encoding": "gzip"}
    r = httpx.post(f"{server.url}/v1/traces", content=body, headers=headers)
    assert r.status_code == 200
    assert r.json()["partialSuccess"]["rejectedSpans"] == "1"
    assert "spanId 'zz' is not 16 hex digits" in r.json()["partialSuccess"]["errorMessage"]
    assert sorted(_rows(server.store)) == ["cmpl-0", "cmpl-2"]
    with server.store.cursor() as cur:
        got = cur.execute("SELECT source, location FROM ingest_errors").fetchall()
    assert got == [("otlp-http", "resource_spans[0].scope_spans[0].spans[1]")]


def test_protobuf_partial_success_reply_is_protobuf(server: Server) -> None:
    from collector.formats.otlp_spans import decode_protobuf

    req = decode_protobuf(to_protobuf(vllm_spans(3)))
    req.resource_spans[0].scope_spans[0].spans[0].trace_id = b"\x00" * 16
    r = httpx.post(f"{server.url}/v1/traces", content=req.SerializeToString(), headers=PB)
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-protobuf"
    resp = ExportTraceServiceResponse.FromString(r.content)
    assert resp.partial_success.rejected_spans == 1
    assert "is not 16 non-zero bytes" in resp.partial_success.error_message
    assert server.store.count("request_spans") == 2


def test_empty_request_is_200_with_empty_response(server: Server) -> None:
    r = httpx.post(f"{server.url}/v1/traces", content=b"", headers=PB)
    assert r.status_code == 200 and r.content == b""  # empty ExportTraceServiceResponse
    r = httpx.post(f"{server.url}/v1/traces", content=b"{}", headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and r.json() == {}


def _status(r: httpx.Response) -> status_pb2.Status:
    if r.headers["content-type"].startswith("application/json"):
        return json_format.Parse(r.text, status_pb2.Status())
    return status_pb2.Status.FromString(r.content)


@pytest.mark.parametrize(
    ("body", "headers", "code", "needle"),
    [
        (b"\x0a\xff\xff\xff\x0f", PB, 400, "not a protobuf ExportTraceServiceRequest"),
        (to_protobuf(vllm_spans(3))[:-9], PB, 400, "not a protobuf"),
        (
            gzip.compress(to_protobuf(vllm_spans(3)))[:-12],
            {**PB, "Content-Encoding": "gzip"},
            400,
            "truncated",
        ),
        (b"not gzip at all", {**PB, "Content-Encoding": "gzip"}, 400, "corrupt gzip"),
        (b'{"resourceSpans": 7', {"Content-Type": "application/json"}, 400, "not JSON"),
        (b"x" * (CAP + 1), PB, 413, f"exceeds {CAP} bytes"),
        (gzip.compress(b"\x00" * (CAP + 1)), {**PB, "Content-Encoding": "gzip"}, 413, "after decompression"),
        (b"abc", {"Content-Type": "text/plain"}, 415, "unsupported Content-Type 'text/plain'"),
        (b"abc", {**PB, "Content-Encoding": "br"}, 415, "unsupported Content-Encoding 'br'"),
    ],
)
def test_bad_requests_get_status_bodies(
    server: Server, body: bytes, headers: dict, code: int, needle: str
) -> None:
    r = httpx.post(f"{server.url}/v1/traces", content=body, headers=headers)
    assert r.status_code == code
    assert needle in _status(r).message
    assert server.store.count("request_spans") == 0


def test_gzip_bomb_is_refused_without_inflating_it(server: Server) -> None:
    bomb = gzip.compress(b"\x00" * (64 * 1024 * 1024), compresslevel=9)  # 64 MiB → ~64 KiB
    assert len(bomb) < CAP
    r = httpx.post(f"{server.url}/v1/traces", content=bomb, headers={**PB, "Content-Encoding": "gzip"})
    assert r.status_code == 413 and "after decompression" in _status(r).message


def test_overloaded_sink_answers_503_with_retry_after() -> None:
    store = Store(":memory:")
    for srv in _serve(Settings(store_path=":memory:"), store, FullSink()):
        r = httpx.post(f"{srv.url}/v1/traces", content=to_protobuf(vllm_spans(2)), headers=PB)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        status = _status(r)
        assert status.code == 14 and "queue full" in status.message  # UNAVAILABLE
    store.close()


def test_bearer_token_is_required_when_configured() -> None:
    store = Store(":memory:")
    for srv in _serve(Settings(store_path=":memory:", auth_token="s3cret"), store):
        url = f"{srv.url}/v1/traces"
        body = to_protobuf(vllm_spans(2))
        r = httpx.post(url, content=body, headers=PB)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert _status(r).code == 16  # UNAUTHENTICATED
        r = httpx.post(url, content=body, headers={**PB, "Authorization": "Bearer wrong"})
        assert r.status_code == 401 and "wrong bearer token" in _status(r).message
        assert store.count("request_spans") == 0
        exporter = _exporter(srv.url, headers={"Authorization": "Bearer s3cret"})
        assert exporter.export(vllm_spans(2)) == SpanExportResult.SUCCESS
        assert store.count("request_spans") == 2
        exporter.shutdown()
    store.close()


def test_route_is_documented_in_openapi(server: Server) -> None:
    spec = httpx.get(f"{server.url}/openapi.json").json()
    op = spec["paths"]["/v1/traces"]["post"]
    assert {"200", "400", "401", "413", "415", "503"} <= set(op["responses"])
    assert set(op["requestBody"]["content"]) == {"application/x-protobuf", "application/json"}
