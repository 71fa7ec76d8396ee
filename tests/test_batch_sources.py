"""Batches of several scrape targets at one instant (Batch rule 4) and the store's plain append of
a flush's points (``Store._insert_unindexed`` rule 4): the same rows as the de-duplicating insert.

Inputs are hand-built engine scrapes: two targets ("vllm", "sglang") scraped at the same second
are different series (``source`` is in ``engine_samples``' key), so a flush that joins them has no
key twice; two scrapes of one target at one second, or a part holding both targets, may."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collector.batch import Batch
from collector.records import batch
from collector.store import Store

S = 1_000_000_000


def _engine(source: str | list[str], ts: int, values: list[float]) -> Batch:
    n = len(values)
    sources = source if isinstance(source, list) else [source] * n
    rows = batch(
        "engine_samples",
        {
            "ts_ns": [ts] * n,
            "source": sources,
            "engine": ["vllm"] * n,
            "model": ["m"] * n,
            "concept": [f"c{i}_total" for i in range(n)],
            "value": values,
        },
    )
    rows.unique = True  # what a checked replay promises: one row per series in a scrape
    return rows


def _gpu(uuid: str, ts: int) -> Batch:
    rows = batch(
        "gpu_samples", {"ts_ns": [ts], "host": ["h"], "uuid": [uuid], "metric": ["m"], "value": [1.0]}
    )
    rows.unique = True
    return rows


def test_parts_of_other_sources_at_one_instant_stay_unique() -> None:
    both = Batch.concat([_engine("vllm", S, [1.0, 2.0]), _engine("sglang", S, [3.0, 4.0])])
    assert both.unique
    parts = [_engine(src, t * S, [1.0, 2.0]) for t in (1, 2, 3) for src in ("vllm", "sglang", "trt")]
    assert Batch.concat(parts).unique  # a flush: each target's scrapes one after the other


def test_parts_that_may_share_a_key_are_not_unique() -> None:
    # one target twice at one instant: a repeated scrape
    assert not Batch.concat([_engine("vllm", S, [1.0]), _engine("vllm", S, [2.0])]).unique
    # a part holding two sources says nothing about the other part's rows
    mixed = _engine(["vllm", "sglang"], S, [1.0, 2.0])
    assert not Batch.concat([mixed, _engine("sglang", S, [3.0, 4.0])]).unique
    # gpu_samples' key has no source: two parts at one instant may hold one GPU twice
    assert not Batch.concat([_gpu("G0", S), _gpu("G1", S)]).unique
    # a part not promised unique
    loose = _engine("sglang", S, [1.0])
    loose.unique = False
    assert not Batch.concat([_engine("vllm", S, [1.0]), loose]).unique


def _stored(store: Store) -> list[tuple[Any, ...]]:
    return store.con.execute(
        "SELECT ts_ns, source, concept, value, rate_per_s FROM engine_samples ORDER BY ALL"
    ).fetchall()


def test_appended_flushes_store_what_the_deduplicating_insert_stores(tmp_path: Path) -> None:
    """A sidecar's flush (two targets, one second each, joined) appended as it is, against the same
    rows written without the promise (DISTINCT ON, then the anti-join), in two stores."""
    flushes = [
        Batch.concat(
            [_engine(src, t * S, [float(t + k), float(2 * t + k)]) for t in (10 * f, 10 * f + 1) for k, src in
             enumerate(("vllm", "sglang"))]
        )
        for f in range(1, 4)
    ]  # fmt: skip
    assert all(f.unique for f in flushes)
    with Store(tmp_path / "a.duckdb") as fast, Store(tmp_path / "b.duckdb") as slow:
        for rows in flushes:
            plain = Batch(rows.table, rows.data, rows.height)  # the same rows, no promise
            assert fast.write("engine_samples", rows) == rows.height == 8
            assert slow.write("engine_samples", plain) == 8
        assert _stored(fast) == _stored(slow) and len(_stored(fast)) == 24
        # the same flush again (a replay): nothing new, either way
        assert fast.write("engine_samples", flushes[-1]) == 0
        assert _stored(fast) == _stored(slow)
        increases = "SELECT ts_ns, series_id, increase FROM engine_samples_points ORDER BY ALL"
        assert fast.con.execute(increases).fetchall() == slow.con.execute(increases).fetchall()
