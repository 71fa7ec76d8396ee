"""OTLP trace export requests → ``request_spans`` rows, one per serving request.

Input: an ``ExportTraceServiceRequest`` as protobuf bytes (:func:`decode_protobuf`) or as
OTLP/JSON text (:func:`decode_json`); output of :func:`request_rows`: a ``request_spans``
frame plus the spans refused, each as a :class:`~collector.errors.Problem`.

Files (``ioe ingest``): OTLP/JSON lines, one ``ExportTraceServiceRequest`` object per line, as
the OpenTelemetry Collector's ``file`` exporter writes them (``*.json``/``*.jsonl``, gzip or
not; a file holding one pretty-printed request is read whole). A line that is not a request is
refused as a Problem naming the file and line; the other lines' spans are kept.

OTLP/JSON differs from the proto3 JSON mapping in one way that matters: trace and span ids
are **hex** strings, not base64. :func:`decode_json` rewrites them to bytes before handing the
document to ``google.protobuf.json_format`` (which accepts camelCase and snake_case names and
integer enums, and is told to ignore unknown fields).

Which spans are requests (:func:`is_request_span`):
  1. ``name == "llm_request"`` (vLLM; TensorRT-LLM reuses vLLM's span).
  2. ``name`` shaped ``"{role} Req {rid}"`` (SGLang's root span; the role may be empty).
  3. any other span with a ``gen_ai.latency.*`` or ``gen_ai.usage.*`` attribute.

Spans that are not requests (SGLang's "Bootstrap Room" span, thread spans, stage slices):
  4. one whose parent chain (followed within the same export request, at most 8 hops)
     reaches a request span is *folded* into it: its duration is added to
     ``stages[name]`` in the request's ``attributes`` JSON, and stage names containing
     ``queue`` / ``prefill`` / ``decode`` fill ``queue_s`` / ``prefill_s`` / ``decode_s`` when
     the request span has no such attribute. Thread container spans (with a ``thread_label``
     attribute) are not stages; their ``dp_rank`` fills a missing one.
  5. every other one is ignored (counted, not stored, not rejected). Known limit: a stage
     whose request span arrives in a *different* export request is ignored too.

Which spans are refused (rejected, reported in ``partial_success``; the rest are kept):
  6. trace id not 16 bytes or all zero; span id not 8 bytes or all zero; parent span id
     neither empty nor 8 bytes; in OTLP/JSON, an id that is not hex of that length.
  7. end time before start time, or no start time.
  8. on a request span, a mapped latency that is not a finite number ≥ 0, or a mapped token
     count that is not an integer ≥ 0 (the value is quoted).

Columns (see :data:`collector.records.REQUEST_SPANS`):
  9. latencies are seconds from ``gen_ai.latency.*``; ``e2e_s`` falls back to the span's
     duration; ``kv_transfer_s`` falls back to the time between the span events
     ``kv_cache_transfer_start`` and ``kv_cache_transfer_end``.
  10. ``input_tokens`` from ``gen_ai.usage.prompt_tokens`` or ``input_tokens`` (both
      spellings), ``output_tokens`` from ``completion_tokens`` or ``output_tokens``.
  11. ``model``: ``gen_ai.response.model``, else ``gen_ai.request.model``;
      ``request_id``: ``gen_ai.request.id``, else ``rid``, else the SGLang name's rid;
      ``finish_reason``: ``gen_ai.response.finish_reasons`` joined with ``,``.
  12. ``engine``: the first of service.name, then scope name, containing ``vllm``,
      ``sglang``, ``trt``/``tensorrt`` (→ ``trtllm``) or ``dynamo``; else by shape: a
      KV-transfer attribute or event → ``trtllm``, SGLang name → ``sglang``,
      ``llm_request`` → ``vllm``; else ``''``.
  13. ``dp_rank``: an integer attribute named ``dp_rank`` or ``*.dp_rank``, span first, then
      resource; else -1.
  14. ``attributes``: JSON of the span's unmapped attributes, the resource's (prefixed
      ``resource.``, without ``service.name`` and ``telemetry.*``) and ``stages``; compact,
      keys sorted, UTF-8; a NaN or infinite unmapped value is written as ``null`` (JSON has
      no such numbers).
  15. a (trace_id, span_id) repeated within one request is stored once (first wins); the
      store ignores ones it already has, so exporter retries never double-count.
"""

