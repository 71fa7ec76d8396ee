"""The one table of serving-engine metric family -> canonical concept (used by engine.py).

Families are keyed by their *canonical spelling*: :func:`canonical_name` first turns the
re-exported spellings into it (Dynamo's ``trtllm:X`` → ``trtllm_X``; Ray Serve's
``ray_vllm:X`` → ``vllm:X``; NVIDIA NIM's unprefixed vLLM names ``X`` → ``nim:X``).
:data:`LABELLED` holds the families whose concept depends on one label's value (TRT-LLM's
Triton backend packs many gauges into one family), and :data:`ALSO` the samples that stand
for a second concept as well (Triton's success counter is the count of its latency sums).
"""

from __future__ import annotations

from typing import NamedTuple


class Concept(NamedTuple):
    """Where one engine family goes: concept name, kind, scale of values, scale of ``le``."""

    concept: str
    # 'gauge' | 'counter' | 'histogram' (buckets kept) | 'summary' (sum/count only) |
    # 'quantiles' (a real summary: its quantile series only)
    kind: str
    scale: float = 1.0
    le_scale: float = 1.0


def _hist(concept: str, scale: float = 1.0) -> Concept:
    return Concept(concept, "histogram", scale, scale)


_G = "gauge"
_C = "counter"
_S = "summary"
_Q = "quantiles"

_LATENCY = {
    "time_to_first_token_seconds": "ttft_seconds",
    "inter_token_latency_seconds": "itl_seconds",
    "request_time_per_output_token_seconds": "tpot_seconds",
    "e2e_request_latency_seconds": "e2e_seconds",
    "request_queue_time_seconds": "queue_seconds",
    "request_prefill_time_seconds": "prefill_seconds",
    "request_decode_time_seconds": "decode_seconds",
    "request_inference_time_seconds": "inference_seconds",
}

# vLLM's families without their prefix: NIM exports them bare, Ray Serve as ``ray_vllm:``.
_VLLM: dict[str, Concept] = {
    **{k: _hist(v) for k, v in _LATENCY.items()},
    "time_per_output_token_seconds": _hist("itl_seconds"),  # retired name of ITL (one obs per token)
    "num_requests_running": Concept("requests_running", _G),
    "num_requests_waiting": Concept("requests_waiting", _G),
    "num_request_max": Concept("requests_max", _G),  # NIM only
    "kv_cache_usage_perc": Concept("kv_usage_ratio", _G),
    "gpu_cache_usage_perc": Concept("kv_usage_ratio", _G),  # retired
    "gpu_prefix_cache_hit_rate": Concept("prefix_cache_hit_ratio", _G),  # retired
    "num_preemptions": Concept("preemptions_total", _C),
    "prompt_tokens": Concept("prompt_tokens_total", _C),
    "generation_tokens": Concept("generation_tokens_total", _C),
    "prefix_cache_hits": Concept("prefix_cache_hits_total", _C),
    "prefix_cache_queries": Concept("prefix_cache_queries_total", _C),
    "gpu_prefix_cache_hits": Concept("prefix_cache_hits_total", _C),  # retired
    "gpu_prefix_cache_queries": Concept("prefix_cache_queries_total", _C),  # retired
    "prompt_tokens_cached": Concept("cached_tokens_total", _C),
    "request_success": Concept("request_success_total", _C),
    "request_prompt_tokens": Concept("request_prompt_tokens", _S),
    "request_generation_tokens": Concept("request_generation_tokens", _S),
    # vLLM ≥ 0.33 --enable-mfu-metrics: per-GPU estimates whose rates are FLOP/s and bytes/s
    "estimated_flops_per_gpu": Concept("estimated_flops_total", _C),
    "estimated_read_bytes_per_gpu": Concept("estimated_read_bytes_total", _C),
    "estimated_write_bytes_per_gpu": Concept("estimated_write_bytes_total", _C),
    # NIXL KV connector (disaggregated prefill/decode): the KV-transfer signal
    "nixl_xfer_time_seconds": _hist("kv_transfer_seconds"),
    "nixl_post_time_seconds": _hist("kv_transfer_post_seconds"),
    "nixl_bytes_transferred": Concept("kv_transfer_bytes", _S),
    "nixl_num_descriptors": Concept("kv_transfer_descriptors", _S),
    "nixl_num_failed_transfers": Concept("kv_transfer_failures_total", _C),
    "nixl_num_failed_notifications": Concept("kv_transfer_failed_notifications_total", _C),
    "nixl_num_kv_expired_reqs": Concept("kv_expired_requests_total", _C),
}

