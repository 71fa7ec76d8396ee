"""OTLP/HTTP trace receiver: ``POST /v1/traces`` → ``request_spans`` rows through the sink.

Rules (OTLP specification, REFERENCE §2 "OTLP/HTTP receiver rules"):
  1. Auth first (:mod:`api.auth`): 401 without the configured bearer token.
  2. ``Content-Type`` ``application/x-protobuf`` (or ``application/protobuf``) or
     ``application/json``; anything else → 415. Replies use the request's content type
     (JSON when it was unsupported).
  3. ``Content-Encoding`` ``gzip`` or ``identity``/none; another coding → 415.
  4. The body, after decompression, may be at most ``settings.otlp.max_body_bytes``; past it
     → 413. Decompression streams with a bounded output, so a gzip bomb costs at most the cap.
  5. A body that is not a request (bad protobuf, bad JSON, truncated or corrupt gzip) → 400.
  6. Success → 200 with an empty ``ExportTraceServiceResponse`` (also for an empty request).
  7. Some spans refused (see :mod:`collector.formats.otlp_spans`) → 200 with
     ``partial_success{rejected_spans, error_message}``; the good spans are kept and the
     refused ones are recorded in ``ingest_errors``.
  8. The sink raises :class:`~collector.sink.Overloaded`, or the store fails (an I/O error, a full
     disk, an invalidated database: :mod:`api.faults`) → 503 with ``Retry-After``, so the
     exporter retries; rows are de-duplicated on (trace_id, span_id) when it does.
  9. Error bodies are ``google.rpc.Status`` in the reply content type.
 10. At most ``app.state.otlp_in_flight.cap`` exports are read and stored at once; past it the
     answer is 503 with ``Retry-After`` at once, before the body is read. Every request refused
     by rules 8 and 10 is counted in ``ioe_api_shed_requests_total{route="otlp"}``.
 11. A JSON body nesting too deeply to parse is bad data: 400, never 500.
"""

from __future__ import annotations

import functools
import logging
import zlib
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Request, Response
from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from api.auth import token_problem
from collector.errors import ParseError, first_line
from collector.formats.otlp_spans import SpanRows, decode_json, decode_protobuf, request_rows
from collector.sink import Overloaded, Sink
from collector.sources.otlp_grpc import write_rows

log = logging.getLogger(__name__)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_MEDIA = {PROTOBUF: PROTOBUF, "application/protobuf": PROTOBUF, JSON: JSON}
RETRY_AFTER_S = 1
_GZIP_WBITS = 16 + zlib.MAX_WBITS


