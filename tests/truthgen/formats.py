"""Writers of the real formats: dcgm-exporter text, vLLM 0.33 ``/metrics`` text, NCCL Inspector JSONL.

Notes:

1. dcgm-exporter: one ``# HELP`` / ``# TYPE`` pair per field, then one sample per GPU with the labels
   dcgm-exporter prints (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``,
   ``DCGM_FI_DRIVER_VERSION``), in the order of the shared fixtures ``dcgm/t4_a10g_mixed.prom`` and
   ``dcgm/h100x8_k8s_pod_labels.prom``; the field set is the default CSV (``default-counters.csv``),
   and ``profiling=True`` adds the ``DCGM_FI_PROF_*`` ratios (SM_ACTIVE and SM_OCCUPANCY, which the
   CSV comments out, included as an operator who enables them would). Gauges that DCGM reports as
   integers print as integers, floats with 6 decimals (Go's ``%f``).
2. vLLM 0.33 (prometheus_client): every family in the order of ``engine/vllm_0.33.0_dp1.prom`` with
   its HELP text, ``engine`` and ``model_name`` labels, the ``_created`` gauge after each counter and
   histogram, histogram buckets with vLLM's default bounds, ``_count`` then ``_sum``, values as
   prometheus_client's ``floatToGoString`` writes them (``12.0``, ``1.15073024e+09``).
3. NCCL Inspector (v4 output): one JSON object per line, ``header`` + ``metadata`` + ``coll_perf``,
   keys in the plugin's order; written only for the latest completed collective of each communicator
   at each dump, so ``coll_sn`` jumps by the number of calls in between.
4. OTLP/JSON request spans: one ``ExportTraceServiceRequest`` object per line, as the OpenTelemetry
   Collector's file exporter writes them (camelCase keys, hex ids, 64-bit integers and nanosecond
   times as decimal strings). A request is one ``llm_request`` SERVER span with the OTel GenAI
   latency attributes (seconds) vLLM sets, and TensorRT-LLM's
   ``gen_ai.latency.kv_cache_transfer_time`` for the prefill→decode KV transfer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DRIVER = "550.127.08"
VLLM_TTFT_LE = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
VLLM_ITL_LE = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
VLLM_PHASE_LE = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
VLLM_TOKENS_LE = (
    1.0,
    2.0,
    5.0,
    10.0,
    20.0,
    50.0,
    100.0,
    200.0,
    500.0,
    1000.0,
    2000.0,
    5000.0,
    10000.0,
    20000.0,
    50000.0,
    100000.0,
)


# ------------------------------------------------------------------------------------------- numbers
def go_float(v: float) -> str:
    """prometheus_client's floatToGoString: ``repr`` of the float, exponent form past 6 integer digits."""
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    s = repr(float(v))
    dot = s.find(".")
    if v > 0 and dot > 6 and "e" not in s:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}"


# ------------------------------------------------------------------------------------------- dcgm
@dataclass(frozen=True)
class GpuIdentity:
    host: str
    index: int
    uuid: str
    pci_bus_id: str
    model_name: str


# (field, type, help, integer-valued) in default-counters.csv order; PROF ratios follow.
_DEFAULT_FIELDS = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", True),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", True),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", True),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", True),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", False),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ).", True),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", True),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", True),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", True),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", True),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", True),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", True),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", True),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", True),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", True),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
        True,
    ),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", True),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        True,
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
        True,
    ),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", True),
)
_PROF_FIELDS = (
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.", False),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned.", False),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM.", False),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.", False),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        False,
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both "
        "protocol headers and data payloads - in bytes per second.",
        True,
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both "
        "protocol headers and data payloads - in bytes per second.",
        True,
    ),
)


def dcgm_text(gpus: Sequence[GpuIdentity], values: Sequence[Mapping[str, float]], *, profiling: bool) -> str:
    """Note 1: one dcgm-exporter scrape body; ``values[i]`` maps field name → value for ``gpus[i]``."""
    fields = _DEFAULT_FIELDS + (_PROF_FIELDS if profiling else ())
    out: list[str] = []
    for name, kind, help_text, integer in fields:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        for g, vals in zip(gpus, values, strict=True):
            v = vals.get(name, 0.0)
            text = str(round(v)) if integer else f"{v:.6f}"
            labels = _labels(
                (
                    ("gpu", str(g.index)),
                    ("UUID", g.uuid),
                    ("pci_bus_id", g.pci_bus_id),
                    ("device", f"nvidia{g.index}"),
                    ("modelName", g.model_name),
                    ("Hostname", g.host),
                    ("DCGM_FI_DRIVER_VERSION", DRIVER),
                )
            )
            out.append(f"{name}{labels} {text}")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------- vLLM