# NIM exports a subset of vLLM's names bare; only these are read without a prefix.
_NIM = (
    "time_to_first_token_seconds",
    "time_per_output_token_seconds",
    "e2e_request_latency_seconds",
    "num_requests_running",
    "num_requests_waiting",
    "num_request_max",
    "gpu_cache_usage_perc",
    "prompt_tokens",
    "generation_tokens",
    "request_success",
    "request_prompt_tokens",
    "request_generation_tokens",
)

FAMILIES: dict[str, Concept] = {
    **{f"vllm:{k}": v for k, v in _VLLM.items()},
    **{f"nim:{k}": _VLLM[k] for k in _NIM},
    # SGLang 0.5 (and 0.3/0.4 names)
    "sglang:time_to_first_token_seconds": _hist("ttft_seconds"),
    "sglang:inter_token_latency_seconds": _hist("itl_seconds"),
    "sglang:time_per_output_token_seconds": _hist("itl_seconds"),  # 0.3/0.4: one obs per token
    "sglang:request_time_per_output_token_seconds": _hist("tpot_seconds"),
    "sglang:e2e_request_latency_seconds": _hist("e2e_seconds"),
    "sglang:queue_time_seconds": _hist("queue_seconds"),
    "sglang:waiting_request_latency_seconds": _hist("queue_seconds"),  # 0.3
    "sglang:num_requests_running": Concept("requests_running", _G),  # 0.3
    "sglang:num_requests_waiting": Concept("requests_waiting", _G),  # 0.3
    "sglang:request_prompt_tokens": Concept("request_prompt_tokens", _S),  # 0.3
    "sglang:request_generation_tokens": Concept("request_generation_tokens", _S),  # 0.3
    "sglang:num_running_reqs": Concept("requests_running", _G),
    "sglang:num_queue_reqs": Concept("requests_waiting", _G),
    "sglang:token_usage": Concept("kv_usage_ratio", _G),
    "sglang:cache_hit_rate": Concept("prefix_cache_hit_ratio", _G),
    "sglang:gen_throughput": Concept("generation_tokens_per_s", _G),
    "sglang:num_retracted_requests": Concept("preemptions_total", _C),
    "sglang:prompt_tokens": Concept("prompt_tokens_total", _C),
    "sglang:generation_tokens": Concept("generation_tokens_total", _C),
    "sglang:cached_tokens": Concept("cached_tokens_total", _C),
    # seconds the GPU runs forward passes (label category): its rate is the busy share
    "sglang:forward_execution_seconds": Concept("forward_busy_seconds_total", _C),
    "sglang:num_requests": Concept("requests_total", _C),
    "sglang:num_aborted_requests": Concept("requests_aborted_total", _C),
    "sglang:prompt_tokens_histogram": Concept("request_prompt_tokens", _S),
    "sglang:generation_tokens_histogram": Concept("request_generation_tokens", _S),
    # TensorRT-LLM (trtllm-serve /prometheus/metrics; Dynamo re-exports them as trtllm:)
    "trtllm_time_to_first_token_seconds": _hist("ttft_seconds"),
    "trtllm_time_per_output_token_seconds": _hist("tpot_seconds"),
    "trtllm_e2e_request_latency_seconds": _hist("e2e_seconds"),
    "trtllm_request_queue_time_seconds": _hist("queue_seconds"),
    "trtllm_request_prefill_time_seconds": _hist("prefill_seconds"),
    "trtllm_request_decode_time_seconds": _hist("decode_seconds"),
    "trtllm_num_requests_running": Concept("requests_running", _G),
    "trtllm_num_requests_waiting": Concept("requests_waiting", _G),
    "trtllm_kv_cache_utilization": Concept("kv_usage_ratio", _G),
    "trtllm_kv_cache_hit_rate": Concept("prefix_cache_hit_ratio", _G),
    "trtllm_prompt_tokens": Concept("prompt_tokens_total", _C),
    "trtllm_generation_tokens": Concept("generation_tokens_total", _C),
    "trtllm_request_success": Concept("request_success_total", _C),
    # Dynamo frontend and workers
    "dynamo_frontend_time_to_first_token_seconds": _hist("ttft_seconds"),
    "dynamo_frontend_inter_token_latency_seconds": _hist("itl_seconds"),
    "dynamo_frontend_request_duration_seconds": _hist("e2e_seconds"),
    "dynamo_frontend_inflight_requests": Concept("requests_running", _G),
    "dynamo_frontend_queued_requests": Concept("requests_waiting", _G),
    "dynamo_frontend_requests": Concept("requests_total", _C),
    "dynamo_frontend_output_tokens": Concept("generation_tokens_total", _C),
    "dynamo_component_gpu_cache_usage_percent": Concept("kv_usage_ratio", _G),
    "dynamo_component_kvstats_gpu_cache_usage_percent": Concept("kv_usage_ratio", _G),  # 0..1
    "dynamo_component_kvstats_gpu_prefix_cache_hit_rate": Concept("prefix_cache_hit_ratio", _G),
    "dynamo_component_inflight_requests": Concept("requests_running", _G),
    "dynamo_component_requests": Concept("requests_total", _C),
    "dynamo_component_request_duration_seconds": _hist("worker_request_seconds"),
    # Hugging Face TGI (router /metrics; counters carry no _total)
    "tgi_request_duration": _hist("e2e_seconds"),
    "tgi_request_queue_duration": _hist("queue_seconds"),
    "tgi_request_inference_duration": _hist("inference_seconds"),
    "tgi_request_mean_time_per_token_duration": _hist("tpot_seconds"),
    "tgi_batch_inference_duration": _hist("batch_step_seconds"),  # per forward pass, label method
    "tgi_batch_forward_duration": _hist("batch_step_seconds"),
    "tgi_queue_size": Concept("requests_waiting", _G),
    "tgi_batch_current_size": Concept("requests_running", _G),
    "tgi_request_success": Concept("request_success_total", _C),
    "tgi_request_failure": Concept("request_failure_total", _C),
    "tgi_request_count": Concept("requests_total", _C),
    "tgi_request_input_length": Concept("request_prompt_tokens", _S),
    "tgi_request_generated_tokens": Concept("request_generation_tokens", _S),
    # Triton (engine rule 4): cumulative µs counters are latency sums, counted by ALSO below
    "nv_inference_request_success": Concept("request_success_total", _C),
    "nv_inference_request_failure": Concept("request_failure_total", _C),
    "nv_inference_pending_request_count": Concept("requests_waiting", _G),
    "nv_inference_request_duration_us": Concept("e2e_seconds_sum", _C, 1e-6),
    "nv_inference_queue_duration_us": Concept("queue_seconds_sum", _C, 1e-6),
    "nv_inference_compute_infer_duration_us": Concept("inference_seconds_sum", _C, 1e-6),
    "nv_inference_compute_input_duration_us": Concept("compute_input_seconds_sum", _C, 1e-6),
    "nv_inference_compute_output_duration_us": Concept("compute_output_seconds_sum", _C, 1e-6),
    "nv_inference_first_response_histogram_ms": _hist("ttft_seconds", 1e-3),
    # Triton summaries (--metrics-config summary_latencies=true): quantiles kept, their
    # _sum/_count equal the counters above and are not stored twice
    "nv_inference_request_summary_us": Concept("e2e_seconds", _Q, 1e-6),
    "nv_inference_queue_summary_us": Concept("queue_seconds", _Q, 1e-6),
    "nv_inference_compute_infer_summary_us": Concept("inference_seconds", _Q, 1e-6),
    "nv_inference_compute_input_summary_us": Concept("compute_input_seconds", _Q, 1e-6),
    "nv_inference_compute_output_summary_us": Concept("compute_output_seconds", _Q, 1e-6),
}