from __future__ import annotations

import binascii
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import polars as pl
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from collector.errors import ParseError, Problem, quote
from collector.files import LineChunks, read_capped
from collector.formats import FileFormat, IngestContext, Parsed, gather_parts
from collector.records import INGEST_ERRORS, REQUEST_SPANS, frame

SOURCE = "otlp"
_SGLANG_ROOT = re.compile(r"^(?P<role>\S*) Req (?P<rid>\S+)$")
_MAX_HOPS = 8

LATENCY_ATTRS: dict[str, str] = {
    "gen_ai.latency.time_to_first_token": "ttft_s",
    "gen_ai.latency.e2e": "e2e_s",
    "gen_ai.latency.time_in_queue": "queue_s",
    "gen_ai.latency.time_in_model_prefill": "prefill_s",
    "gen_ai.latency.time_in_model_decode": "decode_s",
    "gen_ai.latency.time_in_model_inference": "inference_s",
    "gen_ai.latency.kv_cache_transfer_time": "kv_transfer_s",
}
TOKEN_ATTRS: dict[str, str] = {
    "gen_ai.usage.prompt_tokens": "input_tokens",
    "gen_ai.usage.input_tokens": "input_tokens",
    "gen_ai.usage.completion_tokens": "output_tokens",
    "gen_ai.usage.output_tokens": "output_tokens",
    "gen_ai.usage.cached_tokens": "cached_tokens",
}
TEXT_ATTRS: dict[str, tuple[str, ...]] = {  # column -> attribute names, most preferred first
    "model": ("gen_ai.response.model", "gen_ai.request.model"),
    "request_id": ("gen_ai.request.id", "rid"),
    "finish_reason": ("gen_ai.response.finish_reasons", "gen_ai.response.finish_reason"),
}
# attribute name -> (kind, column, preference): one lookup per attribute on the hot path.
_MAPPED: dict[str, tuple[str, str, int]] = {
    **{k: ("s", c, 0) for k, c in LATENCY_ATTRS.items()},
    **{k: ("n", c, 0) for k, c in TOKEN_ATTRS.items()},
    **{k: ("t", c, rank) for c, keys in TEXT_ATTRS.items() for rank, k in enumerate(keys)},
}
_SCALARS = frozenset({"string_value", "int_value", "double_value", "bool_value"})
_EXPECTED: dict[str, str] = {  # attribute name -> the AnyValue member it normally uses
    **{k: "double_value" for k in LATENCY_ATTRS},
    **{k: "int_value" for k in TOKEN_ATTRS},
    **{k: "string_value" for keys in TEXT_ATTRS.values() for k in keys},
}
_ENGINE_WORDS = (
    ("vllm", "vllm"),
    ("sglang", "sglang"),
    ("tensorrt", "trtllm"),
    ("trt", "trtllm"),
    ("dynamo", "dynamo"),
)
_STAGE_PHASES = (("queue", "queue_s"), ("prefill", "prefill_s"), ("decode", "decode_s"))
_KV_EVENTS = ("kv_cache_transfer_start", "kv_cache_transfer_end")
_ID_FIELDS = (
    ("traceId", 16),
    ("trace_id", 16),
    ("spanId", 8),
    ("span_id", 8),
    ("parentSpanId", 8),
    ("parent_span_id", 8),
)
_Key = tuple[bytes, bytes]  # (trace_id, span_id)


class SpanInvalid(ValueError):
    """One span that cannot be stored; the message says why and quotes the value."""


@dataclass
class SpanRows:
    """:func:`request_rows`' answer: the rows, the refused spans, and what was not a request."""

    frame: pl.DataFrame
    rejected: list[Problem] = field(default_factory=list)
    folded: int = 0
    ignored: int = 0

    def error_message(self, limit: int = 5) -> str:
        """The ``partial_success.error_message``: the first ``limit`` problems, then a count."""
        shown = "; ".join(str(p) for p in self.rejected[:limit])
        more = len(self.rejected) - limit
        return shown + (f"; and {more} more" if more > 0 else "")


