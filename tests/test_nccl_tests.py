"""nccl-tests logs and -J JSON → nccl_baselines, with the busbw formula enforced."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import DATA

from collector.formats import IngestContext
from collector.formats.nccl_tests import bus_factor, check_busbw, op_name, parse_json, parse_text
from collector.ingest import ingest_paths
from collector.store import Store

NCCL = DATA / "nccl"


def _text(name: str) -> str:
    return (NCCL / name).read_text()


def test_all_reduce_fixture_rows_are_exact() -> None:
    parsed = parse_text(_text("all_reduce_perf_8gpu_synthetic.log"), "ar.log", ts_ns=7)
    assert parsed.problems == []
    df = parsed.tables["nccl_baselines"]
    assert df.height == 25 * 2
    row = df.filter((df["size_bytes"] == 134217728) & ~df["in_place"]).row(0, named=True)
    assert (row["op"], row["n_gpus"], row["count"], row["dtype"], row["redop"], row["root"]) == (
        "AllReduce",
        8,
        33554432,
        "float",
        "sum",
        -1,
    )
    assert (row["time_us"], row["algbw_gbs"], row["busbw_gbs"], row["wrong"]) == (660.45, 203.22, 355.64, 0)
    assert row["host"] == "synthhost" and row["ts_ns"] == 7
    inplace = df.filter((df["size_bytes"] == 8388608) & df["in_place"]).row(0, named=True)
    assert (inplace["time_us"], inplace["busbw_gbs"]) == (49.08, 299.12)


def test_old_layout_without_redop_root_and_na_wrong() -> None:
    parsed = parse_text(_text("all_gather_perf_4gpu_old_layout.log"), "ag.log")
    assert parsed.problems == []
    df = parsed.tables["nccl_baselines"]
    row = df.filter((df["size_bytes"] == 4194304) & df["in_place"]).row(0, named=True)
    assert (row["op"], row["n_gpus"], row["redop"], row["root"], row["wrong"]) == (
        "AllGather",
        4,
        None,
        None,
        None,
    )
    assert (row["time_us"], row["algbw_gbs"], row["busbw_gbs"]) == (81.0, 51.78, 38.84)


def test_busbw_mismatch_is_a_problem_naming_the_line_other_rows_kept() -> None:
    parsed = parse_text(_text("broadcast_perf_2gpu_bad_row.log"), "bc.log")
    df = parsed.tables["nccl_baselines"]
    assert sorted(set(df["size_bytes"])) == [1048576, 4194304]
    assert df["root"].to_list() == [0, 0, 0, 0] and df["redop"].to_list() == ["none"] * 4
    assert [p.location for p in parsed.problems] == ["bc.log:13"]
    msg = parsed.problems[0].message
    assert "busbw 93.21 GB/s disagrees with algbw 46.60 × 1 (Broadcast, n=2) = 46.6 GB/s" in msg
    assert "2097152" in msg  # the bad line is quoted


def test_json_report_rows_and_bad_result() -> None:
    parsed = parse_json((NCCL / "reduce_scatter_perf_8gpu.json").read_text(), "rs.json", ts_ns=1)
    df = parsed.tables["nccl_baselines"]
    assert df.height == 4
    row = df.filter((df["size_bytes"] == 33554432) & ~df["in_place"]).row(0, named=True)
    assert (row["op"], row["n_gpus"], row["root"], row["redop"], row["host"]) == (
        "ReduceScatter",
        8,
        -1,
        "sum",
        "nodeC",
    )
    assert row["time_us"] == 210.25
    assert row["busbw_gbs"] == pytest.approx(33554432 / 210.25e3 * 7 / 8, abs=1e-6)
    assert [p.location for p in parsed.problems] == ["rs.json:results[2]"]
    assert "oops" in parsed.problems[0].message


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        ("AllReduce", 8, 1.75),
        ("AllGather", 4, 0.75),
        ("AlltoAll", 2, 0.5),
        ("Broadcast", 8, 1.0),
        ("SendRecv", 2, 1.0),
    ],
)
def test_bus_factor_formula(op: str, n: int, factor: float) -> None:
    assert bus_factor(op, n) == factor


def test_rounding_tolerance_uses_printed_precision() -> None:
    assert check_busbw("AllReduce", 8, "203.22", "355.64") is None  # 355.635 rounds either way
    assert check_busbw("AllReduce", 8, "203.22", "355.70") is not None
    assert check_busbw("AllReduce", 8, "1.2e+03", "2.1e+03") is None  # exponent form, coarse digits
    assert op_name("/opt/nccl-tests/build/all_reduce_perf_mpi") == "AllReduce"


def test_ingest_detects_both_formats(tmp_path: Path) -> None:
    store = Store()
    report = ingest_paths(store, [NCCL], IngestContext(ts_ns=3))
    assert report.files["nccl-tests"] == 3 and report.files["nccl-tests-json"] == 1
    assert report.rows["nccl_baselines"] == 50 + 8 + 4 + 4
    assert ingest_paths(store, [NCCL], IngestContext(ts_ns=3)).rows["nccl_baselines"] == 0
