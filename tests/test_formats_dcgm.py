"""dcgm-exporter and ``dcgmi dmon`` -> gpu_samples, in canonical units."""

from __future__ import annotations

import polars as pl
import pytest

from collector.formats import dcgm
from collector.formats.dcgm import GPU_METRICS, canonical, to_gpu_samples
from collector.formats.dcgmi_dmon import parse_dmon, sniff
from collector.formats.exposition import parse
from tests.conftest import DATA

MIB = 1_048_576


def _gpu(path: str, **kw: object) -> tuple[pl.DataFrame, list]:
    parsed = to_gpu_samples(parse((DATA / "dcgm" / path).read_text()), ts_ns=7, host="fallback", **kw)  # type: ignore[arg-type]
    return parsed.tables["gpu_samples"], parsed.problems


def _one(df: pl.DataFrame, **where: object) -> dict:
    rows = df.filter(pl.all_horizontal(pl.col(k) == v for k, v in where.items())).to_dicts()
    assert len(rows) == 1, rows
    return rows[0]


def test_h100_k8s_values_labels_and_units() -> None:
    df, problems = _gpu("h100x8_k8s_pod_labels.prom")
    assert problems == [] and df.height == 30
    gpu0 = _one(df, gpu=0, metric="power_w")
    assert gpu0["value"] == pytest.approx(113.611)
    assert gpu0["host"] == "gpu-node-1" and gpu0["uuid"] == "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"
    assert gpu0["gpu_model"] == "NVIDIA H100 80GB HBM3"
    assert (gpu0["pod"], gpu0["namespace"], gpu0["container"]) == (
        "vllm-agg-0-vllmdecodeworker-s65j5",
        "dynamo-workload",
        "main",
    )
    assert _one(df, gpu=1, metric="power_w")["pod"] == ""
    assert _one(df, gpu=1, metric="gpu_temp_c")["value"] == 29.0
    assert set(df["metric"]) == {"gpu_temp_c", "power_w", "gpu_util_ratio", "mem_copy_util_ratio"}
    assert df["ts_ns"].unique().to_list() == [7]


def test_t4_units_fb_energy_and_unknown_fields() -> None:
    df, problems = _gpu("t4_a10g_mixed.prom")
    assert problems == []
    t4 = dict(host="424773df46e0", uuid="GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e")
    assert _one(df, metric="fb_free_bytes", **t4)["value"] == 15109 * MIB
    assert _one(df, metric="energy_j", **t4)["value"] == pytest.approx(128996.013)
    assert _one(df, metric="sm_clock_mhz", **t4)["value"] == 300.0
    assert _one(df, metric="power_w", **t4)["value"] == pytest.approx(8.969)
    assert _one(df, metric="nvlink_total_bytes_per_s", **t4)["value"] == 0.0
    other = dict(host="551bdf382151")
    assert _one(df, metric="throttle_reasons_mask", **other)["value"] == 1.0
    assert _one(df, metric="slowdown_temp_c", **other)["value"] == 93.0
    assert _one(df, metric="dram_active_ratio")["value"] == pytest.approx(0.000003)
    assert _one(df, metric="dcgm_dev_count")["value"] == 1.0  # unknown field kept, not dropped
    unlabelled = _one(df, metric="remapped_rows_uncorrectable_total")
    assert (unlabelled["gpu"], unlabelled["uuid"], unlabelled["host"]) == (-1, "", "fallback")


def test_conversions_table() -> None:
    assert canonical("DCGM_FI_DEV_GPU_UTIL") == ("gpu_util_ratio", 0.01)
    assert canonical("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL") == ("nvlink_total_bytes_per_s", 1e6)
    assert canonical("DCGM_FI_DEV_POWER_VIOLATION") == ("power_violation_s", 1e-9)
    assert canonical("DCGM_FI_DEV_XID_ERRORS") == ("xid_last", 1.0)
    assert canonical("DCGM_FI_PROF_NEW_THING") == ("dcgm_prof_new_thing", 1.0)
    units = ("_ratio", "_bytes", "_bytes_per_s", "_w", "_j", "_c", "_mhz", "_s", "_total", "_mask", "_last")
    for name in GPU_METRICS:
        assert name.endswith(units), name