class BodyError(Exception):
    """The body cannot be read: ``status`` is the HTTP answer, the message says why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


router = APIRouter(tags=["otlp"])

_STATUS_DOC = "A `google.rpc.Status` in the request's content type."
_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "ExportTraceServiceResponse; `partialSuccess` when some spans were refused."},
    400: {"description": f"Not an ExportTraceServiceRequest. {_STATUS_DOC}"},
    401: {"description": f"Missing or wrong bearer token. {_STATUS_DOC}"},
    413: {"description": f"Body larger than otlp.max_body_bytes after decompression. {_STATUS_DOC}"},
    415: {"description": "Content-Type or Content-Encoding not supported."},
    503: {"description": f"Overloaded or store unavailable: retry after `Retry-After` s. {_STATUS_DOC}"},
}
_BODY_DOC = {
    "requestBody": {
        "required": True,
        "content": {PROTOBUF: {"schema": {"type": "string", "format": "binary"}}, JSON: {"schema": {}}},
    }
}


@router.post(
    "/v1/traces",
    summary="OTLP/HTTP trace export",
    description="Receives engine request spans (vLLM, SGLang, TensorRT-LLM) as OTLP; see module docs.",
    responses=_RESPONSES,
    openapi_extra=_BODY_DOC,
    response_class=Response,
)
async def export_traces(request: Request) -> Response:
    media = _MEDIA.get(request.headers.get("content-type", "").split(";")[0].strip().lower())
    problem = token_problem(request)
    if problem is not None:
        headers = {"WWW-Authenticate": "Bearer"} if problem[0] == 401 else None
        code = code_pb2.UNAUTHENTICATED if problem[0] == 401 else code_pb2.UNAVAILABLE
        return status_response(problem[0], code, problem[1], media or JSON, headers)
    if media is None:
        got = request.headers.get("content-type", "")
        return status_response(415, code_pb2.INVALID_ARGUMENT, f"unsupported Content-Type {got!r}", JSON)
    state = request.app.state
    gate = state.otlp_in_flight
    if not gate.enter():  # rule 10
        state.shed.count("otlp", "overload")
        msg = f"more than {gate.cap} exports in flight, retry later"
        return status_response(503, code_pb2.UNAVAILABLE, msg, media, {"Retry-After": str(RETRY_AFTER_S)})
    try:
        try:
            body = await read_body(request, state.settings.otlp.max_body_bytes)
        except BodyError as exc:
            return status_response(exc.status, _code_for(exc.status), str(exc), media)
        work = functools.partial(ingest, state.sink, body, media, state)
        return await anyio.to_thread.run_sync(work, limiter=state.otlp_threads)
    finally:
        gate.leave()


def ingest(sink: Sink, body: bytes, media: str, state: Any = None) -> Response:
    """Decode, write and answer (rules 5–8, 11); runs in a worker thread. ``state`` (the app's)
    records store faults and counts refused exports."""
    try:
        if media == JSON:
            req, refused = decode_json(body)
        else:
            req, refused = decode_protobuf(body), []
    except ParseError as exc:
        return status_response(400, code_pb2.INVALID_ARGUMENT, str(exc), media)
    except RecursionError:
        return status_response(400, code_pb2.INVALID_ARGUMENT, "JSON body nests too deeply", media)
    rows = request_rows(req)
    rows.rejected[:0] = refused
    retry = {"Retry-After": str(RETRY_AFTER_S)}
    try:
        write_rows(sink, rows, source="otlp-http")
    except Overloaded as exc:
        _count(state, "overload")
        msg = f"store overloaded, retry later ({exc})"
        return status_response(503, code_pb2.UNAVAILABLE, msg, media, retry)
    except Exception as exc:
        if state is None or not state.faults.seen(exc):
            raise
        _count(state, "store_unavailable")
        msg = f"store unavailable, retry later ({first_line(exc)})"
        return status_response(503, code_pb2.UNAVAILABLE, msg, media, retry)
    return message_response(200, export_response(rows), media)


def _count(state: Any, reason: str) -> None:
    if state is not None:
        state.shed.count("otlp", reason)


def export_response(rows: SpanRows) -> ExportTraceServiceResponse:
    """Empty on full success; ``partial_success`` when spans were refused."""
    resp = ExportTraceServiceResponse()
    if rows.rejected:
        resp.partial_success.rejected_spans = len(rows.rejected)
        resp.partial_success.error_message = rows.error_message()
    return resp


async def read_body(request: Request, cap: int) -> bytes:
    """The body, gunzipped when ``Content-Encoding: gzip``, never more than ``cap`` bytes."""
    coding = request.headers.get("content-encoding", "identity").strip().lower()
    if coding not in ("", "identity", "gzip"):
        raise BodyError(415, f"unsupported Content-Encoding {coding!r} (use gzip or none)")
    inflater = zlib.decompressobj(_GZIP_WBITS) if coding == "gzip" else None
    out = bytearray()
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > cap:
            raise BodyError(413, f"body exceeds {cap} bytes")
        out += _inflate(inflater, chunk, cap - len(out)) if inflater else chunk
        if len(out) > cap:
            raise BodyError(413, f"body exceeds {cap} bytes after decompression")  # gzip only
    if inflater is not None and received and not inflater.eof:
        raise BodyError(400, f"gzip stream truncated after {received} bytes")
    if inflater is not None and inflater.unused_data:
        raise BodyError(400, "data after the end of the gzip stream")
    return bytes(out)


def _inflate(inflater: Any, chunk: bytes, room: int) -> bytes:
    """At most ``room + 1`` bytes of output (the rest stays unread): one past the cap refuses."""
    try:
        data: bytes = inflater.decompress(chunk, room + 1)
    except zlib.error as exc:
        raise BodyError(400, f"corrupt gzip body ({exc})") from exc
    return data


def _code_for(status: int) -> int:
    return {413: code_pb2.RESOURCE_EXHAUSTED, 415: code_pb2.INVALID_ARGUMENT}.get(
        status, code_pb2.INVALID_ARGUMENT
    )


def status_response(
    http_status: int, code: int, message: str, media: str, headers: dict[str, str] | None = None
) -> Response:
    """A ``google.rpc.Status`` error body (rule 9)."""
    return message_response(http_status, status_pb2.Status(code=code, message=message), media, headers)


def message_response(
    http_status: int, message: Message, media: str, headers: dict[str, str] | None = None
) -> Response:
    if media == JSON:
        content = json_format.MessageToJson(message, indent=None).encode()
    else:
        content = message.SerializeToString()
    return Response(content=content, status_code=http_status, media_type=media, headers=headers)
