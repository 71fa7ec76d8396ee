"""Serving-engine samples -> ``engine_samples`` and ``histogram_buckets`` rows (REFERENCE §2).

One set of canonical concepts for vLLM (current and retired names), SGLang, TRT-LLM
(``trtllm_*``), Dynamo (``dynamo_frontend_*``, ``dynamo_component_*``) and Triton
(``nv_inference_*``). :data:`FAMILIES` is the one table of engine family -> concept.

Canonical concepts (``engine_samples.concept`` / ``histogram_buckets.concept``):

- Latency histograms, seconds: ``ttft_seconds``, ``itl_seconds`` (per engine step),
  ``tpot_seconds`` (per request), ``e2e_seconds``, ``queue_seconds``, ``prefill_seconds``,
  ``decode_seconds``, ``inference_seconds``. Buckets go to ``histogram_buckets`` (``le`` in
  seconds, ``+inf`` last); ``<concept>_sum`` and ``<concept>_count`` go to ``engine_samples``.
- Size histograms (only ``_sum``/``_count`` kept): ``request_prompt_tokens``,
  ``request_generation_tokens``.
- Gauges: ``requests_running``, ``requests_waiting``, ``kv_usage_ratio`` (0..1),
  ``prefix_cache_hit_ratio`` (0..1), ``generation_tokens_per_s``.
- Counters: ``preemptions_total``, ``prompt_tokens_total``, ``generation_tokens_total``,
  ``prefix_cache_hits_total``, ``prefix_cache_queries_total``, ``cached_tokens_total``,
  ``request_success_total`` (``finished_reason`` kept in ``labels``), ``requests_total``,
  ``requests_aborted_total``, ``request_failure_total``.

Rules:

1. The engine is known from the name: ``vllm:`` → vllm, ``sglang:`` → sglang, ``trtllm_`` →
   trtllm, ``dynamo_`` → dynamo, ``nv_inference_`` → triton. Samples of families not in
   :data:`FAMILIES` (``python_*``, ``process_*``, engine internals) are not stored, and
   ``*_created`` samples never are.
2. Identity columns: ``model`` from ``model_name`` (else ``model``); ``dp_rank`` from vLLM's
   ``engine`` label (its data-parallel index) or ``dp_rank``; ``tp_rank``, ``pp_rank``;
   ``ep_rank`` from ``moe_ep_rank`` or ``ep_rank``. A missing or non-integer rank, or one
   outside the store's 32-bit INTEGER, is -1 (the raw text then stays in ``labels``).
3. Every other label (except ``le``) goes to ``labels`` as JSON with sorted keys and no
   blanks; a series without other labels has ``labels = '{}'`` (never ``''``).
4. Triton's cumulative ``*_duration_us`` counters are seconds sums (×1e-6) and its
   ``*_histogram_ms`` buckets are converted to seconds (le ×1e-3, sum ×1e-3).
5. KV-usage gauges are 0..1 fractions in every engine despite names like ``_perc``; a value
   outside [0, 1.5] is refused as a Problem rather than rescaled silently.
6. Non-finite values (NaN, ±Inf) of mapped series are dropped and counted in one Problem.
   (``le="+Inf"`` is a label, not a value, and is kept as ``+inf``.)
7. ``rate_per_s`` is left NULL: :class:`collector.rates.CounterRates` fills it statefully.
8. A sample's own timestamp wins over ``ts_ns``.
9. ``memo`` (optional, one per scrape target): how a series maps (table, identity columns,
   value factor, ``le``) is worked out once per metric name and label mapping and reused
   while the parser hands out the same mapping (see
   :class:`collector.formats.exposition.ParseCache`). Rows are identical with or without it.
10. A negative bucket count, histogram ``_sum``/``_count`` or ``*_total`` counter is refused
    as a Problem (counters never go below zero; a rate from one would be bogus).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from collector.errors import Problem, quote
from collector.formats import Parsed
from collector.formats.exposition import Exposition, Sample, series_text
from collector.records import batch


class Concept(NamedTuple):
    """Where one engine family goes: concept name, kind, scale of values, scale of ``le``."""

    concept: str
    kind: str  # 'gauge' | 'counter' | 'histogram' (buckets kept) | 'summary' (sum/count only)
    scale: float = 1.0
    le_scale: float = 1.0


def _hist(concept: str, scale: float = 1.0) -> Concept:
    return Concept(concept, "histogram", scale, scale)


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

FAMILIES: dict[str, Concept] = {
    # vLLM 0.33 (and retired names still met in the field)
    **{f"vllm:{k}": _hist(v) for k, v in _LATENCY.items()},
    "vllm:time_per_output_token_seconds": _hist("itl_seconds"),  # retired name of ITL
    "vllm:num_requests_running": Concept("requests_running", "gauge"),
    "vllm:num_requests_waiting": Concept("requests_waiting", "gauge"),
    "vllm:kv_cache_usage_perc": Concept("kv_usage_ratio", "gauge"),
    "vllm:gpu_cache_usage_perc": Concept("kv_usage_ratio", "gauge"),  # retired
    "vllm:gpu_prefix_cache_hit_rate": Concept("prefix_cache_hit_ratio", "gauge"),  # retired
    "vllm:num_preemptions": Concept("preemptions_total", "counter"),
    "vllm:prompt_tokens": Concept("prompt_tokens_total", "counter"),
    "vllm:generation_tokens": Concept("generation_tokens_total", "counter"),
    "vllm:prefix_cache_hits": Concept("prefix_cache_hits_total", "counter"),
    "vllm:prefix_cache_queries": Concept("prefix_cache_queries_total", "counter"),
    "vllm:gpu_prefix_cache_hits": Concept("prefix_cache_hits_total", "counter"),  # retired
    "vllm:gpu_prefix_cache_queries": Concept("prefix_cache_queries_total", "counter"),  # retired
    "vllm:prompt_tokens_cached": Concept("cached_tokens_total", "counter"),
    "vllm:request_success": Concept("request_success_total", "counter"),
    "vllm:request_prompt_tokens": Concept("request_prompt_tokens", "summary"),
    "vllm:request_generation_tokens": Concept("request_generation_tokens", "summary"),
    # SGLang 0.5
    "sglang:time_to_first_token_seconds": _hist("ttft_seconds"),
    "sglang:inter_token_latency_seconds": _hist("itl_seconds"),
    "sglang:request_time_per_output_token_seconds": _hist("tpot_seconds"),
    "sglang:e2e_request_latency_seconds": _hist("e2e_seconds"),
    "sglang:queue_time_seconds": _hist("queue_seconds"),
    "sglang:num_running_reqs": Concept("requests_running", "gauge"),
    "sglang:num_queue_reqs": Concept("requests_waiting", "gauge"),
    "sglang:token_usage": Concept("kv_usage_ratio", "gauge"),
    "sglang:cache_hit_rate": Concept("prefix_cache_hit_ratio", "gauge"),
    "sglang:gen_throughput": Concept("generation_tokens_per_s", "gauge"),
    "sglang:num_retracted_requests": Concept("preemptions_total", "counter"),
    "sglang:prompt_tokens": Concept("prompt_tokens_total", "counter"),
    "sglang:generation_tokens": Concept("generation_tokens_total", "counter"),
    "sglang:cached_tokens": Concept("cached_tokens_total", "counter"),
    "sglang:num_requests": Concept("requests_total", "counter"),
    "sglang:num_aborted_requests": Concept("requests_aborted_total", "counter"),
    "sglang:prompt_tokens_histogram": Concept("request_prompt_tokens", "summary"),
    "sglang:generation_tokens_histogram": Concept("request_generation_tokens", "summary"),
    # TensorRT-LLM (trtllm-serve /prometheus/metrics)
    "trtllm_time_to_first_token_seconds": _hist("ttft_seconds"),
    "trtllm_time_per_output_token_seconds": _hist("tpot_seconds"),
    "trtllm_e2e_request_latency_seconds": _hist("e2e_seconds"),
    "trtllm_request_queue_time_seconds": _hist("queue_seconds"),
    "trtllm_request_prefill_time_seconds": _hist("prefill_seconds"),
    "trtllm_request_decode_time_seconds": _hist("decode_seconds"),
    "trtllm_num_requests_running": Concept("requests_running", "gauge"),
    "trtllm_num_requests_waiting": Concept("requests_waiting", "gauge"),
    "trtllm_kv_cache_utilization": Concept("kv_usage_ratio", "gauge"),
    "trtllm_kv_cache_hit_rate": Concept("prefix_cache_hit_ratio", "gauge"),
    "trtllm_prompt_tokens": Concept("prompt_tokens_total", "counter"),
    "trtllm_generation_tokens": Concept("generation_tokens_total", "counter"),
    "trtllm_request_success": Concept("request_success_total", "counter"),
    # Dynamo
    "dynamo_frontend_time_to_first_token_seconds": _hist("ttft_seconds"),
    "dynamo_frontend_inter_token_latency_seconds": _hist("itl_seconds"),
    "dynamo_frontend_request_duration_seconds": _hist("e2e_seconds"),
    "dynamo_frontend_inflight_requests": Concept("requests_running", "gauge"),
    "dynamo_frontend_queued_requests": Concept("requests_waiting", "gauge"),
    "dynamo_frontend_requests": Concept("requests_total", "counter"),
    "dynamo_component_gpu_cache_usage_percent": Concept("kv_usage_ratio", "gauge"),
    # Triton (rule 4)
    "nv_inference_request_success": Concept("request_success_total", "counter"),
    "nv_inference_request_failure": Concept("request_failure_total", "counter"),
    "nv_inference_pending_request_count": Concept("requests_waiting", "gauge"),
    "nv_inference_request_duration_us": Concept("e2e_seconds_sum", "counter", 1e-6),
    "nv_inference_queue_duration_us": Concept("queue_seconds_sum", "counter", 1e-6),
    "nv_inference_compute_infer_duration_us": Concept("inference_seconds_sum", "counter", 1e-6),
    "nv_inference_first_response_histogram_ms": _hist("ttft_seconds", 1e-3),
}

CONCEPTS: tuple[str, ...] = tuple(dict.fromkeys(c.concept for c in FAMILIES.values()))
ENGINES = {
    "vllm:": "vllm",
    "sglang:": "sglang",
    "trtllm_": "trtllm",
    "dynamo_": "dynamo",
    "nv_inference_": "triton",
}
_RANKS = frozenset({"dp_rank", "tp_rank", "pp_rank", "moe_ep_rank", "ep_rank"})
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "")
_KV_MAX = 1.5
_INT32 = 2**31


def engine_of(name: str) -> str:
    """Rule 1: the engine a metric name belongs to, or ''."""
    for prefix, engine in ENGINES.items():
        if name.startswith(prefix):
            return engine
    return ""


def family_of(name: str) -> tuple[Concept, str] | None:
    """``(concept, suffix)`` of a sample name when its family is mapped (rule 1)."""
    for suffix in _SUFFIXES:
        if suffix and not name.endswith(suffix):
            continue
        found = FAMILIES.get(name[: len(name) - len(suffix)] if suffix else name)
        if found is not None:
            return found, suffix
    return None


def to_engine_samples(
    exp: Exposition,
    *,
    ts_ns: int,
    source: str = "",
    memo: EngineMemo | None = None,
    trace: dict[str, list[tuple[int, float, bool]]] | None = None,
) -> Parsed:
    """``engine_samples`` and ``histogram_buckets`` rows for the engine samples of ``exp``.

    ``trace``, when given, receives per table one ``(sample index, factor, is KV usage)`` per
    row, in row order (scrape rule 6)."""
    out = _Rows(source or exp.source, ts_ns, {} if memo is None else memo)
    for index, sample in enumerate(exp.samples):
        out.add(sample, index)
    if trace is not None:
        trace["engine_samples"] = out.trace_samples
        trace["histogram_buckets"] = out.trace_buckets
    return out.parsed()


class _Series(NamedTuple):
    """How one series maps (rule 9); ``labels`` is kept to check the memo's hit."""

    labels: Mapping[str, str]
    mapped: bool  # a family of FAMILIES (rule 1)
    table: str  # 'samples', 'buckets' or '' (mapped but not stored, e.g. a summary's quantiles)
    ident: tuple[Any, ...]  # _ID_COLUMNS without ts_ns
    factor: float  # stored value = value × factor
    le: float | None  # buckets only; None: the le label is not a number
    kv: bool  # a KV-usage gauge (rule 5)