SPELLINGS = """\
DCGM_FI_DEV_GPU_UTIL{gpu="2",uuid="GPU-old",model_name="A100",hostname="new-host",\
pod_name="p",pod_namespace="ns",container_name="c"} 87
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-mig",GPU_I_PROFILE="1g.10gb",GPU_I_ID="3",Hostname="h"} 1024
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-mig",GPU_I_PROFILE="1g.10gb",GPU_I_ID="5",Hostname="h"} 2048
DCGM_FI_PROF_NVLINK_TX_BYTES{gpu_uuid="GPU-link",nvlink="3",device="nvidia5"} 5e9
DCGM_FI_PROF_SM_ACTIVE{gpu="1",UUID="GPU-x"} 140737488355328
DCGM_FI_PROF_DRAM_ACTIVE{gpu="1",UUID="GPU-x"} NaN
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="1",UUID="GPU-x"} 0.25
vllm:num_requests_running{engine="0"} 3
"""


def test_every_label_spelling_mig_links_and_sentinels() -> None:
    parsed = to_gpu_samples(parse(SPELLINGS), ts_ns=1)
    df = parsed.tables["gpu_samples"]
    old = _one(df, metric="gpu_util_ratio")
    assert old["value"] == pytest.approx(0.87)
    assert (old["uuid"], old["gpu_model"], old["host"]) == ("GPU-old", "A100", "new-host")
    assert (old["pod"], old["namespace"], old["container"]) == ("p", "ns", "c")
    mig = df.filter(pl.col("metric") == "fb_used_bytes").sort("mig_instance")
    assert mig["uuid"].to_list() == ["GPU-mig/gi3", "GPU-mig/gi5"]
    assert mig["value"].to_list() == [1024 * MIB, 2048 * MIB]
    assert mig["mig_profile"].to_list() == ["1g.10gb", "1g.10gb"]
    link = _one(df, metric="nvlink_tx_bytes_per_s")
    assert (link["link"], link["gpu"], link["uuid"], link["value"]) == (3, 5, "GPU-link", 5e9)
    expected = {"gpu_util_ratio", "fb_used_bytes", "nvlink_tx_bytes_per_s", "tensor_active_ratio"}
    assert set(df["metric"]) == expected
    (problem,) = parsed.problems
    assert problem.message.startswith("2 blank-sentinel")
    assert "DCGM_FI_PROF_SM_ACTIVE×1" in problem.message and "DCGM_FI_PROF_DRAM_ACTIVE×1" in problem.message


def test_field_ids_are_unique_per_name() -> None:
    assert dcgm.FIELDS_BY_ID[1011].name == "nvlink_tx_bytes_per_s"
    assert dcgm.FIELDS_BY_ID[449].scale == 1e6


def test_dcgmi_dmon_blocks_timestamps_and_refused_cells() -> None:
    text = (DATA / "dcgm" / "h800x8_dcgmi_dmon_nvlink_pcie.txt").read_text()
    assert sniff("x.txt", text.encode())
    parsed = parse_dmon(text, ts_ns=1_000, host="h800")
    df = parsed.tables["gpu_samples"]
    first = _one(df, ts_ns=1_000, gpu=3, metric="nvlink_tx_bytes_per_s")
    assert first["value"] == 19694075554.0 and first["uuid"] == "gpu3" and first["host"] == "h800"
    assert _one(df, ts_ns=1_000, gpu=0, metric="nvlink_rx_bytes_per_s")["value"] == 21900091841.0
    second_block = 1_000 + 1_000_000_000
    assert _one(df, ts_ns=second_block, gpu=3, metric="nvlink_tx_bytes_per_s")["value"] == 12945588302.0
    assert df["ts_ns"].n_unique() == 10  # 6 + 2 + 2 sample blocks
    last = 1_000 + 9 * 1_000_000_000
    assert _one(df, ts_ns=last, gpu=7, metric="pcie_rx_bytes_per_s")["value"] == 4599309358.0
    assert _one(df, ts_ns=last, gpu=0, metric="pcie_tx_bytes_per_s")["value"] == 3711808007.0
    locations = [p.location for p in parsed.problems]
    assert locations.count("line 57") == 4  # the author's "(36.07GB/s)" annotations on GPU 6
    assert "N/A" in parsed.problems[-1].message
    n_a_block = df.filter((pl.col("ts_ns") == 1_000 + 8 * 1_000_000_000) & (pl.col("gpu") == 0))
    kept = ["nvlink_rx_bytes_per_s", "nvlink_tx_bytes_per_s", "pcie_rx_bytes_per_s"]
    assert sorted(n_a_block["metric"]) == kept


def test_dmon_sniff_does_not_claim_prometheus_text() -> None:
    assert not sniff("x.prom", (DATA / "dcgm" / "t4_a10g_mixed.prom").read_bytes())