# family -> (label, {label value: concept}); other values of the label are not stored
LABELLED: dict[str, tuple[str, dict[str, Concept]]] = {
    "nv_trt_llm_request_metrics": (
        "request_type",
        {
            "waiting": Concept("requests_waiting", _G),
            "scheduled": Concept("requests_running", _G),
            "context": Concept("requests_prefill", _G),
            "max": Concept("requests_max", _G),
        },
    ),
    "nv_trt_llm_kv_cache_block_metrics": (
        "kv_cache_block_type",
        {
            "fraction": Concept("kv_usage_ratio", _G),
            "used": Concept("kv_blocks_used", _G),
            "max": Concept("kv_blocks_max", _G),
        },
    ),
    "nv_trt_llm_disaggregated_serving_metrics": (
        "disaggregated_serving_type",
        {
            "kv_cache_transfer_ms": Concept("kv_transfer_seconds_sum", _C, 1e-3),
            "request_count": Concept("kv_transfer_seconds_count", _C),
        },
    ),
}

# family -> further concepts the same value is stored under (Triton: the success count is
# the count of every per-request latency sum, so means can be taken)
ALSO: dict[str, tuple[Concept, ...]] = {
    "nv_inference_request_success": tuple(
        Concept(f"{c}_seconds_count", _C)
        for c in ("e2e", "queue", "inference", "compute_input", "compute_output")
    ),
}

