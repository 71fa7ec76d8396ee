"""Response models of the REST API (``/api/v1``): what each route promises, in units.

Field names carry their units as the store's columns do (``_ns``, ``_s``, ``_ratio``,
``_bytes_per_s``). Nested analyzer details that have their own documented shape in the analyzer
(thresholds, per-signal notes) are passed through as mappings.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _M(BaseModel):
    model_config = ConfigDict(extra="allow")


class Window(_M):
    start_ns: int
    end_ns: int
    seconds: float


class Layout(_M):
    tp: int
    pp: int
    dp: int
    ep: int


class DeploymentInfo(_M):
    name: str
    model: str
    gpu_type: str
    layout: Layout
    roles: dict[str, int]
    nodes: list[str]
    fabric: str
    origin: str = Field(description="'config' (declared) or 'inferred' (from labels)")
    engine_series: int
    gpus: int
    communicators: int
    inferred_from: list[str]


class Glance(_M):
    """The overview row: the zone and the numbers an SRE looks at first."""

    zone: str | None = None
    secondary: str | None = None
    confidence: float | None = None
    ttft_p99_s: float | None = Field(None, description="bucket estimate")
    itl_p99_s: float | None = Field(None, description="bucket estimate")
    kv_sequences_left: float | None = None
    cp: float | None = None
    stragglers: int | None = None
    error: str | None = None


class DeploymentRow(_M):
    deployment: DeploymentInfo
    glance: Glance | None = None


class DeploymentList(_M):
    window: Window | None
    deployments: list[DeploymentRow]


class Target(_M):
    target: str
    kind: str | None = None
    url: str | None = None
    host: str | None = None
    up: bool | None = None
    last_scrape_ns: int | None = None
    last_duration_s: float | None = None
    last_error: str | None = None
    samples_last: int | None = None
    dropped_last: int | None = None
    consecutive_failures: int | None = None
    updated_ns: int | None = None


class TargetList(_M):
    targets: list[Target]


class DeploymentDetail(_M):
    deployment: DeploymentInfo
    engine_keys: list[str]
    gpu_uuids: list[str]
    comm_ids: list[str]
    slo: dict[str, float | None]
    sources: list[Target] = Field(description="health of its engine targets and node sources")


class Evidence(_M):
    signal: str
    zone: str
    value: float | None
    unit: str
    compared_with: str
    threshold: float | None
    verdict: str = Field(description="pass | near | fail | n/a | info")
    source: str
    note: str


class Verdict(_M):
    deployment: str
    primary: str = Field(
        description="compute | hbm_bandwidth | kv_capacity | network | headroom | saturated | unknown"
    )
    secondary: str | None
    confidence: float
    scores: dict[str, float | None]
    evidence: list[Evidence]
    missing: list[str]
    notes: list[str]
    window: Window
    label: str = Field("", description='the verdict in words, e.g. "ambiguous: compute or hbm_bandwidth"')
    ambiguous: list[str] = Field([], description="zones in a near-tie with the primary (best first)")
    critical_path: dict[str, Any] = Field(
        {}, description="whether the network is in the critical path, why, and collective time shares"
    )


class CpFit(_M):
    cp: float | None = Field(description="crossover concurrency; None when not reached")
    cp_low: float | None
    cp_high: float | None
    p_reached: float
    reached: bool
    cp_lower_bound: float | None
    slope_before: float | None
    slope_after: float | None
    latency_knee: float | None
    max_concurrency: float
    points: int
    method: str


class Headroom(_M):
    kv_sequences_left: float | None
    hbm_bandwidth_left_ratio: float | None
    fabric_left_ratio: float | None
    ttft_slo_margin_s: float | None
    itl_slo_margin_s: float | None


class Regression(_M):
    deployment: str
    baseline: str = Field(description="baseline mode asked for (analysis setting regression_baseline)")
    baseline_window_ns: list[int]
    baseline_mode_used: str = Field("", description="mode whose window was compared with (after fallback)")
    fallback_reason: str | None = Field(None, description="why the asked mode could not serve (else null)")
    metrics: list[dict[str, Any]]
    axes: list[dict[str, Any]] = Field(
        description="per axis (load = arrival rate, context_length, kv_pressure, fabric_bytes, clocks, "
        "straggler_share): before, after, change_ratio, moved, change_point_ns, lead_s, source"
    )
    moved_first: str | None = Field(None, description="the moved axis whose change point led the latency's")
    change_point_ns: int | None = Field(None, description="the latency's change point")
    missing: list[str]


class LoadPoint(_M):
    concurrency: float
    tokens_per_s_per_gpu: float
    itl_p99_s: float | None = Field(None, description="ITL p99 in the bin (bucket estimate)")


class WindowLoadPoint(LoadPoint):
    bin_start_ns: int = Field(description="start of the bin (bins end-inclusive, rule 1 of api.service)")


class Envelope(_M):
    deployment: DeploymentInfo
    window: Window
    envelope: Verdict
    cp: CpFit
    headroom: Headroom
    regression: Regression
    load_curve: list[LoadPoint] = Field(description="per-bin points the Cp fit used (24 h history)")
    load_points: list[WindowLoadPoint] = Field(
        [],
        description="the window's load at chart resolution (complete bins only; warm-up bins left out)",
    )
    computed_at_s: float = Field(description="Unix time the analysis ran (results are cached briefly)")
    settings: dict[str, Any] = Field({}, description="every analysis setting in force for this answer")
    settings_from_request: list[str] = Field(
        [], description="the settings this request gave as query parameters (the rest: the server's)"
    )


class Quantile(_M):
    metric: str
    q: float
    value_s: float | None
    observations: float
    first_bucket_s: float | None
    at_floor: bool
    capped: bool
    estimate: str = Field(description="always 'bucket_interpolated': an estimate from histogram buckets")


class QuantilePoint(_M):
    concept: str
    bin: int
    bin_start_ns: int
    q: float
    value_s: float | None
    observations: float


class Latency(_M):
    deployment: str
    window: Window
    note: str
    quantiles: list[Quantile]
    bin_s: float
    span_s: float = Field(description="each series point covers the trailing span_s ending at its bin")
    series: list[QuantilePoint]
    computed_at_s: float = Field(description="Unix time the analysis ran (results are cached briefly)")


class PhaseQuantiles(_M):
    phase: str = Field(description="ttft_s, queue_s, prefill_s, kv_transfer_s, decode_s or e2e_s")
    count: int = Field(description="requests (spans) or histogram observations behind the quantiles")
    mean_s: float | None = Field(description="mean over the spans (null for histogram estimates)")
    quantiles_s: dict[str, float | None] = Field(description="p50, p90, p99 in seconds")
    source: str = Field(description="'spans' or 'histogram_buckets'")
    estimate: str = Field(
        description="'exact_over_observed_requests' (spans) or 'bucket_interpolated' (histogram estimate)"
    )


class TtftPart(_M):
    mean_s: float
    share: float = Field(description="mean of this part / mean TTFT (1 for ttft itself)")
    p99_s: float | None = Field(None, description="TTFT p99 over the same spans (ttft row only)")


class Phases(_M):
    deployment: str
    window: Window
    requests: int = Field(description="request spans of the deployment that ended in the window")
    phases: list[PhaseQuantiles]
    ttft_decomposition: dict[str, TtftPart] = Field(
        description="from spans only: queue, prefill, kv_transfer (parts a span carries), other, ttft; "
        "empty without enough spans"
    )
    kv_transfer_share_of_ttft: float | None = Field(
        description="KV-transfer share of mean TTFT (disaggregated prefill/decode: network-wall evidence)"
    )
    note: str
    computed_at_s: float = Field(description="Unix time the analysis ran (results are cached briefly)")


class SeriesPoint(_M):
    metric: str
    bin_start_ns: int
    mean: float | None
    min: float | None
    max: float | None


class GpuSeries(_M):
    deployment: str
    window: Window
    bin_s: float
    source: str = Field(description="gpu_samples (raw) or gpu_samples_1m (rollups, long windows)")
    gpus: int
    series: list[SeriesPoint] = Field(description="mean/min/max over the deployment's GPUs per bin")


class FabricSeries(_M):
    deployment: str
    window: Window
    bin_s: float
    links: list[SeriesPoint] = Field(description="NVLink/PCIe bytes/s per GPU")
    ports: list[SeriesPoint] = Field(description="InfiniBand/RoCE tx/rx bytes/s summed over a node's ports")


class Collectives(_M):
    deployment: str
    window: Window
    records: int
    summary: list[dict[str, Any]]


class HeatCell(_M):
    origin: str
    window_start_ns: int = Field(description="start of the slice on the records' clock, ns")
    rank: int
    share: float = Field(description="share of the slice's blame carried by this rank, 0..1")
    blame_us: float


class Stragglers(_M):
    deployment: str
    window: Window
    thresholds: dict[str, Any]
    stragglers: list[dict[str, Any]]
    heatmap: list[HeatCell]


class Plan(_M):
    deployment: str
    model: str
    gpu: str
    gpus: int
    nodes: int
    fabric: str
    workload: dict[str, Any]
    candidates: list[dict[str, Any]]
    current: dict[str, Any]
    change: str


class QueryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sql: str = Field(min_length=1, max_length=20_000, description="one SELECT over the store's tables")
    max_rows: int = Field(default=1000, ge=1, le=10_000)
    timeout_s: float = Field(default=5.0, gt=0, le=30)


class QueryResult(_M):
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    truncated: bool = Field(description="true when max_rows rows came back (more may exist)")


class TableInfo(_M):
    name: str
    doc: str
    columns: dict[str, str]
    key: list[str]


class Problem(BaseModel):
    detail: Any