# -- decoding ---------------------------------------------------------------------------------
def decode_protobuf(body: bytes) -> ExportTraceServiceRequest:
    """Protobuf bytes → request; :class:`ParseError` if they are not one."""
    req = ExportTraceServiceRequest()
    try:
        req.ParseFromString(body)
    except DecodeError as exc:
        raise ParseError(
            f"not a protobuf ExportTraceServiceRequest ({exc})",
            source=SOURCE,
            location=f"body of {len(body)} bytes",
            snippet=body[:48],
        ) from exc
    return req


def decode_json(body: bytes | str) -> tuple[ExportTraceServiceRequest, list[Problem]]:
    """OTLP/JSON → request, plus the spans dropped for ids that are not hex (rule 6)."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ParseError(f"not JSON ({exc})", source=SOURCE, location="body", snippet=body[:80]) from exc
    if not isinstance(doc, dict):
        raise ParseError("top level must be an object", source=SOURCE, location="body", snippet=body[:80])
    problems = _hex_ids_to_base64(doc)
    req = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(doc, req, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise ParseError(
            f"not an OTLP/JSON ExportTraceServiceRequest ({exc})", source=SOURCE, location="body"
        ) from exc
    return req, problems


def _hex_ids_to_base64(doc: dict[str, Any]) -> list[Problem]:
    """Rewrite every span's and link's hex ids in place; drop spans with a non-hex id."""
    problems: list[Problem] = []
    for where, spans in _json_span_lists(doc):
        kept = []
        for i, span in enumerate(spans):
            bad = _rewrite_ids(span) if isinstance(span, dict) else None
            if bad:
                problems.append(Problem(f"{where}.spans[{i}]", bad))
            else:
                kept.append(span)
        spans[:] = kept
    return problems


def _json_span_lists(doc: dict[str, Any]) -> Iterator[tuple[str, list[Any]]]:
    """(location, spans list) for each well-shaped scope; odd shapes are left to ParseDict."""
    resources = _get(doc, "resourceSpans", "resource_spans")
    for ri, rs in enumerate(resources if isinstance(resources, list) else []):
        scopes = _get(rs, "scopeSpans", "scope_spans") if isinstance(rs, dict) else None
        for si, ss in enumerate(scopes if isinstance(scopes, list) else []):
            spans = ss.get("spans") if isinstance(ss, dict) else None
            if isinstance(spans, list):
                yield f"resource_spans[{ri}].scope_spans[{si}]", spans


def _rewrite_ids(span: dict[str, Any]) -> str | None:
    """Hex → base64 for the ids of ``span`` and its links; the first problem, if any."""
    links = span.get("links")
    targets = [("", span)] + [
        ("link ", x) for x in (links if isinstance(links, list) else []) if isinstance(x, dict)
    ]
    for prefix, obj in targets:
        for name, size in _ID_FIELDS:
            value = obj.get(name)
            if value is None or value == "":
                continue
            raw = _hex_bytes(value, size)
            if raw is None:
                return f"{prefix}{name} {quote(str(value), 60)} is not {2 * size} hex digits"
            obj[name] = binascii.b2a_base64(raw, newline=False).decode()
    return None


def _hex_bytes(value: Any, size: int) -> bytes | None:
    if not isinstance(value, str) or len(value) != 2 * size:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        return None


def _get(obj: dict[str, Any], camel: str, snake: str) -> Any:
    return obj.get(camel, obj.get(snake))


# -- attribute values -------------------------------------------------------------------------
def any_value(v: AnyValue) -> Any:
    """An OTLP ``AnyValue`` as plain Python (bytes as hex; unset as None)."""
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attributes(v.kvlist_value.values)
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attributes(kvs: Any) -> dict[str, Any]:
    """Repeated ``KeyValue`` → dict (a repeated key keeps its last value).

    A mapped attribute's value is first read as the type it should have (:data:`_EXPECTED`):
    a oneof member read as non-zero / non-empty is the member that is set, so that read is
    the value; otherwise (zero, unset, another type) the oneof is asked which member is set.
    Same result, without the costlier ``WhichOneof`` for the usual well-typed value.
    """
    out: dict[str, Any] = {}
    expected = _EXPECTED.get
    kv: KeyValue
    for kv in kvs:
        key, value = kv.key, kv.value
        member = expected(key)
        if member is not None and (got := getattr(value, member)):
            out[key] = got
            continue
        kind = value.WhichOneof("value")
        out[key] = getattr(value, kind) if kind in _SCALARS else any_value(value)
    return out


# -- classification ---------------------------------------------------------------------------
def is_request_span(name: str, attrs: dict[str, Any]) -> bool:
    """Rules 1–3 of the module docstring."""
    if name == "llm_request" or _SGLANG_ROOT.match(name):
        return True
    return any(k.startswith(("gen_ai.latency.", "gen_ai.usage.")) for k in attrs)


def engine_by_name(service: str, scope: str) -> str:
    """Rule 12, first half: the engine named by service.name, then by the scope name."""
    for text in (service.lower(), scope.lower()):
        for word, engine in _ENGINE_WORDS:
            if word in text:
                return engine
    return ""


def engine_by_shape(name: str, attrs: dict[str, Any], event_names: set[str]) -> str:
    """Rule 12, second half: the engine told by the span's shape."""
    if "gen_ai.latency.kv_cache_transfer_time" in attrs or event_names.intersection(_KV_EVENTS):
        return "trtllm"
    if _SGLANG_ROOT.match(name):
        return "sglang"
    return "vllm" if name == "llm_request" else ""


