"""pydcgm reader: field-id mapping against a stand-in module; 'not installed' for real."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from collector.sources.pydcgm import BINDING_PATHS, DcgmReader, load_bindings


def _s(ts_us: int, value: float, blank: bool = False) -> Any:
    return SimpleNamespace(ts=ts_us, value=value, isBlank=blank)


class _Samples:
    def __init__(self, calls: list[Any]) -> None:
        self.calls = calls
        self.watched: tuple[Any, ...] = ()

    def WatchFields(self, field_group: Any, update_us: int, keep_s: float, keep_n: int) -> None:
        self.watched = (field_group.field_ids, update_us)

    def GetAllSinceLastCall(self, fvs: Any, field_group: Any) -> Any:
        return SimpleNamespace(values=self.calls.pop(0) if self.calls else {})


def fake_dcgm(calls: list[Any]) -> Any:
    samples = _Samples(calls)

    class Handle:
        def __init__(self, ipAddress: str, opMode: int) -> None:
            self.ip = ipAddress

        def GetSystem(self) -> Any:
            attrs = SimpleNamespace(identifiers=SimpleNamespace(uuid="GPU-dcgm-0"))
            return SimpleNamespace(discovery=SimpleNamespace(GetGpuAttributes=lambda gpu_id: attrs))

    def group(handle: Any, groupName: str, groupType: int) -> Any:
        return SimpleNamespace(samples=samples)

    def field_group(handle: Any, name: str, fieldIds: list[int]) -> Any:
        return SimpleNamespace(field_ids=fieldIds)

    return SimpleNamespace(
        DcgmHandle=Handle,
        DcgmGroup=group,
        DcgmFieldGroup=field_group,
        DCGM_GROUP_DEFAULT=0,
        DCGM_OPERATION_MODE_AUTO=1,
        samples=samples,
    )


def test_every_sample_mapped_with_its_own_timestamp_and_unit() -> None:
    first = {
        0: {
            1002: [_s(1_000_000, 0.62), _s(1_100_000, 0.64)],
            252: [_s(1_000_000, 40960)],  # MiB
            156: [_s(1_000_000, 5_000_000)],  # mJ
            203: [_s(1_000_000, 87)],  # percent
            1005: [_s(1_000_000, 9.2e18)],  # blank sentinel: dropped
            1004: [_s(1_000_000, 0.3, blank=True)],
            9999: [_s(1_000_000, 1.0)],  # not watched by IOE: ignored
        }
    }
    dcgm = fake_dcgm([first])
    reader = DcgmReader(dcgm, host="n1", update_us=100_000)
    assert reader.available()[0]
    assert dcgm.samples.watched[1] == 100_000 and 1002 in dcgm.samples.watched[0]
    df = reader.read(0).tables["gpu_samples"].sort(["metric", "ts_ns"])
    got = {(r["metric"], r["ts_ns"]): r["value"] for r in df.iter_rows(named=True)}
    assert got == {
        ("energy_j", 1_000_000_000): 5000.0,
        ("fb_used_bytes", 1_000_000_000): 40960 * 2**20,
        ("gpu_util_ratio", 1_000_000_000): 0.87,
        ("sm_active_ratio", 1_000_000_000): 0.62,
        ("sm_active_ratio", 1_100_000_000): 0.64,
    }
    assert set(df["uuid"]) == {"GPU-dcgm-0"} and set(df["source"]) == {"pydcgm"} and set(df["link"]) == {-1}
    assert reader.read(0).tables == {}  # nothing new since the last call


def test_not_installed_for_real(tmp_path: Path) -> None:
    bindings, why = load_bindings((tmp_path / "nope",))
    assert bindings is None and "pydcgm not installed" in why
    reader = DcgmReader(paths=(tmp_path / "nope",))
    ok, reason = reader.available()
    assert not ok and str(tmp_path / "nope") in reason
    parsed = reader.read(0)
    assert parsed.tables == {} and "not installed" in parsed.problems[0].message


def test_default_paths_on_this_machine_do_not_crash() -> None:
    ok, why = DcgmReader().available()
    if not any((p / "pydcgm.py").is_file() for p in BINDING_PATHS):
        assert not ok and "pydcgm not installed" in why
    else:
        assert isinstance(ok, bool) and why


def test_host_engine_failure_is_a_reason_not_an_exception() -> None:
    def refuse(**_: Any) -> Any:
        raise ConnectionError("connection refused")

    dcgm = fake_dcgm([])
    dcgm.DcgmHandle = refuse
    ok, why = DcgmReader(dcgm).available()
    assert not ok and "not usable (connection refused)" in why


@pytest.mark.parametrize("value", [float("nan"), "N/A"])
def test_non_numeric_is_blank(value: Any) -> None:
    dcgm = fake_dcgm([{0: {155: [_s(1, value), _s(2, 300.5)]}}])
    df = DcgmReader(dcgm).read(0).tables["gpu_samples"]
    assert df["value"].to_list() == [300.5]


def test_link_power_limit_and_error_fields_share_the_exporter_names() -> None:
    """PCIe link generation/width (fields 235–238), the power limits (160, 164), volatile ECC
    (310/311), PCIe replays (202) and NVLink error totals get the names the dcgm-exporter parser
    gives the same field ids, so the straggler causes read one metric whichever reader wrote it."""
    from collector.formats.dcgm import FIELDS_BY_ID
    from collector.sources.pydcgm import FIELDS

    assert {160, 164, 202, 235, 236, 237, 238, 310, 311, 409, 429} <= set(FIELDS)
    assert {fid: name for fid, (name, _) in FIELDS.items() if fid in FIELDS_BY_ID} == {
        fid: FIELDS_BY_ID[fid].name for fid in FIELDS if fid in FIELDS_BY_ID
    }
    first = {0: {237: [_s(1_000_000, 4)], 238: [_s(1_000_000, 8)], 160: [_s(1_000_000, 600.0)],
                 241: [_s(1_000_000, 2_500_000_000)]}}  # fmt: skip
    df = DcgmReader(fake_dcgm([first])).read(0).tables["gpu_samples"]
    got = {r["metric"]: r["value"] for r in df.iter_rows(named=True)}
    assert got == {"pcie_link_gen_last": 4.0, "pcie_link_width_last": 8.0, "power_limit_w": 600.0,
                   "thermal_violation_s": 2.5}  # fmt: skip
