"""Straggler blame by arrival skew: the synthetic Kineto sets' ground truth and generated fleets."""

from __future__ import annotations

import csv
import json

import polars as pl
import pytest
from typer.testing import CliRunner

from analyzer import collectives, stragglers
from collector.formats import IngestContext
from collector.ingest import ingest_paths
from collector.store import Store
from ioe.cli import app
from tests.conftest import DATA
from tests.gen_collectives import SCENARIOS, gpu_samples
from tests.gen_collectives import collectives as gen_coll

KINETO = DATA / "kineto"
SETS = ("synthetic_4rank_straggler", "synthetic_4rank_straggler_ncclDevKernel")


@pytest.fixture(scope="module")
def kineto_store() -> Store:
    st = Store(":memory:")
    ingest_paths(st, [KINETO / s for s in SETS], IngestContext(ts_ns=0, host="h1"))
    return st


@pytest.mark.parametrize("trace_set", SETS)
def test_arrival_skew_equals_ground_truth(kineto_store: Store, trace_set: str) -> None:
    """skew 600 µs, transfer 400 µs, Σwait 1750 µs per step, culprit rank 2 (arrival_skew.csv)."""
    with kineto_store.cursor() as con:
        waits = collectives.rank_waits(collectives.load_collectives(con, f"kineto:{trace_set}"))
    got = collectives.instances(waits).to_dicts()
    want = list(
        csv.DictReader((KINETO / "hta_reference_results/synthetic_4rank_straggler/arrival_skew.csv").open())
    )
    assert len(got) == len(want) == 4
    for w, g in zip(want, got, strict=True):
        assert (g["comm_id"], g["coll_sn"], g["n_ranks"], g["last_rank"]) == (w["pg"], int(w["seq"]), 4, 2)
        assert g["skew_us"] == float(w["skew_us"]) and g["xfer_us"] == float(w["xfer_us"])
        assert g["sum_wait_rank_us"] == float(w["sum_wait_rank_us"])
    truth = list(csv.DictReader((KINETO / trace_set / "ground_truth.csv").open()))
    per_rank = waits.group_by("rank").agg(pl.col("wait_us").sum()).sort("rank")["wait_us"].to_list()
    assert per_rank == [sum(float(t["wait_us"]) for t in truth if t["rank"] == str(r)) for r in range(4)]
    assert per_rank == [2400.0, 2400.0, 0.0, 2200.0]  # arrival_skew_totals.txt


@pytest.mark.parametrize("trace_set", SETS)
def test_rank2_only_straggler_slow_compute(kineto_store: Store, trace_set: str) -> None:
    """Rank 2 has the shortest NCCL kernel (400 µs) yet is the culprit; its GEMM runs 1.52× its peers'."""
    with kineto_store.cursor() as con:
        verdict = stragglers.analyze(con, f"kineto:{trace_set}")
    found = verdict["origins"][f"kineto:{trace_set}"]
    assert [s["rank"] for s in found] == [2]
    s = found[0]
    assert s["kind"] == "persistent" and s["blame_us"] == 7000.0 and s["blame_share"] == 1.0
    assert s["cause"] == "slow_compute"
    ratio = next(e for e in s["evidence"] if e["metric"] == "compute_kernel_time_ratio")["ratio"]
    assert ratio == pytest.approx((4800 + 450) / 6 / ((3000 + 450) / 6))


def _fleet(name: str) -> Store:
    st = Store(":memory:")
    sc = SCENARIOS[name]
    st.write("collective_records", gen_coll(sc))
    st.write("gpu_samples", gpu_samples(sc))
    return st


def _verdict(name: str) -> list[dict]:
    with _fleet(name).cursor() as con:
        return stragglers.analyze(con, "inspector")["origins"]["inspector"]


def test_balanced_has_no_straggler() -> None:
    assert _verdict("balanced") == []


def test_throttled_gpu_is_named_with_evidence() -> None:
    found = _verdict("throttled")
    assert [s["rank"] for s in found] == [3]
    s = found[0]
    assert s["kind"] == "persistent" and s["persistence"] == 1.0
    assert (s["host"], s["gpu"], s["cause"]) == ("node0", 3, "gpu_throttled: thermal")
    ev = {e["metric"]: e for e in s["evidence"]}
    assert ev["sm_clock_mhz"]["culprit"] == 1400.0 and ev["sm_clock_mhz"]["peers_median"] == 1980.0
    assert ev["gpu_temp_c"]["culprit"] - ev["gpu_temp_c"]["peers_median"] == 23.0


def test_slow_link_cause() -> None:
    found = _verdict("slow_link")
    assert [(s["rank"], s["cause"]) for s in found] == [(6, "slow_link")]
    ev = {e["metric"]: e for e in found[0]["evidence"]}
    assert ev["pcie_replay_total"]["culprit"] > 0 and ev["pcie_replay_total"]["peers_median"] == 0.0


def test_intermittent_is_transient_in_its_windows() -> None:
    found = _verdict("intermittent")
    assert [s["rank"] for s in found] == [5]
    s = found[0]
    assert s["kind"] == "transient" and s["windows_flagged"] == 4 and s["windows_evaluated"] == 40
    assert s["persistence"] == pytest.approx(0.1)
    first = int(1_800_000_000_000_000 // 10e6)
    assert s["flagged_windows"] == [first + w for w in range(10, 14)]
    assert s["cause"] == "unexplained"  # healthy GPU: the delay is on the host side


def test_network_evidence_with_capability() -> None:
    with _fleet("slow_link").cursor() as con:
        ev = collectives.network_evidence(con, origin="inspector", capability_gbs=400.0).as_dict()
    assert ev["records"] == 8000
    assert ev["busbw_vs_capability"] == pytest.approx(ev["busbw_gbs_p50"] / 400.0)
    assert 1.0 < ev["jitter_p99_p50"] < 2.0
    assert ev["exposed_share"] is None  # no kernel trace for Inspector data


def test_cli_stragglers_json(tmp_path) -> None:
    path = tmp_path / "s.duckdb"
    with Store(path) as st:
        sc = SCENARIOS["throttled"]
        st.write("collective_records", gen_coll(sc))
        st.write("gpu_samples", gpu_samples(sc))
    result = CliRunner().invoke(app, ["stragglers", "--store", str(path), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert [(s["rank"], s["cause"]) for s in out["origins"]["inspector"]] == [(3, "gpu_throttled: thermal")]
    bad = CliRunner().invoke(app, ["stragglers", "--store", str(path), "--rank-gpu", "x"])
    assert bad.exit_code == 2 and "RANK=HOST:GPU" in bad.output


def test_cli_trace_report_json() -> None:
    result = CliRunner().invoke(app, ["trace-report", str(KINETO / "synthetic_4rank_straggler"), "--json"])
    assert result.exit_code == 0, result.output
    entry = json.loads(result.output)["sets"]["synthetic_4rank_straggler"]
    assert [r["comp_comm_overlap_pctg"] for r in entry["comm_comp_overlap"]] == [15.0, 15.0, 37.5, 15.79]
    assert [r["last_rank"] for r in entry["arrival_skew"]] == [2, 2, 2, 2]
