"""``ioe query`` and ``ioe analyze`` read the DuckLake fleet store (PostgreSQL catalog on 127.0.0.1,
data files on disk), read-only, and answer what they answer on an embedded store file holding
the same rows.

1. ``--lake-dsn``/``--lake-data`` and ``--config`` with ``store_backend: ducklake`` both reach the
   lake; ``--lake-data`` may be left out (the catalog records its data path).
2. The same rows (two nodes of one deployment, written by tests/gen_telemetry.py to both stores)
   give the same query result and the same analysis report on both backends.
3. The lake is attached read-only and closed to everything else: a DELETE or a file read is
   refused (exit 2, one line) and the rows stay.
4. A catalog that does not answer, or no store named at all, is one line and exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from collector.lake import open_store
from collector.store import Store
from ioe.cli import app
from ioe.settings import Settings
from tests.gen_telemetry import Layout, generate
from tests.test_lake_fleet import lake, pg  # noqa: F401 - pytest fixtures

pytestmark = pytest.mark.component
TWO_NODES = Layout(deployment="tp16", engines=1, gpus=16, hosts=("node-a", "node-b"), duration_s=600)
# exact aggregates only: a float sum's last digits depend on the order rows are read in
HOSTS_SQL = (
    "SELECT host, count(*) AS n, count(DISTINCT uuid) AS gpus, min(value) AS lo, max(value) AS hi "
    "FROM gpu_samples GROUP BY 1 ORDER BY 1"
)
runner = CliRunner()


@pytest.fixture
def stores(lake: dict[str, str], tmp_path: Path) -> dict[str, str]:  # noqa: F811 - the imported fixture
    """The same telemetry in a lake (flushed and compacted into data files) and in a store file."""
    settings = Settings(store_backend="ducklake", lake_catalog_dsn=lake["dsn"], lake_data_path=lake["data"],
                        lake_spool_dir=lake["spool"], store_path=str(tmp_path / "unused.duckdb"))  # fmt: skip
    lake_store = open_store(settings)
    try:
        generate(lake_store, "network", TWO_NODES)
        lake_store.flush()
        lake_store.compact()
    finally:
        lake_store.close()
    assert list(Path(lake["data"]).rglob("*.parquet")), "the lake's rows should be in data files"
    file = tmp_path / "embedded.duckdb"
    with Store(file) as st:
        generate(st, "network", TWO_NODES)
    config = tmp_path / "lake.yaml"
    config.write_text(yaml.safe_dump({"store_backend": "ducklake", "lake_catalog_dsn": lake["dsn"],
                                      "lake_data_path": lake["data"]}))  # fmt: skip
    return {"dsn": lake["dsn"], "data": lake["data"], "file": str(file), "config": str(config)}


def _rounded(obj: Any) -> Any:
    """Floats to 9 significant digits, everywhere in ``obj``."""
    if isinstance(obj, float):
        return float(f"{obj:.9g}")
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rounded(v) for v in obj]
    return obj


def _ok(args: list[str]) -> str:
    got = runner.invoke(app, args)
    assert got.exit_code == 0, got.output
    return got.stdout


def test_query_reads_the_lake_as_it_reads_a_file(stores: dict[str, str]) -> None:
    on_file = json.loads(_ok(["query", HOSTS_SQL, "--store", stores["file"], "--format", "json"]))
    lake_args = ["--lake-dsn", stores["dsn"], "--lake-data", stores["data"], "--format", "json"]
    on_lake = json.loads(_ok(["query", HOSTS_SQL, *lake_args]))
    assert [r["host"] for r in on_lake] == ["node-a", "node-b"] and all(r["n"] > 0 for r in on_lake)
    assert on_lake == on_file
    assert json.loads(_ok(["query", HOSTS_SQL, "--lake-dsn", stores["dsn"], "--format", "json"])) == on_file
    assert json.loads(_ok(["query", HOSTS_SQL, "--config", stores["config"], "--format", "json"])) == on_file


def test_analyze_reads_the_lake_as_it_reads_a_file(stores: dict[str, str]) -> None:
    on_file = json.loads(_ok(["analyze", "--store", stores["file"], "--window", "10m", "--json"]))
    on_lake = json.loads(_ok(["analyze", "--config", stores["config"], "--window", "10m", "--json"]))
    (dep,) = on_lake["deployments"]
    assert dep["deployment"]["name"] == "tp16" and dep["deployment"]["nodes"] == ["node-a", "node-b"]
    assert dep["envelope"]["primary"] == "network"
    assert _rounded(on_lake) == _rounded(on_file)  # the same rows summed in another order: last digits
    text = _ok(["analyze", "--lake-dsn", stores["dsn"], "--window", "10m"])
    assert text.startswith("tp16: network")


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("DELETE FROM gpu_samples", "only SELECT"),
        ("SELECT * FROM read_csv('/etc/passwd')", "read_csv"),
        ("SELECT * FROM postgres_query('__ducklake_metadata_lake', 'SELECT 1')", "postgres_query"),
        ("SELECT * FROM __ducklake_metadata_lake.ducklake_metadata", "ducklake_metadata"),
        ("SELECT * FROM gpu_samples; DELETE FROM gpu_samples", "exactly one statement"),
    ],
)
def test_the_lake_is_read_only(stores: dict[str, str], sql: str, why: str) -> None:
    got = runner.invoke(app, ["query", sql, "--lake-dsn", stores["dsn"]])
    assert got.exit_code == 2
    (line,) = got.stderr.splitlines()
    assert line.startswith("query refused:") and why in line
    on_file = _ok(["query", "SELECT count(*) AS n FROM gpu_samples", "--store", stores["file"]])
    assert _ok(["query", "SELECT count(*) AS n FROM gpu_samples", "--lake-dsn", stores["dsn"]]) == on_file


def test_an_unreachable_catalog_or_no_store_is_one_line() -> None:
    dead = "dbname=ioe host=127.0.0.1 port=9 user=ioe connect_timeout=2"
    for args in (["query", "SELECT 1", "--lake-dsn", dead], ["analyze", "--lake-dsn", dead]):
        got = runner.invoke(app, args)
        assert got.exit_code == 2, got.output
        (line,) = got.stderr.splitlines()
        assert "cannot attach it read-only" in line and "port=9" in line
    for args in (["query", "SELECT 1"], ["analyze"]):
        got = runner.invoke(app, args)
        assert got.exit_code == 2
        assert got.stderr.splitlines() == [f"ioe {args[0]}: name a store: --store FILE, --lake-dsn DSN "
                                           "(DuckLake), or --config FILE"]  # fmt: skip
