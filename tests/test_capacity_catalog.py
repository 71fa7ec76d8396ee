"""Hardware catalog lookups by the names real telemetry and the calibration CSV use."""

from __future__ import annotations

import csv

import pytest

from analyzer import catalog
from tests.conftest import DATA


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100_sxm"),
        ("h100_sxm", "h100_sxm"),
        ("NVIDIA H100 PCIe", "h100_pcie"),
        ("NVIDIA H200", "h200_sxm"),
        ("NVIDIA B200", "b200_sxm"),
        ("NVIDIA GB200", "gb200"),
        ("NVIDIA A100-SXM4-80GB", "a100_sxm"),
        ("AMD Instinct MI300X", "mi300x"),
    ],
)
def test_gpu_lookup(name: str, key: str) -> None:
    assert catalog.gpu(name).name == key


def test_every_calibration_system_resolves() -> None:
    with (DATA / "silicon" / "dense_calibration.csv").open() as fh:
        systems = {row["system"] for row in csv.DictReader(fh)}
    assert {catalog.gpu(s).name for s in systems} == {"h100_sxm", "h200_sxm", "b200_sxm", "gb200"}


def test_reference_figures() -> None:
    h100, h200 = catalog.gpu("h100_sxm"), catalog.gpu("h200")
    assert (h100.hbm_bytes, h100.hbm_bytes_per_s) == (80e9, 3.35e12)
    assert (h200.hbm_bytes, h200.hbm_bytes_per_s) == (141e9, 4.8e12)
    assert catalog.gpu("mi300x").hbm_bytes_per_s == 5.3e12
    assert catalog.gpu("gb200").domain_gpus == 72
    assert catalog.fabric("nvlink4").bytes_per_s * 2 == 900e9  # 900 GB/s bidirectional
    assert catalog.fabric("NVLink 5").bytes_per_s * 2 == 1800e9
    assert catalog.fabric("InfiniBand NDR").bytes_per_s == 50e9
    assert catalog.fabric("100GbE").bytes_per_s == 12.5e9
    assert catalog.gpu("a100").peak_flops("fp8") == 312e12  # no FP8 tensor cores: BF16 rate


def test_unknown_names_are_quoted() -> None:
    with pytest.raises(KeyError, match="unknown GPU 'T4'"):
        catalog.gpu("T4")
    with pytest.raises(KeyError, match="unknown fabric 'token ring'"):
        catalog.fabric("token ring")
