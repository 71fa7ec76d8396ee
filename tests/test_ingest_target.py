"""``ioe ingest --target``: a folder of periodic scrapes of one endpoint is one source.

Input: the real dcgm-exporter scrape in ``tests/data/dcgm/h100x8_k8s_pod_labels.prom`` (8 H100s,
30 samples, SOURCE in the file) copied five times with modification times one second apart, as
a cron job capturing the endpoint every second would leave it. Each copy has the same 30 series,
so read as one target the store must hold 30 series of five points each; named by file path (the
default, right for files of different endpoints) it holds 150 one-point series.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from ioe.cli import app

SCRAPE = Path(__file__).parent / "data" / "dcgm" / "h100x8_k8s_pod_labels.prom"
T0 = 1_790_000_000
FILES, SERIES = 5, 30


@pytest.fixture()
def scrapes(tmp_path: Path) -> Path:
    folder = tmp_path / "scrapes"
    folder.mkdir()
    for i in range(FILES):
        f = folder / f"dcgm-{T0 + i}.prom"
        shutil.copy(SCRAPE, f)
        os.utime(f, ns=((T0 + i) * 10**9, (T0 + i) * 10**9))
    return folder


def _ingest(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["ingest", *args, "--no-progress"])
    return res.exit_code, res.output


def _counts(store: Path) -> tuple[int, int, int]:
    con = duckdb.connect(str(store), read_only=True)
    try:
        series = con.execute("SELECT count(*) FROM gpu_samples_series").fetchone()
        points = con.execute("SELECT count(*), count(DISTINCT ts_ns) FROM gpu_samples").fetchone()
    finally:
        con.close()
    assert series is not None and points is not None
    return int(series[0]), int(points[0]), int(points[1])


def test_one_target_holds_each_series_once_with_every_point(scrapes: Path, tmp_path: Path) -> None:
    store = tmp_path / "one.duckdb"
    code, out = _ingest(str(scrapes), "--store", str(store), "--target", "gpu-node-1:9400")
    assert code == 0, out
    assert _counts(store) == (SERIES, FILES * SERIES, FILES)
    code, out = _ingest(str(scrapes), "--store", str(store), "--target", "gpu-node-1:9400")
    assert code == 0, out
    assert _counts(store) == (SERIES, FILES * SERIES, FILES)  # idempotent: nothing added again


def test_by_default_each_file_is_its_own_source(scrapes: Path, tmp_path: Path) -> None:
    store = tmp_path / "paths.duckdb"
    code, out = _ingest(str(scrapes), "--store", str(store))
    assert code == 0, out
    assert _counts(store) == (FILES * SERIES, FILES * SERIES, FILES)


def test_a_stated_time_over_several_files_of_one_target_is_refused(scrapes: Path, tmp_path: Path) -> None:
    store = tmp_path / "ts.duckdb"
    code, out = _ingest(str(scrapes), "--store", str(store), "--target", "t", "--ts", str(T0))
    assert code == 2
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--target 't' with --ts stamps 5 files" in lines[0]
    assert not store.exists()  # refused before the store was created
    one = next(iter(sorted(scrapes.iterdir())))
    code, out = _ingest(str(one), "--store", str(store), "--target", "t", "--ts", str(T0))
    assert code == 0, out