def dp_rank_of(*attr_maps: dict[str, Any]) -> int:
    """Rule 13: the first integer ``dp_rank`` / ``*.dp_rank`` attribute, else -1."""
    for attrs in attr_maps:
        for key, value in attrs.items():
            if _is_dp_rank(key, value):
                return int(value)
    return -1


def _is_dp_rank(key: str, value: Any) -> bool:
    return (key == "dp_rank" or key.endswith(".dp_rank")) and _is_int(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- validation -------------------------------------------------------------------------------
def check_span(span: Span) -> None:
    """Rules 6–7; raises :class:`SpanInvalid`."""
    if len(span.trace_id) != 16 or not any(span.trace_id):
        raise SpanInvalid(f"trace id {span.trace_id.hex()!r} is not 16 non-zero bytes")
    if len(span.span_id) != 8 or not any(span.span_id):
        raise SpanInvalid(f"span id {span.span_id.hex()!r} is not 8 non-zero bytes")
    if len(span.parent_span_id) not in (0, 8):
        raise SpanInvalid(f"parent span id {span.parent_span_id.hex()!r} is not 8 bytes")
    if span.start_time_unix_nano == 0:
        raise SpanInvalid("no start time")
    if span.end_time_unix_nano < span.start_time_unix_nano:
        raise SpanInvalid(f"end {span.end_time_unix_nano} ns is before start {span.start_time_unix_nano} ns")


def _seconds(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise SpanInvalid(f"{key} must be seconds ≥ 0, got {quote(repr(value), 60)}")
    return float(value)


def _count(key: str, value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not _is_int(value) or value < 0:
        raise SpanInvalid(f"{key} must be a token count ≥ 0, got {quote(repr(value), 60)}")
    return int(value)


def _text(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return "" if value is None else str(value)


def problems_frame(problems: list[Problem], *, source: str, ts_ns: int) -> pl.DataFrame:
    """Refused spans as ``ingest_errors`` rows."""
    n = len(problems)
    cols: dict[str, list[Any]] = {
        "ts_ns": [ts_ns] * n,
        "source": [source] * n,
        "location": [p.location for p in problems],
        "message": [p.message for p in problems],
    }
    return frame(INGEST_ERRORS.name, cols)


# -- rows -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Origin:
    """What a span's resource and scope say, worked out once per scope (rules 12–14)."""

    service: str
    scope: str
    engine: str
    dp_rank: int
    extra: dict[str, Any]

    @classmethod
    def of(cls, resource: dict[str, Any], scope: str) -> _Origin:
        service = _text(resource.get("service.name"))
        extra = {
            f"resource.{k}": v
            for k, v in resource.items()
            if k != "service.name" and not k.startswith("telemetry.")
        }
        return cls(service, scope, engine_by_name(service, scope), dp_rank_of(resource), extra)


@dataclass
class _Seen:
    """A span that is not a request, kept until the request spans are known (rule 4)."""

    span: Span
    attrs: dict[str, Any]


def request_rows(req: ExportTraceServiceRequest) -> SpanRows:
    """Every request span of ``req`` as a ``request_spans`` row (module docstring, rules 1–15)."""
    rows: dict[_Key, dict[str, Any]] = {}
    parents: dict[_Key, bytes] = {}
    others: dict[_Key, _Seen] = {}
    rejected: list[Problem] = []
    for where, origin, spans in _scopes(req):
        for i, span in enumerate(spans):
            try:
                check_span(span)
                key = (span.trace_id, span.span_id)
                if key in parents:  # rule 15: a repeat within the request
                    continue
                attrs = attributes(span.attributes)
                if is_request_span(span.name, attrs):
                    rows[key] = _row(span, attrs, origin)
                else:
                    others[key] = _Seen(span, attrs)
                parents[key] = span.parent_span_id
            except SpanInvalid as exc:
                rejected.append(Problem(f"{where}.spans[{i}] {quote(span.name, 60)}", str(exc)))
    folded = sum(_fold(seen, rows, parents) for seen in others.values())
    return SpanRows(
        frame=_frame(rows.values()), rejected=rejected, folded=folded, ignored=len(others) - folded
    )


def _scopes(req: ExportTraceServiceRequest) -> Iterator[tuple[str, _Origin, Any]]:
    for ri, rs in enumerate(req.resource_spans):
        resource = attributes(rs.resource.attributes)
        for si, ss in enumerate(rs.scope_spans):
            yield f"resource_spans[{ri}].scope_spans[{si}]", _Origin.of(resource, ss.scope.name), ss.spans


_SCHEMA = REQUEST_SPANS.polars_schema()


def _frame(rows: Iterable[dict[str, Any]]) -> pl.DataFrame:
    """Rows → a typed frame, column by column (rows lack the columns they have no value for)."""
    done = [_finish(r) for r in rows]
    return pl.DataFrame(
        [pl.Series(c, [r.get(c) for r in done], dtype=t, strict=False) for c, t in _SCHEMA.items()]
    )


def _row(span: Span, attrs: dict[str, Any], origin: _Origin) -> dict[str, Any]:
    """The row of one request span (rules 8–14); unmapped attributes kept under ``_extra``."""
    name = span.name
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    row: dict[str, Any] = {
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "start_ns": start,
        "end_ns": end,
        "name": name,
        "service": origin.service,
        "engine": origin.engine,
        "dp_rank": origin.dp_rank,
        "role": "",
        "request_id": "",
        "_extra": origin.extra.copy(),
        "_stages": None,
    }
    match = _SGLANG_ROOT.match(name) if " Req " in name else None
    if match:
        row["role"], row["request_id"] = match.group("role", "rid")
    _map_attributes(row, attrs)
    if "e2e_s" not in row:
        row["e2e_s"] = (end - start) / 1e9
    if span.events or not origin.engine:
        _use_events(row, span, attrs)
    return row


def _use_events(row: dict[str, Any], span: Span, attrs: dict[str, Any]) -> None:
    """Rules 9 and 12 where span events matter: KV-transfer time and the engine by shape."""
    events = {e.name: e.time_unix_nano for e in span.events}
    if not row["engine"]:
        row["engine"] = engine_by_shape(span.name, attrs, set(events))
    if "kv_transfer_s" not in row and _KV_EVENTS[0] in events and _KV_EVENTS[1] in events:
        start, end = events[_KV_EVENTS[0]], events[_KV_EVENTS[1]]
        row["kv_transfer_s"] = (end - start) / 1e9 if end >= start else None


def _map_attributes(row: dict[str, Any], attrs: dict[str, Any]) -> None:
    """One pass over the span's attributes: mapped ones to columns, the rest to ``_extra``."""
    extra: dict[str, Any] = row["_extra"]
    ranks: dict[str, int] = {}
    span_dp = False
    for key, value in attrs.items():
        target = _MAPPED.get(key)
        if target is None:
            extra[key] = value
            if not span_dp and (key == "dp_rank" or key.endswith(".dp_rank")) and _is_int(value):
                span_dp, row["dp_rank"] = True, int(value)
            continue
        kind, column, rank = target
        if kind == "s":  # fast path for the usual well-formed value, full check otherwise
            row[column] = value if type(value) is float and 0.0 <= value < math.inf else _seconds(key, value)
        elif kind == "n":
            row[column] = value if type(value) is int and value >= 0 else _count(key, value)
        elif value not in (None, "", []) and rank < ranks.get(column, len(TEXT_ATTRS[column])):
            row[column], ranks[column] = _text(value), rank
    if "role" in extra and not row["role"]:
        row["role"] = _text(extra.pop("role"))


def _fold(seen: _Seen, rows: dict[_Key, dict[str, Any]], parents: dict[_Key, bytes]) -> bool:
    """Rule 4: add ``seen`` to its request ancestor's stages; False when it has none."""
    trace, parent = seen.span.trace_id, seen.span.parent_span_id
    for _ in range(_MAX_HOPS):
        if not parent:
            return False
        row = rows.get((trace, parent))
        if row is not None:
            _add_stage(row, seen)
            return True
        parent = parents.get((trace, parent), b"")
    return False


def _add_stage(row: dict[str, Any], seen: _Seen) -> None:
    if "thread_label" in seen.attrs:  # a container, not a stage
        if row["dp_rank"] == -1:
            row["dp_rank"] = dp_rank_of(seen.attrs)
        return
    span = seen.span
    seconds = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
    if row["_stages"] is None:
        row["_stages"] = {}
    stages: dict[str, float] = row["_stages"]
    stages[span.name] = stages.get(span.name, 0.0) + seconds


def _finish(row: dict[str, Any]) -> dict[str, Any]:
    """Fill phases from stages (rule 4) and serialize ``attributes`` (rule 14)."""
    extra: dict[str, Any] = row.pop("_extra")
    stages: dict[str, float] | None = row.pop("_stages")
    if stages:
        for word, column in _STAGE_PHASES:
            hits = [s for name, s in stages.items() if word in name.lower()]
            if hits and row.get(column) is None:
                row[column] = sum(hits)
        extra["stages"] = stages
    row["attributes"] = _json(extra)
    return row


def _json(obj: dict[str, Any]) -> str:
    """Compact JSON with sorted keys; NaN/±inf become null, other odd values their ``str``."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS, default=str).decode()


# -- files ------------------------------------------------------------------------------------
_FILE_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")
MAX_DOCUMENT_BYTES = 256 << 20  # a pretty-printed (multi-line) request is read whole; past this it is refused


def sniff_file(name: str, head: bytes) -> bool:
    """A JSON file whose first object holds ``resourceSpans`` (or ``resource_spans``) first."""
    start = head.lstrip()[:64]
    return (
        name.endswith(_FILE_SUFFIXES)
        and start.startswith(b"{")
        and (b'"resourceSpans"' in start or b'"resource_spans"' in start)
    )


def _request_parsed(text: str | bytes, where: str) -> Parsed:
    """One export request's rows, or its refusal as a Problem at ``where``."""
    try:
        req, refused = decode_json(text)
    except (ParseError, RecursionError) as exc:
        reason = str(exc) if isinstance(exc, ParseError) else "JSON nests too deeply"
        return Parsed(problems=[Problem(where, reason)])
    rows = request_rows(req)
    refusals = [*refused, *rows.rejected]
    parsed = Parsed(problems=[Problem(f"{where} {p.location}", p.message) for p in refusals])
    parsed.add("request_spans", rows.frame)
    return parsed


def stream_file(path: Path, ctx: IngestContext) -> Iterator[Parsed]:
    """Export requests a line at a time; a file whose first line does not close its object is one
    pretty-printed request, read whole (up to :data:`MAX_DOCUMENT_BYTES`)."""
    chunks = LineChunks(path)
    for first, data in chunks:
        lines = data.split(b"\n")
        if first == 1 and not lines[0].rstrip().endswith(b"}"):
            yield _request_parsed(read_capped(path, MAX_DOCUMENT_BYTES), str(path))
            return
        out = Parsed()
        for i, line in enumerate(lines):
            if line.strip():
                out.extend(_request_parsed(line, f"{path}:{first + i}"))
        out.lines = data.count(b"\n")
        yield out
    if chunks.problems:
        yield Parsed(problems=chunks.problems)


def load_file(path: Path, ctx: IngestContext) -> Parsed:
    return gather_parts(stream_file(path, ctx))


FILE_FORMAT = FileFormat("otlp-json", sniff_file, load_file, priority=45, stream=stream_file)
