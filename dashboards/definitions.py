"""IOE's four Grafana dashboards, as data: fleet overview, deployment drill-down, GPU and fabric, collectives.

Panels read IOE's own verdict series (docs/metrics.md) and the raw dcgm-exporter (``DCGM_FI_*``),
node_exporter InfiniBand and engine series (vLLM ``vllm:*``, SGLang ``sglang:*``, TRT-LLM ``trtllm_*``;
REFERENCE §2).

Notes (the label contract, also in dashboards/README.md):
1. ``deployment`` on engine series is a target label set at scrape time (ServiceMonitor relabeling from the
   pod label ``ioe.dev/deployment``, or a static label); IOE's series carry it themselves.
2. ``host`` on dcgm-exporter and node_exporter series is set at scrape time (copied from ``Hostname`` /
   ``hostname``, or the node name); ``gpu`` is dcgm-exporter's GPU index.
3. Each engine kind gets its own target in latency panels, so a wrong metric name shows as an empty target
   instead of hiding behind another engine's data. Quantiles from buckets are interpolated estimates.
4. Capability lines: NVLink 4 (H100/H200) 450 GB/s per direction per GPU, PCIe Gen5 x16 64 GB/s per
   direction, InfiniBand NDR 50 GB/s per port (REFERENCE §5). Other hardware: read IOE's busbw ratio panel.
"""

from __future__ import annotations

from typing import Any

from dashboards.grafana_model import Panel, Target, Variable, dashboard

BY = "by (cluster, namespace, deployment)"  # one deployment name may live in several clusters
BY_ZONE = "by (cluster, namespace, deployment, zone)"
DEP = 'deployment=~"$deployment"'
GPU = 'host=~"$host", gpu=~"$gpu"'
RATE = "$__rate_interval"

TTFT = {
    "vLLM": "vllm:time_to_first_token_seconds",
    "SGLang": "sglang:time_to_first_token_seconds",
    "TRT-LLM": "trtllm_time_to_first_token_seconds",
}
ITL = {
    "vLLM": "vllm:inter_token_latency_seconds",
    "SGLang": "sglang:inter_token_latency_seconds",
    "TRT-LLM TPOT": "trtllm_time_per_output_token_seconds",
}
QUEUE = {
    "vLLM": "vllm:request_queue_time_seconds",
    "SGLang": "sglang:queue_time_seconds",
    "TRT-LLM": "trtllm_request_queue_time_seconds",
}
PREFILL = {"vLLM": "vllm:request_prefill_time_seconds", "TRT-LLM": "trtllm_request_prefill_time_seconds"}
DECODE = {"vLLM": "vllm:request_decode_time_seconds", "TRT-LLM": "trtllm_request_decode_time_seconds"}
RUNNING = {
    "vLLM": "vllm:num_requests_running",
    "SGLang": "sglang:num_running_reqs",
    "TRT-LLM": "trtllm_num_requests_running",
}
WAITING = {
    "vLLM": "vllm:num_requests_waiting",
    "SGLang": "sglang:num_queue_reqs",
    "TRT-LLM": "trtllm_num_requests_waiting",
}
KV_USAGE = {
    "vLLM": "vllm:kv_cache_usage_perc",
    "SGLang": "sglang:token_usage",
    "TRT-LLM": "trtllm_kv_cache_utilization",
}
GEN_TOKENS = {
    "vLLM": "vllm:generation_tokens_total",
    "SGLang": "sglang:generation_tokens_total",
    "TRT-LLM": "trtllm_generation_tokens_total",
}

DEPLOYMENT_VAR = Variable("deployment", "Deployment", "label_values(ioe_deployment_zone, deployment)")
HOST_VAR = Variable("host", "Host", "label_values(DCGM_FI_DEV_GPU_TEMP, host)")
GPU_VAR = Variable("gpu", "GPU", 'label_values(DCGM_FI_DEV_GPU_TEMP{host=~"$host"}, gpu)')


