"""IOE's breakdowns equal Holistic Trace Analysis 0.5.0's reference answers to the microsecond.

The reference CSVs in ``tests/data/kineto/hta_reference_results/`` were produced by HTA itself
(see COMMANDS.md there); every set is checked with and without the last profiler step.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from analyzer import hta
from collector.formats import IngestContext
from collector.ingest import ingest_paths
from collector.store import Store
from tests.conftest import DATA

KINETO = DATA / "kineto"
REF = KINETO / "hta_reference_results"
CASES = sorted(p.name for p in REF.iterdir() if p.is_dir())
TABLES = ("temporal_breakdown", "comm_comp_overlap", "per_rank_merged_busy", "kernel_type_breakdown")


def _set_of(case: str) -> tuple[str, bool]:
    last = case.endswith("_include_last_step")
    return case.removesuffix("_include_last_step"), last


@pytest.fixture(scope="module")
def store() -> Store:
    st = Store(":memory:")
    sets = sorted({_set_of(c)[0] for c in CASES})
    report = ingest_paths(st, [KINETO / s for s in sets], IngestContext(ts_ns=0))
    assert report.problems == []
    assert report.files["kineto"] == 11
    return st


def _same(want: str, got: object) -> bool:
    if isinstance(got, str):
        return got == want
    return float(want) == pytest.approx(float(got), abs=0)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("table", TABLES)
def test_breakdown_equals_hta(store: Store, case: str, table: str) -> None:
    trace_set, last = _set_of(case)
    with store.cursor() as con:
        got = hta.breakdowns(con, trace_set, include_last_step=last)[table].to_dicts()
    want = list(csv.DictReader((REF / case / f"{table}.csv").open()))
    assert len(got) == len(want)
    for w, g in zip(want, got, strict=True):
        for col, value in w.items():
            assert _same(value, g[col]), (
                f"{case} {table} rank={w.get('rank')} {col}: want {value}, got {g[col]}"
            )


def test_independent_check_microseconds(store: Store) -> None:
    """The µs totals behind the percentages (comm busy, overlap) match the stdlib re-implementation."""
    for case in CASES:
        trace_set, last = _set_of(case)
        with store.cursor() as con:
            got = hta.breakdowns(con, trace_set, include_last_step=last)["comm_comp_overlap"].to_dicts()
        want = list(csv.DictReader((REF / case / "independent_stdlib_check.csv").open()))
        for w, g in zip(want, got, strict=True):
            assert int(w["comm_busy(us)"]) == g["comm_busy(us)"]
            assert int(w["comm_comp_overlap(us)"]) == g["comm_comp_overlap(us)"]


def test_ncclDevKernel_answers_where_hta_fails(store: Store) -> None:
    """HTA's straggler finder raises on ncclDevKernel_*; IOE still answers, as for ncclKernel_*."""
    with store.cursor() as con:
        dev = hta.breakdowns(con, "synthetic_4rank_straggler_ncclDevKernel")["comm_comp_overlap"]
        old = hta.breakdowns(con, "synthetic_4rank_straggler")["comm_comp_overlap"]
    assert dev["comp_comm_overlap_pctg"].to_list() == [15.0, 15.0, 37.5, 15.79]
    assert dev.equals(old)


def test_merge_intervals_touching_and_nested() -> None:
    import numpy as np

    starts, ends = hta.merge_intervals(np.array([0, 10, 12, 30]), np.array([10, 5, 1, 5]))
    assert starts.tolist() == [0, 30] and ends.tolist() == [15, 35]


def test_paths_exist() -> None:
    assert Path(REF / "COMMANDS.md").is_file()


@pytest.mark.parametrize("last", [False, True])
def test_trace_report_without_store_equals_store(store: Store, last: bool) -> None:
    """``ioe trace-report`` works on the parsed frames; it equals the store-backed analyses."""
    from analyzer.collectives import instances, load_collectives, rank_waits
    from ioe.commands.trace_report import report

    sets = sorted({_set_of(c)[0] for c in CASES})
    got = report([KINETO / s for s in sets], include_last_step=last)
    assert sorted(got["sets"]) == sets and got["problems"] == []
    with store.cursor() as con:
        for s in sets:
            want = {k: v.to_dicts() for k, v in hta.breakdowns(con, s, last).items()}
            want["arrival_skew"] = instances(rank_waits(load_collectives(con, f"kineto:{s}"))).to_dicts()
            assert json.dumps(got["sets"][s]) == json.dumps(want), s
    tb = got["sets"]["nccl_parser_config_1rank"]["temporal_breakdown"][0]
    assert tb["kernel_time(us)"] == (660550 if last else 435586)


def test_trace_report_drops_duplicate_rows_like_the_store(tmp_path: Path) -> None:
    """A rank's trace present twice counts once (natural key, first row wins), as ``ioe ingest`` would."""
    from ioe.commands.trace_report import report

    folder = tmp_path / "synthetic_4rank_straggler"
    folder.mkdir()
    for f in (KINETO / "synthetic_4rank_straggler").glob("rank-*.json.gz"):
        shutil.copy(f, folder / f.name)
    shutil.copy(folder / "rank-2.json.gz", folder / "rank-2-again.json.gz")
    twice = report([folder])["sets"]["synthetic_4rank_straggler"]
    once = report([KINETO / "synthetic_4rank_straggler"])["sets"]["synthetic_4rank_straggler"]
    assert twice == once
    assert [r["n_ranks"] for r in twice["arrival_skew"]] == [4, 4, 4, 4]
    assert [r["comp_comm_overlap_pctg"] for r in twice["comm_comp_overlap"]] == [15.0, 15.0, 37.5, 15.79]
