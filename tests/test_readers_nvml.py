"""NVML reader against a stand-in ``pynvml`` module, and the real 'no library / no GPU' paths."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import require_module

from collector.sources.nvml import NvmlReader

S = 1_000_000_000


class FakeNVMLError(Exception):
    pass


class FakeNvml:
    """Two GPUs: GPU 0 a Hopper with GPM and 2 NVLinks, GPU 1 without power or GPM support."""

    NVMLError = FakeNVMLError
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0
    NVML_NVLINK_MAX_LINKS = 4
    NVML_GPM_METRICS_GET_VERSION = 1

    def __init__(self) -> None:
        self.kib = {(138, 0): 1000, (139, 0): 2000, (138, 1): 10, (139, 1): 20}
        self.gpm_values = {1: 99.0, 2: 61.0, 3: 30.0, 5: 42.5, 10: 80.0, 20: 100.0, 21: 25.5}
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h}aaa"

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, h: int, version: int | None = None) -> Any:
        if version is None:  # v1 counts the driver's reservation as used
            return SimpleNamespace(used=40 * 2**30, free=40 * 2**30, total=80 * 2**30)
        if h == 1:  # a driver without nvmlDeviceGetMemoryInfo_v2
            raise FakeNVMLError("Function Not Found")
        assert version == 0x02000028
        return SimpleNamespace(used=40 * 2**30 - 480 * 2**20, free=40 * 2**30, reserved=480 * 2**20)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        if h == 1:
            raise FakeNVMLError("Not Supported")
        return 512_345  # mW

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return 9_000_000  # mJ

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return 1980 if kind == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetTemperature(self, h: int, kind: int) -> int:
        return 67

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return 0x4  # SW power cap

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=97, memory=55)

    # GPU 0: Gen5 x16 under a 700 W limit; GPU 1 trained down to Gen4 x8 under 600 W (enforced
    # 590 W), with 3 corrected volatile ECC errors and 12 PCIe replays
    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return 5 if h == 0 else 4

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return 16 if h == 0 else 8

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return 16

    def nvmlDeviceGetPowerManagementLimit(self, h: int) -> int:
        return 700_000 if h == 0 else 600_000  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return 700_000 if h == 0 else 590_000  # mW

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> int:
        return 0 if h == 0 else 12

    def nvmlDeviceGetTotalEccErrors(self, h: int, error_type: int, counter_type: int) -> int:
        assert counter_type == 0  # volatile, never the lifetime aggregate
        if h == 0:
            raise FakeNVMLError("Not Supported")  # ECC off: the metric is just absent
        return 3 if error_type == 0 else 0

    def nvmlDeviceGetFieldValues(self, h: int, query: list[tuple[int, int]]) -> list[Any]:
        if h == 1:
            raise FakeNVMLError("Not Supported")
        out = []
        for fid, link in query:
            ok = (fid, link) in self.kib
            out.append(
                SimpleNamespace(
                    fieldId=fid,
                    scopeId=link,
                    nvmlReturn=0 if ok else 3,
                    value=SimpleNamespace(ullVal=self.kib.get((fid, link), 0)),
                )
            )
        return out

    def nvmlGpmQueryDeviceSupport(self, h: int) -> Any:
        return SimpleNamespace(isSupportedDevice=1 if h == 0 else 0)

    def nvmlGpmSampleAlloc(self) -> dict[str, int]:
        return {}

    def nvmlGpmSampleGet(self, h: int, sample: dict[str, int]) -> None:
        sample["h"] = h

    def nvmlGpmSampleFree(self, sample: dict[str, int]) -> None:
        pass

    def c_nvmlGpmMetricsGet_t(self) -> Any:
        return SimpleNamespace(
            metrics=[SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(8)]
        )

    def nvmlGpmMetricsGet(self, req: Any) -> None:
        for i in range(req.numMetrics):
            req.metrics[i].value = self.gpm_values[req.metrics[i].metricId]


def _value(parsed: Any, gpu: int, metric: str, link: int = -1) -> float:
    df = parsed.tables["gpu_samples"]
    got = df.filter((df["gpu"] == gpu) & (df["metric"] == metric) & (df["link"] == link))["value"].to_list()
    assert len(got) == 1, (metric, got)
    return float(got[0])


def _metrics(parsed: Any, gpu: int) -> set[str]:
    df = parsed.tables["gpu_samples"]
    return set(df.filter(df["gpu"] == gpu)["metric"])


def test_canonical_values_and_units() -> None:
    reader = NvmlReader(FakeNvml(), host="n1")
    assert reader.available() == (True, "NVML sees 2 GPU(s)")
    first = reader.read(10 * S)
    assert _value(first, 0, "power_w") == pytest.approx(512.345)
    assert _value(first, 0, "energy_j") == 9000.0
    assert _value(first, 0, "fb_used_bytes") == 40 * 2**30 - 480 * 2**20  # v2: reserved apart
    assert _value(first, 0, "fb_reserved_bytes") == 480 * 2**20
    assert _value(first, 1, "fb_used_bytes") == 40 * 2**30  # v1 fallback
    assert "fb_reserved_bytes" not in _metrics(first, 1)
    assert _value(first, 0, "sm_clock_mhz") == 1980 and _value(first, 0, "mem_clock_mhz") == 2619
    assert _value(first, 0, "gpu_temp_c") == 67 and _value(first, 0, "throttle_reasons_mask") == 4
    assert _value(first, 0, "gpu_util_ratio") == pytest.approx(0.97)
    df = first.tables["gpu_samples"]
    assert set(df["uuid"]) == {"GPU-0aaa", "GPU-1aaa"} and set(df["source"]) == {"nvml"}
    assert set(df["gpu_model"]) == {"NVIDIA H100 80GB HBM3"} and set(df["host"]) == {"n1"}
    # first read: no NVLink rate, no GPM ratio yet; GPU 1's unsupported power is just absent
    assert not {"nvlink_tx_bytes_per_s", "sm_active_ratio"} & _metrics(first, 0)
    assert "power_w" not in _metrics(first, 1)


def test_nvlink_kib_counters_become_bytes_per_second_and_gpm_ratios() -> None:
    fake = FakeNvml()
    reader = NvmlReader(fake)
    reader.read(10 * S)
    fake.kib[(138, 0)] += 4_000_000  # +4e6 KiB in 2 s
    fake.kib[(139, 0)] += 1_000
    fake.kib[(138, 1)] += 2_000_000
    second = reader.read(12 * S)
    assert _value(second, 0, "nvlink_tx_bytes_per_s", link=0) == 4_000_000 * 1024 / 2
    assert _value(second, 0, "nvlink_rx_bytes_per_s", link=0) == 1_000 * 1024 / 2
    assert _value(second, 0, "nvlink_tx_bytes_per_s", link=1) == 2_000_000 * 1024 / 2
    assert _value(second, 0, "nvlink_tx_bytes_per_s", link=-1) == 6_000_000 * 1024 / 2
    assert _value(second, 0, "sm_active_ratio") == pytest.approx(0.61)
    assert _value(second, 0, "tensor_active_ratio") == pytest.approx(0.425)
    assert _value(second, 0, "dram_active_ratio") == pytest.approx(0.80)
    assert _value(second, 0, "sm_occupancy_ratio") == pytest.approx(0.30)
    assert _value(second, 0, "gr_engine_active_ratio") == pytest.approx(0.99)
    assert _value(second, 0, "pcie_tx_bytes_per_s") == 100 * 2**20  # GPM gives MiB/s
    assert _value(second, 0, "pcie_rx_bytes_per_s") == 25.5 * 2**20
    assert "sm_active_ratio" not in _metrics(second, 1)  # no GPM on GPU 1


def test_nvlink_counter_reset_gives_no_rate() -> None:
    fake = FakeNvml()
    reader = NvmlReader(fake)
    reader.read(1 * S)
    fake.kib[(138, 0)] = 5
    parsed = reader.read(2 * S)
    df = parsed.tables["gpu_samples"]
    assert df.filter((df["metric"] == "nvlink_tx_bytes_per_s") & (df["link"] == 0)).height == 0


def test_real_library_absent_is_a_clear_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    ok, why = NvmlReader().available()
    assert not ok and "nvidia-ml-py is not installed" in why
    parsed = NvmlReader().read(S)
    assert parsed.tables == {} and "not installed" in parsed.problems[0].message


def test_real_pynvml_without_driver_does_not_crash() -> None:
    require_module("pynvml", "the [nvml] extra")
    ok, why = NvmlReader().available()
    if ok:  # a machine with a GPU: read for real
        parsed = NvmlReader().read(S)
        assert parsed.tables["gpu_samples"].height > 0
    else:
        assert why.startswith(("NVML cannot start", "NVML found no"))


def test_a_pynvml_it_imported_and_could_not_start_is_let_go() -> None:
    """On a node without NVML the module is not kept resident; one passed in is never dropped."""
    require_module("pynvml", "the [nvml] extra")
    reader = NvmlReader()
    ok, why = reader.available()
    if not ok:  # no driver here: the import is undone, and asking again gives the same answer
        assert "pynvml" not in sys.modules and reader._nvml is None
        assert reader.available() == (ok, why)

    class NoDriver(FakeNvml):
        def nvmlInit(self) -> None:
            raise RuntimeError("Driver Not Loaded")

    fake = NoDriver()
    passed = NvmlReader(fake)
    assert passed.available() == (False, "NVML cannot start: Driver Not Loaded")
    assert passed._nvml is fake


def test_energy_is_read_on_the_first_read_then_every_nth() -> None:
    reader = NvmlReader(FakeNvml(), energy_every=3)
    seen = ["energy_j" in _metrics(reader.read((i + 1) * S), 0) for i in range(7)]
    assert seen == [True, False, False, True, False, False, True]
    assert "power_w" in _metrics(reader.read(8 * S), 0)  # the rest is read every time


def test_pcie_link_power_limit_ecc_and_replays() -> None:
    """The settings and counters the straggler causes compare with peers, in canonical units:
    link generation/width every read, limits, maximum link, volatile ECC and replays on the
    energy reads; a GPU whose ECC call is unsupported simply has no ECC row."""
    reader = NvmlReader(FakeNvml(), energy_every=2)
    first = reader.read(1 * S)
    assert (_value(first, 0, "pcie_link_gen_last"), _value(first, 0, "pcie_link_width_last")) == (5, 16)
    assert (_value(first, 1, "pcie_link_gen_last"), _value(first, 1, "pcie_link_width_last")) == (4, 8)
    assert (
        _value(first, 1, "pcie_max_link_gen_last") == 5 and _value(first, 1, "pcie_max_link_width_last") == 16
    )
    assert _value(first, 0, "power_limit_w") == 700.0 and _value(first, 1, "power_limit_w") == 600.0
    assert _value(first, 1, "enforced_power_limit_w") == 590.0
    assert _value(first, 1, "ecc_sbe_volatile_total") == 3 and _value(first, 1, "ecc_dbe_volatile_total") == 0
    assert _value(first, 1, "pcie_replay_total") == 12
    assert not {"ecc_sbe_volatile_total", "ecc_dbe_volatile_total"} & _metrics(first, 0)
    second = reader.read(2 * S)  # not an energy read: only the current link is read again
    assert "pcie_link_gen_last" in _metrics(second, 0) and "power_limit_w" not in _metrics(second, 0)