def quantile_targets(
    names: dict[str, str], quantiles: tuple[float, ...], by: str = "deployment"
) -> tuple[Target, ...]:
    """One target per engine and quantile: ``histogram_quantile(q, sum by (by, le) (rate(<m>_bucket)))``."""
    return tuple(
        Target(
            f"histogram_quantile({q}, sum by ({by}, le) (rate({name}_bucket{{{DEP}}}[{RATE}])))",
            f"{{{{deployment}}}} {engine} p{round(q * 100)}",
        )
        for engine, name in names.items()
        for q in quantiles
    )


def per_engine(names: dict[str, str], template: str, legend: str) -> tuple[Target, ...]:
    """One target per engine from ``template`` (``{m}`` = metric name, ``{sel}`` = deployment selector)."""
    return tuple(
        Target(template.format(m=name, sel=DEP, rate=RATE), f"{{{{deployment}}}} {engine}{legend}")
        for engine, name in names.items()
    )


def ioe(expr: str, legend: str = "{{deployment}}") -> Target:
    return Target(expr, legend)


def fleet() -> dict[str, Any]:
    panels = [
        Panel(
            "Primary zone per deployment",
            (Target(f"max {BY_ZONE} (ioe_deployment_zone{{{DEP}}} == 1)", "", instant=True),),
            kind="table",
            description="IOE's verdict: the wall each deployment is against (compute, hbm_bandwidth, "
            "kv_capacity, network, headroom).",
        ),
        Panel(
            "Zone confidence",
            (ioe(f"ioe_deployment_zone_confidence_ratio{{{DEP}}}"),),
            unit="percentunit",
            max_value=1,
        ),
        Panel(
            "p99 TTFT and ITL (IOE estimate)",
            (
                ioe(f"ioe_deployment_ttft_p99_seconds{{{DEP}}}", "{{deployment}} TTFT p99"),
                ioe(f"ioe_deployment_itl_p99_seconds{{{DEP}}}", "{{deployment}} ITL p99"),
            ),
            unit="s",
        ),
        Panel("p99 TTFT from engine histograms", quantile_targets(TTFT, (0.99,)), unit="s"),
        Panel(
            "KV headroom",
            (ioe(f"ioe_deployment_kv_headroom_ratio{{{DEP}}}"),),
            unit="percentunit",
            max_value=1,
            description="1 − KV cache usage, per deployment (IOE).",
        ),
        Panel(
            "Concurrency vs crossover (Cp)",
            (
                ioe(f"ioe_deployment_concurrency{{{DEP}}}", "{{deployment}} running"),
                ioe(f"ioe_deployment_crossover_concurrency{{{DEP}}}", "{{deployment}} Cp"),
            ),
            description="Past Cp, more concurrency buys latency, not throughput.",
        ),
        Panel(
            "Stragglers per deployment",
            (ioe(f"sum {BY} (ioe_straggler{{{DEP}}})"),),
            kind="stat",
            description="Ranks IOE flags as persistent stragglers.",
        ),
        Panel(
            "p99 regression vs baseline",
            (ioe(f"ioe_deployment_p99_regression_ratio{{{DEP}}}", "{{deployment}} {{signal}}"),),
            unit="short",
            threshold_line=1.5,
        ),
        Panel(
            "Sidecar targets up",
            (Target("ioe_target_up", "{{instance}} {{target}} ({{kind}})"),),
            width=24,
            max_value=1,
        ),
    ]
    return dashboard(
        "ioe-fleet",
        "IOE / Fleet overview",
        "Zones, p99s, headroom and stragglers per deployment.",
        panels,
        [DEPLOYMENT_VAR],
    )


