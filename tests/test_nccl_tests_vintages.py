"""Real nccl-tests logs of several vintages and scales (tests/data/nccl_vintages/SOURCES.md):
collective name and GPU count kept, no refused lines; preambles and INFO lines skipped."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from collector.formats import IngestContext
from collector.formats.nccl_tests import parse_text, sniff_text
from collector.ingest import ingest_paths
from collector.store import Store
from tests.conftest import DATA

LOGS = DATA / "nccl_vintages"

# file -> {(op, n_gpus): rows}, host
EXPECTED = {
    "v100_dgx2_12gpu_2019_two_tests.log": ({("AllReduce", 12): 62, ("Broadcast", 12): 62}, "seville"),
    "a100_16rank_sharp_2021.log": ({("AllReduce", 16): 58}, ""),  # two nodes: no single host
    "gb200_nvl72_allreduce_excerpt.log": ({("AllReduce", 72): 10}, ""),  # one rank line of 72
    "gb200_20racks_allreduce_excerpt.log": ({("AllReduce", 1440): 6}, ""),
}


def test_every_log_has_an_expectation_and_a_source() -> None:
    names = {p.name for p in LOGS.glob("*.log")}
    assert names == set(EXPECTED)
    sources = (LOGS / "SOURCES.md").read_text()
    assert all(f"| {n} |" in sources for n in names)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_collective_gpu_count_and_no_refused_line(name: str) -> None:
    text = (LOGS / name).read_text()
    assert sniff_text(name, text.encode()[:65536])
    parsed = parse_text(text, name)
    assert parsed.problems == []
    df = parsed.tables["nccl_baselines"]
    groups = {(r["op"], r["n_gpus"]): r["len"] for r in df.group_by("op", "n_gpus").len().to_dicts()}
    expected, host = EXPECTED[name]
    assert groups == expected
    assert set(df["host"]) == {host}


def test_values_of_a_2019_row_and_its_error_column() -> None:
    df = parse_text((LOGS / "v100_dgx2_12gpu_2019_two_tests.log").read_text(), "v").tables["nccl_baselines"]
    row = df.filter((pl.col("op") == "AllReduce") & (pl.col("size_bytes") == 8589934592) & pl.col("in_place"))
    assert row.select("time_us", "algbw_gbs", "busbw_gbs", "wrong", "redop").row(0) == (
        127443.0, 67.40, 123.57, 0, "sum")  # fmt: skip
    bcast = df.filter(pl.col("op") == "Broadcast")
    assert set(bcast["root"]) == {0} and set(bcast["redop"]) == {None}


def test_gpu_count_from_the_ratio_when_no_rank_line_is_left() -> None:
    """The NVL72 excerpt without its one rank line: nothing says 72 but busbw/algbw
    (586.06 / 297.16 = 1.9722 = 2·71/72), so the count and the op come from the ratio."""
    text = (LOGS / "gb200_nvl72_allreduce_excerpt.log").read_text().split("\n", 1)[1]
    parsed = parse_text(text, "x")
    assert parsed.problems == []
    df = parsed.tables["nccl_baselines"]
    assert set(df["n_gpus"]) == {72} and set(df["op"]) == {"AllReduce"}


def test_gpu_count_from_nccl_nranks_and_from_the_launcher() -> None:
    """Rank lines cut from the 16-rank A100 log; NCCL's INFO line (the shape NCCL_DEBUG=INFO
    prints, e.g. nccl-tests issue #29) or the mpirun -np count × nThread×nGpus then give 16."""
    text = (LOGS / "a100_16rank_sharp_2021.log").read_text()
    no_ranks = "\n".join(line for line in text.splitlines() if "Rank " not in line)
    by_launcher = parse_text(no_ranks, "x").tables["nccl_baselines"]
    assert set(by_launcher["n_gpus"]) == {16}
    info = (
        "a0000:1:2 [1] NCCL INFO comm 0x7f5780001ca0 rank 15 nranks 16 cudaDev 7 nvmlDev 7 - Init COMPLETE\n"
    )
    no_launcher = "\n".join(line for line in no_ranks.splitlines() if "mpirun" not in line)
    by_nccl = parse_text(info + no_launcher, "x").tables["nccl_baselines"]
    assert set(by_nccl["n_gpus"]) == {16} and set(by_nccl["op"]) == {"AllReduce"}


def test_a_broken_row_is_still_refused_and_named() -> None:
    text = (
        (LOGS / "a100_16rank_sharp_2021.log")
        .read_text()
        .replace("38180   56.25  105.46", "38180   56.25  99.99")
    )
    parsed = parse_text(text, "abci.log")
    assert [p.location for p in parsed.problems] == ["abci.log:64"]
    assert parsed.tables["nccl_baselines"].height == 56


def test_ingest_reads_every_vintage(tmp_path: Path) -> None:
    report = ingest_paths(Store(), [LOGS], IngestContext(ts_ns=1))
    assert report.files["nccl-tests"] == 4 and report.problems == []
    assert report.rows["nccl_baselines"] == 62 * 2 + 58 + 10 + 6


def test_the_tests_own_dash_n_is_not_a_process_count() -> None:
    """`mpirun --hostfile h ./broadcast_perf … -n 50`: 50 is the test's iterations, not processes.
    Broadcast's busbw does not depend on the count, so only the header can say 12 GPUs."""
    text = (LOGS / "v100_dgx2_12gpu_2019_two_tests.log").read_text()
    table = text[text.index("./build/broadcast_perf") :].split("\n", 1)[1]
    body = "mpirun --hostfile hosts ./build/broadcast_perf -b 8 -e 10240M -f 2 -g 12 -n 50\n" + "\n".join(
        line for line in table.splitlines() if "Rank " not in line
    )
    df = parse_text(body, "x").tables["nccl_baselines"]
    assert set(df["n_gpus"]) == {12} and set(df["op"]) == {"Broadcast"}
