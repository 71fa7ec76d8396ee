"""PromQL selectors as IOE's settings take them (below every layer: the settings validate them,
the Prometheus source builds its queries from them)."""

from __future__ import annotations

# GPU series: dcgm-exporter's, and the fields IOE maps from AMD's device-metrics-exporter (with or
# without the ``amd_`` prefix a relabelling often adds), in one query
DEFAULT_SELECTORS = (
    '{__name__=~"DCGM_FI_.+|DCGM_EXP_.+|(amd_)?(gpu_(gfx|umc)_activity|gpu_power_usage|gpu_energy_consumed'
    "|gpu_(junction|edge|memory)_temperature|gpu_(total|used|free)_vram|gpu_ecc_(un)?correct_total"
    '|pcie_replay_count)"}',
    '{__name__=~"(vllm|ray_vllm|sglang|trtllm|dynamo|nim|tgi)[:_].+|nv_inference_.+|nv_trt_llm_.+|nv_gpu_.+"}',
)


def matchers(selector: str) -> str:
    """The matchers of a selector (``name{a="b"}``, ``{a="b"}`` or ``name``) as ``a="b"`` text;
    raises ValueError quoting it when it is none of these."""
    text = selector.strip()
    name, brace, rest = text.partition("{")
    name = name.strip()
    if name and not (name.isascii() and name.replace(":", "_").isidentifier()):
        raise ValueError(f"selector {selector!r}: {name!r} is not a metric name")
    inner = ""
    if brace:
        if not rest.rstrip().endswith("}"):
            raise ValueError(f"selector {selector!r}: expected name{{matchers}} or {{matchers}}")
        inner = rest.rstrip()[:-1].strip().rstrip(",")
    if not name and not inner:
        raise ValueError(f"selector {selector!r}: empty")
    parts = [f'__name__="{name}"'] if name else []
    return ",".join(parts + ([inner] if inner else []))
