"""AMD Instinct GPUs through AMD's device-metrics-exporter -> gpu_samples (dcgm.py rule 11).

The lines in tests/data/amd are real scraped lines (SOURCES.md there); the unit conversions are
checked on lines written here from the exporter's documented metric list (percent, W, µJ, MB)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from collector.formats.dcgm import to_gpu_samples
from collector.formats.exposition import parse
from collector.ingest import ingest_paths
from collector.store import Store
from tests.conftest import DATA

MIB = 1_048_576
REAL = DATA / "amd" / "dme_mi300x_gfx_activity.prom"


def _rows(text: str) -> pl.DataFrame:
    parsed = to_gpu_samples(parse(text), ts_ns=7, host="fallback")
    assert parsed.problems == []
    return parsed.tables["gpu_samples"]


def test_real_mi300x_lines_keep_gpu_host_pod_and_partition() -> None:
    df = _rows(REAL.read_text()).sort("gpu")
    assert df["metric"].unique().to_list() == ["gpu_util_ratio"]
    assert df["gpu"].to_list() == [0, 2, 47]
    assert df["value"].to_list() == [1.0, 0.0, 0.0]  # 100 % and 0 % busy
    assert df["host"].to_list() == ["tw038", "tw038", "tw009"]
    assert set(df["gpu_model"]) == {"AMD Instinct MI300X OAM"}
    busy = df.row(0, named=True)
    assert (busy["pod"], busy["namespace"], busy["container"]) == (
        "high-utilization-57ls6",
        "default",
        "workload",
    )
    assert busy["uuid"] == "3dff74a1-0000-1000-80d3-0c4c1df1df58" and busy["mig_profile"] == ""
    # a CPX partition keeps its own row under the physical GPU's uuid, like a MIG instance
    cpx = df.row(2, named=True)
    assert cpx["uuid"] == "c3ff74a1-0000-0000-80ff-88426fc31c9e/p0" and cpx["mig_profile"] == "cpx"


@pytest.mark.parametrize("prefix", ["", "amd_"])
def test_documented_fields_in_canonical_units(prefix: str) -> None:
    labels = 'gpu_id="3",gpu_uuid="u3",hostname="n1",card_series="AMD Instinct MI300X OAM"'
    lines = {
        "gpu_gfx_activity": ("45", "gpu_util_ratio", 0.45),
        "gpu_umc_activity": ("80", "mem_copy_util_ratio", 0.80),
        "gpu_power_usage": ("612", "power_w", 612.0),
        "gpu_energy_consumed": ("2500000000", "energy_j", 2500.0),  # µJ
        "gpu_junction_temperature": ("71", "gpu_temp_c", 71.0),
        "gpu_memory_temperature": ("60", "memory_temp_c", 60.0),
        "gpu_total_vram": ("196592", "fb_total_bytes", 196592 * MIB),  # MB as amd-smi counts them
        "gpu_used_vram": ("150000", "fb_used_bytes", 150000 * MIB),
        "gpu_ecc_uncorrect_total": ("2", "ecc_dbe_total", 2.0),
        "gpu_ecc_correct_total": ("9", "ecc_sbe_total", 9.0),
        "pcie_replay_count": ("4", "pcie_replay_total", 4.0),
    }
    text = "".join(f"{prefix}{name}{{{labels}}} {raw}\n" for name, (raw, _, _) in lines.items())
    text += f"{prefix}go_goroutines 12\n"  # not a GPU field: ignored
    df = _rows(text)
    got = dict(zip(df["metric"], df["value"], strict=True))
    assert got == pytest.approx({metric: value for _, metric, value in lines.values()})
    assert set(df["gpu"]) == {3} and set(df["host"]) == {"n1"}


def test_ioe_ingest_recognizes_an_amd_scrape(tmp_path: Path) -> None:
    st = Store(str(tmp_path / "s.duckdb"))
    try:
        report = ingest_paths(st, [REAL])
        assert report.problems == []
        with st.cursor() as con:
            got = con.execute(
                "SELECT count(*), sum(value) FROM gpu_samples WHERE metric = 'gpu_util_ratio'"
            ).fetchone()
        assert got == (3, 1.0)
    finally:
        st.close()


def test_the_prometheus_source_asks_for_every_mapped_amd_field() -> None:
    # `ioe backfill` with the default selectors reads an AMD fleet's GPU series too
    import re

    from collector.formats.dcgm import FIELD_LIST
    from ioeconf.promql import DEFAULT_SELECTORS

    names = re.fullmatch(r'\{__name__=~"(.*)"\}', DEFAULT_SELECTORS[0])
    assert names is not None
    amd = [f.dcgm for f in FIELD_LIST if f.id < 0 and not f.dcgm.startswith(("nv_", "DCGM_"))]
    assert len(amd) == 13
    for name in amd:
        assert re.fullmatch(names.group(1), name) and re.fullmatch(names.group(1), "amd_" + name), name