EngineMemo = dict[tuple[str, int, str], _Series]


class _Rows:
    """Column lists of the two tables being built, plus the refused samples."""

    def __init__(self, source: str, ts_ns: int, memo: EngineMemo) -> None:
        self.source = source
        self.ts_ns = ts_ns
        self.memo = memo
        self.samples: list[tuple[Any, ...]] = []
        self.buckets: list[tuple[Any, ...]] = []
        self.problems: list[Problem] = []
        self.non_finite = 0
        # identity columns per (engine, label mapping): the parser shares one mapping among
        # the samples of a body with equal labels, so this is computed once per label set
        self.identities: dict[tuple[str, int], tuple[Any, ...]] = {}
        self.trace_samples: list[tuple[int, float, bool]] = []
        self.trace_buckets: list[tuple[int, float, bool]] = []

    def add(self, sample: Sample, index: int = -1) -> None:
        series = self.series(sample)
        if not series.mapped:
            return
        if not math.isfinite(sample.value):
            self.non_finite += 1
            return
        if not series.table:
            return
        value = sample.value * series.factor
        if series.kv and not 0.0 <= value <= _KV_MAX:
            self.problems.append(Problem(sample.name, f"KV usage {value} outside 0..1 (rule 5)"))
            return
        if value < 0 and is_cumulative(series.table, series.ident):
            where = series_text(sample)
            self.problems.append(Problem(where, f"field value: counter is negative ({value:g}) (rule 10)"))
            return
        ts = self.ts_ns if sample.timestamp_ms is None else int(sample.timestamp_ms * 1_000_000)
        if series.table == "samples":
            self.samples.append((ts, *series.ident, value, None))
            self.trace_samples.append((index, series.factor, series.kv))
        elif series.le is None:
            where = f"{sample.name}{{le={quote(sample.labels.get('le', ''))}}}"
            self.problems.append(Problem(where, "bucket without a numeric le"))
        else:
            self.buckets.append((ts, *series.ident, series.le, value))
            self.trace_buckets.append((index, series.factor, False))

    def series(self, sample: Sample) -> _Series:
        """Rule 9: the memo's mapping of this series, worked out on a miss."""
        key = (sample.name, id(sample.labels), self.source)
        found = self.memo.get(key)
        if found is None or found.labels is not sample.labels:
            found = self.memo[key] = self.new_series(sample)
        return found

    def new_series(self, sample: Sample) -> _Series:
        """Rules 1-5 for one series."""
        engine = engine_of(sample.name)
        mapped = family_of(sample.name) if engine else None
        if mapped is None:
            return _Series(sample.labels, False, "", (), 1.0, None, False)
        concept, suffix = mapped
        name, factor = _concept_value(concept, suffix, 1.0)
        if name is None:
            return _Series(sample.labels, True, "", (), 1.0, None, False)
        table = "buckets" if suffix == "_bucket" else "samples"
        le = _le(sample.labels.get("le", ""), concept.le_scale) if table == "buckets" else None
        key = (engine, id(sample.labels))
        ranks = self.identities.get(key)
        if ranks is None:
            ranks = self.identities[key] = _identity(engine, sample.labels)
        ident = (self.source, engine, *ranks[:5], name, ranks[5])
        return _Series(sample.labels, True, table, ident, factor, le, name == "kv_usage_ratio")

    def parsed(self) -> Parsed:
        result = Parsed(problems=self.problems)
        result.add("engine_samples", batch("engine_samples", _columns(_SAMPLE_COLUMNS, self.samples)))
        result.add("histogram_buckets", batch("histogram_buckets", _columns(_BUCKET_COLUMNS, self.buckets)))
        if self.non_finite:
            result.problems.append(
                Problem("engine", f"{self.non_finite} non-finite value(s) dropped (rule 6)")
            )
        return result


