"""The envelope's window load points (``api.service.window_load``, rule 5 of :mod:`api.service`)
against the written-down engine model of :mod:`gen_sweep` (SYNTHETIC, hand-built)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from gen_sweep import DEPLOYMENT, DURATION_S, ENGINES, build, tokens_per_s

from api.service import deployments, window_load
from collector.store import Store

NS = 1_000_000_000
GPUS = 8


def expected_per_gpu(concurrency: float) -> float:
    """Both engines carry the same load: deployment tokens/s over its 8 GPUs."""
    return ENGINES * tokens_per_s(concurrency / ENGINES) / GPUS


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    path = tmp_path_factory.mktemp("load") / "sweep.duckdb"
    start_ns = (int(time.time()) // 60 * 60 - 2400) * NS
    build(str(path), start_ns)
    st = Store(str(path))
    st.maintain()  # the per-minute rollups long windows read
    st.close()
    return path, start_ns + DURATION_S * NS


def _points(store: tuple[Path, int], window_s: int) -> list[dict]:
    st = Store(str(store[0]))
    try:
        with st.cursor() as con:
            [dep] = [d for d in deployments(con) if d.name == DEPLOYMENT]
            return window_load(con, dep, store[1] - window_s * NS, store[1], 120)
    finally:
        st.close()


def test_raw_points_follow_the_engine_model(store: tuple[Path, int]) -> None:
    pts = _points(store, 900)
    assert len(pts) == 120  # 7.5 s bins, each with scrapes of both engines
    for p in pts:  # the mean of per-scrape rates is the model's rate at the bin's mean load (within 1 %)
        assert p["tokens_per_s_per_gpu"] == pytest.approx(expected_per_gpu(p["concurrency"]), rel=0.01)
        assert p["itl_p99_s"] is not None and p["itl_p99_s"] > 0


def test_long_windows_read_the_rollups(store: tuple[Path, int]) -> None:
    pts = _points(store, 24 * 3600)  # 720 s bins from per-minute means over the 30 min of data
    assert 2 <= len(pts) <= 4
    for p in pts:  # a bin's mean load vs mean rate: the model is close to linear within a bin
        assert p["tokens_per_s_per_gpu"] == pytest.approx(expected_per_gpu(p["concurrency"]), rel=0.08)
