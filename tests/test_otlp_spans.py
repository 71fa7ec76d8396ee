"""The pure OTLP span decoder: engine shapes → request rows, OTLP/JSON quirks, refusals."""

from __future__ import annotations

import json

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otlp_engine_spans import MS, T0_NS, sglang_spans, to_otlp_json, to_protobuf, trtllm_spans, vllm_spans

from collector.errors import ParseError
from collector.formats.otlp_spans import decode_json, decode_protobuf, request_rows
from tests.conftest import DATA

JSON_DIR = DATA / "otlp_json"


def _rows(spans: list) -> dict[str, dict]:
    got = request_rows(decode_protobuf(to_protobuf(spans)))
    assert got.rejected == []
    return {r["request_id"]: r for r in got.frame.to_dicts()}


def test_vllm_llm_request_maps_every_latency_and_token_count() -> None:
    rows = _rows(vllm_spans(3))
    r = rows["cmpl-2"]
    assert r["engine"] == "vllm" and r["service"] == "vllm"
    assert r["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert r["ttft_s"] == pytest.approx(0.052)
    assert (r["queue_s"], r["prefill_s"], r["decode_s"]) == pytest.approx((0.010, 0.040, 0.440))
    assert (r["inference_s"], r["e2e_s"]) == pytest.approx((0.480, 0.500))
    assert (r["input_tokens"], r["output_tokens"], r["cached_tokens"]) == (102, 20, None)
    assert r["start_ns"] == T0_NS + 20 * MS and r["end_ns"] == T0_NS + 520 * MS
    extra = json.loads(r["attributes"])
    assert extra["gen_ai.request.max_tokens"] == 256 and extra["gen_ai.request.top_p"] == 0.95
    assert "gen_ai.latency.e2e" not in extra and "resource.service.name" not in extra


def test_sglang_root_gets_stages_folded_and_other_spans_ignored() -> None:
    spans = sglang_spans(2)
    got = request_rows(decode_protobuf(to_protobuf(spans)))
    assert got.frame.height == 2  # 12 spans: 2 roots
    assert (got.folded, got.ignored) == (8, 2)  # thread + 3 stages each; 2 bootstrap rooms
    r = {x["request_id"]: x for x in got.frame.to_dicts()}["00000001deadbeef"]
    assert (r["engine"], r["role"], r["name"]) == ("sglang", "prefill", "prefill Req 00000001")
    assert r["dp_rank"] == 1  # from the thread span
    assert (r["queue_s"], r["prefill_s"], r["decode_s"]) == pytest.approx((0.005, 0.030, 0.200))
    assert r["e2e_s"] == pytest.approx(0.250)  # span duration: no e2e attribute
    assert (r["input_tokens"], r["output_tokens"], r["cached_tokens"]) == (1001, 64, 512)
    assert r["finish_reason"] == "stop"
    assert json.loads(r["attributes"])["stages"] == pytest.approx(
        {"wait_queue": 0.005, "prefill_forward": 0.030, "decode_loop": 0.200}
    )


def test_sglang_empty_role_is_still_a_request() -> None:
    rows = _rows(sglang_spans(1, role=""))
    (r,) = rows.values()
    assert r["role"] == "" and r["engine"] == "sglang" and r["name"] == " Req 00000000"


def test_trtllm_kv_transfer_from_attribute_or_events() -> None:
    rows = _rows(trtllm_spans(2))
    assert rows["trt-0"]["kv_transfer_s"] == pytest.approx(0.012)  # attribute wins
    assert rows["trt-1"]["kv_transfer_s"] == pytest.approx(0.015)  # from the two events
    assert rows["trt-1"]["engine"] == "trtllm"  # scope tensorrt_llm.serve, service unknown
    assert (rows["trt-1"]["input_tokens"], rows["trt-1"]["output_tokens"]) == (2048, 128)
    assert rows["trt-1"]["model"] == "Qwen3-32B"


def test_otlp_json_hex_ids_camel_case_int_enums_unknown_fields() -> None:
    req, problems = decode_json((JSON_DIR / "vllm_two_requests_one_bad_id.json").read_bytes())
    rows = request_rows(req)
    assert [p.location for p in problems] == ["resource_spans[0].scope_spans[0].spans[1]"]
    assert "'not-a-hex-trace-id-at-all-000000' is not 32 hex digits" in problems[0].message
    by_id = {r["span_id"]: r for r in rows.frame.to_dicts()}
    first = by_id["eee19b7ec3c1b174"]
    assert first["trace_id"] == "5b8efff798038103d269b633813fc60c"
    assert (first["ttft_s"], first["queue_s"], first["e2e_s"]) == pytest.approx((0.184, 0.021, 1.25))
    assert (first["input_tokens"], first["output_tokens"]) == (812, 96)
    assert (first["finish_reason"], first["dp_rank"], first["engine"]) == ("length", 3, "vllm")
    assert first["model"] == "meta-llama/Llama-3.1-70B"
    extra = json.loads(first["attributes"])
    assert extra == {"gen_ai.request.temperature": 0.0, "resource.dp_rank": 3}
    second = by_id["0000000000000001"]
    assert (second["input_tokens"], second["output_tokens"], second["engine"]) == (64, 8, "vllm")


def test_json_round_trip_of_sdk_spans_equals_protobuf() -> None:
    spans = vllm_spans(4) + sglang_spans(2) + trtllm_spans(2)
    via_pb = request_rows(decode_protobuf(to_protobuf(spans))).frame
    req, problems = decode_json(json.dumps(to_otlp_json(spans)))
    assert problems == []
    assert request_rows(req).frame.sort("span_id").equals(via_pb.sort("span_id"))


def _bad(mutate) -> ExportTraceServiceRequest:  # type: ignore[no-untyped-def]
    req = ExportTraceServiceRequest()
    req.ParseFromString(to_protobuf(vllm_spans(3)))
    mutate(req.resource_spans[0].scope_spans[0].spans[1])
    return req


def _set_attr(span, key, value):  # type: ignore[no-untyped-def]
    for kv in span.attributes:
        if kv.key == key:
            kv.value.Clear()
            if isinstance(value, str):
                kv.value.string_value = value
            else:
                kv.value.double_value = value


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda s: setattr(s, "trace_id", b"\x01" * 8),
            "trace id '0101010101010101' is not 16 non-zero bytes",
        ),
        (lambda s: setattr(s, "span_id", b"\x00" * 8), "span id '0000000000000000' is not 8 non-zero bytes"),
        (lambda s: setattr(s, "parent_span_id", b"\x01\x02"), "parent span id '0102' is not 8 bytes"),
        (lambda s: setattr(s, "end_time_unix_nano", 5), "is before start"),
        (lambda s: setattr(s, "start_time_unix_nano", 0), "no start time"),
        (
            lambda s: _set_attr(s, "gen_ai.latency.e2e", "fast"),
            "gen_ai.latency.e2e must be seconds ≥ 0, got \"'fast'\"",
        ),
        (lambda s: _set_attr(s, "gen_ai.latency.e2e", -1.0), "must be seconds ≥ 0, got '-1.0'"),
        (lambda s: _set_attr(s, "gen_ai.usage.prompt_tokens", 1.5), "must be a token count ≥ 0, got '1.5'"),
    ],
)
def test_invalid_span_is_rejected_and_the_others_kept(mutate, message) -> None:  # type: ignore[no-untyped-def]
    got = request_rows(_bad(mutate))
    assert got.frame.height == 2
    assert sorted(got.frame["request_id"]) == ["cmpl-0", "cmpl-2"]
    (problem,) = got.rejected
    assert problem.location == "resource_spans[0].scope_spans[0].spans[1] 'llm_request'"
    assert message in problem.message


