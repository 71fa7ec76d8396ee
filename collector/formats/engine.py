"""Serving-engine samples -> ``engine_samples`` and ``histogram_buckets`` rows (REFERENCE §2).

One set of canonical concepts for vLLM (current and retired names; Ray Serve's ``ray_vllm:``
re-export; NVIDIA NIM's bare names), SGLang (0.3-0.5), TRT-LLM (``trtllm_*`` and Dynamo's
``trtllm:*``), Dynamo (``dynamo_frontend_*``, ``dynamo_component_*``), Hugging Face TGI
(``tgi_*``) and Triton (``nv_inference_*``, its TRT-LLM backend's ``nv_trt_llm_*``).
:data:`collector.formats.engine_families.FAMILIES` is the one table of family -> concept.

Canonical concepts (``engine_samples.concept`` / ``histogram_buckets.concept``):

- Latency histograms, seconds: ``ttft_seconds``, ``itl_seconds`` (per engine step),
  ``tpot_seconds`` (per request), ``e2e_seconds``, ``queue_seconds``, ``prefill_seconds``,
  ``decode_seconds``, ``inference_seconds``, ``batch_step_seconds`` (TGI, one per forward
  pass, ``method`` kept), ``worker_request_seconds`` (Dynamo worker), ``kv_transfer_seconds``
  and ``kv_transfer_post_seconds`` (NIXL KV transfers). Buckets go to ``histogram_buckets``
  (``le`` in seconds, ``+inf`` last); ``<concept>_sum`` and ``<concept>_count`` go to
  ``engine_samples``. Triton's ``compute_input_seconds`` / ``compute_output_seconds`` have
  sums and counts only; ``<concept>_quantile`` (``quantile`` kept in labels) holds a real
  summary's quantiles.
- Size histograms (only ``_sum``/``_count`` kept): ``request_prompt_tokens``,
  ``request_generation_tokens``, ``kv_transfer_bytes``, ``kv_transfer_descriptors``.
- Gauges: ``requests_running``, ``requests_waiting``, ``requests_prefill``, ``requests_max``,
  ``kv_usage_ratio`` (0..1), ``kv_blocks_used``, ``kv_blocks_max``,
  ``prefix_cache_hit_ratio`` (0..1), ``generation_tokens_per_s``.
- Counters: ``preemptions_total``, ``prompt_tokens_total``, ``generation_tokens_total``,
  ``prefix_cache_hits_total``, ``prefix_cache_queries_total``, ``cached_tokens_total``,
  ``request_success_total`` (``finished_reason`` kept in ``labels``), ``requests_total``,
  ``requests_aborted_total``, ``request_failure_total``; vLLM's MFU estimates
  ``estimated_flops_total``, ``estimated_read_bytes_total``, ``estimated_write_bytes_total``
  (per GPU: their ``rate_per_s`` is achieved FLOP/s and HBM bytes/s); NIXL's
  ``kv_transfer_failures_total``, ``kv_transfer_failed_notifications_total``,
  ``kv_expired_requests_total``; SGLang's ``forward_busy_seconds_total`` (seconds the GPU runs
  forward passes, ``category`` kept: its rate is the share of time busy).

Rules:

1. The engine is known from the name: ``vllm:``/``ray_vllm:`` → vllm, ``sglang:`` → sglang,
   ``trtllm_``/``trtllm:`` → trtllm, ``dynamo_`` → dynamo, ``nv_inference_``/``nv_trt_llm_`` →
   triton, ``tgi_`` → tgi; a bare vLLM family name NIM exports (``num_requests_running``,
   ``time_to_first_token_seconds``, ...) → nim, only on a series with a ``model_name`` label.
   Samples of families not in :data:`FAMILIES` (``python_*``, ``process_*``, engine
   internals) are not stored, and ``*_created`` samples never are.
2. Identity columns: ``model`` from ``model_name`` (else ``model``; SGLang ≤ 0.3: ``name``);
   ``dp_rank`` from vLLM's ``engine`` label (its data-parallel index) or ``dp_rank``;
   ``tp_rank``, ``pp_rank``; ``ep_rank`` from ``moe_ep_rank`` or ``ep_rank``. A missing or
   non-integer rank, or one outside the store's 32-bit INTEGER, is -1 (the raw text then stays
   in ``labels``).
3. Every other label (except ``le``) goes to ``labels`` as JSON with sorted keys and no
   blanks; a series without other labels has ``labels = '{}'`` (never ``''``).
4. Triton's cumulative ``*_duration_us`` counters are seconds sums (×1e-6) and its
   ``*_histogram_ms`` buckets are converted to seconds (le ×1e-3, sum ×1e-3). Its
   ``nv_inference_request_success`` is stored as well as the ``_count`` of each of those sums
   (every request adds to each), so that a mean can be taken; its summaries' ``_sum`` and
   ``_count`` equal the counters and are not stored twice.
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
11. A family of ``LABELLED`` maps by one label's value (Triton's TRT-LLM backend:
    ``request_type="waiting"`` → requests_waiting, ``"scheduled"`` → requests_running,
    ``kv_cache_block_type="fraction"`` → kv_usage_ratio, ``disaggregated_serving_type=
    "kv_cache_transfer_ms"`` → kv_transfer_seconds_sum); other values are not stored.
12. A real summary (Triton's ``*_summary_us``) keeps its quantile series as
    ``<concept>_quantile`` in seconds.
12. SGLang ≤ 0.3 (a ``name`` label instead of ``model_name``): ``name`` is the model, its
    ``sglang:num_requests_running``/``_waiting`` and ``waiting_request_latency_seconds`` (queue
    time) are read, and its ``cache_hit_rate`` — a percentage then — is divided by 100.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from collector.errors import Problem, quote
from collector.formats import Parsed
from collector.formats import engine_families as _families
from collector.formats.engine_families import Concept
from collector.formats.exposition import Exposition, Sample, series_text
from collector.records import batch

FAMILIES, CONCEPTS, ENGINES = _families.FAMILIES, _families.CONCEPTS, _families.ENGINES
_RANKS = frozenset({"dp_rank", "tp_rank", "pp_rank", "moe_ep_rank", "ep_rank"})
_KV_MAX = 1.5
_INT32 = 2**31


def engine_of(name: str, labels: Mapping[str, str] | None = None) -> str:
    """Rule 1: the engine a metric name belongs to, or '' (``labels`` decide bare NIM names)."""
    return _families.canonical_name(name, labels)[0]


def family_of(name: str, labels: Mapping[str, str] | None = None) -> tuple[Concept, str] | None:
    """``(concept, suffix)`` of a sample name when its family is mapped (rules 1, 10)."""
    found = _mapped(name, labels)
    return None if not found else found[0]


def _mapped(name: str, labels: Mapping[str, str] | None) -> list[tuple[Concept, str]]:
    """Every ``(concept, suffix)`` one sample is stored under: its family's, then ALSO's."""
    _, canon = _families.canonical_name(name, labels)
    for suffix in _families.SUFFIXES:
        if suffix and not canon.endswith(suffix):
            continue
        base = canon[: len(canon) - len(suffix)] if suffix else canon
        found = FAMILIES.get(base)
        if found is None and base in _families.LABELLED and labels is not None:
            key, values = _families.LABELLED[base]
            found = values.get(labels.get(key, ""))
            if found is None:
                return []
        if found is not None:
            return [(found, suffix)] + [(extra, suffix) for extra in _families.ALSO.get(base, ())]
    return []


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
    more: tuple[_Series, ...] = ()  # the further concepts the same sample is stored under


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
        ts = self.ts_ns if sample.timestamp_ms is None else int(sample.timestamp_ms * 1_000_000)
        self.emit(series, sample, index, ts)
        for extra in series.more:
            self.emit(extra, sample, index, ts)

    def emit(self, series: _Series, sample: Sample, index: int, ts: int) -> None:
        """One row of ``sample`` as ``series`` maps it (rules 4-5)."""
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
        """Rules 1-5 and 10 for one series."""
        engine = engine_of(sample.name, sample.labels)
        mapped = _mapped(sample.name, sample.labels) if engine else []
        if not mapped:
            return _Series(sample.labels, False, "", (), 1.0, None, False)
        first, *rest = (self.one(engine, sample, concept, suffix) for concept, suffix in mapped)
        return first._replace(more=tuple(rest)) if rest else first

    def one(self, engine: str, sample: Sample, concept: Concept, suffix: str) -> _Series:
        name, factor = _concept_value(concept, suffix, 1.0, "quantile" in sample.labels)
        if name == "prefix_cache_hit_ratio" and _old_sglang_model(engine, sample.labels):
            factor *= 0.01  # rule 12: SGLang ≤ 0.3 printed a percentage
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


def _concept_value(
    concept: Concept, suffix: str, value: float, quantile: bool = False
) -> tuple[str | None, float]:
    """The concept name a sample is stored under and its scaled value (None: not stored)."""
    if concept.kind == "quantiles":  # rule 11
        if suffix == "" and quantile:
            return f"{concept.concept}_quantile", value * concept.scale
        return None, value
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
    model = labels.get("model_name") or labels.get("model", "") or _old_sglang_model(engine, labels)
    dp = _rank(labels, "engine") if engine == "vllm" else _rank(labels, "dp_rank")
    ep = _rank(labels, "moe_ep_rank") if "moe_ep_rank" in labels else _rank(labels, "ep_rank")
    return (model, dp, _rank(labels, "tp_rank"), _rank(labels, "pp_rank"), ep, _labels_json(labels, engine))


def _old_sglang_model(engine: str, labels: Mapping[str, str]) -> str:
    """Rule 2: SGLang ≤ 0.3 named the model in a ``name`` label."""
    if engine == "sglang" and "model_name" not in labels and "model" not in labels:
        return labels.get("name", "")
    return ""


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
    old_name = bool(_old_sglang_model(engine, labels))
    rest = {k: v for k, v in labels.items() if not _consumed(k, v, engine) and not (old_name and k == "name")}
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
