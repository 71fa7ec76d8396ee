"""Every threshold the envelope, crossover and regression analyses compare a signal with.

One pydantic object, built once and passed in (no module-level mutable state). Each field says
what it is compared with and where the number comes from; an SRE who disagrees changes one
field, and every verdict's evidence quotes the value that was in force.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Thresholds(BaseModel):
    """Thresholds for zones, network signals, Cp and regressions (units in the names)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # -- compute zone (REFERENCE §1: tensor ≥ 0.5 and SM ≥ 0.6-0.8) -----------------------------
    compute_tensor_min_ratio: float = Field(
        default=0.5, ge=0, le=1, description="PIPE_TENSOR_ACTIVE at or above"
    )
    compute_sm_min_ratio: float = Field(default=0.6, ge=0, le=1, description="SM_ACTIVE at or above")
    # -- HBM bandwidth zone (REFERENCE §1: DRAM_ACTIVE ≥ 0.5 and ≥ SM_ACTIVE, tensor low) -------
    hbm_dram_min_ratio: float = Field(default=0.5, ge=0, le=1, description="DRAM_ACTIVE at or above")
    # REFERENCE §1's prose asks DRAM ≥ SM; a real H100 says otherwise (tests/data/h100_nvml): a
    # pure HBM-bound 2 GiB copy at 3.02 TB/s read DRAM 0.90 / SM 0.99 = 0.90, because SM_ACTIVE
    # counts warps stalled on memory; a BF16 GEMM read 0.26 / 0.96 = 0.27. 0.8 separates them.
    hbm_dram_over_sm_min_ratio: float = Field(
        default=0.8, ge=0, description="DRAM_ACTIVE / SM_ACTIVE at or above"
    )
    hbm_tensor_max_ratio: float = Field(default=0.5, ge=0, le=1, description="tensor activity below (decode)")
    # -- KV capacity zone (REFERENCE §6: KV full, preemptions, queue grows, TTFT = queue time) -----
    kv_usage_min_ratio: float = Field(default=0.9, ge=0, le=1, description="engine KV usage at or above")
    kv_preemptions_min_per_s: float = Field(default=0.01, ge=0, description="preemption rate above")
    kv_waiting_min_ratio: float = Field(default=0.5, ge=0, description="waiting / running at or above")
    kv_queue_share_min_ratio: float = Field(
        default=0.5, ge=0, le=1, description="queue time / TTFT at or above"
    )
    # vLLM admits a waiting request only when its prompt's blocks can be allocated: with long
    # contexts a pool 85 % used can hold no further sequence of the running ones' size
    kv_free_sequences_max: float = Field(
        default=1.0, ge=0, description="average running sequences that fit in the free KV pool, below"
    )
    # -- network zone (REFERENCE §6 and the four signals of seed §16) -----------------------------
    net_collective_share_min_ratio: float = Field(
        default=0.25, ge=0, le=1, description="exposed collective time / wall time at or above"
    )
    net_busbw_max_ratio: float = Field(default=0.5, ge=0, le=1, description="busbw / capability at or below")
    net_unsaturated_max_ratio: float = Field(
        default=0.5, ge=0, le=1, description="GPUs count as unsaturated when SM and DRAM activity are below"
    )
    net_latency_slope_min: float = Field(
        default=0.5, ge=0, description="d log ITL p99 / d log concurrency at or above (while unsaturated)"
    )
    net_gap_widening_min_ratio: float = Field(
        default=1.5, ge=1, description="(p99/p50 − 1) at high load ÷ at low load, at or above"
    )
    net_throughput_elasticity_max: float = Field(
        default=0.6, ge=0, le=1, description="d log tokens/s / d log concurrency below (sublinear)"
    )
    net_decode_stall_min_ratio: float = Field(default=3.0, ge=1, description="ITL p99 / ITL p50 at or above")
    net_model_excess_min_ratio: float = Field(
        default=1.5, ge=1, description="measured / model-expected ITL at or above (with GPUs unsaturated)"
    )
    net_min_load_spread_ratio: float = Field(
        default=1.3, ge=1, description="max/min binned concurrency needed before slopes are judged"
    )
    net_single_domain_excess_min_ratio: float = Field(
        default=1.5,
        ge=1,
        description="measured ITL ÷ the model's ITL with the group inside one NVLink domain, at or above",
    )
    net_change_weight: float = Field(
        default=0.3,
        ge=0,
        le=1,
        description="weight of the change-with-load checks in the network score (level checks: the rest)",
    )
    net_link_busy_min_ratio: float = Field(
        default=0.7,
        ge=0,
        le=1,
        description="IB/RoCE port transmit bytes/s ÷ link rate at or above (a busy link)",
    )
    pd_wait_share_min_ratio: float = Field(
        default=0.5, ge=0, le=1, description="P/D: waiting share of TTFT at or above (KV-transfer wait)"
    )
    pd_kv_transfer_share_min_ratio: float = Field(
        default=0.3, ge=0, le=1, description="P/D: KV-transfer share of TTFT from spans at or above"
    )
    # -- verdict ----------------------------------------------------------------------------------
    near_fraction: float = Field(
        default=0.85, gt=0, le=1, description="a value within this fraction counts half"
    )
    zone_min_score: float = Field(
        default=0.6, ge=0, le=1, description="a zone is primary at or above this score"
    )
    secondary_min_score: float = Field(
        default=0.4, ge=0, le=1, description="secondary zone at or above this score"
    )
    zone_min_checks: int = Field(
        default=2, ge=1, description="judged checks a zone needs before it gets a score"
    )
    zone_tie_margin: float = Field(
        default=0.1, ge=0, le=1, description="scores this close are a near-tie, reported as ambiguous"
    )
    ramp_min_ratio: float = Field(
        default=2.0,
        ge=1,
        description="a window is a ramp when its last quarter runs this many times its first quarter's load",
    )
    confidence_penalty_no_dcgm: float = Field(default=0.35, ge=0, le=1)
    confidence_penalty_no_collectives: float = Field(default=0.15, ge=0, le=1)
    confidence_penalty_no_histograms: float = Field(default=0.2, ge=0, le=1)
    confidence_penalty_no_engine: float = Field(default=0.35, ge=0, le=1)
    # a bin shorter than the 1 s scrape holds no sample; a day is the longest history bin
    bin_s: float = Field(
        default=60.0, ge=1, le=86400, description="time bin for slopes and trends inside a window, seconds"
    )
    counter_lookback_s: float = Field(
        default=120.0, gt=0, description="how far before a window to find a counter base"
    )
    # -- crossover (Cp) ---------------------------------------------------------------------------
    cp_knee_elasticity_max: float = Field(
        default=0.35,
        ge=0,
        le=1,
        description="past Cp: doubling concurrency adds under 2^0.35−1 ≈ 27 % throughput",
    )
    cp_bootstrap_rounds: int = Field(default=200, ge=10, le=5000)
    cp_ttft_explosion_min_elasticity: float = Field(
        default=1.5, ge=1, description="TTFT grows faster than concurrency^this: queueing, not prefill work"
    )
    # -- regressions ------------------------------------------------------------------------------
    regression_min_ratio: float = Field(default=1.25, ge=1, description="p99 now / p99 baseline at or above")
    regression_axis_min_change_ratio: float = Field(
        default=0.2, ge=0, description="an axis 'moved' when it changed by at least this fraction"
    )
    regression_baseline: str = Field(
        default="day_before",
        pattern="^(day_before|trailing_7d|previous_window|reference)$",
        description="what p99 now is compared with; 'reference' = the pinned window below",
    )
    regression_reference_start_s: float | None = Field(
        default=None,
        ge=0,
        le=4102444800,
        description="pinned baseline window start, Unix seconds ('reference' mode)",
    )
    regression_reference_end_s: float | None = Field(
        default=None,
        ge=0,
        le=4102444800,
        description="pinned baseline window end, Unix seconds ('reference' mode)",
    )
    regression_baseline_min_coverage_ratio: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="share of the baseline window the deployment's history must cover, else fall back",
    )

    @model_validator(mode="after")
    def _reference_window(self) -> Thresholds:
        """'reference' mode needs both ends of its window, end after start; the ends alone are refused
        (a pinned window that is silently ignored would be a baseline nobody compares with)."""
        start, end = self.regression_reference_start_s, self.regression_reference_end_s
        if self.regression_baseline == "reference":
            if start is None or end is None:
                raise ValueError(
                    "regression_baseline 'reference' needs regression_reference_start_s and "
                    "regression_reference_end_s (Unix seconds)"
                )
            if end <= start:
                raise ValueError(
                    f"regression_reference_end_s ({end}) must be after regression_reference_start_s ({start})"
                )
        elif start is not None or end is not None:
            raise ValueError(
                "regression_reference_start_s/_end_s are set but regression_baseline is "
                f"{self.regression_baseline!r}: set regression_baseline: reference to use them"
            )
        return self