def test_repeated_span_in_one_request_is_kept_once() -> None:
    spans = vllm_spans(2)
    got = request_rows(decode_protobuf(to_protobuf(spans + spans)))
    assert got.frame.height == 2 and got.rejected == []


def test_empty_request_gives_no_rows() -> None:
    got = request_rows(decode_protobuf(b""))
    assert got.frame.height == 0 and got.rejected == [] and got.frame.columns[0] == "trace_id"


@pytest.mark.parametrize(
    ("body", "decoder", "needle"),
    [
        (b"\x0a\xff\xff\xff\x0f", decode_protobuf, "not a protobuf ExportTraceServiceRequest"),
        (to_protobuf(vllm_spans(2))[:-7], decode_protobuf, "not a protobuf ExportTraceServiceRequest"),
        (b'{"resourceSpans": [', decode_json, "not JSON"),
        (b"[1, 2]", decode_json, "top level must be an object"),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "soon"}]}]}]}',
            decode_json,
            "OTLP/JSON",
        ),
    ],
)
def test_malformed_bodies_raise_parse_error_quoting_them(body, decoder, needle) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ParseError, match=needle) as info:
        decoder(body)
    assert str(info.value).startswith("otlp: ")


def test_unmapped_attributes_json_is_compact_sorted_utf8_and_nan_is_null() -> None:
    req = decode_protobuf(to_protobuf(vllm_spans(1)))
    span = req.resource_spans[0].scope_spans[0].spans[0]
    for key, setter in (
        ("zeta", lambda v: setattr(v, "string_value", "né ✓")),
        ("alpha", lambda v: setattr(v, "double_value", float("nan"))),
        ("mid.big", lambda v: setattr(v, "int_value", -(2**63))),
        ("mid.raw", lambda v: setattr(v, "bytes_value", b"\x00\xff")),
        ("mid.list", lambda v: v.array_value.values.add(bool_value=True)),
    ):
        kv = span.attributes.add(key=key)
        setter(kv.value)
    (row,) = request_rows(req).frame.to_dicts()
    text = row["attributes"]
    extra = json.loads(text)
    assert list(extra) == sorted(extra)
    assert '"alpha":null,' in text and '"zeta":"né ✓"' in text and ", " not in text
    assert (extra["mid.big"], extra["mid.raw"], extra["mid.list"]) == (-(2**63), "00ff", [True])


@pytest.mark.parametrize(
    ("key", "member", "value", "column", "stored"),
    [
        ("gen_ai.latency.e2e", "int_value", 2, "e2e_s", 2.0),  # an integer number of seconds
        ("gen_ai.latency.time_to_first_token", "double_value", 0.0, "ttft_s", 0.0),
        ("gen_ai.usage.prompt_tokens", "int_value", 0, "input_tokens", 0),
        ("gen_ai.usage.completion_tokens", "double_value", 7.0, "output_tokens", 7),
        ("gen_ai.response.model", "string_value", "", "model", "meta-llama/Llama-3.1-8B-Instruct"),
    ],
)
def test_zero_and_other_typed_values_of_mapped_attributes(key, member, value, column, stored) -> None:  # type: ignore[no-untyped-def]
    req = decode_protobuf(to_protobuf(vllm_spans(1)))
    span = req.resource_spans[0].scope_spans[0].spans[0]
    if key == "gen_ai.response.model":  # an empty response model falls back to the request's
        span.attributes.add(key="gen_ai.request.model").value.string_value = stored
    for kv in span.attributes:
        if kv.key == key:
            kv.value.Clear()
            setattr(kv.value, member, value)
    got = request_rows(req)
    assert got.rejected == []
    assert got.frame.row(0, named=True)[column] == stored