_ID_COLUMNS = (
    "ts_ns",
    "source",
    "engine",
    "model",
    "dp_rank",
    "tp_rank",
    "pp_rank",
    "ep_rank",
    "concept",
    "labels",
)
_SAMPLE_COLUMNS = (*_ID_COLUMNS, "value", "rate_per_s")
_BUCKET_COLUMNS = (*_ID_COLUMNS, "le", "cumulative_count")


def _concept_value(concept: Concept, suffix: str, value: float) -> tuple[str | None, float]:
    """The concept name a sample is stored under and its scaled value (None: not stored)."""
    if concept.kind in ("histogram", "summary"):
        if suffix == "_sum":
            return f"{concept.concept}_sum", value * concept.scale
        if suffix == "_count":
            return f"{concept.concept}_count", value
        if suffix == "_bucket" and concept.kind == "histogram":
            return concept.concept, value
        return None, value
    if suffix in ("_bucket", "_sum", "_count"):
        return None, value
    return concept.concept, value * concept.scale


def _columns(names: tuple[str, ...], rows: list[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """Row tuples -> column lists (one C-level transpose)."""
    if not rows:
        return {name: [] for name in names}
    return dict(zip(names, map(list, zip(*rows, strict=True)), strict=True))


def _identity(engine: str, labels: Mapping[str, str]) -> tuple[Any, ...]:
    """Rule 2-3: ``(model, dp, tp, pp, ep, labels JSON)`` of one label set."""
    model = labels.get("model_name") or labels.get("model", "")
    dp = _rank(labels, "engine") if engine == "vllm" else _rank(labels, "dp_rank")
    ep = _rank(labels, "moe_ep_rank") if "moe_ep_rank" in labels else _rank(labels, "ep_rank")
    return (model, dp, _rank(labels, "tp_rank"), _rank(labels, "pp_rank"), ep, _labels_json(labels, engine))


def _rank(labels: Mapping[str, str], key: str) -> int:
    try:
        rank = int(labels.get(key, ""))
    except ValueError:
        return -1
    return rank if -_INT32 <= rank < _INT32 else -1  # rule 2: out of the store's INTEGER range


def is_cumulative(table: str, ident: tuple[Any, ...]) -> bool:
    """Rule 10: a bucket count, a histogram's ``_sum``/``_count`` or a ``*_total`` counter."""
    return table == "buckets" or str(ident[7]).endswith(("_total", "_sum", "_count"))


def _labels_json(labels: Mapping[str, str], engine: str) -> str:
    """Rule 3: labels not consumed by an identity column, as sorted compact JSON."""
    rest = {k: v for k, v in labels.items() if not _consumed(k, v, engine)}
    return json.dumps(rest, sort_keys=True, separators=(",", ":"))


def _consumed(key: str, value: str, engine: str) -> bool:
    """Rule 2: a label that became an identity column (a rank only when it is an integer)."""
    if key in ("model_name", "model", "le"):
        return True
    if key in _RANKS or (key == "engine" and engine == "vllm"):
        return value == "-1" or (value.lstrip("-").isdigit() and _rank({key: value}, key) != -1)
    return False


def _le(text: str, scale: float) -> float | None:
    try:
        bound = float(text)
    except ValueError:
        return None
    return bound * scale if math.isfinite(bound) else bound
