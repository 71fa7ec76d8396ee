"""An unrecognized file says why — the closest format and what it lacked — on the terminal, in
the JSON report and as an ``ingest_errors`` row; recognized files beside it are unaffected."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
from typer.testing import CliRunner

from ioe.cli import app
from tests.conftest import DATA

# an engine IOE does not map: Hugging Face text-embeddings-inference's te_* families
TEI = (
    "# TYPE te_queue_size gauge\nte_queue_size 3\n"
    '# TYPE te_request_count counter\nte_request_count{method="single"} 12\n'
)


def _tree(tmp_path: Path) -> Path:
    src = tmp_path / "in"
    src.mkdir()
    (src / "tei.prom").write_text(TEI)
    (src / "chrome.json").write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}]}')
    (src / "cut.log").write_text("all_reduce_perf done: peak busbw 355 GB/s\n")
    (src / "blob.bin").write_bytes(b"\x00\x01\x02garbage")
    (src / "empty.txt").write_text("")
    (src / "nim.prom").write_bytes((DATA / "engines" / "nim_llama32_1b_h100.prom").read_bytes())
    return src


def test_reasons_in_report_terminal_and_ingest_errors(tmp_path: Path) -> None:
    src, store = _tree(tmp_path), tmp_path / "s.duckdb"
    got = CliRunner().invoke(app, ["ingest", str(src), "--store", str(store), "--json"])
    assert got.exit_code == 0, got.output
    out = json.loads(got.stdout)
    assert out["files"] == {"prometheus-scrape": 1} and out["problems"] == []
    why = {Path(p).name: r for p, r in out["unrecognized_why"].items()}
    assert set(why) == {"tei.prom", "chrome.json", "cut.log", "blob.bin", "empty.txt"}
    assert why["tei.prom"].startswith(
        "closest format prometheus-scrape: Prometheus exposition with 2 sample(s)"
    )
    assert "te_queue_size, te_request_count" in why["tei.prom"]
    assert why["chrome.json"].startswith(
        "closest format kineto: a Chrome trace, but without Kineto's markers"
    )
    assert why["cut.log"].startswith("closest format nccl-tests: ")
    assert why["blob.bin"].startswith("binary content") and why["empty.txt"] == "empty file"
    con = duckdb.connect(str(store), read_only=True)
    try:
        rows = dict(con.execute("SELECT location, message FROM ingest_errors").fetchall())
    finally:
        con.close()
    assert {Path(k).name: v for k, v in rows.items()} == {n: f"unrecognized: {r}" for n, r in why.items()}


def test_terminal_line_names_the_reason(tmp_path: Path) -> None:
    src = _tree(tmp_path)
    got = CliRunner().invoke(app, ["ingest", str(src / "tei.prom"), str(src / "nim.prom"),
                                   "--store", str(tmp_path / "t.duckdb")])  # fmt: skip
    assert got.exit_code == 0
    assert f"unrecognized: {src / 'tei.prom'}: closest format prometheus-scrape:" in got.output
