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


def test_intermittent_is_named_in_its_windows() -> None:
    found = _verdict("intermittent")
    assert [s["rank"] for s in found] == [5]
    s = found[0]
    assert s["kind"] == "intermittent" and s["windows_flagged"] == 4 and s["windows_evaluated"] == 40
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


# ---- the vectorized rank_waits / blame_by_window equal the plain statement of the rules ----------

_KEY = ["origin", "comm_id", "coll_sn"]


def _reference_waits(records: pl.DataFrame) -> pl.DataFrame:
    """Rules 1–3 written with polars windows over the string key (the slow, obvious version)."""
    df = records.filter(pl.col("coll_sn") >= 0).with_columns(
        pl.len().over(_KEY).alias("_n"), pl.col("start_us").is_not_null().all().over(_KEY).alias("timed")
    )
    df = df.filter(pl.col("_n") >= 2)
    timed = df.filter(pl.col("timed")).with_columns(
        (pl.col("start_us").max().over(_KEY) - pl.col("start_us")).alias("wait_us"),
        (pl.col("start_us").max() - pl.col("start_us").min()).over(_KEY).alias("skew_us"),
        (pl.col("stop_us").median() - pl.col("start_us").max()).over(_KEY).alias("transfer_us"),
        pl.col("rank").sort_by(["start_us", "rank"]).last().over(_KEY).alias("last_rank"),
    )
    untimed = df.filter(~pl.col("timed")).with_columns(
        (pl.col("exec_us") - pl.col("exec_us").min().over(_KEY)).alias("wait_us"),
        (pl.col("exec_us").max() - pl.col("exec_us").min()).over(_KEY).alias("skew_us"),
        pl.col("exec_us").min().over(_KEY).alias("transfer_us"),
        pl.col("rank").sort_by(["exec_us", "rank"]).first().over(_KEY).alias("last_rank"),
    )
    return pl.concat([timed, untimed]).drop("_n")


def _reference_blame(waits: pl.DataFrame, window_us: float) -> pl.DataFrame:
    t = pl.coalesce(["start_us", "t_us"]).min().over(_KEY)
    w = waits.with_columns((t.fill_null(0) // window_us).cast(pl.Int64).alias("window"))
    inst = w.group_by(["window", *_KEY]).agg(
        pl.col("last_rank").first().alias("rank"), pl.col("wait_us").sum().alias("blame_us")
    )
    caused = inst.group_by(["window", "rank"]).agg(pl.col("blame_us").sum())
    waited = w.group_by(["window", "rank"]).agg(pl.col("wait_us").sum().alias("waited_us"))
    n_inst = inst.group_by("window").agg(pl.len().alias("instances"))
    out = waited.join(caused, on=["window", "rank"], how="left").with_columns(
        pl.col("blame_us").fill_null(0.0)
    )
    out = out.join(n_inst, on="window").with_columns(
        (pl.col("blame_us") / pl.col("blame_us").sum().over("window")).fill_nan(0.0).alias("share")
    )
    return out.sort(["window", "rank"])


def _messy(sn_offset: int) -> pl.DataFrame:
    """Generated records with every case the rules name: untimed instances (no start), null exec
    times, tied starts and exec times, a Prometheus aggregate (coll_sn −1), single-rank instances,
    two communicators and two origins, rows shuffled; ``sn_offset`` moves one communicator's
    sequence numbers far away (sparse and huge keys)."""
    recs = gen_coll(SCENARIOS["throttled"], n_ranks=4, n_windows=6, per_window=10)
    sn, rank = pl.col("coll_sn"), pl.col("rank")
    untimed = sn % 3 == 0
    recs = recs.with_columns(
        pl.when(untimed).then(None).otherwise(pl.col("start_us")).alias("start_us"),
        pl.when(untimed).then(None).otherwise(pl.col("stop_us")).alias("stop_us"),
        pl.when((sn % 7 == 0) & (rank == 1))
        .then(None)
        .when(untimed)
        .then((pl.col("exec_us") / 50).round() * 50)
        .otherwise(pl.col("exec_us"))
        .alias("exec_us"),
    )
    recs = recs.with_columns(
        pl.when(sn % 5 == 1).then((pl.col("start_us") / 1000).round() * 1000).otherwise(pl.col("start_us")),
        pl.when(sn == 4).then(-1).otherwise(sn).alias("coll_sn"),
        pl.when(sn % 2 == 0).then(pl.lit("0xdef")).otherwise(pl.col("comm_id")).alias("comm_id"),
        pl.when(sn % 4 == 3).then(pl.lit("kineto:x")).otherwise(pl.col("origin")).alias("origin"),
    ).filter(~((pl.col("coll_sn") == 8) & (rank > 0)))
    recs = recs.with_columns(
        pl.when(pl.col("comm_id") == "0xdef").then(sn + sn_offset).otherwise(sn).alias("coll_sn"),
        pl.col("start_us").alias("t_us"),
    )
    return recs.sample(fraction=1.0, shuffle=True, seed=3)


@pytest.mark.parametrize("sn_offset", [0, 10**9, 2**61])
def test_vectorized_waits_and_blame_equal_reference(sn_offset: int) -> None:
    recs = _messy(sn_offset)
    got, want = collectives.rank_waits(recs), _reference_waits(recs)
    assert got.columns == want.columns and got.height == want.height > 100
    assert got.equals(want)  # same rows, same order, bit-equal floats and nulls
    assert got["timed"].sum() > 0 and (~got["timed"]).sum() > 0 and got["wait_us"].null_count() > 0
    assert stragglers.blame_by_window(got, 10e6).equals(_reference_blame(want, 10e6))


def test_group_median_is_bit_equal_to_polars() -> None:
    """Even groups take ``lo + (hi − lo)·0.5`` like polars; ``(lo + hi)/2`` differs in the last bit."""
    import numpy as np

    rng = np.random.default_rng(5)
    n = 4000
    vals = rng.random(3 * n) * 10.0 ** rng.integers(-3, 16, 3 * n)
    ids = np.repeat(np.arange(n), 3)
    valid = np.tile([True, True, False], n)  # two valid values per group, one null
    valid[:30] = True  # ... and a few odd-sized groups
    got = collectives.group_median(ids, n, vals, valid)
    frame = pl.DataFrame({"g": ids, "v": pl.Series(vals).scatter(np.flatnonzero(~valid), None)})
    want = frame.group_by("g", maintain_order=True).agg(pl.col("v").median())["v"].to_numpy()
    assert np.array_equal(got, want)
    lo, hi = np.minimum(vals[0::3], vals[1::3]), np.maximum(vals[0::3], vals[1::3])
    assert (((lo + hi) / 2)[10:] != want[10:]).sum() > 100
