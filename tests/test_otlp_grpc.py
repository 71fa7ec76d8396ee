"""OTLP/gRPC receiver on 127.0.0.1 with the real SDK gRPC exporter and a raw grpcio channel."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace.export import SpanExportResult
from otlp_engine_spans import sglang_spans, to_protobuf, trtllm_spans, vllm_spans

from collector.formats.otlp_spans import decode_protobuf
from collector.sink import Overloaded
from collector.sources.otlp_grpc import SERVICE, GrpcReceiver, start_grpc_receiver
from collector.store import Store

EXPORT = f"/{SERVICE}/Export"


class FullSink:
    def write(self, table: str, batch: object) -> int:
        raise Overloaded("queue full")


@pytest.fixture
def store() -> Iterator[Store]:
    s = Store(":memory:")
    yield s
    s.close()


@pytest.fixture
def receiver(store: Store) -> Iterator[GrpcReceiver]:
    handle = start_grpc_receiver(store, port=0, max_message_bytes=512 * 1024)
    yield handle
    handle.stop(0)


def _call(port: int, body: bytes) -> ExportTraceServiceResponse:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        export = channel.unary_unary(EXPORT, response_deserializer=ExportTraceServiceResponse.FromString)
        return export(body, timeout=5)  # type: ignore[no-any-return]


def test_sdk_grpc_exporter_gzip_all_engines_and_retries_stored_once(
    receiver: GrpcReceiver, store: Store
) -> None:
    exporter = OTLPSpanExporter(
        endpoint=f"127.0.0.1:{receiver.port}", insecure=True, compression=grpc.Compression.Gzip, timeout=5
    )
    spans = vllm_spans(4) + sglang_spans(2) + trtllm_spans(2)
    assert exporter.export(spans) == SpanExportResult.SUCCESS
    assert exporter.export(spans) == SpanExportResult.SUCCESS  # a retry: same ids
    assert store.count("request_spans") == 8
    with store.cursor() as cur:
        got = dict(
            cur.execute("SELECT request_id, ttft_s FROM request_spans WHERE engine = 'vllm'").fetchall()
        )
        kv = cur.execute("SELECT kv_transfer_s FROM request_spans WHERE request_id = 'trt-1'").fetchone()
        sg = cur.execute(
            "SELECT decode_s, cached_tokens FROM request_spans WHERE engine = 'sglang'"
        ).fetchall()
    assert got == pytest.approx({"cmpl-0": 0.050, "cmpl-1": 0.051, "cmpl-2": 0.052, "cmpl-3": 0.053})
    assert kv == pytest.approx((0.015,))
    assert [(pytest.approx(d), c) for d, c in sg] == [(0.2, 512), (0.2, 512)]
    exporter.shutdown()


def test_partial_success_keeps_good_spans(receiver: GrpcReceiver, store: Store) -> None:
    req = decode_protobuf(to_protobuf(vllm_spans(3)))
    req.resource_spans[0].scope_spans[0].spans[2].span_id = b"\x01\x02\x03"
    resp = _call(receiver.port, req.SerializeToString())
    assert resp.partial_success.rejected_spans == 1
    assert "span id '010203' is not 8 non-zero bytes" in resp.partial_success.error_message
    assert store.count("request_spans") == 2
    assert store.count("ingest_errors") == 1


def test_empty_request_is_ok(receiver: GrpcReceiver, store: Store) -> None:
    assert _call(receiver.port, b"") == ExportTraceServiceResponse()
    assert store.count("request_spans") == 0


@pytest.mark.parametrize(
    ("body", "code", "needle"),
    [
        (
            b"\x0a\xff\xff\xff\x0f",
            grpc.StatusCode.INVALID_ARGUMENT,
            "not a protobuf ExportTraceServiceRequest",
        ),
        (to_protobuf(vllm_spans(3))[:-9], grpc.StatusCode.INVALID_ARGUMENT, "not a protobuf"),
        (b"\x0a" + b"\xff" * 600_000, grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max"),
    ],
)
def test_bad_messages_get_grpc_errors(
    receiver: GrpcReceiver, store: Store, body: bytes, code: grpc.StatusCode, needle: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        _call(receiver.port, body)
    assert info.value.code() == code  # type: ignore[attr-defined]
    assert needle in info.value.details()  # type: ignore[attr-defined]
    assert store.count("request_spans") == 0


def test_overloaded_sink_answers_unavailable() -> None:
    handle = start_grpc_receiver(FullSink(), port=0, max_message_bytes=1 << 20)
    try:
        with pytest.raises(grpc.RpcError) as info:
            _call(handle.port, to_protobuf(vllm_spans(2)))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
        assert "queue full" in info.value.details()  # type: ignore[attr-defined]
    finally:
        handle.stop(0)


class SlowSink:
    """A sink whose writes wait until released: exports pile up in flight."""

    def __init__(self) -> None:
        import threading

        self.go = threading.Event()
        self.rows = 0

    def write(self, table: str, batch: object) -> int:
        self.go.wait(10)
        n = len(batch)  # type: ignore[arg-type]
        self.rows += n
        return n


def test_exports_past_the_in_flight_cap_answer_unavailable_and_are_counted() -> None:
    """Rule 7: 2 exports may be in flight; 6 more at once are refused with UNAVAILABLE (which
    OTLP exporters retry) and counted, and the 2 in flight are stored once released."""
    from concurrent.futures import ThreadPoolExecutor

    sink, shed = SlowSink(), []
    handle = start_grpc_receiver(sink, port=0, max_in_flight=2, on_shed=lambda: shed.append(1))  # type: ignore[arg-type]
    body = to_protobuf(vllm_spans(3))

    def call() -> str:
        try:
            _call(handle.port, body)
            return "OK"
        except grpc.RpcError as exc:
            return exc.code().name  # type: ignore[attr-defined, no-any-return]

    try:
        with ThreadPoolExecutor(8) as pool:
            got = [pool.submit(call) for _ in range(8)]
            deadline = 50
            while len(shed) < 6 and deadline:
                import time

                time.sleep(0.1)
                deadline -= 1
            sink.go.set()
            codes = sorted(f.result(timeout=20) for f in got)
    finally:
        handle.stop(0)
    assert codes == ["OK", "OK"] + ["UNAVAILABLE"] * 6
    assert len(shed) == 6 and sink.rows == 2 * 3


def test_port_in_use_is_a_clear_error(receiver: GrpcReceiver, store: Store) -> None:
    with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{receiver.port}"):
        start_grpc_receiver(store, port=receiver.port)
