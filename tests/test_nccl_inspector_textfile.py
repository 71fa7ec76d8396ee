"""NCCL Inspector Prometheus textfile: P2P operation, bucketed sizes kept as a range, each label in
its column, ``ioe ingest --ts`` honoured (samples: tests/data/nccl_inspector_textfile/SOURCES.md)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from collector.formats.nccl_inspector import message_size_bytes, parse_prom, sniff_prom
from collector.store import SCHEMA_VERSION, Store
from ioe.cli import app
from tests.conftest import DATA

FILES = DATA / "nccl_inspector_textfile"
MIB, GIB = 1 << 20, 1 << 30


def _rows(name: str) -> list[dict]:
    text = (FILES / name).read_text()
    assert sniff_prom(name, text.encode())
    parsed = parse_prom(text, name, snapshot_us=5.0)
    assert parsed.problems == []
    return parsed.tables["collective_records"].to_dicts()


def test_documented_aggregate_row_each_label_in_its_column() -> None:
    (row,) = _rows("rccl_inspector_readme_allreduce.prom")
    assert (row["kind"], row["op"], row["n_ranks"], row["nnodes"], row["host"]) == (
        "coll",
        "AllReduce",
        8,
        1,
        "node001",
    )
    assert (row["msg_bytes"], row["msg_bytes_max"]) == (8 * MIB, 9 * MIB)
    assert row["algo_proto"] == "RING_SIMPLE" and row["timing_source"] is None
    assert (row["exec_us"], row["busbw_gbs"]) == (1772.12, 144.832)


def test_p2p_operation_and_gb_bucket() -> None:
    rows = {r["op"]: r for r in _rows("p2p_and_gb_buckets_SYNTHETIC.prom")}
    assert set(rows) == {"Send", "Recv"}
    send = rows["Send"]
    assert send["kind"] == "p2p" and (send["msg_bytes"], send["msg_bytes_max"]) == (4 * GIB, 5 * GIB)
    assert (send["exec_us"], send["busbw_gbs"]) == (110230.0, 41.5)
    assert rows["Recv"]["comm_id"] != send["comm_id"]  # two series, two rows


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1.00MB", (MIB, MIB)), ("8-9MB", (8 * MIB, 9 * MIB)), ("256.00KB", (256 << 10, 256 << 10)),
     ("4096", (4096, 4096)), ("huge", (None, None))],
)  # fmt: skip
def test_message_size_text(text: str, expected: tuple) -> None:
    assert message_size_bytes(text) == expected


def test_ingest_ts_wins_over_mtime(tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    target = src / "nccl.prom"
    shutil.copy(FILES / "rccl_inspector_readme_allreduce.prom", target)
    os.utime(target, (1_600_000_000, 1_600_000_000))
    for ts, expected_us in (("1700000000", 1.7e15), (None, 1.6e15)):
        store = tmp_path / f"s{ts}.duckdb"
        args = ["ingest", str(src), "--store", str(store), "--json"] + (["--ts", ts] if ts else [])
        got = CliRunner().invoke(app, args)
        assert got.exit_code == 0, got.output
        assert json.loads(got.stdout)["files"] == {"nccl-inspector-prom": 1}
        con = duckdb.connect(str(store), read_only=True)
        try:
            assert con.execute("SELECT dump_ts_us FROM collective_records").fetchall() == [(expected_us,)]
        finally:
            con.close()


def test_a_version_2_store_gains_the_new_columns(tmp_path: Path) -> None:
    path = tmp_path / "v2.duckdb"
    Store(path).close()
    con = duckdb.connect(str(path))
    con.execute("ALTER TABLE collective_records DROP COLUMN algo_proto")
    con.execute("ALTER TABLE collective_records DROP COLUMN msg_bytes_max")
    con.execute("UPDATE ioe_schema SET version = 2")
    con.close()
    with Store(path) as st:
        assert st.schema_version() == SCHEMA_VERSION  # migrated through every version
        cols = {r[0] for r in st.con.execute("DESCRIBE collective_records").fetchall()}
        assert {"algo_proto", "msg_bytes_max"} <= cols
        parsed = parse_prom((FILES / "rccl_inspector_readme_allreduce.prom").read_text(), "x", 1.0)
        assert st.write("collective_records", parsed.batches["collective_records"]) == 1