@dataclass
class Histogram:
    """Cumulative bucket counts as an engine keeps them (never decreasing); the running totals are
    expectations, printed as their floor (whole observations)."""

    bounds: tuple[float, ...]
    counts: list[float]
    total: float = 0.0
    sum: float = 0.0

    @classmethod
    def empty(cls, bounds: tuple[float, ...]) -> Histogram:
        return cls(bounds, [0.0] * len(bounds))

    def add(self, per_bucket: Sequence[float], n: float, total_value: float) -> None:
        """Add ``n`` observations: ``per_bucket[i]`` of them fall at or below ``bounds[i]`` (cumulative)."""
        for i, c in enumerate(per_bucket):
            self.counts[i] += c
        self.total += n
        self.sum += total_value


@dataclass
class EngineState:
    """Everything one vLLM engine's ``/metrics`` shows at a scrape."""

    engine: str
    model: str
    running: int = 0
    waiting: int = 0
    waiting_deferred: int = 0
    kv_usage: float = 0.0
    preemptions: float = 0.0
    prompt_tokens: float = 0.0
    prompt_tokens_external: float = 0.0
    generation_tokens: float = 0.0
    success_stop: float = 0.0
    success_length: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    flops: float = 0.0
    read_bytes: float = 0.0
    write_bytes: float = 0.0
    num_gpu_blocks: int = 0
    created: float = 0.0
    hists: dict[str, Histogram] | None = None

    def __post_init__(self) -> None:
        if self.hists is None:
            self.hists = {
                "request_prompt_tokens": Histogram.empty(VLLM_TOKENS_LE),
                "request_generation_tokens": Histogram.empty(VLLM_TOKENS_LE),
                "time_to_first_token_seconds": Histogram.empty(VLLM_TTFT_LE),
                "inter_token_latency_seconds": Histogram.empty(VLLM_ITL_LE),
                "request_time_per_output_token_seconds": Histogram.empty(VLLM_ITL_LE),
                "e2e_request_latency_seconds": Histogram.empty(VLLM_PHASE_LE),
                "request_queue_time_seconds": Histogram.empty(VLLM_PHASE_LE),
                "request_inference_time_seconds": Histogram.empty(VLLM_PHASE_LE),
                "request_prefill_time_seconds": Histogram.empty(VLLM_PHASE_LE),
                "request_decode_time_seconds": Histogram.empty(VLLM_PHASE_LE),
            }


_MFU = " (for Model Flops Utilization calculations)."
_HELP = {
    "estimated_flops_per_gpu_total": "Estimated number of floating point operations per GPU" + _MFU,
    "estimated_read_bytes_per_gpu_total": "Estimated number of bytes read from memory per GPU" + _MFU,
    "estimated_write_bytes_per_gpu_total": "Estimated number of bytes written to memory per GPU" + _MFU,
    "num_requests_running": "Number of requests in model execution batches.",
    "num_requests_waiting": "Number of requests waiting to be processed.",
    "num_requests_waiting_by_reason": (
        "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
        "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of"
        " all reasons equals vllm:num_requests_waiting."
    ),
    "kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "prefix_cache_queries_total": "Prefix cache queries, in terms of number of queried tokens.",
    "prefix_cache_hits_total": "Prefix cache hits, in terms of number of cached tokens.",
    "num_preemptions_total": "Cumulative number of preemption from the engine.",
    "prompt_tokens_total": "Number of prefill tokens processed.",
    "prompt_tokens_by_source_total": "Number of prompt tokens by source.",
    "generation_tokens_total": "Number of generation tokens processed.",
    "request_success_total": "Count of successfully processed requests.",
    "request_prompt_tokens": "Number of prefill tokens processed.",
    "request_generation_tokens": "Number of generation tokens processed.",
    "time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "request_time_per_output_token_seconds": "Histogram of time_per_output_token_seconds per request.",
    "e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "request_inference_time_seconds": "Histogram of time spent in RUNNING phase for request.",
    "request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
    "request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
}
_PROCESS = (
    (
        "python_info",
        "gauge",
        "Python platform information",
        '{implementation="CPython",major="3",minor="12",patchlevel="11",version="3.12.11"}',
        1.0,
    ),
    ("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", "", 1.9e9),
    ("process_open_fds", "gauge", "Number of open file descriptors.", "", 112.0),
)