ENGINES = {
    "vllm:": "vllm",
    "ray_vllm:": "vllm",
    "sglang:": "sglang",
    "trtllm_": "trtllm",
    "trtllm:": "trtllm",
    "dynamo_": "dynamo",
    "nv_inference_": "triton",
    "nv_trt_llm_": "triton",
    "tgi_": "tgi",
}
_RESPELL = {"trtllm:": "trtllm_", "ray_vllm:": "vllm:"}
NIM_FAMILIES = frozenset(_NIM)
# a bare family name is NIM's only on a series that names its model (a guard against
# unrelated applications' `request_success_total` and the like)
NIM_LABELS = ("model_name",)
SUFFIXES = ("_bucket", "_sum", "_count", "_total", "")


def canonical_name(name: str, labels: object = None) -> tuple[str, str]:
    """``(engine, family spelling in FAMILIES)`` of a sample name, or ``('', name)``.

    ``labels`` (a mapping) decides whether a bare vLLM name is NIM's (see NIM_LABELS)."""
    for prefix, engine in ENGINES.items():
        if name.startswith(prefix):
            respelled = _RESPELL.get(prefix)
            return engine, (respelled + name[len(prefix) :]) if respelled else name
    if labels is not None and any(k in labels for k in NIM_LABELS):  # type: ignore[operator]
        for suffix in SUFFIXES:
            if name.endswith(suffix) and name[: len(name) - len(suffix)] in NIM_FAMILIES:
                return "nim", "nim:" + name
    return "", name


CONCEPTS: tuple[str, ...] = tuple(
    dict.fromkeys(
        [c.concept for c in FAMILIES.values()]
        + [c.concept for _, values in LABELLED.values() for c in values.values()]
        + [c.concept for extra in ALSO.values() for c in extra]
    )
)
