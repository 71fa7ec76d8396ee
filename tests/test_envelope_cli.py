"""`ioe analyze` over a store file: JSON report and text, bad input named."""

from __future__ import annotations

import json
from pathlib import Path

from gen_telemetry import NS, T0_NS, Layout, generate
from typer.testing import CliRunner

from collector.store import Store
from ioe.cli import app


def _store(tmp_path: Path) -> Path:
    path = tmp_path / "kv.duckdb"
    with Store(path) as st:
        generate(st, "kv_capacity", Layout())
    return path


def test_analyze_json_reports_zone_cp_headroom_regression(tmp_path: Path) -> None:
    path = _store(tmp_path)
    at = str((T0_NS + 900 * NS) / NS)
    got = CliRunner().invoke(app, ["analyze", "--store", str(path), "--window", "15m", "--at", at, "--json"])
    assert got.exit_code == 0, got.output
    doc = json.loads(got.output)
    (dep,) = doc["deployments"]
    assert dep["deployment"]["name"] == "llama70b" and dep["envelope"]["primary"] == "kv_capacity"
    assert dep["headroom"]["kv_sequences_left"] == 3.1  # 100 running × (1/0.97 − 1)
    assert {m["metric"] for m in dep["regression"]["metrics"]} == {"ttft_seconds", "itl_seconds"}
    assert doc["window"]["seconds"] == 900.0


def test_analyze_text_and_errors(tmp_path: Path) -> None:
    path = _store(tmp_path)
    text = CliRunner().invoke(app, ["analyze", "--store", str(path)])
    assert text.exit_code == 0 and "llama70b: kv_capacity" in text.output
    bad = CliRunner().invoke(app, ["analyze", "--store", str(path), "--window", "15x"])
    assert bad.exit_code != 0 and "'15x'" in bad.output
    missing = CliRunner().invoke(app, ["analyze", "--store", str(path), "--deployment", "nope"])
    assert missing.exit_code == 2 and "llama70b" in missing.output
