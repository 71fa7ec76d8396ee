"""OTLP/gRPC trace receiver (the engines' default, :4317) writing ``request_spans`` rows.

Same mapping as OTLP/HTTP (:mod:`collector.formats.otlp_spans`). Rules:
  1. The service is opentelemetry-proto's ``TraceService``; the request arrives as raw bytes
     and is decoded here, so a body that is not an ``ExportTraceServiceRequest`` answers
     ``INVALID_ARGUMENT`` (grpcio's own deserializer would answer ``INTERNAL``).
  2. Messages larger than ``max_message_bytes`` are refused by grpcio with
     ``RESOURCE_EXHAUSTED``; gzip-compressed calls are decompressed by grpcio.
  3. Some spans refused → OK with ``partial_success{rejected_spans, error_message}``; the
     refused ones are recorded in ``ingest_errors``.
  4. The sink raises :class:`~collector.sink.Overloaded` → ``UNAVAILABLE`` (retryable per
     the OTLP specification); rows are de-duplicated on (trace_id, span_id) when retried.
  5. The server listens on ``host`` only (loopback by default); ``port=0`` picks a free port,
     reported by ``handle.port``.
  7. At most ``max_in_flight`` exports are decoded and written at once; one more answers
     ``UNAVAILABLE`` at once (retryable; nothing of it was acknowledged) and is counted through
     ``on_shed``, so a flood queues in the exporters, not in this process. grpcio's own cap
     (``maximum_concurrent_rpcs``, 4 × that) bounds the calls waiting for a thread.
  6. With a token configured (``token()`` not empty) a call needs ``authorization: Bearer
     <token>`` metadata, compared in constant time: none or a wrong one answers
     ``UNAUTHENTICATED`` and nothing is stored; a token file that cannot be read answers
     ``UNAVAILABLE`` (closed, never open). The same rule as the HTTP routes (``api.auth``).
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceServicer

from collector.errors import ParseError
from collector.formats.otlp_spans import SpanRows, decode_protobuf, problems_frame, request_rows
from collector.records import INGEST_ERRORS, REQUEST_SPANS
from collector.sink import Overloaded, Sink

log = logging.getLogger(__name__)

SERVICE = trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"].full_name


class SpanReceiver(TraceServiceServicer):
    """``TraceService.Export`` over a :class:`~collector.sink.Sink` (rules 1, 3, 4, 6, 7)."""

    def __init__(
        self,
        sink: Sink,
        token: Callable[[], str] | None = None,
        max_in_flight: int = 16,
        on_shed: Callable[[], None] | None = None,
    ):
        self.sink = sink
        self.token = token
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self.on_shed = on_shed

    def _authorize(self, context: grpc.ServicerContext) -> None:
        """Rule 6."""
        if self.token is None:
            return
        try:
            expected = self.token()
        except OSError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"server token file cannot be read ({exc.strerror})")
        if not expected:
            return
        sent = dict(context.invocation_metadata() or ()).get("authorization", "")
        scheme, _, given = str(sent).partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing bearer token (authorization metadata)")
        if not hmac.compare_digest(given.strip().encode(), expected.encode()):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "wrong bearer token")

    def Export(self, request: Any, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        self._authorize(context)
        if not self._slots.acquire(blocking=False):  # rule 7
            if self.on_shed is not None:
                self.on_shed()
            context.abort(grpc.StatusCode.UNAVAILABLE, "receiver at its export cap, retry later")
        try:
            return self._export(request, context)
        finally:
            self._slots.release()

    def _export(self, request: Any, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        try:
            req = decode_protobuf(request) if isinstance(request, bytes) else request
        except ParseError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        rows = request_rows(req)
        try:
            write_rows(self.sink, rows, source="otlp-grpc")
        except Overloaded as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"store overloaded, retry later ({exc})")
        resp = ExportTraceServiceResponse()
        if rows.rejected:
            resp.partial_success.rejected_spans = len(rows.rejected)
            resp.partial_success.error_message = rows.error_message()
        return resp


def write_rows(sink: Sink, rows: SpanRows, *, source: str) -> None:
    """Write the request rows (may raise ``Overloaded``), then record the refused spans.

    Shared by the HTTP and gRPC receivers. Refused spans go to ``ingest_errors``; when the sink
    is overloaded at that point only this record is lost (logged), never the accepted rows.
    """
    if rows.frame.height:
        sink.write(REQUEST_SPANS.name, rows.frame)
    if not rows.rejected:
        return
    try:
        sink.write(INGEST_ERRORS.name, problems_frame(rows.rejected, source=source, ts_ns=time.time_ns()))
    except Overloaded:
        log.info("%s: %d refused spans not recorded (sink overloaded)", source, len(rows.rejected))


@dataclass
class GrpcReceiver:
    """A running receiver: its bound ``port``; :meth:`stop` ends it."""

    server: grpc.Server
    port: int

    def stop(self, grace_s: float = 2.0) -> None:
        self.server.stop(grace_s).wait()


def start_grpc_receiver(
    sink: Sink,
    *,
    host: str = "127.0.0.1",
    port: int,
    max_message_bytes: int = 64 * 1024 * 1024,
    workers: int = 4,
    token: Callable[[], str] | None = None,
    max_in_flight: int = 16,
    on_shed: Callable[[], None] | None = None,
) -> GrpcReceiver:
    """Start the OTLP/gRPC receiver (rules 2, 5, 7); raises ``RuntimeError`` if it cannot bind.

    ``workers`` threads serve calls; at most ``max_in_flight`` of them decode and write at once."""
    server = grpc.server(
        futures.ThreadPoolExecutor(
            max_workers=max(workers, max_in_flight + 4), thread_name_prefix="otlp-grpc"
        ),
        maximum_concurrent_rpcs=4 * max(workers, max_in_flight + 4),
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0),
        ],
    )
    servicer = SpanReceiver(sink, token, max_in_flight, on_shed)
    handler = grpc.unary_unary_rpc_method_handler(
        servicer.Export,
        request_deserializer=None,  # raw bytes: decoded by the servicer (rule 1)
        response_serializer=ExportTraceServiceResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),))
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as exc:
        raise RuntimeError(f"OTLP/gRPC receiver cannot listen on {host}:{port} ({exc})") from exc
    if bound == 0:
        raise RuntimeError(f"OTLP/gRPC receiver cannot listen on {host}:{port}")
    server.start()
    log.info("OTLP/gRPC receiver on %s:%d", host, bound)
    return GrpcReceiver(server=server, port=bound)
