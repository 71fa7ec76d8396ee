"""`ioe query`: read-only SQL over a store file — it reads, and it cannot write, attach or touch files."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from collector.readonly import ReadOnlyQueryError, run_readonly_query
from collector.records import frame
from collector.store import Store
from ioe.cli import app

runner = CliRunner()


@pytest.fixture
def store_file(tmp_path):
    path = tmp_path / "s.duckdb"
    with Store(path) as st:
        st.write("gpu_samples", frame("gpu_samples", {
            "ts_ns": [1, 2], "host": ["h", "h"], "uuid": ["u", "u"], "gpu": [0, 0],
            "metric": ["power_w", "power_w"], "value": [100.0, 300.0]}))  # fmt: skip
    return path


def test_select_as_json_and_csv(store_file) -> None:
    got = runner.invoke(app, ["query", "SELECT avg(value) AS w FROM gpu_samples", "--store", str(store_file),
                              "--format", "json"])  # fmt: skip
    assert got.exit_code == 0, got.output
    assert json.loads(got.output) == [{"w": 200.0}]
    got = runner.invoke(
        app, ["query", "SELECT value FROM gpu_samples ORDER BY ts_ns", "--store", str(store_file)]
    )
    assert got.output.splitlines() == ["value", "100.0", "300.0"]


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("DELETE FROM gpu_samples", "only SELECT"),
        ("INSERT INTO gpu_samples (ts_ns) VALUES (3)", "only SELECT"),
        ("SELECT * FROM read_csv('/etc/passwd')", "disabled"),
        ("SELECT * FROM '/etc/passwd'", "does not exist"),
        ("ATTACH '/tmp/x.duckdb' AS x", "only SELECT"),
        ("COPY gpu_samples TO '/tmp/out.csv'", "only SELECT"),
        ("SELECT 1; DROP TABLE gpu_samples", "exactly one statement"),
        ("", "empty query"),
    ],
)
def test_refused(store_file, sql: str, why: str) -> None:
    with pytest.raises(ReadOnlyQueryError, match=why):
        run_readonly_query(store_file, sql)
    with Store(store_file, read_only=True) as st:
        assert st.count("gpu_samples") == 2


def test_row_limit_and_cli_error(store_file) -> None:
    assert run_readonly_query(store_file, "SELECT * FROM range(100000)", max_rows=10).height == 10
    got = runner.invoke(app, ["query", "DROP TABLE gpu_samples", "--store", str(store_file)])
    assert got.exit_code == 2 and "query refused" in got.output
