"""NCCL Inspector JSONL and Prometheus textfile → collective_records."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import DATA
from inspector_gen import (
    BASE_US,
    COMM_ID,
    MSG_BYTES,
    P2P_COMM_ID,
    coll_record,
    lines,
    p2p_record,
    write_ranks,
)

from collector.formats import IngestContext
from collector.formats.nccl_inspector import FILE_FORMATS, parse_jsonl, parse_prom
from collector.ingest import ingest_paths
from collector.store import Store

INSPECTOR = DATA / "nccl_inspector"


def test_collective_record_fields_are_exact() -> None:
    text = lines([coll_record(rank=3, sn=1407, n_ranks=8)]).decode()
    parsed = parse_jsonl(text, "node0-pid4003.log")
    assert parsed.problems == []
    row = parsed.tables["collective_records"].row(0, named=True)
    assert row["origin"] == "inspector"
    assert (row["comm_id"], row["coll_sn"], row["rank"], row["kind"]) == (COMM_ID, 1407, 3, "coll")
    assert row["exec_us"] == 100 + 30 + 1407
    assert row["msg_bytes"] == MSG_BYTES
    assert row["n_ranks"] == 8 and row["nnodes"] == 1 and row["comm_name"] == "TP0"
    assert row["host"] == "node0" and row["pid"] == 4003
    assert row["busbw_gbs"] == pytest.approx(MSG_BYTES / (1537 * 1e3) * 14 / 8)
    assert row["timing_source"] == "kernel_gpu"
    assert row["start_us"] is None and row["kernel_events"] is None  # not verbose


def test_verbose_p2p_record_keeps_peer_and_event_times() -> None:
    text = lines([p2p_record(rank=2, sn=9, n_ranks=4, verbose=True)]).decode()
    row = parse_jsonl(text).tables["collective_records"].row(0, named=True)
    assert (row["comm_id"], row["coll_sn"], row["kind"], row["op"], row["peer"]) == (
        P2P_COMM_ID,
        9,
        "p2p",
        "Send",
        3,
    )
    assert row["start_us"] == BASE_US + 9000 + 10
    assert row["stop_us"] - row["start_us"] == 100 + 20 + 9
    kernels = json.loads(row["kernel_events"])
    assert kernels[0]["channel_id"] == 0 and kernels[0]["kernel_start_ts"] == row["start_us"] + 1


def test_bad_lines_are_problems_with_file_line_and_quote_good_lines_kept() -> None:
    good = lines([coll_record(0, 1, 2), coll_record(0, 2, 2)]).decode().splitlines()
    no_id = coll_record(0, 3, 2)
    del no_id["header"]["id"]
    wrong_type = coll_record(0, 4, 2)
    wrong_type["coll_perf"]["coll_exec_time_us"] = "fast"
    text = "\n".join(
        [good[0], "this is not json", json.dumps(no_id), json.dumps(wrong_type), "[1, 2]", "", good[1]]
    )
    parsed = parse_jsonl(text, "d/n-pid1.log")
    df = parsed.tables["collective_records"]
    assert df["coll_sn"].to_list() == [1, 2]
    where = [p.location for p in parsed.problems]
    assert where == ["d/n-pid1.log:2", "d/n-pid1.log:3", "d/n-pid1.log:4", "d/n-pid1.log:5"]
    messages = [p.message for p in parsed.problems]
    assert "not JSON" in messages[0] and "'this is not json'" in messages[0]
    assert "header.id" in messages[1]
    assert "coll_perf.coll_exec_time_us must be a finite number" in messages[2] and '"fast"' in messages[2]
    assert "not a JSON object" in messages[3]


def test_dump_stats_lines_are_skipped_not_refused() -> None:
    text = lines([{"header": {"id": COMM_ID, "rank": 0}, "metadata": {}, "dump_stats": {"coll_records": 5}}])
    parsed = parse_jsonl(text.decode())
    assert parsed.tables == {} and parsed.problems == []


def test_ingest_picks_up_inspector_logs_exactly_once(tmp_path: Path) -> None:
    write_ranks(tmp_path / "dump", n_ranks=4, sns=range(5), verbose=True)
    store = Store()
    report = ingest_paths(store, [tmp_path / "dump"], IngestContext(ts_ns=1))
    assert report.files["nccl-inspector-jsonl"] == 4
    assert report.rows["collective_records"] == 4 * (5 + 5)
    again = ingest_paths(store, [tmp_path / "dump"], IngestContext(ts_ns=2))
    assert again.rows["collective_records"] == 0
    with store.cursor() as cur:
        got = cur.execute(
            "SELECT rank, exec_us FROM collective_records WHERE kind='coll' AND coll_sn=4 ORDER BY rank"
        ).fetchall()
    assert got == [(0, 104.0), (1, 114.0), (2, 124.0), (3, 134.0)]


def test_sniff_does_not_claim_plain_logs() -> None:
    jsonl = next(f for f in FILE_FORMATS if f.name == "nccl-inspector-jsonl")
    assert not jsonl.sniff("app.log", b"2026-01-01 INFO started\n")
    assert not jsonl.sniff("data.json", lines([coll_record(0, 1, 2)]))
    assert jsonl.sniff("node0-pid1.log", lines([coll_record(0, 1, 2)]))


# -- Prometheus textfile ---------------------------------------------------------------------
def test_prom_textfile_with_coll_sn_joins_on_comm_and_sn(tmp_path: Path) -> None:
    text = (INSPECTOR / "nccl_inspector_metrics_GPU-0.prom").read_text()
    parsed = parse_prom(text, "x.prom", snapshot_us=5.0)
    assert parsed.problems == []
    df = parsed.tables["collective_records"].sort("rank")
    assert df.height == 2
    row = df.row(0, named=True)
    assert (row["origin"], row["comm_id"], row["coll_sn"], row["rank"]) == ("inspector-prom", "0xabc1", 77, 0)
    assert (row["exec_us"], row["busbw_gbs"], row["algbw_gbs"]) == (1234.0, 301.5, 172.3)
    assert row["op"] == "AllReduce" and row["n_ranks"] == 8 and row["host"] == "gpu-node-1"


def test_prom_textfile_aggregates_get_series_ids_and_minus_one_sn() -> None:
    text = (INSPECTOR / "aggregate_labels.prom").read_text()
    parsed = parse_prom(text, "agg.prom", snapshot_us=9.0)
    df = parsed.tables["collective_records"].sort("comm_id")
    assert df["coll_sn"].to_list() == [-1, -1, -1]
    assert set(df["kind"]) == {"coll", "p2p"}
    ar = df.filter(df["op"] == "AllReduce").row(0, named=True)
    assert ar["comm_id"] == "prom:TP0|AllReduce|1.00MB|Ring_LL128"
    assert (ar["exec_us"], ar["busbw_gbs"], ar["dump_ts_us"]) == (88.5, 20.25, 9.0)
    assert [p.location for p in parsed.problems] == ["agg.prom:9"]
    assert "not a number" in parsed.problems[0].message


def test_prom_textfile_ingests(tmp_path: Path) -> None:
    shutil.copy(INSPECTOR / "aggregate_labels.prom", tmp_path / "nccl_inspector_metrics_GPU-1.prom")
    store = Store()
    report = ingest_paths(store, [tmp_path], IngestContext(ts_ns=1))
    assert report.files["nccl-inspector-prom"] == 1
    assert report.rows["collective_records"] == 3