def deployment() -> dict[str, Any]:
    panels = [
        Panel("TTFT quantiles", quantile_targets(TTFT, (0.5, 0.99)), unit="s"),
        Panel(
            "ITL quantiles",
            quantile_targets(ITL, (0.5, 0.99)),
            unit="s",
            description="TRT-LLM exports no ITL histogram: its per-request TPOT stands in.",
        ),
        Panel(
            "TTFT and ITL (IOE estimate)",
            (
                ioe(f"ioe_deployment_ttft_p50_seconds{{{DEP}}}", "{{deployment}} TTFT p50"),
                ioe(f"ioe_deployment_ttft_p99_seconds{{{DEP}}}", "{{deployment}} TTFT p99"),
                ioe(f"ioe_deployment_itl_p50_seconds{{{DEP}}}", "{{deployment}} ITL p50"),
                ioe(f"ioe_deployment_itl_p99_seconds{{{DEP}}}", "{{deployment}} ITL p99"),
            ),
            unit="s",
        ),
        Panel(
            "Queue, prefill and decode time p99",
            (
                *quantile_targets(QUEUE, (0.99,)),
                *quantile_targets(PREFILL, (0.99,)),
                *quantile_targets(DECODE, (0.99,)),
                Target(
                    "histogram_quantile(0.99, sum by (cluster, namespace, deployment, stage, le) "
                    f"(rate(sglang:per_stage_req_latency_seconds_bucket{{{DEP}}}[{RATE}])))",
                    "{{deployment}} SGLang {{stage}} p99",
                ),
            ),
            unit="s",
            description="vLLM's request-phase buckets start at 0.3 s: fast deployments read near 0.3 s.",
        ),
        Panel(
            "TTFT decomposition (from request spans)",
            (ioe(f"ioe_deployment_ttft_share_ratio{{{DEP}}}", "{{deployment}} {{phase}}"),),
            unit="percentunit",
            max_value=1,
            stacked=True,
            description="Share of mean TTFT per phase, exact over the requests whose OTLP spans IOE received "
            "(queue, prefill, kv_transfer where spans carry them; other = the rest). In a disaggregated "
            "deployment the kv_transfer share is the network's part of the user's wait. Empty without spans.",
        ),
        Panel(
            "KV cache usage",
            per_engine(KV_USAGE, f"max {BY} ({{m}}{{{{{{sel}}}}}})", ""),
            unit="percentunit",
            max_value=1,
            threshold_line=0.95,
        ),
        Panel(
            "Preemptions / retractions per second",
            (
                Target(
                    f"sum {BY} (rate(vllm:num_preemptions_total{{{DEP}}}[{RATE}])) or "
                    f"sum {BY} (rate(sglang:num_retracted_requests_total{{{DEP}}}[{RATE}]))",
                    "{{deployment}}",
                ),
            ),
            unit="reqps",
            description="vLLM preemptions or SGLang retractions; TRT-LLM exports none.",
        ),
        Panel(
            "Requests running and waiting",
            (
                *per_engine(RUNNING, f"sum {BY} ({{m}}{{{{{{sel}}}}}})", " running"),
                *per_engine(WAITING, f"sum {BY} ({{m}}{{{{{{sel}}}}}})", " waiting"),
            ),
        ),
        Panel(
            "Throughput vs concurrency",
            (
                *per_engine(GEN_TOKENS, f"sum {BY} (rate({{m}}{{{{{{sel}}}}}}[{{rate}}]))", " tokens/s"),
                ioe(f"ioe_deployment_concurrency{{{DEP}}}", "{{deployment}} running (IOE)"),
                ioe(f"ioe_deployment_crossover_concurrency{{{DEP}}}", "{{deployment}} Cp (IOE)"),
            ),
            description="Output tokens/s against running requests; throughput flattening below Cp is the "
            "crossover IOE fits.",
        ),
        Panel(
            "KV headroom (sequences that still fit)",
            (ioe(f"ioe_deployment_kv_headroom_sequences{{{DEP}}}"),),
            kind="stat",
        ),
        Panel(
            "Prefix cache hit ratio",
            (
                Target(
                    f"sum {BY} (rate(vllm:prefix_cache_hits_total{{{DEP}}}[{RATE}])) / "
                    f"sum {BY} (rate(vllm:prefix_cache_queries_total{{{DEP}}}[{RATE}]))",
                    "{{deployment}} vLLM",
                ),
                Target(f"max {BY} (sglang:cache_hit_rate{{{DEP}}})", "{{deployment}} SGLang"),
                Target(f"max {BY} (trtllm_kv_cache_hit_rate{{{DEP}}})", "{{deployment}} TRT-LLM"),
            ),
            unit="percentunit",
        ),
    ]
    return dashboard(
        "ioe-deployment",
        "IOE / Deployment drill-down",
        "Latency quantiles, request phases, KV cache and throughput of one deployment.",
        panels,
        [DEPLOYMENT_VAR],
    )