class _Body:
    def __init__(self, engines: Sequence[EngineState]) -> None:
        self.engines = engines
        self.lines: list[str] = []

    def ids(self, e: EngineState, *extra: tuple[str, str]) -> list[tuple[str, str]]:
        return sorted([("engine", e.engine), ("model_name", e.model), *extra])

    def family(self, short: str, kind: str, rows: Iterable[tuple[list[tuple[str, str]], float]]) -> None:
        name = f"vllm:{short}"
        self.lines += [f"# HELP {name} {_HELP[short]}", f"# TYPE {name} {kind}"]
        rows = [
            (lb, float(math.floor(v)) if kind == "counter" and "estimated" not in short else v)
            for lb, v in rows
        ]
        self.lines += [f"{name}{_labels(lb)} {go_float(v)}" for lb, v in rows]
        if kind in ("counter", "histogram"):
            created = f"vllm:{short.removesuffix('_total')}_created"
            self.lines += [f"# HELP {created} {_HELP[short]}", f"# TYPE {created} gauge"]
            self.lines += [
                f"{created}{_labels(lb)} {go_float(e.created)}"
                for e in self.engines
                for lb in self._created_labels(short, e, rows)
            ]

    def _created_labels(
        self, short: str, e: EngineState, rows: list[tuple[list[tuple[str, str]], float]]
    ) -> list[list[tuple[str, str]]]:
        mine = [lb for lb, _ in rows if ("engine", e.engine) in lb]
        return [lb for lb in mine if not any(k == "le" for k, _ in lb)] if mine else [self.ids(e)]

    def histogram(self, short: str) -> None:
        name = f"vllm:{short}"
        self.lines += [f"# HELP {name} {_HELP[short]}", f"# TYPE {name} histogram"]
        for e in self.engines:
            assert e.hists is not None
            h = e.hists[short]
            total = float(math.floor(h.total + 1e-9))
            for le, c in zip(h.bounds, h.counts, strict=True):
                n = float(min(math.floor(c + 1e-9), total))
                self.lines.append(f"{name}_bucket{_labels(self.ids(e, ('le', go_float(le))))} {go_float(n)}")
            self.lines.append(f"{name}_bucket{_labels(self.ids(e, ('le', '+Inf')))} {go_float(total)}")
            self.lines.append(f"{name}_count{_labels(self.ids(e))} {go_float(total)}")
            self.lines.append(f"{name}_sum{_labels(self.ids(e))} {go_float(h.sum)}")
        created = f"{name}_created"
        self.lines += [f"# HELP {created} {_HELP[short]}", f"# TYPE {created} gauge"]
        self.lines += [f"{created}{_labels(self.ids(e))} {go_float(e.created)}" for e in self.engines]


def vllm_text(engines: Sequence[EngineState]) -> str:
    """Note 2: the ``/metrics`` body of one vLLM 0.33 API server with ``engines`` (DP ranks)."""
    b = _Body(engines)
    for name, kind, help_text, labels, value in _PROCESS:
        b.lines += [
            f"# HELP {name} {help_text}",
            f"# TYPE {name} {kind}",
            f"{name}{labels} {go_float(value)}",
        ]
    es = engines
    b.family("estimated_flops_per_gpu_total", "counter", ((b.ids(e), e.flops) for e in es))
    b.family("estimated_read_bytes_per_gpu_total", "counter", ((b.ids(e), e.read_bytes) for e in es))
    b.family("estimated_write_bytes_per_gpu_total", "counter", ((b.ids(e), e.write_bytes) for e in es))
    b.family("num_requests_running", "gauge", ((b.ids(e), float(e.running)) for e in es))
    b.family("num_requests_waiting", "gauge", ((b.ids(e), float(e.waiting)) for e in es))
    b.family(
        "num_requests_waiting_by_reason",
        "gauge",
        [
            row
            for e in es
            for row in (
                (b.ids(e, ("reason", "capacity")), float(e.waiting - e.waiting_deferred)),
                (b.ids(e, ("reason", "deferred")), float(e.waiting_deferred)),
            )
        ],
    )
    b.family("kv_cache_usage_perc", "gauge", ((b.ids(e), e.kv_usage) for e in es))
    b.family("prefix_cache_queries_total", "counter", ((b.ids(e), e.prefix_queries) for e in es))
    b.family("prefix_cache_hits_total", "counter", ((b.ids(e), e.prefix_hits) for e in es))
    b.family("num_preemptions_total", "counter", ((b.ids(e), e.preemptions) for e in es))
    b.family("prompt_tokens_total", "counter", ((b.ids(e), e.prompt_tokens) for e in es))
    b.family(
        "prompt_tokens_by_source_total",
        "counter",
        [
            row
            for e in es
            for row in (
                (b.ids(e, ("source", "local_compute")), e.prompt_tokens - e.prompt_tokens_external),
                (b.ids(e, ("source", "local_cache_hit")), 0.0),
                (b.ids(e, ("source", "external_kv_transfer")), e.prompt_tokens_external),
            )
        ],
    )
    b.family("generation_tokens_total", "counter", ((b.ids(e), e.generation_tokens) for e in es))
    b.family(
        "request_success_total",
        "counter",
        [
            row
            for e in es
            for row in (
                (b.ids(e, ("finished_reason", "stop")), e.success_stop),
                (b.ids(e, ("finished_reason", "length")), e.success_length),
                (b.ids(e, ("finished_reason", "abort")), 0.0),
            )
        ],
    )
    for short in (
        "request_prompt_tokens",
        "request_generation_tokens",
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "request_time_per_output_token_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
        "request_inference_time_seconds",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
    ):
        b.histogram(short)
    b.lines += [
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
    ]
    for e in es:
        lb = (
            ("block_size", "16"),
            ("cache_dtype", "auto"),
            ("enable_prefix_caching", "True"),
            ("engine", e.engine),
            ("gpu_memory_utilization", "0.9"),
            ("num_gpu_blocks", str(e.num_gpu_blocks)),
        )
        b.lines.append(f"vllm:cache_config_info{_labels(lb)} 1.0")
    return "\n".join(b.lines) + "\n"


