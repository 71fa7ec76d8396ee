"""Spans shaped like each engine's, made with the real OpenTelemetry SDK (test helper).

Shapes follow REFERENCE §2 and the engines' tracing code: vLLM's one ``llm_request`` SERVER
span with ``gen_ai.latency.*`` seconds and ``gen_ai.usage.prompt/completion_tokens``;
SGLang's ``Bootstrap Room`` → ``"{role} Req {rid8}"`` root → thread span (``thread_label``,
``tp_rank``) → stage slices, with ``gen_ai.usage.input/output/cached_tokens`` and
``gen_ai.response.finish_reasons`` on the root; TensorRT-LLM's ``llm_request`` with
``gen_ai.latency.kv_cache_transfer_time`` and ``kv_cache_transfer_start/end`` events.

Times are fixed (``T0_NS`` + offsets) so tests assert exact values; ids come from a seeded
generator so a second build of the same spans repeats their (trace_id, span_id).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from google.protobuf import json_format
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.util.types import AttributeValue

T0_NS = 1_780_000_000_000_000_000
MS = 1_000_000


class SeededIds(IdGenerator):
    """Deterministic ids: the same seed gives the same trace and span ids."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def generate_span_id(self) -> int:
        return self.rng.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self.rng.getrandbits(128) or 1


def _tracer(service: str, scope: str, seed: int) -> tuple[trace.Tracer, InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": service}), id_generator=SeededIds(seed)
    )
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider.get_tracer(scope), memory


def vllm_spans(n: int, *, seed: int = 1, service: str = "vllm") -> list[ReadableSpan]:
    """``n`` vLLM requests; request i has TTFT 0.050 + i/1000 s and 100 + i prompt tokens."""
    tracer, memory = _tracer(service, "vllm.tracing", seed)
    for i in range(n):
        start = T0_NS + i * 10 * MS
        attrs: dict[str, AttributeValue] = {
            "gen_ai.response.model": "meta-llama/Llama-3.1-8B-Instruct",
            "gen_ai.request.id": f"cmpl-{i}",
            "gen_ai.request.max_tokens": 256,
            "gen_ai.request.temperature": 0.7,
            "gen_ai.request.top_p": 0.95,
            "gen_ai.request.n": 1,
            "gen_ai.usage.prompt_tokens": 100 + i,
            "gen_ai.usage.completion_tokens": 20,
            "gen_ai.latency.time_to_first_token": 0.050 + i / 1000,
            "gen_ai.latency.e2e": 0.500,
            "gen_ai.latency.time_in_queue": 0.010,
            "gen_ai.latency.time_in_model_prefill": 0.040,
            "gen_ai.latency.time_in_model_decode": 0.440,
            "gen_ai.latency.time_in_model_inference": 0.480,
        }
        span = tracer.start_span(
            "llm_request", kind=trace.SpanKind.SERVER, start_time=start, attributes=attrs
        )
        span.end(end_time=start + 500 * MS)
    return list(memory.get_finished_spans())


def sglang_spans(n: int, *, seed: int = 2, role: str = "prefill") -> list[ReadableSpan]:
    """``n`` SGLang requests, each: bootstrap room, root, thread span, three stage slices.

    Stages of request i: ``wait_queue`` 5 ms, ``prefill_forward`` 30 ms, ``decode_loop`` 200 ms;
    the root lasts 250 ms; the thread span says ``dp_rank`` 1.
    """
    tracer, memory = _tracer("sglang", "sglang server", seed)
    for i in range(n):
        t = T0_NS + i * 10 * MS
        room = tracer.start_span(
            f"Bootstrap Room {hex(i)}", start_time=t, attributes={"bootstrap_room": hex(i)}
        )
        rid = f"{i:08x}deadbeef"
        ctx = trace.set_span_in_context(room)
        root = tracer.start_span(f"{role} Req {rid[:8]}", start_time=t, context=ctx, attributes={"rid": rid})
        thread_attrs: dict[str, AttributeValue] = {
            "thread_label": "Scheduler",
            "tp_rank": 0,
            "dp_rank": 1,
            "pid": 4242,
            "host_id": "abc",
        }
        thread = tracer.start_span(
            "Scheduler [TP 0] (host:abc | pid:4242)",
            start_time=t,
            context=trace.set_span_in_context(root),
            attributes=thread_attrs,
        )
        offset = t
        for stage, ms in (("wait_queue", 5), ("prefill_forward", 30), ("decode_loop", 200)):
            s = tracer.start_span(stage, start_time=offset, context=trace.set_span_in_context(thread))
            s.end(end_time=offset + ms * MS)
            offset += ms * MS
        thread.end(end_time=t + 250 * MS)
        root.set_attributes(
            {
                "gen_ai.usage.input_tokens": 1000 + i,
                "gen_ai.usage.output_tokens": 64,
                "gen_ai.usage.cached_tokens": 512,
                "gen_ai.response.finish_reasons": ["stop"],
            }
        )
        root.end(end_time=t + 250 * MS)
        room.end(end_time=t + 250 * MS)
    return list(memory.get_finished_spans())


def trtllm_spans(n: int, *, seed: int = 3) -> list[ReadableSpan]:
    """``n`` TensorRT-LLM disaggregated requests: KV transfer 12 ms by attribute, 15 ms by events.

    Even requests carry the attribute (0.012 s); odd ones only the events (15 ms apart).
    """
    tracer, memory = _tracer("unknown_service", "tensorrt_llm.serve", seed)
    for i in range(n):
        start = T0_NS + i * 10 * MS
        attrs: dict[str, int | float | str] = {
            "gen_ai.request.model": "Qwen3-32B",
            "gen_ai.request.id": f"trt-{i}",
            "gen_ai.usage.input_tokens": 2048,
            "gen_ai.usage.output_tokens": 128,
            "gen_ai.latency.time_to_first_token": 0.120,
            "gen_ai.latency.e2e": 1.5,
        }
        if i % 2 == 0:
            attrs["gen_ai.latency.kv_cache_transfer_time"] = 0.012
        span = tracer.start_span(
            "llm_request", kind=trace.SpanKind.SERVER, start_time=start, attributes=attrs
        )
        span.add_event("kv_cache_transfer_start", timestamp=start + 100 * MS)
        span.add_event("kv_cache_transfer_end", timestamp=start + 115 * MS)
        span.end(end_time=start + 1500 * MS)
    return list(memory.get_finished_spans())


def to_protobuf(spans: Sequence[ReadableSpan]) -> bytes:
    """The SDK's own encoding of ``spans`` (what the HTTP exporter sends)."""
    return encode_spans(spans).SerializeToString()


def to_otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, object]:
    """OTLP/JSON of ``spans``: the SDK encoding through json_format, ids rewritten to hex.

    The SDK has no JSON exporter; this is what one must send (camelCase, hex ids).
    """
    doc = json_format.MessageToDict(encode_spans(spans))
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = _b64_to_hex(span[key])
    return doc


def _b64_to_hex(value: str) -> str:
    import base64

    return base64.b64decode(value).hex()
