"""Kineto trace import: HTA's preprocessing, rank detection, collectives from nccl args."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from collector.errors import ParseError
from collector.formats import IngestContext, kineto
from collector.ingest import ingest_paths, read_head
from collector.store import Store
from tests.conftest import DATA

KINETO = DATA / "kineto"
CTX = IngestContext(ts_ns=0, host="node7")


def _load(rel: str) -> dict:
    path = KINETO / rel
    parsed = kineto.load(path, CTX)
    assert parsed.problems == []
    return parsed.tables


def test_sniff_accepts_kineto_only() -> None:
    head = read_head(KINETO / "nccl_parser_config_1rank" / "nccl_data.json.gz")
    assert kineto.sniff("nccl_data.json.gz", head)
    assert not kineto.sniff("x.json", b'{"traceEvents": [{"ph": "X"}]}')  # no Kineto marker
    assert not kineto.sniff("x.log", b'{"header": {"id": "0x1"}}')


def test_ns_timestamps_rounded_inward() -> None:
    """4458677009853.422 + 2636.669 → ts ceil = ...854, end floor(...012490.091) = ...012490."""
    kernels = _load("nccl_parser_config_1rank/nccl_data.json.gz")["kernel_events"]
    row = kernels.filter(kernels["correlation"] == 60047).row(0, named=True)
    assert row["ts_us"] == 4458677009854
    assert row["dur_us"] == 4458677012490 - 4458677009854
    assert row["kernel_type"] == "COMMUNICATION" and row["is_comm"]


def test_last_step_flags() -> None:
    kernels = _load("nccl_parser_config_1rank/nccl_data.json.gz")["kernel_events"]
    comm = kernels.filter(kernels["is_comm"])
    assert comm.height == 21
    assert int(comm["kept"].sum()) == 14  # reference: 14 comm kernels without the last step
    assert int(comm["kept_with_last"].sum()) == 21
    assert sorted(set(kernels["iteration"].to_list()) - {-1}) == [4, 5, 6]


def test_collectives_from_kernel_args() -> None:
    coll = _load("synthetic_4rank_straggler/rank-2.json.gz")["collective_records"]
    assert coll.height == 4
    row = coll.sort("coll_sn").row(0, named=True)
    assert row["origin"] == "kineto:synthetic_4rank_straggler"
    assert (row["comm_id"], row["coll_sn"], row["rank"], row["op"]) == ("0", 1, 2, "AllReduce")
    assert row["msg_bytes"] == 8388608 * 4
    assert row["start_us"] == 1700000000001630 and row["exec_us"] == 400.0
    assert row["n_ranks"] == 4 and row["host"] == "node7"
    assert row["algbw_gbs"] == pytest.approx(33554432 / 400 / 1e3)
    assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * 1.5)


def test_collectives_without_args_use_kernel_name(tmp_path: Path) -> None:
    coll = _load("trace_filter_2rank/sampled_rank-1.json.gz")["collective_records"]
    assert coll.height == 10
    assert set(coll["op"].to_list()) == {"SendRecv"}
    assert set(coll["kind"].to_list()) == {"p2p"}
    assert sorted(coll["coll_sn"].to_list()) == list(range(10))
    assert set(coll["rank"].to_list()) == {1}


def _write_trace(path: Path, events: list[dict], **meta: object) -> Path:
    path.write_bytes(gzip.compress(json.dumps({"schemaVersion": 1, **meta, "traceEvents": events}).encode()))
    return path


def test_args_from_enclosing_cpu_op_and_vllm_rank(tmp_path: Path) -> None:
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 9, "tid": 9, "ts": 100, "dur": 50,
         "args": {"Collective name": "_allgather_base", "In msg nelems": 1024, "Out msg nelems": 4096,
                  "Group size": 4, "dtype": "BFloat16", "Process Group Name": "3", "Seq": 17}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 9, "tid": 9, "ts": 120,
         "dur": 5, "args": {"correlation": 5}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL(x)", "pid": 0, "tid": 7,
         "ts": 200, "dur": 80, "args": {"stream": 7, "correlation": 5}},
        {"ph": "X", "cat": "kernel", "name": "no_dur_kernel", "pid": 0, "tid": 7, "ts": 300,
         "args": {"stream": 7, "correlation": 6}},
    ]  # fmt: skip
    set_dir = tmp_path / "vllm_run"
    set_dir.mkdir()
    path = _write_trace(set_dir / "dp0_pp0_tp3_worker.pt.trace.json.gz", events)
    tables = kineto.load(path, CTX).tables
    row = tables["collective_records"].row(0, named=True)
    assert (row["rank"], row["comm_id"], row["coll_sn"], row["op"]) == (3, "3", 17, "AllGather")
    assert row["msg_bytes"] == 4096 * 2
    assert tables["kernel_events"].height == 1  # the event without dur is dropped


def test_bad_json_names_file(tmp_path: Path) -> None:
    bad = tmp_path / "rank-0.json"
    bad.write_text('{"schemaVersion": 1, "traceEvents": [ {"ph": ')
    with pytest.raises(ParseError, match=r"rank-0\.json.*invalid JSON"):
        kineto.load(bad, CTX)


def test_not_a_trace(tmp_path: Path) -> None:
    with pytest.raises(ParseError, match="no traceEvents"):
        kineto.parse_document({"schemaVersion": 1}, "x", "f.json")


def test_ingest_dir_keeps_good_files(tmp_path: Path) -> None:
    good = _write_trace(tmp_path / "rank-1.json.gz", [])
    (tmp_path / "rank-2.json").write_text('{"schemaVersion": 1, "traceEvents": [ oops')
    st = Store(":memory:")
    report = ingest_paths(st, [tmp_path, KINETO / "synthetic_4rank_straggler"], CTX)
    assert good.exists()
    assert report.rows["collective_records"] == 16 and report.rows["kernel_events"] == 48
    assert len(report.problems) == 1 and "rank-2.json" in report.problems[0].location


def test_typed_decode_equals_full_decode() -> None:
    """The msgspec typed decode (only the keys read) parses to the same frames as a full orjson decode."""
    import orjson

    for rel in ("nccl_parser_config_1rank/nccl_data.json.gz", "trace_filter_2rank/sampled_rank-0.json.gz"):
        path = KINETO / rel
        typed = kineto.read_trace(path)
        assert "Input Dims" not in str(typed["traceEvents"][:200])  # keys the parser never reads are gone
        full = orjson.loads(gzip.decompress(path.read_bytes()))
        a = kineto.parse_document(typed, path.parent.name, path.name)
        b = kineto.parse_document(full, path.parent.name, path.name)
        assert set(a.tables) == set(b.tables) == {"kernel_events", "collective_records"}
        for table in a.tables:
            assert a.tables[table].equals(b.tables[table]), (rel, table)
    kernels = a.tables["kernel_events"]
    assert kernels.height == 1204 and int(kernels["dur_us"].sum()) > 0


def test_non_object_events_fall_back_to_full_decode(tmp_path: Path) -> None:
    """A document the typed decode refuses (a number among the events) still parses; the bad entry
    is reported and the good event kept."""
    doc = {"schemaVersion": 1, "traceEvents": [7, {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 10,
           "dur": 5, "args": {"stream": 7, "correlation": 1}}]}  # fmt: skip
    path = tmp_path / "rank-3.json"
    path.write_text(json.dumps(doc))
    parsed = kineto.load(path, CTX)
    assert [p.message for p in parsed.problems] == ["1 traceEvents entries are not objects; skipped"]
    row = parsed.tables["kernel_events"].row(0, named=True)
    assert (row["rank"], row["ts_us"], row["dur_us"], row["kernel_type"]) == (3, 10, 5, "COMPUTATION")