# ------------------------------------------------------------------------------------------- NCCL
def inspector_line(
    *,
    comm_id: str,
    comm_name: str,
    rank: int,
    n_ranks: int,
    nnodes: int,
    host: str,
    pid: int,
    dump_us: int,
    op: str,
    sn: int,
    msg_bytes: int,
    exec_us: float,
    algbw_gbs: float,
    busbw_gbs: float,
) -> str:
    """Note 3: one Inspector JSONL record (non-verbose) for the latest completed collective."""
    rec: dict[str, Any] = {
        "header": {"id": comm_id, "comm_name": comm_name, "rank": rank, "n_ranks": n_ranks, "nnodes": nnodes},
        "metadata": {
            "inspector_output_format_version": "v4.0",
            "git_rev": "v2.28.3-1",
            "rec_mechanism": "nccl_profiler_interface",
            "dump_timestamp_us": dump_us,
            "hostname": host,
            "pid": pid,
        },
        "coll_perf": {
            "coll": op,
            "coll_sn": sn,
            "coll_msg_size_bytes": msg_bytes,
            "coll_exec_time_us": round(exec_us, 3),
            "coll_timing_source": "kernel_gpu",
            "coll_algobw_gbs": round(algbw_gbs, 6),
            "coll_busbw_gbs": round(busbw_gbs, 6),
        },
    }
    return json.dumps(rec, separators=(",", ":"))


@dataclass(frozen=True)
class RequestSpan:
    """One served request's times (seconds, ns for the end) and tokens."""

    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    end_ns: int
    queue_s: float
    prefill_s: float
    kv_transfer_s: float
    ttft_s: float
    e2e_s: float
    input_tokens: int
    output_tokens: int


def _attr(key: str, value: float | int | str) -> dict[str, Any]:
    if isinstance(value, str):
        return {"key": key, "value": {"stringValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"doubleValue": value}}


def otlp_json_line(service: str, model: str, requests: Sequence[RequestSpan]) -> str:
    """Note 4: one export request holding ``requests``."""
    spans = []
    for r in requests:
        start = r.end_ns - round(r.e2e_s * 1e9)
        attrs: list[tuple[str, float | int | str]] = [
            ("gen_ai.response.model", model),
            ("gen_ai.request.id", f"cmpl-{r.span_id}"),
            ("gen_ai.usage.prompt_tokens", r.input_tokens),
            ("gen_ai.usage.completion_tokens", r.output_tokens),
            ("gen_ai.latency.time_in_queue", r.queue_s),
            ("gen_ai.latency.time_in_model_prefill", r.prefill_s),
            ("gen_ai.latency.kv_cache_transfer_time", r.kv_transfer_s),
            ("gen_ai.latency.time_to_first_token", r.ttft_s),
            ("gen_ai.latency.e2e", r.e2e_s),
        ]
        spans.append(
            {
                "traceId": r.trace_id,
                "spanId": r.span_id,
                "name": "llm_request",
                "kind": 2,
                "startTimeUnixNano": str(start),
                "endTimeUnixNano": str(r.end_ns),
                "attributes": [_attr(k, v) for k, v in attrs],
                "status": {},
            }
        )
    doc = {
        "resourceSpans": [
            {
                "resource": {"attributes": [_attr("service.name", service)]},
                "scopeSpans": [{"scope": {"name": "vllm.tracing"}, "spans": spans}],
            }
        ]
    }
    return json.dumps(doc, separators=(",", ":"))