def _gpu(metric: str, legend: str = "{{host}} GPU {{gpu}}", scale: str = "") -> Target:
    return Target(f"{metric}{{{GPU}}}{scale}", legend)


def gpu_fabric() -> dict[str, Any]:
    panels = [
        Panel(
            "Tensor, SM and DRAM activity",
            (
                _gpu("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "{{host}} GPU {{gpu}} tensor"),
                _gpu("DCGM_FI_PROF_SM_ACTIVE", "{{host}} GPU {{gpu}} SM"),
                _gpu("DCGM_FI_PROF_DRAM_ACTIVE", "{{host}} GPU {{gpu}} DRAM"),
            ),
            unit="percentunit",
            max_value=1,
            description="Compute-bound: tensor ≥ 0.5 and SM ≥ 0.6–0.8. HBM-bound: DRAM ≥ 0.5 and ≥ SM with "
            "tensor low. SM_ACTIVE counts warps waiting on memory: never read it alone.",
        ),
        Panel("GPU utilisation", (_gpu("DCGM_FI_DEV_GPU_UTIL"),), unit="percent", max_value=100),
        Panel(
            "NVLink bytes/s vs capability",
            (
                _gpu("DCGM_FI_PROF_NVLINK_TX_BYTES", "{{host}} GPU {{gpu}} TX"),
                _gpu("DCGM_FI_PROF_NVLINK_RX_BYTES", "{{host}} GPU {{gpu}} RX"),
                _gpu(
                    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "{{host}} GPU {{gpu}} total (field 449)", " * 1e6"
                ),
            ),
            unit="Bps",
            threshold_line=450e9,
            description="Red line: NVLink 4 capability, 450 GB/s per direction per GPU. Field 449 is MB/s, "
            "both directions.",
        ),
        Panel(
            "PCIe bytes/s vs capability",
            (
                _gpu("DCGM_FI_PROF_PCIE_TX_BYTES", "{{host}} GPU {{gpu}} TX"),
                _gpu("DCGM_FI_PROF_PCIE_RX_BYTES", "{{host}} GPU {{gpu}} RX"),
            ),
            unit="Bps",
            threshold_line=64e9,
            description="Red line: PCIe Gen5 x16, ~64 GB/s per direction.",
        ),
        Panel(
            "InfiniBand bytes/s vs port rate",
            (
                Target(
                    f'rate(node_infiniband_port_data_received_bytes_total{{host=~"$host"}}[{RATE}])',
                    "{{host}} {{device}}:{{port}} RX",
                ),
                Target(
                    f'rate(node_infiniband_port_data_transmitted_bytes_total{{host=~"$host"}}[{RATE}])',
                    "{{host}} {{device}}:{{port}} TX",
                ),
                Target('node_infiniband_rate_bytes_per_second{host=~"$host"}', "{{host}} {{device}} rate"),
            ),
            unit="Bps",
            threshold_line=50e9,
        ),
        Panel(
            "Clocks",
            (
                _gpu("DCGM_FI_DEV_SM_CLOCK", "{{host}} GPU {{gpu}} SM"),
                _gpu("DCGM_FI_DEV_MEM_CLOCK", "{{host}} GPU {{gpu}} memory"),
            ),
            unit="MHz",
        ),
        Panel(
            "Throttle reasons (bitmask)",
            (_gpu("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),),
            kind="table",
            description="0x4 SW power cap, 0x8 HW slowdown, 0x20 SW thermal, 0x40 HW thermal, "
            "0x80 HW power brake.",
        ),
        Panel(
            "Power and temperature",
            (
                _gpu("DCGM_FI_DEV_POWER_USAGE", "{{host}} GPU {{gpu}} W"),
                _gpu("DCGM_FI_DEV_GPU_TEMP", "{{host}} GPU {{gpu}} °C"),
            ),
        ),
        Panel(
            "XID (last) and ECC errors",
            (
                _gpu("DCGM_FI_DEV_XID_ERRORS", "{{host}} GPU {{gpu}} last XID"),
                Target(
                    f"increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{GPU}}}[1h])", "{{host}} GPU {{gpu}} DBE / 1h"
                ),
                Target(
                    f"increase(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{GPU}}}[1h])", "{{host}} GPU {{gpu}} SBE / 1h"
                ),
            ),
            description="DCGM_FI_DEV_XID_ERRORS is the last XID number, not a count.",
        ),
        Panel(
            "Framebuffer used",
            (
                Target(
                    f"DCGM_FI_DEV_FB_USED{{{GPU}}} / "
                    f"(DCGM_FI_DEV_FB_USED{{{GPU}}} + DCGM_FI_DEV_FB_FREE{{{GPU}}})",
                    "{{host}} GPU {{gpu}}",
                ),
            ),
            unit="percentunit",
            max_value=1,
        ),
    ]
    return dashboard(
        "ioe-gpu-fabric",
        "IOE / GPU and fabric",
        "dcgm-exporter activity, NVLink/PCIe/InfiniBand bytes against capability, clocks, throttling, "
        "XID, ECC.",
        panels,
        [HOST_VAR, GPU_VAR],
    )


def collectives() -> dict[str, Any]:
    straggler = f"(ioe_straggler{{{DEP}}} == 1)"
    panels = [
        Panel(
            "Straggler score per rank",
            (
                ioe(
                    f"ioe_straggler_score_ratio{{{DEP}}}",
                    "{{deployment}} rank {{rank}} ({{host}} GPU {{gpu}})",
                ),
            ),
            unit="percentunit",
            max_value=1,
            description="Share of the peers' collective wait blamed on the rank (last to arrive).",
        ),
        Panel(
            "Flagged stragglers",
            (Target(f"ioe_straggler{{{DEP}}}", "", instant=True),),
            kind="table",
        ),
        Panel(
            "Exposed collective time / step time",
            (ioe(f"ioe_deployment_collective_exposed_ratio{{{DEP}}}"),),
            unit="percentunit",
            max_value=1,
        ),
        Panel(
            "Achieved bus bandwidth / fabric capability",
            (ioe(f"ioe_deployment_collective_busbw_ratio{{{DEP}}}"),),
            unit="percentunit",
            max_value=1,
        ),
        Panel(
            "Straggler GPU: SM clock",
            (
                Target(
                    f"DCGM_FI_DEV_SM_CLOCK * on (host, gpu) group_left (deployment, rank) {straggler}",
                    "{{deployment}} rank {{rank}} ({{host}} GPU {{gpu}})",
                ),
            ),
            unit="MHz",
            description="The flagged rank's GPU clock: a throttled GPU is the usual cause.",
        ),
        Panel(
            "Straggler GPU: throttle reasons",
            (
                Target(
                    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS * on (host, gpu) group_left (deployment, rank) "
                    + straggler,
                    "{{deployment}} rank {{rank}}",
                    instant=True,
                ),
            ),
            kind="table",
        ),
        Panel(
            "Network-critical zone",
            (ioe(f'ioe_deployment_zone{{{DEP}, zone="network"}}'),),
            max_value=1,
            width=24,
        ),
    ]
    return dashboard(
        "ioe-collectives",
        "IOE / Collectives and stragglers",
        "Which rank slows the rest, why, and how much time collectives cost.",
        panels,
        [DEPLOYMENT_VAR],
    )


DASHBOARDS = {
    "fleet-overview.json": fleet,
    "deployment-drilldown.json": deployment,
    "gpu-fabric.json": gpu_fabric,
    "collectives-stragglers.json": collectives,
}
